"""Real Dynamo 1.6.1 workers on file discovery reach the JetStream bucket through the bridge."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue
from natsfixture import NatsServer
from support.buckets import live_keys
from support.workers import (
    InProcessWorker,
    file_discovery_environment,
    write_model_dir,
)
from workerset_admission.adapters.dynamo.bridge import DiscoveryBridge
from workerset_admission.adapters.nats.bucket_writer import JetStreamBucketWriter
from workerset_admission.adapters.nats.buckets import BucketSpec, ensure_bucket
from workerset_admission.adapters.nats.connect import NatsConnectOptions
from workerset_admission.adapters.nats.source import JetStreamDiscoverySource
from workerset_admission.ownership import bridge_writer
from workerset_admission.service.admission_service import AdmissionService

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

_NEEDS_DYNAMO = (
    "the Dynamo tests need ai-dynamo-runtime==1.6.1 (pip install ai-dynamo-runtime==1.6.1)"
)

NAMESPACE = "bridgens"
PATH = f"{NAMESPACE}.backend.generate"

# A worker process that registers a model, prints its id, and serves until killed; once killed
# nobody refreshes its files again.
_WORKER = """
import asyncio, pathlib, sys
from support.workers import InProcessWorker

async def main():
    worker = await InProcessWorker.start(sys.argv[1])
    await worker.register(pathlib.Path(sys.argv[2]), sys.argv[3])
    print(format(worker.instance_id, "x"), flush=True)
    await worker.serving

asyncio.run(main())
"""


@pytest.fixture
def file_discovery(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point every runtime this test starts at a private file store, on loopback only."""
    environment = file_discovery_environment(tmp_path / "dynamo")
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    return Path(environment["DYN_FILE_KV"])


@pytest.fixture
async def bucket(nats_server: NatsServer, bucket_name: str) -> AsyncIterator[KeyValue]:
    client = await nats.connect(nats_server.url)
    try:
        status = await ensure_bucket(client.jetstream(), BucketSpec(name=bucket_name))
        yield status.kv
    finally:
        await client.close()


@pytest.fixture
async def workers() -> AsyncIterator[list[InProcessWorker]]:
    started: list[InProcessWorker] = []
    yield started
    for worker in started:
        worker.stop()


@pytest.fixture
def killed_worker(file_discovery: Path, tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    pytest.importorskip("dynamo.runtime", reason=_NEEDS_DYNAMO)
    model = write_model_dir(tmp_path / "killed-model")
    process = subprocess.Popen(
        [sys.executable, "-c", _WORKER, f"{NAMESPACE}.doomed.generate", str(model), "doomed"],
        stdout=subprocess.PIPE,
        text=True,
        # The stand-in worker lives in integration/support: the child needs that folder.
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(Path(__file__).parent), os.environ.get("PYTHONPATH")) if p
            ),
        },
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(10)
        assert process.stdout is not None
        process.stdout.close()


async def _value(kv: KeyValue, key: str) -> bytes | None:
    try:
        entry = await kv.get(key)
    except KeyNotFoundError:
        return None
    return entry.value


async def _sync_until(bridge: DiscoveryBridge, condition: Any, seconds: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while True:
        await bridge.sync_once()
        if await condition():
            return
        assert loop.time() < deadline, f"bridge did not converge within {seconds} s"
        await asyncio.sleep(0.2)


async def test_start_prunes_only_the_keys_this_bridge_wrote_that_the_store_no_longer_holds(
    nats_server: NatsServer, bucket: KeyValue, bucket_name: str, tmp_path: Path
) -> None:
    store = tmp_path / "empty-store"
    store.mkdir()
    owner = bridge_writer(store, "edge-1")
    client = await nats.connect(nats_server.url)
    try:
        js = client.jetstream()
        for key in ("v1.mdc.ns.backend.generate.dead", "v1.instances.ns.backend.generate.dead"):
            await js.publish(f"$KV.{bucket_name}.{key}", b"{}", headers=owner.headers())
        await bucket.put("v1.mdc.ns.backend.generate.unstamped", b"{}")
        await bucket.put("elsewhere.key", b"not ours")
        writer = JetStreamBucketWriter(bucket, owner=owner, client=client, bucket=bucket_name)
        bridge = DiscoveryBridge(store, writer)

        await bridge.sync_once()
    finally:
        await client.close()

    assert await live_keys(bucket) == ["elsewhere.key", "v1.mdc.ns.backend.generate.unstamped"]
    assert bridge.stats.pruned == 2


@pytest.mark.dynamo
async def test_registrations_removals_and_expiry_of_dynamo_workers_reach_the_bucket(
    file_discovery: Path,
    bucket: KeyValue,
    killed_worker: subprocess.Popen[str],
    workers: list[InProcessWorker],
    tmp_path: Path,
) -> None:
    worker = await InProcessWorker.start(PATH)
    workers.append(worker)
    await worker.register(write_model_dir(tmp_path / "model"), "bridged")
    hex_id = f"{worker.instance_id:x}"
    model_key = f"v1.mdc.{NAMESPACE}.backend.generate.{hex_id}"
    endpoint_key = f"v1.instances.{NAMESPACE}.backend.generate.{hex_id}"
    bridge = DiscoveryBridge(file_discovery, JetStreamBucketWriter(bucket))

    async def both_present() -> bool:
        return None not in (await _value(bucket, model_key), await _value(bucket, endpoint_key))

    await _sync_until(bridge, both_present, 20)
    file_name = f"{NAMESPACE}%2Fbackend%2Fgenerate%2F{hex_id}"
    assert (
        await _value(bucket, model_key) == (file_discovery / "v1" / "mdc" / file_name).read_bytes()
    )
    record = json.loads(await _value(bucket, model_key) or b"")
    assert record["type"] == "Model"
    assert record["instance_id"] == worker.instance_id

    # Removal: the worker withdraws its card; its endpoint record stays.
    await worker.unregister()

    async def card_gone() -> bool:
        return await _value(bucket, model_key) is None

    await _sync_until(bridge, card_gone, 20)
    assert await _value(bucket, endpoint_key) is not None
    assert bridge.stats.removed == 1

    # A clean shutdown deletes the worker's files at once; no live FileStore is left to sweep
    # stale files, so what follows can only be the bridge's own expiry.
    worker.stop()

    async def endpoint_gone() -> bool:
        return await _value(bucket, endpoint_key) is None

    await _sync_until(bridge, endpoint_gone, 20)
    assert bridge.stats.removed == 2

    # Expiry: a killed worker leaves its files behind, unrefreshed, until the TTL passes.
    assert killed_worker.stdout is not None
    doomed = killed_worker.stdout.readline().strip()
    doomed_key = f"v1.mdc.{NAMESPACE}.doomed.generate.{doomed}"

    async def doomed_present() -> bool:
        return await _value(bucket, doomed_key) is not None

    await _sync_until(bridge, doomed_present, 20)
    killed_worker.send_signal(signal.SIGKILL)
    killed_worker.wait(10)

    async def doomed_gone() -> bool:
        return await _value(bucket, doomed_key) is None

    await _sync_until(bridge, doomed_gone, 30)
    assert (file_discovery / "v1" / "mdc" / f"{NAMESPACE}%2Fdoomed%2Fgenerate%2F{doomed}").exists()
    assert bridge.stats.expired == 2  # its card and its endpoint record


def _dynamo_checksum(record_bytes: bytes) -> str:
    """The checksum Dynamo 1.6.1 itself computes: the last part of the card's cache dir."""
    from dynamo._core import ModelDeploymentCard

    card = json.loads(record_bytes)["card_json"]
    return Path(ModelDeploymentCard.from_json_str(json.dumps(card)).local_dir()).name


async def _wait_for(condition: Any, seconds: float, what: str) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while True:
        value = condition()
        if value:
            return value
        assert loop.time() < deadline, f"{what} did not happen within {seconds} s"
        await asyncio.sleep(0.1)


@pytest.mark.dynamo
async def test_workers_registered_by_dynamo_are_admitted_under_dynamos_own_checksum(
    file_discovery: Path,
    nats_server: NatsServer,
    bucket: KeyValue,
    bucket_name: str,
    workers: list[InProcessWorker],
    tmp_path: Path,
) -> None:
    pytest.importorskip("dynamo.runtime", reason=_NEEDS_DYNAMO)
    same = write_model_dir(tmp_path / "v1")
    changed = write_model_dir(tmp_path / "v2", context_length=4096)

    async def worker(model: Path) -> int:
        started = await InProcessWorker.start(PATH)
        workers.append(started)
        await started.register(model, "rolling")
        return started.instance_id

    def card_file(instance_id: int) -> bytes:
        name = f"{NAMESPACE}%2Fbackend%2Fgenerate%2F{instance_id:x}"
        return (file_discovery / "v1" / "mdc" / name).read_bytes()

    def rolling() -> Any:
        groups = [g for g in service.status().groups if g.group.model == "rolling"]
        return groups[0] if groups else None

    bridge = DiscoveryBridge(file_discovery, JetStreamBucketWriter(bucket), interval=0.1)
    stop = asyncio.Event()
    bridging = asyncio.create_task(bridge.run(stop))
    service = AdmissionService(
        JetStreamDiscoverySource(NatsConnectOptions(servers=(nats_server.url,)), bucket=bucket_name)
    )
    await service.start()
    try:
        first = await worker(same)
        second = await worker(same)
        incumbent = _dynamo_checksum(card_file(first))
        assert _dynamo_checksum(card_file(second)) == incumbent

        group = await _wait_for(
            lambda: (g := rolling()) and set(g.admitted) == {first, second} and g,
            30,
            "admission of the first two workers",
        )
        assert group.incumbent == incumbent

        # A rolling update of the same WorkerSet with a different configuration is rejected.
        newcomer = await worker(changed)
        rejected = _dynamo_checksum(card_file(newcomer))
        assert rejected != incumbent

        group = await _wait_for(
            lambda: (g := rolling()) and len(g.cohorts) == 2 and g, 30, "the newcomer's cohort"
        )
        assert [(c.mdc_checksum, c.members) for c in group.cohorts] == [
            (incumbent, tuple(sorted((first, second)))),
            (rejected, (newcomer,)),
        ]
        assert set(group.admitted) == {first, second}
    finally:
        stop.set()
        await bridging
        await service.stop()


async def test_the_bridge_command_mirrors_until_terminated_then_prints_its_counters(
    nats_server: NatsServer, bucket: KeyValue, bucket_name: str, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    (store / "v1" / "mdc").mkdir(parents=True)
    (store / "v1" / "mdc" / "ns%2Fbackend%2Fgenerate%2Fab12").write_bytes(b'{"type":"Model"}')
    command = [
        *(sys.executable, "-m", "workerset_admission.cli", "bridge"),
        # A long interval: the removal below is inotify's to report, not a timed pass's.
        *("--file-kv", str(store), "--interval", "2"),
        # Nothing refreshes the record as its owner would: a TTL longer than the test keeps a
        # slow start (a loaded machine) from finding it already expired.
        *("--ttl", "300"),
        *("--nats-server", nats_server.url, "--discovery-bucket", bucket_name),
    ]
    process = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while await _value(bucket, "v1.mdc.ns.backend.generate.ab12") is None:
            assert loop.time() < deadline, "the bridge command wrote nothing within 30 s"
            await asyncio.sleep(0.1)
        # A worker that stops removes its file: inotify reports it, and the bridge deletes the
        # key at once, before its next pass.
        (store / "v1" / "mdc" / "ns%2Fbackend%2Fgenerate%2Fab12").unlink()
        while await _value(bucket, "v1.mdc.ns.backend.generate.ab12") is not None:
            assert loop.time() < deadline, "the bridge command deleted nothing within 30 s"
            await asyncio.sleep(0.05)
        process.terminate()
        stdout, _stderr = await asyncio.wait_for(process.communicate(), 30)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()

    assert process.returncode == 0
    counters = json.loads(stdout)
    assert counters["puts"] == 1
    assert counters["removed"] == 1
    assert counters["removed_at_once"] == 1, counters
