"""Hostile or huge input through a real bucket: it hides no worker, blinds no operator.

A service runs with an admitted view on a real nats-server and a writer puts what a worker's
permissions let it put: names the view cannot hold, names that would make two keys one worker,
values that quote hundreds of kilobytes back in their refusal. Every case checks what an
operator and the frontend see: ``status`` answers, every routable worker is in the view, and
nothing is admitted that the view cannot name.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from natsfixture import NatsServer, restartable_server
from support.fleet import (
    ADMISSION,
    DISCOVERY,
    OLD,
    Builder,
    admin,
    fresh_buckets,
    group_of,
    settings_for,
    until,
)
from workerset_admission.adapters.dynamo.view import DirectoryFiles, file_name_for
from workerset_admission.card import encode_endpoint_record, encode_model_record
from workerset_admission.errors import DETAIL_LIMIT
from workerset_admission.identity import EndpointId, instance_key
from workerset_admission.keys import STATUS_SUBJECT
from workerset_admission.service.factory import create_service
from workerset_admission.service.shell import AdmissionService

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


@contextlib.asynccontextmanager
async def serving_view(
    url: str, view_dir: Path, **overrides: Any
) -> AsyncIterator[AdmissionService]:
    """A service writing its admitted view into ``view_dir``; stopped on exit."""
    files = DirectoryFiles.open(view_dir)
    service = await create_service(
        settings_for(url, **overrides), builder=Builder(), view_files=files
    )
    try:
        await service.wait_synced(30)
        yield service
    finally:
        await service.stop()
        files.release()


def view_names(view_dir: Path) -> set[tuple[str, str]]:
    return {
        (path.parent.name, path.name)
        for path in (view_dir / "v1").glob("*/*")
        if not path.name.startswith(".")
    }


def routable_in_view(service: AdmissionService, view_dir: Path) -> list[str]:
    """Every routable worker's instance key the view holds no card or instance file for."""
    names = view_names(view_dir)
    missing = []
    for binding in service.bindings():
        endpoint = binding.id.group.endpoint
        for instance_id in binding.routable():
            name = file_name_for(instance_key(endpoint, instance_id))
            if not {("mdc", name), ("instances", name)} <= names:
                missing.append(instance_key(endpoint, instance_id))
    return missing


async def register(kv: Any, ep: EndpointId, instance_id: int) -> None:
    from workerset_admission.keys import endpoint_kv_key, model_kv_key

    await kv.put(endpoint_kv_key(ep, instance_id), encode_endpoint_record(ep, instance_id))
    await kv.put(model_kv_key(ep, instance_id), encode_model_record(ep, instance_id, OLD))


async def status_reply(nc: Any) -> dict[str, Any]:
    reply = await nc.request(STATUS_SUBJECT, b"", timeout=5)
    return json.loads(reply.data)


async def test_a_worker_the_view_cannot_name_is_refused_with_a_reason_and_never_routable(
    nats_server_fn: NatsServer, tmp_path: Path
) -> None:
    plain = EndpointId("ns-plain", "backend", "generate")
    # 250 bytes of namespace: the file name would be 265 bytes (ENAMETOOLONG).
    long_ns = EndpointId("n" * 250, "backend", "generate")
    async with admin(nats_server_fn.url) as nc:
        fleet = await fresh_buckets(nc)
        async with serving_view(nats_server_fn.url, tmp_path) as service:
            await register(fleet.kv, plain, 1)
            await register(fleet.kv, long_ns, 2)
            await until(
                lambda: len(service.snapshot().recent_invalid) >= 2, 20, "both long keys refused"
            )
            await until(lambda: not routable_in_view(service, tmp_path), 20, "the view")
            snapshot = service.snapshot()
            assert {g.group for g in snapshot.groups} == {group_of(plain)}
            assert {r.reason for r in snapshot.recent_invalid} == {"bad_key"}
            assert all("over the 255" in r.detail for r in snapshot.recent_invalid)
            routable = {i for b in service.bindings() for i in b.routable()}
            assert routable == {1}
            assert (await status_reply(nc))["invalid_total"] == 2


async def test_two_keys_that_would_be_one_worker_are_both_refused_and_nothing_is_withdrawn(
    nats_server_fn: NatsServer, tmp_path: Path
) -> None:
    # Namespace "dgd/backend" and namespace "dgd" with component "backend/generate" are both
    # the path dgd/backend/generate/x/1: one registration, one view file for two keys. A writer
    # of `v1.mdc.dgd.>` used to withdraw the other's worker by putting and deleting its own.
    neighbour = EndpointId("dgd", "backend", "generate")
    keys = ("v1.mdc.dgd=2Fbackend.generate.x.1", "v1.mdc.dgd.backend=2Fgenerate.x.1")
    async with admin(nats_server_fn.url) as nc:
        fleet = await fresh_buckets(nc)
        async with serving_view(nats_server_fn.url, tmp_path) as service:
            await register(fleet.kv, neighbour, 1)
            await until(
                lambda: {i for b in service.bindings() for i in b.routable()} == {1}, 20, "served"
            )
            await until(lambda: not routable_in_view(service, tmp_path), 20, "in the view")
            before = view_names(tmp_path)
            victim = EndpointId("dgd/backend", "generate", "x")
            await fleet.kv.put(keys[0], encode_model_record(victim, 1, OLD))
            forger = EndpointId("dgd", "backend/generate", "x")
            await fleet.kv.put(keys[1], encode_model_record(forger, 1, OLD))
            await fleet.kv.delete(keys[1])

            def refused() -> dict[str, str]:
                return {r.key: r.detail for r in service.snapshot().recent_invalid}

            await until(lambda: set(keys) <= set(refused()), 20, "both keys refused")
            assert all("separator" in refused()[key] for key in keys)
            assert [g.group for g in service.snapshot().groups] == [group_of(neighbour)]
            assert {i for b in service.bindings() for i in b.routable()} == {1}
            assert view_names(tmp_path) == before
            assert not routable_in_view(service, tmp_path)


async def test_one_huge_refused_value_leaves_status_answering_with_a_bounded_detail(
    nats_server_fn: NatsServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ep = EndpointId("ns-a", "backend", "generate")
    caplog.set_level(logging.DEBUG)
    async with admin(nats_server_fn.url) as nc:
        fleet = await fresh_buckets(nc)
        async with serving_view(nats_server_fn.url, tmp_path) as service:
            await register(fleet.kv, ep, 1)
            # The value claims an 800 KB namespace under the writer's own key: refused for
            # disagreeing with it, and the refusal used to quote the whole value.
            record = json.loads(encode_model_record(ep, 1, OLD))
            record["namespace"] = "x" * 800_000
            js = nc.jetstream()
            for n in range(3):
                key = f"v1.mdc.ns-a.backend.generate.{n + 10:x}"
                record["instance_id"] = n + 10
                await js.publish(f"$KV.{DISCOVERY}.{key}", json.dumps(record).encode())
            await until(lambda: service.snapshot().invalid_total >= 3, 20, "refused")
            status = await status_reply(nc)
            assert status["invalid_total"] == 3
            assert status["groups"]
            for refused in status["recent_invalid"]:
                assert refused["reason"] == "identity_mismatch"
                assert len(refused["detail"]) < DETAIL_LIMIT + 40
            # A restarted service reads the same values back and still answers.
        async with serving_view(nats_server_fn.url, tmp_path) as service:
            await until(lambda: service.snapshot().invalid_total >= 3, 20, "refused again")
            assert (await status_reply(nc))["invalid_total"] >= 3
    longest = max(len(r.getMessage()) for r in caplog.records)
    assert longest < 4 * DETAIL_LIMIT, f"a log line of {longest} characters"


# -- a serve started while NATS is down -----------------------------------------------------------

CLI = [sys.executable, "-m", "workerset_admission.cli"]


def _serve(url: str, view_dir: Path, *extra: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WORKERSET_ADMISSION_")}
    env |= {"PYTHONUNBUFFERED": "1", "DYN_FILE_KV": str(view_dir)}
    return subprocess.Popen(
        [
            *(*CLI, "serve", "--nats-server", url, "--view-dir", str(view_dir)),
            *("--discovery-bucket", DISCOVERY, "--admission-bucket", ADMISSION),
            *("--frontend-id", "fe-restarted", *extra),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )


def _record_files(view_dir: Path) -> dict[str, float]:
    return {
        f"{path.parent.name}/{path.name}": path.stat().st_mtime
        for path in (view_dir / "v1").glob("*/*")
        if not path.name.startswith(".")
    }


def _wait(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not hold within {timeout:.0f} s")
        time.sleep(0.05)


def _stop(process: subprocess.Popen[str]) -> tuple[int, str]:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        output, _ = process.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        output, _ = process.communicate()
    return process.returncode, output


@pytest.mark.timeout(120)
async def test_a_serve_started_while_nats_is_down_keeps_the_last_view_and_retries(
    tmp_path: Path,
) -> None:
    servers = restartable_server(tmp_path / "nats")
    server = next(servers)
    view_dir = tmp_path / "view"
    view_dir.mkdir()
    ep = EndpointId("ns-lkg", "backend", "generate")
    first = second = None
    try:
        async with admin(server.url) as nc:
            fleet = await fresh_buckets(nc)
            await register(fleet.kv, ep, 1)
        first = _serve(server.url, view_dir)
        name = file_name_for(instance_key(ep, 1))
        wanted = {f"mdc/{name}", f"instances/{name}"}
        _wait(lambda: wanted <= set(_record_files(view_dir)), 30, "the worker in the view")
        # The sidecar crashes, and NATS goes away before its supervisor restarts it.
        first.kill()
        first.communicate(timeout=10)
        server.handle.stop()
        crashed_at = time.time()
        second = _serve(server.url, view_dir, "--registration-ttl", "8")
        await asyncio.sleep(4.0)
        assert second.poll() is None, "serve exited while NATS was down"
        files = _record_files(view_dir)
        assert wanted <= set(files), "the predecessor's view was emptied"
        assert min(files[f] for f in wanted) > crashed_at, "the view was not kept alive"
        # NATS comes back: the retrying serve connects and takes the view over.
        server.handle.start()
        _wait(lambda: wanted <= set(_record_files(view_dir)), 30, "the view after reconnect")
        _wait(
            lambda: min(_record_files(view_dir).get(f, 0) for f in wanted) > time.time() - 3,
            30,
            "the new writer refreshing the view",
        )
        code, output = _stop(second)
        assert code == 0, output
        assert "cannot reach NATS yet" in output
        assert "keeping the previous writer's" in output
        assert "Traceback" not in output
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.kill()
                process.communicate()
        servers.close()
