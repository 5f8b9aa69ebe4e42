"""End to end from etcd: workers in etcd, the bridge, the plugin's admitted view, the real frontend.

Real ``python -m dynamo.mocker`` workers register in a real etcd (Dynamo's default discovery);
the etcd bridge mirrors them into the NATS bucket; ``workerset-admission serve --view-dir``
writes the admitted workers' records into a directory; the real Dynamo 1.6.1 frontend runs on
that directory (``--discovery-backend file``). Requests go through the frontend's OpenAI HTTP
API and each answer names the worker that served it.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import aetcd  # type: ignore[import-untyped]
import pytest
from dynamofrontend import free_port
from etcdfixture import LEASE_TTL, EtcdServer, MockerWorkers, card_gone, eventually, new_instance
from natsfixture import NatsServer
from support.buckets import held_values
from support.workers import write_model_dir

pytestmark = [
    pytest.mark.integration,
    pytest.mark.etcd,
    pytest.mark.dynamo,
    pytest.mark.rollout,
    pytest.mark.timeout(240),
]

NAMESPACE = "etcdview"
ENDPOINT = f"dyn://{NAMESPACE}.backend.generate"
MODEL = "tiny"


def _post(url: str, body: dict[str, Any]) -> tuple[int, Any]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, None
    except (urllib.error.URLError, ConnectionError):
        return 0, None


def _get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, None
    except (urllib.error.URLError, ConnectionError):
        return 0, None


async def _served_by(base: str) -> int | None:
    """Send one chat request; return the instance id that served it (None if it failed)."""
    status, answer = await asyncio.to_thread(
        _post,
        f"{base}/v1/chat/completions",
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 4,
            "nvext": {"extra_fields": ["worker_id"]},
        },
    )
    if status != 200 or not answer:
        return None
    worker = answer.get("nvext", {}).get("worker_id", {})
    served = worker.get("decode_worker_id")
    return int(served) if served is not None else None


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


@pytest.mark.parametrize("router_mode", ["round-robin", "kv"])
async def test_requests_reach_only_workers_the_plugin_admitted_from_etcd(
    router_mode: str,
    etcd_server: EtcdServer,
    etcd_client: aetcd.Client,
    mockers: MockerWorkers,
    nats_server: NatsServer,
    bucket_name: str,
    dynamo_etcd_env: dict[str, str],
    tmp_path: Path,
) -> None:
    model_a = write_model_dir(tmp_path / "model-a")
    model_b = write_model_dir(tmp_path / "model-b", context_length=4096)
    view = tmp_path / "view"
    view.mkdir()
    logs = tmp_path / "logs"
    logs.mkdir()
    known: set[int] = set()
    a1_process = mockers.start(model_a, name=MODEL, endpoint=ENDPOINT)
    a1 = await new_instance(etcd_client, known)
    a2_process = mockers.start(model_a, name=MODEL, endpoint=ENDPOINT)
    a2 = await new_instance(etcd_client, known)

    cli = [sys.executable, "-m", "workerset_admission.cli"]
    nats_flags = ["--nats-server", nats_server.url, "--discovery-bucket", bucket_name]
    unique = uuid.uuid4().hex[:8]
    port = free_port()
    processes: list[subprocess.Popen[bytes]] = []

    def spawn(command: list[str], log: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
        with (logs / log).open("wb") as out:
            process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
        processes.append(process)
        return process

    try:
        spawn(
            [*cli, "bridge", "--etcd", etcd_server.url, *nats_flags], "bridge.log", dynamo_etcd_env
        )
        spawn(
            [
                *(*cli, "serve", "--view-dir", str(view), *nats_flags),
                *("--admission-bucket", f"adm-{unique}", "--status-subject", f"st.{unique}"),
            ],
            "serve.log",
            dynamo_etcd_env,
        )
        frontend_env = {**dynamo_etcd_env, "DYN_FILE_KV": str(view)}
        spawn(
            [
                *(sys.executable, "-m", "dynamo.frontend", "--discovery-backend", "file"),
                *("--http-host", "127.0.0.1", "--http-port", str(port)),
                *("--router-mode", router_mode),
            ],
            "frontend.log",
            frontend_env,
        )
        base = f"http://127.0.0.1:{port}"

        async def listed() -> bool:
            status, answer = await asyncio.to_thread(_get, f"{base}/v1/models")
            return status == 200 and any(m.get("id") == MODEL for m in answer.get("data", []))

        await eventually(listed, 90, "the frontend listing the admitted model", interval=0.5)
        await eventually(
            lambda: _served(base), 60, "the first request served through the view", interval=0.5
        )

        # The KV event records came from etcd too: the view carries the admitted workers' ones.
        sources = view / "v1" / "event_sources"
        assert sources.is_dir(), "no event source reached the view"
        assert any(sources.iterdir()), "no event source reached the view"

        # Configuration B joins the same WorkerSet in etcd: rejected, so never in the view.
        mockers.start(model_b, name=MODEL, endpoint=ENDPOINT)
        b = await new_instance(etcd_client, known)
        await asyncio.sleep(2.0)  # bridge, plugin and writer have had ample time to react
        served = [await _served_by(base) for _ in range(24)]
        assert None not in served, served
        assert set(served) <= {a1, a2}, (served, {"a": {a1, a2}, "b": b})
        if router_mode == "round-robin":
            assert set(served) == {a1, a2}, served

        # A drains from etcd (one stopped, one killed: its lease expires): B succeeds it.
        mockers.stop(a1_process)
        mockers.kill(a2_process)
        await card_gone(etcd_client, a2, LEASE_TTL + 20)

        async def moved_to_b() -> bool:
            return await _served_by(base) == b

        await eventually(moved_to_b, 60, "the successor serving", interval=0.5)
        served = [await _served_by(base) for _ in range(12)]
        assert served == [b] * 12, served
    finally:
        for process in reversed(processes):
            _stop(process)


async def _served(base: str) -> bool:
    return await _served_by(base) is not None


# How long requests are sent around the wipe, their spacing, and when the wipe starts.
STEADY_SECONDS = 30.0
STEADY_SPACING = 0.1
WIPE_AFTER = 5.0


async def _steady_requests(base: str, seconds: float) -> list[tuple[float, int | None]]:
    """Send a request every ``STEADY_SPACING`` s for ``seconds``; (send time, server) each."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    sent: list[tuple[float, asyncio.Future[int | None]]] = []
    while loop.time() - start < seconds:
        sent.append((loop.time() - start, asyncio.ensure_future(_served_by(base))))
        await asyncio.sleep(STEADY_SPACING)
    return [(at, await answer) for at, answer in sent]


async def test_a_plugin_nats_server_restarted_on_a_wiped_store_loses_no_request_fed_from_etcd(
    etcd_server: EtcdServer,
    etcd_client: aetcd.Client,
    mockers: MockerWorkers,
    nats_server_fn: NatsServer,
    bucket_name: str,
    dynamo_etcd_env: dict[str, str],
    tmp_path: Path,
) -> None:
    # The plugin's nats-server is the test's own (``nats_server_fn``), apart from the one the
    # Dynamo processes use as their event plane, so the wipe reaches only the plugin's side.
    handle = nats_server_fn.handle
    assert handle is not None
    model = write_model_dir(tmp_path / "model-a")
    view = tmp_path / "view"
    view.mkdir()
    logs = tmp_path / "logs"
    logs.mkdir()
    known: set[int] = set()
    workers = set()
    for _ in range(2):
        mockers.start(model, name=MODEL, endpoint=ENDPOINT)
        workers.add(await new_instance(etcd_client, known))

    cli = [sys.executable, "-m", "workerset_admission.cli"]
    nats_flags = ["--nats-server", nats_server_fn.url, "--discovery-bucket", bucket_name]
    port = free_port()
    processes: list[subprocess.Popen[bytes]] = []

    def spawn(command: list[str], log: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
        with (logs / log).open("wb") as out:
            process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
        processes.append(process)
        return process

    try:
        bridge = spawn(
            [*cli, "bridge", "--etcd", etcd_server.url, *nats_flags], "bridge.log", dynamo_etcd_env
        )
        serve = spawn(
            [*cli, "serve", "--view-dir", str(view), *nats_flags], "serve.log", dynamo_etcd_env
        )
        spawn(
            [
                *(sys.executable, "-m", "dynamo.frontend", "--discovery-backend", "file"),
                *("--http-host", "127.0.0.1", "--http-port", str(port)),
            ],
            "frontend.log",
            {**dynamo_etcd_env, "DYN_FILE_KV": str(view)},
        )
        base = f"http://127.0.0.1:{port}"

        async def both_serving() -> bool:
            served = {await _served_by(base) for _ in range(6)}
            return served == workers

        await eventually(both_serving, 120, "both workers serving through the view", 0.5)

        async def wipe() -> float:
            await asyncio.sleep(WIPE_AFTER)
            # Killed, its store wiped, back after 2 s: the plugin's whole discovery side lost.
            await asyncio.to_thread(handle.restart, kill=True, wipe=True, downtime=2.0)
            return asyncio.get_running_loop().time()

        wiping = asyncio.ensure_future(wipe())
        answers = await _steady_requests(base, STEADY_SECONDS)
        await wiping
        failed = [at for at, served in answers if served is None]
        strangers = [served for _at, served in answers if served not in (None, *workers)]
        print(
            f"{len(failed)} of {len(answers)} requests failed"
            + (f", from +{failed[0]:.1f} s to +{failed[-1]:.1f} s" if failed else "")
            + f" (the wipe began at +{WIPE_AFTER:.0f} s)"
        )
        assert strangers == []
        # The bridge was never restarted: the bucket holds every worker's records again.
        held = await held_values(nats_server_fn.url, bucket_name)
        cards = {int(key.rsplit(".", 1)[1], 16) for key in held if key.startswith("v1.mdc.")}
        assert cards == workers
        assert bridge.poll() is None
        assert serve.poll() is None
        assert failed == [], f"{len(failed)} requests failed around the wipe"
    finally:
        for process in reversed(processes):
            _stop(process)
