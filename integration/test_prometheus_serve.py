"""``serve`` as a process: the Prometheus endpoint on its own, and an unreachable collector.

Each test runs the real ``workerset-admission serve`` against the session's nats-server, with
settings from the environment only, and reads what an operator would: the scraped metrics, the
log, the exit status.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from natsfixture import NatsServer
from prometheus_client.parser import text_string_to_metric_families

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

CLI = [sys.executable, "-m", "workerset_admission.cli", "serve"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Collector:
    """A loopback listener standing in for an OTLP collector: it only counts connections."""

    def __init__(self) -> None:
        self._socket = socket.socket()
        self._socket.bind(("127.0.0.1", 0))
        self._socket.listen()
        self._socket.settimeout(0.2)
        self.port = int(self._socket.getsockname()[1])
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._socket.accept()
            except OSError:
                continue
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._socket.close()


@pytest.fixture
def collector() -> Iterator[Collector]:
    listening = Collector()
    try:
        yield listening
    finally:
        listening.close()


def serve_env(nats_server: NatsServer, bucket_name: str, **extra: str) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("WORKERSET_ADMISSION_", "OTEL_"))
    }
    env |= {
        "PYTHONUNBUFFERED": "1",
        "WORKERSET_ADMISSION_NATS_SERVERS": nats_server.url,
        "WORKERSET_ADMISSION_DISCOVERY_BUCKET": bucket_name,
        "WORKERSET_ADMISSION_ADMISSION_BUCKET": f"{bucket_name}-admission",
        "WORKERSET_ADMISSION_STATUS_SUBJECT": f"status.{bucket_name}",
        "WORKERSET_ADMISSION_FRONTEND_ID": "prometheus-serve",
    }
    return env | extra


def wait_for_line(path: Path, text: str, process: subprocess.Popen[bytes], timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        content = path.read_text(errors="replace")
        if text in content:
            return content
        assert process.poll() is None, f"serve exited early:\n{content}"
        time.sleep(0.05)
    raise AssertionError(f"no {text!r} in:\n{path.read_text(errors='replace')}")


def stop(process: subprocess.Popen[bytes]) -> int:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        return process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)
        raise


@pytest.fixture
def log(tmp_path: Path) -> Path:
    return tmp_path / "serve.log"


def start_serve(env: dict[str, str], log: Path, *flags: str) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen([*CLI, *flags], env=env, stdout=out, stderr=subprocess.STDOUT)


def test_a_prometheus_port_alone_serves_the_metrics_and_pushes_nothing(
    nats_server: NatsServer, bucket_name: str, collector: Collector, log: Path
) -> None:
    port = free_port()
    env = serve_env(
        nats_server,
        bucket_name,
        WORKERSET_ADMISSION_PROMETHEUS_PORT=str(port),
        # Were OTLP export on, it would go here, every 100 ms.
        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{collector.port}",
        OTEL_METRIC_EXPORT_INTERVAL="100",
        OTEL_BSP_SCHEDULE_DELAY="100",
    )
    process = start_serve(env, log)
    try:
        wait_for_line(log, "synced:", process, 60)
        assert f"Prometheus metrics on http://127.0.0.1:{port}/metrics" in log.read_text()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            assert reply.headers["Content-Type"].startswith("text/plain")
            families = {f.name: f for f in text_string_to_metric_families(reply.read().decode())}
        statuses = {s.labels["status"] for s in families["workerset_admission_groups"].samples}
        assert {"ready", "retrying", "blocked"} <= statuses
        assert "workerset_admission_workers_admitted" in families
        time.sleep(0.5)  # five export intervals: long enough for OTLP to have tried
    finally:
        assert stop(process) == 0, log.read_text()
    assert collector.connections == 0
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
        pass


def test_an_unreachable_collector_is_said_once_per_signal_and_serve_runs_on(
    nats_server: NatsServer, bucket_name: str, log: Path
) -> None:
    closed = free_port()
    env = serve_env(
        nats_server,
        bucket_name,
        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{closed}",
        OTEL_EXPORTER_OTLP_TIMEOUT="1",
        OTEL_METRIC_EXPORT_INTERVAL="200",
        OTEL_BSP_SCHEDULE_DELAY="100",
    )
    process = start_serve(env, log, "--telemetry")
    try:
        wait_for_line(log, "synced:", process, 60)
        wait_for_line(log, "metrics export to", process, 30)
        time.sleep(2.0)  # ten metric export intervals more, each failing
        assert process.poll() is None
    finally:
        assert stop(process) == 0, log.read_text()
    text = log.read_text()
    assert text.count("metrics export to") == 1, text
    # The exporter's own retries stay out of the log: one of its records per outage.
    assert text.count("/v1/metrics") <= 1, text


_FAILING_SERVE = """
import argparse, asyncio, socket, sys
from workerset_admission.settings import Settings
from workerset_admission.cli.serve import _serve

settings = Settings(nats_servers=(sys.argv[1],), prometheus_port=int(sys.argv[2]))
args = argparse.Namespace(log_format=None, log_level="CRITICAL", telemetry=False)

async def serve():
    return await _serve(settings, args, asyncio.Event())

try:
    asyncio.run(asyncio.wait_for(serve(), 60))
except asyncio.TimeoutError:
    sys.exit("serve hung")
except Exception:
    pass
else:
    sys.exit("serve did not fail")
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[2])), timeout=2).close()
except OSError:
    print("endpoint closed")
else:
    print("endpoint still open")
"""


def test_serve_closes_the_metrics_endpoint_even_when_it_fails_to_start(
    nats_server: NatsServer, bucket_name: str
) -> None:
    # In a process of its own: serve installs global providers, which a process keeps for good.
    port = free_port()
    env = serve_env(nats_server, bucket_name)
    nowhere = f"nats://127.0.0.1:{free_port()}"
    done = subprocess.run(
        [sys.executable, "-c", _FAILING_SERVE, nowhere, str(port)],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert f"Prometheus metrics on http://127.0.0.1:{port}/metrics" in done.stdout
    assert done.stdout.rstrip().endswith("endpoint closed"), done.stdout
