"""The boundary judges as the frontend it feeds: Dynamo 1.6 and 1.7 on the same records.

A 1.7 frontend refuses a router time-to-live whose seconds do not fit a u64 (2**64 or more);
1.6.1 accepts it. Every path the boundary decodes a record on (the plain-record path, the
caches, the whole-record decode) answers by the line the settings name.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from support.cards import base_card, model_entry
from workerset_admission.card import (
    BoundarySettings,
    decode_model_record,
    encode_model_record,
    mdcsum,
    model_kv_key,
    parse_key,
)
from workerset_admission.card.boundary import decode_model_entry, decode_whole_record
from workerset_admission.card.entry import EntryDecoder
from workerset_admission.card.fast import clear_caches
from workerset_admission.card.lines import DURATION_LIMIT_SECS, line_of_version
from workerset_admission.cli import main
from workerset_admission.errors import CardDecodeError, ConfigError, UsageError
from workerset_admission.frontend.routes import frontend_settings, installed_dynamo_release
from workerset_admission.identity import EndpointId
from workerset_admission.ports import SourceListing
from workerset_admission.service.admission_service import AdmissionService
from workerset_admission.settings import load_settings
from workerset_admission.traces.format import raw_text
from workerset_admission.traces.replay import replay
from workerset_admission.wiring.compose import boundary_settings

EP = EndpointId("dgd-v1", "backend", "generate")
V16 = BoundarySettings()
V17 = BoundarySettings(dynamo_line="1.7")

# The six router_ttl_secs spellings a 1.7 runtime refused among hand-made cards 1.6.1 accepts.
REFUSED_BY_17 = [
    "1e21",
    "7e22",
    "1e23",
    "18446744073709551616",
    "8.98846567431158e307",
    "1.7976931348623157e308",
]
# Values the limit leaves alone: the largest double below 2**64 among them.
KEPT_BY_17 = ["0", "120", "1e19", "18446744073709549568", "1.844674407370955e19", "5e-324"]


def card_text(field: str, literal: str) -> str:
    """The demo card's JSON text with one kv_router_config value spelled ``literal``."""
    card = base_card(
        router_config={
            "router_mode": "k_v",
            "kv_router_config": {field: "@"},
            "load_threshold_config": {},
        }
    )
    return json.dumps(card).replace('"@"', literal)


def record(field: str, literal: str, instance: int = 7) -> bytes:
    text = card_text(field, literal)
    # Spelled as 1.6.1 writes a record, so the plain-record fast path is the one taken.
    head = encode_model_record(EP, instance, {"x": 1}).decode()
    return head.replace('{"x":1}', text).encode()


def decode_all_paths(raw: bytes, settings: BoundarySettings, instance: int = 7) -> list[Any]:
    """The verdict (checksum, or the refusal's reason) of every decoding path, fresh caches."""
    key = model_kv_key(EP, instance, None)
    return [
        verdict(lambda: decode_model_entry(key, raw, settings)),
        verdict(lambda: decode_model_record(parse_key(key), raw, settings)),
        verdict(lambda: decode_whole_record(parse_key(key), raw, settings)),
    ]


def verdict(decode: Any) -> str:
    try:
        reg = decode()
    except CardDecodeError as exc:
        return str(exc.reason)
    assert reg is not None
    return str(reg.mdc_checksum)


@pytest.mark.parametrize("field", ["router_ttl_secs", "router_predicted_ttl_secs"])
@pytest.mark.parametrize("literal", REFUSED_BY_17)
def test_a_1_7_frontend_refuses_a_ttl_past_the_duration_limit_and_1_6_accepts_it(
    field: str, literal: str
) -> None:
    clear_caches()
    raw = record(field, literal)
    checksum = mdcsum(card_text(field, literal))
    assert decode_all_paths(raw, V16) == [checksum] * 3
    assert decode_all_paths(raw, V17) == ["invalid_router_config"] * 3
    with pytest.raises(CardDecodeError, match=f"{field} is not a valid duration"):
        mdcsum(card_text(field, literal), dynamo_line="1.7")


@pytest.mark.parametrize("field", ["router_ttl_secs", "router_predicted_ttl_secs"])
@pytest.mark.parametrize("literal", KEPT_BY_17)
def test_below_the_limit_both_lines_give_the_same_checksum(field: str, literal: str) -> None:
    clear_caches()
    raw = record(field, literal)
    checksum = mdcsum(card_text(field, literal))
    assert decode_all_paths(raw, V17) == [checksum] * 3
    assert mdcsum(card_text(field, literal), dynamo_line="1.7") == checksum


def test_the_limit_is_two_to_the_64_seconds_exactly() -> None:
    assert DURATION_LIMIT_SECS == 2.0**64
    below = float.fromhex("0x1.fffffffffffffp+63")  # the double just below 2**64
    for value, refused in ((below, False), (2.0**64, True)):
        text = card_text("router_ttl_secs", repr(value))
        if refused:
            with pytest.raises(CardDecodeError):
                mdcsum(text, dynamo_line="1.7")
        else:
            assert mdcsum(text, dynamo_line="1.7") == mdcsum(text)


def test_a_card_decoded_for_one_line_is_judged_afresh_for_the_other() -> None:
    # The same bytes, one decode after the other: no cache answers for the wrong line.
    clear_caches()
    raw = record("router_ttl_secs", "1e21")
    for _ in range(2):
        assert decode_all_paths(raw, V16)[0] != "invalid_router_config"
        assert decode_all_paths(raw, V17) == ["invalid_router_config"] * 3
    # Fleet neighbours (one respelled value) on the cached path, in both orders.
    clear_caches()
    for instance in range(1, 5):
        raw = record("router_ttl_secs", "1e21", instance)
        assert decode_all_paths(raw, V17, instance)[0] == "invalid_router_config"
        assert decode_all_paths(raw, V16, instance)[0] != "invalid_router_config"


def test_an_unknown_line_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match=r"unknown Dynamo line '1\.8'"):
        BoundarySettings(dynamo_line="1.8")
    with pytest.raises(UsageError):
        mdcsum(base_card(), dynamo_line="2")


@pytest.mark.parametrize(
    ("release", "line"),
    [
        ("1.6.1", "1.6"),
        ("1.5.0", "1.6"),
        ("1.7.0.dev20261026", "1.7"),
        ("1.7.1", "1.7"),
        ("1.10.0", "1.7"),
        ("2.0.0rc1", "1.7"),
    ],
)
def test_a_release_maps_to_the_line_whose_rules_it_uses(release: str, line: str) -> None:
    assert line_of_version(release) == line


@pytest.mark.parametrize("release", ["", "dev", "1", "v1.7"])
def test_an_unreadable_release_is_a_usage_error(release: str) -> None:
    with pytest.raises(UsageError, match="cannot read a Dynamo release"):
        line_of_version(release)


def test_the_setting_comes_from_env_flag_or_default_and_reaches_the_boundary() -> None:
    assert boundary_settings(load_settings(env={})).dynamo_line == "1.6"
    env = {"WORKERSET_ADMISSION_DYNAMO_VERSION": "1.7"}
    assert boundary_settings(load_settings(env=env)).dynamo_line == "1.7"
    flagged = load_settings(env=env, flags={"dynamo_version": "1.6"})
    assert boundary_settings(flagged).dynamo_line == "1.6"
    with pytest.raises(ConfigError, match="dynamo_version"):
        load_settings(env={"WORKERSET_ADMISSION_DYNAMO_VERSION": "1.8"})


def test_inside_the_frontend_the_installed_release_decides(
    caplog: pytest.LogCaptureFixture,
) -> None:
    unset = load_settings(env={})
    assert frontend_settings(unset, "1.7.0.dev20261026").dynamo_version == "1.7"
    assert frontend_settings(unset, "1.6.1").dynamo_version == "1.6"
    told = load_settings(env={"WORKERSET_ADMISSION_DYNAMO_VERSION": "1.6"})
    with caplog.at_level(logging.WARNING):
        assert frontend_settings(told, "1.7.1").dynamo_version == "1.7"
    assert "dynamo_version is set to 1.6 but this frontend runs Dynamo 1.7.1" in caplog.text
    # An unreadable release leaves the setting, and says so.
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert frontend_settings(told, "nightly").dynamo_version == "1.6"
    assert "cannot read a Dynamo release" in caplog.text


def test_the_installed_release_is_read_from_the_frontends_distribution_first() -> None:
    def version_of(versions: dict[str, str]) -> Any:
        def look(name: str) -> str:
            if name not in versions:
                import importlib.metadata

                raise importlib.metadata.PackageNotFoundError(name)
            return versions[name]

        return look

    both = {"ai-dynamo": "1.7.0", "ai-dynamo-runtime": "1.6.1"}
    assert installed_dynamo_release(version_of(both)) == "1.7.0"
    assert installed_dynamo_release(version_of({"ai-dynamo-runtime": "1.7.1"})) == "1.7.1"
    assert installed_dynamo_release(version_of({})) is None


def _trace(line: str | None) -> list[str]:
    header: dict[str, Any] = {"kind": "trace", "version": 2, "wall_time": 1.0}
    header["observer"] = "frontend"
    if line is not None:
        header["settings"] = {"boundary": {"dynamo_line": line}}
    card = json.loads(card_text("router_ttl_secs", "1e21"))
    entry = model_entry(5, card)
    put = {"kind": "put", "t": 0.0, "key": entry.key, "value": raw_text(entry.value)}
    return [json.dumps(header), json.dumps(put)]


def test_replay_lists_the_refused_card_as_invalid_for_a_1_7_recording() -> None:
    clear_caches()
    refused = replay(_trace("1.7")).to_json()
    assert refused["groups"] == []
    assert [item["reason"] for item in refused["invalid"]] == ["invalid_router_config"]
    accepted = replay(_trace("1.6")).to_json()
    assert accepted["invalid"] == []
    assert len(accepted["groups"]) == 1
    # A recording that names no line is judged by the 1.6 rules, as before.
    assert replay(_trace(None)).to_json()["invalid"] == []


class _IdleSource:
    async def events(self) -> Any:
        return
        yield

    async def list_all(self) -> SourceListing:
        return SourceListing(())

    async def close(self) -> None:
        return None


@pytest.mark.parametrize("line", ["1.6", "1.7"])
def test_a_service_judging_for_1_7_refuses_the_card_as_invalid_with_its_reason(
    line: str, caplog: pytest.LogCaptureFixture
) -> None:
    clear_caches()
    card = json.loads(card_text("router_ttl_secs", "1e21"))
    decoder = EntryDecoder(BoundarySettings(dynamo_line=line))
    service = AdmissionService(_IdleSource(), decoder=decoder)
    with caplog.at_level(logging.WARNING):
        service.handle_event(SourceListing((model_entry(5, card),)))
    status = service.status()
    if line == "1.6":
        assert status.invalid_total == 0
        assert [g.incumbent for g in status.groups] == [mdcsum(card)]
        return
    assert status.groups == ()
    assert status.invalid_total == 1
    [refused] = status.recent_invalid
    assert refused.reason == "invalid_router_config"
    assert "router_ttl_secs is not a valid duration for a Dynamo 1.7 frontend" in refused.detail
    assert "refused discovery record" in caplog.text
    assert "invalid_router_config" in caplog.text


def test_replay_asks_what_a_frontend_of_another_line_would_have_decided(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    clear_caches()
    trace = tmp_path / "recorded-by-1.6.jsonl"
    trace.write_text("\n".join(_trace("1.6")) + "\n")
    assert main(["replay", str(trace)]) == 0
    assert json.loads(capsys.readouterr().out)["invalid"] == []
    assert main(["replay", "--dynamo-version", "1.7", str(trace)]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert [item["reason"] for item in answer["invalid"]] == ["invalid_router_config"]
    assert answer["groups"] == []
