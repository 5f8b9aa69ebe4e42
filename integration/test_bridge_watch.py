"""The bridge can be watched as ``serve`` is: probes, its lag as a metric, systemd's watchdog.

With the bridge's source loop dead while its process lives, or its store gone, the probes say
so and the lag the metrics endpoint serves grows; a supervisor restarts one and alerts on the
other.
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
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import nats
import pytest
from etcdfixture import EtcdServer
from natsfixture import NatsServer
from workerset_admission.adapters.bridge_progress import BridgeProgress
from workerset_admission.adapters.dynamo.bridge import DiscoveryBridge
from workerset_admission.adapters.nats.bucket_writer import JetStreamBucketWriter
from workerset_admission.adapters.nats.buckets import BucketSpec, ensure_bucket
from workerset_admission.cli.bridge import supervise
from workerset_admission.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

RECORD = "ns%2Fbackend%2Fgenerate%2Fab12"
LAG = "workerset_admission_bridge_lag_seconds"


def _store(tmp_path: Path) -> Path:
    store = tmp_path / "store"
    (store / "v1" / "mdc").mkdir(parents=True)
    (store / "v1" / "mdc" / RECORD).write_bytes(b'{"type":"Model"}')
    return store


def _get(url: str) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())


def _metric(url: str, name: str) -> float:
    with urllib.request.urlopen(url, timeout=5) as answer:
        page = answer.read().decode()
    found = re.search(rf"^{name}(?:{{[^}}]*}})? (\S+)$", page, re.MULTILINE)
    assert found is not None, page
    return float(found.group(1))


async def test_a_bridge_whose_source_loop_died_fails_its_probes_and_its_lag_grows(
    nats_server: NatsServer, bucket_name: str, tmp_path: Path
) -> None:
    store = _store(tmp_path)
    settings = Settings(
        nats_servers=(nats_server.url,),
        discovery_bucket=bucket_name,
        health_port=0,
        prometheus_port=0,
    )
    progress = BridgeProgress()
    async with contextlib.AsyncExitStack() as stack:
        health, metrics = supervise(settings, stack, progress, max_lag=1.0, stalled_after=1.0)
        assert health is not None
        assert metrics is not None
        client = await nats.connect(nats_server.url)
        stack.push_async_callback(client.close)
        status = await ensure_bucket(client.jetstream(), BucketSpec(name=bucket_name))
        writer = JetStreamBucketWriter(status.kv, client=client, bucket=bucket_name)
        bridge = DiscoveryBridge(store, writer, interval=0.1, progress=progress)
        running = asyncio.ensure_future(bridge.run(asyncio.Event()))
        try:
            ready: list[int] = []

            async def probe_ready() -> None:
                ready.append((await asyncio.to_thread(_get, f"{health}/readyz"))[0])

            deadline = time.monotonic() + 20
            while not ready or ready[-1] != 200:
                assert time.monotonic() < deadline, "the bridge never said it was ready"
                await probe_ready()
                await asyncio.sleep(0.1)
            assert (await asyncio.to_thread(_get, f"{health}/livez"))[0] == 200
            assert await asyncio.to_thread(_metric, metrics, LAG) < 1.0
        finally:
            # The source loop dies; the process, its event loop and its endpoints live on.
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running
        await asyncio.sleep(1.5)
        status_code, body = await asyncio.to_thread(_get, f"{health}/livez")
        assert status_code == 503
        assert (body["loop"], body["source_loop"]) == ("turning", "stalled")
        status_code, body = await asyncio.to_thread(_get, f"{health}/readyz")
        assert status_code == 503
        assert float(str(body["lag_seconds"])) >= 1.5
        first = await asyncio.to_thread(_metric, metrics, LAG)
        await asyncio.sleep(0.5)
        second = await asyncio.to_thread(_metric, metrics, LAG)
        assert first >= 1.5
        assert second >= first + 0.4


def _cli_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WORKERSET_ADMISSION_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _endpoints(process: subprocess.Popen[str]) -> tuple[str, str]:
    """Read the health and metrics addresses the bridge names on standard error."""
    assert process.stderr is not None
    health = metrics = None
    deadline = time.monotonic() + 30
    while health is None or metrics is None:
        assert time.monotonic() < deadline, "the bridge named no endpoints"
        line = process.stderr.readline()
        assert line, "the bridge ended before naming its endpoints"
        if found := re.search(r"liveness on (http://\S+)/livez", line):
            health = found.group(1)
        if found := re.search(r"Prometheus metrics on (http://\S+)", line):
            metrics = found.group(1)
    return health, metrics


def _until(condition: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.05)


def test_the_bridge_command_serves_probes_and_lag_and_pings_the_watchdog(
    nats_server: NatsServer, bucket_name: str, tmp_path: Path
) -> None:
    store = _store(tmp_path)
    notify = tmp_path / "notify.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(str(notify))
    listener.settimeout(10)
    env = {**_cli_env(), "NOTIFY_SOCKET": str(notify)}
    command = [
        *(sys.executable, "-m", "workerset_admission.cli", "bridge"),
        *("--file-kv", str(store), "--interval", "0.1", "--ttl", "300", "--max-lag", "0.5"),
        *("--health-port", "0", "--prometheus-port", "0"),
        *("--nats-server", nats_server.url, "--discovery-bucket", bucket_name),
    ]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        health, metrics = _endpoints(process)

        def answers(path: str, status: int) -> None:
            _until(lambda: _get(f"{health}{path}")[0] == status, f"{path} answers {status}")

        answers("/readyz", 200)
        assert _metric(metrics, LAG) < 1.0
        # By now systemd would have heard it: ready, then a ping at each beat of a working loop.
        heard = [listener.recv(64) for _ in range(3)]
        assert heard == [b"READY=1", b"WATCHDOG=1", b"WATCHDOG=1"]
        # The store goes (an unmounted volume): the bridge keeps trying, so it stays live; the
        # bucket is no longer known to hold what the store holds, so it is not ready.
        store.rename(tmp_path / "unmounted")
        answers("/readyz", 503)
        assert _get(f"{health}/livez")[0] == 200
        first = _metric(metrics, LAG)
        time.sleep(0.5)
        assert _metric(metrics, LAG) >= first + 0.4
        # Back: in sync again.
        (tmp_path / "unmounted").rename(store)
        answers("/readyz", 200)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        listener.close()
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()


def test_the_etcd_bridge_is_ready_once_listed_and_its_lag_grows_while_etcd_is_gone(
    nats_server: NatsServer, bucket_name: str, etcd_server: EtcdServer
) -> None:
    command = [
        *(sys.executable, "-m", "workerset_admission.cli", "bridge", "--etcd", etcd_server.url),
        *("--health-port", "0", "--prometheus-port", "0"),
        *("--nats-server", nats_server.url, "--discovery-bucket", bucket_name),
    ]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_cli_env()
    )
    try:
        health, metrics = _endpoints(process)
        _until(lambda: _get(f"{health}/readyz")[0] == 200, "/readyz answers 200")
        status, body = _get(f"{health}/livez")
        assert (status, body["source_loop"]) == (200, "turning")
        etcd_server.stop()
        # Nothing can put the bucket in sync while etcd is gone: the lag only grows, and the
        # bridge, retrying, stays live.
        first = _metric(metrics, LAG)
        time.sleep(1.0)
        assert _metric(metrics, LAG) >= first + 0.9
        assert _get(f"{health}/livez")[0] == 200
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()
