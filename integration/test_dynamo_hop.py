"""The admitted hop against the real Dynamo 1.6.1 runtime: file discovery, in-process workers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from workerset_admission.adapters.dynamo.hop import AdmittedHop
from workerset_admission.errors import NoRoutableInstance, ReceiverRetired
from workerset_admission.identity import EndpointId, GroupKey, WorkerType

pytestmark = [pytest.mark.dynamo, pytest.mark.integration]

runtime = pytest.importorskip(
    "dynamo.runtime",
    reason="the Dynamo tests need ai-dynamo-runtime==1.6.1 (pip install ai-dynamo-runtime==1.6.1)",
)

ENDPOINT = EndpointId("hopns", "backend", "generate")
GROUP = GroupKey.build("hop-model", ENDPOINT, "chat|completions", WorkerType.AGGREGATED)


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


@dataclass(frozen=True, slots=True)
class _Binding:
    group: GroupKey
    generation: int
    admitted: Collection[int]


class _Receiver:
    """Stands in for a binding's receiver: a settable current value, retired for good."""

    def __init__(self, generation: int, admitted: Collection[int]) -> None:
        self.value = _Binding(GROUP, generation, tuple(admitted))
        self.retired = False

    def current(self) -> _Binding:
        if self.retired:
            raise ReceiverRetired(GROUP.id)
        return self.value


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
        first = _Receiver(generation=1, admitted=[a, b])
        hop = AdmittedHop(client, first, role=WorkerType.AGGREGATED)

        assert await _served_by(hop, 12) == {a, b}

        # A compatible membership change: the same hop, same generation, new admitted set.
        first.value = _Binding(GROUP, 1, (a, c))
        assert await _served_by(hop, 12) == {a, c}
        assert hop.generation == 1

        # Succession: the old binding is retired, the successor admits only b.
        first.retired = True
        successor = _Receiver(generation=2, admitted=[b])
        next_hop = await AdmittedHop.connect(frontend, successor)
        await _wait_until(lambda: next_hop.routable() == (b,))

        with pytest.raises(ReceiverRetired):
            await hop.generate({"prompt": "x"})
        assert await _served_by(next_hop, 6) == {b}

        # Admitted but no longer live: refused, never widened to the live instances.
        successor.value = _Binding(GROUP, 2, (0xDEAD,))
        with pytest.raises(NoRoutableInstance):
            await next_hop.generate({"prompt": "x"})
    finally:
        for drt, serving in stack:
            drt.shutdown()
            serving.cancel()
        frontend.shutdown()
