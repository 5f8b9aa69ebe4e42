"""Stand-in Dynamo 1.6.1 workers, in process, for the integration tests: no GPU, no weights.

A worker here is what a real backend is to Dynamo's discovery: its own ``DistributedRuntime``
(so its own instance id) serving an endpoint, and a model registered with Dynamo's own
``register_model`` from a directory holding only the configuration and tokenizer files. Every
socket stays on loopback when the process runs with :func:`file_discovery_environment`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["InProcessWorker", "file_discovery_environment", "write_model_dir"]


def file_discovery_environment(root: Path) -> dict[str, str]:
    """Environment for Dynamo processes sharing a private file store under ``root``.

    Dynamo reads these when a runtime is created: the file store, a scratch ``TMPDIR`` (each
    process leaves a small file there), a ``HOME`` for the frontend's metadata cache, loopback
    addresses for every listener, and no self-hosted metadata server.
    """
    for name in ("kv", "tmp", "home"):
        (root / name).mkdir(parents=True, exist_ok=True)
    return {
        "DYN_FILE_KV": str(root / "kv"),
        "TMPDIR": str(root / "tmp"),
        "HOME": str(root / "home"),
        "DYN_TCP_RPC_HOST": "127.0.0.1",
        "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1",
        "DYN_EVENT_PLANE_HOST": "127.0.0.1",
        "DYN_SELF_HOST_METADATA": "0",
        "DYN_LOG": "warn",
    }


def write_model_dir(directory: Path, *, context_length: int = 2048) -> Path:
    """Write a weightless model Dynamo registers and its frontend can build a chat pipeline for.

    Cards carry the directory as ``source_path`` and the context length, both covered by the
    checksum: workers sharing a directory share a checksum, another directory means another.
    """
    directory.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "max_position_embeddings": context_length,
        "vocab_size": 5,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    tokenizer: dict[str, Any] = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": None,
        "post_processor": None,
        "decoder": None,
        "model": {
            "type": "WordLevel",
            "vocab": {"<unk>": 0, "<s>": 1, "</s>": 2, "a": 3, "b": 4},
            "unk_token": "<unk>",
        },
    }
    tokenizer_config = {
        "model_max_length": context_length,
        "bos_token": "<s>",
        "eos_token": "</s>",
        "chat_template": "{% for message in messages %}{{ message.content }}{% endfor %}",
    }
    for name, content in (
        ("config.json", config),
        ("tokenizer.json", tokenizer),
        ("tokenizer_config.json", tokenizer_config),
    ):
        (directory / name).write_text(json.dumps(content))
    return directory


@dataclass
class InProcessWorker:
    """One worker: a runtime serving ``namespace.component.endpoint`` on the running loop.

    Its handler answers every request with ``{"served_by": <instance id>}``.
    """

    runtime: Any
    endpoint: Any
    serving: asyncio.Future[Any]
    instance_id: int

    @classmethod
    async def start(cls, path: str) -> InProcessWorker:
        """Serve ``path`` (``namespace.component.endpoint``) from a new runtime."""
        from dynamo.runtime import DistributedRuntime

        runtime = DistributedRuntime(asyncio.get_running_loop(), "file", "tcp")
        endpoint = runtime.endpoint(path)
        instance_id = int(endpoint.connection_id())

        async def handler(request: Any, context: Any = None) -> AsyncIterator[dict[str, int]]:
            yield {"served_by": instance_id}

        # serve_endpoint returns a future, not a coroutine.
        serving = asyncio.ensure_future(endpoint.serve_endpoint(handler))
        return cls(runtime, endpoint, serving, instance_id)

    async def register(self, model_dir: Path, name: str) -> None:
        """Register an aggregated chat and completions model with Dynamo's ``register_model``."""
        from dynamo.llm import ModelInput, ModelType, WorkerType, register_model

        await register_model(
            ModelInput.Tokens,
            ModelType.Chat | ModelType.Completions,
            self.endpoint,
            str(model_dir),
            name,
            worker_type=WorkerType.Aggregated,
        )

    async def unregister(self) -> None:
        """Withdraw the model card; the endpoint keeps serving."""
        from dynamo.llm import unregister_model

        await unregister_model(self.endpoint)

    def stop(self) -> None:
        """Shut the runtime down; Dynamo deletes the worker's discovery records."""
        self.runtime.shutdown()
        self.serving.cancel()
