"""Dynamo 1.6.1 model cards and discovery records for tests: one builder for each shape."""

from __future__ import annotations

from typing import Any

from workerset_admission.card import (
    encode_endpoint_record,
    encode_model_record,
    endpoint_kv_key,
    model_kv_key,
)
from workerset_admission.cli.demo import demo_card
from workerset_admission.identity import EndpointId, GroupKey, WorkerType
from workerset_admission.ports import DiscoveryEntry, SourceDelete, SourcePut

__all__ = [
    "EP",
    "base_card",
    "endpoint_entry",
    "group_of",
    "lora_card",
    "model_delete",
    "model_entry",
    "model_put",
]

EP = EndpointId("dgd-v1", "backend", "generate")


def base_card(block_size: int = 16, **changes: Any) -> dict[str, Any]:
    """Return the demo's small aggregated chat card with ``changes`` applied."""
    return demo_card(block_size) | changes


def lora_card(name: str, capacity: int = 4, block_size: int = 16) -> dict[str, Any]:
    """Return the card of LoRA adapter ``name`` on top of :func:`base_card`."""
    return base_card(
        block_size,
        display_name=name,
        slug=name,
        lora={"name": name, "max_gpu_lora_count": capacity},
    )


def group_of(card: dict[str, Any], endpoint: EndpointId = EP) -> GroupKey:
    """Return the WorkerSet group key an aggregated chat card registers under."""
    return GroupKey.build(card["display_name"], endpoint, "chat|completions", WorkerType.AGGREGATED)


def model_entry(
    instance_id: int,
    card: dict[str, Any] | None = None,
    *,
    suffix: str | None = None,
    endpoint: EndpointId = EP,
    revision: int = 1,
) -> DiscoveryEntry:
    """Return the KV entry of a model record (an adapter's when ``suffix`` is given)."""
    card = base_card() if card is None else card
    return DiscoveryEntry(
        model_kv_key(endpoint, instance_id, suffix),
        encode_model_record(endpoint, instance_id, card, suffix),
        revision,
    )


def model_put(instance_id: int, card: dict[str, Any] | None = None, **kwargs: Any) -> SourcePut:
    return SourcePut(model_entry(instance_id, card, **kwargs))


def model_delete(
    instance_id: int, *, suffix: str | None = None, endpoint: EndpointId = EP
) -> SourceDelete:
    return SourceDelete(model_kv_key(endpoint, instance_id, suffix), 2)


def endpoint_entry(instance_id: int, endpoint: EndpointId = EP) -> DiscoveryEntry:
    """Return the KV entry of an endpoint-instance (liveness) record."""
    return DiscoveryEntry(
        endpoint_kv_key(endpoint, instance_id), encode_endpoint_record(endpoint, instance_id), 1
    )
