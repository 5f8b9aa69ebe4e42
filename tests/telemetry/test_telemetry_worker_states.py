"""Workers in Dynamo's router vocabulary: the state table, the rule, and the series it makes."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import pytest
from telemetry_harness import Harness
from workerset_admission.admission import effects as fx
from workerset_admission.card.differences import Difference
from workerset_admission.identity import EndpointId, GroupKey, WorkerType
from workerset_admission.service.rejections import StandingRejection
from workerset_admission.service.status_model import (
    EMPTY_STATUS,
    CohortStatusView,
    GroupStatusReport,
    state_summary,
)
from workerset_admission.telemetry import names as n
from workerset_admission.telemetry.worker_states import (
    COUNT_STATES,
    DIFFERS_IN_VALUES,
    STATE_TABLE,
    differs_in,
    worker_sets,
)

# The states and reasons of Dynamo's frontend (lib/llm/src/http/service/worker_metrics.rs).
UPSTREAM_STATES = {"available", "pending", "excluded"}
UPSTREAM_REASONS = {
    "none",
    "checksum_mismatch",
    "invalid_config",
    "unavailable",
    "initializing",
    "materialization_failed",
    "commit_blocked",
}
EP = EndpointId("dgd", "backend", "generate")
GROUP = GroupKey.build("Qwen/Qwen3-0.6B", EP, "chat|completions", WorkerType.AGGREGATED)
WORKER_SET = {
    "model": "Qwen/Qwen3-0.6B",
    "target_namespace": "dgd",
    "target_component": "backend",
    "target_endpoint": "generate",
    "worker_type": "aggregated",
}


def group(
    cohorts: tuple[tuple[int, ...], ...],
    *,
    status: str = "ready",
    committed: bool = True,
    admitted: tuple[int, ...] | None = None,
    routable: tuple[int, ...] | None = None,
    key: GroupKey = GROUP,
    **extra: Any,
) -> GroupStatusReport:
    admitted = cohorts[0] if admitted is None else admitted
    return GroupStatusReport(
        group=key,
        incumbent="a" if cohorts else None,
        status=status,
        generation=1,
        committed_generation=1 if committed else None,
        receiver=1,
        admitted=admitted,
        routable=admitted if routable is None else routable,
        cohorts=tuple(CohortStatusView(c, ids) for c, ids in zip("abcd", cohorts, strict=False)),
        **extra,
    )


def rejection(checksum: str, *fields: str) -> StandingRejection:
    found = tuple(Difference(f, "1", "2") for f in fields) if fields else None
    return StandingRejection(GROUP, "a", checksum, f"{EP.path()}/9", found)


def states(*groups: Any, rejections: tuple[StandingRejection, ...] = ()) -> dict[int, tuple]:
    """Worker id -> (upstream state, reason, differs_in), over every WorkerSet."""
    out = {}
    for worker_set in worker_sets(groups, rejections):
        for worker, (state, why) in worker_set.workers.items():
            out[worker] = (STATE_TABLE[state].state, STATE_TABLE[state].reason, why)
    return out


def test_every_plugin_state_reads_as_one_of_dynamos_states_with_a_reason_of_its_own() -> None:
    assert {row.state for row in STATE_TABLE.values()} <= UPSTREAM_STATES
    reasons = [row.reason for row in STATE_TABLE.values()]
    assert len(reasons) == len(set(reasons))
    # Every reason Dynamo gives is used as Dynamo uses it, but for a malformed data-parallel
    # range: such a record is refused at the boundary here and is no worker of any WorkerSet.
    assert UPSTREAM_REASONS - set(reasons) == {"invalid_config"}
    assert set(reasons) - UPSTREAM_REASONS == {"last_known", "held", "drained"}


def test_a_rolling_update_shows_the_incumbent_available_and_the_other_cohort_excluded() -> None:
    found = states(
        group(((1, 2), (3,))),
        rejections=(rejection("b", "kv_cache_block_size", "router_config"),),
    )
    assert found == {
        1: ("available", "none", "none"),
        2: ("available", "none", "none"),
        3: ("excluded", "checksum_mismatch", "kv_cache_block_size"),
    }
    (worker_set,) = worker_sets([group(((1, 2), (3,)))])
    assert worker_set.labels.as_dict() == WORKER_SET
    assert worker_set.counts() == {"discovered": 3, "available": 2, "pending": 0, "excluded": 1}


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        ("queued", ("pending", "initializing", "none")),
        ("building", ("pending", "initializing", "none")),
        ("retrying", ("excluded", "materialization_failed", "none")),
        ("blocked", ("excluded", "commit_blocked", "none")),
    ],
)
def test_an_incumbent_not_yet_committed_reads_as_dynamo_reads_its_group_state(
    status: str, expected: tuple[str, str, str]
) -> None:
    assert states(group(((1,),), status=status, committed=False)) == {1: expected}


def test_a_committed_worker_without_a_live_instance_record_is_excluded_as_unavailable() -> None:
    assert states(group(((1, 2),), routable=(1,)))[2] == ("excluded", "unavailable", "none")


def test_a_new_member_of_a_served_group_is_pending_until_the_replacement_commits() -> None:
    found = states(group(((1, 2),), admitted=(1,)))
    assert found[2] == ("pending", "initializing", "none")
    blocked = states(group(((1, 2),), admitted=(1,), status="blocked_ready"))
    assert blocked == {1: ("available", "none", "none"), 2: ("excluded", "commit_blocked", "none")}


def test_during_a_hold_last_known_workers_are_available_and_the_others_wait() -> None:
    held = group(
        ((), (3,)),
        admitted=(1,),
        routable=(1,),
        held_until=time.time() + 30,
        last_known=(1,),
    )
    found = states(held, rejections=(rejection("b", "kv_cache_block_size"),))
    assert found == {
        1: ("available", "last_known", "none"),
        3: ("pending", "held", "kv_cache_block_size"),
    }


def test_a_drained_worker_is_excluded_with_reason_drained() -> None:
    # A drain takes the worker out of its cohort; the snapshot lists it apart, with who and when.
    drained = group(((1,), (3,)), drained=((2, "operator", 1.0),))
    found = states(drained)
    assert found[2] == ("excluded", "drained", "none")
    assert found[1] == ("available", "none", "none")
    (worker_set,) = worker_sets([drained])
    assert worker_set.counts() == {"discovered": 3, "available": 1, "pending": 0, "excluded": 2}


def test_groups_sharing_dynamos_labels_make_one_workerset_and_a_worker_keeps_its_best_state() -> (
    None
):
    other = GroupKey.build(GROUP.model, EP, "chat", WorkerType.AGGREGATED)
    sets = worker_sets([group(((1, 2),)), group(((9,), (1,)), key=other)])
    assert len(sets) == 1
    assert sets[0].workers[1] == ("admitted", "none")
    assert sets[0].counts() == {"discovered": 3, "available": 3, "pending": 0, "excluded": 0}


def test_a_pair_of_checksums_keeps_what_it_differs_in_when_the_cards_are_gone() -> None:
    remembered: dict[tuple[str, str], str] = {}
    worker_sets([group(((1,), (3,)))], (rejection("b", "kv_cache_block_size"),), remembered)
    held = group(((), (3,)), admitted=(), held_until=time.time() + 30)
    (worker_set,) = worker_sets([held], (rejection("b"),), remembered)
    assert worker_set.workers[3] == ("held", "kv_cache_block_size")
    (worker_set,) = worker_sets([held], (rejection("b"),))
    assert worker_set.workers[3] == ("held", "unknown")


def test_rejected_cohorts_successions_and_holds_are_reported_for_every_model_from_zero(
    harness: Harness,
) -> None:
    snap = dataclasses.replace(EMPTY_STATUS, groups=(group(((1,),)),))
    harness.telemetry.observe_state(lambda: state_summary(snap))
    for name in ("cohorts.rejected", "successions", "holds"):
        points = harness.points(f"workerset_admission.{name}")
        assert {k: p.value for k, p in points.items()} == {frozenset({("model", GROUP.model)}): 0}
    harness.telemetry.cohort_rejected(
        model=GROUP.model,
        worker_set="w",
        incumbent_checksum="a",
        rejected_checksum="b",
        instance="i",
    )
    (point,) = harness.points("workerset_admission.cohorts.rejected").values()
    assert point.value == 1


def test_the_first_difference_names_a_checksum_input_from_a_fixed_set() -> None:
    assert differs_in([Difference("router_config.kv_router_config.x", "1", "2")]) == (
        "router_config"
    )
    runtime = "runtime_config.runtime_data.vllm_inference_v1_generate"
    assert differs_in([Difference(runtime, "1", "2")]) == runtime
    assert differs_in(None) == "unknown"
    assert differs_in([Difference("something.else", "1", "2")]) == "unknown"
    assert len(DIFFERS_IN_VALUES) == len(set(DIFFERS_IN_VALUES)) <= 24


def test_the_series_carry_dynamos_labels_and_every_count_state(harness: Harness) -> None:
    snap = dataclasses.replace(
        EMPTY_STATUS,
        groups=(group(((1, 2), (3,))),),
        rejections=(rejection("b", "kv_cache_block_size"),),
    )
    harness.telemetry.observe_state(lambda: state_summary(snap))

    counts = harness.points("workerset_admission.router.workers")
    assert {frozenset(dict(k).items()) for k in counts} == {
        frozenset((WORKER_SET | {"state": s}).items()) for s in COUNT_STATES
    }
    assert {dict(k)["state"]: p.value for k, p in counts.items()} == {
        "discovered": 3,
        "available": 2,
        "pending": 0,
        "excluded": 1,
    }
    per_worker = harness.points("workerset_admission.router.worker_state")
    assert {k: p.value for k, p in per_worker.items()} == {
        frozenset(
            (
                WORKER_SET
                | {
                    "router_worker_id": str(worker),
                    "state": state,
                    "reason": reason,
                    "differs_in": why,
                }
            ).items()
        ): 1
        for worker, state, reason, why in (
            (1, "available", "none", "none"),
            (2, "available", "none", "none"),
            (3, "excluded", "checksum_mismatch", "kv_cache_block_size"),
        )
    }
    (cohort,) = harness.points("workerset_admission.rejected_cohort.workers").items()
    assert dict(cohort[0]) == WORKER_SET | {
        "incumbent_checksum": "a",
        "mdc_checksum": "b",
        "differs_in": "kv_cache_block_size",
    }
    assert cohort[1].value == 1


def test_the_incumbent_gauge_is_valued_at_the_start_of_its_tenure(harness: Harness) -> None:
    snap = dataclasses.replace(EMPTY_STATUS, groups=(group(((1,),)),))
    harness.telemetry.observe_state(lambda: state_summary(snap))
    began = time.time()
    harness.telemetry.effects([fx.OpenReceiver(GROUP, 1, "a", 1)])
    time.sleep(0.05)
    ((labels, point),) = harness.points("workerset_admission.incumbent.since").items()
    assert dict(labels) == WORKER_SET | {n.LABEL_MDC_CHECKSUM: "a"}
    assert began - 0.01 <= point.value <= began + 0.04
    # A later tenure (another receiver) starts its own clock.
    harness.telemetry.effects([fx.RetireReceiver(GROUP, 1, "a")])
    later = dataclasses.replace(snap, groups=(dataclasses.replace(snap.groups[0], receiver=2),))
    harness.telemetry.observe_state(lambda: state_summary(later))
    ((_, point),) = harness.points("workerset_admission.incumbent.since").items()
    assert point.value >= began + 0.04


def test_a_held_tenure_is_counted_by_model(harness: Harness) -> None:
    harness.telemetry.tenure_held(GROUP, "a", 1, deadline=10.0)
    (point,) = harness.points("workerset_admission.holds").values()
    assert point.value == 1
    assert dict(point.attributes) == {"model": GROUP.model}
