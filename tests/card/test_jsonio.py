"""serde_json number, duplicate-key, depth and float-format semantics."""

from __future__ import annotations

import math

import pytest
from workerset_admission.card import jsonio


@pytest.mark.parametrize(
    ("literal", "written"),
    [
        # Each pair was read and written back by Dynamo 1.6.1.
        ("1e16", "1e+16"),
        ("1e15", "1000000000000000.0"),
        ("123456789012345678", "1.2345678901234568e+17"),
        ("1e-6", "1e-6"),
        ("0.00001", "0.00001"),
        ("1e21", "1e+21"),
        ("1.5e300", "1.5e+300"),
        ("5e-324", "5e-324"),
        ("100", "100.0"),
        ("1E2", "100.0"),
        ("2.5e-5", "0.000025"),
        ("9007199254740993", "9007199254740992.0"),
        ("0.30000000000000004", "0.30000000000000004"),
        ("1.7976931348623157e308", "1.7976931348623157e+308"),
        ("123456789.123456789123456789", "123456789.1234568"),
        ("-0", "-0.0"),
        ("1e-400", "0.0"),
    ],
)
def test_numbers_read_and_write_like_serde_json(literal: str, written: str) -> None:
    value = jsonio.loads(literal)
    assert jsonio.format_f64(float(value)) == written


def test_long_decimals_are_not_always_the_nearest_double() -> None:
    # serde_json truncates the significand at 19-20 digits and scales once.
    assert jsonio.loads("123456789.123456789123456789") != 123456789.123456789123456789


def test_integers_stay_integers_only_within_u64_and_i64() -> None:
    assert jsonio.loads("18446744073709551615") == 2**64 - 1
    assert isinstance(jsonio.loads("18446744073709551616"), float)
    assert jsonio.loads("-9223372036854775808") == -(2**63)
    assert isinstance(jsonio.loads("-9223372036854775809"), float)
    minus_zero = jsonio.loads("-0")
    assert isinstance(minus_zero, float)
    assert math.copysign(1.0, minus_zero) < 0


def test_out_of_range_numbers_are_marked_not_raised() -> None:
    value = jsonio.loads('{"a":[1e400]}')
    assert isinstance(value["a"][0], jsonio.Overflow)
    assert jsonio.has_overflow(value)
    assert not jsonio.has_overflow(jsonio.loads('{"a":[1e300]}'))


def test_repeated_keys_are_remembered_and_the_last_value_kept() -> None:
    value = jsonio.loads('{"a":1,"b":2,"a":3}')
    assert isinstance(value, jsonio.DupDict)
    assert value.dups == frozenset({"a"})
    assert value == {"a": 3, "b": 2}
    assert not isinstance(jsonio.loads('{"a":1}'), jsonio.DupDict)


@pytest.mark.parametrize("text", ["NaN", "Infinity", "[1,]", "01", "\ufeff{}", '"\x01"', "{} x"])
def test_text_serde_json_refuses_is_refused(text: str) -> None:
    with pytest.raises(jsonio.JsonError):
        jsonio.loads(text)


def test_invalid_utf8_is_refused() -> None:
    with pytest.raises(jsonio.JsonError) as info:
        jsonio.loads(b'"\xff"')
    assert info.value.reason == "invalid_utf8"


def test_depth_counts_containers() -> None:
    assert jsonio.depth_of(1) == 0
    assert jsonio.depth_of([]) == 1
    assert jsonio.depth_of({"a": [[{}]]}) == 4


def test_lone_surrogates_are_found_in_keys_and_values() -> None:
    assert jsonio.has_lone_surrogate(jsonio.loads('{"\\ud800":1}'))
    assert jsonio.has_lone_surrogate(jsonio.loads('["\\udc00"]'))
    assert not jsonio.has_lone_surrogate(jsonio.loads('["\\ud83d\\ude00"]'))


def test_compact_output_matches_serde_json_style() -> None:
    value = {"b": 1.0, "a": [None, True, "é\n"], "c": 1e-7}
    assert jsonio.dumps_compact(value) == '{"b":1.0,"a":[null,true,"é\\n"],"c":1e-7}'
