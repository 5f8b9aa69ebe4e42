"""Telemetry never breaks admission: failing exporters, callbacks and odd inputs are absorbed."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from telemetry_harness import Harness
from workerset_admission.admission import RejectionReported, Succession
from workerset_admission.identity import EndpointId, GroupKey, WorkerType
from workerset_admission.ports import DiscoveryEntry, SourcePut
from workerset_admission.telemetry import AdmissionStateSummary, AdmissionTelemetry
from workerset_admission.telemetry import names as n

GROUP = GroupKey.build("llama", EndpointId("ns", "backend", "generate"), "chat", WorkerType.DECODE)


class ExplodingExporter(SpanExporter):
    def __init__(self) -> None:
        self.calls = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.calls += 1
        raise ConnectionError("collector is down")

    def shutdown(self) -> None:
        raise ConnectionError("collector is down")


def test_a_failing_exporter_does_not_reach_the_caller(
    rejection_records: list[logging.LogRecord],
) -> None:
    exporter = ExplodingExporter()
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry = AdmissionTelemetry(tracer_provider=provider, meter_provider=MeterProvider())

    with telemetry.apply_update(SourcePut(DiscoveryEntry("k", b"", 1))) as update:
        update.record_decision("admitted", GROUP)
        telemetry.effects(
            [
                RejectionReported(GROUP, "llama", GROUP.worker_set, "a", "b", "ns/b/g/1"),
                Succession(GROUP, "a", "b", 1, 2, 1, 2),
            ]
        )
    with telemetry.build_attempt(GROUP, "a", 3):
        pass

    assert exporter.calls == 3  # the exporter really was called, and really failed
    assert [r.levelno for r in rejection_records if r.levelno >= logging.ERROR] == [logging.ERROR]


def test_a_failing_state_callback_yields_no_gauge_points_and_no_exception() -> None:
    reader = InMemoryMetricReader()
    telemetry = AdmissionTelemetry(
        tracer_provider=TracerProvider(), meter_provider=MeterProvider(metric_readers=[reader])
    )

    def broken() -> AdmissionStateSummary:
        raise RuntimeError("state is being rebuilt")

    telemetry.observe_state(broken)
    telemetry.invalid_record("k", "bad_json")
    data = reader.get_metrics_data()
    assert data is not None
    names = {m.name for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    assert n.METRIC_INVALID_RECORDS in names
    assert n.METRIC_GROUPS not in names


def test_effects_of_unknown_kinds_and_malformed_values_are_skipped(harness: Harness) -> None:
    class Unknown:
        pass

    broken = Succession(GROUP, "a", "b", 1, 2, 1, 2)
    object.__setattr__(broken, "group", object())  # not a GroupKey: str() still names it
    harness.telemetry.effects([Unknown(), broken, 42])
    assert [s.name for s in harness.finished()] == [n.SPAN_SUCCEED]


def test_an_event_that_is_no_discovery_event_is_still_counted(harness: Harness) -> None:
    with harness.telemetry.apply_update(object()) as update:  # type: ignore[arg-type]
        assert update.operation == "unknown"
    op = frozenset({("operation", "unknown"), ("decision", "unchanged")})
    assert harness.points(n.METRIC_UPDATES)[op].value == 1


def test_without_any_sdk_every_call_is_a_cheap_no_op() -> None:
    telemetry = AdmissionTelemetry()
    with telemetry.apply_update(SourcePut(DiscoveryEntry("k", b"", 1))) as update:
        update.record_decision("admitted", GROUP)
        assert not update.span.is_recording()
    with telemetry.build_attempt(GROUP, "a", 1) as build:
        assert not build.span.is_recording()
    telemetry.effects([Succession(GROUP, "a", None, 1, None, 1, None)])
