"""Event-plane discovery records (``event_sources``, ``event_channels``): keys and values.

Dynamo 1.6.1 registers, beside a worker's endpoint and model records, where its event-plane
publishers are: an ``EventSource`` (a semantic source, for example the KV-event stream, whose
``metadata.worker.worker_id`` names the worker) and an ``EventChannel`` per topic it publishes
(the transport a subscriber connects to). A KV-aware router needs both for the workers it
routes to. They never enter admission: they ride along as per-instance data.

Dynamo's own key (relative to its bucket) is
``namespace/<ns>[/component/<comp>[/endpoint/<ep>]]/topic/<topic>/<publisher id hex>`` with
every name percent-encoded outside ``[A-Za-z0-9_-]``. The bucket key keeps that shape with
``.`` as the separator and the DESIGN escaping (``=XX``) on every name::

    v1.event_sources.namespace.<ns>[.component.<comp>[.endpoint.<ep>]].topic.<topic>.<id hex>
    v1.event_channels.<same>

A value must agree with its key on scope, topic and publisher id, as model and endpoint records
must; anything else is refused with the same reasons (``bad_key``, ``invalid_json``,
``invalid_record``, ``wrong_record_type``, ``identity_mismatch``, ``value_too_large``, ...).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from workerset_admission.card import jsonio
from workerset_admission.card.boundary import DEFAULT_MAX_VALUE_SIZE, escape_token, unescape_token
from workerset_admission.card.envelope import mapping_value, text_within
from workerset_admission.errors import InvalidRecordError, UsageError
from workerset_admission.identity import path_name_problem

__all__ = [
    "EVENT_BUCKETS",
    "EventBucket",
    "EventKey",
    "EventRecord",
    "decode_event_record",
    "dynamo_event_path",
    "event_kv_key",
    "is_event_key",
    "parse_dynamo_event_path",
    "parse_event_key",
]

EventBucket = Literal["event_sources", "event_channels"]
EVENT_BUCKETS: tuple[EventBucket, ...] = ("event_sources", "event_channels")
_PREFIXES = tuple(f"v1.{bucket}." for bucket in EVENT_BUCKETS)
_HEX_ID_RE = re.compile(r"0|[1-9a-f][0-9a-f]{0,15}")
_DYNAMO_PLAIN = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_RECORD_TYPES: dict[str, str] = {"event_sources": "EventSource", "event_channels": "EventChannel"}


@dataclass(frozen=True, slots=True)
class EventKey:
    """A decoded event-record key: bucket, scope, topic and publisher id."""

    bucket: EventBucket
    namespace: str
    component: str | None
    endpoint: str | None
    topic: str
    publisher_id: int
    key: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if self.endpoint is not None and self.component is None:
            raise UsageError("an endpoint scope needs its component")
        if not 0 <= self.publisher_id < 1 << 64:
            raise UsageError("publisher_id must fit in u64")

    def scope_names(self) -> tuple[tuple[str, str], ...]:
        """Return the scope as (level, name) pairs, outermost first."""
        names = [("namespace", self.namespace)]
        if self.component is not None:
            names.append(("component", self.component))
        if self.endpoint is not None:
            names.append(("endpoint", self.endpoint))
        return tuple(names)


def is_event_key(kv_key: str) -> bool:
    """Whether a bucket key belongs to one of the event buckets (it may still be malformed)."""
    return kv_key.startswith(_PREFIXES)


def event_kv_key(key: EventKey) -> str:
    """Return the bucket key of an event record."""
    parts = ["v1", key.bucket]
    for level, name in key.scope_names():
        parts += [level, escape_token(name)]
    parts += ["topic", escape_token(key.topic), f"{key.publisher_id:x}"]
    return ".".join(parts)


def _split_scope(
    tokens: list[str], unescape: Any, where: str
) -> tuple[str, str | None, str | None, str, str]:
    """Read ``namespace N [component C [endpoint E]] topic T ID`` from a token list."""
    bad = InvalidRecordError("bad_key", f"not an event record key: {where!r}", key=where)
    if len(tokens) not in (5, 7, 9) or tokens[0] != "namespace" or tokens[-3] != "topic":
        raise bad
    levels = tokens[:-3:2]
    if levels != ["namespace", "component", "endpoint"][: len(levels)]:
        raise bad
    names = [unescape(t) for t in tokens[1:-3:2]]
    namespace = names[0]
    component = names[1] if len(names) > 1 else None
    endpoint = names[2] if len(names) > 2 else None
    if not _HEX_ID_RE.fullmatch(tokens[-1]):
        raise InvalidRecordError(
            "bad_key", f"publisher id {tokens[-1]!r} is not canonical lowercase hex", key=where
        )
    return namespace, component, endpoint, unescape(tokens[-2]), tokens[-1]


def parse_event_key(kv_key: str) -> EventKey:
    """Parse an event-record bucket key, or raise :class:`InvalidRecordError` (``bad_key``)."""
    parts = kv_key.split(".")
    if len(parts) < 3 or parts[0] != "v1" or parts[1] not in EVENT_BUCKETS:
        raise InvalidRecordError("bad_key", f"not an event record key: {kv_key!r}", key=kv_key)
    bucket: EventBucket = "event_sources" if parts[1] == "event_sources" else "event_channels"

    def unescape(token: str) -> str:
        try:
            return unescape_token(token)
        except InvalidRecordError as exc:
            raise InvalidRecordError(exc.reason, exc.detail, key=kv_key) from None

    namespace, component, endpoint, topic, hex_id = _split_scope(parts[2:], unescape, kv_key)
    key = EventKey(bucket, namespace, component, endpoint, topic, int(hex_id, 16), kv_key)
    # Dynamo percent-encodes the names, so only the length can keep a record out of the view.
    problem = path_name_problem((), dynamo_event_path(key))
    if problem is not None:
        raise InvalidRecordError("bad_key", problem, key=kv_key)
    return key


def _dynamo_encode(name: str) -> str:
    return "".join(chr(b) if b in _DYNAMO_PLAIN else f"%{b:02X}" for b in name.encode("utf-8"))


def dynamo_event_path(key: EventKey) -> str:
    """Dynamo's own key for the record, relative to its bucket (names percent-encoded)."""
    parts: list[str] = []
    for level, name in key.scope_names():
        parts += [level, _dynamo_encode(name)]
    parts += ["topic", _dynamo_encode(key.topic), f"{key.publisher_id:x}"]
    return "/".join(parts)


def _dynamo_decode(segment: str, where: str) -> str:
    raw = bytearray()
    pos = 0
    while pos < len(segment):
        char = segment[pos]
        if char == "%":
            digits = segment[pos + 1 : pos + 3]
            if len(digits) != 2 or not all(c in "0123456789ABCDEFabcdef" for c in digits):
                raise InvalidRecordError("bad_key", f"bad percent escape in {where!r}", key=where)
            raw.append(int(digits, 16))
            pos += 3
        else:
            raw += char.encode("utf-8")
            pos += 1
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidRecordError("bad_key", f"{where!r} is not UTF-8", key=where) from None
    if not text:
        raise InvalidRecordError("bad_key", f"empty name in {where!r}", key=where)
    return text


def parse_dynamo_event_path(bucket: EventBucket, path: str) -> EventKey:
    """Parse Dynamo's key for an event record (as its file store names it, decoded once)."""
    namespace, component, endpoint, topic, hex_id = _split_scope(
        path.split("/"), lambda s: _dynamo_decode(s, path), path
    )
    return EventKey(bucket, namespace, component, endpoint, topic, int(hex_id, 16))


@dataclass(frozen=True, slots=True)
class EventRecord:
    """A validated event record: its key, and the worker it belongs to when the value says.

    ``worker_id`` is ``metadata.worker.worker_id`` of an event source; a channel names no
    worker (it is tied to one through the source with the same publisher id).
    """

    key: EventKey
    worker_id: int | None
    transport: Any = field(default=None, compare=False)


def _u64(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 64


def _scope_of(scope: Any, kv_key: str) -> tuple[str, str | None, str | None]:
    invalid = InvalidRecordError(
        "invalid_record", "field `scope` is not an event scope", key=kv_key
    )
    if not isinstance(scope, dict):
        raise invalid
    kind = scope.get("kind")
    if kind == "namespace" and isinstance(scope.get("name"), str):
        return scope["name"], None, None
    if (
        kind == "component"
        and isinstance(scope.get("namespace"), str)
        and isinstance(scope.get("component"), str)
    ):
        return scope["namespace"], scope["component"], None
    if kind == "endpoint":
        inner = scope.get("endpoint")
        if isinstance(inner, dict) and all(
            isinstance(inner.get(n), str) for n in ("namespace", "component", "name")
        ):
            return inner["namespace"], inner["component"], inner["name"]
    raise invalid


def decode_event_record(
    parsed: EventKey,
    raw: bytes | bytearray | memoryview | str | Mapping[str, Any],
    *,
    max_value_size: int = DEFAULT_MAX_VALUE_SIZE,
) -> EventRecord:
    """Validate one event record against its key; raise :class:`InvalidRecordError` if refused."""
    key = parsed.key or event_kv_key(parsed)
    if isinstance(raw, Mapping):
        value = mapping_value(raw, key)
    else:
        data = raw if isinstance(raw, (bytes, str)) else bytes(raw)
        try:
            value = jsonio.loads(text_within(data, max_value_size, key))
        except jsonio.JsonError as exc:
            raise InvalidRecordError(exc.reason, exc.detail, key=key) from None
    if jsonio.depth_of(value) > jsonio.MAX_DEPTH:
        raise InvalidRecordError("depth_limit", "recursion limit exceeded", key=key)
    if not isinstance(value, dict):
        raise InvalidRecordError("invalid_record", "an event record must be a JSON object", key=key)
    if isinstance(value, jsonio.DupDict) and value.dups:
        name = sorted(value.dups)[0]
        raise InvalidRecordError("duplicate_field", f"duplicate field `{name}`", key=key)
    expected = _RECORD_TYPES[parsed.bucket]
    if value.get("type") != expected:
        raise InvalidRecordError(
            "wrong_record_type",
            f"expected an {expected} record, got type {value.get('type')!r}",
            key=key,
        )
    scope = _scope_of(value.get("scope"), key)
    topic = value.get("topic")
    if not isinstance(topic, str):
        raise InvalidRecordError("invalid_record", "field `topic` must be a string", key=key)
    id_field = "publisher_id" if parsed.bucket == "event_sources" else "instance_id"
    publisher = value.get(id_field)
    if not _u64(publisher):
        raise InvalidRecordError("invalid_record", f"field `{id_field}` must be a u64", key=key)
    if scope != (parsed.namespace, parsed.component, parsed.endpoint) or (
        topic,
        publisher,
    ) != (parsed.topic, parsed.publisher_id):
        raise InvalidRecordError(
            "identity_mismatch",
            "the value's scope, topic or publisher id disagrees with its key",
            key=key,
        )
    if parsed.bucket == "event_channels":
        transport = value.get("transport")
        if not isinstance(transport, dict):
            raise InvalidRecordError(
                "invalid_record", "field `transport` must be an object", key=key
            )
        return EventRecord(parsed, None, transport)
    metadata = value.get("metadata")
    if not isinstance(metadata, dict):
        raise InvalidRecordError("invalid_record", "field `metadata` must be an object", key=key)
    worker = metadata.get("worker")
    if worker is None:
        return EventRecord(parsed, None)
    worker_id = worker.get("worker_id") if isinstance(worker, dict) else None
    if not _u64(worker_id):
        raise InvalidRecordError(
            "invalid_record", "field `metadata.worker.worker_id` must be a u64", key=key
        )
    return EventRecord(parsed, worker_id)
