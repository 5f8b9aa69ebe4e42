"""What telemetry costs per discovery update, with and without the SDK.

A plain script, not a test: ``python integration/bench/bench_telemetry_overhead.py [N]``.
Each configuration applies N updates through ``apply_update`` with a decision and an empty
effect list (the common case: a duplicate or an admitted join), and prints microseconds per
update next to a bare loop doing the same work without telemetry. The spans go to an exporter
that drops them, so the figure is the process's own cost, not a network's.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBasedTraceIdRatio
from workerset_admission.identity import EndpointId, GroupKey, WorkerType
from workerset_admission.ports import DiscoveryEntry, SourcePut
from workerset_admission.telemetry import AdmissionTelemetry

GROUP = GroupKey.build("llama", EndpointId("ns", "backend", "generate"), "chat", WorkerType.DECODE)


class DropExporter(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def events(count: int) -> list[SourcePut]:
    now = time.time()
    return [
        SourcePut(DiscoveryEntry(f"v1.mdc.ns.backend.generate.{i:x}", b"", i, published_at=now))
        for i in range(count)
    ]


def per_update(run: Callable[[list[SourcePut]], None], updates: list[SourcePut]) -> float:
    """Best of three runs, in microseconds per update."""
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        run(updates)
        best = min(best, time.perf_counter() - started)
    return best / len(updates) * 1e6


def through(telemetry: AdmissionTelemetry) -> Callable[[list[SourcePut]], None]:
    def run(updates: list[SourcePut]) -> None:
        for event in updates:
            with telemetry.apply_update(event) as update:
                update.record_decision("admitted", GROUP)
                update.effects([])

    return run


def bare(updates: list[SourcePut]) -> None:
    decided: dict[str, str] = {}
    for event in updates:
        decided[event.entry.key] = "admitted"


def sdk(sampler: object | None, *, trace_updates: bool) -> AdmissionTelemetry:
    provider = TracerProvider(sampler=sampler, shutdown_on_exit=False)  # type: ignore[arg-type]
    provider.add_span_processor(BatchSpanProcessor(DropExporter(), max_queue_size=65536))
    meters = MeterProvider(metric_readers=[InMemoryMetricReader()], shutdown_on_exit=False)
    return AdmissionTelemetry(
        tracer_provider=provider, meter_provider=meters, trace_updates=trace_updates
    )


def main(count: int) -> dict[str, float]:
    updates = events(count)
    results = {
        "bare loop, no telemetry": per_update(bare, updates),
        "API only (no SDK installed)": per_update(through(AdmissionTelemetry()), updates),
        "SDK metrics, update spans off": per_update(
            through(sdk(ALWAYS_ON, trace_updates=False)), updates
        ),
        "SDK, update spans sampled at 1%": per_update(
            through(sdk(ParentBasedTraceIdRatio(0.01), trace_updates=True)), updates
        ),
        "SDK, every update span recorded": per_update(
            through(sdk(ALWAYS_ON, trace_updates=True)), updates
        ),
    }
    return {name: round(value, 2) for name, value in results.items()}


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 50_000
    print(json.dumps({"updates": n, "microseconds_per_update": main(n)}, indent=2))
