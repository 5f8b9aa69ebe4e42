"""The admission publisher's coalescing, retry, withdrawal and heartbeat, over a small fake bucket.

The fake bucket is an older one (a max age, no per-key TTLs) unless a test asks for per-key
TTLs: then liveness is the heartbeat and content is written when it changes.
"""

from __future__ import annotations

import asyncio
import json
import logging
from types import SimpleNamespace
from typing import Any

import pytest
from nats.errors import MaxPayloadError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import (
    APIError,
    KeyNotFoundError,
    KeyValueLimitMarkerTTLNotSupportedError,
    NotFoundError,
)
from support.aio import eventually
from workerset_admission.adapters.nats.admission_publisher import (
    NatsAdmissionPublisher,
    admission_keys,
    heartbeat_key,
)
from workerset_admission.ports import AdmissionPublisher


class FakeKV:
    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.writes: list[tuple[str, str]] = []
        self.failures = 0
        # Keys whose writes the server never answers (a refused publish), and the largest
        # payload it takes (nats-py refuses a larger one before sending it).
        self.unanswered: set[str] = set()
        self.max_payload = 1024 * 1024
        self.revisions: dict[str, int] = {}
        self.ttls: dict[str, float | None] = {}
        self.sequence = 0

    async def put(self, key: str, value: bytes, ttl: float | None = None) -> int:
        if len(value) > self.max_payload:
            raise MaxPayloadError
        if key in self.unanswered:
            await asyncio.sleep(0.5)
            raise NatsTimeoutError
        if self.failures:
            self.failures -= 1
            raise ConnectionError("bucket unreachable")
        self.data[key] = value
        self.writes.append(("put", key))
        self.sequence += 1
        self.revisions[key] = self.sequence
        self.ttls[key] = ttl
        return self.sequence

    async def delete(self, key: str) -> bool:
        self.data.pop(key, None)
        self.revisions.pop(key, None)
        self.writes.append(("delete", key))
        return True

    async def get(self, key: str) -> Any:
        if key not in self.data:
            raise KeyNotFoundError
        return SimpleNamespace(key=key, value=self.data[key], revision=self.revisions[key])


class FakeJetStream:
    def __init__(self, per_key_ttl: bool = False) -> None:
        self.kv = FakeKV()
        self.created: list[Any] = []
        self.per_key_ttl = per_key_ttl

    async def stream_info(self, name: str) -> Any:
        raise NotFoundError

    async def create_key_value(self, config: Any) -> FakeKV:
        if config.limit_marker_ttl is not None and not self.per_key_ttl:
            raise KeyValueLimitMarkerTTLNotSupportedError  # an older server
        self.created.append(config)
        return self.kv

    async def publish(
        self,
        subject: str,
        payload: bytes,
        headers: dict[str, str] | None = None,
        msg_ttl: float | None = None,
    ) -> Any:
        key = subject.split(".", 2)[2]  # $KV.<bucket>.<key>
        last = (headers or {}).get("Nats-Expected-Last-Subject-Sequence")
        if last is not None and self.kv.revisions.get(key, 0) != int(last):
            raise APIError(err_code=10071, description="wrong last sequence")
        return SimpleNamespace(seq=await self.kv.put(key, payload, msg_ttl))

    async def key_value(self, name: str) -> FakeKV:
        if not self.created:
            raise NotFoundError
        return self.kv

    def wipe(self) -> None:
        """The store loses the bucket: writes fail until it is created again."""
        self.created.clear()
        self.kv = FakeKV()


def publisher(js: FakeJetStream, **kwargs: Any) -> NatsAdmissionPublisher:
    kwargs.setdefault("min_interval", 0.01)
    kwargs.setdefault("retry_interval", 0.01)
    return NatsAdmissionPublisher(js, "fe/1", bucket="adm", **kwargs)  # type: ignore[arg-type]


def test_it_satisfies_the_admission_publisher_port() -> None:
    assert isinstance(publisher(FakeJetStream()), AdmissionPublisher)


def test_keys_escape_the_frontend_and_namespace_and_name_the_frontend() -> None:
    capability, member = admission_keys("fe/1")
    assert capability == "v1.fe=2F1.capability"
    assert member("ns.a") == "v1.fe=2F1.members.ns=2Ea"


async def test_a_burst_of_changes_is_written_once_with_the_last_state() -> None:
    js = FakeJetStream()
    pub = publisher(js, min_interval=60.0)
    for n in range(1, 51):
        await pub.publish_members("ns", [f"ns/c/e/{i:x}" for i in range(n)])
    await asyncio.wait_for(pub.flushed(), 5)
    key = admission_keys("fe/1")[1]("ns")
    assert js.kv.writes == [("put", key)]
    record = json.loads(js.kv.data[key])
    assert record["protocol"] == "v1"
    assert record["frontend"] == "fe/1"
    assert len(record["members"]) == 50
    assert record["members"] == sorted(record["members"])
    assert js.created[0].bucket == "adm"
    await pub.withdraw_all()


async def test_an_unchanged_record_is_not_written_again() -> None:
    js = FakeJetStream()
    pub = publisher(js)
    await pub.publish_members("ns", ["ns/c/e/1"])
    await asyncio.wait_for(pub.flushed(), 5)
    await pub.publish_members("ns", ["ns/c/e/1"])
    await asyncio.wait_for(pub.flushed(), 5)
    assert len(js.kv.writes) == 1
    await pub.withdraw_all()


async def test_a_failed_write_is_retried_until_it_lands() -> None:
    js = FakeJetStream()
    js.kv.failures = 3
    pub = publisher(js)
    await pub.publish_capability()
    await asyncio.wait_for(pub.flushed(), 5)
    capability = admission_keys("fe/1")[0]
    assert json.loads(js.kv.data[capability]) == {
        "protocol": "v1",
        "capability": True,
        "frontend": "fe/1",
        "liveness": "heartbeat",
    }
    # The heartbeat is written before the rest of its round, and retried with it.
    await eventually(lambda: heartbeat_key("fe/1") in js.kv.data, "the heartbeat written")
    assert json.loads(js.kv.data[heartbeat_key("fe/1")]) == {
        "protocol": "v1",
        "frontend": "fe/1",
        "heartbeat": True,
    }
    await pub.withdraw_all()


async def test_withdrawal_deletes_every_record_and_ignores_later_changes() -> None:
    js = FakeJetStream()
    pub = publisher(js)
    await pub.publish_capability()
    await pub.publish_members("a", ["a/c/e/1"])
    await pub.publish_members("b", ["b/c/e/2"])
    await asyncio.wait_for(pub.flushed(), 5)
    assert len(js.kv.data) == 4  # two namespaces, the capability and the heartbeat
    await pub.withdraw_all()
    assert js.kv.data == {}
    await pub.publish_members("c", ["c/c/e/3"])
    await asyncio.sleep(0.05)
    assert js.kv.data == {}


async def test_an_emptied_namespace_loses_its_record() -> None:
    js = FakeJetStream()
    pub = publisher(js)
    await pub.publish_members("a", ["a/c/e/1"])
    await asyncio.wait_for(pub.flushed(), 5)
    await pub.publish_members("a", [])
    await asyncio.wait_for(pub.flushed(), 5)
    assert js.kv.data == {}
    assert js.kv.writes[-1][0] == "delete"
    await pub.withdraw_all()


def _held_group(held: list[str]) -> dict[str, Any]:
    return {
        "model": "m",
        "worker_set": "ws",
        "checksum": "A",
        "generation": 3,
        "members": [],
        "held": held,
    }


async def test_a_namespace_whose_group_holds_workers_it_does_not_serve_keeps_its_record() -> None:
    js = FakeJetStream()
    pub = publisher(js)
    member = admission_keys("fe/1")[1]
    await pub.publish_members("a", ["a/c/e/1"])
    await asyncio.wait_for(pub.flushed(), 5)
    # The tenure is held after an outage, and nobody on it is served any more.
    await pub.publish_members("a", [], groups=[_held_group(["a/c/e/1"])])
    await asyncio.wait_for(pub.flushed(), 5)
    record = json.loads(js.kv.data[member("a")])
    assert record["members"] == []
    assert record["groups"] == [_held_group(["a/c/e/1"])]
    # The hold ended (or gave up): nothing is held, and the record is withdrawn.
    await pub.publish_members("a", [], groups=[_held_group([])])
    await asyncio.wait_for(pub.flushed(), 5)
    assert member("a") not in js.kv.data
    assert js.kv.writes[-1] == ("delete", member("a"))
    await pub.withdraw_all()


async def test_a_record_of_held_workers_only_too_large_is_withdrawn_not_marked() -> None:
    js = FakeJetStream()
    js.kv.max_payload = 2000
    pub = publisher(js)
    member = admission_keys("fe/1")[1]
    await pub.publish_members("a", ["a/c/e/1"])
    await asyncio.wait_for(pub.flushed(), 5)
    held = [f"a/c/e/{'x' * 100}{n}" for n in range(30)]
    await pub.publish_members("a", [], groups=[_held_group(held)])
    await asyncio.wait_for(pub.flushed(), 5)
    # A marker would read as "may route to any worker of a": this frontend routes to none.
    assert member("a") not in js.kv.data
    await pub.withdraw_all()


async def test_after_a_failed_write_the_bucket_is_made_again_and_every_record_rewritten() -> None:
    js = FakeJetStream()
    pub = publisher(js, replicas=3)
    await pub.publish_capability()
    await pub.publish_members("ns1", ["ns1/c/e/1"])
    await pub.publish_members("ns2", ["ns2/c/e/2"])
    await asyncio.wait_for(pub.flushed(), 5)
    old = js.kv
    js.wipe()
    old.failures = 1  # the publisher still holds the old bucket: its next write fails
    await pub.publish_members("ns1", ["ns1/c/e/1", "ns1/c/e/3"])
    await asyncio.wait_for(pub.flushed(), 5)
    capability, member = admission_keys("fe/1")
    assert set(js.kv.data) == {capability, member("ns1"), member("ns2"), heartbeat_key("fe/1")}
    assert [c.replicas for c in js.created] == [3]
    await pub.withdraw_all()
    assert js.kv.data == {}


async def test_republish_writes_every_record_again() -> None:
    js = FakeJetStream()
    pub = publisher(js)
    await pub.publish_capability()
    await pub.publish_members("ns", ["ns/c/e/1"])
    await asyncio.wait_for(pub.flushed(), 5)
    js.kv.data.clear()  # another frontend re-created the bucket empty
    await pub.republish()
    await asyncio.wait_for(pub.flushed(), 5)
    assert set(js.kv.data) == {
        admission_keys("fe/1")[0],
        admission_keys("fe/1")[1]("ns"),
        heartbeat_key("fe/1"),
    }
    await pub.withdraw_all()


async def test_withdrawing_from_a_bucket_that_is_gone_is_quiet_and_creates_nothing() -> None:
    js = FakeJetStream()
    pub = publisher(js, retry_interval=60.0)
    await pub.publish_members("ns", ["ns/c/e/1"])
    await asyncio.wait_for(pub.flushed(), 5)
    js.created.clear()
    pub._kv = None  # as after a failed write
    await pub.withdraw_all()
    assert js.created == []


async def test_a_record_the_bucket_lost_behind_its_back_is_written_again_by_the_audit() -> None:
    js = FakeJetStream()
    pub = publisher(js, audit_interval=0.05)
    await pub.publish_capability()
    await pub.publish_members("ns", ["ns/c/e/1"])
    await asyncio.wait_for(pub.flushed(), 5)
    capability, member = admission_keys("fe/1")
    written = dict(js.kv.data)

    del js.kv.data[member("ns")]
    js.kv.data[capability] = b"overwritten"
    await eventually(
        lambda: js.kv.data.get(member("ns")) == written[member("ns")], "the members written again"
    )
    assert js.kv.data[member("ns")] == written[member("ns")]
    await eventually(lambda: js.kv.data[capability] == written[capability], "capability again")
    await pub.close()


async def test_records_are_refreshed_on_time_even_while_other_records_keep_changing() -> None:
    js = FakeJetStream()
    pub = publisher(js, record_ttl=0.3, audit_interval=None)
    _capability, member = admission_keys("fe/1")
    await pub.publish_members("steady", ["ns/c/e/1"])
    await asyncio.wait_for(pub.flushed(), 5)
    first = js.kv.writes.count(("put", member("steady")))

    # A change every 20 ms, for ten refresh periods (0.1 s each).
    for n in range(50):
        await pub.publish_members("busy", [f"ns/c/e/{n:x}"])
        await asyncio.sleep(0.02)

    assert js.kv.writes.count(("put", member("steady"))) - first >= 5
    await pub.close()


async def test_a_record_too_large_for_the_server_is_marked_said_by_key_and_delays_no_other(
    caplog: pytest.LogCaptureFixture,
) -> None:
    js = FakeJetStream()
    js.kv.max_payload = 2000
    pub = publisher(js)
    _capability, member = admission_keys("fe/1")
    await pub.publish_members("ns-a", ["ns-a/c/e/1"])
    await pub.publish_members("ns-b", ["ns-b/c/e/1"])
    await asyncio.wait_for(pub.flushed(), 5)
    assert set(js.kv.data) == {member("ns-a"), member("ns-b")}

    caplog.set_level(logging.DEBUG, logger="workerset_admission.adapters.nats.admission_publisher")
    huge = [f"ns-a/c/e/{'x' * 100}{n}" for n in range(30)]
    await pub.publish_members("ns-a", huge)
    await pub.publish_members("ns-b", ["ns-b/c/e/1", "ns-b/c/e/2"])
    await asyncio.wait_for(pub.flushed(), 5)
    # ns-b's change landed; ns-a's older record, which no longer holds, is replaced by a
    # marker saying a record could not be published (a drain reads it as not confirmed).
    assert json.loads(js.kv.data[member("ns-b")])["members"] == ["ns-b/c/e/1", "ns-b/c/e/2"]
    marker = json.loads(js.kv.data[member("ns-a")])
    assert marker["members"] == []
    assert marker["unpublished"] > 2000
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert member("ns-a") in warnings[0]
    assert "more than the NATS server takes" in warnings[0]

    # Not tried again until it changes: other rounds write only what changed.
    writes = len(js.kv.writes)
    await pub.publish_members("ns-b", ["ns-b/c/e/1"])
    await asyncio.wait_for(pub.flushed(), 5)
    assert js.kv.writes[writes:] == [("put", member("ns-b"))]
    await pub.publish_members("ns-a", ["ns-a/c/e/1"])
    await asyncio.wait_for(pub.flushed(), 5)
    assert json.loads(js.kv.data[member("ns-a")])["members"] == ["ns-a/c/e/1"]
    await pub.withdraw_all()


async def test_a_key_the_server_never_answers_delays_no_other_and_is_retried_alone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    js = FakeJetStream()
    pub = publisher(js, retry_interval=0.2)
    _capability, member = admission_keys("fe/1")
    js.kv.unanswered.add(member("ns-a"))
    caplog.set_level(logging.DEBUG, logger="workerset_admission.adapters.nats.admission_publisher")
    loop = asyncio.get_running_loop()
    started = loop.time()
    await pub.publish_members("ns-b", ["ns-b/c/e/1"])
    await pub.publish_members("ns-c", ["ns-c/c/e/1"])
    await pub.publish_members("ns-a", ["ns-a/c/e/1"])
    await eventually(lambda: member("ns-c") in js.kv.data, "ns-c published")
    await eventually(lambda: pub._retry_at is not None, "ns-a's write has failed")
    assert member("ns-b") in js.kv.data
    # Written together: the unanswered key held back neither (its timeout is 0.5 s).
    assert loop.time() - started < 1.0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert member("ns-a") in warnings[0]

    js.kv.unanswered.clear()
    await eventually(lambda: member("ns-a") in js.kv.data, "ns-a published once answered")
    # Only ns-a was written again: the others had not changed.
    assert js.kv.writes.count(("put", member("ns-b"))) == 1
    assert js.kv.writes.count(("put", member("ns-c"))) == 1
    assert any("works again" in r.getMessage() for r in caplog.records)
    await pub.withdraw_all()


async def test_with_per_key_ttls_a_frontend_at_rest_writes_only_its_heartbeat() -> None:
    js = FakeJetStream(per_key_ttl=True)
    pub = publisher(js, record_ttl=0.3, content_ttl=3600.0, audit_interval=None)
    capability, member = admission_keys("fe/1")
    beat = heartbeat_key("fe/1")
    await pub.publish_capability()
    await pub.publish_members("ns", ["ns/c/e/1"])
    await asyncio.wait_for(pub.flushed(), 5)
    assert pub.leased
    assert js.created[0].ttl is None  # no max age: the heartbeat's TTL is what ages a frontend
    assert js.kv.ttls == {beat: 0.3, capability: 3600.0, member("ns"): 3600.0}
    assert json.loads(js.kv.data[member("ns")])["liveness"] == "heartbeat"
    before = len(js.kv.writes)

    await asyncio.sleep(1.0)  # ten heartbeat periods at rest

    at_rest = js.kv.writes[before:]
    assert set(at_rest) == {("put", beat)}
    assert 6 <= len(at_rest) <= 11
    await pub.withdraw_all()
    assert js.kv.data == {}


async def test_with_per_key_ttls_a_lost_heartbeat_has_every_record_written_again() -> None:
    js = FakeJetStream(per_key_ttl=True)
    pub = publisher(js, record_ttl=60.0, audit_interval=0.05)
    await pub.publish_capability()
    await pub.publish_members("ns", ["ns/c/e/1"])
    await asyncio.wait_for(pub.flushed(), 5)
    written = dict(js.kv.data)

    js.kv.data.clear()  # the bucket was re-created empty behind the frontend's back
    js.kv.revisions.clear()
    await eventually(lambda: js.kv.data == written, "every record written again")
    await pub.withdraw_all()


async def test_with_per_key_ttls_a_heartbeat_overwritten_elsewhere_is_taken_for_a_lost_bucket() -> (
    None
):
    js = FakeJetStream(per_key_ttl=True)
    pub = publisher(js, record_ttl=0.15, audit_interval=None)
    _capability, member = admission_keys("fe/1")
    await pub.publish_capability()
    await pub.publish_members("ns", ["ns/c/e/1"])
    await asyncio.wait_for(pub.flushed(), 5)
    await js.kv.put(heartbeat_key("fe/1"), b"{}")  # a newer revision this frontend did not write
    del js.kv.data[member("ns")]
    # The next heartbeat names the revision it wrote last, fails, and everything is rewritten.
    await eventually(lambda: member("ns") in js.kv.data, "the members written again")
    await pub.withdraw_all()


async def test_a_view_that_outlives_the_writer_is_leased_and_a_stop_leaves_what_it_routes_by() -> (
    None
):
    js = FakeJetStream(per_key_ttl=True)
    pub = publisher(js, record_ttl=0.3, content_ttl=3600.0, audit_interval=None, view_outlives=2.0)
    capability, member = admission_keys("fe/1")
    beat = heartbeat_key("fe/1")
    await pub.publish_capability()
    await pub.publish_members("ns", ["ns/c/e/1"])
    await asyncio.wait_for(pub.flushed(), 5)
    # The lease: the view's life and two rewrites of it (a tenth of 2 s, at least a beat).
    assert pub.lease_every == pytest.approx(0.2)
    assert pub.routes_for == pytest.approx(2.4)
    assert json.loads(js.kv.data[capability])["routes_for"] == pytest.approx(2.4)
    assert json.loads(js.kv.data[beat])["view_outlives"] == 2.0
    assert js.kv.ttls[capability] == pytest.approx(2.4)
    before = len(js.kv.writes)

    await asyncio.sleep(1.0)  # the lease is written again at the beat after each is due
    at_rest = js.kv.writes[before:]
    assert set(at_rest) == {("put", beat), ("put", capability)}
    assert at_rest.count(("put", capability)) >= 2

    writes = len(js.kv.writes)
    await pub.withdraw_all()
    # A stop writes the lease afresh, deletes the heartbeat, and leaves the namespace record.
    assert js.kv.writes[writes:] == [("put", capability), ("delete", beat)]
    assert set(js.kv.data) == {capability, member("ns")}


async def test_without_a_view_a_stop_withdraws_every_record_as_before() -> None:
    js = FakeJetStream(per_key_ttl=True)
    pub = publisher(js, record_ttl=0.3, audit_interval=None)
    capability, _member = admission_keys("fe/1")
    await pub.publish_capability()
    await pub.publish_members("ns", ["ns/c/e/1"])
    await asyncio.wait_for(pub.flushed(), 5)
    assert pub.routes_for is None
    assert "routes_for" not in json.loads(js.kv.data[capability])
    await pub.withdraw_all()
    assert js.kv.data == {}


async def test_a_lease_the_bucket_stops_taking_is_overdue_by_what_passed_beyond_one_rewrite() -> (
    None
):
    js = FakeJetStream(per_key_ttl=True)
    pub = publisher(js, record_ttl=0.3, content_ttl=3600.0, audit_interval=None, view_outlives=2.0)
    assert pub.lease_overdue() is None  # nothing leased yet: the view is not bounded by it
    await pub.publish_capability()
    await asyncio.wait_for(pub.flushed(), 5)
    assert pub.lease_every == pytest.approx(0.2)
    assert pub.lease_overdue() == 0.0

    async def cut_off(*args: Any, **kwargs: Any) -> Any:
        raise NatsTimeoutError

    js.publish = cut_off  # type: ignore[method-assign]
    await asyncio.sleep(0.8)
    overdue = pub.lease_overdue()
    # The last lease went out at most one rewrite before the cut; a rewrite and a beat are allowed.
    assert overdue is not None
    assert 0.4 <= overdue <= 1.0
    del js.publish  # the bucket answers again: the next beat renews the lease
    await eventually(lambda: pub.lease_overdue() == 0.0, "the lease renewed")
    await pub.withdraw_all()
