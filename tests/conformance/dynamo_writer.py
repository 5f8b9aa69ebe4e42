"""Register a few models with the real Dynamo 1.6.1 runtime on its file discovery backend.

Run as a script (``python dynamo_writer.py <model dir>``) with ``DYN_FILE_KV`` pointing at a
temporary folder; the records it leaves there are what 1.6.1 workers publish.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from dynamo._core import (
    DistributedRuntime,
    KvRouterConfig,
    ModelInput,
    ModelRuntimeConfig,
    ModelType,
    RouterConfig,
    RouterMode,
    WorkerType,
    register_model,
)

MODEL = sys.argv[1]


async def main() -> None:
    loop = asyncio.get_running_loop()
    drt = DistributedRuntime(loop, "file", "tcp")

    async def gen(request: Any, context: Any = None) -> Any:
        yield {}

    served: list[Any] = []

    async def endpoint(path: str) -> Any:
        ep = drt.endpoint(path)
        served.append(asyncio.ensure_future(ep.serve_endpoint(gen)))
        await asyncio.sleep(0.3)
        return ep

    ep = await endpoint("dgd-v1.backend.generate")
    await register_model(
        ModelInput.Tokens,
        ModelType.Chat | ModelType.Completions,
        ep,
        MODEL,
        "Org/Model-A",
        worker_type=WorkerType.Decode,
        needs=[[WorkerType.Prefill]],
        model_aliases=["alias-a"],
    )
    await register_model(
        ModelInput.Tokens,
        ModelType.Chat | ModelType.Completions,
        ep,
        MODEL,
        "my-lora",
        worker_type=WorkerType.Decode,
        needs=[[WorkerType.Prefill]],
        lora_name="My LoRA.v1",
        base_model_path=MODEL,
        max_gpu_lora_count=2,
    )
    ep2 = await endpoint("dgd-v1.prefill.generate")
    rc = ModelRuntimeConfig()
    rc.max_num_seqs = 64
    await register_model(
        ModelInput.Tokens,
        ModelType.Prefill,
        ep2,
        MODEL,
        "Org/Model-A",
        worker_type=WorkerType.Prefill,
        needs=[[WorkerType.Decode]],
        router_config=RouterConfig(RouterMode.KV, KvRouterConfig(router_temperature=0.25)),
        runtime_config=rc,
        kv_cache_block_size=32,
    )
    ep3 = await endpoint("other.backend.generate")
    await register_model(
        ModelInput.Tokens,
        ModelType.Chat,
        ep3,
        MODEL,
        "Org/Model-A",
        worker_type=WorkerType.Aggregated,
        router_config=RouterConfig(RouterMode.RoundRobin),
    )
    await asyncio.sleep(0.5)
    print("registered", flush=True)
    # The runtime keeps serving threads alive; leave without waiting for them.
    os._exit(0)


asyncio.run(main())
