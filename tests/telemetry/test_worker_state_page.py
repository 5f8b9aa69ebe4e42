"""The worker families kept as a fold and served as text, held to the plain path.

The fold is driven through random histories of group reports (groups added, changed, left
alone and removed, WorkerSets shared by groups, rejections with and without their cards) and
after every step must equal ``worker_sets`` and ``exposition`` worked out whole; the text must
equal what the SDK's Prometheus exporter renders for the same states; and the page ``serve``
serves must carry each family once, every worker of it, while another reader still collects
them.
"""

from __future__ import annotations

import dataclasses
import gzip
import random
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
    exposition,
)
from workerset_admission.telemetry.worker_states import worker_sets

CHECKSUMS = ("a" * 64, "b" * 64, "c" * 64)
STATUSES = ("ready", "building", "retrying", "blocked", "committed")
FIELDS = ("kv_cache_block_size", "tokenizer", "router_config.kv_router_config.x")


def group_key(namespace: int, types: str, model: str = "Qwen/Qwen3-0.6B") -> GroupKey:
    return GroupKey.build(
        model, EndpointId(f"ns-{namespace}", "backend", "generate"), types, WorkerType.AGGREGATED
    )


class History:
    """A random sequence of what the service's status shows, one step at a time.

    Keys differ in their model types, which Dynamo's labels leave out, so two groups may be one
    WorkerSet; a worker may be listed in both.
    """

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.keys = [group_key(ns, types) for ns in range(3) for types in ("chat", "chat|embed")]
        self.groups: dict[GroupKey, GroupStatusReport] = {}
        self.rejections: dict[GroupKey, tuple[StandingRejection, ...]] = {}

    def report(self, key: GroupKey) -> tuple[GroupStatusReport, tuple[StandingRejection, ...]]:
        rng = self.rng
        pool = list(range(1, 25))
        rng.shuffle(pool)
        cohorts = []
        for checksum in rng.sample(CHECKSUMS, rng.randint(1, 3)):
            take = rng.randint(0, 4)
            cohorts.append(CohortStatusView(checksum, tuple(sorted(pool[:take]))))
            del pool[:take]
        incumbent = rng.choice((cohorts[0].mdc_checksum, cohorts[0].mdc_checksum, None))
        members = cohorts[0].members
        committed = rng.random() < 0.7
        admitted = members if committed and incumbent is not None else ()
        routable = tuple(m for m in admitted if rng.random() < 0.8)
        held = rng.random() < 0.2
        drained = tuple(
            (worker, "ops", None) for worker in sorted(rng.sample(pool, rng.randint(0, 2)))
        )
        report = GroupStatusReport(
            group=key,
            incumbent=incumbent,
            status=rng.choice(STATUSES),
            generation=1,
            committed_generation=1 if committed else None,
            receiver=rng.randint(1, 3),
            admitted=admitted,
            routable=routable,
            cohorts=tuple(cohorts),
            held_until=123.0 if held else None,
            last_known=tuple(m for m in admitted if rng.random() < 0.2),
            drained=drained,
        )
        rejections = tuple(
            StandingRejection(
                key,
                cohorts[0].mdc_checksum,
                cohort.mdc_checksum,
                "x",
                None if rng.random() < 0.4 else (Difference(rng.choice(FIELDS), "1", "2"),),
            )
            for cohort in cohorts[1:]
            if incumbent is not None
        )
        return report, rejections

    def step(self) -> None:
        rng = self.rng
        for _ in range(rng.choice((0, 1, 1, 2))):
            key = rng.choice(self.keys)
            if key in self.groups and rng.random() < 0.25:
                del self.groups[key]
                self.rejections.pop(key, None)
            elif rng.random() < 0.2 and key in self.rejections:
                # The same group, its rejections' cards now at hand or gone.
                self.rejections[key] = tuple(
                    dataclasses.replace(
                        r, differences=None if r.differences else (Difference(FIELDS[0], "1", "2"),)
                    )
                    for r in self.rejections[key]
                )
            else:
                self.groups[key], self.rejections[key] = self.report(key)

    def status(self) -> tuple[tuple[GroupStatusReport, ...], tuple[StandingRejection, ...]]:
        ordered = sorted(self.groups)
        return (
            tuple(self.groups[key] for key in ordered),
            tuple(r for key in ordered for r in self.rejections.get(key, ())),
        )


@pytest.mark.parametrize("seed", range(40))
def test_the_fold_equals_the_whole_rendering_after_every_step_of_a_random_history(
    seed: int,
) -> None:
    history = History(seed)
    remembered: dict[tuple[str, str], str] = {}
    fold = WorkerStateFold(remembered)
    for _ in range(60):
        history.step()
        groups, rejections = history.status()
        # What the whole path would remember at this read: the same memory, before the read.
        whole = worker_sets(groups, rejections, dict(remembered))
        fold.refresh(groups, rejections)
        assert fold.sets() == whole
        assert [(labels, dict(counts)) for labels, counts in fold.counts()] == [
            (s.labels, s.counts()) for s in whole
        ]
        assert fold.text() == exposition(whole)


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


def test_a_change_writes_the_lines_of_the_workers_it_moved_and_no_others() -> None:
    groups = fleet(50, 100)
    fold = WorkerStateFold()
    fold.refresh(groups, ())
    first = fold.text()[STATES]
    assert fold.lines_written == 5000
    # Three workers of one WorkerSet become unavailable; a new tuple of the same reports else.
    changed = dataclasses.replace(groups[7], routable=groups[7].routable[3:])
    fold.refresh((*groups[:7], changed, *groups[8:]), ())
    assert fold.lines_written == 5000 + 3
    assert fold.text()[STATES] != first
    assert fold.text() == exposition(worker_sets((*groups[:7], changed, *groups[8:])))


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
