"""The route extension inside the real Dynamo 1.6.1 frontend: its loader, then its HTTP server."""

from __future__ import annotations

import asyncio
import json
import os
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import nats
import psutil
import pytest
from dynamofrontend import free_port, running_frontend
from nats.js.kv import KeyValue
from natsfixture import NatsServer
from support.buckets import live_keys
from support.cards import base_card
from support.workers import (
    InProcessWorker,
    file_discovery_environment,
    write_model_dir,
)
from workerset_admission.adapters.dynamo.bridge import DiscoveryBridge
from workerset_admission.adapters.nats.bucket_writer import JetStreamBucketWriter
from workerset_admission.adapters.nats.buckets import BucketSpec, ensure_bucket
from workerset_admission.card import encode_model_record, model_kv_key
from workerset_admission.frontend.routes import (
    HEALTH_PATH,
    READINESS_PATH,
    WORKERS_PATH,
    WORKERSETS_PATH,
    AdmissionRoutes,
    shared_host,
    stop_shared_host,
)
from workerset_admission.identity import EndpointId

pytestmark = [pytest.mark.dynamo, pytest.mark.integration, pytest.mark.timeout(120)]

_NEEDS = "needs ai-dynamo==1.6.1 (its runtime wheel, then `pip install --no-deps ai-dynamo==1.6.1`)"
frontend_main = pytest.importorskip("dynamo.frontend.main", reason=_NEEDS)

NAMESPACE = "frontns"
MODEL = "served-model"


@pytest.fixture
def environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nats_server: NatsServer, bucket_name: str
) -> dict[str, str]:
    """Private Dynamo file store, scratch and home, loopback sockets, the plugin's settings."""
    values = file_discovery_environment(tmp_path / "dynamo") | {
        "WORKERSET_ADMISSION_NATS_SERVERS": nats_server.url,
        "WORKERSET_ADMISSION_DISCOVERY_BUCKET": bucket_name,
        "WORKERSET_ADMISSION_ADMISSION_BUCKET": f"adm-{uuid.uuid4().hex[:12]}",
        "WORKERSET_ADMISSION_FRONTEND_ID": "frontend-under-test",
    }
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    return values


@pytest.fixture
async def bucket(nats_server: NatsServer, bucket_name: str) -> AsyncIterator[KeyValue]:
    client = await nats.connect(nats_server.url)
    try:
        yield (await ensure_bucket(client.jetstream(), BucketSpec(name=bucket_name))).kv
    finally:
        await client.close()


class _Workers:
    """In-process Dynamo workers registering one model on file discovery, bridged to the bucket."""

    def __init__(self, store: Path, bucket: KeyValue, models: Path) -> None:
        self._models = models
        self._bridge = DiscoveryBridge(store, JetStreamBucketWriter(bucket), interval=0.1)
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._running: list[InProcessWorker] = []

    async def __aenter__(self) -> _Workers:
        self._task = asyncio.create_task(self._bridge.run(self._stop))
        return self

    async def __aexit__(self, *exc: object) -> None:
        for worker in self._running:
            worker.stop()
        self._stop.set()
        assert self._task is not None
        await self._task

    async def start(self) -> int:
        """Start a worker; all of them share one model directory, hence one checksum."""
        worker = await InProcessWorker.start(f"{NAMESPACE}.backend.generate")
        self._running.append(worker)
        await worker.register(write_model_dir(self._models / "shared"), MODEL)
        return worker.instance_id


class _Context:
    """Stands in for FrontendExtensionContext, which Python cannot construct."""

    def is_cancelled(self) -> bool:
        return False

    def is_model_ready_to_serve(self, model: str) -> bool:
        return False


async def _eventually(probe: Any, seconds: float, what: str) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while True:
        value = await probe()
        if value:
            return value
        assert loop.time() < deadline, f"{what} did not happen within {seconds} s"
        await asyncio.sleep(0.2)


async def test_dynamos_loader_starts_the_extension_and_its_handlers_answer_live_state(
    environment: dict[str, str], bucket: KeyValue, tmp_path: Path
) -> None:
    try:
        routes = frontend_main.load_frontend_route_extensions(
            ["workerset-admission", "workerset-admission"]
        )
        assert sorted((r.method, r.path) for r in routes) == [
            ("GET", HEALTH_PATH),
            ("GET", READINESS_PATH),
            ("GET", WORKERS_PATH),
            ("GET", WORKERSETS_PATH),
        ]
        host = shared_host()
        handlers = AdmissionRoutes(lambda: host.state)
        ctx = _Context()

        async def healthy() -> bool:
            return handlers.health(ctx).status == 200

        await _eventually(healthy, 30, "the extension's service becoming healthy")

        async with _Workers(Path(environment["DYN_FILE_KV"]), bucket, tmp_path / "models") as w:
            first = await w.start()
            second = await w.start()

            async def admitted() -> Any:
                reply = handlers.workersets(ctx)
                sets = [s for s in reply.body.get("workersets", []) if s["model"] == MODEL]
                return sets and set(sets[0]["admitted"]) == {first, second} and sets[0]

            workerset = await _eventually(admitted, 30, "admission of both workers")
            assert workerset["incumbent"] is not None
            assert [c["members"] for c in workerset["cohorts"]] == [sorted((first, second))]

            async def ready() -> Any:
                models = handlers.readiness(ctx).body["models"]
                return [m for m in models if m["model"] == MODEL and m["ready"]]

            [readiness] = await _eventually(ready, 30, "readiness of the model")
            assert readiness["namespace"] == NAMESPACE
    finally:
        stop_shared_host()


def _get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")
    except (urllib.error.URLError, ConnectionError):
        return 0, None


async def _healthy_frontend(base: str, process: Any) -> Callable[[str], Awaitable[tuple[int, Any]]]:
    """Wait until the frontend's extension is healthy; return an HTTP GET of its paths."""

    async def get(path: str) -> tuple[int, Any]:
        return await asyncio.to_thread(_get, base + path)

    async def healthy() -> bool:
        assert process.poll() is None, "the frontend exited"
        return (await get(HEALTH_PATH))[0] == 200

    await _eventually(healthy, 60, "the frontend's extension becoming healthy")
    return get


@pytest.fixture
def frontend(environment: dict[str, str], tmp_path: Path) -> Iterator[tuple[str, Any]]:
    port = free_port()
    with running_frontend(port, os.environ, tmp_path / "frontend.log", stop_timeout=15) as process:
        yield f"http://127.0.0.1:{port}", process


async def test_the_real_frontend_serves_the_extensions_routes_over_http(
    environment: dict[str, str],
    bucket: KeyValue,
    frontend: tuple[str, Any],
    nats_server: NatsServer,
    tmp_path: Path,
) -> None:
    process = frontend[1]
    get = await _healthy_frontend(*frontend)

    async with _Workers(Path(environment["DYN_FILE_KV"]), bucket, tmp_path / "models") as w:
        worker = await w.start()

        async def admitted() -> Any:
            status, body = await get(WORKERSETS_PATH)
            sets = [s for s in body["workersets"] if s["model"] == MODEL] if status == 200 else []
            return sets and sets[0]["admitted"] == [worker] and sets[0]

        workerset = await _eventually(admitted, 60, "admission seen over HTTP")
        assert workerset["routable"] == [worker]
        listening = {
            c.laddr.ip
            for c in psutil.Process(process.pid).net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN
        }
        assert listening <= {"127.0.0.1"}

        # Dynamo's own discovery of the same worker, for comparison.
        async def listed() -> bool:
            status, body = await get("/v1/models")
            return status == 200 and MODEL in [m["id"] for m in body["data"]]

        await _eventually(listed, 30, "Dynamo listing the model")
        # The frontend caches the card's files under the checksum it computed itself.
        cached = Path(environment["HOME"]) / ".cache" / "dynamo" / "mdc" / "by-slug" / MODEL
        assert [d.name for d in cached.iterdir()] == [workerset["incumbent"]]
        status, body = await get(READINESS_PATH)
        assert status == 200
        assert [m["ready"] for m in body["models"] if m["model"] == MODEL] == [True]

        # Stopping the frontend stops the service, which withdraws its serving records.
        client = await nats.connect(nats_server.url)
        try:
            admission = await client.jetstream().key_value(
                environment["WORKERSET_ADMISSION_ADMISSION_BUCKET"]
            )

            member = f"{NAMESPACE}/backend/generate/{worker:x}"

            async def published() -> bool:
                for key in await live_keys(admission):
                    record = json.loads((await admission.get(key)).value)
                    if member in record.get("members", []):
                        return True
                return False

            await _eventually(published, 30, "the serving-admission record")
            process.terminate()
            await asyncio.to_thread(process.wait, 20)
            assert await live_keys(admission) == []
        finally:
            await client.close()


async def test_the_workersets_route_names_what_a_conflicting_card_differs_in(
    bucket: KeyValue, frontend: tuple[str, Any]
) -> None:
    get = await _healthy_frontend(*frontend)
    endpoint = EndpointId(NAMESPACE, "backend", "generate")
    incumbent = base_card(16, display_name=MODEL, slug=MODEL)
    conflicting = dict(incumbent, kv_cache_block_size=32, context_length=8192)
    for instance_id, card in ((1, incumbent), (2, conflicting)):
        await bucket.put(
            model_kv_key(endpoint, instance_id), encode_model_record(endpoint, instance_id, card)
        )

    async def rejected() -> Any:
        status, body = await get(WORKERSETS_PATH)
        return status == 200 and [r for r in body["rejections"] if r["model"] == MODEL]

    [rejection] = await _eventually(rejected, 60, "the rejection seen over HTTP")
    assert rejection["namespace"] == NAMESPACE
    assert rejection["instance"] == f"{NAMESPACE}/backend/generate/2"
    assert rejection["differences"] == [
        {
            "field": "context_length",
            "incumbent": "4096 (context_length)",
            "rejected": "8192 (context_length)",
        },
        {"field": "kv_cache_block_size", "incumbent": "16", "rejected": "32"},
    ]
    [workerset] = [s for s in (await get(WORKERSETS_PATH))[1]["workersets"] if s["model"] == MODEL]
    assert workerset["group_id"] == rejection["group_id"]
    assert workerset["rejected"] == [rejection["rejected_checksum"]]
