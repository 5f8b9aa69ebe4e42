"""The tenure-hold traces replay to their reviewed outputs, and the contract names each one.

Each trace in ``tests/golden/hold`` is one rule of the hold, written by
``tests/golden/make_hold_traces.py``; ``plugin/CONTRACT.md`` gives, trace by trace, the outcome
its replay output shows.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from workerset_admission.admission import CoreSettings
from workerset_admission.traces.replay import render, replay

FOLDER = Path(__file__).with_name("hold")
CONTRACT = Path(__file__).resolve().parents[2] / "plugin" / "CONTRACT.md"
NAMES = sorted(p.name.removesuffix(".jsonl") for p in FOLDER.glob("*.jsonl"))


def lines(name: str) -> list[str]:
    return (FOLDER / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()


def test_there_is_a_trace_for_every_case_of_the_hold() -> None:
    assert len(NAMES) == 7


@pytest.mark.parametrize("name", NAMES)
def test_a_hold_trace_replays_to_its_expected_output(name: str) -> None:
    expected = (FOLDER / f"{name}.expected.json").read_text(encoding="utf-8")
    assert render(replay(lines(name))) == expected


def test_every_hold_trace_has_its_row_in_the_contract() -> None:
    text = CONTRACT.read_text(encoding="utf-8")
    body = text.split("### Hold traces", 1)[1].split("\n#", 1)[0]
    rows = dict(re.findall(r"^\| `([a-z0-9_]+)` \| (.+) \|$", body, flags=re.MULTILINE))
    assert sorted(rows) == NAMES
    assert all(len(outcome) > 40 for outcome in rows.values())


def test_an_expired_hold_reaches_the_decision_of_no_hold_at_all() -> None:
    name = "a_new_instance_during_a_hold_is_tracked_and_joins_the_end_on_expiry"
    held = replay(lines(name)).to_json()["groups"]
    unheld = replay(lines(name), core_settings=CoreSettings(tenure_hold=0)).to_json()["groups"]

    def decision(groups: list[dict[str, object]]) -> list[tuple[object, ...]]:
        return [(g["incumbent"], g["admitted"], g["cohorts"]) for g in groups]

    assert decision(held) == decision(unheld)


def test_a_returning_member_keeps_the_tenure_a_plain_listing_would_have_ended() -> None:
    name = "a_pre_hold_member_returning_ends_the_hold_in_the_same_tenure"
    held = replay(lines(name)).to_json()["groups"][0]
    unheld = replay(lines(name), core_settings=CoreSettings(tenure_hold=0)).to_json()["groups"][0]
    assert (held["receiver"], held["generation"]) == (1, 1)
    assert held["incumbent"] != unheld["incumbent"]
