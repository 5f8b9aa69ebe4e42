"""Which frontends are live, and which worker namespaces each watches, read from serving records.

The one reading of liveness the gate and the drain tools share: a frontend is live while its
heartbeat is in the serving-admission bucket (``serving_record.live_records``: the server removes
a stopped frontend's heartbeat by its TTL; a frontend of an earlier release, without one, while
it has any record). A frontend watches the namespaces it publishes a
namespace record for; a namespace no live frontend has a record for is watched by none that can
be asked, and the drain tools judge it on the discovery bucket instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from workerset_admission.card.serving_record import NamespaceRecord, Record, live_records
from workerset_admission.keys import escape_token

__all__ = ["live_frontends", "record_filters", "watched_namespaces"]


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
        if isinstance(record, NamespaceRecord) and record.namespace is not None:
            namespaces.add(record.namespace)
    return {frontend: frozenset(names) for frontend, names in found.items()}
