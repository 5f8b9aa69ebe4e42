"""Dynamo's controller and readiness tests, replayed as traces, give their reviewed outputs.

Each trace in ``tests/golden/controller`` retells one test of Dynamo's
``lib/llm/src/discovery/controller.rs`` or ``readiness.rs`` and is named after it; its replay
output (and, for readiness tests, the readiness of what the replay serves) is compared byte for
byte. ``plugin/CONTRACT.md`` names the Dynamo test of every trace, says where the project
deliberately differs, and lists the Dynamo tests no trace can express.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from trace_readiness import readiness_of
from workerset_admission.admission import GroupStatus
from workerset_admission.traces.replay import render, replay

FOLDER = Path(__file__).with_name("controller")
CONTRACT = Path(__file__).resolve().parents[2] / "plugin" / "CONTRACT.md"
NAMES = sorted(p.name.removesuffix(".jsonl") for p in FOLDER.glob("*.jsonl"))
READINESS = sorted(p.name.removesuffix(".readiness.json") for p in FOLDER.glob("*.readiness.json"))


def lines(name: str) -> list[str]:
    return (FOLDER / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()


def contract_rows(section: str) -> dict[str, str]:
    """Dynamo test name -> its row, from one table of the contract's parity section."""
    text = CONTRACT.read_text(encoding="utf-8")
    body = text.split(f"### {section}", 1)[1].split("\n#", 1)[0]
    rows = {}
    for row in body.splitlines():
        found = re.match(r"\| `([a-z0-9_]+)` \|", row)
        if found:
            rows[found.group(1)] = row
    return rows


def test_there_is_a_trace_for_every_ported_test_of_both_files() -> None:
    assert len(NAMES) >= 20
    assert len(READINESS) == 6


@pytest.mark.parametrize("name", NAMES)
def test_a_controller_trace_replays_to_its_expected_output(name: str) -> None:
    expected = (FOLDER / f"{name}.expected.json").read_text(encoding="utf-8")
    assert render(replay(lines(name))) == expected


@pytest.mark.parametrize("name", READINESS)
def test_a_readiness_trace_serves_what_dynamo_calls_ready(name: str) -> None:
    expected = json.loads((FOLDER / f"{name}.readiness.json").read_text(encoding="utf-8"))
    assert readiness_of(replay(lines(name)), lines(name)) == expected


def test_a_compatible_join_during_a_retry_backoff_rebuilds_at_once() -> None:
    # The trace has no tick: only an immediate rebuild can reach the second build line.
    trace = lines("desired_change_retries_a_failed_build_immediately")
    assert not any(json.loads(line)["kind"] == "tick" for line in trace)
    (group,) = replay(trace).core.groups()
    assert (group.status, group.generation, group.admitted) == (GroupStatus.READY, 2, (1, 2))


def test_every_trace_names_its_dynamo_test_in_the_contract() -> None:
    ported = contract_rows("Ported as replay traces")
    assert sorted(ported) == NAMES
    for row in ported.values():
        assert "controller.rs" in row or "readiness.rs" in row, row


def test_the_tests_left_out_have_no_trace_and_a_reason() -> None:
    left_out = contract_rows("Left out")
    assert left_out
    for name, row in left_out.items():
        assert name not in NAMES
        assert len(row.split("|")[-2].strip()) > 20, row
