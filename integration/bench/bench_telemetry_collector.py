"""Does an unreachable collector slow admission? Updates per second with OTLP export off, on to a
live collector, and on to a dead one.

A plain script, not a test: ``python integration/bench/bench_telemetry_collector.py [N]``.
Each configuration pushes N discovery updates through the telemetry facade (every update span
recorded, the worst case) while a real OTLP/HTTP exporter sends the spans in the background:
to a tiny collector on 127.0.0.1 that accepts every request, or to a loopback port where nothing
listens. The figure is what the admission path pays, measured on its own thread.
"""

from __future__ import annotations

import http.server
import json
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from workerset_admission.identity import EndpointId, GroupKey, WorkerType
from workerset_admission.ports import DiscoveryEntry, SourcePut
from workerset_admission.telemetry import AdmissionTelemetry

GROUP = GroupKey.build("llama", EndpointId("ns", "backend", "generate"), "chat", WorkerType.DECODE)


class _Accept(http.server.BaseHTTPRequestHandler):
    received = 0

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        self.rfile.read(length)
        type(self).received += 1
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        return


@contextmanager
def live_collector() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Accept)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
    finally:
        server.shutdown()
        server.server_close()


def dead_endpoint() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # The socket is closed again: nothing listens on that port while the run lasts.
    return f"http://127.0.0.1:{port}/v1/traces"


def updates(count: int) -> list[SourcePut]:
    now = time.time()
    return [
        SourcePut(DiscoveryEntry(f"v1.mdc.ns.backend.generate.{i:x}", b"", i, published_at=now))
        for i in range(count)
    ]


def rate(telemetry: AdmissionTelemetry, events: list[SourcePut]) -> float:
    started = time.perf_counter()
    for event in events:
        with telemetry.apply_update(event) as update:
            update.record_decision("admitted", GROUP)
            update.effects([])
    return len(events) / (time.perf_counter() - started)


def exporting(endpoint: str) -> tuple[AdmissionTelemetry, Callable[[], None]]:
    provider = TracerProvider(shutdown_on_exit=False)
    exporter = OTLPSpanExporter(endpoint=endpoint, timeout=2)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    telemetry = AdmissionTelemetry(tracer_provider=provider, trace_updates=True)
    return telemetry, provider.shutdown


def main(count: int) -> dict[str, float]:
    events = updates(count)
    results: dict[str, float] = {"export off (API only)": rate(AdmissionTelemetry(), events)}
    with live_collector() as url:
        telemetry, stop = exporting(url)
        results["export on, live collector"] = rate(telemetry, events)
        stop()
    telemetry, stop = exporting(dead_endpoint())
    results["export on, dead collector"] = rate(telemetry, events)
    started = time.perf_counter()
    stop()
    results["shutdown with a dead collector (s)"] = time.perf_counter() - started
    return {name: round(value, 1) for name, value in results.items()}


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
    print(json.dumps({"updates": n, "updates_per_second": main(n)}, indent=2))
