"""Every worker this frontend knows, in upstream Dynamo's serving-state words: one pure function.

Upstream's proposal for drains (DEP issue 11173, prototype PR 11118, open at 1.6.1) lists each
worker at ``GET /workers`` with a serving state: ``serving``, ``draining``, ``overloaded``,
``unavailable``, ``unknown`` (and ``drained`` once a drain is done). :func:`worker_listing`
gives this frontend's answer from the service's status read-model alone, one row per worker and
WorkerSet, with the admission state beside it:

=================  ======================================================================
serving state      when
=================  ======================================================================
``serving``        admitted, not drained, and routable here (a committed build, a live
                   endpoint record)
``draining``       drained, and this frontend still routes to it: a handover keeps the old
                   tenure serving its drained members until the successor is committed
``drained``        drained, and this frontend no longer routes to it (``drain --wait`` asks
                   every live frontend this question)
``unavailable``    not routable here: a rejected cohort's member, or admitted while the build
                   is not committed or its endpoint record is missing
``unknown``        the service has not applied its first listing yet, or the worker is
                   served on its last known records while a hold rides out an outage
=================  ======================================================================

``overloaded`` is the router's word for load, which admission does not see; it is not used.
Admission states: ``admitted``, ``drained``, ``rejected`` (a cohort behind the incumbent),
``pending`` (in the incumbent cohort, not admitted yet).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from workerset_admission.identity import GroupKey, group_fields
from workerset_admission.service.read_store import ReadStore
from workerset_admission.service.read_store import worker_listing as store_listing
from workerset_admission.service.status_model import (
    CohortStatusView,
    GroupStatusReport,
    ServiceStatus,
)

__all__ = [
    "SERVING_STATES",
    "group_view_from_json",
    "plain_worker_listing",
    "render_worker_table",
    "status_from_json",
    "worker_listing",
]

SERVING_STATES = ("serving", "draining", "drained", "unavailable", "unknown")


def _serving_state(
    instance: int, admission: str, group: GroupStatusReport, routed: set[int], synced: bool
) -> str:
    if not synced:
        return "unknown"
    if admission == "drained":
        return "draining" if instance in routed else "drained"
    if instance in group.last_known:
        return "unknown"
    if admission == "admitted" and instance in routed:
        return "serving"
    return "unavailable"


def worker_listing(status: ServiceStatus) -> list[dict[str, Any]]:
    """Return one row per (worker, WorkerSet) the status knows, sorted by WorkerSet then id.

    A status rendered from the service's read store is listed from the store's worker records
    (:func:`~.read_store.worker_listing`); one made otherwise (read back from a status reply)
    by :func:`plain_worker_listing`, the plain path the store is held to.
    """
    if isinstance(status.store, ReadStore):
        return store_listing(status.store, status.synced)
    return plain_worker_listing(status)


def plain_worker_listing(status: ServiceStatus) -> list[dict[str, Any]]:
    """Work every row out of the status's groups alone (what ``status --workers`` reads)."""
    rows: list[dict[str, Any]] = []
    for group in status.groups:
        drained = {instance: (by, at) for instance, by, at in group.drained}
        routed = set(group.routable)
        if group.handover is not None:
            routed |= set(group.handover[2])
        checksums: dict[int, str] = {}
        rejected: set[int] = set()
        for index, cohort in enumerate(group.cohorts):
            for member in cohort.members:
                checksums.setdefault(member, cohort.mdc_checksum)
                if index > 0:
                    rejected.add(member)
        if group.handover is not None:
            for member in group.handover[2]:
                checksums.setdefault(member, group.handover[0])
        for instance, checksum in group.drained_checksums:
            checksums.setdefault(instance, checksum)
        admitted = set(group.admitted)
        fields = group_fields(group.group)
        for instance in sorted(set(checksums) | set(drained) | admitted):
            if instance in drained:
                admission = "drained"
            elif instance in admitted:
                admission = "admitted"
            elif instance in rejected:
                admission = "rejected"
            else:
                admission = "pending"
            by, at = drained.get(instance, (None, None))
            rows.append(
                {
                    "instance_id": instance,
                    **fields,
                    "checksum": checksums.get(instance),
                    "admission": admission,
                    "serving_state": _serving_state(
                        instance, admission, group, routed, status.synced
                    ),
                    "drained_by": by,
                    "drained_at": at,
                }
            )
    rows.sort(key=lambda row: (row["worker_set_id"], row["model"], row["instance_id"]))
    return rows


def _ids(values: Iterable[Any] | None) -> tuple[int, ...]:
    return tuple(int(v) for v in values or ())


def group_view_from_json(doc: Mapping[str, Any]) -> GroupStatusReport:
    """Read one group of a status reply (``status --json``) back into the read-model's shape."""
    handover = doc.get("handover")
    return GroupStatusReport(
        group=GroupKey.from_id(doc["group_id"]),
        incumbent=doc.get("incumbent"),
        status=str(doc.get("status")),
        generation=doc.get("generation"),
        committed_generation=doc.get("committed_generation"),
        receiver=doc.get("receiver"),
        admitted=_ids(doc.get("admitted")),
        routable=_ids(doc.get("routable")),
        cohorts=tuple(
            CohortStatusView(str(c["checksum"]), _ids(c["members"])) for c in doc.get("cohorts", ())
        ),
        last_known=_ids(doc.get("last_known")),
        drained=tuple(
            (int(d["instance_id"]), str(d.get("by") or ""), d.get("at"))
            for d in doc.get("drained") or ()
        ),
        drained_checksums=tuple(
            (int(d["instance_id"]), str(d["checksum"]))
            for d in doc.get("drained") or ()
            if isinstance(d, Mapping) and isinstance(d.get("checksum"), str)
        ),
        handover=None
        if not handover
        else (
            str(handover["checksum"]),
            int(handover["committed_generation"]),
            _ids(handover["members"]),
        ),
    )


def status_from_json(doc: Mapping[str, Any]) -> ServiceStatus:
    """Read a status reply back into the read-model, as far as :func:`worker_listing` looks."""
    return ServiceStatus(
        health=str(doc.get("health")),
        synced=bool(doc.get("synced")),
        groups=tuple(group_view_from_json(g) for g in doc.get("groups", ())),
        readiness=(),
        invalid_total=int(doc.get("invalid_total", 0)),
        recent_invalid=(),
        live_instances=int(doc.get("live_instances", 0)),
        builds_in_flight=int(doc.get("builds_in_flight", 0)),
        listings_applied=int(doc.get("snapshots_applied", 0)),
        frontend=doc.get("frontend"),
    )


def render_worker_table(rows: Iterable[Mapping[str, Any]]) -> str:
    """Print the listing as a table: one line per worker and WorkerSet."""
    lines = [
        f"{'INSTANCE':>20}  {'NAMESPACE/COMPONENT/ENDPOINT':32}  {'MODEL':20}  ADMISSION  STATE"
    ]
    for row in rows:
        place = f"{row['namespace']}/{row['component']}/{row['endpoint']}"
        lines.append(
            f"{row['instance_id']:>20}  {place:32}  {row['model']:20}  "
            f"{row['admission']:9}  {row['serving_state']}"
        )
    return "\n".join(lines) + "\n"
