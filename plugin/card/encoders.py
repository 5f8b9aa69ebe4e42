"""Record encoders: model and endpoint discovery values spelled exactly as 1.6.1 writes them."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from workerset_admission.card import jsonio
from workerset_admission.card.envelope import CARD_MARK
from workerset_admission.errors import UsageError
from workerset_admission.identity import EndpointId
from workerset_admission.keys import check_instance_id

__all__ = ["encode_endpoint_record", "encode_model_record"]


def _card_text(card: Mapping[str, Any] | str | bytes) -> str:
    if isinstance(card, Mapping):
        return jsonio.dumps_compact(dict(card))
    text = card.decode("utf-8") if isinstance(card, bytes) else card
    try:
        value = jsonio.loads(text)
    except jsonio.JsonError as exc:
        raise UsageError(f"card text is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise UsageError("card text must be a JSON object")
    return text.strip()


def encode_model_record(
    endpoint: EndpointId,
    instance_id: int,
    card_mapping: Mapping[str, Any] | str | bytes,
    suffix: str | None = None,
) -> bytes:
    """Encode a 1.6.1 ``DiscoveryInstance::Model`` value (compact JSON, 1.6.1 field order)."""
    check_instance_id(instance_id)
    head = jsonio.dumps_compact(
        {
            "type": "Model",
            "namespace": endpoint.namespace,
            "component": endpoint.component,
            "endpoint": endpoint.endpoint,
            "instance_id": instance_id,
        }
    )
    text = f"{head[:-1]},{CARD_MARK}{_card_text(card_mapping)}"
    if suffix:
        text += f',"model_suffix":{json.dumps(suffix, ensure_ascii=False)}'
    return (text + "}").encode("utf-8")


def encode_endpoint_record(
    endpoint: EndpointId,
    instance_id: int,
    transport: Any = None,
    device_type: str | None = "cpu",
    extra: Mapping[str, Any] | None = None,
) -> bytes:
    """Encode a 1.6.1 ``DiscoveryInstance::Endpoint`` value."""
    check_instance_id(instance_id)
    value: dict[str, Any] = {
        "type": "Endpoint",
        "component": endpoint.component,
        "endpoint": endpoint.endpoint,
        "namespace": endpoint.namespace,
        "instance_id": instance_id,
        "transport": transport
        if transport is not None
        else {"tcp": f"127.0.0.1:0/{instance_id:x}"},
        "device_type": device_type,
    }
    value.update(extra or {})
    return jsonio.dumps_compact(value).encode("utf-8")
