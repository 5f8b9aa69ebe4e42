"""Event-plane records (event sources and channels): keys, values, and what the boundary refuses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from workerset_admission.adapters.dynamo.bridge import bucket_key_for
from workerset_admission.adapters.dynamo.filestore import scan_file_store
from workerset_admission.card import (
    EventKey,
    decode_event_record,
    event_kv_key,
    is_event_key,
    parse_event_key,
)
from workerset_admission.card.events import dynamo_event_path, parse_dynamo_event_path
from workerset_admission.errors import InvalidRecordError
from workerset_admission.ports import DiscoveryEntry, SourcePut
from workerset_admission.service.admission_service import AdmissionService, CardRecordDecoder

WORKER = 6931318943588571538
PUBLISHER = 2659330722633680
SCOPE = {
    "kind": "endpoint",
    "endpoint": {"namespace": "pns", "component": "backend", "name": "generate"},
}

# As a `python -m dynamo.mocker` (1.6.1) registered them, with DYN_EVENT_PLANE=nats.
SOURCE: dict[str, Any] = {
    "type": "EventSource",
    "scope": SCOPE,
    "topic": "kv-events",
    "publisher_id": PUBLISHER,
    "metadata": {
        "kv_state_endpoint": {"namespace": "pns", "component": "backend", "name": "generate"},
        "worker": {"worker_id": WORKER, "dp_rank": 0},
        "publisher_id": PUBLISHER,
    },
}
CHANNEL: dict[str, Any] = {
    "type": "EventChannel",
    "scope": SCOPE,
    "topic": "kv-events",
    "instance_id": PUBLISHER,
    "transport": {
        "kind": "Nats",
        "config": {"subject_prefix": "namespace.pns.component.backend.endpoint.generate"},
    },
}
SOURCE_KEY = (
    "v1.event_sources.namespace.pns.component.backend.endpoint.generate"
    f".topic.kv-events.{PUBLISHER:x}"
)
CHANNEL_KEY = SOURCE_KEY.replace("event_sources", "event_channels")


def _bytes(value: dict[str, Any]) -> bytes:
    return json.dumps(value).encode()


def test_event_keys_mirror_dynamo_paths_with_the_design_escaping() -> None:
    key = EventKey("event_sources", "p.ns", "back end", "generate", "kv-events", PUBLISHER)

    text = event_kv_key(key)

    assert text == (
        "v1.event_sources.namespace.p=2Ens.component.back=20end.endpoint.generate"
        f".topic.kv-events.{PUBLISHER:x}"
    )
    assert parse_event_key(text) == key
    assert is_event_key(text)
    assert not is_event_key("v1.mdc.ns.backend.generate.1")


def test_namespace_and_component_scopes_have_keys_too() -> None:
    for key in (
        EventKey("event_channels", "ns", None, None, "t", 1),
        EventKey("event_channels", "ns", "comp", None, "t", 2),
    ):
        assert parse_event_key(event_kv_key(key)) == key
        assert parse_dynamo_event_path(key.bucket, dynamo_event_path(key)) == key


@pytest.mark.parametrize(
    "key",
    [
        "v1.event_sources.namespace.ns.topic.t",
        "v1.event_sources.namespace.ns.topic.t.00ab",
        "v1.event_sources.namespace.ns.endpoint.ep.topic.t.1",
        "v1.event_sources.space.ns.topic.t.1",
        "v1.event_sources.namespace.n=2es.topic.t.1",
        "v1.event_things.namespace.ns.topic.t.1",
    ],
)
def test_malformed_event_keys_are_refused_as_bad_keys(key: str) -> None:
    with pytest.raises(InvalidRecordError) as caught:
        parse_event_key(key)
    assert caught.value.reason == "bad_key"


def test_a_source_names_its_worker_and_a_channel_its_transport() -> None:
    source = decode_event_record(parse_event_key(SOURCE_KEY), _bytes(SOURCE))
    channel = decode_event_record(parse_event_key(CHANNEL_KEY), _bytes(CHANNEL))

    assert source.worker_id == WORKER
    assert source.key.publisher_id == PUBLISHER
    assert channel.worker_id is None
    assert channel.transport == CHANNEL["transport"]


def _refusal(key: str, value: dict[str, Any] | bytes) -> str:
    raw = value if isinstance(value, bytes) else _bytes(value)
    with pytest.raises(InvalidRecordError) as caught:
        decode_event_record(parse_event_key(key), raw)
    return caught.value.reason


def test_records_that_disagree_with_their_key_or_are_malformed_are_refused_with_a_reason() -> None:
    assert _refusal(SOURCE_KEY, {**SOURCE, "publisher_id": 7}) == "identity_mismatch"
    assert _refusal(SOURCE_KEY, {**SOURCE, "topic": "other"}) == "identity_mismatch"
    other_scope = {"kind": "namespace", "name": "pns"}
    assert _refusal(SOURCE_KEY, {**SOURCE, "scope": other_scope}) == "identity_mismatch"
    assert _refusal(SOURCE_KEY, {**SOURCE, "type": "EventChannel"}) == "wrong_record_type"
    assert _refusal(SOURCE_KEY, {**SOURCE, "scope": "pns"}) == "invalid_record"
    bad_worker = {**SOURCE, "metadata": {"worker": {"worker_id": -1}}}
    assert _refusal(SOURCE_KEY, bad_worker) == "invalid_record"
    assert _refusal(CHANNEL_KEY, {**CHANNEL, "transport": None}) == "invalid_record"
    assert _refusal(CHANNEL_KEY, b"{not json") == "invalid_json"
    assert _refusal(CHANNEL_KEY, b"\xff") == "invalid_utf8"
    with pytest.raises(InvalidRecordError) as caught:
        decode_event_record(parse_event_key(CHANNEL_KEY), _bytes(CHANNEL), max_value_size=16)
    assert caught.value.reason == "value_too_large"


def test_a_source_without_worker_metadata_is_valid_but_names_no_worker() -> None:
    record = decode_event_record(parse_event_key(SOURCE_KEY), _bytes({**SOURCE, "metadata": {}}))
    assert record.worker_id is None


def test_event_files_of_the_store_become_bucket_keys(tmp_path: Path) -> None:
    bucket = tmp_path / "v1" / "event_sources"
    bucket.mkdir(parents=True)
    name = (
        "namespace%2Fpns%2Fcomponent%2Fbackend%2Fendpoint%2Fgenerate%2Ftopic%2Fkv%2Devents"
        f"%2F{PUBLISHER:x}"
    )
    (bucket / name).write_bytes(_bytes(SOURCE))
    (bucket / "namespace%2Fpns").write_bytes(b"too short")

    scan = scan_file_store(tmp_path)

    assert [bucket_key_for(r) for r in scan.records] == [SOURCE_KEY]
    assert [s.reason for s in scan.skipped] == ["bad_path_shape"]


async def test_the_service_reports_a_bad_event_record_and_keeps_it_out_of_admission() -> None:
    class _Quiet:
        def events(self) -> Any:
            raise NotImplementedError

        async def list_all(self) -> Any:
            raise NotImplementedError

        async def close(self) -> None:
            return None

    service = AdmissionService(_Quiet(), decoder=CardRecordDecoder())
    good = SourcePut(DiscoveryEntry(SOURCE_KEY, _bytes(SOURCE), 1))
    bad = SourcePut(DiscoveryEntry(CHANNEL_KEY, _bytes({**CHANNEL, "instance_id": 9}), 2))

    service.handle_event(good)
    service.handle_event(bad)

    assert [(r.key, r.reason) for r in service.recent_invalid] == [
        (CHANNEL_KEY, "identity_mismatch")
    ]
    assert list(service.core.groups()) == []
    assert len(service.liveness) == 0


def test_replay_lists_a_refused_event_record_and_ignores_a_valid_one() -> None:
    from workerset_admission.traces.replay import replay

    trace = [
        {"kind": "put", "key": SOURCE_KEY, "value": SOURCE},
        {"kind": "put", "key": CHANNEL_KEY, "value": {**CHANNEL, "topic": "kv_metrics"}},
        {"kind": "delete", "key": "v1.event_channels.namespace.ns.topic"},
    ]

    result = replay(json.dumps(line) for line in trace)

    assert result.invalid == [
        (CHANNEL_KEY, "identity_mismatch"),
        ("v1.event_channels.namespace.ns.topic", "bad_key"),
    ]
    assert list(result.core.groups()) == []
