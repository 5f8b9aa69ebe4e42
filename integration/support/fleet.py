"""A live fleet for fault and burst tests: buckets, a service with a watchdog, replay checks.

Shared by the fault, bad-input, burst and security tests and the soak benchmark. Everything
here talks to a real nats-server the test started on loopback.
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
from nats.aio.client import Client as NatsClient
from nats.js.api import KeyValueConfig
from nats.js.errors import BadRequestError
from nats.js.kv import KeyValue
from workerset_admission.adapters.nats.connect import NatsConnectOptions
from workerset_admission.adapters.nats.source import JetStreamDiscoverySource
from workerset_admission.card import (
    encode_endpoint_record,
    encode_model_record,
    endpoint_kv_key,
    model_kv_key,
)
from workerset_admission.identity import EndpointId, GroupKey, WorkerType
from workerset_admission.ports import SourceListing
from workerset_admission.service.admission_service import (
    AdmissionService,
    BuildRequest,
    GroupStatusReport,
)
from workerset_admission.service.receivers import AdmissionReceiver
from workerset_admission.service.step import StepRecord
from workerset_admission.settings import Settings
from workerset_admission.traces.replay import replay
from workerset_admission.wiring.compose import create_service

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

    A receiver may show only members of its own tenure's cohort (and, during a hold, the members
    served on their last known records), and only while that cohort is its group's incumbent;
    a retired receiver shows nothing new. The checker holds every
    receiver it has ever seen (old tenures included), like hops that keep a stale client.
    """

    service: AdmissionService
    min_interval: float = 0.0
    held: dict[int, AdmissionReceiver] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    checks: int = 0
    _last: float = float("-inf")

    def __post_init__(self) -> None:
        self.service.subscribe(self)

    def heard(self, record: StepRecord) -> None:
        if record.changed:
            self._on_change()

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
            # A held tenure also serves the members it had, on their last known records.
            outside = set(state.admitted) - set(cohort) - set(view.last_known)
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


async def bucket_listing(url: str) -> SourceListing:
    """Everything the discovery bucket holds now, in stream order, as a fresh watcher sees it."""
    source = JetStreamDiscoverySource(NatsConnectOptions(servers=(url,)), bucket=DISCOVERY)
    try:
        return await source.list_all()
    finally:
        await source.close()


def replay_of(listing: SourceListing) -> dict[str, dict[str, Any]]:
    trace = {
        "kind": "snapshot",
        "entries": [{"key": e.key, "value": e.value.decode()} for e in listing.entries],
    }
    result = replay([json.dumps(trace)]).to_json()
    return {g["group_id"]: g for g in result["groups"]}


def live_groups(service: AdmissionService) -> dict[str, GroupStatusReport]:
    return {g.group.id: g for g in service.status().groups}


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
        groups = service.status().groups
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
        # The records here carry no TTL, so a resync that misses the incumbent after a wipe
        # means it is gone: hold its tenure only briefly.
        "tenure_hold": 1.0,
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
    url: str,
    builder: Builder | None = None,
    *,
    check_every: float = 0.0,
    clock: Callable[[], float] | None = None,
    **overrides: Any,
) -> AsyncIterator[tuple[AdmissionService, Watchdog]]:
    """A started service with a watchdog; on exit, stop it and check nothing leaked."""
    before = other_tasks()
    service = await create_service(
        settings_for(url, **overrides), builder=builder or Builder(), clock=clock
    )
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
