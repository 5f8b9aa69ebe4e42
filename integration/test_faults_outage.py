"""Outages against a real nats-server: tenure holds, wiped stores, and resyncs that must not happen.

Workers here heartbeat their registrations with a per-key TTL, as Dynamo workers do, so an
outage longer than the TTL really lets their records expire. Every test is bounded in time and
runs its own server on loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import nats
import pytest
from nats.aio.client import Client as NatsClient
from natsfixture import NatsServer
from support.cards import base_card as demo_card
from workerset_admission.adapters.nats.admission_reader import NatsRecordSource
from workerset_admission.adapters.nats.buckets import BucketSpec, stream_name
from workerset_admission.adapters.nats.connect import NatsConnectOptions
from workerset_admission.adapters.nats.registrar import WorkerRegistrar
from workerset_admission.adapters.nats.source import JetStreamDiscoverySource
from workerset_admission.cli.rollout import GateQuery, check_gate
from workerset_admission.identity import EndpointId, GroupKey, WorkerType
from workerset_admission.service.admission_service import AdmissionService
from workerset_admission.settings import Settings
from workerset_admission.wiring.compose import create_service

# The rollout tier (docs/testing.md): long faults and concurrency trials, its own CI step.
pytestmark = [pytest.mark.integration, pytest.mark.rollout, pytest.mark.timeout(150)]

DISCOVERY = "dynamo-discovery"
ADMISSION = "frontend-model-admission"
EP = EndpointId("outage", "backend", "generate")
A = demo_card(16)
B = demo_card(32)
TTL = 2.0
GROUP = GroupKey.build(A["display_name"], EP, "chat|completions", WorkerType.AGGREGATED)


async def until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout:g} s")
        await asyncio.sleep(0.05)


async def _quiet(_exc: Exception) -> None:
    return None


@contextlib.asynccontextmanager
async def worker_client(url: str) -> AsyncIterator[NatsClient]:
    """The workers' own connection: it rides out every outage by reconnecting."""
    nc = await nats.connect(
        url, max_reconnect_attempts=-1, reconnect_time_wait=0.1, error_cb=_quiet
    )
    try:
        yield nc
    finally:
        await nc.close()


def workers(nc: NatsClient, *, ttl: float = TTL, heartbeat: float | None = None) -> WorkerRegistrar:
    return WorkerRegistrar(
        nc.jetstream(timeout=2),
        bucket=DISCOVERY,
        ttl=ttl,
        heartbeat=heartbeat,
        on_removed="reregister",
    )


def settings_for(url: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "nats_servers": (url,),
        "discovery_bucket": DISCOVERY,
        "admission_bucket": ADMISSION,
        "registration_ttl": TTL,
        "retry_delays": (0.05, 0.1, 0.2),
        "reconcile_interval": 2.0,
        "frontend_id": "fe-outage",
        "tracing": False,
        "metrics": False,
    }
    values.update(overrides)
    return Settings(**values)


@pytest.fixture
def server(nats_server_fn: NatsServer) -> NatsServer:
    assert nats_server_fn.handle is not None
    return nats_server_fn


def admitted(service: AdmissionService) -> tuple[int, ...]:
    group = service.status().group(GROUP)
    return () if group is None else group.admitted


async def serving_a_with_b_waiting(service: AdmissionService, a: WorkerRegistrar) -> None:
    for instance in (1, 2):
        await a.register(EP, instance, A)
    await until(lambda: admitted(service) == (1, 2), 30, "A to be admitted")


async def test_an_outage_of_two_and_a_half_ttls_keeps_the_incumbent_and_its_workers_rejoin(
    server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    handle = server.handle
    assert handle is not None
    caplog.set_level(logging.INFO)
    service = await create_service(settings_for(server.url))
    try:
        await service.wait_synced(30)
        async with worker_client(server.url) as nc_a, worker_client(server.url) as nc_b:
            a, b = workers(nc_a), workers(nc_b)
            await serving_a_with_b_waiting(service, a)
            await b.register(EP, 3, B)
            await until(lambda: len(service.status().groups[0].cohorts) == 2, 30, "B seen")
            receiver = service.receiver_for(GROUP)
            assert receiver is not None

            await asyncio.to_thread(handle.restart, kill=True, downtime=2.5 * TTL)

            # Whatever the resync listed first, A keeps the tenure and its workers come back.
            await until(lambda: admitted(service) == (1, 2), 60, "A's workers to rejoin")
            assert not receiver.retired
            assert receiver.current().admitted == frozenset({1, 2})
            group = service.status().group(GROUP)
            assert group is not None
            assert group.held_until is None
            assert [c.members for c in group.cohorts] == [(1, 2), (3,)]
            assert "succession in" not in caplog.text
            await a.close()
            await b.close()
    finally:
        await service.stop()


async def test_when_the_incumbents_workers_are_really_gone_the_succession_follows_the_hold(
    server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    handle = server.handle
    assert handle is not None
    caplog.set_level(logging.INFO)
    service = await create_service(settings_for(server.url))
    try:
        await service.wait_synced(30)
        async with worker_client(server.url) as nc_a, worker_client(server.url) as nc_b:
            a, b = workers(nc_a), workers(nc_b)
            await serving_a_with_b_waiting(service, a)
            await b.register(EP, 3, B)
            await until(lambda: len(service.status().groups[0].cohorts) == 2, 30, "B seen")
            receiver = service.receiver_for(GROUP)
            assert receiver is not None

            await a.stop_heartbeat()  # A's workers die with the outage
            await asyncio.to_thread(handle.restart, kill=True, downtime=2.5 * TTL)
            await until(lambda: "holding the tenure" in caplog.text, 60, "the hold")
            held_at = time.monotonic()
            # Held: A's workers are served on their last known records for one registration
            # TTL (B is not admitted), then withdrawn while the tenure stays A's.
            assert 3 not in admitted(service)
            assert not receiver.retired
            await until(lambda: admitted(service) == (), TTL + 5, "A's last known workers go")
            assert not receiver.retired

            await until(lambda: admitted(service) == (3,), 3 * TTL + 30, "the succession to B")
            assert time.monotonic() - held_at >= 3 * TTL - 1.0
            assert receiver.retired
            assert "the succession follows" in caplog.text
            assert "succession in" in caplog.text
            await b.close()
            await a.close(withdraw=False)
    finally:
        await service.stop()


async def _gate_live(url: str) -> tuple[str, ...]:
    check = await check_gate(
        NatsRecordSource(NatsConnectOptions(servers=(url,)), ADMISSION, timeout=3.0),
        GateQuery(model=str(A["display_name"]), namespace=EP.namespace),
    )
    return () if check.report is None else check.report.live


async def test_a_wiped_store_gets_both_buckets_back_and_rollout_sees_the_frontend_within_seconds(
    server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    handle = server.handle
    assert handle is not None
    service = await create_service(settings_for(server.url, tenure_hold=1.0))
    try:
        await service.wait_synced(30)
        async with worker_client(server.url) as nc:
            a = workers(nc)
            await serving_a_with_b_waiting(service, a)
            deadline = time.monotonic() + 15
            while "fe-outage" not in await _gate_live(server.url):
                assert time.monotonic() < deadline, "the frontend never reached the gate"
                await asyncio.sleep(0.2)

            await asyncio.to_thread(handle.restart, wipe=True, downtime=0.3)
            wiped_at = time.monotonic()
            while "fe-outage" not in await _gate_live(server.url):
                assert time.monotonic() - wiped_at < 15, "rollout never saw the frontend again"
                await asyncio.sleep(0.2)
            print(f"rollout saw the frontend {time.monotonic() - wiped_at:.1f} s after the wipe")

            js = nc.jetstream(timeout=2)
            for bucket in (DISCOVERY, ADMISSION):
                info = await js.stream_info(stream_name(bucket))
                assert info.config.num_replicas == 1
            # The workers re-register (their keys aged out of nothing: the store is new), and
            # the serving records follow.
            await until(lambda: admitted(service) == (1, 2), 30, "A to be served again")

            async def serving() -> bool:
                check = await check_gate(
                    NatsRecordSource(NatsConnectOptions(servers=(server.url,)), ADMISSION),
                    GateQuery(model=str(A["display_name"]), namespace=EP.namespace),
                )
                return check.report is not None and "fe-outage" in check.report.serving

            deadline = time.monotonic() + 15
            while not await serving():
                assert time.monotonic() < deadline, "the serving record was never re-published"
                await asyncio.sleep(0.2)
            await a.close()

        # A stop while the store is away is clean: one line, no traceback.
        await asyncio.to_thread(handle.stop, kill=True)
        caplog.clear()
        await asyncio.wait_for(service.stop(), 30)
        assert not [r for r in caplog.records if r.exc_info], "a traceback was logged at stop"
    finally:
        await service.stop()


async def test_a_churn_run_makes_no_spurious_resync_and_counts_each_bad_record_once(
    server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    # Ten minutes of a default deployment (10 s TTLs, a stream check every 10 s) compressed:
    # 1 s TTLs with heartbeats every third of it, a stream check every 50 ms and a full
    # re-listing every second, for 20 s.
    caplog.set_level(logging.INFO)
    source = JetStreamDiscoverySource(
        NatsConnectOptions(servers=(server.url,)),
        bucket=DISCOVERY,
        create_bucket=True,
        bucket_spec=BucketSpec(name=DISCOVERY),
        health_interval=0.05,
    )
    service = AdmissionService(source, settings=Settings(reconcile_interval=1.0))
    await service.start()
    try:
        await service.wait_synced(30)
        async with worker_client(server.url) as nc:
            fleet = workers(nc, ttl=1.0)
            for instance in range(1, 21):
                await fleet.register(EP, instance, A if instance % 4 else B)
            for n in range(14):
                # Refreshed with every heartbeat (the same bad value again and again), with a
                # TTL long enough that a slow beat on a busy machine does not let them expire.
                key = f"v1.mdc.outage.backend.generate.bad{n}"
                await fleet.put(key, b"{not json", ttl=10.0)
            await until(lambda: service.counters.invalid >= 14, 30, "the bad records")
            baseline = service.status().invalid_total
            loop_end = time.monotonic() + 20
            churned = 21
            while time.monotonic() < loop_end:
                # Rolling replacement: a worker leaves, a new one comes.
                await fleet.deregister(EP, churned - 20)
                await fleet.register(EP, churned, A if churned % 4 else B)
                churned += 1
                await asyncio.sleep(0.25)
            # The stream check never fired (a connection lost to a loaded machine may still
            # re-create the watch; that is a real resync, not a spurious one).
            assert "stream deleted or re-created" not in caplog.text
            assert "re-created" not in caplog.text
            assert service.status().invalid_total == baseline == 14
            await fleet.close()
    finally:
        await service.stop()
