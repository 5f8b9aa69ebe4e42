"""Frontends agree on the incumbent: peer-aligned starts and key-ordered cold starts, real NATS.

Workers heartbeat their registrations (1 s TTL, a refresh every third of it), so the bucket's
last-write order keeps changing; B's instance key sorts before A's, so a frontend that merely
took a listing in key order would pick B.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client as NatsClient
from natsfixture import NatsServer
from support.cards import base_card
from workerset_admission.adapters.nats.registrar import WorkerRegistrar
from workerset_admission.identity import EndpointId, instance_key
from workerset_admission.service.admission_service import AdmissionService
from workerset_admission.settings import Settings
from workerset_admission.traces.replay import is_admitted, replay
from workerset_admission.wiring.compose import create_service

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

EP = EndpointId("agree", "backend", "generate")
A, B = base_card(16), base_card(32)
A_IDS, B_IDS = (0x10, 0x11), (0x1,)
# Long enough that a heartbeat held up by a loaded machine never lets a live worker's record
# expire: an expiry makes its cohort rejoin at the end, which is another test's subject.
TTL = 3.0


async def until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout:g} s")
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def fleet(url: str, bucket: str) -> AsyncIterator[WorkerRegistrar]:
    nc: NatsClient = await nats.connect(url)
    workers = WorkerRegistrar(nc.jetstream(), bucket=bucket, ttl=TTL)
    try:
        yield workers
    finally:
        await workers.close()
        await nc.close()


def settings_for(url: str, bucket: str, frontend: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "nats_servers": (url,),
        "discovery_bucket": bucket,
        "admission_bucket": f"{bucket}-adm",
        "status_subject": f"status.{bucket}",
        "frontend_id": frontend,
        "tracing": False,
        "metrics": False,
    }
    values.update(overrides)
    return Settings(**values)


def incumbent(service: AdmissionService) -> str | None:
    groups = service.status().groups
    return groups[0].incumbent if groups else None


def cohorts(service: AdmissionService) -> int:
    groups = service.status().groups
    return len(groups[0].cohorts) if groups else 0


async def serving_record_of(service: AdmissionService) -> None:
    # The first frontend's serving record reaches the bucket once its build is committed.
    await until(lambda: bool(service.serving_records()), 30, "the serving record")
    await asyncio.sleep(0.5)  # one publication round


@pytest.mark.parametrize("phase", [0.0, 0.3, 0.6])
async def test_frontends_started_at_any_moment_of_a_heartbeat_cycle_all_serve_the_incumbent(
    nats_server: NatsServer, bucket_name: str, phase: float
) -> None:
    started: list[AdmissionService] = []
    try:
        async with fleet(nats_server.url, bucket_name) as workers:
            first = await create_service(settings_for(nats_server.url, bucket_name, "fe-1"))
            started.append(first)
            await first.wait_synced(30)
            for instance in A_IDS:
                await workers.register(EP, instance, A)
            await until(lambda: incumbent(first) is not None, 30, "A reserved")
            serving = incumbent(first)
            for instance in B_IDS:
                await workers.register(EP, instance, B)
            await until(lambda: cohorts(first) == 2, 30, "B seen and rejected")
            await serving_record_of(first)

            # Start the others at a chosen moment of the refresh cycle: right after a beat,
            # plus the phase (in thirds of the TTL, the heartbeat interval).
            beat = workers.refreshes
            await until(lambda: workers.refreshes > beat, 10, "a heartbeat")
            await asyncio.sleep(phase * TTL / 3)
            for n in (2, 3):
                other = await create_service(settings_for(nats_server.url, bucket_name, f"fe-{n}"))
                started.append(other)
                await other.wait_synced(30)
                await asyncio.sleep(TTL / 7)  # the next one a little later in the cycle
            for service in started:
                await until(lambda s=service: cohorts(s) == 2, 30, "both cohorts seen")
            assert [incumbent(s) for s in started] == [serving] * 3
    finally:
        for service in started:
            await service.stop()


async def test_frontends_cold_started_together_without_peers_agree_in_key_order(
    nats_server: NatsServer, bucket_name: str
) -> None:
    started: list[AdmissionService] = []
    try:
        async with fleet(nats_server.url, bucket_name) as workers:
            for instance in A_IDS:
                await workers.register(EP, instance, A)
            for instance in B_IDS:
                await workers.register(EP, instance, B)
            await asyncio.sleep(TTL)  # a few heartbeats reshuffle the last-write order
            services = await asyncio.gather(
                *(
                    create_service(
                        settings_for(nats_server.url, bucket_name, f"cold-{n}", tracing=False)
                    )
                    for n in range(3)
                )
            )
            started.extend(services)
            for service in started:
                await service.wait_synced(30)
                await until(lambda s=service: cohorts(s) == 2, 30, "both cohorts seen")
            chosen = {incumbent(s) for s in started}
            assert len(chosen) == 1
            # B's key sorts first: the choice etcd's key order gives, as Dynamo's frontends.
            group = started[0].status().groups[0]
            assert group.admitted == B_IDS
    finally:
        for service in started:
            await service.stop()


async def _cli(*args: str, timeout: float = 60.0) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "workerset_admission.cli",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        _out, err = await asyncio.wait_for(process.communicate(), timeout)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode is not None
    return process.returncode, err.decode()


async def test_a_recording_taken_mid_rollout_explains_what_the_live_frontend_decided(
    nats_server: NatsServer, bucket_name: str, tmp_path: Path
) -> None:
    settings = settings_for(nats_server.url, bucket_name, "fe-live")
    connection = [
        *("--nats-server", nats_server.url, "--discovery-bucket", bucket_name),
        *("--admission-bucket", settings.admission_bucket),
        *("--status-subject", settings.status_subject),
    ]
    service = await create_service(settings)
    try:
        async with fleet(nats_server.url, bucket_name) as workers:
            await service.wait_synced(30)
            for instance in A_IDS:
                await workers.register(EP, instance, A)
            await until(lambda: incumbent(service) is not None, 30, "A reserved")
            # The rollout: B's workers come while A serves (B's key sorts first).
            for instance in B_IDS:
                await workers.register(EP, instance, B)
            await until(lambda: cohorts(service) == 2, 30, "B seen and rejected")
            await serving_record_of(service)

            trace = tmp_path / "rollout.jsonl"
            code, err = await _cli("record", "--duration", "1", "-o", str(trace), *connection)
            assert code == 0, err
            lines = trace.read_text().splitlines()
            kinds = [json.loads(line)["kind"] for line in lines]
            assert kinds[:3] == ["trace", "state", "snapshot"]
            result = replay(lines)
            live = service.status().groups[0]
            for instance in (*A_IDS, *B_IDS):
                key = instance_key(EP, instance)
                assert is_admitted(result, key) == (instance in live.admitted), key
                code, _err = await _cli("explain", str(trace), key)
                assert code == (0 if instance in live.admitted else 1), key
            # Without the state line the listing alone would have chosen B.
            assert not is_admitted(replay([lines[0], *lines[2:]]), instance_key(EP, A_IDS[0]))
    finally:
        await service.stop()


async def test_record_with_several_live_frontends_asks_which_one(
    nats_server: NatsServer, bucket_name: str, tmp_path: Path
) -> None:
    started = [
        await create_service(settings_for(nats_server.url, bucket_name, name))
        for name in ("fe-a", "fe-b")
    ]
    settings = settings_for(nats_server.url, bucket_name, "unused")
    connection = [
        *("--nats-server", nats_server.url, "--discovery-bucket", bucket_name),
        *("--admission-bucket", settings.admission_bucket),
        *("--status-subject", settings.status_subject),
    ]
    try:
        for service in started:
            await service.wait_synced(30)
        await asyncio.sleep(1.0)  # their capability records
        trace = tmp_path / "t.jsonl"
        code, err = await _cli("record", "--duration", "1", "-o", str(trace), *connection)
        assert code == 2
        assert "fe-a, fe-b" in err
        code, err = await _cli(
            "record", "--duration", "1", "-o", str(trace), "--frontend", "fe-b", *connection
        )
        assert code == 0, err
        state = json.loads(trace.read_text().splitlines()[1])
        assert (state["kind"], state["frontend"]) == ("state", "fe-b")
    finally:
        for service in started:
            await service.stop()
