"""Serving records: the wire vocabulary of the ``frontend-model-admission`` bucket, decoded.

Every frontend publishes its serving admissions to the ``frontend-model-admission`` bucket: one
record per worker namespace it serves, plus a capability record that says "this frontend is
here and speaks protocol v1". A record looks like::

    {"protocol": "v1", "frontend": "fe-a", "namespace": "prod-v2",
     "members": ["prod-v2/backend/generate/1a", ...],
     "groups": [{"model": "llama", "worker_set": "[...]", "checksum": "<mdc_checksum>",
                 "generation": 7, "members": ["prod-v2/backend/generate/1a", ...]}]}

``members`` is the part Dynamo's own publisher writes; ``groups`` (one entry per admitted
WorkerSet) is what a gate needs to tell models and configurations apart. A record without
``groups`` still counts, by namespace, with the model marked unverified.

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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from workerset_admission.errors import InvalidRecordError, bounded_text
from workerset_admission.keys import escape_token

__all__ = [
    "PROTOCOL",
    "BucketRead",
    "CapabilityRecord",
    "NamespaceRecord",
    "RawEntry",
    "Record",
    "ServedGroup",
    "parse_record",
]

PROTOCOL = "v1"

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


@dataclass(frozen=True, slots=True)
class ServedGroup:
    """One WorkerSet a frontend serves: its model, incumbent checksum and admitted members."""

    model: str
    worker_set: str
    checksum: str | None
    generation: int | None
    members: tuple[str, ...]


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


@dataclass(frozen=True, slots=True)
class CapabilityRecord:
    """A frontend's presence: it publishes serving admissions with this protocol.

    ``resynced_at`` (Unix seconds) is when it last resynced after losing its connection, if it
    has: a frontend starting soon after takes its first listing as one within that outage.
    """

    key: str
    frontend: str
    published_at: float | None = None
    resynced_at: float | None = None


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
    )


def _namespace_of(members: Sequence[str]) -> str | None:
    # An instance key is "<ns>/<component>/<endpoint>/<id hex>": the namespace is its first part.
    namespaces = {member.split("/", 1)[0] for member in members}
    return namespaces.pop() if len(namespaces) == 1 else None


def _check_key(key: str, frontend: str, capability: bool) -> str | None:
    """Refuse a record whose key is not its own frontend's; return the key's namespace token.

    A frontend's NATS user may write only under ``v1.<its id>.``, so a record counts only when
    the frontend its value names is the one its key names: no frontend can speak for another,
    or for one that does not exist.
    """
    parts = key.split(".")
    own = parts[:2] == [PROTOCOL, escape_token(frontend)]
    if capability and own and parts[2:] == ["capability"]:
        return None
    if not capability and own and len(parts) == 4 and parts[2] == "members":
        return parts[3]
    raise _refuse(
        key, "identity_mismatch", f"the key is not frontend {bounded_text(frontend, 64)!r}'s"
    )


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
    key_namespace = _check_key(key, frontend, data.get("capability") is True)
    if data.get("capability") is True:
        resynced_at = data.get("resynced_at")
        if resynced_at is not None and not (
            isinstance(resynced_at, (int, float))
            and not isinstance(resynced_at, bool)
            and math.isfinite(resynced_at)
            and resynced_at >= 0
        ):
            raise _refuse(key, "bad_field", "resynced_at must be non-negative Unix seconds")
        return CapabilityRecord(
            key=key,
            frontend=frontend,
            published_at=published_at,
            resynced_at=None if resynced_at is None else float(resynced_at),
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
    return NamespaceRecord(
        key=key,
        frontend=frontend,
        namespace=namespace,
        members=members,
        groups=groups,
        published_at=published_at,
    )
