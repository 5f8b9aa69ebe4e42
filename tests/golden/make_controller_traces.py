"""Write the controller-parity traces in ``tests/golden/controller`` (run by hand, review the diff).

Each trace is one of Dynamo's own controller or readiness tests
(``lib/llm/src/discovery/controller.rs``, ``readiness.rs``), retold as discovery records, build
outcomes and clock ticks, and named after it. ``python tests/golden/make_controller_traces.py``
rewrites every ``<test>.jsonl`` trace and its replay output ``<test>.expected.json``; readiness
traces also get ``<test>.readiness.json``, the readiness of each (model, namespace) over the
WorkerSets the replay ends up serving. ``tests/golden/test_controller_traces.py`` replays them
byte for byte, and ``plugin/CONTRACT.md`` says, trace by trace, which Dynamo test it ports and
where the project deliberately behaves otherwise.

In Dynamo's tests, "spec" strings stand for card checksums; here each distinct spec is a card
that differs in one hashed field, so it has its own ``mdc_checksum``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from make_examples import card, delete, group_id, live, put
from trace_readiness import readiness_of
from workerset_admission.card import model_kv_key
from workerset_admission.identity import EndpointId
from workerset_admission.traces.replay import render, replay

OUT = Path(__file__).with_name("controller")
EP = EndpointId("namespace", "worker", "generate")
GID = group_id(EP)
SPEC = {
    name: card(kv_cache_block_size=size)
    for name, size in (("spec", 16), ("first", 32), ("second", 64), ("third", 128))
}
Event = dict[str, Any]


def add(instance_id: int, spec: str = "spec", ep: EndpointId = EP) -> Event:
    return put(ep, instance_id, SPEC[spec])


def remove(instance_id: int, ep: EndpointId = EP) -> Event:
    return delete(ep, instance_id)


def build(outcome: str = "ok", gid: str = GID) -> Event:
    return {"kind": "build", "group": gid, "outcome": outcome}


def tick(seconds: float) -> Event:
    return {"kind": "tick", "seconds": seconds}


def snapshot(*entries: tuple[int, str]) -> Event:
    return {
        "kind": "snapshot",
        "entries": [
            {"key": e["key"], "value": e["value"]} for e in (add(i, spec) for i, spec in entries)
        ],
    }


def with_contract(resize_mode: str | None) -> dict[str, Any]:
    # 1.6.1 keeps the Qwen video contract in runtime_data, outside the checksum.
    if resize_mode is None:
        return SPEC["spec"]
    contract = {"placeholder_target": "bare_video_token", "resize_mode": resize_mode}
    return card(runtime_config={"runtime_data": {"vllm_qwen_video_processor_contract": contract}})


def add_contract(instance_id: int, resize_mode: str | None) -> Event:
    return put(EP, instance_id, with_contract(resize_mode))


def adapter_card(projection: str, name: str) -> dict[str, Any]:
    # The adapter's projection fingerprint follows its LoRA settings, not its checksum.
    count = {"adapter-spec": 4, "updated": 8}[projection]
    return card(display_name=name, slug=name, lora={"name": name, "max_gpu_lora_count": count})


def add_adapter(
    instance_id: int, projection: str = "adapter-spec", suffix: str = "adapter"
) -> Event:
    return put(EP, instance_id, adapter_card(projection, suffix), suffix)


def remove_adapter(instance_id: int, suffix: str = "adapter") -> Event:
    return {"kind": "delete", "key": model_kv_key(EP, instance_id, suffix)}


# --------------------------------------------------------------------------- controller.rs


def contract_agreement_drives_the_fingerprint_and_survives_a_rolling_upgrade() -> list[Event]:
    return [
        add_contract(1, None),
        add_contract(2, "round_ties_even"),
        build(),
        remove(1),
    ]


def republished_contract_withdraws_the_commit_it_no_longer_matches() -> list[Event]:
    return [
        add_contract(1, "round_ties_even"),
        add_contract(2, "round_ties_even"),
        build(),
        add_contract(1, "legacy_ceil"),
    ]


def a_republished_contract_during_a_pending_rebuild_withdraws_the_retained_commit() -> list[Event]:
    return [
        add_contract(1, "round_ties_even"),
        add_contract(2, "round_ties_even"),
        build(),
        add_contract(3, None),
        add_contract(1, "legacy_ceil"),
    ]


def a_republished_contract_during_a_failed_rebuild_withdraws_the_retained_commit() -> list[Event]:
    return [
        add_contract(1, "round_ties_even"),
        add_contract(2, "round_ties_even"),
        build(),
        add_contract(3, None),
        build("failed"),
        add_contract(1, "legacy_ceil"),
    ]


def a_retained_pipeline_keeps_receiving_worker_updates_while_rebuilding() -> list[Event]:
    return [
        add_contract(1, "round_ties_even"),
        add_contract(2, "round_ties_even"),
        add_contract(3, None),
        build(),
        remove(3),
        build("failed"),
        remove(2),
        build(),
    ]


def membership_churn_keeps_one_build_and_commits_latest_members() -> list[Event]:
    return [add(1), add(2), remove(1), build(), add(3), remove(3)]


def duplicate_and_in_place_mutation_preserve_first_valid_incarnation() -> list[Event]:
    return [add(1, "first"), add(1, "first"), add(1, "second"), build()]


def competing_cohorts_preserve_serving_until_complete_incumbent_drain() -> list[Event]:
    return [
        add(1, "first"),
        build(),
        add(2, "second"),
        add(3, "second"),
        add(4, "third"),
        remove(1),
        build(),
    ]


def first_cohort_reserves_queued_and_active_construction() -> list[Event]:
    return [add(1, "first"), add(2, "second"), add(3, "second"), add(4, "third"), build()]


def final_removal_cancels_build_without_late_publication() -> list[Event]:
    return [add(1), remove(1), build()]


def recreated_group_rejects_prepared_result_from_prior_lifetime() -> list[Event]:
    return [add(1), remove(1), add(1), build()]


def adapter_cards_neither_start_nor_keep_worker_sets_alive() -> list[Event]:
    return [
        add_adapter(1),
        add(1, "first"),
        build(),
        remove_adapter(1),
        add_adapter(1),
        add_adapter(1, "updated"),
        remove(1, EP),
    ]


def desired_change_retries_a_failed_build_immediately() -> list[Event]:
    return [add(1), build("failed"), add(2), build()]


def snapshots_preserve_priority_and_recreated_cohorts_join_the_end() -> list[Event]:
    return [
        add(1, "first"),
        add(2, "second"),
        add(3, "third"),
        remove(2),
        add(2, "second"),
        snapshot((2, "second"), (3, "third"), (1, "first")),
        build(),
        remove(1),
        build(),
        remove(3),
        build(),
        remove(2),
    ]


def rejected_workers_and_adapters_cannot_reset_retry_or_change_publication() -> list[Event]:
    return [
        add(1, "first"),
        build("failed"),
        tick(0.5),
        add(2, "second"),
        add_adapter(2),
        remove(2),
        add(2, "second"),
        add_adapter(2, "updated"),
        add_adapter(0x99, suffix="unrelated-adapter"),
        # Had any of the above started a build, this would fail it and push the retry back.
        build("failed"),
        tick(0.25),
        tick(0.25),
        build(),
        remove_adapter(2),
        add_adapter(2),
        add(3, "third"),
        remove(3),
    ]


def a_resync_replaces_the_desired_instances() -> list[Event]:
    return [add(1), build(), snapshot((2, "spec"))]


def reconciliation_repairs_missed_state_without_undoing_newer_events() -> list[Event]:
    return [add(1), add(1), build(), remove(1), add(2), build(), snapshot((1, "spec"))]


# --------------------------------------------------------------------------- readiness.rs


def role_card(worker_type: str | None, needs: list[list[str]], **changes: Any) -> dict[str, Any]:
    value = card(needs=needs, **changes)
    if worker_type is None:
        value.pop("worker_type")
    else:
        value["worker_type"] = worker_type
    if worker_type == "prefill":
        value["model_type"] = "Prefill"
    elif worker_type == "encode":
        value["model_type"] = ""
    return value


def serve(
    ep: EndpointId, instance_id: int, value: dict[str, Any], alive: bool = True
) -> list[Event]:
    events = [put(ep, instance_id, value)]
    if alive:
        events.insert(0, live(ep, instance_id))
    return events


def roles(namespace: str, *units: tuple[str, str | None, list[list[str]], bool]) -> list[Event]:
    """One WorkerSet per unit (component, worker type, needs, live) in ``namespace``."""
    events: list[Event] = []
    for n, (component, worker_type, needs, alive) in enumerate(units, start=1):
        ep = EndpointId(namespace, component, "generate")
        events += serve(ep, n, role_card(worker_type, needs), alive)
    return events


def evaluator_matches_aggregated_pd_epd_and_dead_worker_semantics() -> list[Event]:
    return [
        *roles("aggregated", ("backend", "aggregated", [], True)),
        *roles(
            "pd",
            ("prefill", "prefill", [["decode"]], True),
            ("decode", "decode", [["prefill"]], True),
        ),
        *roles(
            "epd",
            ("encoder", "encode", [["prefill", "decode"], ["aggregated"]], True),
            ("prefill", "prefill", [], True),
            ("decode", "decode", [], True),
        ),
        *roles(
            "missing-decode",
            ("prefill", "prefill", [["decode"]], True),
            ("decode", "decode", [["prefill"]], False),
        ),
    ]


def evaluator_matches_legacy_fallback_for_legacy_only_and_mixed_inputs() -> list[Event]:
    return [
        *roles("legacy-only", ("backend", None, [], True)),
        *roles("mixed", ("backend", None, [], True), ("decode", "decode", [["prefill"]], False)),
        *roles("legacy-dead", ("backend", None, [], False)),
    ]


def evaluator_ignores_needs_of_dead_workers_but_reports_their_declared_role() -> list[Event]:
    return roles(
        "ns",
        ("backend", "aggregated", [], True),
        ("encoder", "encode", [["prefill", "decode"]], False),
    )


def duplicate_live_units_of_one_role_are_ambiguous_but_still_ready() -> list[Event]:
    return [
        *roles(
            "pd",
            ("prefill-a", "prefill", [["decode"]], True),
            ("prefill-b", "prefill", [["decode"]], True),
            ("decode", "decode", [["prefill"]], True),
        ),
        *roles(
            "scale-out",
            ("backend-a", "aggregated", [], True),
            ("backend-b", "aggregated", [], True),
        ),
    ]


def normalization_projects_legacy_prefill_cards() -> list[Event]:
    ep = EndpointId("ns", "prefill", "generate")
    legacy_prefill = card(model_type="Prefill", needs=[])
    legacy_prefill.pop("worker_type")
    explicit = card(model_type="Prefill", worker_type="prefill", needs=[["decode"]])
    plain_legacy = card()
    plain_legacy.pop("worker_type")
    return [
        *serve(ep, 1, legacy_prefill),
        *serve(ep, 2, explicit),
        *serve(EndpointId("ns", "backend", "generate"), 3, plain_legacy),
    ]


def empty_topology_is_not_ready() -> list[Event]:
    ep = EndpointId("ns", "backend", "generate")
    return [*serve(ep, 1, card()), build("failed", group_id(ep))]


CONTROLLER: list[Callable[[], list[Event]]] = [
    contract_agreement_drives_the_fingerprint_and_survives_a_rolling_upgrade,
    republished_contract_withdraws_the_commit_it_no_longer_matches,
    a_republished_contract_during_a_pending_rebuild_withdraws_the_retained_commit,
    a_republished_contract_during_a_failed_rebuild_withdraws_the_retained_commit,
    a_retained_pipeline_keeps_receiving_worker_updates_while_rebuilding,
    membership_churn_keeps_one_build_and_commits_latest_members,
    duplicate_and_in_place_mutation_preserve_first_valid_incarnation,
    competing_cohorts_preserve_serving_until_complete_incumbent_drain,
    first_cohort_reserves_queued_and_active_construction,
    final_removal_cancels_build_without_late_publication,
    recreated_group_rejects_prepared_result_from_prior_lifetime,
    adapter_cards_neither_start_nor_keep_worker_sets_alive,
    desired_change_retries_a_failed_build_immediately,
    snapshots_preserve_priority_and_recreated_cohorts_join_the_end,
    rejected_workers_and_adapters_cannot_reset_retry_or_change_publication,
    a_resync_replaces_the_desired_instances,
    reconciliation_repairs_missed_state_without_undoing_newer_events,
]
READINESS: list[Callable[[], list[Event]]] = [
    evaluator_matches_aggregated_pd_epd_and_dead_worker_semantics,
    evaluator_matches_legacy_fallback_for_legacy_only_and_mixed_inputs,
    evaluator_ignores_needs_of_dead_workers_but_reports_their_declared_role,
    duplicate_live_units_of_one_role_are_ambiguous_but_still_ready,
    normalization_projects_legacy_prefill_cards,
    empty_topology_is_not_ready,
]


def main() -> None:
    OUT.mkdir(exist_ok=True)
    for build_trace in CONTROLLER + READINESS:
        name = build_trace.__name__
        lines = [json.dumps(e, ensure_ascii=False, separators=(",", ":")) for e in build_trace()]
        (OUT / f"{name}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
        result = replay(lines)
        (OUT / f"{name}.expected.json").write_text(render(result), encoding="utf-8")
        if build_trace in READINESS:
            verdicts = readiness_of(result, lines)
            (OUT / f"{name}.readiness.json").write_text(
                json.dumps(verdicts, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
            )


if __name__ == "__main__":
    main()
