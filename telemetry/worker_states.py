"""Every worker's state in Dynamo's router vocabulary: one table, and the rule that picks a row.

Theory of operation
-------------------
Dynamo's frontend (after 1.6.1) reports each discovered worker of a WorkerSet in one of three
states, ``available``, ``pending`` or ``excluded``, with a reason, and counts them per WorkerSet
beside the ``discovered`` total. This plugin knows a little more about a worker than that
frontend does: that it waits for a held tenure to end, that it is served on its last known
records during an outage, that an operator drained it. :data:`STATE_TABLE` names each of the
plugin's states once, with the upstream state a query written for Dynamo counts it in and the
reason it is shown with. Reasons are unique, so the reason alone tells the plugin state; a new
state is one line in the table and one branch in the rule :func:`router_states` applies.

:func:`worker_sets` reads the service's group status views (duck-typed, see :class:`GroupLike`) and
gives one :class:`WorkerSetState` per label set: Dynamo labels a WorkerSet by model, namespace,
component, endpoint and worker type, while this plugin's group key also carries the model types,
so two groups may share labels. A worker listed in both keeps its best state (available before
pending before excluded), as Dynamo's own collector does.

A rejected worker's series also names the first input of the checksum its card differs in
(``differs_in``): one of the checksum's own input names (a router config member is shown as
``router_config``), ``unknown`` when the cards were not at hand, ``none`` for every other
worker. The values are a fixed set, so the label adds no series beyond one per worker.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final, Protocol

from workerset_admission.card.checksum import CHECKSUM_INPUTS
from workerset_admission.telemetry import names as n

__all__ = [
    "COUNT_STATES",
    "DIFFERS_IN_NONE",
    "DIFFERS_IN_UNKNOWN",
    "DIFFERS_IN_VALUES",
    "STATE_TABLE",
    "WAITING",
    "CohortLike",
    "GroupFacts",
    "GroupLike",
    "RejectionLike",
    "RouterState",
    "WorkerSetLabels",
    "WorkerSetState",
    "differs_in",
    "merge_resolved",
    "merged_workers",
    "rejection_reasons",
    "resolved",
    "router_state",
    "router_states",
    "worker_labels",
    "worker_sets",
]


@dataclass(frozen=True, slots=True)
class RouterState:
    """How one plugin state reads in Dynamo's vocabulary: the upstream state and the reason."""

    state: str
    reason: str


# plugin state    -> the upstream state a Dynamo query counts it in, and the reason shown.
STATE_TABLE: Final[Mapping[str, RouterState]] = MappingProxyType(
    {
        "admitted": RouterState("available", "none"),
        "last_known": RouterState("available", "last_known"),
        "unavailable": RouterState("excluded", "unavailable"),
        "initializing": RouterState("pending", "initializing"),
        "build_failed": RouterState("excluded", "materialization_failed"),
        "commit_blocked": RouterState("excluded", "commit_blocked"),
        "rejected": RouterState("excluded", "checksum_mismatch"),
        "held": RouterState("pending", "held"),
        "drained": RouterState("excluded", "drained"),
    }
)

# The per-WorkerSet counts, as Dynamo reports them: every one of them for every WorkerSet, zero
# included; ``discovered`` is all of a WorkerSet's workers, the other three divide them.
COUNT_STATES: Final = ("discovered", "available", "pending", "excluded")

DIFFERS_IN_NONE: Final = "none"
DIFFERS_IN_UNKNOWN: Final = "unknown"
DIFFERS_IN_VALUES: Final = (
    DIFFERS_IN_NONE,
    DIFFERS_IN_UNKNOWN,
    *(name for name, _ in CHECKSUM_INPUTS),
)
_INPUT_NAMES: Final = frozenset(name for name, _ in CHECKSUM_INPUTS)
_PRIORITY: Final = {"available": 2, "pending": 1}

# Statuses whose uncommitted incumbent workers Dynamo would call pending, and the others.
_BUILD_FAILED_STATUSES: Final = frozenset({"retrying"})
_COMMIT_BLOCKED_STATUSES: Final = frozenset({"blocked", "blocked_ready"})
# The states of a worker outside the incumbent cohort, whose series say what its card differs in.
WAITING: Final = frozenset({"rejected", "held"})


class CohortLike(Protocol):
    """A cohort as the service's status shows it."""

    @property
    def mdc_checksum(self) -> str: ...
    @property
    def members(self) -> tuple[int, ...]: ...


class GroupLike(Protocol):
    """The fields of the service's group status view the worker states are read from."""

    @property
    def group(self) -> object: ...  # a GroupKey: ``model`` and ``worker_set``
    @property
    def incumbent(self) -> str | None: ...
    @property
    def status(self) -> str: ...
    @property
    def committed_generation(self) -> int | None: ...
    @property
    def receiver(self) -> int | None: ...
    @property
    def admitted(self) -> tuple[int, ...]: ...
    @property
    def routable(self) -> tuple[int, ...]: ...
    @property
    def cohorts(self) -> Sequence[CohortLike]: ...
    @property
    def held_until(self) -> float | None: ...
    @property
    def last_known(self) -> tuple[int, ...]: ...
    @property
    def drained(self) -> Sequence[tuple[int, str, float | None]]: ...  # (id, by whom, when)


class RejectionLike(Protocol):
    """A standing rejection as the service's status shows it."""

    @property
    def group(self) -> object: ...
    @property
    def incumbent_checksum(self) -> str: ...
    @property
    def rejected_checksum(self) -> str: ...
    @property
    def differences(self) -> Sequence[object] | None: ...


@dataclass(frozen=True, slots=True, order=True)
class WorkerSetLabels:
    """Dynamo's labels of one WorkerSet, in its order."""

    model: str
    target_namespace: str
    target_component: str
    target_endpoint: str
    worker_type: str

    def as_dict(self) -> dict[str, str]:
        return {
            "model": self.model,
            "target_namespace": self.target_namespace,
            "target_component": self.target_component,
            "target_endpoint": self.target_endpoint,
            "worker_type": self.worker_type,
        }

    @classmethod
    def of(cls, group: object) -> WorkerSetLabels:
        model = str(getattr(group, "model", ""))
        try:
            namespace, component, endpoint, _types, worker_type = json.loads(
                str(getattr(group, "worker_set", ""))
            )
        except (TypeError, ValueError):
            namespace = component = endpoint = worker_type = ""
        return cls(model, str(namespace), str(component), str(endpoint), str(worker_type))


@dataclass(frozen=True, slots=True)
class WorkerSetState:
    """One WorkerSet's workers: per worker id, its plugin state and ``differs_in``."""

    labels: WorkerSetLabels
    workers: Mapping[int, tuple[str, str]]

    def counts(self) -> dict[str, int]:
        """Workers per upstream state, every one of :data:`COUNT_STATES` present."""
        out = dict.fromkeys(COUNT_STATES, 0)
        out["discovered"] = len(self.workers)
        for state, _ in self.workers.values():
            out[STATE_TABLE[state].state] += 1
        return out


def worker_labels(labels: WorkerSetLabels, worker: int, state: str, why: str) -> dict[str, str]:
    """Return the labels of one worker's ``router_worker_state`` series (its set's, its own)."""
    router = STATE_TABLE[state]
    return {
        **labels.as_dict(),
        n.LABEL_ROUTER_WORKER_ID: str(worker),
        n.LABEL_STATE: router.state,
        n.LABEL_REASON: router.reason,
        n.LABEL_DIFFERS_IN: why,
    }


def differs_in(differences: Sequence[object] | None) -> str:
    """Name the first checksum input ``differences`` lists, as a bounded label value."""
    if not differences:
        return DIFFERS_IN_UNKNOWN
    field = str(getattr(differences[0], "field", ""))
    if field in _INPUT_NAMES:
        return field
    # A router config member (``router_config.kv_router_config.x``) or any other dotted path:
    # the longest input name it starts with, so the label keeps to the checksum's own names.
    for name in sorted(_INPUT_NAMES, key=len, reverse=True):
        if field.startswith(f"{name}."):
            return name
    return DIFFERS_IN_UNKNOWN


@dataclass(frozen=True, slots=True)
class GroupFacts:
    """One group's id sets, made once per collection (a group may list thousands of workers)."""

    admitted: frozenset[int]
    routable: frozenset[int]
    last_known: frozenset[int]
    drained: frozenset[int]
    committed: bool
    held: bool
    status: str

    @classmethod
    def of(cls, group: GroupLike) -> GroupFacts:
        return cls(
            admitted=frozenset(group.admitted),
            routable=frozenset(group.routable),
            last_known=frozenset(group.last_known),
            drained=frozenset(entry[0] for entry in group.drained),
            committed=group.committed_generation is not None,
            held=group.held_until is not None,
            status=group.status,
        )


def router_state(facts: GroupFacts, worker: int, incumbent_member: bool) -> str:
    """Return one worker's plugin state (a key of :data:`STATE_TABLE`): the rule itself.

    It reads only whether the worker is drained, admitted, last known and routable, and
    whether it is an incumbent cohort's member: workers alike in those share the answer.
    """
    if worker in facts.drained:
        return "drained"
    if not incumbent_member:
        return "held" if facts.held else "rejected"
    if worker in facts.admitted and facts.committed:
        if worker in facts.last_known:
            return "last_known"
        return "admitted" if worker in facts.routable else "unavailable"
    if facts.held:
        return "held"
    if facts.status in _BUILD_FAILED_STATUSES:
        return "build_failed"
    if facts.status in _COMMIT_BLOCKED_STATUSES:
        return "commit_blocked"
    return "initializing"


def router_states(group: GroupLike) -> dict[int, tuple[str, str | None]]:
    """Every worker of ``group`` the gauges list: its plugin state, and the cohort it waits in.

    The second value is the checksum of the cohort whose ``differs_in`` the worker's series
    shows (a worker rejected or held behind the incumbent), ``None`` for every other worker.
    The one rule of a worker's gauge state: the read store keeps its answer per worker.
    """
    facts = GroupFacts.of(group)
    out: dict[int, tuple[str, str | None]] = {}
    for index, cohort in enumerate(group.cohorts):
        incumbent_member = index == 0 and cohort.mdc_checksum == group.incumbent
        waits_in = None if incumbent_member else cohort.mdc_checksum
        for worker in cohort.members:
            state = router_state(facts, worker, incumbent_member)
            out[worker] = (state, waits_in if state in WAITING else None)
    # Workers served on their last known records may have no record left to list them, and a
    # drain takes a worker out of its cohort (during a handover it still serves until the
    # successor is committed; it is excluded all the same, as the operator declared it leaving).
    for worker in (*group.admitted, *sorted(facts.drained)):
        if worker not in out:
            out[worker] = (router_state(facts, worker, True), None)
    return out


def resolved(
    key: object,
    states: Mapping[int, tuple[str, str | None]],
    reasons: Mapping[tuple[object, str], str],
) -> dict[int, tuple[str, str]]:
    """Each worker's state and ``differs_in`` from :func:`router_states`' answer for ``key``."""
    out: dict[int, tuple[str, str]] = {}
    for worker, (state, waits_in) in states.items():
        why = (
            DIFFERS_IN_NONE
            if waits_in is None
            else reasons.get((key, waits_in), DIFFERS_IN_UNKNOWN)
        )
        out[worker] = (state, why)
    return out


def _group_workers(
    group: GroupLike, reasons: Mapping[tuple[object, str], str]
) -> dict[int, tuple[str, str]]:
    return resolved(group.group, router_states(group), reasons)


_REMEMBERED_LIMIT: Final = 1024


def rejection_reasons(
    rejections: Iterable[RejectionLike], remembered: dict[tuple[str, str], str] | None = None
) -> dict[tuple[object, str], str]:
    """``differs_in`` per (group, rejected checksum), from ``rejections``.

    ``remembered`` keeps what each pair of checksums (incumbent's, rejected card's) was found to
    differ in; the same pair always differs in the same inputs, so when the cards are not at
    hand (a held incumbent with no member left) the remembered answer still stands.
    """
    out: dict[tuple[object, str], str] = {}
    for rejection in rejections:
        why = differs_in(rejection.differences)
        if remembered is not None:
            pair = (rejection.incumbent_checksum, rejection.rejected_checksum)
            if why == DIFFERS_IN_UNKNOWN:
                why = remembered.get(pair, why)
            elif pair not in remembered:
                if len(remembered) >= _REMEMBERED_LIMIT:
                    remembered.clear()
                remembered[pair] = why
        out[(rejection.group, rejection.rejected_checksum)] = why
    return out


def worker_sets(
    groups: Iterable[GroupLike],
    rejections: Iterable[RejectionLike] = (),
    remembered: dict[tuple[str, str], str] | None = None,
) -> tuple[WorkerSetState, ...]:
    """Every WorkerSet's workers with their states, sorted by labels.

    ``remembered`` is :func:`rejection_reasons`' memory of what checksum pairs differ in.
    """
    reasons = rejection_reasons(rejections, remembered)
    members: dict[WorkerSetLabels, list[GroupLike]] = {}
    for group in groups:
        members.setdefault(WorkerSetLabels.of(group.group), []).append(group)
    return tuple(
        WorkerSetState(labels, merged_workers(members[labels], reasons))
        for labels in sorted(members)
    )


def merged_workers(
    groups: Iterable[GroupLike], reasons: Mapping[tuple[object, str], str]
) -> dict[int, tuple[str, str]]:
    """Merge the workers of ``groups`` (one WorkerSet's, in status order), each at its best.

    ``reasons`` is :func:`rejection_reasons`' answer; a worker listed by two groups keeps the
    state of the first that ranks highest.
    """
    return merge_resolved(_group_workers(group, reasons) for group in groups)


def merge_resolved(
    per_group: Iterable[Mapping[int, tuple[str, str]]],
) -> dict[int, tuple[str, str]]:
    """Merge groups' resolved workers (status order): each keeps the first highest ranked."""
    pool: dict[int, tuple[str, str]] = {}
    for workers in per_group:
        for worker, found in workers.items():
            known = pool.get(worker)
            if known is None or _rank(found) > _rank(known):
                pool[worker] = found
    return pool


def _rank(found: tuple[str, str]) -> int:
    return _PRIORITY.get(STATE_TABLE[found[0]].state, 0)
