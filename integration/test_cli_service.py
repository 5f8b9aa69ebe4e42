"""``serve``, ``status``, ``record``/``replay`` and ``demo`` from the command line, end to end."""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nats
import pytest
from natsfixture import NatsServer
from support.aio import eventually
from support.cards import base_card as demo_card
from workerset_admission.adapters.nats.connect import NatsConnectOptions
from workerset_admission.adapters.nats.registrar import WorkerRegistrar
from workerset_admission.adapters.nats.source import JetStreamDiscoverySource
from workerset_admission.cli.traces import record_trace
from workerset_admission.identity import EndpointId
from workerset_admission.service.admission_service import AdmissionService
from workerset_admission.settings import load_settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

EP = EndpointId("dgd", "backend", "generate")
CARD: dict[str, Any] = demo_card(16)
NEW = demo_card(32)
CLI = [sys.executable, "-m", "workerset_admission.cli"]


def cli_env() -> dict[str, str]:
    # Settings come from flags only: nothing from the developer's environment leaks in.
    env = {k: v for k, v in os.environ.items() if not k.startswith("WORKERSET_ADMISSION_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def read_line_matching(process: subprocess.Popen[str], pattern: str, timeout: float) -> str:
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        seen.append(line)
        if re.search(pattern, line):
            return line
    raise AssertionError(f"no line matching {pattern!r} in {seen!r}")


def status_until(
    flags: list[str], done: Callable[[dict[str, Any]], bool], timeout: float = 20
) -> dict[str, Any]:
    """Ask ``status --json`` until its answer is ``done``; return that answer."""
    deadline = time.monotonic() + timeout
    while True:
        status = subprocess.run(
            [*CLI, "status", *flags, "--json"],
            capture_output=True,
            text=True,
            env=cli_env(),
            timeout=30,
            check=False,
        )
        assert status.returncode == 0, status.stderr
        answer: dict[str, Any] = json.loads(status.stdout)
        if done(answer):
            return answer
        assert time.monotonic() < deadline, answer
        time.sleep(0.2)  # a status round trip is cheap; poll it a few times a second


def stop_serve(serve: subprocess.Popen[str]) -> None:
    """Stop a serve process a test left running, and close its pipes."""
    if serve.poll() is None:
        # SIGTERM first: serve stops its embedded nats-server; a kill would orphan it.
        serve.terminate()
        try:
            serve.wait(timeout=15)
        except subprocess.TimeoutExpired:
            serve.kill()
            serve.wait(timeout=10)
    for stream in (serve.stdout, serve.stderr):
        if stream is not None:
            stream.close()


def test_serve_starts_an_embedded_server_answers_status_and_stops_on_sigterm(
    tmp_path: Path,
) -> None:
    env = cli_env()
    announced = tmp_path / "serve.json"
    env["WORKERSET_ADMISSION_SERVE_FILE"] = str(announced)
    serve = subprocess.Popen(
        [*CLI, "serve", "--store-dir", str(tmp_path / "js"), "--frontend-id", "fe-cli"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        line = read_line_matching(serve, r"listening on nats://127\.0\.0\.1:\d+", 30)
        url = re.search(r"nats://127\.0\.0\.1:\d+", line)
        assert url is not None
        read_line_matching(serve, r"^synced:", 30)

        async def register() -> None:
            nc = await nats.connect(url.group(0))
            workers = WorkerRegistrar(nc.jetstream(), ttl=None)
            await workers.register(EP, 0x1A, CARD)
            await workers.register_endpoint(EP, 0x1A)
            await workers.register(EP, 0x2B, NEW)
            await nc.close()

        asyncio.run(register())
        answer = status_until(
            ["--nats-server", url.group(0)],
            lambda a: (
                bool(a["groups"])
                and a["groups"][0]["status"] == "ready"
                and len(a["groups"][0]["cohorts"]) == 2
            ),
        )
        groups = answer["groups"]
        assert groups[0]["admitted"] == [0x1A]
        assert groups[0]["rejected"] == [groups[0]["cohorts"][1]["checksum"]]
        assert answer["readiness"][0]["ready"] is True
        # Without a server named, status finds the local serve through its announcement.
        assert json.loads(announced.read_text())["url"] == url.group(0)
        table = subprocess.run(
            [*CLI, "status"],
            capture_output=True,
            text=True,
            env=env,
            timeout=30,
            check=True,
        ).stdout
        header, row = table.splitlines()[:2]
        assert header.split() == [
            "group",
            "incumbent",
            "status",
            "gen",
            "admitted",
            "rejected",
            "readiness",
        ]
        assert "ready" in row
        assert " 26 " in f" {row} "  # instance 0x1a, printed as an integer
        serve.send_signal(signal.SIGTERM)
        assert serve.wait(timeout=30) == 0
        assert not announced.exists()
    finally:
        stop_serve(serve)


def test_status_without_a_running_service_says_so_and_fails(nats_server: NatsServer) -> None:
    status = subprocess.run(
        [*CLI, "status", "--nats-server", nats_server.url, "--timeout", "1"],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=30,
        check=False,
    )
    assert status.returncode == 3  # unreachable: nothing answers
    assert "no admission service answers" in status.stderr


async def test_record_then_replay_gives_the_state_the_live_service_holds(
    nats_server: NatsServer, bucket_name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = load_settings(
        flags={"nats_servers": nats_server.url, "discovery_bucket": bucket_name}, env={}
    )
    nc = await nats.connect(nats_server.url)
    workers = WorkerRegistrar(nc.jetstream(), bucket=bucket_name, ttl=None)
    await workers.register(EP, 1, CARD)
    await workers.register(EP, 2, NEW)
    source = JetStreamDiscoverySource(
        NatsConnectOptions(servers=(nats_server.url,)), bucket=bucket_name
    )
    service = AdmissionService(source)
    await service.start()
    trace = io.StringIO()
    stop = asyncio.Event()
    recorder = asyncio.create_task(record_trace(settings, trace, stop=stop))
    try:
        await service.wait_synced(15)
        await eventually(lambda: trace.getvalue().count("\n") >= 1, "the recorder has a snapshot")
        # Live changes while both watch: a third worker, then a drain and a succession.
        await workers.register(EP, 3, CARD)
        await workers.deregister(EP, 1)
        await workers.register(EP, 4, NEW)
        await workers.deregister(EP, 3)
        # A record the boundary refuses: live and replay must both report it, and keep state.
        await workers.put("v1.mdc.dgd.backend.generate.9", b"{not json")

        def settled() -> bool:
            groups = service.status().groups
            return bool(groups) and groups[0].admitted == (2, 4) and groups[0].status == "ready"

        await eventually(settled, "the live service settles")
        await eventually(lambda: service.status().invalid_total == 1, "the refusal is reported")
        await eventually(lambda: trace.getvalue().count("\n") >= 6, "the recorder saw every change")
    finally:
        stop.set()
        await asyncio.wait_for(recorder, 15)
        live = service.status()
        await service.stop()
        await nc.close()
    path = tmp_path / "trace.jsonl"
    path.write_text(trace.getvalue(), encoding="utf-8")
    from workerset_admission.cli import main
    from workerset_admission.identity import with_id_strings

    capsys.readouterr()
    assert await asyncio.to_thread(main, ["replay", str(path)]) == 0
    replayed = json.loads(capsys.readouterr().out)
    # The same ingestion and core ran both: every field replay shows equals the live one.
    fields = ("group_id", "model", "worker_set_id", "incumbent", "status", "generation", "receiver")
    # The replay command prints each id list a second time as strings, as status --json does.
    live_groups = [with_id_strings(g.to_json()) for g in live.groups]
    assert len(live_groups) == len(replayed["groups"]) == 1
    for live_group, replayed_group in zip(live_groups, replayed["groups"], strict=True):
        assert {f: replayed_group[f] for f in fields} == {f: live_group[f] for f in fields}
        assert replayed_group["admitted"] == live_group["admitted"] == [2, 4]
        assert replayed_group["cohorts"] == live_group["cohorts"]
    assert (
        replayed["invalid"]
        == [{"key": r.key, "reason": r.reason} for r in live.recent_invalid]
        == [{"key": "v1.mdc.dgd.backend.generate.9", "reason": "invalid_json"}]
    )


def test_the_demo_plays_a_rolling_update_to_the_end() -> None:
    demo = subprocess.run(
        [*CLI, "demo", "--timeout", "60"],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=110,
        check=False,
    )
    assert demo.returncode == 0, demo.stdout + demo.stderr
    out = demo.stdout
    assert "REJECTED cohort" in out
    assert "succession:" in out
    # The v1 workers leave by the real drain command, the last one handing over to v2.
    assert out.count("$ workerset-admission drain 0x") == 2
    assert out.count("safe to stop: no live frontend routes to dgd/") == 2
    assert out.index("drained dgd/2b") < out.index("succession:")
    assert "the v1 receiver is retired: True" in out
    assert out.rstrip().endswith("demo complete")
    # The rejected cohort is logged once, at ERROR, with its fields in the text.
    assert out.count("ERROR") == 1
    assert "rejected_checksum=" in out


def test_status_with_no_server_and_no_local_serve_says_where_it_looked(tmp_path: Path) -> None:
    env = cli_env()
    env["WORKERSET_ADMISSION_SERVE_FILE"] = str(tmp_path / "nobody.json")
    status = subprocess.run(
        [*CLI, "status"], capture_output=True, text=True, env=env, timeout=30, check=False
    )
    assert status.returncode == 3
    assert "nobody.json" in status.stderr


def test_serve_against_an_unreachable_server_exits_with_a_clear_error() -> None:
    from workerset_admission.adapters.nats.embedded import free_loopback_port

    url = f"nats://127.0.0.1:{free_loopback_port()}"
    serve = subprocess.run(
        [*CLI, "serve", "--nats-server", url],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=60,
        check=False,
    )
    assert serve.returncode == 3
    assert serve.stderr.startswith("workerset-admission serve: cannot reach NATS: ")
    assert "Traceback" not in serve.stderr


def test_serve_names_what_a_conflicting_card_differs_in_in_status_and_its_error_line(
    nats_server_fn: NatsServer, bucket_name: str
) -> None:
    url = nats_server_fn.url
    flags = ["--nats-server", url]
    serve = subprocess.Popen(
        [
            *(*CLI, "serve", *flags, "--discovery-bucket", bucket_name),
            *("--admission-bucket", f"adm-{bucket_name}", "--frontend-id", "fe"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
    )
    try:
        read_line_matching(serve, r"^synced:", 30)

        async def register() -> None:
            nc = await nats.connect(url)
            workers = WorkerRegistrar(nc.jetstream(), bucket=bucket_name, ttl=None)
            await workers.register(EP, 1, CARD)
            await workers.register(EP, 2, demo_card(32, aliases=["v2"]))
            await nc.close()

        asyncio.run(register())
        (rejection,) = status_until(flags, lambda answer: bool(answer["rejections"]))["rejections"]
        assert rejection["instance"] == "dgd/backend/generate/2"
        assert (rejection["model"], rejection["namespace"]) == (CARD["display_name"], "dgd")
        assert rejection["differences"] == [
            {"field": "kv_cache_block_size", "incumbent": "16", "rejected": "32"},
            {"field": "aliases", "incumbent": "[]", "rejected": '["v2"]'},
        ]
        serve.send_signal(signal.SIGTERM)
        _, err = serve.communicate(timeout=30)
        assert serve.returncode == 0
        [line] = [line for line in err.splitlines() if " ERROR " in line]
        assert "rejected cohort: " in line
        assert 'differs in: kv_cache_block_size 16 -> 32; aliases [] -> ["v2"] (' in line
    finally:
        stop_serve(serve)
