"""The telemetry test harness: an AdmissionTelemetry wired to in-memory SDK exporters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from workerset_admission.telemetry import AdmissionTelemetry


@dataclass
class Harness:
    telemetry: AdmissionTelemetry
    spans: InMemorySpanExporter
    reader: InMemoryMetricReader
    tracer_provider: TracerProvider

    def finished(self, name: str | None = None) -> list[ReadableSpan]:
        return [s for s in self.spans.get_finished_spans() if name is None or s.name == name]

    def metrics(self) -> dict[str, Any]:
        """Metric name -> the SDK's metric data, from one collection."""
        data = self.reader.get_metrics_data()
        found: dict[str, Any] = {}
        if data is None:
            return found
        for resource_metrics in data.resource_metrics:
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    found[metric.name] = metric
        return found

    def points(self, name: str) -> dict[frozenset[tuple[str, Any]], Any]:
        """Data points of one metric keyed by their attribute set."""
        metric = self.metrics()[name]
        return {frozenset(p.attributes.items()): p for p in metric.data.data_points}


def make_harness(**kwargs: Any) -> Harness:
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider(shutdown_on_exit=False)
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    telemetry = AdmissionTelemetry(
        tracer_provider=tracer_provider, meter_provider=meter_provider, **kwargs
    )
    return Harness(telemetry, spans, reader, tracer_provider)
