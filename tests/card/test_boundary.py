"""Discovery boundary: keys, record decoding, normalization, agreement rules."""

from __future__ import annotations

import json

import pytest
from workerset_admission.card import (
    BoundarySettings,
    decode_endpoint_record,
    decode_model_record,
    encode_endpoint_record,
    encode_model_record,
    endpoint_kv_key,
    escape_token,
    mdcsum,
    model_kv_key,
    parse_key,
    unescape_token,
)
from workerset_admission.card.boundary import decode_whole_record
from workerset_admission.card.card_facts import MAX_NAME_CHARS
from workerset_admission.errors import REFUSAL_REASONS, CardDecodeError, InvalidRecordError
from workerset_admission.identity import EndpointId, WorkerType

EP = EndpointId("ns1", "workers", "generate")


def card(**changes: object) -> dict[str, object]:
    base: dict[str, object] = {
        "display_name": "org/model",
        "slug": "org_model",
        "model_info": None,
        "tokenizer": None,
        "kv_cache_block_size": 16,
        "migration_limit": 0,
        "model_type": "Chat|Completions",
        "model_input": "Tokens",
        "worker_type": "decode",
        "needs": [["prefill"]],
    }
    for name, value in changes.items():
        if value is None and name.startswith("drop_"):
            base.pop(name[5:], None)
        else:
            base[name] = value
    return base


def decode(
    value: object,
    suffix: str | None = None,
    instance: int = 0xABC,
    settings: BoundarySettings | None = None,
):  # type: ignore[no-untyped-def]
    return decode_model_record(parse_key(model_kv_key(EP, instance, suffix)), value, settings)  # type: ignore[arg-type]


@pytest.mark.parametrize("text", ["ns", "a.b", "ü", "x y", "=", "a-b_c", "Ünï/☃"])
def test_escaped_tokens_round_trip(text: str) -> None:
    token = escape_token(text)
    assert all((c.isalnum() and c.isascii()) or c in "_-=" for c in token)
    assert unescape_token(token) == text


@pytest.mark.parametrize("token", ["=41", "=2e", "a=2", "=zz", "a.b", "", "=C3"])
def test_non_canonical_or_malformed_tokens_are_refused(token: str) -> None:
    with pytest.raises(InvalidRecordError) as info:
        unescape_token(token)
    assert info.value.reason == "bad_key"


def test_model_and_endpoint_keys_parse_back_to_their_parts() -> None:
    endpoint = EndpointId("dgd.v2", "work ers", "gen")
    parsed = parse_key(model_kv_key(endpoint, 0x694D9A1B, "my-lora"))
    assert (parsed.kind, parsed.endpoint, parsed.instance_id, parsed.model_suffix) == (
        "model",
        endpoint,
        0x694D9A1B,
        "my-lora",
    )
    assert parsed.instance_key == "dgd.v2/work ers/gen/694d9a1b/my-lora"
    live = parse_key(endpoint_kv_key(endpoint, 7))
    assert (live.kind, live.instance_id, live.model_suffix) == ("endpoint", 7, None)


@pytest.mark.parametrize(
    "key",
    [
        "v1.mdc.ns.c.e.0abc",
        "v1.mdc.ns.c.e.ABC",
        "v1.mdc.ns.c.e.xyz",
        "v1.mdc.ns.c.e.12345678901234567",
        "v1.mdc.ns.c.e",
        "v1.mdc.ns.c.e.1.s.t",
        "v1.instances.ns.c.e.1.lora",
        "v2.mdc.ns.c.e.1",
        "v1.mdc.n=2es.c.e.1",
        "v1.mdc..c.e.1",
    ],
)
def test_malformed_keys_are_refused(key: str) -> None:
    with pytest.raises(InvalidRecordError):
        parse_key(key)


def test_a_record_decodes_to_a_registration_with_dynamo_identity() -> None:
    value = encode_model_record(EP, 0xABC, card())
    reg = decode(value)
    assert reg is not None
    assert reg.key == "ns1/workers/generate/abc"
    assert reg.group.worker_set == '["ns1","workers","generate","chat|completions","decode"]'
    assert reg.group.model == "org/model"
    assert reg.mdc_checksum == mdcsum(json.dumps(card()))
    assert reg.worker_type is WorkerType.DECODE
    assert reg.needs == ((WorkerType.PREFILL,),)


def test_the_same_record_as_text_bytes_and_mapping_gives_the_same_registration() -> None:
    value = encode_model_record(EP, 0xABC, card())
    as_bytes, as_text, as_map = decode(value), decode(value.decode()), decode(json.loads(value))
    assert as_bytes == as_text == as_map


def test_a_cached_card_still_checks_each_records_identity() -> None:
    decode(encode_model_record(EP, 1, card()), instance=1)
    other = encode_model_record(EndpointId("ns1", "workers", "other"), 1, card())
    with pytest.raises(InvalidRecordError) as info:
        decode(other, instance=1)
    assert info.value.reason == "identity_mismatch"


def test_a_value_claiming_another_instance_is_refused() -> None:
    with pytest.raises(InvalidRecordError) as info:
        decode(encode_model_record(EP, 0xDEF, card()))
    assert info.value.reason == "identity_mismatch"


def test_lora_suffix_and_card_lora_must_agree() -> None:
    with pytest.raises(InvalidRecordError) as info:
        decode(encode_model_record(EP, 0xABC, card(), suffix="my-lora"), suffix="my-lora")
    assert info.value.reason == "lora_mismatch"
    adapter = card(display_name="my-lora", slug="my-lora", lora={"name": "my-lora"})
    reg = decode(encode_model_record(EP, 0xABC, adapter, suffix="my-lora"), suffix="my-lora")
    assert reg is not None
    assert reg.is_lora
    assert reg.key.endswith("/abc/my-lora")


def test_lora_fingerprint_changes_without_changing_the_checksum() -> None:
    one = card(display_name="a", lora={"name": "a", "max_gpu_lora_count": 2})
    two = card(display_name="a", lora={"name": "a", "max_gpu_lora_count": 4})
    r1 = decode(encode_model_record(EP, 1, one, "a"), "a", 1)
    r2 = decode(encode_model_record(EP, 1, two, "a"), "a", 1)
    assert r1 is not None
    assert r2 is not None
    assert r1.mdc_checksum == r2.mdc_checksum
    assert r1.lora_fingerprint != r2.lora_fingerprint


def test_legacy_prefill_cards_gain_worker_type_and_needs_before_hashing() -> None:
    legacy = card(model_type="Prefill", drop_worker_type=None, drop_needs=None)
    modern = card(model_type="Prefill", worker_type="prefill", needs=[["decode"]])
    reg_legacy, reg_modern = (
        decode(encode_model_record(EP, 1, legacy), instance=1),
        decode(encode_model_record(EP, 2, modern), instance=2),
    )
    assert reg_legacy is not None
    assert reg_modern is not None
    assert reg_legacy.mdc_checksum == reg_modern.mdc_checksum
    assert reg_legacy.group.worker_set.endswith('"prefill","prefill"]')
    assert mdcsum(json.dumps(legacy)) != reg_legacy.mdc_checksum


def test_untyped_cards_are_aggregated() -> None:
    reg = decode(
        encode_model_record(EP, 1, card(drop_worker_type=None, drop_needs=None)), instance=1
    )
    assert reg is not None
    assert reg.worker_type is None
    assert reg.effective_worker_type is WorkerType.AGGREGATED


def test_tokenizer_overrides_reach_the_card_but_not_the_checksum() -> None:
    value = encode_model_record(EP, 1, card())
    plain = decode(value, instance=1)
    forced = decode(value, instance=1, settings=BoundarySettings(tokenizer_backend="fastokens"))
    assert plain is not None
    assert forced is not None
    assert forced.card.runtime_config["tokenizer_backend"] == "fastokens"
    assert plain.card.runtime_config["tokenizer_backend"] is None
    assert plain.mdc_checksum == forced.mdc_checksum


@pytest.mark.parametrize(
    ("settings", "namespace", "kept"),
    [
        (BoundarySettings(), "anything", True),
        (BoundarySettings(namespace="dynamo"), "anything", True),
        (BoundarySettings(namespace="ns1"), "ns1", True),
        (BoundarySettings(namespace="ns1"), "ns10", False),
        (BoundarySettings(namespace_prefix="dgd"), "dgdx", True),
        (BoundarySettings(namespace_prefix="dgd", prefix_strict=True), "dgdx", False),
        (BoundarySettings(namespace_prefix="dgd", prefix_strict=True), "dgd-v2", True),
        (BoundarySettings(namespace_prefix="dgd", prefix_strict=True), "dgd", True),
    ],
)
def test_the_namespace_filter_drops_other_namespaces(
    settings: BoundarySettings, namespace: str, kept: bool
) -> None:
    endpoint = EndpointId(namespace, "c", "e")
    value = encode_model_record(endpoint, 1, card())
    reg = decode_model_record(parse_key(model_kv_key(endpoint, 1)), value, settings)
    assert (reg is not None) is kept


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"display_name": ""}, "invalid_card_shape"),
        (
            {"model_type": "Prefill", "worker_type": "prefill", "model_input": "Text"},
            "invalid_card_shape",
        ),
        ({"model_input": "Tensor"}, "invalid_card_shape"),
        ({"kv_cache_block_size": -0.0}, "invalid_type"),
        ({"slug": "Bad.Slug"}, "invalid_slug"),
    ],
)
def test_cards_with_a_bad_shape_are_refused_with_a_reason(
    changes: dict[str, object], reason: str
) -> None:
    with pytest.raises(CardDecodeError) as info:
        decode(encode_model_record(EP, 1, card(**changes)), instance=1)
    assert info.value.reason == reason


# Shapes the real 1.6.1 frontend builds a WorkerSet for (the full table is checked against a
# running frontend in integration/test_frontend_shapes.py).
@pytest.mark.parametrize(
    ("model_input", "model_type", "worker_type"),
    [
        ("Tokens", "Embedding|Pooling", "aggregated"),
        ("Tokens", "Chat|Pooling", "aggregated"),
        ("Tokens", "Completions|Classify", "aggregated"),
        ("Tokens", "Embedding|Classify|Pooling", "aggregated"),
        ("Tokens", "Chat|Completions|Embedding|Pooling", "decode"),
        ("Tokens", "Chat|Images", "aggregated"),
        ("Tokens", "Completions|Videos", "aggregated"),
        ("Tokens", "Embedding|Rerank", "aggregated"),
        ("Tokens", "Chat|Prefill", "aggregated"),
        ("Tensor", "TensorBased|Chat", "aggregated"),
        ("Text", "Classify", "aggregated"),
        ("Tokens", "TensorBased", "prefill"),
        ("Tokens", "Images", "prefill"),
        ("Text", "", "aggregated"),
        ("Tensor", "", "decode"),
    ],
)
def test_the_boundary_admits_every_shape_the_frontend_builds(
    model_input: str, model_type: str, worker_type: str
) -> None:
    value = card(model_input=model_input, model_type=model_type, worker_type=worker_type)
    assert decode(encode_model_record(EP, 1, value), instance=1) is not None


@pytest.mark.parametrize(
    ("model_input", "model_type", "worker_type"),
    [
        ("Tokens", "Images", "aggregated"),
        ("Tokens", "Pooling|Classify|Rerank", "aggregated"),
        ("Tokens", "Prefill", "aggregated"),
        ("Tokens", "TensorBased", "decode"),
        ("Tensor", "Chat|Embedding", "aggregated"),
        ("Text", "Chat", "prefill"),
        ("Tensor", "TensorBased|Prefill", None),
        ("Text", "", "encode"),
    ],
)
def test_the_boundary_refuses_every_shape_the_frontend_refuses(
    model_input: str, model_type: str, worker_type: str | None
) -> None:
    value = card(model_input=model_input, model_type=model_type, worker_type=worker_type)
    if worker_type is None:
        value.pop("worker_type")
        value["needs"] = []
    with pytest.raises(CardDecodeError) as info:
        decode(encode_model_record(EP, 1, value), instance=1)
    assert info.value.reason == "invalid_card_shape"


@pytest.mark.parametrize(
    "value",
    [
        b"\xff\xfe",
        b"not json",
        b"[]",
        b'{"type":"Endpoint"}',
        b'{"type":"Model","type":"Model"}',
        b'{"type":"Model","namespace":"ns1","component":"workers","endpoint":"generate","instance_id":2748}',
        b'{"type":"Model","namespace":"ns1","component":"workers","endpoint":"generate","instance_id":2748,"card_json":{},"x":1e400}',
    ],
)
def test_bad_values_raise_a_typed_error_and_nothing_else(value: bytes) -> None:
    with pytest.raises((InvalidRecordError, CardDecodeError)):
        decode(value)


def test_values_over_the_size_limit_are_refused() -> None:
    value = encode_model_record(EP, 1, card(user_data="x" * 2000))
    with pytest.raises(InvalidRecordError) as info:
        decode(value, instance=1, settings=BoundarySettings(max_value_size=1000))
    assert info.value.reason == "value_too_large"


def test_duplicate_envelope_fields_are_refused_but_card_duplicates_keep_the_last() -> None:
    text = encode_model_record(EP, 1, card()).decode()
    doubled = text.replace(
        '"kv_cache_block_size":16', '"kv_cache_block_size":8,"kv_cache_block_size":16'
    )
    reg = decode(doubled, instance=1)
    assert reg is not None
    assert reg.mdc_checksum == mdcsum(json.dumps(card()))
    with pytest.raises(InvalidRecordError):
        decode(
            text.replace('"component":"workers"', '"component":"workers","component":"workers"'),
            instance=1,
        )


def test_record_depth_counts_the_envelope() -> None:
    ok = encode_model_record(EP, 1, card(user_data=json.loads("[" * 125 + "]" * 125)))
    too_deep = encode_model_record(EP, 1, card(user_data=json.loads("[" * 126 + "]" * 126)))
    assert decode(ok, instance=1) is not None
    with pytest.raises((InvalidRecordError, CardDecodeError)):
        decode(too_deep, instance=1)


def test_endpoint_records_decode_and_must_agree_with_their_key() -> None:
    key = parse_key(endpoint_kv_key(EP, 5))
    record = decode_endpoint_record(
        key, encode_endpoint_record(EP, 5, {"tcp": "127.0.0.1:1/x"}, "cuda")
    )
    assert (record.instance_id, record.device_type, record.instance_key) == (
        5,
        "cuda",
        "ns1/workers/generate/5",
    )
    with pytest.raises(InvalidRecordError):
        decode_endpoint_record(key, encode_endpoint_record(EP, 6))


def test_the_card_cache_stays_within_its_byte_budget() -> None:
    from workerset_admission.card.fast.card_cache import _FactsCache

    cache = _FactsCache(max_entries=100, max_bytes=1000)
    error = CardDecodeError("x")
    for index in range(50):
        cache.put((b"c" * 100 + bytes([index]), (None, None, "1.6")), error)
    assert cache.size <= 1000
    assert len(cache.entries) == cache.size // 101
    assert cache.get((b"c" * 100 + bytes([49]), (None, None, "1.6"))) is error
    assert cache.get((b"c" * 100 + bytes([0]), (None, None, "1.6"))) is None


def test_a_tracking_key_file_is_not_read_while_decoding() -> None:
    # 1.6.1 checks the tracking key options for consistency only; the file is read later.
    kv = {
        "router_tracking_hash": "keyed-xxh3-v1",
        "router_tracking_key_file": "/nonexistent/key.bin",
        "router_tracking_key_id": "k1",
    }
    router = {"router_mode": "k_v", "kv_router_config": kv, "load_threshold_config": {}}
    assert decode(encode_model_record(EP, 1, card(router_config=router)), instance=1) is not None
    kv.pop("router_tracking_key_id")
    with pytest.raises(CardDecodeError):
        decode(encode_model_record(EP, 1, card(router_config=router)), instance=1)


def test_endpoint_records_from_older_generations_decode() -> None:
    key = parse_key(endpoint_kv_key(EP, 9))
    old = {
        "type": "Endpoint",
        "namespace": "ns1",
        "component": "workers",
        "endpoint": "generate",
        "instance_id": 9,
        "transport": {"nats_tcp": "ns1_workers.generate-9"},
    }
    record = decode_endpoint_record(key, json.dumps(old))
    assert record.device_type is None
    assert record.transport == {"nats_tcp": "ns1_workers.generate-9"}


@pytest.mark.parametrize(
    "envelope_change",
    [
        ('"instance_id":0', '"instance_id":-0'),
        ('"type":"Model"', '"type":"Model","x":NaN'),
        ('"type":"Model"', '"type":"Model","x":1e400'),
        ('"type":"Model"', '"type":"Model","namespace":"ns1"'),
        ('"type":"Model"', '"type":"Model","instance_id":0'),
    ],
)
def test_envelope_oddities_get_serde_verdicts_on_every_path(
    envelope_change: tuple[str, str],
) -> None:
    text = encode_model_record(EP, 0, card()).decode()
    bad = text.replace(*envelope_change)
    assert bad != text
    for raw in (bad, bad.encode()):
        with pytest.raises(InvalidRecordError):
            decode(raw, instance=0)


@pytest.mark.parametrize("as_bytes", [True, False])
def test_a_lora_record_written_with_spaces_decodes_like_its_compact_spelling(
    as_bytes: bool,
) -> None:
    record = {
        "type": "Model",
        "namespace": EP.namespace,
        "component": EP.component,
        "endpoint": EP.endpoint,
        "instance_id": 0xABC,
        "card_json": card(
            display_name="my-adapter", slug="my-adapter", lora={"name": "my-adapter"}
        ),
        "model_suffix": "my-adapter",
    }
    compact = decode(json.dumps(record, separators=(",", ":")), suffix="my-adapter")
    # Python's default separators put a space after every comma and colon; the record is the
    # same JSON, so it must decode to the same registration, not be refused as invalid JSON.
    spaced_text = json.dumps(record)
    spaced = decode(spaced_text.encode() if as_bytes else spaced_text, suffix="my-adapter")
    assert spaced == compact
    assert spaced.is_lora
    assert spaced.model_suffix == "my-adapter"


@pytest.mark.parametrize(
    "changes",
    [
        {"display_name": "m" * 400_000},
        {"display_name": "m" * (MAX_NAME_CHARS + 1)},
        {"aliases": ["short", "a" * (MAX_NAME_CHARS + 1)]},
        {"lora": {"name": "l" * (MAX_NAME_CHARS + 1)}},
    ],
)
def test_names_longer_than_the_bound_are_refused_as_invalid_on_every_path(
    changes: dict[str, object],
) -> None:
    """1.6.1 sets no bound; the boundary does, for the text every frontend carries on."""
    suffix = "lora-a" if "lora" in changes else None
    value = encode_model_record(EP, 1, card(**changes), suffix=suffix)
    for raw in (value, value.decode(), json.loads(value)):
        with pytest.raises(CardDecodeError) as info:
            decode(raw, suffix=suffix, instance=1)
        assert info.value.reason == "name_too_long"
        assert info.value.reason in REFUSAL_REASONS  # counted from 0 like every reason
        assert f"longer than {MAX_NAME_CHARS}" in info.value.detail
        with pytest.raises(CardDecodeError):
            decode_whole_record(parse_key(model_kv_key(EP, 1, suffix)), raw)


def test_a_name_at_the_bound_is_accepted() -> None:
    value = encode_model_record(EP, 1, card(display_name="m" * MAX_NAME_CHARS))
    reg = decode(value, instance=1)
    assert reg is not None
    assert reg.group.model == "m" * MAX_NAME_CHARS
