"""The Prometheus endpoint, scraped over HTTP while the real service admits a rolling update.

A real nats-server, the real admission service and the real discovery publisher play the
scenario the metrics exist for: an incumbent, a disagreeing cohort, a malformed record, then
the incumbent draining and the other cohort succeeding it. Between the steps the test scrapes
the endpoint ``setup_telemetry(prometheus=...)`` serves on a free loopback port and reads the
figures an operator (and the alert rules) would read.
"""

from __future__ import annotations

import asyncio
import socket
import time
import urllib.request
from collections.abc import AsyncIterator, Callable
from typing import Any

import nats
import pytest
from natsfixture import NatsServer
from prometheus_client.parser import text_string_to_metric_families
from support.cards import base_card as demo_card
from workerset_admission.adapters.nats.registrar import WorkerRegistrar
from workerset_admission.errors import ConfigError
from workerset_admission.identity import EndpointId
from workerset_admission.service.admission_service import AdmissionService, GroupStatusReport
from workerset_admission.settings import Settings
from workerset_admission.telemetry import AdmissionTelemetry, TelemetryHandle, setup_telemetry
from workerset_admission.wiring.compose import create_service

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

ENDPOINT = EndpointId("prom", "backend", "generate")
MODEL = "Qwen/Qwen3-0.6B"


def card(block_size: int) -> dict[str, Any]:
    return demo_card(block_size)


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(port: int) -> Samples:
    """Every sample the endpoint serves, keyed by (series name, labels without scope labels)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        assert reply.status == 200
        assert reply.headers["Content-Type"].startswith("text/plain")
        text = reply.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = frozenset(
                (k, v) for k, v in sample.labels.items() if not k.startswith("otel_scope_")
            )
            samples[(sample.name, labels)] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


async def until(condition: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        await asyncio.sleep(0.02)


@pytest.fixture
def metrics_endpoint(monkeypatch: pytest.MonkeyPatch) -> TelemetryHandle:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
    return setup_telemetry(prometheus=("127.0.0.1", 0), set_global=False, log_correlation=False)


@pytest.fixture
async def running(
    nats_server: NatsServer, bucket_name: str, metrics_endpoint: TelemetryHandle
) -> AsyncIterator[tuple[AdmissionService, WorkerRegistrar, int]]:
    telemetry = AdmissionTelemetry(meter_provider=metrics_endpoint.meter_provider)
    settings = Settings(
        nats_servers=(nats_server.url,),
        discovery_bucket=bucket_name,
        admission_bucket=f"{bucket_name}-admission",
        frontend_id="prometheus-test",
    )
    service = await create_service(settings, telemetry=telemetry, publish=False, status=False)
    nc = await nats.connect(nats_server.url)
    workers = WorkerRegistrar(nc.jetstream(), bucket=bucket_name, ttl=None)
    try:
        await service.wait_synced(timeout=20)
        assert metrics_endpoint.prometheus_port is not None
        yield service, workers, metrics_endpoint.prometheus_port
    finally:
        await service.stop()
        await workers.close(withdraw=False)
        await nc.close()
        metrics_endpoint.shutdown()


def only_group(service: AdmissionService) -> GroupStatusReport | None:
    groups = service.status().groups
    return groups[0] if len(groups) == 1 else None


async def test_a_rolling_update_shows_in_the_scraped_metrics(
    running: tuple[AdmissionService, WorkerRegistrar, int],
) -> None:
    service, workers, port = running

    # 1. The incumbent: two workers with one configuration.
    for instance_id in (0x1A, 0x2B):
        await workers.register_endpoint(ENDPOINT, instance_id)
        await workers.register(ENDPOINT, instance_id, card(16))
    await until(
        lambda: (
            (g := only_group(service)) is not None
            and g.status == "ready"
            and g.admitted == (0x1A, 0x2B)
        ),
        "the incumbent is served",
    )
    first = scrape(port)
    assert value(first, "workerset_admission_workers_admitted") == 2
    assert value(first, "workerset_admission_groups", status="ready") == 1
    assert value(first, "workerset_admission_groups", status="retrying") == 0
    assert value(first, "workerset_admission_builds_total", outcome="ok") >= 1
    admitted_puts = value(
        first, "workerset_admission_discovery_updates_total", operation="put", decision="admitted"
    )
    assert admitted_puts >= 2
    assert value(first, "workerset_admission_admission_latency_seconds_count") >= 1
    assert value(first, "workerset_admission_cohorts_rejected_total", model=MODEL) == 0

    # 2. A second cohort with another configuration: rejected, counted once.
    for instance_id in (0x3C, 0x4D):
        await workers.register_endpoint(ENDPOINT, instance_id)
        await workers.register(ENDPOINT, instance_id, card(32))
    await until(
        lambda: (
            (g := only_group(service)) is not None
            and len(g.cohorts) == 2
            and g.cohorts[1].members == (0x3C, 0x4D)
        ),
        "the second cohort is tracked with both workers",
    )
    second = scrape(port)
    assert value(second, "workerset_admission_cohorts_rejected_total", model=MODEL) == 1
    assert value(second, "workerset_admission_workers_admitted") == 2
    assert (
        value(
            second,
            "workerset_admission_discovery_updates_total",
            operation="put",
            decision="rejected",
        )
        >= 2
    )

    # 3. A record that is not a card at all.
    await workers.put("v1.mdc.prom.backend.generate.5e", b"{not json", ttl=None)
    await until(lambda: service.status().invalid_total >= 1, "the bad record is refused")
    third = scrape(port)
    invalid = {
        dict(labels)["reason"]: count
        for (name, labels), count in third.items()
        if name == "workerset_admission_discovery_invalid_records_total"
    }
    assert sum(invalid.values()) >= 1

    # 4. The incumbent drains: the other cohort succeeds it.
    for instance_id in (0x1A, 0x2B):
        await workers.deregister(ENDPOINT, instance_id, endpoint_record=True)
    await until(
        lambda: (
            (g := only_group(service)) is not None
            and g.status == "ready"
            and g.admitted == (0x3C, 0x4D)
        ),
        "the successor is served",
    )
    fourth = scrape(port)
    assert value(fourth, "workerset_admission_successions_total", model=MODEL) == 1
    assert value(fourth, "workerset_admission_workers_admitted") == 2
    assert value(fourth, "workerset_admission_cohorts_rejected_total", model=MODEL) == 1
    assert value(fourth, "workerset_admission_builds_total", outcome="ok") >= 2
    updates = "workerset_admission_discovery_updates_total"
    assert value(fourth, updates, operation="delete", decision="removed") >= 2
    # Counters never go back between scrapes.
    for key, earlier in second.items():
        if key[0].endswith("_total"):
            assert fourth.get(key, 0.0) >= earlier


def test_the_endpoint_serves_only_this_plugins_metrics_and_closes_on_shutdown(
    metrics_endpoint: TelemetryHandle,
) -> None:
    port = metrics_endpoint.prometheus_port
    assert port is not None
    AdmissionTelemetry(meter_provider=metrics_endpoint.meter_provider).invalid_record("k", "x")
    samples = scrape(port)
    assert value(samples, "workerset_admission_discovery_invalid_records_total", reason="x") == 1
    (target,) = [labels for name, labels in samples if name == "target_info"]
    assert ("service_name", "workerset-admission") in target
    # Its own registry: nothing of the process's default prometheus_client registry leaks in.
    for name, _labels in samples:
        assert name.startswith(("workerset_admission_", "target_info")), name
    metrics_endpoint.shutdown()
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
        pass


def test_a_port_already_taken_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=str(port)):
            setup_telemetry(prometheus=("127.0.0.1", port), set_global=False)
