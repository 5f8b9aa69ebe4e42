"""What the service shows: an immutable status of its state, its JSON, and running counters."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from workerset_admission.admission import AdmissionCore, GroupView
from workerset_admission.admission.readiness import ReadinessUnit, evaluate_readiness
from workerset_admission.identity import AttemptId, EndpointId, GroupKey, instance_key
from workerset_admission.service.group_json import (
    Serving,
    drained_json,
    group_json,
    handover_json,
    id_list,
)
from workerset_admission.service.liveness import LivenessIndex
from workerset_admission.service.rejections import (
    Registrations,
    StandingRejection,
    standing_rejections,
)
from workerset_admission.telemetry import AdmissionStateSummary, HeldGroup
from workerset_admission.telemetry.worker_state_page import StoreLike

__all__ = [
    "EMPTY_STATUS",
    "CohortStatusView",
    "GroupStatusReport",
    "InvalidRecord",
    "ModelReadiness",
    "Routable",
    "ServiceCounters",
    "ServiceStatus",
    "ServingRecord",
    "StandingRejection",
    "group_status_report",
    "judge_readiness",
    "readiness",
    "readiness_unit",
    "serving_group",
    "serving_record",
    "serving_records",
    "standing_rejections",
    "state_summary",
]


@dataclass(frozen=True, slots=True)
class CohortStatusView:
    """One cohort: its checksum and member instance ids, sorted."""

    mdc_checksum: str
    members: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class GroupStatusReport:
    """One WorkerSet as the service serves it."""

    group: GroupKey
    incumbent: str | None
    status: str
    generation: int | None
    committed_generation: int | None
    receiver: int | None
    admitted: tuple[int, ...]
    routable: tuple[int, ...]
    cohorts: tuple[CohortStatusView, ...]
    # When a tenure held after an outage ends (Unix time), None when it is not held; and the
    # instance ids it was held for (one of them coming back ends it).
    held_until: float | None = None
    hold_members: tuple[int, ...] = ()
    # Admitted ids served on their last known records during a hold, and until when (Unix
    # time); routable though their instance records may be missing.
    last_known: tuple[int, ...] = ()
    last_known_until: float | None = None
    # Workers a drain set aside: (instance id, who drained it, when as Unix time), sorted; and
    # a drained tenure still serving its drained members until the incumbent is committed
    # (checksum, committed generation, members).
    drained: tuple[tuple[int, str, float | None], ...] = ()
    handover: tuple[str, int, tuple[int, ...]] | None = None
    # The card checksum each drained worker registered with (instance id, checksum).
    drained_checksums: tuple[tuple[int, str], ...] = ()

    @property
    def rejected(self) -> tuple[CohortStatusView, ...]:
        return self.cohorts[1:]

    def to_json(self, brief: bool = False) -> dict[str, Any]:
        out = group_json(
            self.group,
            incumbent=self.incumbent,
            status=self.status,
            generation=self.generation,
            receiver=self.receiver,
            admitted=self.admitted,
            cohorts=((c.mdc_checksum, c.members) for c in self.cohorts),
            serving=Serving(self.committed_generation, self.routable),
            brief=brief,
        )
        # What the status alone shows: every field always, the hold's times as Unix time.
        out.update(
            {
                "rejected": [c.mdc_checksum for c in self.rejected],
                "held": self.held_until is not None,
                "held_until": self.held_until,
                "hold_members": id_list(self.hold_members, brief),
                "last_known": id_list(self.last_known, brief),
                "last_known_until": self.last_known_until,
                "drained": len(self.drained)
                if brief
                else drained_json(self.drained, dict(self.drained_checksums)),
                "handover": None
                if self.handover is None
                else handover_json(*self.handover, brief=brief),
            }
        )
        return out


@dataclass(frozen=True, slots=True)
class ModelReadiness:
    """Readiness of one model in one namespace, from its committed WorkerSets only."""

    model: str
    namespace: str
    ready: bool
    present: tuple[str, ...]
    missing: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "namespace": self.namespace,
            "ready": self.ready,
            "present": list(self.present),
            "missing": list(self.missing),
        }


@dataclass(frozen=True, slots=True)
class InvalidRecord:
    """A refused discovery record, kept in the bounded recent list."""

    key: str
    reason: str
    detail: str
    at: float

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "reason": self.reason, "detail": self.detail}


@dataclass(frozen=True, slots=True)
class ServiceStatus:
    """A consistent, immutable picture of the service for synchronous readers."""

    health: str
    synced: bool
    groups: tuple[GroupStatusReport, ...]
    readiness: tuple[ModelReadiness, ...]
    invalid_total: int
    recent_invalid: tuple[InvalidRecord, ...]
    live_instances: int
    builds_in_flight: int
    listings_applied: int
    frontend: str | None = None
    # Every cohort standing rejected, with what its card differs in from the incumbent's.
    rejections: tuple[StandingRejection, ...] = ()
    # When the picture was taken (Unix time): it shows every step that ended before then.
    as_of: float | None = None
    # The read store the picture was rendered from (``None``: a picture made otherwise, as
    # one read back from JSON); the worker listing and the gauges render from it.
    # (a ``read_store.ReadStore``; typed by what the gauges read of it, as the store's module
    # imports this one).
    store: StoreLike | None = field(default=None, compare=False, repr=False)

    def group(self, key: GroupKey) -> GroupStatusReport | None:
        for g in self.groups:
            if g.group == key:
                return g
        return None

    def to_json(self, brief: bool = False) -> dict[str, Any]:
        return {
            "frontend": self.frontend,
            "health": self.health,
            "synced": self.synced,
            "groups": [g.to_json(brief) for g in self.groups],
            "rejections": [r.to_json() for r in self.rejections],
            "readiness": [r.to_json() for r in self.readiness],
            "invalid_total": self.invalid_total,
            "recent_invalid": [r.to_json() for r in self.recent_invalid],
            "live_instances": self.live_instances,
            "builds_in_flight": self.builds_in_flight,
            "snapshots_applied": self.listings_applied,  # the key predates the word "listing"
            "as_of": self.as_of,
        }


@dataclass(frozen=True, slots=True)
class ServingRecord:
    """One worker namespace's serving record: the members, and per group what is served.

    Each group is ``{"model", "worker_set", "checksum", "generation", "members"}``.
    """

    members: tuple[str, ...]
    groups: tuple[dict[str, Any], ...]


@dataclass(slots=True)
class ServiceCounters:
    """Running totals since start: events by kind, refused records, receiver notifications."""

    puts: int = 0
    deletes: int = 0
    listings: int = 0
    invalid: int = 0
    notifications: int = 0


EMPTY_STATUS = ServiceStatus(
    health="starting",
    synced=False,
    groups=(),
    readiness=(),
    invalid_total=0,
    recent_invalid=(),
    live_instances=0,
    builds_in_flight=0,
    listings_applied=0,
)


class Routable(Protocol):
    """Which admitted ids of an endpoint a hop may route to (a :class:`LivenessIndex`)."""

    def routable(
        self, endpoint: EndpointId, admitted: Iterable[int], last_known: Iterable[int] = ()
    ) -> frozenset[int]: ...


def group_status_report(
    view: GroupView, liveness: Routable, clock: Callable[[], float] | None = None
) -> GroupStatusReport:
    """Picture one group as served: its cohorts, and which admitted ids are routable.

    ``clock`` is the service clock the core's hold deadlines are on; with it a held group's
    deadline is shown as Unix time.
    """
    routable = liveness.routable(view.key.endpoint, view.admitted, view.last_known)

    def unix(at: float | None) -> float | None:
        if at is None or clock is None:
            return None
        return round(time.time() + at - clock(), 3)

    return GroupStatusReport(
        held_until=unix(view.held_until),
        hold_members=view.hold_members,
        last_known=view.last_known,
        last_known_until=unix(view.last_known_until),
        group=view.key,
        incumbent=view.incumbent,
        status=view.status.value,
        generation=view.generation,
        committed_generation=view.committed_generation,
        receiver=view.receiver,
        admitted=view.admitted,
        routable=tuple(sorted(routable)),
        cohorts=tuple(CohortStatusView(c.mdc_checksum, c.instance_ids) for c in view.cohorts),
        drained=tuple((d.instance_id, d.drain.by, d.drain.at) for d in view.drained),
        drained_checksums=tuple((d.instance_id, d.mdc_checksum) for d in view.drained),
        handover=None
        if view.handover is None
        else (view.handover.mdc_checksum, view.handover.generation, view.handover.members),
    )


def readiness_unit(
    core: Registrations, view: GroupView, liveness: Routable
) -> ReadinessUnit | None:
    """One committed WorkerSet's readiness unit: live = admitted and routable, as the frontend.

    ``None`` when the group has no incumbent member to read its worker type and needs from.
    """
    if not view.cohorts or not view.cohorts[0].members:
        return None
    reg = core.registration(view.cohorts[0].members[0].key)
    if reg is None:
        return None
    live = len(liveness.routable(view.key.endpoint, view.admitted))
    return ReadinessUnit(reg.worker_type, live, reg.needs)


def judge_readiness(
    units: Iterable[tuple[GroupKey, ReadinessUnit]],
) -> tuple[ModelReadiness, ...]:
    """Judge readiness per model and namespace from the committed WorkerSets' units."""
    by_model: dict[tuple[str, str], list[ReadinessUnit]] = {}
    for key, unit in units:
        by_model.setdefault((key.model, key.endpoint.namespace), []).append(unit)
    out = []
    for (model, namespace), group_units in sorted(by_model.items()):
        verdict = evaluate_readiness(group_units)
        out.append(
            ModelReadiness(
                model=model,
                namespace=namespace,
                ready=verdict.ready,
                present=tuple(r.value for r in verdict.present),
                missing=tuple(r.value for r in verdict.missing),
            )
        )
    return tuple(out)


def readiness(
    core: AdmissionCore, committed: Iterable[GroupKey], liveness: LivenessIndex
) -> tuple[ModelReadiness, ...]:
    """Judge readiness per model and namespace from the committed WorkerSets only."""
    units = []
    for key in committed:
        view = core.group(key)
        unit = None if view is None else readiness_unit(core, view, liveness)
        if unit is not None:
            units.append((key, unit))
    return judge_readiness(units)


def serving_group(view: GroupView, served: AttemptId) -> dict[str, Any] | None:
    """One served group's entry in its namespace's serving record (``None``: nobody served)."""
    admitted = view.admitted
    handover = view.handover
    if handover is not None and handover.generation == served.generation:
        # A drained tenure still serves its drained members until its successor commits.
        admitted = handover.members
    endpoint = view.key.endpoint
    if not admitted:
        if view.held_until is None or not view.hold_members:
            return None
        # Held with nobody served: the record names whom the hold waits for, and serves no one.
        return {
            "model": view.key.model,
            "worker_set": view.key.worker_set,
            "checksum": served.mdc_checksum,
            "generation": served.generation,
            "members": [],
            "held": [instance_key(endpoint, i) for i in view.hold_members],
        }
    # A served member's registration key is its instance key: the record names it by that
    # string, not by a copy of it per record kept (a fleet holds one per worker).
    registered = {m.instance_id: m.key for cohort in view.cohorts[:1] for m in cohort.members}
    return {
        "model": view.key.model,
        "worker_set": view.key.worker_set,
        "checksum": served.mdc_checksum,
        "generation": served.generation,
        "members": [_shared(instance_key(endpoint, i), registered.get(i)) for i in admitted],
    }


def _shared(key: str, registered: str | None) -> str:
    return registered if registered == key else key


def serving_record(groups: Iterable[dict[str, Any]]) -> ServingRecord:
    """One namespace's serving record from its served groups' entries, in group order."""
    entries = tuple(groups)
    return ServingRecord(
        members=tuple(sorted({m for g in entries for m in g["members"]})), groups=entries
    )


def serving_records(
    core: AdmissionCore, committed: Mapping[GroupKey, AttemptId]
) -> dict[str, ServingRecord]:
    """Return what this frontend serves, per worker namespace (committed groups only)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for key, served in sorted(committed.items()):
        view = core.group(key)
        entry = None if view is None else serving_group(view, served)
        if entry is not None:
            out.setdefault(key.endpoint.namespace, []).append(entry)
    return {namespace: serving_record(groups) for namespace, groups in out.items()}


def state_summary(current: ServiceStatus) -> AdmissionStateSummary:
    """Count groups per status, admitted workers of committed groups, workers by state."""
    by_status: dict[str, int] = {}
    admitted = 0
    held: list[HeldGroup] = []
    workers: dict[tuple[str, str], int] = {}
    for group in current.groups:
        by_status[group.status] = by_status.get(group.status, 0) + 1
        if group.committed_generation is not None:
            admitted += len(group.admitted)
        model = group.group.model
        if group.held_until is not None:
            held.append(
                HeldGroup(
                    group.group.id, group.held_until, group.last_known, group.last_known_until
                )
            )
            # While the tenure is held, its last known members are still served (admitted);
            # every other worker waits for the hold's end, neither admitted nor rejected.
            counts = {
                "admitted": len(group.admitted),
                "held": sum(len(c.members) for c in group.cohorts) - len(group.admitted),
            }
        else:
            counts = {
                "admitted": len(group.admitted),
                "rejected": sum(len(c.members) for c in group.rejected),
            }
        if group.drained:
            counts["drained"] = len(group.drained)
        for state, count in counts.items():
            workers[(model, state)] = workers.get((model, state), 0) + count
    return AdmissionStateSummary(
        by_status,
        admitted,
        len(held),
        tuple(held),
        workers,
        current.groups,
        current.rejections,
        current.store,
    )
