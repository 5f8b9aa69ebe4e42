"""Replay semantics: decoding as live, invalid records inert, simulated builds and clock."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from workerset_admission.admission import CoreSettings
from workerset_admission.card import encode_model_record, endpoint_kv_key, model_kv_key
from workerset_admission.cli import main
from workerset_admission.identity import EndpointId, GroupKey, WorkerType
from workerset_admission.traces.replay import TraceError, explain, render, replay

EP = EndpointId("ns1", "backend", "generate")
CARD: dict[str, Any] = {
    "display_name": "m",
    "slug": "m",
    "source_path": "m",
    "model_info": None,
    "tokenizer": None,
    "context_length": 4096,
    "kv_cache_block_size": 16,
    "migration_limit": 0,
    "model_type": "Chat | Completions",
    "model_input": "Tokens",
    "worker_type": "aggregated",
    "needs": [],
}
ROUTER = {"router_mode": "k_v", "kv_router_config": {}, "load_threshold_config": {}}
GID = GroupKey.build("m", EP, "chat|completions", WorkerType.AGGREGATED).id


def put(instance_id: int, **changes: Any) -> str:
    card = dict(CARD, **changes)
    value = encode_model_record(EP, instance_id, card).decode()
    return json.dumps({"kind": "put", "key": model_kv_key(EP, instance_id), "value": value})


def line(**event: Any) -> str:
    return json.dumps(event)


def out(lines: list[str]) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(render(replay(lines)))
    return result


def test_a_build_without_a_later_build_line_succeeds_at_once() -> None:
    [group] = out([put(1)])["groups"]
    assert (group["status"], group["generation"], group["admitted"]) == ("ready", 1, [1])


def test_a_build_named_by_a_later_line_stays_in_flight_until_that_line() -> None:
    ok = line(kind="build", group=GID, outcome="ok")
    failed = line(kind="build", group=GID, outcome="failed")
    assert out([put(1), put(2)])["groups"][0]["status"] == "ready"
    assert out([put(1), put(2), ok])["groups"][0]["status"] == "ready"
    assert out([put(1), put(2), failed])["groups"][0]["status"] == "retrying"
    # The failure lands when its line comes (clock 5), so the retry is due at 6, not at 1.
    later = [put(1), line(kind="tick", seconds=5.0), failed]
    assert out([*later, line(kind="tick", seconds=0.9)])["groups"][0]["status"] == "retrying"
    assert out([*later, line(kind="tick", seconds=1.0)])["groups"][0]["status"] == "ready"


def test_the_first_later_build_line_decides_the_build() -> None:
    ok = line(kind="build", group=GID, outcome="ok")
    failed = line(kind="build", group=GID, outcome="failed")
    assert out([put(1), ok, failed])["groups"][0]["status"] == "ready"
    assert out([put(1), failed, ok])["groups"][0]["status"] == "retrying"


def test_a_failed_build_retries_when_the_clock_reaches_the_deadline() -> None:
    failed = line(kind="build", group=GID, outcome="failed")
    before = out([put(1), failed, line(kind="tick", seconds=0.9)])["groups"][0]
    after = out([put(1), failed, line(kind="tick", seconds=0.9), line(kind="tick", seconds=0.1)])
    assert before["status"] == "retrying"
    assert (after["groups"][0]["status"], after["groups"][0]["generation"]) == ("ready", 2)


def test_a_build_line_with_no_build_in_flight_is_a_no_op() -> None:
    ok = line(kind="build", group=GID, outcome="ok")
    plain = out([put(1), ok])
    assert out([put(1), ok, line(kind="build", group=GID, outcome="failed")]) == plain
    assert out([line(kind="build", group="not json", outcome="ok")])["groups"] == []


def test_an_invalid_record_is_listed_and_changes_nothing() -> None:
    base = [put(1)]
    bad = [
        line(kind="put", key=model_kv_key(EP, 1), value="{broken"),
        line(kind="put", key="v1.mdc.too.short", value={}),
        line(kind="delete", key="nonsense"),
    ]
    result = out(base + bad)
    assert result["groups"] == out(base)["groups"]
    assert [entry["key"] for entry in result["invalid"]] == [
        model_kv_key(EP, 1),
        "v1.mdc.too.short",
        "nonsense",
    ]
    assert all(entry["reason"] for entry in result["invalid"])


def test_a_listing_keeps_a_listed_key_whose_new_value_is_refused() -> None:
    snapshot = line(kind="snapshot", entries=[{"key": model_kv_key(EP, 1), "value": "junk"}])
    result = out([put(1), put(2), snapshot])
    assert result["groups"][0]["admitted"] == [1]


def test_endpoint_records_are_validated_but_do_not_change_admission() -> None:
    good = {
        "type": "Endpoint",
        "namespace": "ns1",
        "component": "backend",
        "endpoint": "generate",
        "instance_id": 1,
        "transport": {"tcp": "127.0.0.1:1/1"},
        "device_type": "cpu",
    }
    lying = dict(good, instance_id=2)
    result = out(
        [
            put(1),
            line(kind="put", key=endpoint_kv_key(EP, 1), value=good),
            line(kind="put", key=endpoint_kv_key(EP, 1), value=lying),
            line(kind="delete", key=endpoint_kv_key(EP, 1)),
        ]
    )
    assert result["groups"][0]["admitted"] == [1]
    assert [e["key"] for e in result["invalid"]] == [endpoint_kv_key(EP, 1)]


def test_the_same_trace_renders_the_same_bytes() -> None:
    lines = [put(i, kv_cache_block_size=16 * (1 + i % 2)) for i in range(1, 20)]
    assert render(replay(lines)) == render(replay(list(lines)))


@pytest.mark.parametrize(
    "bad",
    [
        "not json",
        json.dumps({"kind": "jump"}),
        json.dumps({"kind": "put", "key": 3, "value": {}}),
        json.dumps({"kind": "tick", "seconds": -1}),
        json.dumps({"kind": "build", "group": GID, "outcome": "maybe"}),
        json.dumps({"kind": "snapshot", "entries": {}}),
    ],
)
def test_a_malformed_trace_line_is_a_trace_error(bad: str) -> None:
    with pytest.raises(TraceError):
        replay([put(1), bad])


def test_the_replay_command_reports_a_malformed_trace_with_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "bad.jsonl"
    trace.write_text("not json\n")
    assert main(["replay", str(trace)]) == 2
    assert "line 1" in capsys.readouterr().err


def test_the_explain_command_explains_a_rejected_instance(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join([put(1), put(2, kv_cache_block_size=32)]) + "\n")
    # The exit status is the answer: 1 not admitted, 0 admitted.
    assert main(["explain", str(trace), "ns1/backend/generate/2"]) == 1
    text = capsys.readouterr().out
    assert text.startswith("ns1/backend/generate/2 is not admitted")
    assert main(["explain", str(trace), model_kv_key(EP, 1)]) == 0
    assert capsys.readouterr().out.startswith("ns1/backend/generate/1 is admitted")


def test_a_rejection_lists_the_checksum_inputs_its_card_differs_in() -> None:
    result = out([put(1), put(2, kv_cache_block_size=32, aliases=["m2"], migration_limit=3)])
    [rejection] = result["rejections"]
    assert rejection["differences"] == [
        {"field": "kv_cache_block_size", "incumbent": "16", "rejected": "32"},
        {"field": "aliases", "incumbent": "[]", "rejected": '["m2"]'},
    ]
    assert {key: rejection[key] for key in ("model", "namespace", "component", "endpoint")} == {
        "model": "m",
        "namespace": "ns1",
        "component": "backend",
        "endpoint": "generate",
    }
    assert (rejection["model_types"], rejection["worker_type"]) == (
        ["chat", "completions"],
        "aggregated",
    )
    assert rejection["group_id"] == GID
    [group] = result["groups"]
    assert (group["group_id"], group["worker_set_id"]) == (GID, json.loads(GID)[1])


def test_explain_says_in_words_what_a_rejected_card_differs_in() -> None:
    result = replay([put(1), put(2, router_config=ROUTER)])
    text = explain(result, "ns1/backend/generate/2")
    assert "It differs from the incumbent in 1 input(s) of the checksum:" in text
    assert "  - router_config is absent from the incumbent card and set to {" in text
    assert "an absent router config and an explicit default one" in text
    # An admitted instance has nothing to differ in.
    assert "differs from the incumbent in" not in explain(result, "ns1/backend/generate/1")


def test_explain_takes_an_instance_id_in_decimal_or_in_hex(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text("\n".join([put(26), put(27, kv_cache_block_size=32)]) + "\n")
    for spelling in ("26", "0x1a", "ns1/backend/generate/1a"):
        assert main(["explain", str(trace), spelling]) == 0
        assert capsys.readouterr().out.startswith("ns1/backend/generate/1a is admitted")
    assert main(["explain", "--json", str(trace), "27"]) == 1
    answer = json.loads(capsys.readouterr().out)
    assert (answer["instance"], answer["admitted"]) == ("27", False)
    assert main(["explain", str(trace), "99"]) == 2
    assert "never registers instance id 99" in capsys.readouterr().err


def test_the_namespace_option_ignores_other_namespaces(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(put(1) + "\n")
    assert main(["replay", "--namespace", "elsewhere", str(trace)]) == 0
    assert json.loads(capsys.readouterr().out)["groups"] == []


def test_a_reconnect_snapshot_in_a_trace_holds_the_tenure_until_the_clock_runs_out() -> None:
    a1 = json.loads(put(1))
    b2 = json.loads(put(2, kv_cache_block_size=32))
    listing = [{"key": b2["key"], "value": b2["value"]}]
    trace = [
        json.dumps(a1),
        json.dumps(b2),
        line(kind="snapshot", entries=listing, reason="reconnect"),
    ]
    held = replay(trace, core_settings=CoreSettings(tenure_hold=30.0))
    (group,) = held.to_json()["groups"]
    # Worker 1 stays admitted on its last known record for one registration TTL.
    assert (group["admitted"], group["held_until"]) == ([1], 30.0)
    assert (group["last_known"], group["last_known_until"]) == ([1], 10.0)
    assert group["incumbent"] == group["cohorts"][0]["checksum"]
    assert "held after an outage" in explain(held, "ns1/backend/generate/2")
    (group,) = out([*trace, line(kind="tick", seconds=10)])["groups"]
    assert (group["admitted"], group["held_until"]) == ([], 30.0)
    assert "last_known" not in group
    (group,) = out([*trace, line(kind="tick", seconds=30)])["groups"]
    assert group["admitted"] == [2]
    assert "held_until" not in group
    (group,) = out([*trace, json.dumps(a1), line(kind="tick", seconds=30)])["groups"]
    assert group["admitted"] == [1]
    # Without the reason a snapshot is an ordinary listing: the succession happens at once.
    (group,) = out([*trace[:2], line(kind="snapshot", entries=listing)])["groups"]
    assert group["admitted"] == [2]


def test_a_state_line_makes_the_next_listing_reproduce_the_recorded_cohort_order() -> None:
    a = json.loads(put(0x20))
    b = json.loads(put(0x1, kv_cache_block_size=32))
    listing = line(
        kind="snapshot", entries=[{"key": e["key"], "value": e["value"]} for e in (a, b)]
    )
    # Without a state line a listing is observed in key order: 0x1's configuration first.
    assert out([listing])["groups"][0]["admitted"] == [0x1]
    first = replay([listing]).to_json()["groups"][0]
    b_checksum, a_checksum = (c["checksum"] for c in first["cohorts"])
    state = line(kind="state", frontend="fe-1", groups=[{"group": GID, "cohorts": [a_checksum]}])
    (group,) = out([state, listing])["groups"]
    assert (group["incumbent"], group["admitted"]) == (a_checksum, [0x20])
    assert b_checksum != a_checksum


def test_a_malformed_state_line_is_a_trace_error() -> None:
    with pytest.raises(TraceError):
        replay([line(kind="state", frontend="fe-1", groups=[{"group": "x", "cohorts": []}])])
