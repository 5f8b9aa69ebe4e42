"""Endpoint liveness records: which instance serves an endpoint, checked against its key."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from workerset_admission.card import jsonio
from workerset_admission.card.boundary_settings import BoundarySettings
from workerset_admission.card.envelope import as_text, check_envelope, mapping_value, parse
from workerset_admission.errors import InvalidRecordError, UsageError
from workerset_admission.identity import EndpointId, instance_key
from workerset_admission.keys import ParsedKey, endpoint_kv_key

__all__ = ["EndpointRecord", "decode_endpoint_record"]


@dataclass(frozen=True, slots=True)
class EndpointRecord:
    """An endpoint liveness record: which instance serves an endpoint, and how to reach it."""

    endpoint: EndpointId
    instance_id: int
    transport: Any = None
    device_type: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False)

    @property
    def instance_key(self) -> str:
        return instance_key(self.endpoint, self.instance_id)


_ENDPOINT_FIELDS = ("namespace", "component", "endpoint", "instance_id", "transport", "device_type")


def decode_endpoint_record(
    parsed_key: ParsedKey,
    raw: bytes | bytearray | memoryview | str | Mapping[str, Any],
    settings: BoundarySettings | None = None,
) -> EndpointRecord:
    """Decode an endpoint liveness record; its identity must agree with its key."""
    settings = settings or BoundarySettings()
    if parsed_key.kind != "endpoint":
        raise UsageError("decode_endpoint_record needs an endpoint key")
    key = parsed_key.key or endpoint_kv_key(parsed_key.endpoint, parsed_key.instance_id)
    if isinstance(raw, Mapping):
        value = mapping_value(raw, key)
    else:
        data = raw if isinstance(raw, (bytes, str)) else bytes(raw)
        value = parse(as_text(data, settings, key), key)
    if jsonio.depth_of(value) > jsonio.MAX_DEPTH:
        raise InvalidRecordError("depth_limit", "recursion limit exceeded", key=key)
    obj = check_envelope(value, parsed_key, "Endpoint", _ENDPOINT_FIELDS)
    device = obj.get("device_type")
    if device is not None and not isinstance(device, str):
        raise InvalidRecordError("invalid_record", "field `device_type` must be a string", key=key)
    extra = {k: v for k, v in obj.items() if k not in _ENDPOINT_FIELDS and k != "type"}
    return EndpointRecord(
        parsed_key.endpoint, parsed_key.instance_id, obj.get("transport"), device, extra
    )
