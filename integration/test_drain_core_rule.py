"""The drain's last-worker refusal asks the admission core, and its budgets the server's clock.

On a real nats-server, with a real ``serve`` where a live frontend is part of the story: a
same-configuration card with no endpoint record, a successor whose card the discovery boundary
refuses, and the last workers of a LoRA adapter (one drain, and two at once) are each refused
with status 6; a model named in 460 CJK characters drains like any other; a drain host whose
clock runs two minutes behind cannot let a second drain of the model's last worker through,
and a budget entry stamped a year ahead counts for the budget window, by the server's clock.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.js.api import DiscardPolicy, StreamConfig
from natsfixture import NatsServer
from support.buckets import live_keys
from support.cards import base_card, lora_card
from workerset_admission import cli
from workerset_admission.adapters.nats.connect import NatsConnectOptions
from workerset_admission.adapters.nats.drain_store import NatsDrainStore
from workerset_admission.adapters.nats.registrar import WorkerRegistrar
from workerset_admission.card.drain_record import budget_kv_key
from workerset_admission.cli.drain import run_drain
from workerset_admission.errors import LastWorkerRefused
from workerset_admission.identity import EndpointId

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

CLI = [sys.executable, "-m", "workerset_admission.cli"]
EP = EndpointId("dgd", "backend", "generate")
MODEL = base_card(16)["display_name"]


@pytest.fixture
def buckets(nats_server: NatsServer) -> list[str]:
    suffix = uuid.uuid4().hex[:8]
    return [
        "--nats-server", nats_server.url,
        "--discovery-bucket", f"disc-{suffix}",
        "--admission-bucket", f"adm-{suffix}",
    ]  # fmt: skip


@pytest.fixture
def serve(buckets: list[str], tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    subject = f"status-{uuid.uuid4().hex[:8]}"
    with (tmp_path / "serve.log").open("w") as log:
        process = subprocess.Popen(
            [*CLI, "serve", *buckets, "--frontend-id", "fe-1", "--status-subject", subject],
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    try:
        yield process
    finally:
        process.terminate()
        process.wait(timeout=20)


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=90, check=False)


async def register(
    url: str,
    bucket: str,
    instances: list[int],
    card: dict[str, Any],
    *,
    endpoint: EndpointId = EP,
    with_endpoint: bool = True,
    adapter: str | None = None,
) -> None:
    nc = await nats.connect(url)
    try:
        registrar = WorkerRegistrar(nc.jetstream(), bucket=bucket, ttl=None)
        for instance in instances:
            await registrar.register(endpoint, instance, card)
            if adapter is not None:
                await registrar.register(endpoint, instance, lora_card(adapter), suffix=adapter)
            if with_endpoint:
                await registrar.register_endpoint(
                    endpoint, instance, transport={"tcp": f"10.1.0.{instance & 0xFF}:4000/x"}
                )
    finally:
        await nc.close()


async def members_until(url: str, admission: str, namespace: str, count: int) -> list[str]:
    """Wait until the frontend's serving record for ``namespace`` lists ``count`` members."""
    deadline = time.monotonic() + 30
    nc = await nats.connect(url)
    try:
        while True:
            members: list[str] = []
            try:
                kv = await nc.jetstream().key_value(admission)
                for key in await live_keys(kv):
                    if key.endswith(f".members.{namespace}"):
                        entry = await kv.get(key)
                        members.extend(json.loads(entry.value or b"{}").get("members", []))
            except Exception:  # not published yet
                members = []
            if len(members) == count:
                return members
            assert time.monotonic() < deadline, (namespace, members)
            await asyncio.sleep(0.1)
    finally:
        await nc.close()


async def drain_keys(url: str, bucket: str) -> list[str]:
    nc = await nats.connect(url)
    try:
        kv = await nc.jetstream().key_value(bucket)
        return sorted(k for k in await live_keys(kv) if k.startswith("v1.drain."))
    finally:
        await nc.close()


def refused(buckets: list[str], instance: int) -> str:
    answer = run("drain", f"{instance:#x}", "--timeout", "30", *buckets)
    assert answer.returncode == cli.EXIT_LAST_WORKER, answer.stderr
    assert len(answer.stderr.strip().splitlines()) == 1
    return answer.stderr


def args_for(buckets: list[str], instance: int, namespace: str = "dgd") -> argparse.Namespace:
    parsed = cli.build_parser().parse_args(
        ["drain", f"{instance:#x}", "--namespace", namespace, "--timeout", "60", *buckets]
    )
    assert isinstance(parsed, argparse.Namespace)
    return parsed


def store_for(url: str, buckets: list[str]) -> NatsDrainStore:
    return NatsDrainStore(NatsConnectOptions(servers=(url,)), buckets[3], buckets[5])


async def drain_status(store: NatsDrainStore, args: argparse.Namespace, **kwargs: Any) -> int:
    try:
        return await run_drain(args, store, io.StringIO(), io.StringIO(), environ={}, **kwargs)
    except LastWorkerRefused:
        return cli.EXIT_LAST_WORKER


# -- one rule for routable: the core's ---------------------------------------------------------


def test_a_same_configuration_card_with_no_endpoint_record_is_no_successor_on_a_live_frontend(
    nats_server: NatsServer, buckets: list[str], serve: subprocess.Popen[bytes]
) -> None:
    url, discovery, admission = nats_server.url, buckets[3], buckets[5]
    asyncio.run(register(url, discovery, [0xA1], base_card(16)))
    # The incumbent's own configuration, registered without an endpoint record: the frontend's
    # core admits it (its serving record lists it) but can route nothing to it.
    asyncio.run(register(url, discovery, [0xA2], base_card(16), with_endpoint=False))
    asyncio.run(members_until(url, admission, "dgd", 2))
    said = refused(buckets, 0xA1)
    assert f"model {MODEL} would be left with no routable worker on frontend fe-1" in said
    assert asyncio.run(drain_keys(url, discovery)) == []
    assert serve.poll() is None


def test_a_successor_whose_card_the_boundary_refuses_is_no_successor(
    nats_server: NatsServer, buckets: list[str], serve: subprocess.Popen[bytes]
) -> None:
    url, discovery, admission = nats_server.url, buckets[3], buckets[5]
    asyncio.run(register(url, discovery, [0xA1], base_card(16)))
    asyncio.run(members_until(url, admission, "dgd", 1))
    # Another configuration with a live endpoint, whose card the boundary refuses.
    asyncio.run(register(url, discovery, [0xB1], base_card(32, kv_cache_block_size=-1)))
    said = refused(buckets, 0xA1)
    assert "on frontend fe-1" in said
    assert asyncio.run(drain_keys(url, discovery)) == []
    # With no frontend live, the same core run over the bucket refuses it too.
    serve.terminate()
    serve.wait(timeout=20)
    deadline = time.monotonic() + 30
    while True:
        said = refused(buckets, 0xA1)
        if "in the discovery bucket" in said:
            break
        assert time.monotonic() < deadline, said  # the frontend's records are withdrawn
        time.sleep(0.5)


def test_the_last_worker_of_a_lora_adapter_is_refused(
    nats_server: NatsServer, buckets: list[str], serve: subprocess.Popen[bytes]
) -> None:
    url, discovery, admission = nats_server.url, buckets[3], buckets[5]
    # A1 serves the base model and the adapter; B1 the base model alone.
    asyncio.run(register(url, discovery, [0xA1], base_card(16), adapter="ad"))
    asyncio.run(register(url, discovery, [0xB1], base_card(16)))
    asyncio.run(members_until(url, admission, "dgd", 2))
    said = refused(buckets, 0xA1)
    assert "model ad would be left with no routable worker on frontend fe-1" in said
    # B1 carries no adapter: its drain leaves the base model on A1, and goes through.
    drained = run("drain", f"{0xB1:#x}", "--timeout", "30", *buckets)
    assert drained.returncode == 0, drained.stderr
    assert asyncio.run(drain_keys(url, discovery)) == ["v1.drain.dgd.b1"]


def test_two_drains_at_once_of_a_lora_adapters_last_two_workers_leave_it_one(
    nats_server: NatsServer, buckets: list[str], serve: subprocess.Popen[bytes]
) -> None:
    url, discovery, admission = nats_server.url, buckets[3], buckets[5]

    async def trial(number: int) -> list[int]:
        namespace = f"t{number}"
        endpoint = EndpointId(namespace, "backend", "generate")
        # A model and an adapter of each trial's own: no other trial's workers serve them.
        card = base_card(16, display_name=f"model-{number}", slug=f"model-{number}")
        adapter = f"ad-{number}"
        await register(url, discovery, [0xA1, 0xA2], card, endpoint=endpoint, adapter=adapter)
        await register(url, discovery, [0xB1], card, endpoint=endpoint)
        await members_until(url, admission, namespace, 3)
        return sorted(
            await asyncio.gather(
                *(
                    drain_status(store_for(url, buckets), args_for(buckets, i, namespace))
                    for i in (0xA1, 0xA2)
                )
            )
        )

    for number in range(3):
        # Exactly one goes on; the other counts it drained and is refused for the adapter.
        assert asyncio.run(trial(number)) == [0, cli.EXIT_LAST_WORKER], number


def test_a_model_named_in_460_cjk_characters_is_drained(
    nats_server: NatsServer, buckets: list[str]
) -> None:
    url, discovery = nats_server.url, buckets[3]
    name = "模" * 460  # 1,380 bytes: escaped as a key token, over NATS's 4,096-byte control line
    card = base_card(16, display_name=name, slug="wide")
    asyncio.run(register(url, discovery, [0xA1, 0xA2], card))
    drained = run("drain", f"{0xA1:#x}", "--timeout", "30", *buckets)
    assert drained.returncode == 0, drained.stderr
    said = refused(buckets, 0xA2)
    assert f"model {name} would be left" in said
    assert asyncio.run(drain_keys(url, discovery)) == ["v1.drain.dgd.a1"]


# -- budgets on the server's clock -------------------------------------------------------------


class HeldStore(NatsDrainStore):
    """A real store whose drain record writes wait for ``go``: stopped between swap and write."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.go = asyncio.Event()
        self.swapped = asyncio.Event()

    async def swap_budget(
        self, key: str, value: bytes, revision: int | None, *rest: float | None
    ) -> bool:
        done = await super().swap_budget(key, value, revision, *rest)
        self.swapped.set()
        return done

    async def put(self, key: str, value: bytes, ttl: float | None) -> None:
        await self.go.wait()
        await super().put(key, value, ttl)


async def budget_message(url: str, bucket: str, model: str) -> tuple[dict[str, Any], str | None]:
    nc = await nats.connect(url)
    try:
        msg = await nc.jetstream().get_last_msg(
            f"KV_{bucket}", f"$KV.{bucket}.{budget_kv_key(model)}"
        )
        return json.loads(msg.data or b"{}"), (msg.headers or {}).get("Nats-TTL")
    finally:
        await nc.close()


def test_a_drain_host_two_minutes_behind_cannot_let_a_second_drain_through(
    nats_server: NatsServer, buckets: list[str]
) -> None:
    url, discovery = nats_server.url, buckets[3]
    asyncio.run(register(url, discovery, [0xA1, 0xA2], base_card(16)))

    async def race() -> tuple[int, int]:
        slow = HeldStore(NatsConnectOptions(servers=(url,)), discovery, buckets[5])
        # The first drain's host runs two minutes behind; it stops between swap and write.
        first = asyncio.ensure_future(
            drain_status(slow, args_for(buckets, 0xA1), wall=lambda: time.time() - 120.0)
        )
        await asyncio.wait_for(slow.swapped.wait(), 30)
        second = await drain_status(store_for(url, buckets), args_for(buckets, 0xA2))
        slow.go.set()
        return await first, second

    assert asyncio.run(race()) == (0, cli.EXIT_LAST_WORKER)
    assert asyncio.run(drain_keys(url, discovery)) == ["v1.drain.dgd.a1"]
    # The budget keeps no host's time, and the server removes it after the window.
    value, ttl = asyncio.run(budget_message(url, discovery, MODEL))
    assert (value["model"], value["pending"], ttl) == (MODEL, [], "60")


async def forge_a1_pending_a_year_ahead(url: str, discovery: str) -> None:
    """Leave A1 pending in MODEL's budget, stamped a year ahead.

    What another namespace's drain user could write, or a host a year ahead whose drain died
    between its swap and its write.
    """
    ahead = time.time() + 365 * 86400
    nc = await nats.connect(url)
    try:
        kv = await nc.jetstream().key_value(discovery)
        pending = {"namespace": "dgd", "instance_id": 0xA1, "at": ahead, "since": ahead}
        value = {"type": "DrainBudget", "model": MODEL, "pending": [pending]}
        await kv.put(budget_kv_key(MODEL), json.dumps(value).encode())
    finally:
        await nc.close()


def test_a_budget_entry_stamped_a_year_ahead_counts_for_the_window_only(
    nats_server: NatsServer, buckets: list[str]
) -> None:
    url, discovery = nats_server.url, buckets[3]
    asyncio.run(register(url, discovery, [0xA1, 0xA2], base_card(16)))
    asyncio.run(forge_a1_pending_a_year_ahead(url, discovery))
    window = 2.0
    started = time.monotonic()
    # Within the window (by the server's clock, from the forged record's write) it counts ...
    first = asyncio.run(
        drain_status(store_for(url, buckets), args_for(buckets, 0xA2), window=window)
    )
    assert first == cli.EXIT_LAST_WORKER
    assert time.monotonic() - started < window
    # ... and once the window has passed since that write, never again.
    time.sleep(window + 0.5)
    later = asyncio.run(
        drain_status(store_for(url, buckets), args_for(buckets, 0xA2), window=window)
    )
    assert later == 0
    assert asyncio.run(drain_keys(url, discovery)) == ["v1.drain.dgd.a2"]


@pytest.mark.rollout  # the default window, a minute, by the server's clock: the slower tier
def test_a_budget_entry_stamped_a_year_ahead_lets_drains_through_after_a_minute(
    nats_server: NatsServer, buckets: list[str]
) -> None:
    url, discovery = nats_server.url, buckets[3]
    asyncio.run(register(url, discovery, [0xA1, 0xA2], base_card(16)))
    asyncio.run(forge_a1_pending_a_year_ahead(url, discovery))
    refused(buckets, 0xA2)
    time.sleep(61.0)
    drained = run("drain", f"{0xA2:#x}", "--timeout", "30", *buckets)
    assert drained.returncode == 0, drained.stderr
    assert asyncio.run(drain_keys(url, discovery)) == ["v1.drain.dgd.a2"]


def test_a_bucket_without_per_key_ttls_still_drains_and_its_budgets_lapse_by_the_server(
    nats_server: NatsServer, buckets: list[str]
) -> None:
    url, discovery = nats_server.url, buckets[3]

    async def bucket_without_ttls() -> None:
        # A discovery bucket made by another tool, whose stream keeps no per-key TTL.
        nc = await nats.connect(url)
        try:
            await nc.jetstream().add_stream(
                StreamConfig(
                    name=f"KV_{discovery}",
                    subjects=[f"$KV.{discovery}.>"],
                    max_msgs_per_subject=1,
                    allow_rollup_hdrs=True,
                    deny_delete=True,
                    discard=DiscardPolicy.NEW,
                    allow_direct=True,
                    allow_msg_ttl=False,
                )
            )
        finally:
            await nc.close()

    asyncio.run(bucket_without_ttls())
    asyncio.run(register(url, discovery, [0xA1, 0xA2, 0xA3], base_card(16)))
    drained = run("drain", f"{0xA1:#x}", "--timeout", "30", *buckets)
    assert drained.returncode == 0, drained.stderr
    assert "keeps no per-key TTL" in drained.stderr
    value, ttl = asyncio.run(budget_message(url, discovery, MODEL))
    assert (value["pending"], ttl) == ([], None)
    # A drain that died between its swap and its write still lapses, by the server's clock.
    asyncio.run(_forge_pending(url, discovery, 0xA2))
    assert (
        asyncio.run(drain_status(store_for(url, buckets), args_for(buckets, 0xA3), window=1.0))
        == cli.EXIT_LAST_WORKER
    )
    time.sleep(1.5)
    assert (
        asyncio.run(drain_status(store_for(url, buckets), args_for(buckets, 0xA3), window=1.0)) == 0
    )


async def _forge_pending(url: str, bucket: str, instance: int) -> None:
    nc = await nats.connect(url)
    try:
        kv = await nc.jetstream().key_value(bucket)
        value = {"type": "DrainBudget", "model": MODEL, "pending": [
            {"namespace": "dgd", "instance_id": instance}
        ]}  # fmt: skip
        await kv.put(budget_kv_key(MODEL), json.dumps(value).encode())
    finally:
        await nc.close()
