"""Register models the way workers do, with whichever ``ai-dynamo-runtime`` runs this script.

Run by ``build_n2_corpus.py`` under each old runtime's own venv, with ``DYN_FILE_KV`` set:
``python n2_writer.py <variants.json>``. Each variant gets its own namespace on one runtime
and is registered with ``register_model`` (or started as the runtime's mocker engine);
the records land in the file store. One JSON line per variant goes to stdout: its name and
whether the runtime took it (an old runtime may not know a flag or refuse a shape).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from dynamo import _core as core


def flags(names: list[str]) -> Any:
    value = None
    for name in names:
        flag = getattr(core.ModelType, name)
        value = flag if value is None else value | flag
    return core.ModelType.Empty if value is None else value


def worker(name: str | None) -> Any:
    return None if name is None else getattr(core.WorkerType, name.capitalize())


def router_kwargs(spec: dict[str, Any] | None) -> dict[str, Any]:
    """The ``router_config`` argument for a variant's router settings."""
    if spec is None:
        return {}
    mode = getattr(core.RouterMode, spec["mode"])
    kv = spec.get("kv")
    if kv is None:
        return {"router_config": core.RouterConfig(mode)}
    return {"router_config": core.RouterConfig(mode, core.KvRouterConfig(**kv))}


def runtime_config(spec: dict[str, Any] | None) -> Any:
    if spec is None:
        return None
    config = core.ModelRuntimeConfig()
    for name, value in spec.items():
        setattr(config, name, value)
    return config


def mdc_files(store: Path, namespace: str) -> list[Path]:
    prefix = namespace.replace("-", "%2D") + "%2F"
    folder = store / "v1" / "mdc"
    return sorted(folder.glob(prefix + "*")) if folder.is_dir() else []


async def register(drt: Any, spec: dict[str, Any]) -> None:
    endpoint = drt.endpoint(f"{spec['namespace']}.backend.generate")

    async def generate(request: Any, context: Any = None) -> Any:
        yield {}

    serving = asyncio.ensure_future(endpoint.serve_endpoint(generate))
    await asyncio.sleep(0.2)
    if serving.done():
        serving.result()
    kwargs: dict[str, Any] = {"worker_type": worker(spec.get("worker_type") or "aggregated")}
    if spec.get("needs") is not None:
        kwargs["needs"] = [[worker(w) for w in alt] for alt in spec["needs"]]
    for name in ("kv_cache_block_size", "custom_template_path", "max_gpu_lora_count"):
        if spec.get(name) is not None:
            kwargs[name] = spec[name]
    if spec.get("lora_name") is not None:
        kwargs["lora_name"] = spec["lora_name"]
        kwargs["base_model_path"] = spec["model_path"]
    if spec.get("self_host_metadata") is not None:
        kwargs["self_host_metadata"] = spec["self_host_metadata"]
    if spec.get("runtime_config") is not None:
        kwargs["runtime_config"] = runtime_config(spec["runtime_config"])
    if spec.get("aliases"):
        kwargs["model_aliases"] = spec["aliases"]
    kwargs.update(router_kwargs(spec.get("router")))
    await core.register_model(
        getattr(core.ModelInput, spec["model_input"]),
        flags(spec["model_type"]),
        endpoint,
        spec["model_path"],
        spec["model_name"],
        **kwargs,
    )


async def mocker(drt: Any, spec: dict[str, Any], store: Path) -> None:
    """Start the runtime's mocker engine on the variant's endpoint until its card is written."""
    path = f"dyn://{spec['namespace']}.backend.generate"
    role = spec.get("worker_type")
    args = core.EntrypointArgs(
        core.EngineType.Mocker,
        model_path=spec["model_path"],
        model_name=spec["model_name"],
        endpoint_id=path,
        kv_cache_block_size=spec.get("kv_cache_block_size"),
        is_prefill=role == "prefill",
        is_decode=role == "decode",
    )
    engine = await core.make_engine(drt, args)
    running = asyncio.ensure_future(core.run_input(drt, path, engine))
    deadline = time.monotonic() + 20
    while not mdc_files(store, spec["namespace"]):
        if running.done():
            running.result()
            raise RuntimeError("the mocker stopped before writing its card")
        if time.monotonic() > deadline:
            raise RuntimeError("the mocker wrote no card within 20 s")
        await asyncio.sleep(0.1)


async def main(variants: list[dict[str, Any]], store: Path) -> None:
    drt = core.DistributedRuntime(asyncio.get_running_loop(), "file", "tcp")
    for spec in variants:
        try:
            if spec.get("engine") == "mocker":
                await mocker(drt, spec, store)
            else:
                await register(drt, spec)
            outcome = {"variant": spec["variant"], "written": True}
        except Exception as error:  # an old runtime refusing a variant is a finding, not a crash
            outcome = {"variant": spec["variant"], "written": False, "error": str(error)[:300]}
        print(json.dumps(outcome), flush=True)
    # Give the file store a moment to flush the last writes before the process leaves.
    await asyncio.sleep(0.5)
    print(json.dumps({"done": True}), flush=True)
    # The runtime keeps serving threads alive; leave without waiting for them.
    os._exit(0)


asyncio.run(main(json.loads(Path(sys.argv[1]).read_text()), Path(os.environ["DYN_FILE_KV"])))
