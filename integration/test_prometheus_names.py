"""Why the worker metrics carry the plugin's prefix: a real Prometheus, both names in one scrape.

A later Dynamo frontend exports ``dynamo_frontend_router_workers`` and
``dynamo_frontend_router_worker_state`` itself. This test measures, with a real Prometheus
server, what an upstream query returns when the plugin's series sit beside the frontend's:

- ``merged``: one exposition holds both the frontend's families and the plugin's under the
  upstream names (what a plugin registering into the frontend's registry, or a proxy joining
  the two pages, would serve);
- ``both``: two targets, the frontend's page and the plugin's under the upstream names;
- ``prefixed``: two targets, the frontend's page and the plugin's own page as it is, its
  series under ``workerset_admission_router_*`` (the decision);
- ``recorded``: the plugin's own page alone with ``deploy/prometheus/upstream_names.yml``
  loaded, as on a 1.6.1 frontend whose frontend exports no such metric.

The plugin's page is the OpenTelemetry Prometheus exporter's real output for a WorkerSet with
two admitted workers and one rejected; the frontend's page says the same in the frontend's
own format. Each figure the test reads is printed, and ``deploy/prometheus/README.md`` quotes
them.
"""

from __future__ import annotations

import dataclasses
import http.server
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import CollectorRegistry, generate_latest
from promfixture import PrometheusServer, tool
from workerset_admission.card.differences import Difference
from workerset_admission.identity import EndpointId, GroupKey, WorkerType
from workerset_admission.service.rejections import StandingRejection
from workerset_admission.service.status_model import (
    EMPTY_STATUS,
    CohortStatusView,
    GroupStatusReport,
    state_summary,
)
from workerset_admission.telemetry import AdmissionTelemetry
from workerset_admission.telemetry.worker_states import STATE_TABLE, worker_sets

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

RULES = Path(__file__).resolve().parents[1] / "deploy" / "prometheus"
EP = EndpointId("dgd", "backend", "generate")
GROUP = GroupKey.build("Qwen/Qwen3-0.6B", EP, "chat|completions", WorkerType.AGGREGATED)
SNAPSHOT = dataclasses.replace(
    EMPTY_STATUS,
    groups=(
        GroupStatusReport(
            group=GROUP,
            incumbent="a" * 64,
            status="ready",
            generation=1,
            committed_generation=1,
            receiver=1,
            admitted=(1, 2),
            routable=(1, 2),
            cohorts=(CohortStatusView("a" * 64, (1, 2)), CohortStatusView("b" * 64, (3,))),
        ),
    ),
    rejections=(
        StandingRejection(
            GROUP,
            "a" * 64,
            "b" * 64,
            f"{EP.path()}/3",
            (Difference("kv_cache_block_size", "16", "32"),),
        ),
    ),
)
UPSTREAM_EXCLUDED = 'count(dynamo_frontend_router_worker_state{setup="%s", state="excluded"} == 1)'


def plugin_page() -> str:
    """The plugin's page, as its Prometheus exporter renders it."""
    registry = CollectorRegistry(auto_describe=True)
    reader = PrometheusMetricReader(registry=registry)
    telemetry = AdmissionTelemetry(
        tracer_provider=TracerProvider(shutdown_on_exit=False),
        meter_provider=MeterProvider(metric_readers=[reader], shutdown_on_exit=False),
    )
    telemetry.observe_state(lambda: state_summary(SNAPSHOT))
    return generate_latest(registry).decode()


def frontend_page() -> str:
    """The same WorkerSet as a later Dynamo frontend pages it: its names, no scope labels."""
    lines = [
        "# HELP dynamo_frontend_router_workers Number of discovered workers by current router "
        "state (not DP ranks)",
        "# TYPE dynamo_frontend_router_workers gauge",
    ]
    states = []
    for worker_set in worker_sets(SNAPSHOT.groups, SNAPSHOT.rejections):
        base = ",".join(f'{k}="{v}"' for k, v in worker_set.labels.as_dict().items())
        for state, count in worker_set.counts().items():
            lines.append(f'dynamo_frontend_router_workers{{{base},state="{state}"}} {count}')
        for worker, (plugin_state, _) in sorted(worker_set.workers.items()):
            row = STATE_TABLE[plugin_state]
            states.append(
                f'dynamo_frontend_router_worker_state{{{base},router_worker_id="{worker}",'
                f'state="{row.state}",reason="{row.reason}"}} 1'
            )
    lines += [
        "# HELP dynamo_frontend_router_worker_state Current router state of a discovered worker "
        "(1 = current state)",
        "# TYPE dynamo_frontend_router_worker_state gauge",
        *states,
    ]
    return "\n".join(lines) + "\n"


def upstream_named(page: str) -> str:
    """The plugin's page had it taken Dynamo's names (the choice not made)."""
    return page.replace("workerset_admission_router_", "dynamo_frontend_router_")


class Pages(http.server.ThreadingHTTPServer):
    """Loopback pages by path, as Prometheus scrapes them."""

    def __init__(self, pages: dict[str, str]) -> None:
        self.pages = pages

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = pages.get(self.path)
                if body is None:
                    self.send_error(404)
                    return
                data = body.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *_args: object) -> None:
                return

        super().__init__(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"

    def close(self) -> None:
        self.shutdown()
        self.server_close()
        self.thread.join(5)


@pytest.fixture
def pages() -> Iterator[Pages]:
    plugin = plugin_page()
    served = Pages(
        {
            "/frontend": frontend_page(),
            "/plugin": plugin,
            "/plugin-upstream-names": upstream_named(plugin),
            "/merged": frontend_page() + upstream_named(plugin),
        }
    )
    try:
        yield served
    finally:
        served.close()


EXPECTED = {"discovered": 3.0, "available": 2.0, "pending": 0.0, "excluded": 1.0}


def scrape_jobs(pages: Pages, setups: dict[str, list[str]]) -> list[dict[str, Any]]:
    """One scrape job per page, each series labelled with the setup it belongs to."""
    return [
        {
            "job_name": f"{setup}-{index}",
            "metrics_path": path,
            "static_configs": [{"targets": [pages.address], "labels": {"setup": setup}}],
        }
        for setup, paths in setups.items()
        for index, path in enumerate(paths)
    ]


def measure(prom: PrometheusServer, setups: dict[str, list[str]]) -> dict[str, Any]:
    """What an upstream dashboard's queries return in each setup, and each target's health."""
    targets = sum(len(paths) for paths in setups.values())
    prom.wait(lambda: len(prom.query("up")) == targets, 30, "every target scraped")
    time.sleep(2.5)  # two scrapes and rule evaluations more
    out: dict[str, Any] = {}
    for setup in setups:
        counted = prom.values(f'sum by (state) (dynamo_frontend_router_workers{{setup="{setup}"}})')
        excluded = prom.values(UPSTREAM_EXCLUDED % setup)
        up = [float(row["value"][1]) for row in prom.query(f'up{{setup="{setup}"}}')]
        out[setup] = {
            "counts": {dict(k)["state"]: v for k, v in counted.items()},
            "excluded": next(iter(excluded.values()), 0.0),
            "up": sorted(up),
        }
        print(f"{setup}: {out[setup]}")
    return out


def test_upstream_queries_count_each_worker_once_only_when_the_plugin_keeps_its_prefix(
    pages: Pages, tmp_path: Path
) -> None:
    tool("prometheus")
    plain = {
        "merged": ["/merged"],
        "both": ["/frontend", "/plugin-upstream-names"],
        "prefixed": ["/frontend", "/plugin"],
    }
    recorded = {"recorded": ["/plugin"], "recorded_later": ["/frontend", "/plugin"]}
    without_rules = PrometheusServer(tmp_path / "plain", {})
    without_rules.write_config(scrape_jobs(pages, plain))
    with_rules = PrometheusServer(
        tmp_path / "rules", {}, rule_files=(RULES / "upstream_names.yml",)
    )
    with_rules.write_config(scrape_jobs(pages, recorded))
    try:
        found = measure(without_rules.start(), plain)
        found |= measure(with_rules.start(), recorded)
    finally:
        without_rules.stop()
        with_rules.stop()
    # The decision: the frontend's figures, each worker once, every target up.
    assert found["prefixed"] == {"counts": EXPECTED, "excluded": 1.0, "up": [1.0, 1.0]}
    # On a 1.6.1 frontend, the recording rules give upstream queries the same figures.
    assert found["recorded"] == {"counts": EXPECTED, "excluded": 1.0, "up": [1.0]}
    # Dynamo's names on two targets, or the rules left loaded after the frontend exports them:
    # every worker counted twice.
    double = {state: 2 * value for state, value in EXPECTED.items()}
    assert found["both"] == {"counts": double, "excluded": 2.0, "up": [1.0, 1.0]}
    assert found["recorded_later"] == {"counts": double, "excluded": 2.0, "up": [1.0, 1.0]}
    # Both families in one exposition: the page is still scraped, and every worker counts
    # twice, the frontend's series and the plugin's differing only in the exporter's labels.
    assert found["merged"] == {"counts": double, "excluded": 2.0, "up": [1.0]}
