"""A stalled event loop is seen: logged when it turns again, reported while it stands still."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import struct
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from workerset_admission.cli.supervision import HealthServer, SystemdNotifier
from workerset_admission.service.loop_watch import STALLED_AFTER, LoopWatch


def test_a_late_beat_is_logged_with_how_long_the_loop_stood_still(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = [0.0]
    watch = LoopWatch(interval=1.0, stall_after=2.0, clock=lambda: clock[0])
    heard: list[float] = []
    watch.on_beat(lambda: heard.append(clock[0]))
    with caplog.at_level(logging.WARNING):
        clock[0] = 1.0
        watch.beat()
        clock[0] = 2.5  # half a second late: no stall
        watch.beat()
        assert caplog.records == []
        clock[0] = 18.5  # fifteen seconds late: a stall of sixteen
        watch.beat()
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == [
        "the event loop stood still for 16.0 s"
    ]
    assert watch.stalls == 1
    assert watch.longest_stall == pytest.approx(15.0)
    assert heard == [1.0, 2.5, 18.5]


def test_silence_is_measured_while_it_lasts_and_stuck_after_the_limit() -> None:
    clock = [100.0]
    watch = LoopWatch(clock=lambda: clock[0])
    assert not watch.stuck()
    clock[0] = 100.0 + STALLED_AFTER - 0.1
    assert not watch.stuck()
    clock[0] = 100.0 + STALLED_AFTER
    assert watch.stuck()
    assert watch.silent_for() == pytest.approx(STALLED_AFTER)
    watch.beat()
    assert not watch.stuck()


def test_a_listener_whose_supervisor_is_away_is_said_at_warning_and_the_others_still_hear(
    caplog: pytest.LogCaptureFixture,
) -> None:
    watch = LoopWatch()
    heard: list[str] = []

    def broken() -> None:
        raise ConnectionRefusedError("notify socket gone")

    watch.on_beat(broken)
    watch.on_beat(lambda: heard.append("second"))
    with caplog.at_level(logging.DEBUG, logger="workerset_admission.service.loop_watch"):
        watch.beat()
    assert heard == ["second"]
    (record,) = [r for r in caplog.records if "listener" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert "notify socket gone" in record.getMessage()


def test_a_listener_with_a_defect_stops_the_beat_and_its_owner_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from workerset_admission.aio import cancel_and_wait, owned_task

    watch = LoopWatch(interval=0.01, stall_after=10.0)

    def defective() -> None:
        raise RuntimeError("listener bug")

    watch.on_beat(defective)

    async def owner() -> asyncio.Task[object]:
        beating = owned_task(watch.run(), name="the loop beat", log=logging.getLogger("owner"))
        try:
            await asyncio.wait({beating}, timeout=2.0)
        finally:
            await cancel_and_wait([beating])
        return beating

    with caplog.at_level(logging.WARNING, logger="owner"):
        beating = asyncio.run(owner())
    assert beating.done()
    assert not beating.cancelled()
    (record,) = [r for r in caplog.records if r.name == "owner"]
    assert record.levelno == logging.WARNING
    assert "the loop beat stopped: RuntimeError: listener bug" in record.getMessage()


@pytest.mark.parametrize(("interval", "stall_after"), [(0.0, 1.0), (1.0, 0.0), (-1.0, 2.0)])
def test_a_watch_needs_positive_times(interval: float, stall_after: float) -> None:
    with pytest.raises(ValueError, match="positive"):
        LoopWatch(interval=interval, stall_after=stall_after)


def _get(url: str) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


async def test_livez_turns_503_while_the_loop_is_blocked_and_200_once_it_turns_again() -> None:
    watch = LoopWatch(interval=0.05, stall_after=0.2)
    ready = [False]
    health = HealthServer(watch, lambda: ready[0], stalled_after=0.5)
    health.start()
    beating = asyncio.ensure_future(watch.run())
    try:
        await asyncio.sleep(0.2)
        status, body = await asyncio.to_thread(_get, f"{health.url}/livez")
        assert (status, body["loop"]) == (200, "turning")
        assert await asyncio.to_thread(_get, f"{health.url}/readyz") == (
            503,
            {"synced": False, "silent_for": pytest.approx(0.0, abs=0.5)},
        )
        # A call that never yields holds the loop: the probe, on its own thread, sees it.
        answers: list[tuple[int, dict[str, object]]] = []

        def probe_later() -> None:
            time.sleep(0.8)
            answers.append(_get(f"{health.url}/livez"))

        prober = threading.Thread(target=probe_later)
        prober.start()
        time.sleep(1.2)  # noqa: ASYNC251 (the point: the loop stands still)
        prober.join()
        assert answers[0][0] == 503
        assert answers[0][1]["loop"] == "stalled"
        await asyncio.sleep(0.2)
        status, body = await asyncio.to_thread(_get, f"{health.url}/livez")
        assert status == 200
        assert body["stalls"] == 1
        ready[0] = True
        assert (await asyncio.to_thread(_get, f"{health.url}/readyz"))[0] == 200
        assert (await asyncio.to_thread(_get, f"{health.url}/metrics"))[0] == 404
    finally:
        beating.cancel()
        health.close()


def test_systemd_hears_ready_then_a_watchdog_ping_per_beat(tmp_path: Path) -> None:
    path = tmp_path / "notify.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(str(path))
    listener.settimeout(2)
    try:
        notifier = SystemdNotifier({"NOTIFY_SOCKET": str(path)})
        assert notifier.enabled
        watch = LoopWatch()
        notifier.follow(watch)
        watch.beat()
        watch.beat()
        notifier.close()
        heard = [listener.recv(64) for _ in range(4)]
        assert heard == [b"READY=1", b"WATCHDOG=1", b"WATCHDOG=1", b"STOPPING=1"]
    finally:
        listener.close()


def test_without_notify_socket_nothing_is_sent() -> None:
    notifier = SystemdNotifier({})
    assert not notifier.enabled
    watch = LoopWatch()
    notifier.follow(watch)
    watch.beat()  # no listener was added, nothing raised
    notifier.close()


def test_a_probe_that_went_away_before_its_answer_leaves_no_traceback(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    # As after a pause: the probe's request waits, its timeout runs out, it hangs up, and
    # only then is it answered.
    asked, hung_up = threading.Event(), threading.Event()

    def ready() -> bool:
        asked.set()
        assert hung_up.wait(5)
        time.sleep(0.1)  # the reset reaches the server's socket first
        return True

    health = HealthServer(LoopWatch(), ready)
    health.start()
    try:
        host, port = health.url.removeprefix("http://").split(":")
        for _ in range(3):
            asked.clear()
            hung_up.clear()
            probe = socket.create_connection((host, int(port)), timeout=5)
            probe.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert asked.wait(5)
            # A reset on close, as a probe's client that timed out may send.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            probe.close()
            with caplog.at_level(logging.DEBUG, logger="workerset_admission.cli"):
                hung_up.set()
                time.sleep(0.3)
        # Still answering afterwards.
        assert _get(f"{health.url}/livez")[0] == 200
    finally:
        health.close()
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "BrokenPipeError" not in err
    assert "ConnectionResetError" not in err
    assert all(r.levelno <= logging.DEBUG for r in caplog.records if "went away" in r.message)
