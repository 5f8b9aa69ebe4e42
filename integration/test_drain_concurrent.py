"""Drains that race each other, and the last-worker check's loopholes, on a real nats-server.

Ten drains of a model's last ten workers at once, twenty times: each drain is the real command
(``run_drain`` over its own ``NatsDrainStore`` connection), all ten started together and
interleaving at every NATS round trip, with a real ``serve`` live. Exactly one of the ten is
refused in every trial, and the frontend keeps serving the model. Then each of the four ways a
drain used to take a model's last routable worker unsaid is refused with status 6, through the
command line.
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
from nats.js.errors import KeyNotFoundError
from natsfixture import NatsServer
from support.buckets import live_keys
from support.cards import base_card
from workerset_admission import cli
from workerset_admission.adapters.nats.connect import NatsConnectOptions
from workerset_admission.adapters.nats.drain_store import NatsDrainStore
from workerset_admission.adapters.nats.registrar import WorkerRegistrar
from workerset_admission.cli.drain import run_drain
from workerset_admission.errors import LastWorkerRefused
from workerset_admission.identity import EndpointId

# The rollout tier (docs/testing.md): long faults and concurrency trials, its own CI step.
pytestmark = [pytest.mark.integration, pytest.mark.rollout, pytest.mark.timeout(400)]

CLI = [sys.executable, "-m", "workerset_admission.cli"]
TRIALS = 20
RACERS = 10


@pytest.fixture
def buckets(nats_server: NatsServer) -> list[str]:
    suffix = uuid.uuid4().hex[:8]
    return [
        "--nats-server", nats_server.url,
        "--discovery-bucket", f"disc-{suffix}",
        "--admission-bucket", f"adm-{suffix}",
    ]  # fmt: skip


def start_serve(buckets: list[str], log: Path, *extra: str) -> subprocess.Popen[bytes]:
    subject = f"status-{uuid.uuid4().hex[:8]}"
    with log.open("w") as out:
        return subprocess.Popen(
            [*CLI, "serve", *buckets, "--status-subject", subject, *extra],
            stdout=subprocess.DEVNULL,
            stderr=out,
        )


@pytest.fixture
def serve(buckets: list[str], tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    process = start_serve(buckets, tmp_path / "serve.log", "--frontend-id", "fe-1")
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
    endpoint: EndpointId,
    instances: list[int],
    card: dict[str, Any],
    *,
    with_endpoint: bool = True,
) -> None:
    nc = await nats.connect(url)
    try:
        registrar = WorkerRegistrar(nc.jetstream(), bucket=bucket, ttl=None)
        for instance in instances:
            await registrar.register(endpoint, instance, card)
            if with_endpoint:
                await registrar.register_endpoint(
                    endpoint, instance, transport={"tcp": f"10.1.0.{instance & 0xFF}:4000/x"}
                )
    finally:
        await nc.close()


async def served_members(url: str, admission: str, namespace: str) -> list[str]:
    """The members the frontends' serving records list for ``namespace`` now."""
    nc = await nats.connect(url)
    try:
        try:
            kv = await nc.jetstream().key_value(admission)
            keys = await live_keys(kv)
        except Exception:
            return []
        members: list[str] = []
        for key in keys:
            if key.endswith(f".members.{namespace}"):
                entry = await kv.get(key)
                members.extend(json.loads(entry.value or b"{}").get("members", []))
        return members
    finally:
        await nc.close()


async def drain_keys(url: str, bucket: str, namespace: str) -> list[str]:
    """The drain records of ``namespace`` in force: the stream's subjects, then each key's value."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        prefix = f"$KV.{bucket}."
        info = await js.stream_info(
            f"KV_{bucket}", subjects_filter=f"{prefix}v1.drain.{namespace}.>"
        )
        kv = await js.key_value(bucket)
        found = []
        for subject in info.state.subjects or {}:
            key = subject[len(prefix) :]
            try:
                await kv.get(key)
            except KeyNotFoundError:
                continue  # withdrawn
            found.append(key)
        return sorted(found)
    finally:
        await nc.close()


async def members_until(
    url: str, admission: str, namespace: str, count: int, timeout: float = 30
) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        members = await served_members(url, admission, namespace)
        if len(members) == count:
            return members
        assert time.monotonic() < deadline, (namespace, members)
        await asyncio.sleep(0.1)


async def one_drain(url: str, buckets: list[str], instance: int, namespace: str) -> int:
    args = cli.build_parser().parse_args(
        ["drain", f"{instance:#x}", "--namespace", namespace, "--timeout", "60", *buckets]
    )
    assert isinstance(args, argparse.Namespace)
    store = NatsDrainStore(NatsConnectOptions(servers=(url,)), buckets[3], buckets[5])
    try:
        return await run_drain(args, store, io.StringIO(), io.StringIO(), environ={})
    except LastWorkerRefused:
        return cli.EXIT_LAST_WORKER


def test_ten_concurrent_drains_of_a_models_last_ten_workers_leave_it_one_in_every_trial(
    nats_server: NatsServer, buckets: list[str], serve: subprocess.Popen[bytes]
) -> None:
    url, discovery, admission = nats_server.url, buckets[3], buckets[5]

    async def trial(number: int) -> tuple[list[int], list[str], list[str]]:
        namespace = f"t{number}"
        endpoint = EndpointId(namespace, "backend", "generate")
        instances = [0x100 + i for i in range(RACERS)]
        card = base_card(display_name=f"model-{number}", slug=f"model-{number}")
        await register(url, discovery, endpoint, instances, card)
        await members_until(url, admission, namespace, RACERS)
        statuses = await asyncio.gather(
            *(one_drain(url, buckets, instance, namespace) for instance in instances)
        )
        drained = await drain_keys(url, discovery, namespace)
        left = await members_until(url, admission, namespace, 1)
        return list(statuses), drained, left

    started = time.monotonic()
    for number in range(TRIALS):
        statuses, drained, left = asyncio.run(trial(number))
        assert sorted(statuses) == [0] * (RACERS - 1) + [cli.EXIT_LAST_WORKER], (number, statuses)
        assert len(drained) == RACERS - 1, (number, drained)
        # The one worker not drained is the one the frontend still serves.
        (member,) = left
        assert f"v1.drain.t{number}.{member.rsplit('/', 1)[1]}" not in drained
    took = time.monotonic() - started
    print(f"\n[drain] {TRIALS} trials of {RACERS} racing drains: the model kept a worker in "
          f"every one ({took:.1f} s)")  # fmt: skip
    assert serve.poll() is None


# -- the four loopholes -----------------------------------------------------------------------

EP = EndpointId("dgd", "backend", "generate")


def refused(buckets: list[str], instance: int) -> subprocess.CompletedProcess[str]:
    answer = run("drain", f"{instance:#x}", "--timeout", "30", *buckets)
    assert answer.returncode == cli.EXIT_LAST_WORKER, answer.stderr
    assert "would be left with no routable worker" in answer.stderr
    assert len(answer.stderr.strip().splitlines()) == 1
    return answer


def test_a_card_with_no_endpoint_record_is_no_successor_on_a_live_frontend(
    nats_server: NatsServer, buckets: list[str], serve: subprocess.Popen[bytes]
) -> None:
    url, discovery, admission = nats_server.url, buckets[3], buckets[5]
    asyncio.run(register(url, discovery, EP, [0xA1], base_card(16)))
    asyncio.run(members_until(url, admission, "dgd", 1))
    # Another configuration's card at the same endpoint, registered without an endpoint record.
    asyncio.run(register(url, discovery, EP, [0xB1], base_card(32), with_endpoint=False))
    answer = refused(buckets, 0xA1)
    assert "on frontend fe-1" in answer.stderr
    assert asyncio.run(drain_keys(url, discovery, "dgd")) == []


def test_with_no_frontend_live_a_card_only_registration_is_no_worker(
    nats_server: NatsServer, buckets: list[str]
) -> None:
    url, discovery = nats_server.url, buckets[3]
    asyncio.run(register(url, discovery, EP, [0xA1], base_card(16)))
    asyncio.run(register(url, discovery, EP, [0xA2], base_card(16), with_endpoint=False))
    answer = refused(buckets, 0xA1)
    assert "in the discovery bucket" in answer.stderr
    assert asyncio.run(drain_keys(url, discovery, "dgd")) == []


def test_with_no_frontend_live_a_prefill_worker_alone_serves_nothing(
    nats_server: NatsServer, buckets: list[str]
) -> None:
    url, discovery = nats_server.url, buckets[3]
    prefill = EndpointId("dgd", "prefill", "generate")
    asyncio.run(register(url, discovery, EP, [0xA1], base_card(16)))
    prefill_card = base_card(16, worker_type="prefill", model_input="Tokens", needs=[["decode"]])
    asyncio.run(register(url, discovery, prefill, [0xC1], prefill_card))
    answer = refused(buckets, 0xA1)
    assert "in the discovery bucket" in answer.stderr
    assert asyncio.run(drain_keys(url, discovery, "dgd")) == []


def test_a_live_frontend_of_another_namespace_leaves_the_bucket_to_judge_this_one(
    nats_server: NatsServer, buckets: list[str], tmp_path: Path
) -> None:
    url, discovery, admission = nats_server.url, buckets[3], buckets[5]
    other = EndpointId("other", "backend", "generate")
    watching_other = start_serve(
        buckets, tmp_path / "serve-other.log",
        "--frontend-id", "fe-other", "--namespace-filter-mode", "exact",
        "--namespace-filter", "other",
    )  # fmt: skip
    try:
        asyncio.run(register(url, discovery, other, [0xD1], base_card(16, display_name="m2")))
        asyncio.run(members_until(url, admission, "other", 1))
        asyncio.run(register(url, discovery, EP, [0xA1], base_card(16)))
        answer = refused(buckets, 0xA1)
        assert "in the discovery bucket" in answer.stderr
        assert asyncio.run(drain_keys(url, discovery, "dgd")) == []
    finally:
        watching_other.terminate()
        watching_other.wait(timeout=20)
