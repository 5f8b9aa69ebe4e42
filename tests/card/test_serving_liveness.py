"""A frontend's liveness is its heartbeat: content records outlive it and count only beside one."""

from __future__ import annotations

import json

import pytest
from workerset_admission.card.serving_record import (
    CapabilityRecord,
    NamespaceRecord,
    live_records,
    parse_record,
)
from workerset_admission.errors import InvalidRecordError


def _members(frontend: str, *, leased: bool) -> NamespaceRecord:
    value: dict[str, object] = {
        "protocol": "v1",
        "frontend": frontend,
        "namespace": "ns",
        "members": ["ns/c/e/1"],
    }
    if leased:
        value["liveness"] = "heartbeat"
    record = parse_record(f"v1.{frontend}.members.ns", json.dumps(value).encode())
    assert isinstance(record, NamespaceRecord)
    return record


def _heartbeat(frontend: str) -> CapabilityRecord:
    value = {"protocol": "v1", "frontend": frontend, "heartbeat": True}
    record = parse_record(f"v1.{frontend}.heartbeat", json.dumps(value).encode())
    assert isinstance(record, CapabilityRecord)
    return record


def test_a_heartbeat_decodes_as_the_frontends_presence() -> None:
    beat = _heartbeat("fe-a")
    assert (beat.frontend, beat.heartbeat, beat.leased, beat.resynced_at) == (
        "fe-a",
        True,
        True,
        None,
    )


def test_a_heartbeat_under_another_frontends_key_is_refused() -> None:
    value = {"protocol": "v1", "frontend": "fe-a", "heartbeat": True}
    with pytest.raises(InvalidRecordError) as refused:
        parse_record("v1.fe-b.heartbeat", json.dumps(value).encode())
    assert refused.value.reason == "identity_mismatch"


def test_content_of_a_leased_frontend_counts_only_beside_its_heartbeat() -> None:
    live, stopped = _members("fe-a", leased=True), _members("fe-b", leased=True)
    beat = _heartbeat("fe-a")
    assert live_records([live, stopped, beat]) == [live, beat]


def test_an_older_writers_records_count_while_they_are_in_the_bucket() -> None:
    older = _members("fe-old", leased=False)
    assert live_records([older]) == [older]


def test_a_content_record_reads_the_same_to_a_reader_that_ignores_liveness() -> None:
    record = _members("fe-a", leased=True)
    assert (record.frontend, record.namespace, record.members, record.groups) == (
        "fe-a",
        "ns",
        ("ns/c/e/1",),
        None,
    )
