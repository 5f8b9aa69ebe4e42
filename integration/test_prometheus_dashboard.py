"""The Grafana dashboard's queries, evaluated by a real Prometheus scraping a real ``serve``.

A real nats-server, the real ``workerset-admission serve`` (its Prometheus endpoint on a free
loopback port) and a real Prometheus server (Debian's package, its data in the test's folder,
scraping every second) watch a rolling update: cohort A serves, cohort B registers with another
block size and is rejected, a malformed record is refused, A's workers die with a discovery
outage so the tenure is held, and when the hold runs out B succeeds A. Every panel and
annotation query of ``deploy/grafana/workerset-admission.json`` is then evaluated through
Prometheus' HTTP API, and each must return the series it exists to show with the values the
scenario leaves. Every metric name and label the dashboard and the rules use must be in what
Prometheus scraped.

With ``WORKERSET_ADMISSION_PANELS_OUT`` set to a folder, the test also writes there the query
results over the whole scenario (``panels.json``) and a picture of the panels drawn from them
(``metrics-dashboard.png``), the one in ``docs/``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import nats
import pytest
import yaml
from nats.aio.client import Client as NatsClient
from natsfixture import NatsServer
from promfixture import PrometheusServer, tool
from support.cards import base_card as demo_card
from workerset_admission.adapters.nats.registrar import WorkerRegistrar
from workerset_admission.identity import EndpointId
from workerset_admission.telemetry.worker_states import (
    COUNT_STATES,
    DIFFERS_IN_VALUES,
    STATE_TABLE,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "deploy" / "grafana" / "workerset-admission.json"
RULES = ROOT / "deploy" / "prometheus"
BUCKET = "dynamo-discovery"
EP = EndpointId("dash", "backend", "generate")
A = demo_card(16)
B = demo_card(32)
MODEL = str(A["display_name"])
TTL = 3.0
WORKER_SET = {
    "model": MODEL,
    "target_namespace": EP.namespace,
    "target_component": EP.component,
    "target_endpoint": EP.endpoint,
    "worker_type": "aggregated",
}
# What Grafana puts in place of the dashboard's variables: every model and frontend, and a rate
# window of several scrapes (Grafana's $__rate_interval is four scrape intervals at least).
VARIABLES = {"$model": ".*", "$instance": ".*", "$__rate_interval": "15s"}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def dashboard_targets() -> list[dict[str, str]]:
    """Every query of the dashboard: its panel (or annotation), refId, expression, legend, kind."""
    board = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    out = [
        {
            "title": panel["title"],
            "ref": target["refId"],
            "expr": target["expr"],
            "legend": target.get("legendFormat", ""),
            "kind": panel["type"],
        }
        for panel in board["panels"]
        for target in panel["targets"]
    ]
    out.extend(
        {
            "title": f"annotation: {annotation['name']}",
            "ref": "A",
            "expr": annotation["expr"],
            "legend": annotation.get("textFormat", ""),
            "kind": "annotation",
        }
        for annotation in board["annotations"]["list"]
        if "expr" in annotation
    )
    return out


def dashboard_queries() -> list[tuple[str, str, str]]:
    """(panel or annotation title, refId, expression) for every query of the dashboard."""
    return [(t["title"], t["ref"], t["expr"]) for t in dashboard_targets()]


def rule_expressions() -> list[tuple[str, str]]:
    return [
        (rule.get("alert") or rule["record"], str(rule["expr"]))
        for path in rule_files()
        for group in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]
        for rule in group["rules"]
    ]


def rule_files() -> tuple[Path, ...]:
    """The rule files of deploy/prometheus (their unit tests aside)."""
    return tuple(sorted(p for p in RULES.glob("*.yml") if not p.name.endswith("_test.yml")))


def instantiate(expr: str) -> str:
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    return expr


# --- reading what a query names -------------------------------------------------------------

_NAME = re.compile(r"\b(workerset_admission_[a-z_]+|dynamo_frontend_[a-z_]+)\b")
_GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
_MATCHER = re.compile(r'([a-z_]+)\s*(=~|!=|!~|=)\s*"([^"]*)"')
_HISTOGRAM = ("_bucket", "_count", "_sum")


def used_names(expr: str) -> set[str]:
    return set(_NAME.findall(expr))


def used_labels(expr: str) -> set[str]:
    labels = {m[0] for m in _MATCHER.findall(expr)}
    for grouping in _GROUPING.findall(expr):
        labels |= {label.strip() for label in grouping.split(",") if label.strip()}
    return labels - {"__name__"}


def matched_values(expr: str) -> set[tuple[str, str]]:
    return {(label, value) for label, op, value in _MATCHER.findall(expr) if op in ("=", "!=")}


# --- the scenario's processes ----------------------------------------------------------------


class Serve:
    """``workerset-admission serve`` as a process, with its Prometheus endpoint."""

    def __init__(self, nats_url: str, folder: Path) -> None:
        self.metrics_port = free_port()
        self.log = folder / "serve.log"
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("WORKERSET_ADMISSION_", "OTEL_"))
        }
        env |= {
            "PYTHONUNBUFFERED": "1",
            "WORKERSET_ADMISSION_NATS_SERVERS": nats_url,
            "WORKERSET_ADMISSION_DISCOVERY_BUCKET": BUCKET,
            "WORKERSET_ADMISSION_ADMISSION_BUCKET": "frontend-model-admission",
            "WORKERSET_ADMISSION_FRONTEND_ID": "fe-dashboard",
            "WORKERSET_ADMISSION_REGISTRATION_TTL": str(TTL),
            "WORKERSET_ADMISSION_RECONCILE_INTERVAL": "2",
            "WORKERSET_ADMISSION_PROMETHEUS_PORT": str(self.metrics_port),
            "OTEL_SERVICE_NAME": "frontend-dashboard",
        }
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "workerset_admission.cli", "serve"],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    async def wait_for_line(self, line: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while line not in self.text():
            assert self.process.poll() is None, f"serve exited:\n{self.text()}"
            if time.monotonic() > deadline:
                raise AssertionError(f"no {line!r} within {timeout:g} s:\n{self.text()}")
            await asyncio.sleep(0.1)

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait(5)


async def _quiet(_exc: Exception) -> None:
    return None


@contextlib.asynccontextmanager
async def worker_client(url: str) -> AsyncIterator[NatsClient]:
    """The workers' own connection: it rides out the outage by reconnecting."""
    nc = await nats.connect(
        url, max_reconnect_attempts=-1, reconnect_time_wait=0.1, error_cb=_quiet
    )
    try:
        yield nc
    finally:
        await nc.close()


def publisher(nc: NatsClient) -> WorkerRegistrar:
    return WorkerRegistrar(nc.jetstream(timeout=2), bucket=BUCKET, ttl=TTL, on_removed="reregister")


async def join(workers: WorkerRegistrar, instance: int, card: dict[str, Any]) -> None:
    """A worker joins as Dynamo's do: its instance record, then its model card."""
    await workers.register_endpoint(EP, instance)
    await workers.register(EP, instance, card)


@pytest.fixture
def prometheus_binary() -> str:
    """Skip (saying why) before anything starts when there is no Prometheus server to run."""
    return tool("prometheus")


async def waiting(prom: PrometheusServer, expr: str, timeout: float, what: str) -> Any:
    # In a thread: the workers' heartbeats run on this loop while Prometheus is polled.
    return await asyncio.to_thread(prom.wait_for, expr, timeout, what)


async def until(
    check: Callable[[], bool], prom: PrometheusServer, timeout: float, what: str
) -> None:
    await asyncio.to_thread(prom.wait, check, timeout, what)


def series(prom: PrometheusServer, expr: str) -> dict[frozenset[tuple[str, str]], float]:
    return prom.values(instantiate(expr))


def upstream_counts(prom: PrometheusServer) -> dict[str, float]:
    """What a dashboard written for Dynamo reads: workers by state, under Dynamo's name."""
    found = prom.values("sum by (state) (dynamo_frontend_router_workers)")
    return {dict(labels)["state"]: value for labels, value in found.items()}


def labelled(value: float, **labels: str) -> tuple[frozenset[tuple[str, str]], float]:
    return frozenset(labels.items()), value


@pytest.mark.rollout  # a rolling update scraped by a real Prometheus: the slower tier
async def test_every_dashboard_query_shows_the_rolling_update_a_real_prometheus_scraped(
    prometheus_binary: str, nats_server_fn: NatsServer, tmp_path: Path
) -> None:
    handle = nats_server_fn.handle
    assert handle is not None
    serve = Serve(nats_server_fn.url, tmp_path)
    prom = PrometheusServer(
        tmp_path / "prometheus",
        {"workerset-admission": [f"127.0.0.1:{serve.metrics_port}"]},
        rule_files=tuple(
            sorted(p for p in RULES.glob("*.yml") if not p.name.endswith("_test.yml"))
        ),
    )
    marks: dict[str, float] = {}
    try:
        await serve.wait_for_line("synced:", 60)
        prom.start()
        started = time.time()
        # Counters of things that happen once (the first build) must be seen at 0 first.
        await waiting(prom, "up == 1", 30, "Prometheus' first scrape of serve")
        async with (
            worker_client(nats_server_fn.url) as nc_a,
            worker_client(nats_server_fn.url) as nc_b,
        ):
            a, b = publisher(nc_a), publisher(nc_b)
            for instance in (1, 2):
                await join(a, instance, A)
            await waiting(
                prom,
                'workerset_admission_router_workers{state="available"} == 2',
                60,
                "A's two workers available",
            )
            marks["A serves"] = time.time()

            await join(b, 3, B)
            await a.put(
                f"v1.mdc.{EP.namespace}.{EP.component}.{EP.endpoint}.5e", b"{not json", ttl=None
            )
            found = await waiting(
                prom,
                'workerset_admission_router_worker_state{reason="checksum_mismatch"}',
                60,
                "B's worker excluded for its checksum",
            )
            (row,) = found
            assert row["metric"]["router_worker_id"] == "3"
            assert row["metric"]["differs_in"] == "kv_cache_block_size"
            await waiting(
                prom,
                "workerset_admission_discovery_invalid_records_total",
                30,
                "the malformed record counted",
            )
            marks["B rejected"] = time.time()
            await asyncio.sleep(3)  # a few scrapes of the standing rejection
            check_while_b_waits({(t, r): series(prom, e) for t, r, e in dashboard_queries()})
            assert upstream_counts(prom) == {
                "discovered": 3,
                "available": 2,
                "pending": 0,
                "excluded": 1,
            }
            # The alert rules run in this Prometheus too: the first rejection of a model fires.
            await waiting(
                prom,
                'ALERTS{alertname="WorkersetAdmissionCohortRejected", alertstate="firing"}',
                30,
                "the rejected-cohort alert",
            )

            # A's workers die with a discovery outage: the tenure is held, then B succeeds A.
            await a.stop_heartbeat()
            await asyncio.to_thread(handle.restart, kill=True, downtime=2.5 * TTL)
            marks["outage"] = time.time()
            (held,) = await waiting(
                prom, 'workerset_admission_router_worker_state{reason="held"}', 90, "the hold"
            )
            marks["held"] = time.time()
            # B waits for the hold's end: pending in Dynamo's terms, and still says why.
            assert held["metric"]["router_worker_id"] == "3"
            assert held["metric"]["state"] == "pending"
            assert held["metric"]["differs_in"] == "kv_cache_block_size"
            # Dynamo's own query, through deploy/prometheus/upstream_names.yml (loaded here).
            await until(
                lambda: upstream_counts(prom).get("pending") == 1,
                prom,
                30,
                "Dynamo's query to count B's worker pending",
            )
            await waiting(
                prom,
                'workerset_admission_router_worker_state{router_worker_id="3", state="available"}',
                90,
                "B's worker available after the succession",
            )
            marks["B succeeded"] = time.time()
            await until(
                lambda: bool(prom.query("increase(workerset_admission_successions_total[1m]) > 0")),
                prom,
                30,
                "the succession counted",
            )
            await asyncio.sleep(3)  # a few scrapes of the end state
            ended = time.time()

            results = {(title, ref): series(prom, expr) for title, ref, expr in dashboard_queries()}
            check_end_state(results)
            assert upstream_counts(prom) == {
                "discovered": 1,
                "available": 1,
                "pending": 0,
                "excluded": 0,
            }
            assert not prom.query('dynamo_frontend_router_worker_state{reason="checksum_mismatch"}')
            check_names_and_labels(prom)
            write_panels(prom, started, ended, marks)

            # A drain, with the real command: a second B worker joins, then is drained out of
            # routing while it still runs. Dynamo's vocabulary calls it excluded, the reason
            # says drained, and the dashboard's annotation finds it.
            await join(b, 4, B)
            await waiting(
                prom,
                'workerset_admission_router_workers{state="available"} == 2',
                60,
                "B's second worker available",
            )
            drained = await asyncio.to_thread(
                subprocess.run,
                [
                    sys.executable,
                    "-m",
                    "workerset_admission.cli",
                    "drain",
                    "4",
                    "--wait",
                    "--timeout",
                    "60",
                    "--nats-server",
                    nats_server_fn.url,
                    "--discovery-bucket",
                    BUCKET,
                    "--admission-bucket",
                    "frontend-model-admission",
                ],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            assert drained.returncode == 0, drained.stderr
            (row,) = await waiting(
                prom,
                'workerset_admission_router_worker_state{reason="drained"}',
                60,
                "the drained worker excluded, reason drained",
            )
            assert (row["metric"]["router_worker_id"], row["metric"]["state"]) == ("4", "excluded")
            drains = {t: e for t, _r, e in dashboard_queries()}["annotation: Drains"]
            await until(lambda: bool(series(prom, drains)), prom, 60, "the Drains annotation")
            assert list(series(prom, drains).values()) == [1]
            await b.close()
            await a.close(withdraw=False)
    finally:
        prom.stop()
        assert serve.stop() == 0, serve.text()


Results = dict[tuple[str, str], dict[frozenset[tuple[str, str]], float]]


def check_while_b_waits(results: Results) -> None:
    """While B waits: A's two workers available, B's one excluded for its checksum, and why."""
    by_state = {dict(k)["state"]: v for k, v in results[("Workers by state", "A")].items()}
    assert by_state == {"available": 2, "pending": 0, "excluded": 1}
    assert results[("Why workers are not served", "A")] == dict(
        [
            labelled(
                1,
                **WORKER_SET,
                router_worker_id="3",
                state="excluded",
                reason="checksum_mismatch",
                differs_in="kv_cache_block_size",
            )
        ]
    )
    ((labels, workers),) = results[("Rejected cohorts", "A")].items()
    assert dict(labels)["differs_in"] == "kv_cache_block_size"
    assert dict(labels)["incumbent_checksum"] != dict(labels)["mdc_checksum"]
    assert workers == 1
    assert results[("Frontends per incumbent", "B")] == dict([labelled(1, **WORKER_SET)])
    assert results[("annotation: Successions", "A")] == {}
    assert results[("annotation: Holds", "A")] == {}


def check_end_state(results: Results) -> None:
    """Each panel's series at the end: B serves alone, A's workers gone, nothing excluded."""
    incumbent_b = _incumbent(results)
    by_state = {
        dict(labels)["state"]: value for labels, value in results[("Workers by state", "A")].items()
    }
    assert by_state == {"available": 1, "pending": 0, "excluded": 0}
    assert {frozenset(dict(k).keys()) for k in results[("Workers by state", "A")]} == {
        frozenset({*WORKER_SET, "state"})
    }
    # Nobody is left with a reason: zero excluded with checksum_mismatch after the succession.
    assert results[("Why workers are not served", "A")] == {}
    ((labels, tenure),) = results[("Incumbent and its tenure", "A")].items()
    assert dict(labels) == WORKER_SET | {"mdc_checksum": incumbent_b}
    assert 0 < tenure < 120
    assert results[("Rejected cohorts", "A")] == {}
    assert results[("Frontends per incumbent", "A")] == dict(
        [labelled(1, **WORKER_SET, mdc_checksum=incumbent_b)]
    )
    assert results[("Frontends per incumbent", "B")] == dict([labelled(1, **WORKER_SET)])
    # The rate window holds the successor's one build, and every outcome is a series.
    outcomes = {dict(k)["outcome"]: v for k, v in results[("Build outcomes", "A")].items()}
    assert set(outcomes) == {"ok", "failed", "cancelled"}
    assert outcomes["ok"] >= 1
    assert outcomes["failed"] == outcomes["cancelled"] == 0
    latencies = results[("Admission latency", "A")] | results[("Admission latency", "B")]
    assert latencies, "no admission latency quantile"
    (lag,) = results[("View lag behind the bucket", "A")].values()
    assert 0 <= lag < 5
    # increase() extrapolates to the window's edges: one event reads as 1 or a little more.
    for annotation in ("Successions", "Holds"):
        ((labels, value),) = results[(f"annotation: {annotation}", "A")].items()
        assert dict(labels) == {"model": MODEL}
        assert 1 <= value < 2
    assert results[("annotation: Drains", "A")] == {}


def _incumbent(results: Results) -> str:
    ((labels, _),) = results[("Incumbent and its tenure", "A")].items()
    return dict(labels)["mdc_checksum"]


# Label values the queries match on that a scenario may not produce, but the plugin declares.
DECLARED = {
    "state": {*COUNT_STATES, *(row.state for row in STATE_TABLE.values())},
    "reason": {row.reason for row in STATE_TABLE.values()},
    "differs_in": set(DIFFERS_IN_VALUES),
    "outcome": {"ok", "failed", "cancelled"},
}


# The bridge's own families: its process exports them (``bridge --prometheus-port``), not
# ``serve``; integration/test_bridge_watch.py scrapes them from a running bridge.
BRIDGE_PREFIX = "workerset_admission_bridge_"


def check_names_and_labels(prom: PrometheusServer) -> None:
    """Every metric and label a query names is in what Prometheus scraped from ``serve``."""
    scraped = set(prom.api("label/__name__/values"))
    queries = [(title, expr) for title, _, expr in dashboard_queries()] + rule_expressions()
    for title, expr in queries:
        names = used_names(expr)
        if names and all(name.startswith(BRIDGE_PREFIX) for name in names):
            continue
        assert names, f"{title}: names no metric of the plugin"
        labels_seen: set[str] = {"job", "instance"}
        values_seen: dict[str, set[str]] = {}
        for name in names:
            assert name in scraped, f"{title}: {name} is not in the scrape"
            base = next((name[: -len(s)] for s in _HISTOGRAM if name.endswith(s)), name)
            for row in prom.api("series", **{"match[]": name}):
                labels_seen |= set(row)
                for label, value in row.items():
                    values_seen.setdefault(label, set()).add(value)
            assert base
        missing = used_labels(expr) - labels_seen
        assert not missing, f"{title}: labels {missing} are in no scraped series of {names}"
        for label, value in matched_values(expr):
            if label in ("job", "instance"):
                continue
            known = values_seen.get(label, set()) | DECLARED.get(label, set())
            assert value in known, f"{title}: {label}={value!r} is neither scraped nor declared"


def write_panels(prom: PrometheusServer, start: float, end: float, marks: dict[str, float]) -> None:
    folder = os.environ.get("WORKERSET_ADMISSION_PANELS_OUT")
    if not folder:
        return
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    step = 1.0
    ranges = [
        target | {"rows": prom.query_range(instantiate(target["expr"]), start, end, step)}
        for target in dashboard_targets()
    ]
    record = {"start": start, "end": end, "step": step, "marks": marks, "queries": ranges}
    (out / "panels.json").write_text(json.dumps(record, indent=1), encoding="utf-8")
    from dashboardplot import draw

    draw(record, out / "metrics-dashboard.png")
