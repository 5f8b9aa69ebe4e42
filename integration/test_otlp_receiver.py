"""The opt-in wiring exports to a real OTLP receiver of our own, over HTTP and over gRPC.

The receivers decode ``ExportTraceServiceRequest`` / ``ExportMetricsServiceRequest`` exactly as
a collector would, so these tests see what a backend sees: span names, links (which some
backends drop), and resource attributes such as ``service.name``. One test also carries the
trace context through a real nats-server: a worker's put with W3C headers, the discovery
source delivering it, and the frontend's apply span linking back to the worker's span.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import os
import socket
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
import nats
import pytest
from nats.js.api import KeyValueConfig
from natsfixture import NatsServer
from opentelemetry.proto.collector.metrics.v1 import (
    metrics_service_pb2,
    metrics_service_pb2_grpc,
)
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.sdk.trace import TracerProvider
from support.registrations import reg
from workerset_admission.adapters.nats.connect import NatsConnectOptions
from workerset_admission.adapters.nats.source import JetStreamDiscoverySource
from workerset_admission.admission import AdmissionCore, WorkerAdded
from workerset_admission.identity import EndpointId, GroupKey, Registration, WorkerType
from workerset_admission.ports import DiscoveryEntry, SourceListing, SourcePut
from workerset_admission.telemetry import AdmissionTelemetry, inject_headers, setup_telemetry

pytestmark = pytest.mark.timeout(60)

ENDPOINT = EndpointId("ns", "backend", "generate")
GROUP = GroupKey.build("llama", ENDPOINT, "chat", WorkerType.DECODE)


@dataclass
class Received:
    """What a receiver got, decoded; filled from server threads."""

    spans: list[Any] = field(default_factory=list)
    span_resources: list[dict[str, Any]] = field(default_factory=list)
    metric_names: set[str] = field(default_factory=set)
    metric_resources: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add_traces(self, request: trace_service_pb2.ExportTraceServiceRequest) -> None:
        with self.lock:
            for resource_spans in request.resource_spans:
                self.span_resources.append(attributes(resource_spans.resource.attributes))
                for scope_spans in resource_spans.scope_spans:
                    self.spans.extend(scope_spans.spans)

    def add_metrics(self, request: metrics_service_pb2.ExportMetricsServiceRequest) -> None:
        with self.lock:
            for resource_metrics in request.resource_metrics:
                self.metric_resources.append(attributes(resource_metrics.resource.attributes))
                for scope_metrics in resource_metrics.scope_metrics:
                    self.metric_names.update(m.name for m in scope_metrics.metrics)

    def named(self, name: str) -> list[Any]:
        with self.lock:
            return [s for s in self.spans if s.name == name]


def attributes(pairs: Any) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for pair in pairs:
        assert isinstance(pair, KeyValue)
        kind = pair.value.WhichOneof("value")
        found[pair.key] = getattr(pair.value, kind) if kind else None
    return found


class _Handler(BaseHTTPRequestHandler):
    received: Received

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        if self.headers.get("Content-Type") != "application/x-protobuf":
            self.send_response(415)
            self.end_headers()
            return
        if self.path == "/v1/traces":
            request = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
            self.received.add_traces(request)
            reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
        elif self.path == "/v1/metrics":
            metrics_request = metrics_service_pb2.ExportMetricsServiceRequest.FromString(body)
            self.received.add_metrics(metrics_request)
            reply = metrics_service_pb2.ExportMetricsServiceResponse().SerializeToString()
        else:
            self.send_response(404)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def http_receiver() -> Iterator[tuple[str, Received]]:
    received = Received()
    handler = type("Handler", (_Handler,), {"received": received})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", received
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, received: Received) -> None:
        self.received = received

    def Export(self, request: Any, context: Any) -> Any:
        self.received.add_traces(request)
        return trace_service_pb2.ExportTraceServiceResponse()


class _MetricsService(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, received: Received) -> None:
        self.received = received

    def Export(self, request: Any, context: Any) -> Any:
        self.received.add_metrics(request)
        return metrics_service_pb2.ExportMetricsServiceResponse()


@pytest.fixture
def grpc_receiver() -> Iterator[tuple[str, Received]]:
    received = Received()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceService(received), server)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(_MetricsService(received), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"http://127.0.0.1:{port}", received
    finally:
        server.stop(grace=None).wait(5)


@pytest.fixture
def otel_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=integration")
    # Long enough that only the shutdown flush exports metrics, which keeps the count exact.
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "600000")
    return monkeypatch


def registration(instance_id: int, checksum: str) -> Registration:
    return reg(instance_id, checksum, group=GROUP, fingerprint="")


def run_scenario(telemetry: AdmissionTelemetry, worker_headers: dict[str, str]) -> None:
    """An incumbent, then a disagreeing worker whose registration carried trace context."""
    core = AdmissionCore()
    for instance_id, checksum, headers in ((1, "aaaa", None), (2, "bbbb", worker_headers)):
        entry = DiscoveryEntry(
            key=f"v1.mdc.ns.backend.generate.{instance_id:x}",
            value=b"{}",
            revision=instance_id,
            headers=headers,
            published_at=time.time(),
        )
        with telemetry.apply_update(SourcePut(entry)) as update:
            update.effects(core.apply(WorkerAdded(registration(instance_id, checksum))))
    with telemetry.build_attempt(GROUP, "aaaa", generation=1):
        pass


def worker_span_headers() -> tuple[dict[str, str], Any]:
    """Headers a worker process would attach, from a tracer of its own (not the frontend's)."""
    worker = TracerProvider(shutdown_on_exit=False).get_tracer("worker")
    with worker.start_as_current_span("register worker") as span:
        headers = inject_headers()
    return headers, span.get_span_context()


def check_export(received: Received, worker_context: Any) -> None:
    applies = received.named("apply discovery_update")
    assert len(applies) == 2
    linked = [s for s in applies if s.links]
    assert len(linked) == 1
    (link,) = linked[0].links
    assert link.trace_id == worker_context.trace_id.to_bytes(16, "big")
    assert link.span_id == worker_context.span_id.to_bytes(8, "big")
    assert [e.name for e in linked[0].events] == ["workerset_admission.cohort_rejected"]
    assert len(received.named("build worker_set")) == 1
    for resource in received.span_resources + received.metric_resources:
        assert resource["service.name"] == "frontend-under-test"
        assert resource["deployment.environment"] == "integration"
    assert {
        "workerset_admission.discovery.updates",
        "workerset_admission.cohorts.rejected",
        "workerset_admission.builds",
        "workerset_admission.build.duration",
        "workerset_admission.admission.latency",
    } <= received.metric_names


def test_spans_links_resource_and_metrics_reach_an_otlp_http_receiver(
    otel_env: pytest.MonkeyPatch, http_receiver: tuple[str, Received]
) -> None:
    endpoint, received = http_receiver
    otel_env.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    otel_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    handle = setup_telemetry("frontend-under-test", set_global=False, log_correlation=False)
    telemetry = AdmissionTelemetry(
        tracer_provider=handle.tracer_provider, meter_provider=handle.meter_provider
    )
    headers, worker_context = worker_span_headers()
    run_scenario(telemetry, headers)
    handle.shutdown()
    check_export(received, worker_context)


def test_spans_links_resource_and_metrics_reach_an_otlp_grpc_receiver(
    otel_env: pytest.MonkeyPatch, grpc_receiver: tuple[str, Received]
) -> None:
    endpoint, received = grpc_receiver
    otel_env.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    otel_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    otel_env.setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
    handle = setup_telemetry("frontend-under-test", set_global=False, log_correlation=False)
    telemetry = AdmissionTelemetry(
        tracer_provider=handle.tracer_provider, meter_provider=handle.meter_provider
    )
    headers, worker_context = worker_span_headers()
    run_scenario(telemetry, headers)
    handle.shutdown()
    check_export(received, worker_context)


def test_a_down_receiver_costs_the_caller_nothing_but_a_bounded_shutdown(
    otel_env: pytest.MonkeyPatch,
) -> None:
    # A port nobody listens on: bind one, note it, close it.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    otel_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
    otel_env.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")
    otel_env.setenv("OTEL_METRICS_EXPORTER", "none")
    handle = setup_telemetry("frontend-under-test", set_global=False, log_correlation=False)
    telemetry = AdmissionTelemetry(tracer_provider=handle.tracer_provider)
    headers, _ = worker_span_headers()
    run_scenario(telemetry, headers)  # raises nothing
    handle.shutdown()


@pytest.mark.integration
async def test_trace_context_survives_a_real_nats_put_and_links_the_frontends_decision(
    otel_env: pytest.MonkeyPatch,
    http_receiver: tuple[str, Received],
    nats_server: NatsServer,
    bucket_name: str,
) -> None:
    endpoint, received = http_receiver
    otel_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    otel_env.setenv("OTEL_METRICS_EXPORTER", "none")
    handle = setup_telemetry("frontend-under-test", set_global=False, log_correlation=False)
    telemetry = AdmissionTelemetry(tracer_provider=handle.tracer_provider, bucket=bucket_name)

    nc = await nats.connect(nats_server.url)
    source = JetStreamDiscoverySource(
        NatsConnectOptions(servers=(nats_server.url,)), bucket=bucket_name
    )
    try:
        js = nc.jetstream()
        await js.create_key_value(KeyValueConfig(bucket=bucket_name))
        events = source.events()
        snapshot = await asyncio.wait_for(anext(events), 20)
        assert isinstance(snapshot, SourceListing)

        headers, worker_context = worker_span_headers()
        key = "v1.mdc.ns.backend.generate.2"
        await js.publish(f"$KV.{bucket_name}.{key}", b"{}", headers=headers)
        put = await asyncio.wait_for(anext(events), 20)
        assert isinstance(put, SourcePut)
        assert put.entry.key == key
        with telemetry.apply_update(put) as update:
            update.record_decision("rejected", GROUP)
        with contextlib.suppress(StopAsyncIteration, asyncio.CancelledError):
            await events.aclose()  # type: ignore[attr-defined]
    finally:
        await source.close()
        await nc.close()
    handle.shutdown()

    (applied,) = received.named("apply discovery_update")
    (link,) = applied.links
    assert link.trace_id == worker_context.trace_id.to_bytes(16, "big")
    assert link.span_id == worker_context.span_id.to_bytes(8, "big")
    assert attributes(applied.attributes)["messaging.destination.name"] == bucket_name
