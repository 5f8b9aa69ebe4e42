"""Serving records: the wire vocabulary of the ``frontend-model-admission`` bucket, decoded.

Every frontend publishes its serving admissions to the ``frontend-model-admission`` bucket: one
record per worker namespace it serves, a capability record that says "this frontend speaks
protocol v1", and a heartbeat. A record looks like::

    {"protocol": "v1", "frontend": "fe-a", "namespace": "prod-v2",
     "members": ["prod-v2/backend/generate/1a", ...],
     "groups": [{"model": "llama", "worker_set": "[...]", "checksum": "<mdc_checksum>",
                 "generation": 7, "members": ["prod-v2/backend/generate/1a", ...]}]}

``members`` is the part Dynamo's own publisher writes; ``groups`` (one entry per admitted
WorkerSet) is what a gate needs to tell models and configurations apart. A group whose tenure
is held after an outage with nobody served on it has no ``members`` and names in ``held`` the
workers whose return ends the hold, so a frontend that starts meanwhile reserves the same
tenure for the same workers (``adapters/nats/peers.py``); nothing else reads it. A record without
``groups`` still counts, by namespace, with the model marked unverified.

Liveness is kept apart from content, as a Kubernetes Lease is kept apart from its object. The
heartbeat ``v1.<frontend>.heartbeat`` (``{"protocol":"v1","frontend":<id>,"heartbeat":true}``)
is rewritten every few seconds with a per-key TTL, and the server removes it when its frontend
stops; the content records say ``"liveness":"heartbeat"`` and are written when they change.
A frontend whose records say so is live exactly while its heartbeat is in the bucket; one whose
records do not (an older writer, whose records all age out by the bucket's max age) is live
while it has a record. :func:`live_records` applies that rule: every reader that asks "is this
frontend live" reads the records it returns. The heartbeat decodes as a
:class:`CapabilityRecord` with ``heartbeat`` set, so a reader that only counts presence needs
nothing new.

A frontend that routes by a view which outlives its writer (the admitted view fails static)
says for how long: its capability record carries ``routes_for``, the seconds after the server
stored that record for which the frontend may still route by its last view if it writes nothing
more, and the record's per-key TTL is that long, so the server removes it when it stops meaning
anything. A frontend whose heartbeat is gone while that record is still in the bucket is
*silent*: it cannot be asked, but it still routes by its last view, which its namespace records
describe. :func:`routing_records` keeps the records of live and silent frontends: every reader
that asks "may this frontend still route to the worker" (the drain's wait, the rollout gate)
reads the records it returns.

A namespace record the server could not take (larger than its maximum payload) is replaced by a
small marker with ``"unpublished": <bytes>`` and no members: the frontend serves that namespace,
and nothing can be told of which workers, so a reader takes it for "may route to any of them".

A record counts only under its own frontend's key: ``v1.<frontend>.capability`` and
``v1.<frontend>.members.<namespace>`` (tokens escaped as discovery keys are), naming the same
frontend and namespace as its value. Each frontend's NATS user may write only under its own
``v1.<frontend>.`` (``docs/security.md``), so together no frontend can make the gate, or a peer
aligning its start, count a record for another frontend or for one that does not exist.

:func:`parse_record` refuses anything else with an
:class:`~workerset_admission.errors.InvalidRecordError` naming the key (``too_large``,
``not_json``, ``not_object``, ``protocol``, ``no_frontend``, ``identity_mismatch``,
``bad_members``, ``bad_field``, ``bad_group``). The readers of the bucket (the rollout gate,
the drain tools, a frontend's peers and start-up state) hand its entries over as a
:class:`BucketRead` of :class:`RawEntry` values, or the reason it could not be read.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from workerset_admission.errors import InvalidRecordError, bounded_text
from workerset_admission.keys import escape_token

__all__ = [
    "LIVENESS_HEARTBEAT",
    "PROTOCOL",
    "BucketRead",
    "CapabilityRecord",
    "NamespaceRecord",
    "RawEntry",
    "Record",
    "ServedGroup",
    "live_records",
    "parse_record",
    "routing_records",
]

PROTOCOL = "v1"

# The value of ``liveness`` in a content record whose frontend's heartbeat says it is live.
LIVENESS_HEARTBEAT = "heartbeat"

# A record is tiny; anything much larger is not ours and is refused before json.loads.
_MAX_RECORD_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class RawEntry:
    """One bucket entry: key, value bytes, and the wall-clock time the server stored it."""

    key: str
    value: bytes
    published_at: float | None = None


@dataclass(frozen=True, slots=True)
class BucketRead:
    """The bucket's current entries, or why they could not be read (``problem``)."""

    entries: tuple[RawEntry, ...] = ()
    problem: str | None = None
    # The server's own time when it was read (Unix seconds), when the server said it.
    server_time: float | None = None


@dataclass(frozen=True, slots=True)
class ServedGroup:
    """One WorkerSet a frontend serves: its model, incumbent checksum and admitted members."""

    model: str
    worker_set: str
    checksum: str | None
    generation: int | None
    members: tuple[str, ...]
    # A tenure held after an outage with nobody served on it: the members whose return ends
    # the hold (they are not served, so no reader of ``members`` counts them).
    held: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class NamespaceRecord:
    """What one frontend serves from one worker namespace.

    ``groups`` is None for a record that names only members (Dynamo's own shape); the gate then
    cannot tell which model those members serve.
    """

    key: str
    frontend: str
    namespace: str | None
    members: tuple[str, ...]
    groups: tuple[ServedGroup, ...] | None
    published_at: float | None = None
    # The record's frontend is live while its heartbeat is (not while this record is).
    leased: bool = False
    # A marker for a record too large to publish (its size in bytes): ``members`` says
    # nothing, and any worker of the namespace may be routed to.
    unpublished: int | None = None

    @property
    def held_only(self) -> bool:
        """Whether the record serves no one and only names workers a held tenure waits for.

        Its frontend routes to none of the namespace's workers: a reader that asks what it
        serves or watches takes it as no record, as a publisher before ``held`` wrote none.
        """
        return (
            self.unpublished is None
            and not self.members
            and self.groups is not None
            and not any(group.members for group in self.groups)
            and any(group.held for group in self.groups)
        )


@dataclass(frozen=True, slots=True)
class CapabilityRecord:
    """A frontend's presence: it publishes serving admissions with this protocol.

    ``resynced_at`` (Unix seconds) is when it last resynced after losing its connection, if it
    has: a frontend starting soon after takes its first listing as one within that outage. It is
    the writer's own clock, kept for older readers; ``resynced_server_at`` is the same moment by
    the NATS server's clock (the time the server stored the record that first said it), which a
    reader compares with the server's time, so no two hosts' clocks are ever compared.
    ``heartbeat`` marks the frontend's heartbeat record (``v1.<frontend>.heartbeat``);
    ``leased`` a capability record whose frontend is live while its heartbeat is.
    ``routes_for`` (seconds) is how long after ``published_at`` the frontend may still route by
    its last view though it writes nothing more (a capability record); a heartbeat says how
    long its view outlives the writer's last touch (``view_outlives``).
    """

    key: str
    frontend: str
    published_at: float | None = None
    resynced_at: float | None = None
    heartbeat: bool = False
    leased: bool = False
    resynced_server_at: float | None = None
    routes_for: float | None = None
    view_outlives: float | None = None

    def routes_until(self) -> float | None:
        """Return the server time until which a silent frontend may route by its view, if said."""
        if self.routes_for is None or self.published_at is None:
            return None
        return self.published_at + self.routes_for

    def resync_by_server(self) -> float | None:
        """When the server stored this frontend's last resync, by the server's clock.

        Until the writer has learned the server's time of its resync record, that record is
        the one in the bucket, and its own store time says it.
        """
        if self.resynced_at is None or not self.leased:
            return None
        return self.resynced_server_at if self.resynced_server_at is not None else self.published_at


Record = NamespaceRecord | CapabilityRecord


def _refuse(key: str, reason: str, detail: str) -> InvalidRecordError:
    return InvalidRecordError(reason, detail, key=key)


def _string_list(key: str, value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise _refuse(key, "bad_members", f"{where} must be a list of strings")
    return tuple(value)


def _optional_str(key: str, value: Any, where: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise _refuse(key, "bad_field", f"{where} must be a string")


def _parse_group(key: str, raw: Any, index: int) -> ServedGroup:
    where = f"groups[{index}]"
    if not isinstance(raw, dict):
        raise _refuse(key, "bad_group", f"{where} must be an object")
    model = raw.get("model")
    worker_set = raw.get("worker_set")
    if not isinstance(model, str) or not model:
        raise _refuse(key, "bad_group", f"{where}.model must be a non-empty string")
    if not isinstance(worker_set, str):
        raise _refuse(key, "bad_group", f"{where}.worker_set must be a string")
    generation = raw.get("generation")
    # bool is an int subclass; a JSON true is not a build generation.
    if generation is not None and (isinstance(generation, bool) or not isinstance(generation, int)):
        raise _refuse(key, "bad_group", f"{where}.generation must be an integer")
    return ServedGroup(
        model=model,
        worker_set=worker_set,
        checksum=_optional_str(key, raw.get("checksum"), f"{where}.checksum"),
        generation=generation,
        members=_string_list(key, raw.get("members", []), f"{where}.members"),
        held=_string_list(key, raw.get("held", []), f"{where}.held"),
    )


def _namespace_of(members: Sequence[str]) -> str | None:
    # An instance key is "<ns>/<component>/<endpoint>/<id hex>": the namespace is its first part.
    namespaces = {member.split("/", 1)[0] for member in members}
    return namespaces.pop() if len(namespaces) == 1 else None


def _check_key(key: str, frontend: str, capability: bool, heartbeat: bool = False) -> str | None:
    """Refuse a record whose key is not its own frontend's; return the key's namespace token.

    A frontend's NATS user may write only under ``v1.<its id>.``, so a record counts only when
    the frontend its value names is the one its key names: no frontend can speak for another,
    or for one that does not exist.
    """
    parts = key.split(".")
    own = parts[:2] == [PROTOCOL, escape_token(frontend)]
    if heartbeat and own and parts[2:] == ["heartbeat"]:
        return None
    if capability and own and parts[2:] == ["capability"]:
        return None
    if not capability and own and len(parts) == 4 and parts[2] == "members":
        return parts[3]
    raise _refuse(
        key, "identity_mismatch", f"the key is not frontend {bounded_text(frontend, 64)!r}'s"
    )


def _seconds(key: str, value: Any, where: str) -> float | None:
    if value is None:
        return None
    if (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    ):
        return float(value)
    raise _refuse(key, "bad_field", f"{where} must be non-negative Unix seconds")


def parse_record(key: str, value: bytes, published_at: float | None = None) -> Record:
    """Decode one bucket entry; bad data raises ``InvalidRecordError`` naming the key."""
    if len(value) > _MAX_RECORD_BYTES:
        raise _refuse(key, "too_large", f"{len(value)} bytes")
    try:
        data = json.loads(value)
    except (UnicodeDecodeError, ValueError) as error:
        raise _refuse(key, "not_json", str(error)) from None
    if not isinstance(data, dict):
        raise _refuse(key, "not_object", "a record must be a JSON object")
    if data.get("protocol") != PROTOCOL:
        raise _refuse(key, "protocol", f"unsupported protocol {data.get('protocol')!r}")
    frontend = data.get("frontend")
    if not isinstance(frontend, str) or not frontend:
        raise _refuse(key, "no_frontend", "the record does not name its frontend")
    if data.get("heartbeat") is True:
        _check_key(key, frontend, capability=False, heartbeat=True)
        return CapabilityRecord(
            key=key,
            frontend=frontend,
            published_at=published_at,
            heartbeat=True,
            leased=True,
            view_outlives=_seconds(key, data.get("view_outlives"), "view_outlives"),
        )
    leased = data.get("liveness") == LIVENESS_HEARTBEAT
    key_namespace = _check_key(key, frontend, data.get("capability") is True)
    if data.get("capability") is True:
        resynced_at = _seconds(key, data.get("resynced_at"), "resynced_at")
        return CapabilityRecord(
            key=key,
            frontend=frontend,
            published_at=published_at,
            resynced_at=resynced_at,
            leased=leased,
            resynced_server_at=_seconds(key, data.get("resynced_server_at"), "resynced_server_at"),
            routes_for=_seconds(key, data.get("routes_for"), "routes_for") if leased else None,
        )
    members = _string_list(key, data.get("members"), "members")
    raw_groups = data.get("groups")
    groups: tuple[ServedGroup, ...] | None = None
    if raw_groups is not None:
        if not isinstance(raw_groups, list):
            raise _refuse(key, "bad_group", "groups must be a list")
        groups = tuple(_parse_group(key, raw, index) for index, raw in enumerate(raw_groups))
    namespace = _optional_str(key, data.get("namespace"), "namespace")
    if namespace is None:
        namespace = _namespace_of(members)
    if namespace is not None and (not namespace or escape_token(namespace) != key_namespace):
        raise _refuse(key, "identity_mismatch", "the value's namespace is not its key's")
    unpublished = data.get("unpublished")
    if unpublished is not None and (
        isinstance(unpublished, bool) or not isinstance(unpublished, int) or unpublished < 0
    ):
        raise _refuse(key, "bad_field", "unpublished must be a size in bytes")
    return NamespaceRecord(
        key=key,
        frontend=frontend,
        namespace=namespace,
        members=members,
        groups=groups,
        published_at=published_at,
        leased=leased,
        unpublished=unpublished,
    )


def live_records(records: Iterable[Record]) -> list[Record]:
    """Keep the records of live frontends: a leased frontend's only while its heartbeat is here.

    A frontend that said its liveness is its heartbeat and has none in the bucket has stopped
    (the heartbeat's TTL ran out) or not yet begun; its content records, which outlive it until
    their own longer TTL, say nothing about what is served now.
    """
    listed = list(records)
    beating = {r.frontend for r in listed if isinstance(r, CapabilityRecord) and r.heartbeat}
    leased = {r.frontend for r in listed if r.leased}
    return [r for r in listed if r.frontend in beating or r.frontend not in leased]


def routing_records(records: Iterable[Record]) -> list[Record]:
    """Keep the records of frontends that may still route: live ones, and silent ones.

    A silent frontend said its liveness is its heartbeat, has none in the bucket, and still has
    a capability record that says how long it routes by its last view (``routes_for``): the
    server removes that record by its TTL once the view has expired, so its presence is the
    lease, judged on the server's clock. A frontend without one (an earlier release, or one
    whose view does not outlive it) drops out with its heartbeat, as :func:`live_records` says.
    """
    listed = list(records)
    beating = {r.frontend for r in listed if isinstance(r, CapabilityRecord) and r.heartbeat}
    leased = {r.frontend for r in listed if r.leased}
    lasting = {
        r.frontend
        for r in listed
        if isinstance(r, CapabilityRecord) and not r.heartbeat and r.routes_for
    }
    keep = beating | lasting
    return [r for r in listed if r.frontend in keep or r.frontend not in leased]
