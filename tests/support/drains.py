"""Discovery listings and serving records as the drain tools read them, for tests."""

from __future__ import annotations

import json
from typing import Any

from workerset_admission.card.serving_record import RawEntry, Record, parse_record

MODEL = "tiny"


def card(namespace: str, instance: int, model: str = MODEL, component: str = "backend") -> Any:
    key = f"v1.mdc.{namespace}.{component}.generate.{instance:x}"
    value = {
        "type": "Model",
        "namespace": namespace,
        "component": component,
        "endpoint": "generate",
        "instance_id": instance,
        "card_json": {"display_name": model},
    }
    return key, json.dumps(value).encode()


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


def served_entry(frontend: str, namespace: str, *instances: int, model: str = MODEL) -> RawEntry:
    """One frontend's serving record for ``namespace``: these instances serve ``model``."""
    members = [f"{namespace}/backend/generate/{i:x}" for i in instances]
    value = {
        "protocol": "v1",
        "frontend": frontend,
        "namespace": namespace,
        "members": members,
        "groups": [{"model": model, "worker_set": "[]", "checksum": "c", "members": members}],
    }
    return RawEntry(f"v1.{frontend}.members.{namespace}", json.dumps(value).encode())


def served(frontend: str, namespace: str, *instances: int, model: str = MODEL) -> Record:
    """The same record, parsed."""
    raw = served_entry(frontend, namespace, *instances, model=model)
    return parse_record(raw.key, raw.value)
