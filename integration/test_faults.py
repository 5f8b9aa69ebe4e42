"""Faults against a real nats-server, each bounded in time, loopback only.

Every test runs the service as a host would (``create_service``: JetStream source, admission
publisher, status responder) and injects one kind of fault: the server killed or restarted with
its store kept or wiped, the client connection cut in the middle of a snapshot, builders that
hang, raise or answer too late, a burst of registrations and removals while builds are in
flight, duplicate and reordered deliveries, and the service itself restarted.

Three things are checked after every fault:

* the admission state equals a replay of what the bucket holds (``workerset-admission replay``
  over a snapshot of the bucket): the same groups and cohorts, and the same incumbents whenever
  the service observed the bucket in the order the replay does;
* no receiver ever shows a worker outside its incumbent cohort: an invariant checker runs after
  every state change of the service, over the receivers the test holds and the current ones;
* no task, connection or receiver leaked once the service has stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
from natsfixture import NatsServer
from support.buckets import live_keys
from support.fleet import (
    ADMISSION,
    NEW,
    OLD,
    Builder,
    admin,
    all_ready,
    assert_replays_bucket,
    bind_fleet,
    bucket_listing,
    endpoint,
    fresh_buckets,
    group_of,
    live_groups,
    rebuilt_buckets,
    running,
    until,
)
from support.proxy import TcpProxy

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

# -- fixtures -----------------------------------------------------------------------------------


@pytest.fixture
def server(nats_server_fn: NatsServer) -> NatsServer:
    assert nats_server_fn.handle is not None
    return nats_server_fn


# =========================================================================================== tests


async def test_a_server_killed_mid_stream_and_restarted_on_its_store_loses_no_change(
    server: NatsServer,
) -> None:
    handle = server.handle
    assert handle is not None
    async with admin(server.url) as nc:
        fleet = await fresh_buckets(nc)
        ep = endpoint()
        await fleet.register(ep, range(1, 21), OLD)
        await fleet.register(ep, range(101, 106), NEW)
        async with running(server.url) as (service, watchdog):
            await all_ready(service)
            first = service.receiver_for(group_of(ep))
            assert first is not None

            writer = asyncio.create_task(fleet.register(ep, range(1001, 1201), OLD, window=10))
            await asyncio.sleep(0.05)
            await asyncio.to_thread(handle.stop, kill=True)
            # What was delivered before the kill is still being applied: let it land first.
            serving = first.current().admitted
            for _ in range(50):
                await asyncio.sleep(0.1)
                if first.current().admitted == serving:
                    break
                serving = first.current().admitted
            await asyncio.sleep(0.5)
            # While discovery is unreachable, what was admitted stays admitted.
            assert not first.retired
            assert first.current().admitted == serving
            assert set(range(1, 21)) <= serving
            await asyncio.to_thread(handle.start)
            with contextlib.suppress(Exception):
                await writer  # puts that hit the dead server fail; the bucket says what landed
            fleet = await bind_fleet(nc)
            await fleet.register(ep, range(300, 310), OLD)
            await fleet.remove(ep, range(1, 6))

            await assert_replays_bucket(service, server.url)
            assert not first.retired, "a restart must not end the incumbent's tenure"
            current = service.receiver_for(group_of(ep))
            assert current is not None
            assert current.receiver_id == first.receiver_id
            watchdog.assert_clean()


async def test_a_server_restarted_with_a_wiped_store_converges_on_what_workers_reregister(
    server: NatsServer,
) -> None:
    handle = server.handle
    assert handle is not None
    ep = endpoint()
    async with admin(server.url) as nc:
        fleet = await fresh_buckets(nc)
        await fleet.register(ep, range(1, 11), OLD)
        await fleet.register(ep, range(101, 104), NEW)
        async with running(server.url) as (service, watchdog):
            await all_ready(service)
            first = service.receiver_for(group_of(ep))
            assert first is not None

            # The store is gone; workers re-register, the incumbent's configuration first and
            # with new ids. Whenever the service re-binds (to an empty, partial or full
            # bucket), it observes that configuration before the competitor.
            await asyncio.to_thread(handle.restart, wipe=True, downtime=0.3)
            fleet = await rebuilt_buckets(nc)
            await fleet.register(ep, range(50, 55), OLD)
            await fleet.register(ep, range(101, 104), NEW)

            await assert_replays_bucket(service, server.url)
            current = service.receiver_for(group_of(ep))
            assert current is not None
            assert current.current().admitted == frozenset(range(50, 55))
            assert first.retired or first.current().admitted == frozenset(range(50, 55))
            first = current

            # Wiped again, and only the rejected configuration comes back: succession.
            await asyncio.to_thread(handle.restart, wipe=True, downtime=0.3)
            fleet = await rebuilt_buckets(nc)
            await fleet.register(ep, range(101, 104), NEW)
            await assert_replays_bucket(service, server.url)
            await until(lambda: first.retired, 10, "the old tenure to retire")
            successor = service.receiver_for(group_of(ep))
            assert successor is not None
            assert successor.current().admitted == frozenset(range(101, 104))
            watchdog.assert_clean()


async def test_a_connection_cut_while_a_listing_is_applied_converges_after_reconnect(
    server: NatsServer,
) -> None:
    port = int(server.url.rsplit(":", 1)[1])
    ep_old, ep_mixed = endpoint(0), endpoint(1)
    async with admin(server.url) as nc:
        fleet = await fresh_buckets(nc)
        await fleet.register(ep_old, range(1, 1501), OLD)
        await fleet.register(ep_mixed, range(1, 301), OLD)
        await fleet.register(ep_mixed, range(1001, 1301), NEW)
        proxy = TcpProxy(port)
        url = await proxy.start()
        try:
            # Cut every connection a third of the way through the initial values.
            listing = await bucket_listing(server.url)
            initial_bytes = sum(len(e.key) + len(e.value) for e in listing.entries)
            proxy.cut_after = initial_bytes // 3
            async with running(url) as (service, watchdog):
                await until(lambda: proxy.cuts >= 1, 30, "the cut")
                await fleet.register(ep_old, range(1501, 1511), OLD)
                await fleet.remove(ep_mixed, range(1, 11))
                await assert_replays_bucket(service, server.url)
                watchdog.assert_clean()
        finally:
            await proxy.close()


async def test_a_hanging_builder_blocks_nothing_else_and_is_cancelled_on_succession(
    server: NatsServer,
) -> None:
    stuck, other = endpoint(0), endpoint(1)
    builder = Builder(hang={group_of(stuck)})
    async with admin(server.url) as nc:
        fleet = await fresh_buckets(nc)
        await fleet.register(stuck, range(1, 4), OLD)
        await fleet.register(stuck, range(11, 14), NEW)
        await fleet.register(other, range(1, 4), OLD)
        async with running(server.url, builder) as (service, watchdog):
            await until(lambda: live_groups(service)[group_of(other).id].status == "ready")
            assert live_groups(service)[group_of(stuck).id].status == "building"
            hung = service.receiver_for(group_of(stuck))
            assert hung is not None

            # The incumbent drains while its build hangs: the build is cancelled, the tenure
            # retired, and the successor builds (and hangs too, until it is removed as well).
            await fleet.remove(stuck, range(1, 4))
            await until(lambda: builder.cancelled >= 1, 10, "the hung build to be cancelled")
            await until(lambda: hung.retired, 10, "the hung tenure to retire")
            await assert_replays_bucket(service, server.url)
            await fleet.remove(stuck, range(11, 14))
            await until(lambda: builder.cancelled >= 2, 10, "the successor build to be cancelled")
            await assert_replays_bucket(service, server.url)
            watchdog.assert_clean()


async def test_a_builder_that_raises_is_retried_until_it_succeeds(server: NatsServer) -> None:
    ep = endpoint()
    builder = Builder(fail={group_of(ep): 3})
    async with admin(server.url) as nc:
        fleet = await fresh_buckets(nc)
        await fleet.register(ep, range(1, 6), OLD)
        async with running(server.url, builder) as (service, watchdog):
            await all_ready(service)
            assert builder.failed == 3
            generations = [r.generation for r in builder.started]
            assert generations == sorted(set(generations)), "each attempt gets a fresh generation"
            await assert_replays_bucket(service, server.url)
            watchdog.assert_clean()


async def test_a_builder_answering_after_its_group_was_succeeded_is_fenced_out(
    server: NatsServer,
) -> None:
    ep = endpoint()
    builder = Builder(late={group_of(ep)})
    async with admin(server.url) as nc:
        fleet = await fresh_buckets(nc)
        await fleet.register(ep, range(1, 4), OLD)
        await fleet.register(ep, range(11, 14), NEW)
        async with running(server.url, builder) as (service, watchdog):
            await until(lambda: len(builder.started) >= 1, 10, "the first build")
            first = service.receiver_for(group_of(ep))
            assert first is not None
            late_generation = builder.started[0].generation

            builder.late.clear()  # the successor's build behaves
            await fleet.remove(ep, range(1, 4))
            await until(builder.late_returned.is_set, 10, "the late answer")
            await all_ready(service)

            view = live_groups(service)[group_of(ep).id]
            assert view.committed_generation != late_generation
            assert service.pipeline(group_of(ep)) != ("late pipeline", late_generation)
            assert first.retired
            assert view.admitted == (11, 12, 13)
            await assert_replays_bucket(service, server.url)
            watchdog.assert_clean()


async def test_duplicate_deliveries_and_reordered_listings_keep_the_incumbent(
    server: NatsServer,
) -> None:
    ep = endpoint()
    port = int(server.url.rsplit(":", 1)[1])
    async with admin(server.url) as nc:
        fleet = await fresh_buckets(nc)
        await fleet.register(ep, range(1, 6), OLD)
        proxy = TcpProxy(port)
        url = await proxy.start()
        try:
            async with running(url, reconcile_interval=0.5) as (service, watchdog):
                await all_ready(service)
                first = service.receiver_for(group_of(ep))
                assert first is not None
                await fleet.register(ep, range(101, 106), NEW)
                # Duplicates: the incumbent's records re-sent unchanged, several times. They
                # also move behind the competitor in stream order, so every later snapshot
                # (reconciliation and reconnect) lists the competitor first.
                for _ in range(3):
                    await fleet.register(ep, range(1, 6), OLD)
                proxy.cut()
                await until(lambda: service.counters.listings >= 4, 20, "resyncs")

                view = live_groups(service)[group_of(ep).id]
                assert view.admitted == (1, 2, 3, 4, 5)
                assert not first.retired
                # The stream lists the competitor first, yet a fresh observer (the replay)
                # takes a listing in key order and picks the same incumbent.
                replayed = await assert_replays_bucket(service, server.url)
                assert replayed[group_of(ep).id]["admitted"] == [1, 2, 3, 4, 5]
                watchdog.assert_clean()
        finally:
            await proxy.close()


async def test_a_restarted_service_observes_the_listing_in_key_order_not_the_stream_order(
    server: NatsServer,
) -> None:
    ep = endpoint()
    async with admin(server.url) as nc:
        fleet = await fresh_buckets(nc)
        await fleet.register(ep, range(1, 4), OLD)
        async with running(server.url) as (service, watchdog):
            await all_ready(service)
            await fleet.register(ep, range(11, 14), NEW)
            await assert_replays_bucket(service, server.url)
            old_receiver = service.receiver_for(group_of(ep))
            assert old_receiver is not None
            assert old_receiver.current().admitted == {1, 2, 3}
            # The incumbent's workers refresh their records: the competitor is now older in
            # the bucket than they are.
            await fleet.register(ep, range(1, 4), OLD)
            watchdog.assert_clean()
        assert old_receiver.retired

        async with running(server.url) as (restarted, watchdog):
            await all_ready(restarted)
            # The stream now lists the competitor first; the restarted frontend observes the
            # listing in key order, as a fresh replay does, and keeps the same incumbent.
            replayed = await assert_replays_bucket(restarted, server.url)
            view = live_groups(restarted)[group_of(ep).id]
            assert list(view.admitted) == replayed[group_of(ep).id]["admitted"] == [1, 2, 3]
            assert len(view.cohorts) == 2
            watchdog.assert_clean()


async def test_a_stopped_service_withdraws_its_serving_records(server: NatsServer) -> None:
    ep = endpoint()
    async with admin(server.url) as nc:
        fleet = await fresh_buckets(nc)
        await fleet.register(ep, range(1, 4), OLD)
        admission = await nc.jetstream().key_value(ADMISSION)

        async def member_records() -> list[str]:
            with contextlib.suppress(Exception):
                return [k for k in await live_keys(admission) if ".members." in k]
            return []

        async with running(server.url) as (service, _):
            await all_ready(service)
            deadline = time.monotonic() + 10
            while not await member_records():
                assert time.monotonic() < deadline, "serving records never appeared"
                await asyncio.sleep(0.05)
        assert await member_records() == []


async def test_a_service_given_a_clock_retries_a_failed_build_only_when_that_clock_jumps(
    server: NatsServer,
) -> None:
    # The host's clock, frozen until it jumps: the retry an hour away falls due only then.
    now = [time.monotonic()]
    ep = endpoint()
    builder = Builder(fail={group_of(ep): 1})
    async with admin(server.url) as nc:
        fleet = await fresh_buckets(nc)
        await fleet.register(ep, range(1, 4), OLD)
        async with running(server.url, builder, clock=lambda: now[0], retry_delays=(3600.0,)) as (
            service,
            _watchdog,
        ):
            await until(lambda: builder.failed == 1, 10, "the first build fails")
            await asyncio.sleep(0.5)
            assert len(builder.started) == 1
            assert service.binding(group_of(ep)) is None

            now[0] += 3601.0
            service.wake_timers()
            await until(lambda: service.binding(group_of(ep)) is not None, 10, "the retry")
            assert len(builder.started) == 2
