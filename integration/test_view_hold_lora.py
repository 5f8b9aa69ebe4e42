"""A held tenure keeps its workers' LoRA adapter cards in the view beside their base cards.

A real nats-server and a real ``serve --view-dir`` (registration TTL 3 s): one worker registers
its base card, one LoRA adapter and its endpoint record, refreshed by a heartbeat, and the view
holds all three. Then the worker's heartbeat stalls and the server is killed: while the outage
lasts and after the server is back, the tenure is held and the worker is served on its last
known records for one registration TTL: its adapter card with its base card, never one without
the other.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from natsfixture import NatsServer
from support.cards import base_card, lora_card
from support.fleet import admin
from support.serve_process import ServeProcess
from workerset_admission.adapters.nats.registrar import WorkerRegistrar
from workerset_admission.identity import EndpointId

pytestmark = [pytest.mark.integration, pytest.mark.rollout, pytest.mark.timeout(120)]

DISCOVERY = "dynamo-discovery"
ADMISSION = "frontend-model-admission"
EP = EndpointId("hold-lora", "backend", "generate")
WORKER = 0x10
ADAPTER = "my-lora"
TTL = 3.0


def cards_in(view: Path) -> set[str]:
    """The names of the model card files the view holds for the worker."""
    mdc = view / "v1" / "mdc"
    if not mdc.is_dir():
        return set()
    worker = f"{WORKER:x}"
    return {p.name for p in mdc.iterdir() if p.is_file() and worker in p.name}


def base_and_adapter(names: set[str]) -> tuple[bool, bool]:
    """Whether the names hold the worker's base card, and its adapter's card."""
    suffix = "%2F" + ADAPTER.replace("-", "%2D")
    return any(not n.endswith(suffix) for n in names), any(n.endswith(suffix) for n in names)


async def until(condition: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout:g} s")
        await asyncio.sleep(0.1)


async def test_a_held_workers_adapter_card_stays_in_the_view_beside_its_base_card(
    nats_server_fn: NatsServer, tmp_path: Path
) -> None:
    handle = nats_server_fn.handle
    assert handle is not None
    url = nats_server_fn.url
    view = tmp_path / "view"
    view.mkdir()
    process = ServeProcess(
        [
            *("--nats-server", url, "--view-dir", str(view)),
            *("--discovery-bucket", DISCOVERY, "--admission-bucket", ADMISSION),
            *("--frontend-id", "fe-lora", "--registration-ttl", str(TTL)),
        ],
        view_dir=view,
    )
    try:
        async with admin(url) as nc:
            worker = WorkerRegistrar(
                nc.jetstream(timeout=2), bucket=DISCOVERY, ttl=TTL, on_removed="reregister"
            )
            await worker.register_endpoint(EP, WORKER)
            await worker.register(EP, WORKER, base_card(16))
            await worker.register(EP, WORKER, lora_card(ADAPTER), suffix=ADAPTER)
            await until(lambda: base_and_adapter(cards_in(view)) == (True, True), 60, "both cards")
            served = cards_in(view)
            assert len(served) == 2, served

            # The worker's heartbeat stalls and the server dies: nobody can refresh anything.
            await worker.stop_heartbeat()
            await asyncio.to_thread(handle.stop, kill=True)
            killed = time.monotonic()
            samples = []
            while time.monotonic() - killed < 6.0:
                samples.append(cards_in(view))
                await asyncio.sleep(0.2)
            assert all(names == served for names in samples), samples

            # The server comes back once the worker's records ran out: the resync lists none of
            # them, and the hold serves the worker on its last known records for one TTL, its
            # adapter included.
            await asyncio.to_thread(handle.start)
            await asyncio.to_thread(process.wait_for_line, "holding the tenure", 30)
            held = time.monotonic()
            samples = []
            while time.monotonic() - held < TTL - 1.0:
                samples.append(cards_in(view))
                await asyncio.sleep(0.2)
            assert samples
            assert all(names == served for names in samples), samples
            # Once the TTL is over with the worker not back, it leaves, both cards together.
            await until(lambda: not cards_in(view), 10, "the worker's cards leave")
            await worker.close()
    finally:
        process.stop()
