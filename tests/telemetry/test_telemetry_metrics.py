"""Metrics the facade records: exact names, attribute sets and values."""

from __future__ import annotations

import dataclasses
import time

from opentelemetry.sdk.metrics.export import HistogramDataPoint, NumberDataPoint
from telemetry_harness import Harness
from workerset_admission.errors import REFUSAL_REASONS
from workerset_admission.identity import EndpointId, GroupKey, WorkerType
from workerset_admission.ports import DiscoveryEntry, SourceDelete, SourcePut
from workerset_admission.service.status_model import (
    EMPTY_STATUS,
    CohortStatusView,
    GroupStatusReport,
    state_summary,
)
from workerset_admission.telemetry import AdmissionStateSummary
from workerset_admission.telemetry import names as n

GROUP = GroupKey.build("llama", EndpointId("ns", "backend", "generate"), "chat", WorkerType.DECODE)


def put(published_at: float | None = None) -> SourcePut:
    return SourcePut(
        DiscoveryEntry(key="v1.mdc.ns.b.g.1", value=b"", revision=1, published_at=published_at)
    )


def labels(**kwargs: str) -> frozenset[tuple[str, str]]:
    return frozenset(kwargs.items())


def test_updates_are_counted_by_operation_and_decision(harness: Harness) -> None:
    for decision in ("admitted", "admitted", "rejected"):
        with harness.telemetry.apply_update(put()) as update:
            update.record_decision(decision, GROUP)
    with harness.telemetry.apply_update(SourceDelete(key="k", revision=2)):
        pass

    points = harness.points("workerset_admission.discovery.updates")
    op, dec = "operation", "decision"
    assert {k: p.value for k, p in points.items()} == {
        frozenset({(op, "put"), (dec, "admitted")}): 2,
        frozenset({(op, "put"), (dec, "rejected")}): 1,
        frozenset({(op, "delete"), (dec, "unchanged")}): 1,
    }


def test_invalid_records_are_counted_by_reason_every_reason_from_zero(harness: Harness) -> None:
    harness.telemetry.invalid_record("k1", "invalid_json")
    harness.telemetry.invalid_record("k2", "invalid_json")
    harness.telemetry.invalid_record("k3", "identity_mismatch")
    points = harness.points("workerset_admission.discovery.invalid_records")
    expected = {labels(reason=reason): 0 for reason in REFUSAL_REASONS}
    expected[labels(reason="invalid_json")] = 2
    expected[labels(reason="identity_mismatch")] = 1
    assert {k: p.value for k, p in points.items()} == expected


def test_builds_are_counted_by_outcome_and_timed_in_a_histogram(harness: Harness) -> None:
    with harness.telemetry.build_attempt(GROUP, "a", 1):
        pass
    with harness.telemetry.build_attempt(GROUP, "a", 2) as build:
        build.set_outcome("failed", "RuntimeError")

    counts = harness.points("workerset_admission.builds")
    # Every outcome is there from the start, so the first of each is an increase.
    assert {k: p.value for k, p in counts.items()} == {
        labels(outcome="ok"): 1,
        labels(outcome="failed"): 1,
        labels(outcome="cancelled"): 0,
    }
    metric = harness.metrics()["workerset_admission.build.duration"]
    assert metric.unit == "s"
    durations = {frozenset(p.attributes.items()): p for p in metric.data.data_points}
    for point in durations.values():
        assert isinstance(point, HistogramDataPoint)
        assert point.count == 1
        assert point.sum >= 0.0
        # Seconds-scale buckets, not the SDK's millisecond defaults.
        assert 600.0 in point.explicit_bounds


def test_publish_to_admission_latency_is_recorded_when_the_server_time_is_known(
    harness: Harness,
) -> None:
    with harness.telemetry.apply_update(put(published_at=time.time() - 0.5)):
        pass
    with harness.telemetry.apply_update(put(published_at=None)):
        pass
    # A server clock slightly ahead of ours counts as "just now", never as a negative age.
    with harness.telemetry.apply_update(put(published_at=time.time() + 60)):
        pass

    metric = harness.metrics()["workerset_admission.admission.latency"]
    assert metric.unit == "s"
    (point,) = metric.data.data_points
    assert point.count == 2
    assert point.min == 0.0
    assert 0.5 <= point.max < 60


def test_rejected_cohorts_and_successions_are_counted_by_model(harness: Harness) -> None:
    harness.telemetry.cohort_rejected(
        model="llama",
        worker_set=GROUP.worker_set,
        incumbent_checksum="a",
        rejected_checksum="b",
        instance="ns/backend/generate/1",
    )
    harness.telemetry.succession(GROUP, "a", "b", 1, 2)
    model = labels(model="llama")
    assert harness.points("workerset_admission.cohorts.rejected")[model].value == 1
    assert harness.points("workerset_admission.successions")[model].value == 1


def test_gauges_report_every_status_and_the_admitted_workers_from_the_state_callback(
    harness: Harness,
) -> None:
    state = {"summary": AdmissionStateSummary({"ready": 3, "retrying": 1}, admitted_workers=12)}
    harness.telemetry.observe_state(lambda: state["summary"])

    groups = harness.points("workerset_admission.groups")
    by_status = {dict(k)["status"]: p.value for k, p in groups.items()}
    assert by_status == dict.fromkeys(n.GROUP_STATUSES, 0) | {"ready": 3, "retrying": 1}
    (admitted,) = harness.points("workerset_admission.workers.admitted").values()
    assert isinstance(admitted, NumberDataPoint)
    assert admitted.value == 12

    # The gauges read the state at collection time, not when the callback was set.
    state["summary"] = AdmissionStateSummary({"ready": 2}, admitted_workers=7)
    (admitted,) = harness.points("workerset_admission.workers.admitted").values()
    assert admitted.value == 7


def _group(model: str, cohorts: tuple[tuple[int, ...], ...], held: bool) -> GroupStatusReport:
    key = GroupKey.build(model, EndpointId("ns", "backend", "generate"), "chat", WorkerType.DECODE)
    return GroupStatusReport(
        group=key,
        incumbent="c0",
        status="ready",
        generation=1,
        committed_generation=1,
        receiver=1,
        admitted=() if held else cohorts[0],
        routable=(),
        cohorts=tuple(CohortStatusView(f"c{i}", ids) for i, ids in enumerate(cohorts)),
        held_until=100.0 if held else None,
    )


def test_workers_are_counted_by_model_as_admitted_rejected_held_or_drained(
    harness: Harness,
) -> None:
    llama = dataclasses.replace(
        _group("llama", ((1, 2, 3), (4,), (5, 6)), held=False),
        drained=((9, "ops", None),),
    )
    snap = dataclasses.replace(
        EMPTY_STATUS, groups=(llama, _group("qwen", ((), (7, 8)), held=True))
    )
    harness.telemetry.observe_state(lambda: state_summary(snap))

    points = harness.points("workerset_admission.workers")
    counts = {(dict(k)["model"], dict(k)["state"]): p.value for k, p in points.items()}
    assert counts == {
        ("llama", "admitted"): 3,
        ("llama", "rejected"): 3,
        ("llama", "held"): 0,
        ("llama", "drained"): 1,
        ("qwen", "admitted"): 0,
        ("qwen", "rejected"): 0,
        ("qwen", "held"): 2,
        ("qwen", "drained"): 0,
    }


def test_without_a_state_callback_the_gauges_report_nothing(harness: Harness) -> None:
    harness.telemetry.invalid_record("k", "bad_json")  # so that a collection has data at all
    found = harness.metrics()
    assert "workerset_admission.groups" not in found
    assert "workerset_admission.workers.admitted" not in found


def test_metric_names_units_and_kinds_are_as_documented(harness: Harness) -> None:
    harness.telemetry.observe_state(
        lambda: AdmissionStateSummary({}, 0, workers={("m", "admitted"): 1})
    )
    with harness.telemetry.apply_update(put(published_at=time.time())) as update:
        update.record_decision("admitted")
    with harness.telemetry.build_attempt(GROUP, "a", 1):
        pass
    harness.telemetry.invalid_record("k", "bad_json")
    harness.telemetry.cohort_rejected(
        model="m", worker_set="w", incumbent_checksum="a", rejected_checksum="b", instance="i"
    )
    harness.telemetry.succession(GROUP, "a", "b", 1, 2)

    kinds = {name: type(m.data).__name__ for name, m in harness.metrics().items()}
    assert kinds == {
        "workerset_admission.discovery.updates": "Sum",
        "workerset_admission.discovery.invalid_records": "Sum",
        "workerset_admission.cohorts.rejected": "Sum",
        "workerset_admission.successions": "Sum",
        "workerset_admission.builds": "Sum",
        "workerset_admission.build.duration": "Histogram",
        "workerset_admission.admission.latency": "Histogram",
        "workerset_admission.groups": "Gauge",
        "workerset_admission.groups.held": "Gauge",
        "workerset_admission.workers.admitted": "Gauge",
        "workerset_admission.workers": "Gauge",
        "workerset_admission.view.lag": "Gauge",
    }
    for metric in harness.metrics().values():
        if type(metric.data).__name__ == "Sum":
            assert metric.data.is_monotonic
