"""The README's and docs/'s command examples, run as written (the offline ones: no network)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.docs import ROOT, Block, command_blocks, marked

RUNS = (
    "runs offline",
    "runs beside a local serve",
    "runs as the walkthrough, with real Dynamo",
)


def _kind(block: Block) -> str:
    marker = block.marker or ""
    if marker.startswith("not run here: ") and len(marker) > len("not run here: ") + 10:
        return "not run"
    for kind in RUNS:
        if marker == kind or marker.startswith(f"{kind}, exit "):
            return kind
    return "unmarked"


def test_every_command_example_is_run_by_the_suite_or_says_why_not() -> None:
    kinds = {block.where: _kind(block) for block in command_blocks()}
    assert [where for where, kind in kinds.items() if kind == "unmarked"] == []
    # The runnable ones, by their first command: README's replay and diff, the walkthrough, the
    # runbook's status.
    runnable = [b for b in command_blocks() if _kind(b) != "not run"]
    assert sorted(_first_command(b) for b in runnable) == [
        "$ workerset-admission diff examples/serving-card.json examples/new-card.json",
        ".venv/bin/workerset-admission replay plugin/examples/rolling_update_conflict.jsonl",
        "WORK=${WORK:-$(mktemp -d)} NATS_PORT=${NATS_PORT:-4222} HTTP_PORT=${HTTP_PORT:-8000}",
        "workerset-admission status                  # one row per WorkerSet: incumbent, "
        "status, admitted, rejected",
    ]


def _first_command(block: Block) -> str:
    return next(
        line for line in block.text.splitlines() if line.strip() and not line.startswith("#")
    )


def example_env(bin_dir: Path) -> dict[str, str]:
    """The environment of an example: the venv's commands first, no settings of the caller's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WORKERSET_ADMISSION_")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return env


def split_transcript(text: str) -> tuple[str, str | None]:
    """Split a ``$ command`` transcript into its script and the output it shows."""
    lines = text.splitlines()
    if not lines or not lines[0].startswith("$ "):
        return text, None
    script = [line[2:] for line in lines if line.startswith("$ ")]
    shown = [line for line in lines if not line.startswith("$ ")]
    return "\n".join(script) + "\n", "\n".join(shown) + "\n"


def run_block(block: Block, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    script, _shown = split_transcript(block.text)
    # The project's own paths (.venv/bin/...) become the running interpreter's.
    script = script.replace(".venv/bin/", "")
    return subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", script],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


OFFLINE = [b for b in command_blocks() if _kind(b) == "runs offline"]


@pytest.mark.parametrize("block", OFFLINE, ids=[b.where for b in OFFLINE])
def test_an_offline_example_runs_as_written_and_prints_what_it_shows(block: Block) -> None:
    ran = run_block(block, ROOT, example_env(Path(sys.executable).parent))
    assert ran.returncode == block.expected_status(), ran.stderr
    _script, shown = split_transcript(block.text)
    if shown is not None:
        assert ran.stdout == shown
    assert "Traceback" not in ran.stderr


def test_every_output_the_docs_show_is_checked_or_says_why_not() -> None:
    outputs = marked("output")
    assert outputs
    for block in outputs:
        marker = block.marker or ""
        assert marker.startswith("output of ") or re.match(
            r"output not checked here: .{10,}", marker
        ), block.where
