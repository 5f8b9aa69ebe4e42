"""Hand-written fakes behind the service's Protocol ports, and a bounded wait for the loop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from typing import Any

from workerset_admission.admission import (
    CommitGroup,
    LoraProjectionChanged,
    OpenReceiver,
    PublishAdmissions,
    RetireReceiver,
    WithdrawGroup,
)
from workerset_admission.identity import EndpointId
from workerset_admission.ports import BuildRequest, DiscoveryEntry, SourceEvent, SourceListing

__all__ = [
    "FakeBuilder",
    "FakeClock",
    "FakePublisher",
    "FakeSource",
    "GroupsPublisher",
    "LiveInstanceSet",
    "handle_all",
    "settle",
]


class FakeSource:
    """Events pushed by the test; ``list_all`` returns whatever the test set as the bucket."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[SourceEvent | None] = asyncio.Queue()
        self.listing: list[DiscoveryEntry] = []
        self.listing_gate = asyncio.Event()
        self.listing_gate.set()
        self.list_calls = 0
        self.closed = False

    async def events(self) -> AsyncIterator[SourceEvent]:
        while True:
            event = await self.queue.get()
            if event is None:
                return
            yield event

    async def list_all(self) -> SourceListing:
        self.list_calls += 1
        listing = tuple(self.listing)  # read when the listing starts, like a real bucket scan
        await self.listing_gate.wait()
        return SourceListing(listing, reason="periodic")

    async def close(self) -> None:
        self.closed = True
        self.queue.put_nowait(None)


class FakeBuilder:
    """Builds finish when the test says so; ``fail_next`` makes attempts raise."""

    def __init__(self, *, hold: bool = False) -> None:
        self.hold = hold
        self.requests: list[BuildRequest] = []
        self.release = asyncio.Event()
        self.fail_next = 0
        self.cancelled = 0

    async def build(self, request: BuildRequest) -> object:
        self.requests.append(request)
        try:
            if self.hold:
                await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        if self.fail_next:
            self.fail_next -= 1
            raise RuntimeError("metadata download failed")
        return ("pipeline", request.generation)


class FakePublisher:
    def __init__(self) -> None:
        self.records: dict[str, tuple[str, ...]] = {}
        self.capability = False
        self.withdrawn = False
        self.settled = 0
        self.calls = 0
        self.republished = 0

    async def publish_members(
        self, worker_namespace: str, members: Any, *, groups: Any = None
    ) -> None:
        self.calls += 1
        self.records[worker_namespace] = tuple(members)

    async def publish_capability(self, resynced_at: float | None = None) -> None:
        self.capability = True
        self.resynced_at = resynced_at

    async def republish(self) -> None:
        self.republished += 1

    async def withdraw_all(self) -> None:
        self.withdrawn = True
        self.records.clear()

    async def settle(self) -> int:
        self.settled += 1
        return 0


class GroupsPublisher(FakePublisher):
    """A publisher that also takes the per-group details the rollout gate reads."""

    def __init__(self) -> None:
        super().__init__()
        self.groups: dict[str, Any] = {}

    async def publish_members(
        self, worker_namespace: str, members: Any, *, groups: Any = None
    ) -> None:
        await super().publish_members(worker_namespace, members)
        self.groups[worker_namespace] = groups


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def settle(condition: Any, timeout: float = 5.0) -> None:
    """Yield to the loop until ``condition()`` holds (bounded)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition never held")
        await asyncio.sleep(0.005)


class LiveInstanceSet:
    """A fake ``LiveInstances``: the live ids per endpoint, set by the test."""

    __slots__ = ("_live",)

    def __init__(self) -> None:
        self._live: dict[EndpointId, set[int]] = {}

    def add(self, endpoint: EndpointId, instance_id: int) -> None:
        self._live.setdefault(endpoint, set()).add(instance_id)

    def remove(self, endpoint: EndpointId, instance_id: int) -> None:
        ids = self._live.get(endpoint)
        if ids is not None:
            ids.discard(instance_id)
            if not ids:
                del self._live[endpoint]

    def live_ids(self, endpoint: EndpointId) -> frozenset[int]:
        return frozenset(self._live.get(endpoint, ()))


# The typed method of the channels or the bindings that carries each effect, as the step's
# table has it (the step calls the bindings through the builds).
_METHOD_OF: dict[type, str] = {
    OpenReceiver: "open",
    PublishAdmissions: "publish",
    LoraProjectionChanged: "project",
    RetireReceiver: "retire",
    CommitGroup: "commit",
    WithdrawGroup: "withdraw",
}


def handle_all(handler: Any, effects: Iterable[object]) -> None:
    """Give ``handler`` (channels or bindings) the effects of one core step it carries, in order."""
    for effect in effects:
        name = _METHOD_OF.get(type(effect))
        method = None if name is None else getattr(handler, name, None)
        if method is not None:
            method(effect)
