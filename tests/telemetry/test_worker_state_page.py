"""The worker families served as kept text, held to the SDK's exporter and served once.

The kept text must equal what the SDK's Prometheus exporter renders for the same states, and
the page ``serve`` serves must carry each family once, every worker of it, while another reader
still collects them. (The fold itself is held to ``worker_sets`` and ``exposition`` over random
histories of the service in ``tests/test_read_store.py``.)
"""

from __future__ import annotations

import dataclasses
import gzip
import re
import urllib.request
from collections.abc import Iterator

import pytest
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.parser import text_string_to_metric_families
from workerset_admission.card.differences import Difference
from workerset_admission.identity import EndpointId, GroupKey, WorkerType
from workerset_admission.service.rejections import StandingRejection
from workerset_admission.service.status_model import (
    EMPTY_STATUS,
    CohortStatusView,
    GroupStatusReport,
    ServiceStatus,
    state_summary,
)
from workerset_admission.telemetry import AdmissionTelemetry, setup_telemetry
from workerset_admission.telemetry.worker_state_page import (
    COUNTS,
    STATES,
    WorkerStateFold,
)

CHECKSUMS = ("a" * 64, "b" * 64, "c" * 64)
STATUSES = ("ready", "building", "retrying", "blocked", "committed")
FIELDS = ("kv_cache_block_size", "tokenizer", "router_config.kv_router_config.x")


def group_key(namespace: int, types: str, model: str = "Qwen/Qwen3-0.6B") -> GroupKey:
    return GroupKey.build(
        model, EndpointId(f"ns-{namespace}", "backend", "generate"), types, WorkerType.AGGREGATED
    )


def fleet(sets: int, per_set: int) -> tuple[GroupStatusReport, ...]:
    reports = []
    for index in range(sets):
        members = tuple(range(index * per_set + 1, (index + 1) * per_set + 1))
        reports.append(
            GroupStatusReport(
                group=group_key(index, "chat"),
                incumbent=CHECKSUMS[0],
                status="ready",
                generation=1,
                committed_generation=1,
                receiver=1,
                admitted=members,
                routable=members,
                cohorts=(CohortStatusView(CHECKSUMS[0], members),),
            )
        )
    return tuple(reports)


def sdk_family(status: ServiceStatus, family: str, *, openmetrics: bool = False) -> list[str]:
    """A family's lines as the OpenTelemetry Prometheus exporter renders them on its own."""
    registry = CollectorRegistry(auto_describe=True)
    reader = PrometheusMetricReader(registry=registry)
    telemetry = AdmissionTelemetry(
        tracer_provider=TracerProvider(shutdown_on_exit=False),
        meter_provider=MeterProvider(metric_readers=[reader], shutdown_on_exit=False),
    )
    telemetry.observe_state(lambda: state_summary(status))
    page = (generate_openmetrics if openmetrics else generate_latest)(registry).decode()
    return sorted(
        line
        for line in page.splitlines()
        if line.startswith(f"{family}{{") or line.split(" ")[2:3] == [family]
    )


def odd_fleet() -> ServiceStatus:
    """Label values that need escaping, a rejected cohort, and a WorkerSet shared by two groups."""
    odd = 'Org/model "quoted" \\ back\nslash é'
    shared = fleet(2, 3)
    other = dataclasses.replace(
        fleet(1, 2)[0],
        group=group_key(0, "chat|embed", odd),
        cohorts=(
            CohortStatusView(CHECKSUMS[0], (1, 2)),
            CohortStatusView(CHECKSUMS[1], (9, 10)),
        ),
    )
    rejection = StandingRejection(
        other.group, CHECKSUMS[0], CHECKSUMS[1], "x", (Difference(FIELDS[1], "a", "b"),)
    )
    also = dataclasses.replace(shared[0], group=group_key(0, "chat|embed"), routable=(1,))
    return dataclasses.replace(EMPTY_STATUS, groups=(*shared, also, other), rejections=(rejection,))


@pytest.mark.parametrize("openmetrics", [False, True])
@pytest.mark.parametrize(("family", "samples"), [(STATES, 10), (COUNTS, 12)])
def test_the_kept_text_is_what_the_sdk_renders_for_the_family(
    openmetrics: bool, family: str, samples: int
) -> None:
    status = odd_fleet()
    fold = WorkerStateFold()
    fold.refresh(status.groups, status.rejections)
    mine = sorted(fold.text()[family].decode().splitlines())
    assert mine == sdk_family(status, family, openmetrics=openmetrics)
    assert len([line for line in mine if not line.startswith("#")]) == samples


def test_a_worker_set_without_workers_has_its_counts_and_no_worker_lines_as_the_sdk() -> None:
    status = dataclasses.replace(EMPTY_STATUS, groups=fleet(1, 0))
    fold = WorkerStateFold()
    fold.refresh(status.groups, status.rejections)
    assert fold.text()[STATES] == b""
    assert sdk_family(status, STATES) == []
    assert sorted(fold.text()[COUNTS].decode().splitlines()) == sdk_family(status, COUNTS)


@pytest.fixture
def served() -> Iterator[tuple[str, InMemoryMetricReader, list[ServiceStatus]]]:
    other_reader = InMemoryMetricReader()
    handle = setup_telemetry(
        prometheus=("127.0.0.1", 0),
        metric_readers=[other_reader],
        span_exporters=[],
        otlp=False,
        set_global=False,
        log_correlation=False,
    )
    telemetry = AdmissionTelemetry(
        tracer_provider=TracerProvider(shutdown_on_exit=False),
        meter_provider=handle.meter_provider,
        prometheus_page=handle.prometheus_page,
    )
    current = [dataclasses.replace(EMPTY_STATUS, groups=fleet(25, 100))]
    telemetry.observe_state(lambda: state_summary(current[0]))
    assert handle.prometheus_url is not None
    try:
        yield handle.prometheus_url, other_reader, current
    finally:
        handle.shutdown()


def scrape(url: str, **headers: str) -> tuple[str, str]:
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request, timeout=30) as response:
        body = response.read()
        if response.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        return body.decode(), response.headers["Content-Type"]


def test_the_page_serves_every_worker_once_and_other_readers_still_collect_it(
    served: tuple[str, InMemoryMetricReader, list[ServiceStatus]],
) -> None:
    url, other_reader, current = served
    page, content_type = scrape(url)
    assert content_type.startswith("text/plain; version=0.0.4")
    families = {f.name: f for f in text_string_to_metric_families(page)}
    # 2,500 workers: more than the SDK's default of 2,000 points per metric stream, which the
    # exporter's own rendering folded into one overflow series.
    assert len(families[STATES].samples) == 2500
    assert len(families[COUNTS].samples) == 25 * 4
    for family in (STATES, COUNTS):
        assert page.count(f"# TYPE {family} gauge") == 1
    assert "workerset_admission_incumbent_since_seconds" in families

    # Another reader (the OTLP export in serve) collects the gauge through the SDK, as before.
    data = other_reader.get_metrics_data()
    assert data is not None
    metrics = {
        metric.name: metric
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
    }
    # The SDK caps the stream at its default limit; the page is not capped.
    assert metrics["workerset_admission.router.worker_state"].data.data_points
    assert len(metrics["workerset_admission.router.workers"].data.data_points) == 25 * 4

    # A change shows at the next scrape; OpenMetrics and gzip as Prometheus asks for them.
    groups = current[0].groups
    current[0] = dataclasses.replace(
        current[0], groups=(dataclasses.replace(groups[0], routable=()), *groups[1:])
    )
    page, content_type = scrape(
        url, Accept="application/openmetrics-text; version=1.0.0", **{"Accept-Encoding": "gzip"}
    )
    assert content_type.startswith("application/openmetrics-text")
    assert page.endswith("# EOF\n")
    assert page.count(f"# TYPE {STATES} gauge") == 1
    assert page.count('reason="unavailable"') == 100
    excluded = rf'^{COUNTS}\{{[^}}]*state="excluded",[^}}]*"ns-0",[^}}]*\}} 100\.0$'
    assert re.search(excluded, page, re.MULTILINE)
