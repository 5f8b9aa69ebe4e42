"""How many series the plugin's page holds: per 1,000 workers and per rejected cohort, measured.

The page is rendered by the OpenTelemetry Prometheus exporter, as ``serve`` serves it, for
WorkerSets of a thousand workers each, and its series are counted family by family. Run with
``-s`` to see the table ``deploy/prometheus/README.md`` quotes.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import CollectorRegistry, generate_latest
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
from workerset_admission.telemetry import AdmissionTelemetry
from workerset_admission.telemetry.worker_states import DIFFERS_IN_VALUES, STATE_TABLE

WORKER_FAMILIES = (
    "workerset_admission_router_workers",
    "workerset_admission_router_worker_state",
    "workerset_admission_incumbent_since_seconds",
    "workerset_admission_rejected_cohort_workers",
)


def service_status(worker_sets: int, workers: int, rejected: tuple[int, ...] = ()) -> ServiceStatus:
    """``worker_sets`` WorkerSets of ``workers`` admitted workers, and rejected cohorts beside."""
    groups, rejections = [], []
    next_id = 1
    for index in range(worker_sets):
        key = GroupKey.build(
            "Qwen/Qwen3-0.6B",
            EndpointId("dgd", f"backend{index}", "generate"),
            "chat",
            WorkerType.AGGREGATED,
        )
        admitted = tuple(range(next_id, next_id + workers))
        next_id += workers
        cohorts = [CohortStatusView("a" * 64, admitted)]
        for number, size in enumerate(rejected):
            checksum = f"{number:x}" * 64
            cohorts.append(CohortStatusView(checksum[:64], tuple(range(next_id, next_id + size))))
            next_id += size
            rejections.append(
                StandingRejection(
                    key,
                    "a" * 64,
                    checksum[:64],
                    "x",
                    (Difference("kv_cache_block_size", "16", "32"),),
                )
            )
        groups.append(
            GroupStatusReport(
                group=key,
                incumbent="a" * 64,
                status="ready",
                generation=1,
                committed_generation=1,
                receiver=1,
                admitted=admitted,
                routable=admitted,
                cohorts=tuple(cohorts),
            )
        )
    return dataclasses.replace(EMPTY_STATUS, groups=tuple(groups), rejections=tuple(rejections))


def series(snap: ServiceStatus) -> tuple[Counter[str], float]:
    """Series per family on the page, and how long one scrape's rendering took (seconds)."""
    registry = CollectorRegistry(auto_describe=True)
    reader = PrometheusMetricReader(registry=registry)
    telemetry = AdmissionTelemetry(
        tracer_provider=TracerProvider(shutdown_on_exit=False),
        meter_provider=MeterProvider(metric_readers=[reader], shutdown_on_exit=False),
    )
    telemetry.observe_state(lambda: state_summary(snap))
    generate_latest(registry)  # the first collection makes the instruments' state
    started = time.perf_counter()
    page = generate_latest(registry).decode()
    took = time.perf_counter() - started
    counts: Counter[str] = Counter()
    for family in text_string_to_metric_families(page):
        counts[family.name] += len(family.samples)
    return counts, took


def test_series_grow_by_one_per_worker_and_one_per_rejected_cohort() -> None:
    base, _ = series(service_status(1, 0))
    thousand, took = series(service_status(1, 1000))
    two_sets, _ = series(service_status(2, 500))
    rejected, _ = series(service_status(1, 1000, rejected=(10,)))
    three_rejected, _ = series(service_status(1, 1000, rejected=(10, 10, 10)))

    def worker_series(counts: Counter[str]) -> int:
        return sum(counts[f] for f in WORKER_FAMILIES)

    total = sum(thousand.values())
    print(
        f"\n1 WorkerSet, 0 workers: {sum(base.values())} series on the page "
        f"({worker_series(base)} of them per WorkerSet or worker)"
        f"\n1 WorkerSet, 1,000 workers: {total} series "
        f"({worker_series(thousand)} per WorkerSet or worker; "
        f"{thousand['workerset_admission_router_worker_state']} worker states); "
        f"one scrape rendered in {took * 1000:.1f} ms"
        f"\n2 WorkerSets of 500: {sum(two_sets.values())} series"
        f"\n+ 1 rejected cohort of 10 workers: {sum(rejected.values()) - total} series more"
        f"\n+ 3 rejected cohorts of 10 workers: {sum(three_rejected.values()) - total} series more"
    )
    # One series per worker, four counts and one incumbent per WorkerSet, whatever the size.
    assert thousand["workerset_admission_router_worker_state"] == 1000
    assert thousand["workerset_admission_router_workers"] == 4
    assert thousand["workerset_admission_incumbent_since_seconds"] == 1
    assert worker_series(thousand) - worker_series(base) == 1000
    # A second WorkerSet: five series more, whatever its workers.
    assert sum(two_sets.values()) - total == 5
    # A rejected cohort: one series for the cohort and one per worker in it.
    assert sum(rejected.values()) - total == 1 + 10
    assert sum(three_rejected.values()) - total == 3 * (1 + 10)


def test_the_labels_that_change_take_few_values() -> None:
    # What bounds the series a worker can leave behind in Prometheus over a rollout: its state,
    # reason and differs_in change, its other labels do not.
    assert len({row.state for row in STATE_TABLE.values()}) == 3
    assert len(STATE_TABLE) == 9
    assert len(DIFFERS_IN_VALUES) == 21
