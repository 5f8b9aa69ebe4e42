"""A burst of registrations and removals while builds are in flight.

The full burst (10,000 registrations, 5,000 removals, 100 groups) is marked ``bench``; the
default run writes a fifth of it through the same code.

The same checks as every other fault (``test_faults``): the state replays the bucket, no
receiver shows a worker outside its incumbent cohort, nothing leaks. The burst is written by a
separate thread with its own event loop and connection, as workers are separate processes: the
service's loop must keep up on its own.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from natsfixture import NatsServer
from support.fleet import (
    NEW,
    OLD,
    Builder,
    admin,
    all_ready,
    assert_replays_bucket,
    bind_fleet,
    endpoint,
    fresh_buckets,
    running,
    until,
)

GROUPS = 100


async def _write_burst(url: str, burst: int) -> float:
    """Register ``burst`` workers over GROUPS endpoints, then remove every second one."""
    per_group = burst // GROUPS
    async with admin(url) as nc:
        fleet = await bind_fleet(nc)
        started = time.monotonic()
        for index in range(GROUPS):
            ids = range(1000, 1000 + per_group)
            if index % 5 == 0:
                # Every fifth group also gets a competing configuration.
                half = per_group // 2
                await fleet.register(endpoint(index), ids[:half], OLD)
                await fleet.register(endpoint(index), ids[half:], NEW)
            else:
                await fleet.register(endpoint(index), ids, OLD)
        for index in range(GROUPS):
            await fleet.remove(endpoint(index), range(1000, 1000 + per_group, 2))
        return time.monotonic() - started


@pytest.mark.parametrize(
    "burst", [2_000, pytest.param(10_000, marks=pytest.mark.bench)], ids=["2k", "10k"]
)
async def test_a_burst_of_registrations_and_removals_while_builds_are_in_flight(
    nats_server_fn: NatsServer, burst: int
) -> None:
    """Registrations over 100 groups, then half of them removed, with every build held."""
    server = nats_server_fn
    builder = Builder(hold=True)
    async with admin(server.url) as nc:
        fleet = await fresh_buckets(nc)
        await fleet.register(endpoint(0), range(1, 3), OLD)
        async with running(server.url, builder, check_every=0.05, max_concurrent_builds=8) as (
            service,
            watchdog,
        ):
            await until(lambda: len(builder.started) >= 1, 10, "the first build")
            seconds = await asyncio.to_thread(asyncio.run, _write_burst(server.url, burst))
            assert 1 <= service.status().builds_in_flight <= 8

            builder.release.set()
            await assert_replays_bucket(service, server.url, timeout=90)
            await all_ready(service, timeout=60)
            watchdog.check()
            watchdog.assert_clean()
            print(
                f"\n[faults] burst: {burst} registrations and {burst // 2} removals written in "
                f"{seconds:.1f} s; {watchdog.checks} invariant checks"
            )
