"""Which frontends are live, and which worker namespaces each watches, read from serving records.

The one reading of liveness the gate and the drain tools share: a frontend is live while its
heartbeat is in the serving-admission bucket (``serving_record.live_records``: the server removes
a stopped frontend's heartbeat by its TTL; a frontend of an earlier release, without one, while
it has any record). A frontend watches the namespaces it publishes a
namespace record for; a namespace no live frontend has a record for is watched by none that can
be asked, and the drain tools judge it on the discovery bucket instead.

A frontend that cannot be asked is not always one that no longer routes. One whose view outlives
its writer (``serve`` writing a view that fails static) and whose heartbeat is gone is *silent*:
it routes by its last view until the lease its capability record states has run out, and the
server removes that record then (``serving_record.routing_records``). The drain's wait and the
gate count it: :func:`silent_frontends` names them, with the server time their lease ends.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from workerset_admission.card.serving_record import (
    CapabilityRecord,
    NamespaceRecord,
    Record,
    live_records,
    routing_records,
)
from workerset_admission.keys import escape_token

__all__ = [
    "leased_frontends",
    "live_frontends",
    "record_filters",
    "silent_frontends",
    "watched_namespaces",
]


def record_filters(namespaces: Iterable[str]) -> tuple[str, ...]:
    """Return the keys a poll about ``namespaces`` reads, as NATS subject filters.

    What says each frontend is live, and the frontends' records of those namespaces.
    """
    return (
        "v1.*.heartbeat",
        "v1.*.capability",
        *(f"v1.*.members.{escape_token(ns)}" for ns in sorted(set(namespaces))),
    )


def live_frontends(records: Iterable[Record]) -> Mapping[str, float | None]:
    """Map each live frontend to the newest publication time among its records (if known)."""
    newest: dict[str, float | None] = {}
    for record in live_records(records):
        stamp = record.published_at
        if record.frontend not in newest:
            newest[record.frontend] = stamp
            continue
        seen = newest[record.frontend]
        if stamp is not None and (seen is None or stamp > seen):
            newest[record.frontend] = stamp
    return newest


def watched_namespaces(records: Iterable[Record]) -> Mapping[str, frozenset[str]]:
    """Map each live frontend to the worker namespaces it publishes a record for."""
    found: dict[str, set[str]] = {}
    for record in live_records(records):
        namespaces = found.setdefault(record.frontend, set())
        # A record of held workers only: the frontend routes to none of the namespace, and
        # the drain judges the namespace on the discovery bucket, as before such records.
        if (
            isinstance(record, NamespaceRecord)
            and record.namespace is not None
            and not record.held_only
        ):
            namespaces.add(record.namespace)
    return {frontend: frozenset(names) for frontend, names in found.items()}


def silent_frontends(records: Iterable[Record]) -> Mapping[str, float | None]:
    """Map each silent frontend to the server time its lease on its last view ends (if known).

    Silent: no heartbeat, but a capability record saying how long it routes by its last view.
    """
    listed = list(records)
    live = set(live_frontends(listed))
    found: dict[str, float | None] = {}
    for record in routing_records(listed):
        if record.frontend in live or not isinstance(record, CapabilityRecord):
            continue
        if record.heartbeat or not record.routes_for:
            continue
        found[record.frontend] = record.routes_until()
    return found


def leased_frontends(records: Iterable[Record]) -> frozenset[str]:
    """Return the frontends whose records say their view outlives them by a stated lease.

    When such a frontend leaves the bucket, the server removed its lease: its view expired.
    """
    return frozenset(
        record.frontend
        for record in records
        if isinstance(record, CapabilityRecord) and not record.heartbeat and record.routes_for
    )
