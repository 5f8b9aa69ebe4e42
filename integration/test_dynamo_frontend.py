"""The route extension inside the real Dynamo 1.6.1 frontend: its loader, then its HTTP server."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import nats
import psutil
import pytest
from nats.js.kv import KeyValue
from natsfixture import NatsServer
from workerset_admission.adapters.dynamo.bridge import DiscoveryBridge, JetStreamBucketWriter
from workerset_admission.adapters.dynamo.routes import (
    HEALTH_PATH,
    READINESS_PATH,
    WORKERSETS_PATH,
    AdmissionRoutes,
    shared_host,
    stop_shared_host,
)
from workerset_admission.adapters.nats.buckets import BucketSpec, ensure_bucket

pytestmark = [pytest.mark.dynamo, pytest.mark.integration, pytest.mark.timeout(120)]

_NEEDS = "needs ai-dynamo==1.6.1 (its runtime wheel, then `pip install --no-deps ai-dynamo==1.6.1`)"
frontend_main = pytest.importorskip("dynamo.frontend.main", reason=_NEEDS)
runtime = pytest.importorskip("dynamo.runtime", reason=_NEEDS)
llm = pytest.importorskip("dynamo.llm", reason=_NEEDS)

NAMESPACE = "frontns"
MODEL = "served-model"


def _model_dir(directory: Path) -> Path:
    """A model directory Dynamo registers without weights."""
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "max_position_embeddings": 2048,
                "vocab_size": 5,
                "bos_token_id": 1,
                "eos_token_id": 2,
            }
        )
    )
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "a": 3, "b": 4}
    (directory / "tokenizer.json").write_text(
        json.dumps(
            {
                "version": "1.0",
                "truncation": None,
                "padding": None,
                "added_tokens": [],
                "normalizer": None,
                "pre_tokenizer": None,
                "post_processor": None,
                "decoder": None,
                "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"},
            }
        )
    )
    # The frontend builds a chat pipeline, which needs a chat template.
    template = "{% for message in messages %}{{ message.content }}{% endfor %}"
    (directory / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "model_max_length": 2048,
                "bos_token": "<s>",
                "eos_token": "</s>",
                "chat_template": template,
            }
        )
    )
    return directory


@pytest.fixture
def environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nats_server: NatsServer, bucket_name: str
) -> dict[str, str]:
    """Private file store and scratch dir, loopback sockets, and the plugin's NATS settings."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    values = {
        # The frontend caches model metadata under $HOME/.cache/dynamo.
        "HOME": str(tmp_path / "home"),
        "DYN_FILE_KV": str(tmp_path / "kv"),
        "TMPDIR": str(scratch),
        "DYN_TCP_RPC_HOST": "127.0.0.1",
        "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1",
        "DYN_EVENT_PLANE_HOST": "127.0.0.1",
        "DYN_SELF_HOST_METADATA": "0",
        "DYN_LOG": "warn",
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
    """In-process Dynamo workers registering a model on file discovery, bridged to the bucket."""

    def __init__(self, store: Path, bucket: KeyValue, models: Path) -> None:
        self._models = models
        self._bridge = DiscoveryBridge(store, JetStreamBucketWriter(bucket), interval=0.1)
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._running: list[tuple[Any, Any]] = []

    async def __aenter__(self) -> _Workers:
        self._task = asyncio.create_task(self._bridge.run(self._stop))
        return self

    async def __aexit__(self, *exc: object) -> None:
        for drt, serving in self._running:
            drt.shutdown()
            serving.cancel()
        self._stop.set()
        assert self._task is not None
        await self._task

    async def start(self, files: str = "shared", model: str = MODEL) -> int:
        """Start a worker; workers given the same ``files`` share one checksum."""
        drt = runtime.DistributedRuntime(asyncio.get_running_loop(), "file", "tcp")
        endpoint = drt.endpoint(f"{NAMESPACE}.backend.generate")

        async def handler(request: Any, context: Any = None) -> AsyncIterator[dict[str, Any]]:
            yield {}

        self._running.append((drt, asyncio.ensure_future(endpoint.serve_endpoint(handler))))
        await llm.register_model(
            llm.ModelInput.Tokens,
            llm.ModelType.Chat | llm.ModelType.Completions,
            endpoint,
            str(self._model_dir(files)),
            model,
            worker_type=llm.WorkerType.Aggregated,
        )
        return int(endpoint.connection_id())

    def _model_dir(self, files: str) -> Path:
        # The card carries the directory as source_path, which the checksum covers.
        directory = self._models / files
        return directory if directory.exists() else _model_dir(directory)


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


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")
    except (urllib.error.URLError, ConnectionError):
        return 0, None


@pytest.fixture
def frontend(environment: dict[str, str], tmp_path: Path) -> Iterator[tuple[str, Any]]:
    port = _free_port()
    log = (tmp_path / "frontend.log").open("w")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dynamo.frontend",
            "--discovery-backend",
            "file",
            "--frontend-route-extension",
            "workerset-admission",
            "--http-host",
            "127.0.0.1",
            "--http-port",
            str(port),
        ],
        env=os.environ.copy(),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        yield f"http://127.0.0.1:{port}", process
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
        log.close()


async def test_the_real_frontend_serves_the_extensions_routes_over_http(
    environment: dict[str, str],
    bucket: KeyValue,
    frontend: tuple[str, Any],
    nats_server: NatsServer,
    tmp_path: Path,
) -> None:
    base, process = frontend

    async def get(path: str) -> tuple[int, Any]:
        return await asyncio.to_thread(_get, base + path)

    async def healthy() -> bool:
        assert process.poll() is None, "the frontend exited"
        return (await get(HEALTH_PATH))[0] == 200

    await _eventually(healthy, 60, "the frontend's extension becoming healthy")

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
                for key in await _live_keys(admission):
                    record = json.loads((await admission.get(key)).value)
                    if member in record.get("members", []):
                        return True
                return False

            await _eventually(published, 30, "the serving-admission record")
            process.terminate()
            await asyncio.to_thread(process.wait, 20)
            assert await _live_keys(admission) == []
        finally:
            await client.close()


async def _live_keys(kv: KeyValue) -> list[str]:
    from nats.js.errors import NoKeysError

    try:
        return list(await kv.keys())
    except NoKeysError:
        return []
