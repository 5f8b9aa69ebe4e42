"""Golden replays: the bundled example traces replay to their reviewed outputs, byte for byte."""

from __future__ import annotations

import importlib.resources
import json
from pathlib import Path

import pytest
from workerset_admission.cli import main
from workerset_admission.traces.replay import explain, render, replay

EXAMPLES = importlib.resources.files("workerset_admission.examples")
NAMES = ["rolling_update_clean", "rolling_update_conflict", "lora_adapters", "rolling_update_drained"]


def _text(name: str) -> str:
    return EXAMPLES.joinpath(name).read_text(encoding="utf-8")


@pytest.mark.parametrize("name", NAMES)
def test_an_example_trace_replays_to_its_expected_output(name: str) -> None:
    result = replay(_text(f"{name}.jsonl").splitlines())
    assert render(result) == _text(f"{name}.expected.json")


@pytest.mark.parametrize("name", NAMES)
def test_an_example_trace_explains_its_instances_as_recorded(name: str) -> None:
    expected = json.loads(_text(f"{name}.explain.json"))
    result = replay(_text(f"{name}.jsonl").splitlines())
    assert expected
    assert {key: explain(result, key) for key in expected} == expected


@pytest.mark.parametrize("name", NAMES)
def test_the_replay_command_prints_the_expected_bytes(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / f"{name}.jsonl"
    trace.write_text(_text(f"{name}.jsonl"), encoding="utf-8")
    assert main(["replay", str(trace)]) == 0
    assert capsys.readouterr().out == _text(f"{name}.expected.json")


def test_the_example_traces_are_shipped_as_package_data() -> None:
    shipped = {p.name for p in EXAMPLES.iterdir()}
    for name in NAMES:
        assert {f"{name}.jsonl", f"{name}.expected.json", f"{name}.explain.json"} <= shipped
