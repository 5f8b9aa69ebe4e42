"""The admitted hop against the real Dynamo 1.6.1 runtime: file discovery, in-process workers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from workerset_admission.adapters.dynamo.hop import AdmittedHop
from workerset_admission.admission import (
    AdmissionCore,
    BuildFinished,
    Input,
    StartBuild,
    WorkerAdded,
    WorkerRemoved,
)
from workerset_admission.errors import NoRoutableInstance, ReceiverRetired
from workerset_admission.identity import (
    EndpointId,
    GroupKey,
    Registration,
    WorkerType,
    instance_key,
)
from workerset_admission.receivers import AdmissionChannels, AdmissionReceiver

pytestmark = [pytest.mark.dynamo, pytest.mark.integration]

runtime = pytest.importorskip(
    "dynamo.runtime",
    reason="the Dynamo tests need ai-dynamo-runtime==1.6.1 (pip install ai-dynamo-runtime==1.6.1)",
)

ENDPOINT = EndpointId("hopns", "backend", "generate")
GROUP = GroupKey.build("hop-model", ENDPOINT, "chat|completions", WorkerType.AGGREGATED)
OLD = "1" * 64
NEW = "2" * 64


@pytest.fixture
def file_discovery(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point every runtime this test creates at a private file store, on loopback only."""
    store = tmp_path / "kv"
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("DYN_FILE_KV", str(store))
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setenv("DYN_TCP_RPC_HOST", "127.0.0.1")
    monkeypatch.setenv("DYN_TCP_RESPONSE_STREAM_HOST", "127.0.0.1")
    monkeypatch.setenv("DYN_EVENT_PLANE_HOST", "127.0.0.1")
    return store


class _Admission:
    """The real core and admission channels, with every build succeeding at once."""

    def __init__(self) -> None:
        self.core = AdmissionCore()
        self.channels = AdmissionChannels()

    def apply(self, event: Input) -> None:
        pending = [event]
        while pending:
            effects = self.core.apply(pending.pop(0))
            self.channels.handle_all(effects)
            pending.extend(
                BuildFinished(e.group, e.mdc_checksum, e.generation, ok=True)
                for e in effects
                if isinstance(e, StartBuild)
            )

    def add(self, instance_id: int, checksum: str) -> None:
        self.apply(
            WorkerAdded(
                Registration(
                    key=instance_key(ENDPOINT, instance_id),
                    endpoint=ENDPOINT,
                    instance_id=instance_id,
                    model_suffix=None,
                    group=GROUP,
                    mdc_checksum=checksum,
                    lora_fingerprint="",
                    worker_type=WorkerType.AGGREGATED,
                    needs=(),
                )
            )
        )

    def remove(self, instance_id: int) -> None:
        self.apply(WorkerRemoved(instance_key(ENDPOINT, instance_id)))

    def receiver(self) -> AdmissionReceiver:
        receiver = self.channels.subscribe(GROUP)
        assert receiver is not None
        return receiver


async def _start_worker(stack: list[Any]) -> int:
    """One in-process worker: its own runtime (so its own instance id) serving the endpoint."""
    loop = asyncio.get_running_loop()
    drt = runtime.DistributedRuntime(loop, "file", "tcp")
    endpoint = drt.endpoint(f"{ENDPOINT.namespace}.{ENDPOINT.component}.{ENDPOINT.endpoint}")
    instance_id = endpoint.connection_id()

    async def handler(request: Any, context: Any = None) -> AsyncIterator[dict[str, int]]:
        yield {"served_by": instance_id}

    stack.append((drt, asyncio.ensure_future(endpoint.serve_endpoint(handler))))
    return int(instance_id)


async def _served_by(hop: AdmittedHop, requests: int) -> set[int]:
    seen: set[int] = set()
    for _ in range(requests):
        async for item in await hop.generate({"prompt": "x"}, annotated=False):
            seen.add(item["served_by"])
    return seen


async def _wait_until(condition: Any) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    while not condition():
        assert loop.time() < deadline, "discovery did not converge within 20 s"
        await asyncio.sleep(0.05)


async def test_hop_routes_to_admitted_instances_across_membership_change_and_succession(
    file_discovery: Path,
) -> None:
    stack: list[Any] = []
    frontend = runtime.DistributedRuntime(asyncio.get_running_loop(), "file", "tcp")
    try:
        a, b, c = [await _start_worker(stack) for _ in range(3)]
        client = await frontend.endpoint(
            f"{ENDPOINT.namespace}.{ENDPOINT.component}.{ENDPOINT.endpoint}"
        ).client()
        await _wait_until(lambda: {a, b, c} <= set(client.instance_ids()))
        admission = _Admission()
        admission.add(a, OLD)
        admission.add(b, OLD)
        admission.add(c, NEW)  # live, but a rejected cohort
        hop = AdmittedHop(client, admission.receiver(), role=WorkerType.AGGREGATED)
        first_generation = hop.generation

        assert await _served_by(hop, 12) == {a, b}

        # A compatible membership change: b's card is gone (its endpoint still serves).
        admission.remove(b)
        assert await _served_by(hop, 12) == {a}
        assert hop.generation == first_generation

        # The last incumbent leaves: c's cohort succeeds it under a fresh receiver.
        admission.remove(a)
        with pytest.raises(ReceiverRetired):
            await hop.generate({"prompt": "x"})
        next_hop = await AdmittedHop.connect(frontend, admission.receiver())
        await _wait_until(lambda: next_hop.routable() == (c,))
        assert next_hop.generation > first_generation
        assert await _served_by(next_hop, 6) == {c}

        # Admitted but no longer live: refused, never widened to the live instances.
        stack[2][0].shutdown()
        await _wait_until(lambda: c not in client.instance_ids())
        with pytest.raises(NoRoutableInstance):
            await next_hop.generate({"prompt": "x"})
    finally:
        for drt, serving in stack:
            drt.shutdown()
            serving.cancel()
        frontend.shutdown()
