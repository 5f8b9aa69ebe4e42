"""Spans the facade emits: exact names, attribute keys, value types, events and links."""

from __future__ import annotations

import asyncio

import pytest
from opentelemetry import trace
from opentelemetry.trace import SpanKind, StatusCode
from telemetry_harness import Harness, make_harness
from workerset_admission.identity import EndpointId, GroupKey, WorkerType
from workerset_admission.ports import DiscoveryEntry, SourceDelete, SourceListing, SourcePut
from workerset_admission.telemetry import inject_headers
from workerset_admission.telemetry import names as n

GROUP = GroupKey.build("llama", EndpointId("ns", "backend", "generate"), "chat", WorkerType.DECODE)
KEY = "v1.mdc.ns.backend.generate.1a"


def put(key: str = KEY, revision: int = 7, **kwargs: object) -> SourcePut:
    return SourcePut(DiscoveryEntry(key=key, value=b"{}", revision=revision, **kwargs))  # type: ignore[arg-type]


def test_applying_a_put_makes_one_consumer_span_with_messaging_and_discovery_attributes(
    harness: Harness,
) -> None:
    with harness.telemetry.apply_update(put()) as update:
        update.record_decision("admitted", GROUP)

    (span,) = harness.finished()
    assert span.name == "apply discovery_update"
    assert span.kind is SpanKind.CONSUMER
    assert dict(span.attributes or {}) == {
        "messaging.system": "nats",
        "messaging.destination.name": "dynamo-discovery",
        "messaging.operation.type": "process",
        "workerset_admission.discovery.key": KEY,
        "workerset_admission.discovery.revision": 7,
        "workerset_admission.discovery.operation": "put",
        "workerset_admission.decision": "admitted",
        "workerset_admission.group": GROUP.id,
    }
    assert isinstance(span.attributes["workerset_admission.discovery.revision"], int)  # type: ignore[index]


def test_a_delete_span_names_the_removal_kind_and_the_bucket_given() -> None:
    other_bucket = make_harness(bucket="discovery-b")
    with other_bucket.telemetry.apply_update(
        SourceDelete(key=KEY, revision=9, operation="expired")
    ):
        pass
    (span,) = other_bucket.finished()
    assert span.attributes is not None
    assert span.attributes[n.ATTR_DISCOVERY_OPERATION] == "expired"
    assert span.attributes[n.ATTR_MESSAGING_DESTINATION] == "discovery-b"
    # Nothing was decided explicitly: the span says so by leaving the decision out.
    assert n.ATTR_DECISION not in span.attributes


def test_the_apply_span_links_to_the_publishers_span_carried_in_the_entry_headers(
    harness: Harness,
) -> None:
    publisher = harness.tracer_provider.get_tracer("worker")
    with publisher.start_as_current_span("register worker") as registering:
        headers = inject_headers()
    assert "traceparent" in headers

    with harness.telemetry.apply_update(put(headers=headers)):
        pass

    apply_span = harness.finished(n.SPAN_APPLY_UPDATE)[0]
    assert len(apply_span.links) == 1
    linked = apply_span.links[0].context
    assert linked.trace_id == registering.get_span_context().trace_id
    assert linked.span_id == registering.get_span_context().span_id
    # A link, not a parent: the frontend's decision is its own trace.
    assert apply_span.parent is None


def test_headers_without_valid_trace_context_give_no_link(harness: Harness) -> None:
    with harness.telemetry.apply_update(put(headers={"traceparent": "garbage", "x": "y"})):
        pass
    with harness.telemetry.apply_update(put(headers={"KV-Operation": "DEL"})):
        pass
    assert [len(s.links) for s in harness.finished()] == [0, 0]


def test_a_listing_gets_its_own_span_with_entry_count_reason_and_bounded_links(
    harness: Harness,
) -> None:
    tracer = harness.tracer_provider.get_tracer("worker")
    entries = []
    for i in range(40):
        with tracer.start_as_current_span("register worker"):
            entries.append(
                DiscoveryEntry(key=f"{KEY}{i}", value=b"", revision=i, headers=inject_headers())
            )
    with harness.telemetry.apply_update(SourceListing(entries, reason="reconnect")):
        pass

    (span,) = harness.finished(n.SPAN_APPLY_SNAPSHOT)
    assert span.attributes is not None
    assert span.attributes[n.ATTR_SNAPSHOT_ENTRIES] == 40
    assert span.attributes[n.ATTR_SNAPSHOT_REASON] == "reconnect"
    assert span.attributes[n.ATTR_DISCOVERY_OPERATION] == "snapshot"
    assert 1 <= len(span.links) <= 16


def test_spans_started_while_applying_are_children_of_the_apply_span(harness: Harness) -> None:
    with harness.telemetry.apply_update(put()) as update:
        harness.telemetry.group_committed(GROUP, "abc", 3)
    commit = harness.finished(n.SPAN_COMMIT)[0]
    assert commit.parent is not None
    assert commit.parent.span_id == update.span.get_span_context().span_id
    # And the apply span is no longer current once the block is left.
    assert not trace.get_current_span().get_span_context().is_valid


def test_an_exception_while_applying_marks_the_span_as_an_error_and_propagates(
    harness: Harness,
) -> None:
    with pytest.raises(KeyError), harness.telemetry.apply_update(put()):
        raise KeyError("boom")
    (span,) = harness.finished()
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes is not None
    assert span.attributes[n.ATTR_ERROR_TYPE] == "KeyError"
    assert span.attributes[n.ATTR_DECISION] == "error"
    assert [e.name for e in span.events] == ["exception"]


def test_an_invalid_record_is_an_event_on_the_apply_span(harness: Harness) -> None:
    with harness.telemetry.apply_update(put()) as update:
        update.invalid_record("identity_mismatch", "key names instance 1a, value 1b")
    (span,) = harness.finished()
    (event,) = span.events
    assert event.name == "workerset_admission.invalid_record"
    assert dict(event.attributes or {}) == {
        "workerset_admission.discovery.key": KEY,
        "workerset_admission.reason": "identity_mismatch",
        "workerset_admission.detail": "key names instance 1a, value 1b",
    }
    assert update.decision == "invalid"


def test_update_spans_can_be_switched_off_for_the_hot_path() -> None:
    quiet = make_harness(trace_updates=False)
    with quiet.telemetry.apply_update(put()) as update:
        update.record_decision("admitted", GROUP)
        assert not update.span.is_recording()
        quiet.telemetry.group_committed(GROUP, "abc", 1)
    # The commit span is still made; only the per-update span is skipped.
    assert [s.name for s in quiet.finished()] == [n.SPAN_COMMIT]


def test_a_build_attempt_span_carries_group_checksum_generation_attempt_and_outcome(
    harness: Harness,
) -> None:
    with harness.telemetry.build_attempt(GROUP, "c0ffee", generation=4, attempt=2):
        pass
    (span,) = harness.finished()
    assert span.name == "build worker_set"
    assert dict(span.attributes or {}) == {
        "workerset_admission.group": GROUP.id,
        "workerset_admission.mdc_checksum": "c0ffee",
        "workerset_admission.generation": 4,
        "workerset_admission.build.attempt": 2,
        "workerset_admission.build.outcome": "ok",
    }


def test_a_failing_build_records_failed_with_the_error_type(harness: Harness) -> None:
    with pytest.raises(TimeoutError), harness.telemetry.build_attempt(GROUP, "c0ffee", 5):
        raise TimeoutError
    (span,) = harness.finished()
    assert span.attributes is not None
    assert span.attributes[n.ATTR_BUILD_OUTCOME] == "failed"
    assert span.attributes[n.ATTR_ERROR_TYPE] == "TimeoutError"
    assert span.status.status_code is StatusCode.ERROR


def test_a_build_that_reports_failure_without_raising_can_say_so(harness: Harness) -> None:
    with harness.telemetry.build_attempt(GROUP, "c0ffee", 6) as build:
        build.set_outcome("failed", "TokenizerMissing")
    (span,) = harness.finished()
    assert span.attributes is not None
    assert span.attributes[n.ATTR_BUILD_OUTCOME] == "failed"
    assert span.attributes[n.ATTR_ERROR_TYPE] == "TokenizerMissing"


async def test_a_cancelled_build_is_cancelled_not_failed(harness: Harness) -> None:
    async def build() -> None:
        with harness.telemetry.build_attempt(GROUP, "c0ffee", 7):
            await asyncio.sleep(3600)

    task = asyncio.create_task(build())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    (span,) = harness.finished()
    assert span.attributes is not None
    assert span.attributes[n.ATTR_BUILD_OUTCOME] == "cancelled"
    assert n.ATTR_ERROR_TYPE not in span.attributes
    assert span.status.status_code is not StatusCode.ERROR


def test_commit_withdraw_and_succession_spans_have_their_names_and_typed_attributes(
    harness: Harness,
) -> None:
    harness.telemetry.group_committed(GROUP, "aaa", 1)
    harness.telemetry.group_withdrawn(GROUP, "aaa", 1)
    harness.telemetry.succession(GROUP, "aaa", "bbb", 1, 2)

    commit, withdraw, succeed = harness.finished()
    assert (commit.name, withdraw.name, succeed.name) == (
        "commit worker_set",
        "withdraw worker_set",
        "succeed worker_set",
    )
    assert dict(commit.attributes or {}) == {
        n.ATTR_GROUP: GROUP.id,
        n.ATTR_CHECKSUM: "aaa",
        n.ATTR_GENERATION: 1,
    }
    assert dict(withdraw.attributes or {}) == dict(commit.attributes or {})
    assert dict(succeed.attributes or {}) == {
        n.ATTR_GROUP: GROUP.id,
        "workerset_admission.succession.old_checksum": "aaa",
        "workerset_admission.succession.new_checksum": "bbb",
        "workerset_admission.succession.old_generation": 1,
        "workerset_admission.succession.new_generation": 2,
        "workerset_admission.drained": False,
    }


def test_drain_and_handover_spans_name_the_worker_who_drained_it_and_why_it_ended(
    harness: Harness,
) -> None:
    harness.telemetry.succession(GROUP, "aaa", "bbb", 1, 2, drained=True)
    harness.telemetry.worker_drained(GROUP, "ns/c/e/1a", "aaa", True, "preStop:pod/w-0")
    harness.telemetry.handover_ended(GROUP, "aaa", 1, "committed")
    succeed, drain, handover = harness.finished()
    assert (succeed.attributes or {})[n.ATTR_DRAINED] is True
    assert (drain.name, handover.name) == ("drain worker", "handover worker_set")
    assert dict(drain.attributes or {}) == {
        n.ATTR_GROUP: GROUP.id,
        n.ATTR_INSTANCE: "ns/c/e/1a",
        n.ATTR_CHECKSUM: "aaa",
        n.ATTR_DRAIN_BY: "preStop:pod/w-0",
    }
    assert dict(handover.attributes or {}) == {
        n.ATTR_GROUP: GROUP.id,
        n.ATTR_CHECKSUM: "aaa",
        n.ATTR_GENERATION: 1,
        n.ATTR_HANDOVER_REASON: "committed",
    }


def test_a_succession_with_no_successor_leaves_the_new_side_out(harness: Harness) -> None:
    harness.telemetry.succession(GROUP, "aaa", None, 1, None)
    (span,) = harness.finished()
    assert span.attributes is not None
    assert n.ATTR_NEW_CHECKSUM not in span.attributes
    assert n.ATTR_NEW_GENERATION not in span.attributes


def test_every_span_name_is_verb_then_object_and_every_custom_key_has_the_prefix() -> None:
    span_names = [getattr(n, name) for name in n.__all__ if name.startswith("SPAN_")]
    for name in span_names:
        verb, obj = name.split(" ")
        assert verb.isalpha()
        assert verb.islower()
        assert obj.replace("_", "").isalpha()
    semconv = {"messaging.system", "messaging.destination.name", "messaging.operation.type"}
    semconv.add("error.type")
    for name in n.__all__:
        value = getattr(n, name)
        if name.startswith(("ATTR_", "METRIC_", "EVENT_")):
            assert value in semconv or value.startswith("workerset_admission."), value
