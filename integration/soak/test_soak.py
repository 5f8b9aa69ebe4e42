"""Bounded soak runs, one per mode, each with a fixed seed printed in the log (``-m soak``).

Each runs ``python -m integration.soak`` for a few minutes and fails on any violation, on too
few faults or quiet points, and (views mode) on a leak of the steady frontend. Longer runs are
made by hand with the same command; ``docs/faults.md`` has their figures.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from natsfixture import show

from soak.net import tools_missing

pytestmark = [pytest.mark.integration, pytest.mark.soak, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
SEED = int(os.environ.get("WORKERSET_ADMISSION_SOAK_SEED", "4141"))

if os.geteuid() != 0 or tools_missing():
    pytest.skip(
        f"the soak needs root and ip, iptables, tc, nsenter (missing: {tools_missing()})",
        allow_module_level=True,
    )


def _soak(tmp_path: Path, *args: str, minutes: float) -> dict[str, Any]:
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "integration.soak", "--minutes", f"{minutes:g}"]
    argv += ["--seed", str(SEED), "--out", str(out), *args]
    show(f"[soak] {' '.join(argv[1:])}")
    process = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        output, _ = process.communicate(timeout=minutes * 60 + 240)
    except subprocess.TimeoutExpired:
        # SIGTERM lets the soak remove its namespaces, mounts and processes.
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=90)
    text = output.decode(errors="replace")
    for line in text.splitlines():
        if line.startswith(("soak:", "FAIL:")):
            show(f"[soak] {line}")
    report_file = out / "report.json"
    assert report_file.exists(), text[-3000:]
    report: dict[str, Any] = json.loads(report_file.read_text())
    show(f"[soak] faults {report['faults']}")
    assert process.returncode == 0, text[-3000:]
    assert report["violations"] == []
    return report


def test_frontends_on_views_under_churn_and_seeded_faults(tmp_path: Path) -> None:
    report = _soak(tmp_path, "--mode", "views", "--active", "30", minutes=3)
    show(f"[soak] views: {report['quiet_points']} quiet points, {report['steps']} steps")
    assert report["quiet_points"] >= 3
    assert report["process_kills"] >= 5
    assert sum(report["faults"].values()) >= 15
    assert report["operations"].get("succession", 0) >= 1
    fe0 = report["leaks"]["fe-0"]
    assert fe0["samples"] >= 10
    assert {"rss_mb", "fds", "tasks", "subscriptions"} <= set(fe0)


@pytest.mark.cluster
def test_frontends_on_a_three_node_cluster_under_churn_and_seeded_faults(tmp_path: Path) -> None:
    report = _soak(tmp_path, "--mode", "cluster", "--active", "30", minutes=2)
    assert report["quiet_points"] >= 2
    assert report["process_kills"] >= 3


@pytest.mark.dynamo
def test_the_real_frontend_on_a_view_beside_dynamo_alone_under_seeded_faults(
    tmp_path: Path,
) -> None:
    pytest.importorskip("dynamo.frontend.main", reason="needs ai-dynamo==1.6.1")
    from soak.frontend import SERVE_FAULTS

    # The first round runs every fault of serve once (two of them up to 70 s): about 4 minutes.
    report = _soak(tmp_path, "--mode", "frontend", minutes=5)
    show(f"[soak] frontend: requests {report['requests']}, failed {report['failed']}")
    show(f"[soak] faults of serve: {report['serve_faults']}")
    assert report["answered_by_rejected"] == 0
    assert report["answered_by_drained"] == 0
    assert set(SERVE_FAULTS) <= set(report["faults"])
    for kind in ("kill serve, late restart", "stop serve over 10 s"):
        assert report["serve_faults"][kind]["longest_s"] > 10.0
    assert report["requests"]["view"] > 1000
