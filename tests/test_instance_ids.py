"""Instance ids: one spelling pasted from any output works in any command, and JSON keeps them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support.cards import base_card
from workerset_admission.card import encode_model_record, model_kv_key
from workerset_admission.cli import main
from workerset_admission.errors import UsageError
from workerset_admission.identity import EndpointId, parse_instance_id, with_id_strings
from workerset_admission.traces.replay import replay, resolve_instance

EP = EndpointId("ns", "c", "e")
BIG = 5102475244781244677  # above 2**53, as a worker registered by a 64-bit tool may be


def put(instance_id: int, **changes: Any) -> str:
    value = encode_model_record(EP, instance_id, base_card(**changes)).decode()
    return json.dumps({"kind": "put", "key": model_kv_key(EP, instance_id), "value": value})


@pytest.mark.parametrize("spelled", ["ns/c/e/3c", "ns/c/e/0x3c", "ns/c/e/60", "60", "0x3c", "3c"])
def test_explain_takes_the_id_as_keys_and_logs_spell_it_and_as_tables_print_it(
    spelled: str,
) -> None:
    result = replay([put(0x3C)])
    assert resolve_instance(result, spelled) == "ns/c/e/3c"


def test_a_spelling_that_reads_as_two_registered_ids_is_refused_with_both() -> None:
    result = replay([put(60), put(0x60, kv_cache_block_size=32)])
    with pytest.raises(UsageError, match="ambiguous"):
        resolve_instance(result, "60")
    # Written as a key, the id is read as keys spell it first: in hex.
    assert resolve_instance(result, "ns/c/e/60") == "ns/c/e/60"
    assert resolve_instance(result, "0x60") == "ns/c/e/60"
    assert resolve_instance(result, "ns/c/e/0x3c") == "ns/c/e/3c"


def test_an_id_never_registered_is_named_in_both_spellings() -> None:
    with pytest.raises(UsageError, match=r"never registers instance id 153 \(0x99\)"):
        resolve_instance(replay([put(1)]), "0x99")


@pytest.mark.parametrize(("text", "value"), [("42", 42), ("0x2a", 42), ("0X2A", 42)])
def test_every_command_reads_decimal_and_0x_hex(text: str, value: int) -> None:
    assert parse_instance_id(text) == value


@pytest.mark.parametrize("text", ["2a", "-1", str(2**64), "forty"])
def test_an_id_that_is_not_one_is_refused_naming_the_forms(text: str) -> None:
    with pytest.raises(ValueError, match="instance id"):
        parse_instance_id(text)


def _as_jq_16_or_javascript_reads(text: str) -> Any:
    # jq 1.6 and JSON.parse hold every number as an IEEE double.
    return json.loads(text, parse_int=float)


def test_replay_json_carries_every_id_list_as_strings_that_lose_no_digit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(put(BIG) + "\n", encoding="utf-8")
    assert main(["replay", str(trace)]) == 0
    text = capsys.readouterr().out
    (group,) = _as_jq_16_or_javascript_reads(text)["groups"]
    assert int(group["admitted"][0]) != BIG
    assert group["admitted_str"] == [str(BIG)]
    assert group["cohorts"][0]["members_str"] == [str(BIG)]
    assert parse_instance_id(group["admitted_str"][0]) == BIG


def test_the_id_strings_sit_beside_every_id_list_and_nowhere_else() -> None:
    doc = {"groups": [{"admitted": [1, BIG], "generation": 3, "cohorts": [{"members": []}]}]}
    assert with_id_strings(doc) == {
        "groups": [
            {
                "admitted": [1, BIG],
                "admitted_str": ["1", str(BIG)],
                "generation": 3,
                "cohorts": [{"members": [], "members_str": []}],
            }
        ]
    }
    # A brief status counts ids instead of listing them: nothing to add.
    assert with_id_strings({"admitted": 2}) == {"admitted": 2}
