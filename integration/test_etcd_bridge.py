"""Real Dynamo 1.6.1 workers registering in a real etcd reach the bucket through the etcd bridge.

Every test runs its own etcd on loopback, real ``python -m dynamo.mocker`` workers with
``--discovery-backend etcd`` and a short lease (``ETCD_LEASE_TTL``), and the shared nats-server.
The truth each test converges to is what etcd itself lists at that moment.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aetcd  # type: ignore[import-untyped]
import nats
import pytest
from etcdfixture import (
    LEASE_TTL,
    EtcdServer,
    MockerWorkers,
    card_gone,
    etcd_binary,
    eventually,
    new_instance,
)
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue
from natsfixture import NatsServer
from secfixture import _make_tls as make_tls
from support.buckets import live_keys
from support.workers import write_model_dir
from workerset_admission.adapters.etcd.bridge import (
    EtcdDiscoveryBridge,
    StoreChange,
    StoreListing,
    bucket_key_for_etcd,
)
from workerset_admission.adapters.etcd.client import AetcdStoreReader, EtcdOptions
from workerset_admission.adapters.nats.bucket_writer import JetStreamBucketWriter
from workerset_admission.adapters.nats.buckets import BucketSpec, ensure_bucket
from workerset_admission.adapters.nats.connect import NatsConnectOptions
from workerset_admission.adapters.nats.source import JetStreamDiscoverySource
from workerset_admission.discovery_paths import parse_endpoints
from workerset_admission.errors import StoreUnavailable
from workerset_admission.ownership import WriterId
from workerset_admission.service.admission_service import AdmissionService

pytestmark = [pytest.mark.integration, pytest.mark.etcd, pytest.mark.timeout(180)]

NAMESPACE = "etcdns"
ENDPOINT = f"dyn://{NAMESPACE}.backend.generate"
# A key another writer (a ``register`` process) owns in the same bucket.
FOREIGN_KEY = "v1.mdc.elsewhere.backend.generate.abc"
FOREIGN_VALUE = b'{"written":"by another writer"}'


@pytest.fixture
async def bucket_and_writer(
    nats_server: NatsServer, bucket_name: str
) -> AsyncIterator[tuple[KeyValue, JetStreamBucketWriter]]:
    client = await nats.connect(nats_server.url)
    try:
        status = await ensure_bucket(client.jetstream(), BucketSpec(name=bucket_name))
        await status.kv.put(FOREIGN_KEY, FOREIGN_VALUE)
        # The writer the bridge command uses: every put stamped, only stamped keys pruned.
        writer = JetStreamBucketWriter(
            status.kv,
            owner=WriterId("bridge", "etcd-integration-test"),
            client=client,
            bucket=bucket_name,
        )
        yield status.kv, writer
    finally:
        await client.close()


@pytest.fixture
def bucket(bucket_and_writer: tuple[KeyValue, JetStreamBucketWriter]) -> KeyValue:
    return bucket_and_writer[0]


@pytest.fixture
def writer(bucket_and_writer: tuple[KeyValue, JetStreamBucketWriter]) -> JetStreamBucketWriter:
    return bucket_and_writer[1]


def _reader(etcd_server: EtcdServer) -> AetcdStoreReader:
    return AetcdStoreReader(EtcdOptions(parse_endpoints(etcd_server.url), timeout=5))


async def _etcd_records(client: aetcd.Client) -> dict[str, bytes]:
    """What etcd holds now, under the bucket keys the bridge must give it."""
    listing = await client.get_prefix(b"v1/")
    records: dict[str, bytes] = {}
    for kv in listing:
        key = bucket_key_for_etcd(kv.key.decode())
        if key is not None:
            records[key] = kv.value
    return records


async def _bucket_records(kv: KeyValue) -> dict[str, bytes]:
    """What the bucket holds, the other writer's key left out."""
    records: dict[str, bytes] = {}
    for key in await live_keys(kv):
        if key == FOREIGN_KEY:
            continue
        try:
            entry = await kv.get(key)
        except KeyNotFoundError:
            continue
        if entry.value is not None:
            records[key] = entry.value
    return records


async def _converged(
    client: aetcd.Client, kv: KeyValue, seconds: float, what: str, *, may_be_empty: bool = False
) -> dict[str, bytes]:
    """Wait until the bucket holds exactly etcd's records; the other writer's key untouched.

    An empty etcd counts only when ``may_be_empty`` (when every worker may be gone).
    """

    async def same() -> tuple[dict[str, bytes]] | None:
        truth = await _etcd_records(client)
        if not truth and not may_be_empty:
            return None
        return (truth,) if truth == await _bucket_records(kv) else None

    (truth,) = await eventually(same, seconds, what)
    foreign = await kv.get(FOREIGN_KEY)
    assert foreign.value == FOREIGN_VALUE, "the bridge touched a key another writer owns"
    return truth


def _dynamo_checksum(record: bytes) -> str:
    """The checksum Dynamo 1.6.1 itself computes: the last part of the card's cache dir."""
    from dynamo._core import ModelDeploymentCard

    card = json.loads(record)["card_json"]
    return Path(ModelDeploymentCard.from_json_str(json.dumps(card)).local_dir()).name


def _mdc_key(instance_id: int) -> str:
    return f"v1.mdc.{NAMESPACE}.backend.generate.{instance_id:x}"


@pytest.mark.dynamo
async def test_workers_registering_deregistering_and_dying_in_etcd_are_followed_and_admitted(
    etcd_server: EtcdServer,
    etcd_client: aetcd.Client,
    mockers: MockerWorkers,
    nats_server: NatsServer,
    bucket: KeyValue,
    writer: JetStreamBucketWriter,
    bucket_name: str,
    tmp_path: Path,
) -> None:
    same = write_model_dir(tmp_path / "model-a")
    changed = write_model_dir(tmp_path / "model-b", context_length=4096)
    bridge = EtcdDiscoveryBridge(_reader(etcd_server), writer)
    stop = asyncio.Event()
    bridging = asyncio.create_task(bridge.run(stop))
    service = AdmissionService(
        JetStreamDiscoverySource(NatsConnectOptions(servers=(nats_server.url,)), bucket=bucket_name)
    )
    await service.start()

    def rolling() -> Any:
        groups = [g for g in service.status().groups if g.group.model == "rolling"]
        return groups[0] if groups else None

    known: set[int] = set()
    try:
        first_process = mockers.start(same, name="rolling", endpoint=ENDPOINT)
        first = await new_instance(etcd_client, known)
        second_process = mockers.start(same, name="rolling", endpoint=ENDPOINT)
        second = await new_instance(etcd_client, known)
        truth = await _converged(etcd_client, bucket, 30, "the bucket following two workers")
        incumbent = _dynamo_checksum(truth[_mdc_key(first)])
        assert _dynamo_checksum(truth[_mdc_key(second)]) == incumbent
        group = await eventually(
            lambda: _ready(rolling, lambda g: set(g.admitted) == {first, second}),
            30,
            "admission of both workers",
        )
        assert group.incumbent == incumbent

        # A worker of another configuration in the same WorkerSet is seen and rejected.
        mockers.start(changed, name="rolling", endpoint=ENDPOINT)
        newcomer = await new_instance(etcd_client, known)
        truth = await _converged(etcd_client, bucket, 30, "the bucket following the newcomer")
        rejected = _dynamo_checksum(truth[_mdc_key(newcomer)])
        assert rejected != incumbent
        group = await eventually(
            lambda: _ready(rolling, lambda g: len(g.cohorts) == 2),
            30,
            "the newcomer's cohort",
        )
        assert [(c.mdc_checksum, set(c.members)) for c in group.cohorts] == [
            (incumbent, {first, second}),
            (rejected, {newcomer}),
        ]
        assert set(group.admitted) == {first, second}

        # A clean stop deregisters at once; a kill is a lease expiry, a delete all the same.
        mockers.stop(second_process)
        await card_gone(etcd_client, second, 15)
        await _converged(etcd_client, bucket, 15, "the bucket dropping the stopped worker")
        mockers.kill(first_process)
        await card_gone(etcd_client, first, LEASE_TTL + 20)
        truth = await _converged(etcd_client, bucket, 15, "the bucket dropping the dead worker")
        assert _mdc_key(first) not in truth
        assert bridge.stats.deletes >= 2
        # The incumbent drained: the waiting configuration succeeds it.
        group = await eventually(
            lambda: _ready(rolling, lambda g: set(g.admitted) == {newcomer}),
            30,
            "succession by the newcomer",
        )
        assert group.incumbent == rejected
    finally:
        stop.set()
        await bridging
        await service.stop()


async def _ready(group_of: Callable[[], Any], condition: Callable[[Any], bool]) -> Any:
    group = group_of()
    return group if group is not None and condition(group) else None


@pytest.mark.dynamo
async def test_the_bucket_converges_after_etcd_restarts_and_deletes_nothing_while_it_is_down(
    etcd_server: EtcdServer,
    etcd_client: aetcd.Client,
    mockers: MockerWorkers,
    bucket: KeyValue,
    writer: JetStreamBucketWriter,
    tmp_path: Path,
) -> None:
    model = write_model_dir(tmp_path / "model")
    bridge = EtcdDiscoveryBridge(_reader(etcd_server), writer, backoff=(0.2, 0.5, 1.0))
    stop = asyncio.Event()
    bridging = asyncio.create_task(bridge.run(stop))
    known: set[int] = set()
    try:
        survivor_process = mockers.start(model, name="restarts", endpoint=ENDPOINT)
        await new_instance(etcd_client, known)
        doomed_process = mockers.start(model, name="restarts", endpoint=ENDPOINT)
        doomed = await new_instance(etcd_client, known)
        before = await _converged(etcd_client, bucket, 30, "the bucket following two workers")

        etcd_server.kill()
        await eventually(
            lambda: _true(bridge.stats.store_errors >= 2), 20, "the bridge noticing etcd is gone"
        )
        # A worker dies while etcd is down; nothing may leave the bucket meanwhile.
        mockers.kill(doomed_process)
        await asyncio.sleep(1.0)
        assert await _bucket_records(bucket) == before

        etcd_server.start()
        # etcd keeps the dead worker's lease; it expires after a TTL counted from the restart.
        await card_gone(etcd_client, doomed, LEASE_TTL + 30)
        truth = await _converged(
            etcd_client, bucket, 30, "the bucket after the restart", may_be_empty=True
        )
        assert _mdc_key(doomed) not in truth
        # The survivor kept (or re-made) its registration unless etcd's outage ended it.
        assert survivor_process.poll() is not None or any(k.startswith("v1.mdc.") for k in truth)
    finally:
        stop.set()
        await bridging


@pytest.mark.dynamo
async def test_a_frozen_etcd_is_noticed_by_the_probe_and_the_bucket_converges_once_it_thaws(
    etcd_server: EtcdServer,
    etcd_client: aetcd.Client,
    mockers: MockerWorkers,
    bucket: KeyValue,
    writer: JetStreamBucketWriter,
    tmp_path: Path,
) -> None:
    model = write_model_dir(tmp_path / "model")
    reader = AetcdStoreReader(EtcdOptions(parse_endpoints(etcd_server.url), timeout=2))
    bridge = EtcdDiscoveryBridge(reader, writer, probe_interval=1.0, backoff=(0.5, 1.0))
    stop = asyncio.Event()
    bridging = asyncio.create_task(bridge.run(stop))
    known: set[int] = set()
    try:
        doomed_process = mockers.start(model, name="frozen", endpoint=ENDPOINT)
        doomed = await new_instance(etcd_client, known)
        before = await _converged(etcd_client, bucket, 30, "the bucket following the worker")

        # Frozen, not stopped: every connection stays open and nothing answers.
        etcd_server.freeze()
        try:
            await eventually(
                lambda: _true(bridge.stats.store_errors >= 1), 20, "the probe noticing"
            )
            # What the bucket held when etcd froze: the worker may have added records (its
            # event channels come a moment after its card) between the comparison above and
            # the freeze. Nothing the bridge had is gone, and nothing changes while frozen.
            frozen = await _bucket_records(bucket)
            assert set(before) <= set(frozen)
            mockers.kill(doomed_process)
            await asyncio.sleep(2 * 1.0)  # two probe intervals
            assert await _bucket_records(bucket) == frozen
        finally:
            etcd_server.thaw()
        await card_gone(etcd_client, doomed, LEASE_TTL + 30)
        truth = await _converged(
            etcd_client, bucket, 30, "the bucket after the thaw", may_be_empty=True
        )
        assert _mdc_key(doomed) not in truth
    finally:
        stop.set()
        await bridging
        await reader.close()


async def _true(value: bool) -> bool:
    return value


class _LaggingReader:
    """The real aetcd reader, whose watch starts only when the test lets it (it falls behind)."""

    def __init__(self, reader: AetcdStoreReader) -> None:
        self._reader = reader
        self.listed = asyncio.Event()
        self.may_watch = asyncio.Event()

    async def list_prefix(self, prefix: str) -> StoreListing:
        listing = await self._reader.list_prefix(prefix)
        self.listed.set()
        return listing

    async def watch_prefix(self, prefix: str, start_revision: int) -> AsyncIterator[StoreChange]:
        await self.may_watch.wait()
        async for change in self._reader.watch_prefix(prefix, start_revision):
            yield change

    async def probe(self) -> None:
        await self._reader.probe()

    async def reset(self) -> None:
        await self._reader.reset()


@pytest.mark.dynamo
async def test_a_compaction_while_the_watch_is_behind_makes_the_bridge_list_again(
    etcd_server: EtcdServer,
    etcd_client: aetcd.Client,
    mockers: MockerWorkers,
    bucket: KeyValue,
    writer: JetStreamBucketWriter,
    tmp_path: Path,
) -> None:
    model = write_model_dir(tmp_path / "model")
    known: set[int] = set()
    leaving_process = mockers.start(model, name="compacted", endpoint=ENDPOINT)
    leaving = await new_instance(etcd_client, known)
    reader = _LaggingReader(_reader(etcd_server))
    bridge = EtcdDiscoveryBridge(reader, writer)
    stop = asyncio.Event()
    bridging = asyncio.create_task(bridge.run(stop))
    try:
        await asyncio.wait_for(bridge.synced.wait(), 30)
        assert _mdc_key(leaving) in await _bucket_records(bucket)
        # While the watch has not started: one worker leaves, one arrives, history is compacted.
        mockers.stop(leaving_process)
        await card_gone(etcd_client, leaving, 15)
        mockers.start(model, name="compacted", endpoint=ENDPOINT)
        arrived = await new_instance(etcd_client, known)
        current = (await etcd_client.get_prefix(b"v1/")).header.revision
        await etcd_client.compact(current, physical=True)
        reader.may_watch.set()

        truth = await _converged(etcd_client, bucket, 30, "the bucket after the compaction")
        assert _mdc_key(arrived) in truth
        assert _mdc_key(leaving) not in truth
        assert bridge.stats.relists_after_compaction >= 1
    finally:
        stop.set()
        await bridging


def _bridge_command(etcd_server: EtcdServer, nats_server: NatsServer, bucket: str) -> list[str]:
    return [
        *(sys.executable, "-m", "workerset_admission.cli", "bridge"),
        *("--etcd", etcd_server.url),
        *("--nats-server", nats_server.url, "--discovery-bucket", bucket),
    ]


DEAD_WORKER_LEASE = 20


@pytest.mark.dynamo
@pytest.mark.rollout  # a long fault under churn: the slower tier
async def test_a_bridge_killed_and_restarted_while_workers_churn_converges(
    etcd_server: EtcdServer,
    etcd_client: aetcd.Client,
    mockers: MockerWorkers,
    nats_server: NatsServer,
    bucket: KeyValue,
    bucket_name: str,
    tmp_path: Path,
) -> None:
    model = write_model_dir(tmp_path / "model")
    command = _bridge_command(etcd_server, nats_server, bucket_name)
    known: set[int] = set()
    processes: list[asyncio.subprocess.Process] = []

    async def start_bridge() -> asyncio.subprocess.Process:
        process = await asyncio.create_subprocess_exec(
            *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
        )
        processes.append(process)
        return process

    try:
        # The worker that dies below must still be in etcd when the restarted bridge lists it,
        # after a worker and a bridge have started: seconds on a loaded machine, more than
        # LEASE_TTL.
        first_process = mockers.start(
            model, name="churn", endpoint=ENDPOINT, lease_ttl=DEAD_WORKER_LEASE
        )
        first = await new_instance(etcd_client, known)
        mockers.start(model, name="churn", endpoint=ENDPOINT)
        await new_instance(etcd_client, known)
        bridge = await start_bridge()
        await _converged(etcd_client, bucket, 30, "the bridge command following two workers")

        bridge.send_signal(signal.SIGKILL)
        await bridge.wait()
        # Churn while no bridge runs: one dies, one arrives.
        mockers.kill(first_process)
        mockers.start(model, name="churn", endpoint=ENDPOINT)
        await new_instance(etcd_client, known)
        restarted = await start_bridge()
        truth = await _converged(etcd_client, bucket, 30, "the restarted bridge catching up")
        assert len([key for key in truth if key.startswith("v1.mdc.")]) == 3
        # The dead worker's lease then expires under the running bridge.
        await card_gone(etcd_client, first, DEAD_WORKER_LEASE + 20)
        truth = await _converged(etcd_client, bucket, 30, "the bucket after the lease expiry")
        assert _mdc_key(first) not in truth

        restarted.terminate()
        stdout, _ = await asyncio.wait_for(restarted.communicate(), 30)
        assert restarted.returncode == 0
        counters = json.loads(stdout)
        assert counters["listings"] >= 1
        assert counters["deletes"] + counters["pruned"] >= 1
    finally:
        for process in processes:
            if process.returncode is None:
                process.kill()
                await process.wait()


async def test_bridge_once_against_an_etcd_that_does_not_answer_fails_and_writes_nothing(
    etcd_server: EtcdServer, nats_server: NatsServer, bucket: KeyValue, bucket_name: str
) -> None:
    etcd_server.stop()
    command = [*_bridge_command(etcd_server, nats_server, bucket_name), "--once"]
    process = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    _stdout, stderr = await asyncio.wait_for(process.communicate(), 60)

    assert process.returncode == 3  # the CLI's status for an unreachable store
    assert b"etcd" in stderr
    assert await live_keys(bucket) == [FOREIGN_KEY]


@pytest.fixture
def tls_etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    folder = tmp_path / "tls"
    folder.mkdir()
    server = EtcdServer(etcd_binary(), tmp_path / "etcd-tls", tls=make_tls(folder))
    server.start()
    try:
        yield server
    finally:
        server.stop()


async def test_the_reader_lists_over_mutual_tls_and_a_stranger_certificate_is_refused(
    tls_etcd: EtcdServer,
) -> None:
    tls = tls_etcd.tls
    assert tls is not None
    endpoints = parse_endpoints(tls_etcd.url)
    trusted = AetcdStoreReader(
        EtcdOptions(
            endpoints, ca_file=tls.ca_file, cert_file=tls.client_cert, key_file=tls.client_key
        )
    )
    stranger = AetcdStoreReader(
        EtcdOptions(
            endpoints,
            ca_file=tls.ca_file,
            cert_file=tls.stranger_cert,
            key_file=tls.stranger_key,
            timeout=3,
        )
    )
    try:
        listing = await trusted.list_prefix("v1/")
        assert listing.revision >= 1
        assert listing.entries == ()
        with pytest.raises(StoreUnavailable):
            await stranger.list_prefix("v1/")
    finally:
        await trusted.close()
        await stranger.close()


async def test_the_reader_authenticates_with_user_and_password_and_a_wrong_one_is_refused(
    etcd_server: EtcdServer,
) -> None:
    etcd_server.gateway("/v3/auth/user/add", {"name": "root", "password": "root-secret"})
    etcd_server.gateway("/v3/auth/user/grant", {"user": "root", "role": "root"})
    etcd_server.gateway("/v3/kv/put", {"key": "djEvbWRjL25zL2IvZy8x", "value": "e30="})
    etcd_server.gateway("/v3/auth/enable", {})
    endpoints = parse_endpoints(etcd_server.url)
    right = AetcdStoreReader(EtcdOptions(endpoints, user="root", password="root-secret"))
    wrong = AetcdStoreReader(EtcdOptions(endpoints, user="root", password="not-it"))
    nobody = AetcdStoreReader(EtcdOptions(endpoints))
    try:
        listing = await right.list_prefix("v1/")
        assert [e.key for e in listing.entries] == ["v1/mdc/ns/b/g/1"]
        with pytest.raises(StoreUnavailable) as refused:
            await wrong.list_prefix("v1/")
        assert "not-it" not in str(refused.value)
        with pytest.raises(StoreUnavailable):
            await nobody.list_prefix("v1/")
    finally:
        for reader in (right, wrong, nobody):
            await reader.close()
