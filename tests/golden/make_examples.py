"""Write the bundled example traces in ``plugin/examples`` (run by hand, then review the output).

``python tests/golden/make_examples.py`` rewrites every ``*.jsonl`` trace, its expected
``*.expected.json`` replay output and its ``*.explain.json`` explanations (instance -> text).
The golden tests replay the traces and compare byte for byte, so a change of behaviour shows
up as a reviewed diff.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

# Run as a script: the shared test builders live one folder up, in tests/support.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from support.cards import base_card as demo_card
from workerset_admission.card import encode_model_record, endpoint_kv_key, model_kv_key
from workerset_admission.identity import EndpointId, GroupKey, WorkerType
from workerset_admission.traces.replay import explain, render, replay

EXAMPLES = Path(__file__).resolve().parents[2] / "plugin" / "examples"

BASE_CARD: dict[str, Any] = demo_card()


def card(**changes: Any) -> dict[str, Any]:
    value = copy.deepcopy(BASE_CARD)
    value.update(changes)
    return value


def record(
    ep: EndpointId, instance_id: int, card_json: dict[str, Any], suffix: str | None = None
) -> dict[str, Any]:
    value: dict[str, Any] = {
        "type": "Model",
        "namespace": ep.namespace,
        "component": ep.component,
        "endpoint": ep.endpoint,
        "instance_id": instance_id,
        "card_json": card_json,
    }
    if suffix is not None:
        value["model_suffix"] = suffix
    return value


def put(
    ep: EndpointId, instance_id: int, card_json: dict[str, Any], suffix: str | None = None
) -> dict[str, Any]:
    return {
        "kind": "put",
        "key": model_kv_key(ep, instance_id, suffix),
        "value": record(ep, instance_id, card_json, suffix),
    }


def put_raw(ep: EndpointId, instance_id: int, card_json: dict[str, Any]) -> dict[str, Any]:
    text = encode_model_record(ep, instance_id, card_json).decode()
    return {"kind": "put", "key": model_kv_key(ep, instance_id), "value": text}


def live(ep: EndpointId, instance_id: int) -> dict[str, Any]:
    return {
        "kind": "put",
        "key": endpoint_kv_key(ep, instance_id),
        "value": {
            "type": "Endpoint",
            "component": ep.component,
            "endpoint": ep.endpoint,
            "namespace": ep.namespace,
            "instance_id": instance_id,
            "transport": {"tcp": f"127.0.0.1:9000/{instance_id:x}"},
            "device_type": "cpu",
        },
    }


def delete(ep: EndpointId, instance_id: int, suffix: str | None = None) -> dict[str, Any]:
    return {"kind": "delete", "key": model_kv_key(ep, instance_id, suffix)}


def group_id(ep: EndpointId, worker_type: WorkerType = WorkerType.AGGREGATED) -> str:
    return GroupKey.build(BASE_CARD["display_name"], ep, "chat|completions", worker_type).id


def rolling_update_clean() -> list[dict[str, Any]]:
    """Versioned namespaces: v2 comes up beside v1, then v1 drains. No conflict anywhere."""
    v1 = EndpointId("dgd-v1", "backend", "generate")
    v2 = EndpointId("dgd-v2", "backend", "generate")
    old, new = card(), card(kv_cache_block_size=32)
    trace: list[dict[str, Any]] = []
    for i in (0x11, 0x12, 0x13):
        trace += [live(v1, i), put(v1, i, old)]
    for i in (0x21, 0x22, 0x23):
        trace += [live(v2, i), put_raw(v2, i, new)]
    trace.append(
        {
            "kind": "snapshot",
            "entries": [
                {"key": e["key"], "value": e["value"]} for e in trace if e["kind"] == "put"
            ],
        }
    )
    for i in (0x11, 0x12, 0x13):
        trace.append(delete(v1, i))
        trace.append({"kind": "delete", "key": endpoint_kv_key(v1, i)})
    return trace


def rolling_update_conflict() -> list[dict[str, Any]]:
    """An in-place rolling update with a changed card: the incumbent holds until it drains."""
    ep = EndpointId("prod", "backend", "generate")
    old, new = card(), card(kv_cache_block_size=32)
    gid = group_id(ep)
    trace: list[dict[str, Any]] = [
        put(ep, 0x1, old),
        {"kind": "build", "group": gid, "outcome": "failed"},
        put(ep, 0x2, old),
        put(ep, 0x3, new),
        put(ep, 0x4, new),
        put(ep, 0x5, new),
        {"kind": "tick", "seconds": 0.5},
        {"kind": "tick", "seconds": 0.5},
        {"kind": "build", "group": gid, "outcome": "ok"},
        put(ep, 0x3, new),
        put(ep, 0x2, card(kv_cache_block_size=64)),
        {"kind": "put", "key": model_kv_key(ep, 0x6), "value": record(ep, 0x7, new)},
        {"kind": "put", "key": model_kv_key(ep, 0x8), "value": "{not json"},
        delete(ep, 0x1),
        {
            "kind": "snapshot",
            "entries": [
                {"key": model_kv_key(ep, 0x2), "value": record(ep, 0x2, old)},
                {"key": model_kv_key(ep, 0x3), "value": record(ep, 0x3, new)},
                {"key": model_kv_key(ep, 0x4), "value": record(ep, 0x4, new)},
                {"key": model_kv_key(ep, 0x5), "value": "garbage"},
            ],
        },
        delete(ep, 0x2),
        {"kind": "build", "group": gid, "outcome": "ok"},
    ]
    return trace


def lora_adapters() -> list[dict[str, Any]]:
    """Adapters follow admitted workers only; fingerprint changes need no rebuild."""
    ep = EndpointId("prod", "backend", "generate")
    base, other = card(), card(context_length=8192)
    adapter = card(
        display_name="sql-lora",
        slug="sql-lora",
        source_path="Qwen/Qwen3-0.6B",
        lora={"name": "sql-lora", "max_gpu_lora_count": 4},
    )
    adapter_8 = card(
        display_name="sql-lora",
        slug="sql-lora",
        source_path="Qwen/Qwen3-0.6B",
        lora={"name": "sql-lora", "max_gpu_lora_count": 8},
    )
    return [
        put(ep, 0xA0, adapter, "sql-lora"),
        put(ep, 0xA1, base),
        put(ep, 0xA1, adapter, "sql-lora"),
        put(ep, 0xA2, other),
        put(ep, 0xA2, adapter, "sql-lora"),
        put(ep, 0xA1, adapter_8, "sql-lora"),
        delete(ep, 0xA1, "sql-lora"),
        put(ep, 0xA1, adapter, "sql-lora"),
        delete(ep, 0xA1),
    ]


TRACES = {
    "rolling_update_clean": (
        rolling_update_clean,
        ["dgd-v1/backend/generate/11", "dgd-v2/backend/generate/21"],
    ),
    "rolling_update_conflict": (
        rolling_update_conflict,
        ["prod/backend/generate/3", "prod/backend/generate/2", "prod/backend/generate/8"],
    ),
    "lora_adapters": (
        lora_adapters,
        ["prod/backend/generate/a2/sql-lora", "prod/backend/generate/a0/sql-lora"],
    ),
}


def main() -> None:
    for name, (build, explained) in TRACES.items():
        lines = [json.dumps(event, ensure_ascii=False, separators=(",", ":")) for event in build()]
        (EXAMPLES / f"{name}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
        result = replay(lines)
        (EXAMPLES / f"{name}.expected.json").write_text(render(result), encoding="utf-8")
        explanations = {key: explain(result, key) for key in explained}
        (EXAMPLES / f"{name}.explain.json").write_text(
            json.dumps(explanations, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
        )


if __name__ == "__main__":
    main()
