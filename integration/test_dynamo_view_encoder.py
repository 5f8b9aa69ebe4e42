"""The admitted view without a frontend: recorded encoder registrations, and a NATS outage.

The mocker has no encoder mode, so encoder workers are played from records shaped as 1.6.1
writes them (an encode card with no model type, Tokens input, and its endpoint record), put as
files into a worker file store. From there the path is the real one: the bridge mirrors them
into a real JetStream bucket, the service admits the first configuration, and the writer puts
exactly the admitted encoder's records into the view directory.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from pathlib import Path

import nats
import pytest
from natsfixture import NatsServer
from support.cards import base_card as demo_card
from workerset_admission.adapters.dynamo.bridge import DiscoveryBridge
from workerset_admission.adapters.dynamo.view import file_name_for
from workerset_admission.adapters.dynamo.view_directory import read_registry
from workerset_admission.adapters.nats.bucket_writer import JetStreamBucketWriter
from workerset_admission.adapters.nats.buckets import BucketSpec, ensure_bucket
from workerset_admission.card import encode_endpoint_record, encode_model_record
from workerset_admission.identity import EndpointId
from workerset_admission.service.bindings import HopRole
from workerset_admission.settings import Settings
from workerset_admission.wiring.compose import create_service

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

ENCODER = EndpointId("encns", "encoder", "generate")
FIRST, RIVAL = 0x5EED0001, 0x5EED0002


def _encoder_files(instance_id: int, block_size: int) -> dict[tuple[str, str], bytes]:
    card = demo_card(block_size) | {"worker_type": "encode", "model_type": ""}
    path = f"{ENCODER.namespace}/{ENCODER.component}/{ENCODER.endpoint}/{instance_id:x}"
    return {
        ("instances", file_name_for(path)): encode_endpoint_record(
            ENCODER, instance_id, {"tcp": f"127.0.0.1:9/{instance_id:x}"}
        ),
        ("mdc", file_name_for(path)): encode_model_record(ENCODER, instance_id, card),
    }


def _write(store: Path, files: dict[tuple[str, str], bytes]) -> None:
    for (bucket, name), value in files.items():
        (store / "v1" / bucket).mkdir(parents=True, exist_ok=True)
        (store / "v1" / bucket / name).write_bytes(value)


def _view(view: Path) -> dict[tuple[str, str], bytes]:
    found = {}
    for bucket in ("instances", "mdc"):
        folder = view / "v1" / bucket
        for name in os.listdir(folder) if folder.exists() else ():
            if not name.startswith("."):
                found[(bucket, name)] = (folder / name).read_bytes()
    return found


async def _until(condition: object, seconds: float, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not condition():  # type: ignore[operator]
        assert loop.time() < deadline, f"{what}: not within {seconds:g} s"
        await asyncio.sleep(0.05)


async def test_recorded_encoder_registrations_reach_the_view_only_when_admitted(
    tmp_path: Path, nats_server: NatsServer
) -> None:
    store, view = tmp_path / "workers", tmp_path / "view"
    store.mkdir()
    view.mkdir()
    bucket = f"enc-{uuid.uuid4().hex[:10]}"
    first, rival = _encoder_files(FIRST, 16), _encoder_files(RIVAL, 32)
    _write(store, first)

    client = await nats.connect(nats_server.url)
    kv = (await ensure_bucket(client.jetstream(), BucketSpec(name=bucket))).kv
    bridge = DiscoveryBridge(store, JetStreamBucketWriter(kv), interval=0.05)
    stop = asyncio.Event()
    bridging = asyncio.ensure_future(bridge.run(stop))
    settings = Settings(
        nats_servers=(nats_server.url,),
        discovery_bucket=bucket,
        admission_bucket=f"{bucket}-adm",
        view_dir=view,
        frontend_id="encoder-view-test",
    )
    service = await create_service(settings, publish=False, status=False)
    try:
        await _until(lambda: _view(view) == first, 20, "the first encoder is in the view")
        (binding,) = service.bindings()
        assert binding.role is HopRole.ENCODER

        _write(store, rival)
        await _until(
            lambda: any(c.members for g in service.status().groups for c in g.rejected),
            20,
            "the rival encoder is rejected",
        )
        await asyncio.sleep(0.3)  # a few writer passes: the rival must stay out
        assert _view(view) == first

        # The first encoder goes away: the rival succeeds it, and only then appears.
        for bucket_name, name in first:
            (store / "v1" / bucket_name / name).unlink()
        await _until(lambda: _view(view) == rival, 20, "the successor encoder is in the view")
        assert sorted(read_registry(view)) == sorted(rival)
    finally:
        await service.stop()
        stop.set()
        await bridging
        await client.close()
    # A stopped writer leaves its view for the frontend, for its horizon (fail static).
    assert _view(view) == rival


@pytest.mark.rollout  # a fault on a real server, about 13 s
@pytest.mark.timeout(90)
async def test_the_view_stays_alive_while_nats_is_unreachable_and_when_the_service_stops(
    tmp_path: Path, nats_server_fn: NatsServer
) -> None:
    handle = nats_server_fn.handle
    assert handle is not None
    view = tmp_path / "view"
    view.mkdir()
    bucket = f"outage-{uuid.uuid4().hex[:10]}"
    client = await nats.connect(nats_server_fn.url)
    kv = (await ensure_bucket(client.jetstream(), BucketSpec(name=bucket))).kv
    for (bucket_name, _name), value in _encoder_files(FIRST, 16).items():
        record = json.loads(value)
        key = f"v1.{bucket_name}.encns.encoder.generate.{record['instance_id']:x}"
        await kv.put(key, value)
    await client.close()
    settings = Settings(
        nats_servers=(nats_server_fn.url,),
        discovery_bucket=bucket,
        admission_bucket=f"{bucket}-adm",
        view_dir=view,
        frontend_id="outage-view-test",
    )
    service = await create_service(settings, publish=False, status=False)
    try:
        await _until(lambda: len(_view(view)) == 2, 20, "the encoder is in the view")
        await asyncio.to_thread(handle.stop, kill=True)
        # Longer than the file store's 10 s expiry: every file still carries the horizon's
        # lease, well ahead of the clock (the store keeps a file until 10 s past its mtime).
        await asyncio.sleep(11.0)
        assert len(_view(view)) == 2
        ahead = [(view / "v1" / b / n).stat().st_mtime - time.time() for b, n in _view(view)]
        assert min(ahead) > settings.view_horizon - 10.0 - 11.0
        await asyncio.to_thread(handle.start)
        await asyncio.sleep(1.0)
        assert len(_view(view)) == 2
    finally:
        await service.stop()
    assert len(_view(view)) == 2
