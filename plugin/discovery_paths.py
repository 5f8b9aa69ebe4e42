"""Dynamo's discovery store paths (etcd keys and file names alike) and the bucket keys they map to.

Dynamo 1.6.1 keeps one record per path in four buckets, whichever store it runs on:
``<ns>/<component>/<endpoint>/<id hex>`` (plus ``/<suffix>`` for a LoRA card) in ``instances``
and ``mdc``, and ``namespace/<ns>[/component/<c>[/endpoint/<e>]]/topic/<topic>/<publisher id
hex>`` in ``event_sources`` and ``event_channels``. Every bridge gives a record the bucket key
DESIGN.md names for it, through the one translation here.
"""

from __future__ import annotations

import re
from typing import Literal

from workerset_admission.card import event_kv_key
from workerset_admission.card.events import parse_dynamo_event_path
from workerset_admission.errors import InvalidRecordError
from workerset_admission.identity import EndpointId
from workerset_admission.keys import endpoint_kv_key, model_kv_key

__all__ = [
    "RECORD_KINDS",
    "RecordKind",
    "bucket_key_for_parts",
    "bucket_key_for_path",
    "parse_record_path",
]

RecordKind = Literal["mdc", "instances", "event_sources", "event_channels"]

# All four: the admitted view needs a worker's event sources and channels for KV routing.
RECORD_KINDS: tuple[RecordKind, ...] = ("instances", "mdc", "event_sources", "event_channels")

_HEX_ID = re.compile(r"0|[1-9a-f][0-9a-f]{0,15}")


def parse_record_path(kind: RecordKind, path: str) -> tuple[str, str, str, int, str | None] | str:
    """Split a discovery path; return the parts, or a reason token when it is not one."""
    parts = path.split("/")
    allowed = (4,) if kind == "instances" else (4, 5)
    if len(parts) not in allowed:
        return "bad_path_shape"
    if any(part == "" for part in parts):
        return "empty_path_segment"
    namespace, component, endpoint, id_hex = parts[:4]
    # Dynamo prints ids as lowercase hex without padding and parses them back the same way.
    if not _HEX_ID.fullmatch(id_hex):
        return "bad_instance_id"
    suffix = parts[4] if len(parts) == 5 else None
    return namespace, component, endpoint, int(id_hex, 16), suffix


def bucket_key_for_parts(
    kind: RecordKind,
    namespace: str,
    component: str,
    endpoint_name: str,
    instance_id: int,
    suffix: str | None,
) -> str:
    """Return the bucket key of an endpoint or model record given its path's parts."""
    endpoint = EndpointId(namespace, component, endpoint_name)
    if kind == "instances":
        return endpoint_kv_key(endpoint, instance_id)
    return model_kv_key(endpoint, instance_id, suffix)


def bucket_key_for_path(kind: RecordKind, path: str) -> str:
    """Return the bucket key of the record any Dynamo store keeps at ``v1/<kind>/<path>``.

    Raises :class:`InvalidRecordError` (with a reason token) for a path that names no record.
    """
    if kind == "event_sources" or kind == "event_channels":
        return event_kv_key(parse_dynamo_event_path(kind, path))
    parsed = parse_record_path(kind, path)
    if isinstance(parsed, str):
        raise InvalidRecordError(parsed, f"not a {kind} record path", key=f"v1/{kind}/{path}")
    return bucket_key_for_parts(kind, *parsed)
