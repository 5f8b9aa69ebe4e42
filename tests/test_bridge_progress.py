"""A bridge can be watched: its lag grows while it stands still, and its probes say so."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from support.fakebucket import FakeBucket
from workerset_admission.adapters.bridge_progress import BridgeProgress
from workerset_admission.adapters.dynamo.bridge import DiscoveryBridge
from workerset_admission.cli.supervision import HealthServer, SystemdNotifier
from workerset_admission.service.loop_watch import LoopWatch


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_lag_grows_from_the_start_until_the_first_sync_then_from_each_sync() -> None:
    clock = Clock()
    progress = BridgeProgress(clock=clock)
    clock.now += 3
    assert (progress.synced, progress.lag()) == (False, 3.0)
    began = progress.now()
    clock.now += 0.5
    progress.in_sync(began)
    assert (progress.synced, progress.lag()) == (True, 0.5)
    clock.now += 40  # nothing since: the source loop stopped
    assert progress.lag() == 40.5
    assert progress.silent_for() == 40.0


def test_a_change_seen_stays_unwritten_until_a_sync_that_began_after_it() -> None:
    clock = Clock()
    progress = BridgeProgress(clock=clock)
    began = progress.now()
    clock.now += 1
    progress.change_seen()  # during a pass that began before it: that pass may have missed it
    clock.now += 1
    progress.in_sync(began)
    assert progress.unwritten_for() == 1.0
    clock.now += 2
    assert progress.unwritten_for() == 3.0
    progress.in_sync(progress.now())
    assert progress.unwritten_for() == 0.0
    assert progress.last_write_age() is None
    progress.wrote()
    clock.now += 7
    assert progress.last_write_age() == 7.0


def test_a_failed_write_keeps_the_bridge_out_of_sync_until_a_pass_writes_it(
    tmp_path: Path,
) -> None:
    import asyncio

    record = tmp_path / "v1" / "mdc" / "ns%2Fbackend%2Fgenerate%2Fab"
    record.parent.mkdir(parents=True)
    record.write_bytes(b'{"type":"Model"}')
    key = "v1.mdc.ns.backend.generate.ab"
    bucket = FakeBucket(failing={key})
    bridge = DiscoveryBridge(tmp_path, bucket, notify=False, check_interval=3600.0)

    async def run() -> None:
        await bridge.sync_once()
        assert not bridge.progress.synced
        assert bridge.progress.last_write_age() is None
        bucket.failing.clear()
        await bridge.sync_once()  # reads the mark first (a write failed), then writes
        await bridge.sync_once()

    asyncio.run(run())
    assert bucket.data[key] == b'{"type":"Model"}'
    assert bridge.progress.synced
    assert bridge.progress.lag() < 5
    assert bridge.progress.last_write_age() is not None


def test_the_watchdog_is_pinged_only_while_the_work_goes_on(tmp_path: Path) -> None:
    path = tmp_path / "notify.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(str(path))
    listener.settimeout(0.5)
    try:
        working = [True]
        notifier = SystemdNotifier({"NOTIFY_SOCKET": str(path)})
        watch = LoopWatch()
        notifier.follow(watch, healthy=lambda: working[0])
        watch.beat()
        working[0] = False  # the loop still beats, the source loop does not
        watch.beat()
        watch.beat()
        notifier.close()
        heard = [listener.recv(64) for _ in range(3)]
        assert heard == [b"READY=1", b"WATCHDOG=1", b"STOPPING=1"]
    finally:
        listener.close()


def _get(url: str) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())


@pytest.mark.parametrize("source_turning", [True, False])
def test_the_probes_add_a_check_of_their_own_and_its_figures(source_turning: bool) -> None:
    watch = LoopWatch()
    health = HealthServer(
        watch,
        lambda: True,
        liveness=lambda: (source_turning, {"source_loop": "x"}),
        readiness=lambda: (source_turning, {"lag_seconds": 1.5}),
    )
    health.start()
    try:
        status, body = _get(f"{health.url}/livez")
        assert status == (200 if source_turning else 503)
        assert (body["loop"], body["source_loop"]) == ("turning", "x")
        status, body = _get(f"{health.url}/readyz")
        assert status == (200 if source_turning else 503)
        assert body["lag_seconds"] == 1.5
    finally:
        health.close()
