"""Bad discovery input is refused with a reason, counted, and changes nothing.

Two sources of bad input: the committed corpus (``tests/corpus/bad_records.jsonl``, one case per
line, grouped by the boundary stage that must refuse it) and Hypothesis, which mutates keys,
raw bytes and decoded records within a fixed example budget. Both go through the card boundary
alone and through the service (its ``handle_event`` step, no network), which must keep running,
count every refusal, and leave admission state exactly as it was.
"""

from __future__ import annotations

import base64
import copy
import json
import re
import string
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.cards import base_card as demo_card
from workerset_admission.card import (
    BoundarySettings,
    decode_endpoint_record,
    decode_model_record,
    encode_model_record,
    escape_token,
    model_kv_key,
    parse_key,
    unescape_token,
)
from workerset_admission.errors import (
    REFUSAL_REASONS,
    CardDecodeError,
    InvalidRecordError,
    RemoteDataError,
)
from workerset_admission.identity import EndpointId, Registration
from workerset_admission.ports import DiscoveryEntry, SourceDelete, SourceListing, SourcePut
from workerset_admission.service.admission_service import AdmissionService, ServiceStatus

CORPUS = Path(__file__).with_name("corpus") / "bad_records.jsonl"
REASON = re.compile(r"[a-z][a-z0-9_]*")
EP = EndpointId("ns1", "backend", "generate")
GOOD_ID = 0x1F

# A fixed budget: the fuzz runs in the default test command, so it must stay small and bounded.
FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@dataclass(frozen=True)
class Case:
    name: str
    layer: str
    key: str
    value: bytes
    why: str

    def __str__(self) -> str:
        return self.name


def load_corpus() -> list[Case]:
    cases = []
    for line in CORPUS.read_text().splitlines():
        item = json.loads(line)
        if "value_b64" in item:
            value = base64.b64decode(item["value_b64"])
        else:
            # surrogatepass keeps an escaped-in-text lone surrogate as the bytes a worker sent.
            value = item["value"].encode("utf-8", "surrogatepass")
        cases.append(Case(item["name"], item["layer"], item["key"], value, item["why"]))
    return cases


CASES = load_corpus()


def good_card(**changes: Any) -> dict[str, Any]:
    card = demo_card()
    card.update(changes)
    return card


def good_entry(instance_id: int = GOOD_ID, revision: int = 1, **changes: Any) -> DiscoveryEntry:
    return DiscoveryEntry(
        model_kv_key(EP, instance_id),
        encode_model_record(EP, instance_id, good_card(**changes)),
        revision,
    )


def decode(key: str, value: bytes, boundary: BoundarySettings | None = None) -> object:
    """What the service does with one put: parse the key, then decode by record kind."""
    parsed = parse_key(key)
    if parsed.kind == "endpoint":
        return decode_endpoint_record(parsed, value, boundary)
    return decode_model_record(parsed, value, boundary)


def attempt(key: str, value: bytes) -> object:
    """Decode, returning the refusal instead of raising it (anything else still raises)."""
    try:
        return decode(key, value)
    except RemoteDataError as exc:
        return exc


def well_refused(outcome: object) -> bool:
    """A refusal with a reason of the one table (so its counter started at 0)."""
    return (
        isinstance(outcome, RemoteDataError)
        and bool(REASON.fullmatch(outcome.reason))
        and outcome.reason in REFUSAL_REASONS
    )


def parsed_or_refused(key: str) -> Any:
    try:
        return parse_key(key)
    except InvalidRecordError as exc:
        return exc


# -- the corpus at the boundary -----------------------------------------------------------------


def test_the_corpus_covers_every_layer_and_has_unique_names() -> None:
    assert {c.layer for c in CASES} == {"key", "record", "identity", "card", "shape"}
    assert len({c.name for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_every_corpus_record_is_refused_at_the_boundary_with_a_reason(case: Case) -> None:
    with pytest.raises(RemoteDataError) as caught:
        decode(case.key, case.value)
    error = caught.value
    assert REASON.fullmatch(error.reason), error.reason
    assert error.reason in REFUSAL_REASONS, error.reason
    assert str(error)
    if case.layer == "key":
        assert isinstance(error, InvalidRecordError)
        assert error.reason == "bad_key"
    elif case.layer == "identity":
        assert isinstance(error, InvalidRecordError)
        assert error.reason in ("identity_mismatch", "lora_mismatch")
    elif case.layer == "shape":
        assert isinstance(error, CardDecodeError)
    if isinstance(error, InvalidRecordError):
        assert error.key == case.key


def test_a_value_over_the_size_limit_is_refused_before_it_is_parsed() -> None:
    limit = 4096
    padding = "x" * limit
    value = encode_model_record(EP, GOOD_ID, good_card(user_data={"pad": padding}))
    with pytest.raises(InvalidRecordError) as caught:
        decode(model_kv_key(EP, GOOD_ID), value, BoundarySettings(max_value_size=limit))
    assert caught.value.reason == "value_too_large"


def test_a_value_of_many_megabytes_is_refused_under_the_default_limit() -> None:
    value = b'{"type":"Model","pad":"' + b"x" * (3 << 20) + b'"}'
    with pytest.raises(InvalidRecordError) as caught:
        decode(model_kv_key(EP, GOOD_ID), value)
    assert caught.value.reason == "value_too_large"


# -- the corpus through the service ------------------------------------------------------------


class IdleSource:
    """A source that never yields: these tests drive the service one event at a time."""

    async def events(self) -> AsyncIterator[Any]:
        return
        yield

    async def list_all(self) -> SourceListing:
        return SourceListing(())

    async def close(self) -> None:
        return None


def admission_state(snapshot: ServiceStatus) -> list[dict[str, Any]]:
    """The parts of the status that admission decisions consist of."""
    return [g.to_json() for g in snapshot.groups]


def synced_service(*entries: DiscoveryEntry) -> AdmissionService:
    service = AdmissionService(IdleSource())
    service.handle_event(SourceListing(entries))
    return service


def test_every_corpus_record_is_counted_by_the_service_and_changes_nothing() -> None:
    service = synced_service(good_entry())
    before = admission_state(service.status())
    assert before, "the baseline registration must have made a group"

    for revision, case in enumerate(CASES, start=2):
        service.handle_event(SourcePut(DiscoveryEntry(case.key, case.value, revision)))

    after = service.status()
    assert admission_state(after) == before
    assert after.invalid_total == len(CASES)
    assert service.counters.invalid == len(CASES)
    for record in after.recent_invalid:
        assert REASON.fullmatch(record.reason)


def test_a_bad_value_over_a_good_key_keeps_the_last_valid_registration() -> None:
    service = synced_service(good_entry())
    before = admission_state(service.status())
    key = model_kv_key(EP, GOOD_ID)
    for revision, case in enumerate(c for c in CASES if c.layer != "key"):
        service.handle_event(SourcePut(DiscoveryEntry(key, case.value, revision + 2)))
    assert admission_state(service.status()) == before


def test_a_bad_value_in_a_reconciliation_listing_keeps_the_last_valid_registration() -> None:
    # Dynamo keeps the last valid value when a resync listing holds a value it cannot parse;
    # a garbled listing must not read as the worker's departure.
    service = synced_service(good_entry())
    before = admission_state(service.status())
    garbled = DiscoveryEntry(model_kv_key(EP, GOOD_ID), b'{"type":"Model",', 5)
    service.handle_event(SourceListing((garbled,), reason="reconnect"))
    assert admission_state(service.status()) == before
    assert service.status().invalid_total == 1


def test_a_refused_value_is_counted_once_per_key_and_value_however_often_it_is_listed() -> None:
    bad = [
        DiscoveryEntry(model_kv_key(EP, GOOD_ID + n), b'{"type":"Model",', n) for n in range(1, 15)
    ]
    service = synced_service(good_entry(), *bad)
    assert service.status().invalid_total == 14
    for reason in ("reconnect", "periodic") * 10:
        service.handle_event(SourceListing((good_entry(), *bad), reason=reason))
        service.handle_event(SourcePut(bad[0]))
    assert service.status().invalid_total == 14
    changed = DiscoveryEntry(bad[0].key, b"{", 99)
    service.handle_event(SourcePut(changed))
    assert service.status().invalid_total == 15
    # A periodic listing that misses a key (read while it was rewritten) forgets nothing.
    service.handle_event(SourceListing((good_entry(), *bad[1:]), reason="periodic"))
    service.handle_event(SourceListing((good_entry(), changed, *bad[1:]), reason="periodic"))
    assert service.status().invalid_total == 15
    # A bad key that is removed and comes back is a new bad record; so is one a resync misses.
    service.handle_event(SourceDelete(bad[1].key, 100))
    service.handle_event(SourcePut(bad[1]))
    service.handle_event(SourceListing((good_entry(), changed, *bad[3:]), reason="reconnect"))
    service.handle_event(SourcePut(bad[2]))
    assert service.status().invalid_total == 17


def test_removals_of_keys_that_do_not_parse_are_refused_and_change_nothing() -> None:
    service = synced_service(good_entry())
    before = admission_state(service.status())
    for revision, case in enumerate(c for c in CASES if c.layer == "key"):
        service.handle_event(SourceDelete(case.key, revision + 2))
    assert admission_state(service.status()) == before
    assert service.status().invalid_total == sum(1 for c in CASES if c.layer == "key")


# -- Hypothesis: keys --------------------------------------------------------------------------

_KEY_ALPHABET = string.ascii_letters + string.digits + "_-.=/:*> \t" + "äÿ€\x00"
_TOKENS = st.text(alphabet=string.ascii_letters + string.digits + "_-=", min_size=0, max_size=6)


@FUZZ
@given(st.text(alphabet=_KEY_ALPHABET, max_size=60))
def test_any_key_either_parses_to_its_canonical_spelling_or_is_refused(key: str) -> None:
    parsed = parsed_or_refused(key)
    if isinstance(parsed, InvalidRecordError):
        assert parsed.reason == "bad_key"
        return
    rebuilt = model_kv_key(parsed.endpoint, parsed.instance_id, parsed.model_suffix)
    if parsed.kind == "model":
        assert rebuilt == key
    else:
        assert key == rebuilt.replace("v1.mdc.", "v1.instances.", 1)


@FUZZ
@given(st.lists(_TOKENS, min_size=0, max_size=8).map(lambda parts: ".".join(["v1", "mdc", *parts])))
def test_keys_built_from_odd_tokens_either_parse_canonically_or_are_refused(key: str) -> None:
    parsed = parsed_or_refused(key)
    if isinstance(parsed, InvalidRecordError):
        assert parsed.reason == "bad_key"
        return
    assert model_kv_key(parsed.endpoint, parsed.instance_id, parsed.model_suffix) == key


@FUZZ
@given(st.text(min_size=1, max_size=30))
def test_escaping_any_token_round_trips_and_stays_subject_safe(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return  # lone surrogates cannot come from a worker's UTF-8 configuration
    token = escape_token(text)
    assert re.fullmatch(r"(?:[A-Za-z0-9_-]|=[0-9A-F]{2})+", token)
    assert unescape_token(token) == text


@FUZZ
@given(st.text(alphabet=string.ascii_letters + string.digits + "_-=", min_size=1, max_size=12))
def test_an_escaped_token_is_accepted_only_in_its_canonical_spelling(token: str) -> None:
    try:
        text = unescape_token(token)
    except InvalidRecordError as exc:
        refusal = exc
    else:
        assert escape_token(text) == token
        return
    assert refusal.reason == "bad_key"


# -- Hypothesis: values ------------------------------------------------------------------------

_GOOD_VALUE = encode_model_record(EP, GOOD_ID, good_card())
_GOOD_KEY = model_kv_key(EP, GOOD_ID)


@FUZZ
@given(st.binary(max_size=400))
def test_any_bytes_as_a_value_are_refused_without_any_other_exception(value: bytes) -> None:
    outcome = attempt(_GOOD_KEY, value)
    assert isinstance(outcome, Registration) or well_refused(outcome)


@FUZZ
@given(
    st.integers(min_value=0, max_value=len(_GOOD_VALUE) - 1),
    st.integers(min_value=1, max_value=40),
    st.binary(min_size=0, max_size=40),
)
def test_a_record_with_bytes_cut_or_spliced_is_refused_or_still_names_its_key(
    at: int, cut: int, splice: bytes
) -> None:
    value = _GOOD_VALUE[:at] + splice + _GOOD_VALUE[at + cut :]
    registration = attempt(_GOOD_KEY, value)
    if not isinstance(registration, Registration):
        assert well_refused(registration)
        return
    assert (registration.endpoint, registration.instance_id) == (EP, GOOD_ID)


_JSON_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
    st.sampled_from(["Model", "Endpoint", "prefill", "decode", "Chat", "blake3:00", "ns1"]),
)
_JSON = st.recursive(
    _JSON_LEAVES,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
_RECORD_FIELDS = ["type", "namespace", "component", "endpoint", "instance_id", "model_suffix"]
_CARD_FIELDS = [*good_card(), "lora", "router_config", "runtime_config", "user_data", "aliases"]


def _record(card: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "Model",
        "namespace": EP.namespace,
        "component": EP.component,
        "endpoint": EP.endpoint,
        "instance_id": GOOD_ID,
        "card_json": card,
    }


@FUZZ
@given(
    st.lists(
        st.tuples(st.booleans(), st.sampled_from(_RECORD_FIELDS + _CARD_FIELDS), _JSON),
        min_size=1,
        max_size=4,
    )
)
def test_records_with_fields_of_the_wrong_type_are_refused_or_keep_their_identity(
    changes: list[tuple[bool, str, Any]],
) -> None:
    record = _record(good_card())
    for in_card, name, value in changes:
        target = record["card_json"] if in_card else record
        target[name] = copy.deepcopy(value)
    text = json.dumps(record).encode()
    registration = attempt(_GOOD_KEY, text)
    if not isinstance(registration, Registration):
        assert well_refused(registration)
        return
    # Accepted: then it must be what the key says, and only a LoRA key carries a suffix.
    assert (registration.endpoint, registration.instance_id) == (EP, GOOD_ID)
    assert registration.model_suffix is None


@FUZZ
@given(st.integers(min_value=1, max_value=3000), st.sampled_from(["[", '{"a":']))
def test_deep_nesting_anywhere_is_refused_or_accepted_but_never_crashes(
    depth: int, opener: str
) -> None:
    closer = "]" if opener == "[" else "}"
    nested = opener * depth + "1" + closer * depth
    for place in ("user_data", "zz_unknown"):
        record = json.dumps(_record(good_card())).replace(
            '"needs": []', f'"needs": [], "{place}": {nested}'
        )
        outcome = attempt(_GOOD_KEY, record.encode())
        assert isinstance(outcome, Registration) or well_refused(outcome)


@FUZZ
@given(st.integers(min_value=10, max_value=20000), st.sampled_from(["", "-", "0."]))
def test_huge_number_literals_are_refused_or_accepted_but_never_crash(
    digits: int, prefix: str
) -> None:
    literal = prefix + "9" * digits
    for field in ("instance_id", "kv_cache_block_size", "zz_unknown"):
        record = _record(good_card())
        text = json.dumps(record)
        if field == "instance_id":
            text = text.replace(f'"instance_id": {GOOD_ID}', f'"instance_id": {literal}')
        elif field == "kv_cache_block_size":
            text = text.replace('"kv_cache_block_size": 16', f'"kv_cache_block_size": {literal}')
        else:
            text = text.replace('"needs": []', f'"needs": [], "zz_unknown": {literal}e9')
        outcome = attempt(_GOOD_KEY, text.encode())
        assert isinstance(outcome, Registration) or well_refused(outcome)


# -- Hypothesis: the service under a stream of good and bad events ------------------------------

_IDS = (0x1A, 0x2B, 0x3C)
_BAD_VALUES = [c.value for c in CASES if c.layer in ("record", "card", "shape")][:20]


@dataclass(frozen=True)
class _Op:
    kind: str  # "good" | "other" | "bad" | "delete" | "badkey"
    instance: int
    bad: int = 0


_OPS = st.builds(
    _Op,
    st.sampled_from(["good", "other", "bad", "delete", "badkey"]),
    st.sampled_from(_IDS),
    st.integers(min_value=0, max_value=len(_BAD_VALUES) - 1),
)


@settings(FUZZ, max_examples=60)
@given(st.lists(_OPS, min_size=1, max_size=30))
def test_the_service_state_depends_only_on_the_valid_events_it_was_given(ops: list[_Op]) -> None:
    """Interleaving refused events into a stream leaves the same state as leaving them out."""
    noisy = AdmissionService(IdleSource())
    clean = AdmissionService(IdleSource())
    for service in (noisy, clean):
        service.handle_event(SourceListing(()))
    refused = 0
    # A bad value is counted once per key and value: a re-sent copy is the same bad record.
    held_bad: dict[str, bytes] = {}
    for revision, op in enumerate(ops, start=1):
        key = model_kv_key(EP, op.instance)
        if op.kind in ("good", "other"):
            block = 16 if op.kind == "good" else 32
            value = encode_model_record(EP, op.instance, good_card(kv_cache_block_size=block))
            event: Any = SourcePut(DiscoveryEntry(key, value, revision))
            clean.handle_event(event)
            held_bad.pop(key, None)
        elif op.kind == "delete":
            event = SourceDelete(key, revision)
            clean.handle_event(event)
            held_bad.pop(key, None)
        else:
            if op.kind != "bad":
                key += ".x.y"
            event = SourcePut(DiscoveryEntry(key, _BAD_VALUES[op.bad], revision))
            if held_bad.get(key) != _BAD_VALUES[op.bad]:
                refused += 1
            held_bad[key] = _BAD_VALUES[op.bad]
        noisy.handle_event(event)
    assert admission_state(noisy.status()) == admission_state(clean.status())
    assert noisy.status().invalid_total == refused
    assert clean.status().invalid_total == 0


def test_a_refused_key_a_reconciliation_keeps_from_live_updates_is_not_counted_again() -> None:
    bad = DiscoveryEntry(model_kv_key(EP, GOOD_ID + 1), b'{"type":"Model",', 2)
    service = synced_service(good_entry(), bad)
    # A listing that missed the key because a live re-send landed while it was read.
    service.handle_event(SourceListing((good_entry(),), reason="periodic"), keep={bad.key})
    service.handle_event(SourceListing((good_entry(), bad), reason="periodic"))
    service.handle_event(SourcePut(bad))
    assert service.status().invalid_total == 1


def test_every_reason_the_boundary_names_in_its_code_is_in_the_one_table() -> None:
    import ast
    from pathlib import Path

    named = set()
    for path in (Path(__file__).parents[1] / "plugin").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and node.args:
                func = node.func
                name = getattr(func, "id", None) or getattr(func, "attr", "")
                first = node.args[0]
                if (
                    name in ("CardDecodeError", "InvalidRecordError", "JsonError")
                    and isinstance(first, ast.Constant)
                    and isinstance(first.value, str)
                ):
                    named.add(first.value)
    assert named
    assert named <= REFUSAL_REASONS, named - REFUSAL_REASONS
