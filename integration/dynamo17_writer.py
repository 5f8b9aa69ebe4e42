"""Register model variants with the Dynamo 1.7 runtime's own workers on its file store.

Run by the 1.7 environment's Python: ``python dynamo17_writer.py <scratch dir>`` with
``DYN_FILE_KV`` set. Each variant is registered on an endpoint of its own (one card per
endpoint, and a LoRA adapter beside some), across model directories with and without their
tokenizer and generation files, block sizes, worker types and needs, router and runtime
configs, aliases and adapters. The records left in ``DYN_FILE_KV`` are what 1.7 workers
publish; the script prints ``registered <n>`` and leaves.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import sys
from pathlib import Path
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

SCRATCH = Path(sys.argv[1])


def model_dirs() -> list[Path]:
    """Model directories: full, without tokenizer_config, with generation_config, with extras."""
    config = {"max_position_embeddings": 4096, "model_type": "llama", "eos_token_id": 2}
    tokenizer = {
        "version": "1.0",
        "model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []},
    }
    tok_config = {"eos_token": "b", "bos_token": "a", "chat_template": "{{ messages }}"}
    shapes: list[dict[str, Any]] = [
        {"config.json": config, "tokenizer.json": tokenizer, "tokenizer_config.json": tok_config},
        {"config.json": config, "tokenizer.json": tokenizer},
        {
            "config.json": {**config, "max_position_embeddings": 8192},
            "tokenizer.json": tokenizer,
            "tokenizer_config.json": tok_config,
            "generation_config.json": {"temperature": 0.6, "top_p": 0.9},
        },
        {
            "config.json": config,
            "tokenizer.json": tokenizer,
            "tokenizer_config.json": {**tok_config, "chat_template": "{{ bos_token }}{{ x }}"},
            "special_tokens_map.json": {"eos_token": "b"},
        },
    ]
    dirs = []
    for index, files in enumerate(shapes):
        folder = SCRATCH / f"model-{index}"
        folder.mkdir(parents=True, exist_ok=True)
        for name, content in files.items():
            (folder / name).write_text(json.dumps(content))
        dirs.append(folder)
    return dirs


def routers() -> list[RouterConfig | None]:
    return [
        None,
        RouterConfig(RouterMode.RoundRobin),
        RouterConfig(RouterMode.KV, KvRouterConfig(router_temperature=0.25)),
        RouterConfig(RouterMode.KV, KvRouterConfig(router_ttl_secs=30.0)),
        RouterConfig(RouterMode.KV, KvRouterConfig(router_ttl_secs=1e19)),
    ]


def runtime(index: int) -> ModelRuntimeConfig | None:
    if index % 3 == 0:
        return None
    config = ModelRuntimeConfig()
    config.max_num_seqs = 32 * index
    if index % 3 == 2:
        config.total_kv_blocks = 1000 + index
        config.taints = {f"zone=z{index % 2}"}
    return config


TOPOLOGIES = [
    (ModelType.Chat | ModelType.Completions, WorkerType.Aggregated, None),
    (ModelType.Chat | ModelType.Completions, WorkerType.Decode, [[WorkerType.Prefill]]),
    (ModelType.Prefill, WorkerType.Prefill, [[WorkerType.Decode]]),
    (ModelType.Chat, WorkerType.Aggregated, None),
]


async def main() -> None:
    loop = asyncio.get_running_loop()
    drt = DistributedRuntime(loop, "file", "tcp")

    async def gen(request: Any, context: Any = None) -> Any:
        yield {}

    served: list[Any] = []
    dirs = model_dirs()
    count = 0
    variants = itertools.product(range(len(dirs)), range(len(routers())), range(len(TOPOLOGIES)))
    for index, (d, r, t) in enumerate(variants):
        ep = drt.endpoint(f"v17n{index}.backend.generate")
        served.append(asyncio.ensure_future(ep.serve_endpoint(gen)))
        await asyncio.sleep(0.02)
        model_type, worker_type, needs = TOPOLOGIES[t]
        name = f"Org/Model-{d}"
        await register_model(
            ModelInput.Tokens,
            model_type,
            ep,
            str(dirs[d]),
            name,
            kv_cache_block_size=(16, 32, 64)[index % 3],
            router_config=routers()[r],
            runtime_config=runtime(index),
            worker_type=worker_type,
            needs=needs,
            model_aliases=[f"alias-{index}"] if index % 4 == 1 else None,
        )
        count += 1
        if worker_type is WorkerType.Aggregated and index % 5 == 0:
            await register_model(
                ModelInput.Tokens,
                model_type,
                ep,
                str(dirs[d]),
                f"lora-{index}",
                worker_type=worker_type,
                lora_name=f"My LoRA.{index}",
                base_model_path=str(dirs[d]),
                max_gpu_lora_count=2,
            )
            count += 1
    await asyncio.sleep(0.5)
    print(f"registered {count}", flush=True)
    # The runtime keeps serving threads alive; leave without waiting for them.
    os._exit(0)


asyncio.run(main())
