"""Operator tools never destroy what is not theirs: ``bridge`` and ``register``, real server."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest
from nats.aio.client import Client as NatsClient
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue
from natsfixture import NatsServer
from support.buckets import live_keys
from support.cards import base_card as demo_card
from workerset_admission.adapters.nats.buckets import BucketSpec, ensure_bucket
from workerset_admission.card import model_kv_key
from workerset_admission.identity import EndpointId
from workerset_admission.ownership import bridge_writer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

EP = EndpointId("tools", "backend", "generate")
CLI = (sys.executable, "-m", "workerset_admission.cli")


@pytest.fixture
async def bucket(client: NatsClient, bucket_name: str) -> KeyValue:
    return (await ensure_bucket(client.jetstream(), BucketSpec(name=bucket_name))).kv


async def _value(kv: KeyValue, key: str) -> bytes | None:
    try:
        return (await kv.get(key)).value
    except KeyNotFoundError:
        return None


async def _run(*args: str, timeout: float = 60.0) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        *CLI, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), timeout)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def _bridge_args(server: NatsServer, bucket: str, store: Path, *extra: str) -> list[str]:
    return [
        "bridge",
        *("--file-kv", str(store), "--once"),
        *("--nats-server", server.url, "--discovery-bucket", bucket),
        *extra,
    ]


@pytest.mark.parametrize("shape", ["missing", "a file instead of a directory"])
async def test_the_bridge_on_a_missing_store_exits_nonzero_with_one_line_and_deletes_nothing(
    nats_server: NatsServer, bucket: KeyValue, bucket_name: str, tmp_path: Path, shape: str
) -> None:
    keys = [f"v1.mdc.tools.backend.generate.{n:x}" for n in range(1, 4)]
    for key in keys:
        await bucket.put(key, b"{}")
    store = tmp_path / "mistyped"
    if shape != "missing":
        store.write_text("")

    code, out, err = await _run(*_bridge_args(nats_server, bucket_name, store))

    assert code == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert "file store" in err
    assert await live_keys(bucket) == sorted(keys)


async def test_a_registered_workers_key_survives_every_bridge_prune_and_stale_bridge_keys_go(
    nats_server: NatsServer,
    client: NatsClient,
    bucket: KeyValue,
    bucket_name: str,
    tmp_path: Path,
) -> None:
    store = tmp_path / "store"
    (store / "v1" / "mdc").mkdir(parents=True)
    record = store / "v1" / "mdc" / "tools%2Fbackend%2Fgenerate%2Fab12"
    record.write_bytes(b'{"type":"Model"}')
    bridged = "v1.mdc.tools.backend.generate.ab12"
    # What an earlier run of this same bridge wrote and the store no longer holds.
    stale = "v1.mdc.tools.backend.generate.dead"
    js = client.jetstream()
    owner = bridge_writer(store, "edge-1")
    await js.publish(f"$KV.{bucket_name}.{stale}", b"{}", headers=owner.headers())
    # A key with no stamp (a worker writing directly) and one another bridge owns.
    await bucket.put("v1.mdc.tools.backend.generate.0", b"{}")
    other = bridge_writer(store, "edge-2")
    theirs = "v1.mdc.tools.backend.generate.1"
    await js.publish(f"$KV.{bucket_name}.{theirs}", b"{}", headers=other.headers())

    card = tmp_path / "card.json"
    card.write_text(json.dumps(demo_card(16)))
    register = await asyncio.create_subprocess_exec(
        *CLI,
        "register",
        *("--nats-server", nats_server.url, "--discovery-bucket", bucket_name),
        *("--namespace", EP.namespace, "--component", EP.component, "--endpoint", EP.endpoint),
        *("--instance-id", "0x77", "--card", str(card), "--ttl", "2"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    registered = model_kv_key(EP, 0x77)
    try:
        assert register.stdout is not None
        line = await asyncio.wait_for(register.stdout.readline(), 30)
        assert registered in json.loads(line)["registered"]
        for _ in range(3):  # every run of the bridge prunes at its start
            # Refreshed as its live owner would (Dynamo touches it every ttl/3): three bridge
            # runs on a loaded machine can take longer than the file TTL, and an expired
            # record is deleted, as it should be.
            record.touch()
            code, out, err = await _run(
                *_bridge_args(nats_server, bucket_name, store, "--bridge-id", "edge-1")
            )
            assert code == 0, err
            assert await _value(bucket, registered) is not None
        assert json.loads(out)["pruned"] == 0
        assert await _value(bucket, stale) is None
        assert await _value(bucket, bridged) is not None
        assert await _value(bucket, "v1.mdc.tools.backend.generate.0") is not None
        assert await _value(bucket, theirs) is not None
        assert register.returncode is None, "register must still be running"
    finally:
        if register.returncode is None:
            register.terminate()
        await asyncio.wait_for(register.communicate(), 30)


async def _start_register(
    server: NatsServer, bucket: str, card: Path, instance: str, *extra: str
) -> asyncio.subprocess.Process:
    process = await asyncio.create_subprocess_exec(
        *CLI,
        "register",
        *("--nats-server", server.url, "--discovery-bucket", bucket),
        *("--namespace", EP.namespace, "--component", EP.component, "--endpoint", EP.endpoint),
        *("--instance-id", instance, "--card", str(card), "--ttl", "2", "--heartbeat", "0.2"),
        *extra,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    await asyncio.wait_for(process.stdout.readline(), 30)
    return process


async def test_register_writes_its_key_again_when_it_is_deleted_and_says_so(
    nats_server: NatsServer, bucket: KeyValue, bucket_name: str, tmp_path: Path
) -> None:
    card = tmp_path / "card.json"
    card.write_text(json.dumps(demo_card(16)))
    process = await _start_register(nats_server, bucket_name, card, "0x78")
    key = model_kv_key(EP, 0x78)
    try:
        for _ in range(2):
            revision = (await bucket.get(key)).revision
            await bucket.delete(key)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 15
            while True:
                try:
                    entry = await bucket.get(key)
                except KeyNotFoundError:
                    entry = None
                if entry is not None and entry.revision > revision + 1:
                    break
                assert loop.time() < deadline, "the deleted registration never came back"
                await asyncio.sleep(0.1)
        assert process.returncode is None
    finally:
        process.terminate()
        _out, err = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 0
    assert err.decode().count("registering it again") >= 2


async def test_register_told_to_exit_on_loss_exits_nonzero_when_its_key_is_deleted(
    nats_server: NatsServer, bucket: KeyValue, bucket_name: str, tmp_path: Path
) -> None:
    card = tmp_path / "card.json"
    card.write_text(json.dumps(demo_card(16)))
    process = await _start_register(nats_server, bucket_name, card, "0x79", "--exit-on-loss")
    try:
        await bucket.delete(model_kv_key(EP, 0x79))
        _out, err = await asyncio.wait_for(process.communicate(), 30)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 4  # the command failed while running
    assert "registration lost" in err.decode()
