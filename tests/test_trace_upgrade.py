"""Version 1 traces are upgraded when read: replay sees only the current form, and nothing moves."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from support.cards import base_card, group_of, model_entry
from workerset_admission.admission import CoreSettings
from workerset_admission.traces.format import (
    TraceError,
    read_trace,
    recorded_ticks,
    trace_version,
    upgrade_version_1,
)
from workerset_admission.traces.replay import explain, render, replay

A = base_card(16)
B = base_card(32)
GID = group_of(A).id
ROOT = Path(__file__).resolve().parents[1]
# Every version 1 trace the project keeps: the golden examples and the hold and controller ones.
VERSION_1 = sorted(
    path
    for path in [
        *(ROOT / "plugin" / "examples").glob("*.jsonl"),
        *(ROOT / "tests" / "golden").rglob("*.jsonl"),
    ]
    if '"kind":"trace"' not in path.read_text(encoding="utf-8").replace(" ", "")
)


def put(instance_id: int, card: dict[str, Any] = A, **extra: Any) -> str:
    entry = model_entry(instance_id, card)
    return json.dumps({"kind": "put", "key": entry.key, "value": entry.value.decode(), **extra})


def line(**event: Any) -> str:
    return json.dumps(event)


# Two failed builds, retries due between ticks, a conflicting cohort and a succession.
RETRIES = [
    put(1),
    line(kind="build", group=GID, outcome="failed"),
    line(kind="tick", seconds=0.5),
    put(2, B),
    line(kind="tick", seconds=0.7),
    line(kind="build", group=GID, outcome="failed"),
    line(kind="tick", seconds=0.1),
    line(kind="delete", key=model_entry(1).key),
    line(kind="tick", seconds=2.2),
    line(kind="tick", seconds=30),
]


def written(events: list[dict[str, Any]]) -> list[str]:
    return [json.dumps(event) for event in events]


def test_the_project_keeps_version_1_traces_to_check_the_upgrade_with() -> None:
    assert len(VERSION_1) >= 20
    assert all(
        trace_version(read_trace(p.read_text(encoding="utf-8").splitlines())) == 1
        for p in VERSION_1
    )


def test_every_upgraded_line_carries_the_reading_of_the_tick_clock() -> None:
    events = read_trace(RETRIES)
    assert [event["t"] for event in events] == [0.0, 0.0, 0.5, 0.5, 1.2, 1.2, 1.3, 1.3, 3.5, 33.5]
    # The readings are the sums replay made, in line order, to the last bit.
    assert events[6]["t"] == 0.5 + 0.7 + 0.1
    assert recorded_ticks(events)


def test_a_t_that_a_version_1_line_carries_is_not_its_time() -> None:
    events = read_trace([put(1, t=99), line(kind="tick", seconds=2, t=1)])
    assert [event["t"] for event in events] == [0.0, 2.0]


@pytest.mark.parametrize("path", VERSION_1, ids=lambda p: p.stem)
def test_a_version_1_trace_and_its_upgraded_form_replay_to_the_same_end_state(
    path: Path,
) -> None:
    original = path.read_text(encoding="utf-8").splitlines()
    upgraded = written(read_trace(original))
    before, after = replay(original), replay(upgraded)
    assert render(after) == render(before)
    assert (after.effects, after.version) == (before.effects, 1)
    assert {k: h.events for k, h in after.history.items()} == {
        k: h.events for k, h in before.history.items()
    }


@pytest.mark.parametrize("tenure_hold", [0.0, 30.0])
def test_a_version_1_trace_with_retries_replays_the_same_from_its_upgraded_form(
    tenure_hold: float,
) -> None:
    settings = CoreSettings(tenure_hold=tenure_hold)
    before = replay(RETRIES, core_settings=settings)
    after = replay(written(read_trace(RETRIES)), core_settings=settings)
    assert render(after) == render(before)
    key = model_entry(2).key
    assert explain(after, key) == explain(before, key)
    [group] = after.to_json()["groups"]
    assert (group["status"], group["incumbent"]) == ("ready", group["cohorts"][0]["checksum"])


def test_the_upgrade_is_idempotent() -> None:
    once = upgrade_version_1(json.loads(text) for text in RETRIES)
    assert upgrade_version_1(once) == once
    assert read_trace(written(read_trace(RETRIES))) == read_trace(RETRIES)
    for path in VERSION_1:
        events = read_trace(path.read_text(encoding="utf-8").splitlines())
        assert upgrade_version_1(events) == events


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        (line(kind="tick"), "tick needs non-negative seconds"),
        (line(kind="tick", seconds=-1), "tick needs non-negative seconds"),
        (line(kind="tick", seconds="soon"), "tick needs non-negative seconds"),
        (line(kind="tick", seconds=float("inf")), "tick needs non-negative seconds"),
        (line(kind="delete", key=model_entry(1).key, operation="erase"), "delete operation"),
        (line(kind="build", group=GID, outcome="ok", generation=2), "generation and checksum"),
    ],
)
def test_a_malformed_version_1_line_is_refused_naming_the_line(bad: str, why: str) -> None:
    with pytest.raises(TraceError, match=rf"^line 3: .*{re.escape(why)}"):
        read_trace([put(1), line(kind="tick", seconds=1), bad, put(2)])
    with pytest.raises(TraceError, match=r"^line 3: "):
        replay([put(1), line(kind="tick", seconds=1), bad, put(2)])
