"""The admission publisher says what failed at WARNING, keeps what it wrote, and stops whole."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest
from nats.errors import TimeoutError as NatsTimeoutError
from support.aio import eventually
from test_nats_admission_publisher import FakeJetStream, FakeKV, publisher
from workerset_admission.adapters.nats import admission_publisher as module
from workerset_admission.adapters.nats.admission_publisher import admission_keys, heartbeat_key


def _own_tasks() -> list[asyncio.Task[object]]:
    return [
        t
        for t in asyncio.all_tasks()
        if t.get_name().startswith("admission-publisher") and not t.done()
    ]


class UnwatchableKV(FakeKV):
    async def watch(self, keys: str, **_options: Any) -> Any:
        raise NatsTimeoutError


class NoServerTime(FakeJetStream):
    def __init__(self) -> None:
        super().__init__(per_key_ttl=True)
        self.kv = UnwatchableKV()

    async def get_msg(self, stream: str, seq: int) -> Any:
        raise NatsTimeoutError


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


async def test_an_unreadable_resync_time_and_an_unwatchable_bucket_are_said_and_kept_going(
    caplog: pytest.LogCaptureFixture,
) -> None:
    js = NoServerTime()
    pub = publisher(js)
    with caplog.at_level(logging.WARNING, logger=module.__name__):
        await pub.publish_capability(resynced_at=1234.5)
        await pub.publish_members("ns", ["ns/c/e/1"])
        await asyncio.wait_for(pub.flushed(), 5)
        await eventually(lambda: len(_warnings(caplog)) >= 2, "both failures said")
    assert sorted(_warnings(caplog)) == [
        "cannot read the server's time of the resync record (TimeoutError()); the record says "
        "the resync by this host's clock, and the next one that says it is read again",
        "cannot watch this frontend's own serving records (TimeoutError()); the heartbeat's "
        "audit still finds a lost bucket, and the watch is tried again with the next binding",
    ]
    capability, member = admission_keys("fe/1")
    record = json.loads(js.kv.data[capability])
    assert record["resynced_at"] == 1234.5
    assert "resynced_server_at" not in record
    assert json.loads(js.kv.data[member("ns")])["members"] == ["ns/c/e/1"]
    assert heartbeat_key("fe/1") in js.kv.data
    await pub.withdraw_all()
    assert _own_tasks() == []


class DefectOnce(FakeKV):
    def __init__(self) -> None:
        super().__init__()
        self.defects = 1

    async def put(self, key: str, value: bytes, ttl: float | None = None) -> int:
        if self.defects and ".members." in key:
            self.defects -= 1
            raise KeyError("a defect, not an outage")
        return await super().put(key, value, ttl)


async def test_a_writer_that_fails_on_a_defect_is_said_started_again_and_writes_what_is_owed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    js = FakeJetStream()
    js.kv = DefectOnce()
    pub = publisher(js)
    with caplog.at_level(logging.WARNING, logger=module.__name__):
        await pub.publish_members("ns", ["ns/c/e/1"])
        await asyncio.wait_for(pub.flushed(), 5)
    said = _warnings(caplog)
    assert said == [
        "admission-publisher fe/1 failed: KeyError('a defect, not an outage'); the records "
        "written so far stay, and what changed is written once it runs, and starts it again "
        "in 0.01 s"
    ]
    member = admission_keys("fe/1")[1]
    assert json.loads(js.kv.data[member("ns")])["members"] == ["ns/c/e/1"]
    await pub.withdraw_all()
    assert _own_tasks() == []
    assert js.kv.data == {}
