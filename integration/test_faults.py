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
import json
import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import nats
import pytest
from nats.aio.client import Client as NatsClient
from nats.js.api import KeyValueConfig
from nats.js.errors import BadRequestError
from nats.js.kv import KeyValue
from natsfixture import NatsServer
from workerset_admission.adapters.nats.connect import NatsConnectOptions
from workerset_admission.adapters.nats.source import JetStreamDiscoverySource
from workerset_admission.card import (
    encode_endpoint_record,
    encode_model_record,
    endpoint_kv_key,
    model_kv_key,
)
from workerset_admission.config import Settings
from workerset_admission.identity import EndpointId, GroupKey, WorkerType
from workerset_admission.plugin import create_service
from workerset_admission.ports import SourceSnapshot
from workerset_admission.receivers import AdmissionReceiver
from workerset_admission.replay import replay
from workerset_admission.service import AdmissionService, BuildRequest, GroupSnapshot

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

DISCOVERY = "dynamo-discovery"
ADMISSION = "frontend-model-admission"
MODEL = "Qwen/Qwen3-0.6B"


def card(block_size: int = 16, name: str = MODEL) -> dict[str, Any]:
    """A 1.6.1 card; the KV block size is part of mdcsum, so it tells configurations apart."""
    return {
        "display_name": name,
        "slug": name.lower().replace("/", "_").replace(".", "_"),
        "source_path": name,
        "model_info": None,
        "tokenizer": None,
        "context_length": 4096,
        "kv_cache_block_size": block_size,
        "migration_limit": 0,
        "model_type": "Chat | Completions",
        "model_input": "Tokens",
        "worker_type": "aggregated",
        "needs": [],
    }


OLD = card(16)
NEW = card(32)


def endpoint(index: int = 0) -> EndpointId:
    return EndpointId(f"ns-{index}", "backend", "generate")


def group_of(ep: EndpointId, name: str = MODEL) -> GroupKey:
    return GroupKey.build(name, ep, "chat|completions", WorkerType.AGGREGATED)


# -- waiting ------------------------------------------------------------------------------------


async def until(
    condition: Callable[[], bool], timeout: float = 30.0, what: str = "condition"
) -> None:
    """Poll ``condition`` every 20 ms; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not hold within {timeout:.0f} s")
        await asyncio.sleep(0.02)


# -- workers ------------------------------------------------------------------------------------


@dataclass
class Fleet:
    """Workers registering through an admin connection, as Dynamo's discovery does."""

    kv: KeyValue

    async def register(
        self, ep: EndpointId, ids: Iterable[int], card_json: dict[str, Any], window: int = 200
    ) -> None:
        writes: list[tuple[str, bytes | None]] = []
        for instance_id in ids:
            writes.append(
                (endpoint_kv_key(ep, instance_id), encode_endpoint_record(ep, instance_id))
            )
            writes.append(
                (model_kv_key(ep, instance_id), encode_model_record(ep, instance_id, card_json))
            )
        await self._windowed(writes, window)

    async def remove(self, ep: EndpointId, ids: Iterable[int], window: int = 200) -> None:
        writes: list[tuple[str, bytes | None]] = []
        for instance_id in ids:
            writes += [
                (model_kv_key(ep, instance_id), None),
                (endpoint_kv_key(ep, instance_id), None),
            ]
        await self._windowed(writes, window)

    async def _windowed(self, writes: Sequence[tuple[str, bytes | None]], window: int) -> None:
        # Coroutines are made one window at a time: a window that fails (the server died) must
        # not leave never-awaited writes behind.
        for start in range(0, len(writes), window):
            await asyncio.gather(
                *(
                    self.kv.delete(key) if value is None else self.kv.put(key, value)
                    for key, value in writes[start : start + window]
                )
            )


# The workers' own clients: their reconnect tasks are started during a fault, after the
# service, and are not the service's to clean up.
_WORKER_CLIENTS: weakref.WeakSet[NatsClient] = weakref.WeakSet()


async def _quiet(_exc: Exception) -> None:
    # The workers' connection sees every fault too; its errors are expected, not news.
    return None


@contextlib.asynccontextmanager
async def admin(url: str) -> AsyncIterator[NatsClient]:
    nc = await nats.connect(
        url,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.1,
        error_cb=_quiet,
    )
    _WORKER_CLIENTS.add(nc)
    try:
        yield nc
    finally:
        await nc.close()


async def fresh_buckets(nc: NatsClient) -> Fleet:
    js = nc.jetstream()
    for bucket in (DISCOVERY, ADMISSION):
        with contextlib.suppress(Exception):
            await js.delete_key_value(bucket)
    kv = await js.create_key_value(KeyValueConfig(bucket=DISCOVERY, history=1))
    await js.create_key_value(KeyValueConfig(bucket=ADMISSION, history=1, ttl=60))
    return Fleet(kv)


async def rebuilt_buckets(nc: NatsClient) -> Fleet:
    """After a wiped store: create the bucket, or bind it when the service re-created it first."""
    js = nc.jetstream()
    try:
        kv = await js.create_key_value(KeyValueConfig(bucket=DISCOVERY, history=1))
    except BadRequestError:
        kv = await js.key_value(DISCOVERY)
    return Fleet(kv)


async def bind_fleet(nc: NatsClient, timeout: float = 20.0) -> Fleet:
    """Bind the discovery bucket again after a restart (JetStream may need a moment)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            return Fleet(await nc.jetstream(timeout=2).key_value(DISCOVERY))
        await asyncio.sleep(0.1)
    raise AssertionError("the discovery bucket could not be bound after the restart")


# -- builders -----------------------------------------------------------------------------------


@dataclass
class Builder:
    """A pipeline builder whose behaviour each test chooses per group.

    ``hold`` makes builds wait for ``release``; ``fail`` makes the next N attempts of a group
    raise; ``hang`` makes a group's builds wait forever; ``late`` makes a group's builds ignore
    cancellation and return anyway, after the tenure they were started for has ended.
    """

    hold: bool = False
    release: asyncio.Event = field(default_factory=asyncio.Event)
    fail: dict[GroupKey, int] = field(default_factory=dict)
    hang: set[GroupKey] = field(default_factory=set)
    late: set[GroupKey] = field(default_factory=set)
    late_returned: asyncio.Event = field(default_factory=asyncio.Event)
    started: list[BuildRequest] = field(default_factory=list)
    cancelled: int = 0
    failed: int = 0

    async def build(self, request: BuildRequest) -> object:
        self.started.append(request)
        group = request.group
        if group in self.late:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                # Deliberately swallow the cancellation: a builder that finishes its work
                # anyway and returns after its group was succeeded.
                await asyncio.sleep(0.05)
                self.late_returned.set()
                return ("late pipeline", request.generation)
        try:
            if group in self.hang:
                await asyncio.Event().wait()
            if self.hold:
                await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        if self.fail.get(group, 0) > 0:
            self.fail[group] -= 1
            self.failed += 1
            raise RuntimeError("model metadata could not be fetched")
        return ("pipeline", request.generation)


# -- the invariant checker --------------------------------------------------------------------


@dataclass
class Watchdog:
    """Checks, after every state change of a service, what every receiver shows.

    A receiver may show only members of its own tenure's cohort, and only while that cohort is
    its group's incumbent; a retired receiver shows nothing new. The checker holds every
    receiver it has ever seen (old tenures included), like hops that keep a stale client.
    """

    service: AdmissionService
    min_interval: float = 0.0
    held: dict[int, AdmissionReceiver] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    checks: int = 0
    _last: float = float("-inf")

    def __post_init__(self) -> None:
        self.service.on_state_change(self._on_change)

    def _on_change(self) -> None:
        # A full check walks every group; under a burst of thousands of changes it runs at
        # most every ``min_interval`` seconds instead (0: after every change).
        now = time.monotonic()
        if now - self._last >= self.min_interval:
            self._last = now
            self.check()

    def check(self) -> None:
        self.checks += 1
        core = self.service.core
        for view in core.groups():
            if view.receiver is not None and view.receiver not in self.held:
                receiver = self.service.receiver_for(view.key)
                if receiver is not None:
                    self.held[receiver.receiver_id] = receiver
        for receiver in self.held.values():
            if receiver.retired:
                continue
            state = receiver.current()
            view = core.group(state.group)
            if view is None or view.receiver != state.receiver:
                self.violations.append(
                    f"receiver {state.receiver} of {state.group.id} is live after its tenure"
                )
                continue
            if view.incumbent != state.mdc_checksum:
                self.violations.append(
                    f"receiver {state.receiver} carries {state.mdc_checksum[:8]} but the "
                    f"incumbent is {str(view.incumbent)[:8]}"
                )
            cohort = view.cohorts[0].instance_ids if view.cohorts else ()
            outside = set(state.admitted) - set(cohort)
            if outside:
                self.violations.append(
                    f"receiver {state.receiver} shows {sorted(outside)} outside its cohort"
                )
            # Only the incumbent's checksum may be admitted in a group: ids of other cohorts
            # must never be visible through any receiver of the group.
            others = {i for c in view.cohorts[1:] for i in c.instance_ids} - set(cohort)
            if set(state.admitted) & others:
                self.violations.append(f"receiver {state.receiver} shows a rejected worker")

    def assert_clean(self) -> None:
        assert self.checks > 0, "the checker never ran"
        assert self.violations == []


# -- replay of the bucket -----------------------------------------------------------------------


async def bucket_listing(url: str) -> SourceSnapshot:
    """Everything the discovery bucket holds now, in stream order, as a fresh watcher sees it."""
    source = JetStreamDiscoverySource(NatsConnectOptions(servers=(url,)), bucket=DISCOVERY)
    try:
        return await source.list_all()
    finally:
        await source.close()


def replay_of(listing: SourceSnapshot) -> dict[str, dict[str, Any]]:
    trace = {
        "kind": "snapshot",
        "entries": [{"key": e.key, "value": e.value.decode()} for e in listing.entries],
    }
    result = replay([json.dumps(trace)]).to_json()
    return {g["group"]: g for g in result["groups"]}


def live_groups(service: AdmissionService) -> dict[str, GroupSnapshot]:
    return {g.group.id: g for g in service.snapshot().groups}


def differences(
    service: AdmissionService, replayed: dict[str, dict[str, Any]], *, same_order: bool
) -> list[str]:
    """How the live state differs from the replay (an empty list when it matches).

    Groups, cohort checksums and members must match. With ``same_order`` the incumbent and
    the cohort order must match too; without it (a service that saw the bucket in another
    order than a fresh replay does) the incumbent must be one of the replay's cohorts and
    admit exactly its members.
    """
    found: list[str] = []
    live = {k: g for k, g in live_groups(service).items() if g.cohorts}
    wanted = {k: g for k, g in replayed.items() if g["cohorts"]}
    if set(live) != set(wanted):
        return [f"groups differ: live {sorted(live)} vs replay {sorted(wanted)}"]
    for key, group in live.items():
        mine = [(c.mdc_checksum, sorted(c.members)) for c in group.cohorts]
        theirs = [(c["checksum"], c["members"]) for c in wanted[key]["cohorts"]]
        if sorted(mine) != sorted(theirs):
            found.append(f"{key}: cohorts {mine} vs replay {theirs}")
            continue
        if same_order and mine != theirs:
            found.append(f"{key}: cohort order {mine} vs replay {theirs}")
        if group.incumbent != mine[0][0] or sorted(group.admitted) != mine[0][1]:
            found.append(f"{key}: admitted {group.admitted} is not the incumbent cohort")
    return found


async def assert_replays_bucket(
    service: AdmissionService, url: str, *, same_order: bool = True, timeout: float = 30.0
) -> dict[str, dict[str, Any]]:
    """Wait until the live state matches a replay of the bucket; fail with the difference."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            listing = await asyncio.wait_for(
                bucket_listing(url), max(1.0, deadline - time.monotonic())
            )
        except (asyncio.TimeoutError, nats.errors.Error) as exc:
            # Listing a large bucket on a loaded machine can stall; try again until the deadline.
            diff = [f"the bucket could not be listed: {exc!r}"]
        else:
            replayed = replay_of(listing)
            diff = differences(service, replayed, same_order=same_order)
            if not diff:
                return replayed
        if time.monotonic() > deadline:
            raise AssertionError("live state never matched the bucket replay: " + "; ".join(diff))
        await asyncio.sleep(0.1)


async def all_ready(service: AdmissionService, timeout: float = 30.0) -> None:
    def ready() -> bool:
        groups = service.snapshot().groups
        return bool(groups) and all(g.status == "ready" for g in groups if g.cohorts)

    await until(ready, timeout, "every group ready")


# -- running the service ------------------------------------------------------------------------


def settings_for(url: str, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "nats_servers": (url,),
        "discovery_bucket": DISCOVERY,
        "admission_bucket": ADMISSION,
        "retry_delays": (0.05, 0.1, 0.2, 0.4),
        "reconcile_interval": 2.0,
        "frontend_id": "frontend-under-test",
        "tracing": False,
        "metrics": False,
    }
    values.update(overrides)
    return Settings(**values)


def _worker_task(task: asyncio.Task[Any]) -> bool:
    frame = getattr(task.get_coro(), "cr_frame", None)
    owner = frame.f_locals.get("self") if frame is not None else None
    if owner is None:
        return False
    conn = owner if isinstance(owner, NatsClient) else getattr(owner, "_conn", None)
    if owner in _WORKER_CLIENTS or conn in _WORKER_CLIENTS:
        return True
    # A task of a connection the service has closed is nats-py's own: the heartbeat helpers
    # of a push consumer notice the close only when they next wake (up to 10 s later), and a
    # response subscription opened while reconnecting can outlive the close. An unclosed
    # connection of the service is still reported.
    return isinstance(conn, NatsClient) and conn.is_closed


def _describe(task: asyncio.Task[Any]) -> str:
    frame = getattr(task.get_coro(), "cr_frame", None)
    owner = frame.f_locals.get("self") if frame is not None else None
    subject = getattr(owner, "subject", None) or getattr(owner, "_subject", None)
    conn = getattr(owner, "_conn", None)
    client = None if conn is None else (conn.options.get("name"), conn.is_closed)
    return f"{task.get_name()}: {task.get_coro()!r} subject={subject!r} client={client}"


def other_tasks() -> set[asyncio.Task[Any]]:
    current = asyncio.current_task()
    return {
        t for t in asyncio.all_tasks() if t is not current and not t.done() and not _worker_task(t)
    }


@contextlib.asynccontextmanager
async def running(
    url: str, builder: Builder | None = None, *, check_every: float = 0.0, **overrides: Any
) -> AsyncIterator[tuple[AdmissionService, Watchdog]]:
    """A started service with a watchdog; on exit, stop it and check nothing leaked."""
    before = other_tasks()
    service = await create_service(settings_for(url, **overrides), builder=builder or Builder())
    watchdog = Watchdog(service, min_interval=check_every)
    try:
        await service.wait_synced(30)
        yield service, watchdog
    finally:
        await service.stop()
    watchdog.check()
    watchdog.assert_clean()
    assert all(r.retired for r in watchdog.held.values()), "a receiver outlived the service"
    try:
        await until(lambda: not (other_tasks() - before), 10, "service tasks to finish")
    except AssertionError:
        leaked = [_describe(t) for t in other_tasks() - before]
        raise AssertionError(f"tasks leaked past the service's stop: {leaked}") from None


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


class TcpProxy:
    """A loopback TCP relay in front of the server whose connections a test can cut.

    ``cut_after`` cuts every connection once that many bytes have gone from the server to
    clients, which lands the cut inside a large initial snapshot.
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.downstream = 0
        self.cut_after: int | None = None
        self.cuts = 0
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"nats://127.0.0.1:{port}"

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}
        pumps = [
            asyncio.create_task(self._pump(reader, up_writer, downstream=False)),
            asyncio.create_task(self._pump(up_reader, writer, downstream=True)),
        ]
        self._tasks.update(pumps)
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        for task in pumps:
            task.cancel()
        for w in (writer, up_writer):
            w.transport.abort()
            self._writers.discard(w)
        self._tasks.difference_update(pumps)

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, downstream: bool
    ) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while chunk := await reader.read(65536):
                writer.write(chunk)
                await writer.drain()
                if downstream:
                    self.downstream += len(chunk)
                    if self.cut_after is not None and self.downstream >= self.cut_after:
                        self.cut_after = None
                        self.cut()

    def cut(self) -> None:
        """Drop every relayed connection at once, as a failing network would."""
        self.cuts += 1
        for writer in list(self._writers):
            writer.transport.abort()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self.cut()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)
        if self._server is not None:
            await self._server.wait_closed()


async def test_a_connection_cut_while_a_snapshot_is_applied_converges_after_reconnect(
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


async def test_duplicate_deliveries_and_reordered_snapshots_keep_the_incumbent(
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
                await until(lambda: service.counters.snapshots >= 4, 20, "resyncs")

                view = live_groups(service)[group_of(ep).id]
                assert view.admitted == (1, 2, 3, 4, 5)
                assert not first.retired
                # The replay (a fresh observer) sees the competitor first and picks it: both
                # are right for what each observed, and the cohorts agree.
                replayed = await assert_replays_bucket(service, server.url, same_order=False)
                assert replayed[group_of(ep).id]["admitted"] == [101, 102, 103, 104, 105]
                watchdog.assert_clean()
        finally:
            await proxy.close()


async def test_a_restarted_service_may_choose_differently_but_never_admits_two_checksums(
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
            # The restarted frontend observes the bucket in stream order and follows the
            # incumbent rule on that: the competitor, listed first, is its incumbent now.
            replayed = await assert_replays_bucket(restarted, server.url)
            view = live_groups(restarted)[group_of(ep).id]
            assert list(view.admitted) == replayed[group_of(ep).id]["admitted"] == [11, 12, 13]
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
                return [k for k in await admission.keys() if ".members." in k]
            return []

        async with running(server.url) as (service, _):
            await all_ready(service)
            deadline = time.monotonic() + 10
            while not await member_records():
                assert time.monotonic() < deadline, "serving records never appeared"
                await asyncio.sleep(0.05)
        assert await member_records() == []
