"""Every writer fills the bucket again by itself after losing it, on a real nats-server.

Each test runs one writer the way an operator does (``workerset-admission bridge`` on a file
store, ``bridge --etcd`` on a real etcd, ``register``, and ``serve`` for the serving records it
publishes in the admission bucket) as its own process, waits until the
bucket holds its records, then takes them away: the server restarted on a wiped store, the
bucket's stream deleted, the stream deleted and created again by someone else, or one key
deleted behind the writer's back. The writer is never restarted; the test waits (bounded) until
the bucket holds every record again with the same value, and a stream the writer had to create
again has the settings a bucket created by this package has.
"""

from __future__ import annotations

import asyncio
import json
import operator
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import nats
import pytest
from etcdfixture import EtcdServer, eventually
from natsfixture import NatsServer
from support.buckets import held_values
from support.cards import base_card
from workerset_admission.adapters.nats.buckets import BucketSpec, ensure_bucket
from workerset_admission.adapters.nats.kv import stream_name

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

FAULTS = ("wiped store", "stream deleted", "stream re-created", "key deleted")
CLI = (sys.executable, "-m", "workerset_admission.cli")
# Short enough that a deleted key comes back within the test's patience, long enough to show a
# lost bucket is noticed by its mark (within a second) and not by waiting for this.
RECONCILE = "3"
NAMESPACE = "healns"
RECORDS = {
    "v1/mdc/healns/backend/generate/a1": b'{"type":"Model","card":"a1"}',
    "v1/instances/healns/backend/generate/a1": b'{"type":"Endpoint","id":"a1"}',
    "v1/mdc/healns/backend/generate/b2": b'{"type":"Model","card":"b2"}',
}


def _bucket_key(path: str) -> str:
    return path.replace("/", ".")


async def _inflict(fault: str, server: NatsServer, spec: BucketSpec, victim: str) -> None:
    bucket = spec.name
    handle = server.handle
    assert handle is not None
    if fault == "wiped store":
        await asyncio.to_thread(handle.restart, wipe=True, downtime=0.5)
        return
    nc = await nats.connect(server.url)
    try:
        js = nc.jetstream()
        if fault == "key deleted":
            await (await js.key_value(bucket)).delete(victim)
            return
        await js.delete_stream(stream_name(bucket))
        if fault == "stream re-created":
            # Another client makes the bucket again at once, empty: the writer never sees
            # it missing, only a stream with a new creation time.
            await ensure_bucket(js, spec)
    finally:
        await nc.close()


async def _spawn(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *CLI, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )


async def _finish(process: asyncio.subprocess.Process) -> tuple[int, bytes, bytes]:
    if process.returncode is None:
        process.send_signal(signal.SIGTERM)
    try:
        stdout, stderr = await asyncio.wait_for(process.communicate(), 30)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode is not None
    return process.returncode, stdout, stderr


def _same_capability(held: bytes | None, lost: bytes) -> bool:
    if held is None:
        return False
    fields = [json.loads(value) for value in (held, lost)]
    for record in fields:
        record.pop("resynced_at", None)
    return fields[0] == fields[1]


async def _heals(
    fault: str,
    server: NatsServer,
    bucket: str,
    process: asyncio.subprocess.Process,
    expected_keys: set[str],
    *,
    spec: BucketSpec | None = None,
    same: Callable[[bytes | None, bytes], bool] = operator.eq,
) -> float:
    """Wait for the writer's records, take them away, wait for all of them again; the seconds.

    ``same`` says whether a record read back is the one that was lost.
    """

    async def all_written() -> dict[str, bytes] | None:
        held = await held_values(server.url, bucket)
        return held if expected_keys <= set(held) else None

    before = await eventually(all_written, 30, "the writer's records reaching the bucket")
    before = {key: before[key] for key in expected_keys}
    spec = spec or BucketSpec(name=bucket)
    await _inflict(fault, server, spec, victim=min(expected_keys))
    lost_at = time.monotonic()

    async def restored() -> bool:
        held = await held_values(server.url, bucket)
        return all(same(held.get(key), value) for key, value in before.items())

    await eventually(restored, 30, f"the writer filling the bucket again after: {fault}", 0.05)
    seconds = time.monotonic() - lost_at
    assert process.returncode is None, "the writer exited instead of healing the bucket"
    print(f"{fault}: every record back {seconds:.2f} s later")
    status = await _bucket_as_created(server.url, spec)
    assert status == (), f"the bucket came back with other settings: {status}"
    return seconds


async def _bucket_as_created(url: str, spec: BucketSpec) -> tuple[str, ...]:
    nc = await nats.connect(url)
    try:
        status = await ensure_bucket(nc.jetstream(), spec)
        assert not status.created
        return status.mismatches
    finally:
        await nc.close()


def _stats(stdout: bytes) -> dict[str, Any]:
    stats: dict[str, Any] = json.loads(stdout.decode().strip().splitlines()[-1])
    return stats


def _assert_healed_by(fault: str, stats: Mapping[str, Any]) -> None:
    if fault == "key deleted":
        # Nothing about the bucket changed but one key: the periodic reading found it.
        assert stats["restored"] >= 1, stats
    else:
        assert stats["heals"] >= 1, stats


async def _bridge_heals(fault: str, server: NatsServer, bucket: str, *source: str) -> None:
    """Run ``bridge`` on a store holding ``RECORDS``; check it heals ``fault`` by itself."""
    process = await _spawn(
        "bridge",
        *source,
        *("--heal-interval", RECONCILE),
        *("--nats-server", server.url, "--discovery-bucket", bucket),
    )
    try:
        seconds = await _heals(fault, server, bucket, process, {_bucket_key(p) for p in RECORDS})
    finally:
        returncode, stdout, stderr = await _finish(process)
    assert returncode == 0, stderr.decode()
    _assert_healed_by(fault, _stats(stdout))
    if fault != "key deleted":
        assert seconds < float(RECONCILE), "the lost bucket was only found by the periodic read"


@pytest.fixture
def server(nats_server_fn: NatsServer) -> NatsServer:
    return nats_server_fn


@pytest.fixture
def file_store(tmp_path: Path) -> Path:
    """A Dynamo file store holding ``RECORDS``, written as Dynamo names its files."""
    from urllib.parse import quote

    root = tmp_path / "store"
    for path, value in RECORDS.items():
        _v1, kind, rest = path.split("/", 2)
        target = root / "v1" / kind / quote(rest, safe="")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(value)
    return root


@pytest.mark.parametrize("fault", FAULTS)
async def test_the_file_bridge_fills_the_bucket_again_after_losing_it(
    fault: str, server: NatsServer, bucket_name: str, file_store: Path
) -> None:
    await _bridge_heals(fault, server, bucket_name, "--file-kv", str(file_store), "--ttl", "3600")


@pytest.fixture
async def etcd_records(etcd_server: EtcdServer) -> AsyncIterator[None]:
    import aetcd  # type: ignore[import-untyped]

    client = aetcd.Client("127.0.0.1", etcd_server.client_port, timeout=5)
    try:
        for path, value in RECORDS.items():
            await client.put(path.encode(), value)
        yield
    finally:
        await client.close()


@pytest.mark.etcd
@pytest.mark.parametrize("fault", FAULTS)
async def test_the_etcd_bridge_fills_the_bucket_again_after_losing_it(
    fault: str,
    server: NatsServer,
    bucket_name: str,
    etcd_server: EtcdServer,
    etcd_records: None,
) -> None:
    await _bridge_heals(fault, server, bucket_name, "--etcd", etcd_server.url)


@pytest.mark.parametrize("fault", FAULTS)
async def test_a_register_process_fills_the_bucket_again_after_losing_it(
    fault: str, server: NatsServer, bucket_name: str, tmp_path: Path
) -> None:
    card = tmp_path / "card.json"
    card.write_text(json.dumps(base_card()))
    process = await _spawn(
        "register",
        *("--namespace", NAMESPACE, "--component", "backend", "--endpoint", "generate"),
        *("--instance-id", "0xa1", "--card", str(card), "--ttl", "3"),
        *("--nats-server", server.url, "--discovery-bucket", bucket_name),
    )
    expected = {
        f"v1.mdc.{NAMESPACE}.backend.generate.a1",
        f"v1.instances.{NAMESPACE}.backend.generate.a1",
    }
    try:
        await _heals(fault, server, bucket_name, process, expected)
    finally:
        returncode, stdout, stderr = await _finish(process)
    assert returncode == 0, stderr.decode()
    assert set(json.loads(stdout.decode().strip().splitlines()[-1])["deregistered"]) == expected


@pytest.mark.parametrize("fault", FAULTS)
async def test_serve_fills_the_admission_bucket_again_after_losing_it(
    fault: str, server: NatsServer, bucket_name: str
) -> None:
    admission = f"adm-{bucket_name}"
    process = await _spawn(
        "serve",
        *("--nats-server", server.url, "--discovery-bucket", bucket_name),
        *("--admission-bucket", admission, "--status-subject", f"st.{bucket_name}"),
        *("--frontend-id", "fe-heal"),
    )
    try:
        # The capability record: a frontend that serves nothing yet still says it publishes.
        seconds = await _heals(
            fault,
            server,
            admission,
            process,
            {"v1.fe-heal.heartbeat", "v1.fe-heal.capability"},
            # What serve creates it with: per-key TTLs (the heartbeat's 60 s) with removal
            # markers, and no max age (content is written when it changes).
            spec=BucketSpec(name=admission, limit_marker_ttl=60.0, max_age=None),
            # After a resync the capability also says when it happened (for late peers).
            same=_same_capability,
        )
    finally:
        returncode, _stdout, stderr = await _finish(process)
    assert returncode == 0, stderr.decode()
    # The writer's watch of its own keys, or its heartbeat read back every 2 s, brings the lost
    # records back at once: not at the next heartbeat (a third of its 60 s TTL).
    assert seconds < 15, "the lost record came back only with the periodic refresh"
