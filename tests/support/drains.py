"""Discovery listings and serving records as the drain tools read them, for tests."""

from __future__ import annotations

import json
from typing import Any

from support.cards import base_card, lora_card
from workerset_admission.card import encode_model_record, model_kv_key
from workerset_admission.card.serving_record import RawEntry, Record, parse_record
from workerset_admission.identity import EndpointId, GroupKey, WorkerType

MODEL = "tiny"


def card(
    namespace: str,
    instance: int,
    model: str = MODEL,
    component: str = "backend",
    *,
    block_size: int = 16,
    **changes: Any,
) -> Any:
    """A worker's model record: a 1.6.1 card the discovery boundary admits."""
    endpoint = EndpointId(namespace, component, "generate")
    body = base_card(block_size, display_name=model, slug=model) | changes
    return model_kv_key(endpoint, instance), encode_model_record(endpoint, instance, body)


def adapter(namespace: str, instance: int, name: str, component: str = "backend") -> Any:
    """A LoRA adapter's record on a worker (over its base card)."""
    endpoint = EndpointId(namespace, component, "generate")
    body = lora_card(name)
    return model_kv_key(endpoint, instance, name), encode_model_record(
        endpoint, instance, body, name
    )


def endpoint(namespace: str, instance: int, transport: dict[str, str]) -> Any:
    key = f"v1.instances.{namespace}.backend.generate.{instance:x}"
    value = {
        "type": "Endpoint",
        "namespace": namespace,
        "component": "backend",
        "endpoint": "generate",
        "instance_id": instance,
        "transport": transport,
    }
    return key, json.dumps(value).encode()


def worker(namespace: str, instance: int, host: str, model: str = MODEL) -> list[Any]:
    return [card(namespace, instance, model), endpoint(namespace, instance, {"tcp": f"{host}:9/x"})]


def worker_set(namespace: str, component: str = "backend") -> str:
    """The WorkerSet key an aggregated chat worker of ``namespace`` registers under."""
    endpoint = EndpointId(namespace, component, "generate")
    return GroupKey.build(MODEL, endpoint, "chat|completions", WorkerType.AGGREGATED).worker_set


def served_entry(frontend: str, namespace: str, *instances: int, model: str = MODEL) -> RawEntry:
    """One frontend's serving record for ``namespace``: these instances serve ``model``."""
    members = [f"{namespace}/backend/generate/{i:x}" for i in instances]
    value = {
        "protocol": "v1",
        "frontend": frontend,
        "namespace": namespace,
        "members": members,
        "groups": [
            {
                "model": model,
                "worker_set": worker_set(namespace),
                "checksum": "c",
                "members": members,
            }
        ],
    }
    return RawEntry(f"v1.{frontend}.members.{namespace}", json.dumps(value).encode())


def served(frontend: str, namespace: str, *instances: int, model: str = MODEL) -> Record:
    """The same record, parsed."""
    raw = served_entry(frontend, namespace, *instances, model=model)
    return parse_record(raw.key, raw.value)
