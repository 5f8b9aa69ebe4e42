"""Telemetry of the route extension inside Dynamo 1.6.1: through its loader, then the frontend.

Dynamo offers an extension no way onto the frontend's own ``/metrics``, so the plugin serves
its metrics on a port of its own when ``WORKERSET_ADMISSION_PROMETHEUS_PORT`` is set.
"""

from __future__ import annotations

import os
import socket
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from dynamofrontend import free_port, running_frontend
from natsfixture import NatsServer
from prometheus_client.parser import text_string_to_metric_families
from support.workers import file_discovery_environment
from workerset_admission.frontend.routes import (
    HEALTH_PATH,
    shared_telemetry,
    stop_shared_host,
)

pytestmark = [pytest.mark.dynamo, pytest.mark.integration, pytest.mark.timeout(120)]

_NEEDS = "needs ai-dynamo==1.6.1 (its runtime wheel, then `pip install --no-deps ai-dynamo==1.6.1`)"
frontend_main = pytest.importorskip("dynamo.frontend.main", reason=_NEEDS)


def metric_names(port: int) -> set[str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        assert reply.headers["Content-Type"].startswith("text/plain")
        text = reply.read().decode()
    return {family.name for family in text_string_to_metric_families(text)}


def eventually(probe: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not probe():
        assert time.monotonic() < deadline, f"{what} did not happen within {seconds} s"
        time.sleep(0.2)


@pytest.fixture
def environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nats_server: NatsServer, bucket_name: str
) -> dict[str, str]:
    for name in list(os.environ):
        if name.startswith(("OTEL_", "WORKERSET_ADMISSION_")):
            monkeypatch.delenv(name)
    values = file_discovery_environment(tmp_path / "dynamo") | {
        "WORKERSET_ADMISSION_NATS_SERVERS": nats_server.url,
        "WORKERSET_ADMISSION_DISCOVERY_BUCKET": bucket_name,
        "WORKERSET_ADMISSION_ADMISSION_BUCKET": f"adm-{uuid.uuid4().hex[:12]}",
        "WORKERSET_ADMISSION_FRONTEND_ID": "frontend-telemetry",
    }
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    return values


def test_the_loader_starts_the_metrics_endpoint_and_stopping_the_host_closes_it(
    environment: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORKERSET_ADMISSION_PROMETHEUS_PORT", "0")
    try:
        frontend_main.load_frontend_route_extensions(["workerset-admission"])
        handle = shared_telemetry()
        assert handle is not None
        assert handle.tracer_provider is None  # no OTLP export unless telemetry is on
        port = handle.prometheus_port
        assert port
        eventually(
            lambda: "workerset_admission_groups" in metric_names(port),
            30,
            "the service's gauges on the endpoint",
        )
    finally:
        stop_shared_host()
    assert shared_telemetry() is None
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
        pass


def get_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as error:
        return error.code
    except (urllib.error.URLError, ConnectionError):
        return 0


@pytest.fixture
def frontend(environment: dict[str, str], tmp_path: Path) -> Iterator[tuple[int, int, int]]:
    http_port, metrics_port = free_port(), free_port()
    env = os.environ | {"WORKERSET_ADMISSION_PROMETHEUS_PORT": str(metrics_port)}
    with running_frontend(http_port, env, tmp_path / "frontend.log") as process:
        yield process.pid, http_port, metrics_port


def test_the_real_frontend_serves_the_plugins_metrics_on_their_own_loopback_port(
    frontend: tuple[int, int, int],
) -> None:
    pid, http_port, metrics_port = frontend
    process = psutil.Process(pid)

    def healthy() -> bool:
        assert process.status() != psutil.STATUS_ZOMBIE, "the frontend exited"
        return get_status(f"http://127.0.0.1:{http_port}{HEALTH_PATH}") == 200

    eventually(healthy, 60, "the extension becoming healthy")
    names = metric_names(metrics_port)
    assert {"workerset_admission_groups", "workerset_admission_workers_admitted"} <= names
    # The frontend's own /metrics stays Dynamo's: nothing of the plugin's is there.
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=5) as reply:
        assert b"workerset_admission_" not in reply.read()
    listening = {
        c.laddr.ip for c in process.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN
    }
    assert listening <= {"127.0.0.1"}

    process.terminate()
    process.wait(20)
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", metrics_port), timeout=2):
        pass
