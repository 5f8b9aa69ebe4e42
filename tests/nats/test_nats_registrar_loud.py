"""The registrar's heartbeat says what failed and goes on; nothing ends it quietly but close."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import pytest
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import APIError
from support.aio import eventually
from workerset_admission.adapters.nats import registrar as registrar_module
from workerset_admission.adapters.nats.registrar import WorkerRegistrar

_EXPECTED = "Nats-Expected-Last-Subject-Sequence"


class FakeStream:
    """The discovery bucket's stream: revisions per key, conditional writes, injected failures."""

    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}
        self.revisions: dict[str, int] = {}
        self.sequence = 0
        self.refreshes = 0
        self.failing_reads = 0
        self.bad_acks = 0

    async def publish(
        self,
        subject: str,
        payload: bytes,
        headers: dict[str, str] | None = None,
        msg_ttl: float | None = None,
    ) -> Any:
        last = (headers or {}).get(_EXPECTED)
        if last is not None:
            if self.bad_acks:
                self.bad_acks -= 1
                raise TypeError("an acknowledgement without a sequence")  # a defect, not an outage
            if self.revisions.get(subject) != int(last):
                raise APIError(err_code=10071, description="wrong last sequence")
            self.refreshes += 1
        self.sequence += 1
        self.values[subject] = payload
        self.revisions[subject] = self.sequence
        return SimpleNamespace(seq=self.sequence)

    async def get_last_msg(self, stream: str, subject: str) -> Any:
        if self.failing_reads:
            self.failing_reads -= 1
            raise NatsTimeoutError
        return SimpleNamespace(data=self.values[subject], headers=None, seq=self.revisions[subject])

    def ack_lost(self, subject: str) -> None:
        """A write of the registrar's own landed whose acknowledgement it never got."""
        self.sequence += 1
        self.revisions[subject] = self.sequence


def _registrar(stream: FakeStream) -> WorkerRegistrar:
    return WorkerRegistrar(
        stream,  # type: ignore[arg-type]
        bucket="disc",
        ttl=1.0,
        heartbeat=0.02,
        create_bucket=False,
        trace_context=False,
    )


def _heartbeats() -> list[asyncio.Task[object]]:
    return [
        t
        for t in asyncio.all_tasks()
        if t.get_name().startswith("discovery heartbeat") and not t.done()
    ]


async def test_a_refusal_whose_reason_cannot_be_read_is_said_and_the_heartbeat_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stream = FakeStream()
    registrar = _registrar(stream)
    await registrar.put("v1.instances.ns.c.e.1", b"{}")
    subject = "$KV.disc.v1.instances.ns.c.e.1"
    await eventually(lambda: stream.refreshes >= 1, "a first refresh")
    # The next refresh is refused (a write of its own whose ack was lost), and the reading
    # that finds out why times out twice.
    stream.failing_reads = 2
    stream.ack_lost(subject)
    before = stream.refreshes
    with caplog.at_level(logging.WARNING, logger=registrar_module.__name__):
        await eventually(lambda: stream.refreshes > before, "refreshes again", timeout=5)
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert (
        said.count(
            "refreshing v1.instances.ns.c.e.1 was refused and why cannot be read now: timed out; "
            "it is kept and refreshed again at the next beat"
        )
        == 2
    ), said
    # Kept, found to be its own, and refreshed over the revision it now knows.
    assert registrar.keys == {"v1.instances.ns.c.e.1"}
    assert registrar.lost == {}
    assert registrar.heartbeat_failures == 0
    await registrar.close(withdraw=False)
    assert _heartbeats() == []


async def test_a_defect_in_the_heartbeat_is_said_and_the_heartbeat_starts_again(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(registrar_module, "_RESTART_AFTER", 0.01)
    stream = FakeStream()
    registrar = _registrar(stream)
    await registrar.put("v1.instances.ns.c.e.1", b"{}")
    stream.bad_acks = 1
    with caplog.at_level(logging.WARNING, logger=registrar_module.__name__):
        await eventually(lambda: registrar.heartbeat_failures == 1, "the failure said")
        before = stream.refreshes
        await eventually(lambda: stream.refreshes > before, "refreshes again", timeout=5)
    said = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.getMessage() for r in said] == [
        "discovery heartbeat disc failed: TypeError('an acknowledgement without a sequence'); "
        "the registrations stay as last written until the heartbeat runs again, and starts it "
        "again in 0.01 s"
    ]
    assert registrar.keys == {"v1.instances.ns.c.e.1"}
    await registrar.close()
    assert _heartbeats() == []
    assert stream.values["$KV.disc.v1.instances.ns.c.e.1"] == b""  # withdrawn at close
