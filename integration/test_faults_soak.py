"""The soak script, run small: a few seconds of churn over 50 groups must stay flat and clean.

The real soak (``integration/bench/soak.py``, minutes over 1,000 groups) is run by hand or in a
benchmark job; this keeps the script working and its checks honest in every test run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# The rollout tier (docs/testing.md): long faults and concurrency trials, its own CI step.
pytestmark = [pytest.mark.integration, pytest.mark.rollout, pytest.mark.timeout(120)]

SOAK = Path(__file__).parent / "bench" / "soak.py"


def test_a_short_soak_over_fifty_groups_stays_flat(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    completed = subprocess.run(
        [
            sys.executable,
            str(SOAK),
            "--minutes",
            "0.15",
            "--groups",
            "50",
            "--rate",
            "40",
            "--warmup",
            "2",
            "--sample",
            "3",
            "--check-every",
            "0",
            "--max-growth-mb",
            "15",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["operations"] > 100
    assert result["successions"] > 0
    assert result["watchdog_violations"] == 0
    assert result["watchdog_checks"] > 100
    assert result["orphan_channels"] == 0
    assert result["end"]["channels"] == result["end"]["tenures"] == 50
