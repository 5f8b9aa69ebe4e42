"""Run every benchmark in this folder with one command and summarize what they measured.

``python integration/bench/run.py [--quick] [--only NAME] [--timeout SECONDS]``

Each ``bench_*.py`` script runs in its own process (bounded by ``--timeout``), its output is
shown as it goes, and afterwards the JSON files the benchmarks wrote under ``results/`` are
gathered into one table with ratios, saved as ``results/run.json``, and the initial-sync figures
are drawn as ``results/bench_sync.png`` (rate against fleet size, plugin against bare nats-py).
``--quick`` sets ``BENCH_QUICK=1``, which benchmarks that support it read as "smaller and once".
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
RESULTS = HERE / "results"


def run_bench(path: Path, timeout: float, quick: bool) -> dict[str, Any]:
    env = dict(os.environ)
    if quick:
        env["BENCH_QUICK"] = "1"
    print(f"\n=== {path.name}", flush=True)
    started = time.monotonic()
    try:
        completed = subprocess.run(
            [sys.executable, str(path)], env=env, timeout=timeout, check=False, cwd=HERE
        )
        status = "ok" if completed.returncode == 0 else f"exit {completed.returncode}"
    except subprocess.TimeoutExpired:
        status = f"timed out after {timeout:.0f} s"
    return {"bench": path.stem, "status": status, "seconds": round(time.monotonic() - started, 1)}


def _flatten(prefix: str, value: Any, out: dict[str, float]) -> None:
    if isinstance(value, dict):
        for key, inner in value.items():
            _flatten(f"{prefix}.{key}" if prefix else str(key), inner, out)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        out[prefix] = float(value)


def summary_rows(results: dict[str, Any]) -> list[tuple[str, str, str]]:
    """One row per ratio-like figure of every results file, plus the sync bench's details."""
    rows: list[tuple[str, str, str]] = []
    for name, data in sorted(results.items()):
        if name == "bench_sync" and isinstance(data, dict):
            rows.extend(
                (
                    name,
                    f"initial sync, {row['fleet']} cards, {row['workers']:,} workers",
                    f"{row['plugin_rate']:,.0f}/s vs bare {row['bare_rate']:,.0f}/s "
                    f"= {row['ratio']:.2f}x",
                )
                for row in data.get("sync", [])
            )
            resync = data.get("resync", {})
            if resync:
                rows.append(
                    (
                        name,
                        "resync after server restart, nothing changed",
                        f"{resync['resync_after_restart_s']} s = "
                        f"{resync['resync_vs_bare_sync']}x bare sync; receiver notified: "
                        f"{resync['receiver_notified']}",
                    )
                )
                rows.append(
                    (name, "heap per tracked worker", f"{resync['heap_per_worker_bytes']} B")
                )
            lat = data.get("latency", {})
            if lat:
                rows.append(
                    (
                        name,
                        f"publish -> receiver at {lat['rate_per_s']}/s",
                        f"p50 {lat['p50_ms']} ms, p99 {lat['p99_ms']} ms",
                    )
                )
            continue
        flat: dict[str, float] = {}
        _flatten("", data, flat)
        for key, value in flat.items():
            if "ratio" in key or key.endswith("_vs_bare") or "speedup" in key:
                rows.append((name, key, f"{value:.3f}"))
    return rows


def draw_sync_chart(data: dict[str, Any], path: Path) -> bool:
    rows = data.get("sync") or []
    if not rows:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4.2))
    for fleet, style in (("shared", "-"), ("distinct", "--")):
        mine = sorted((r for r in rows if r["fleet"] == fleet), key=lambda r: r["workers"])
        if not mine:
            continue
        sizes = [r["workers"] for r in mine]
        axis.plot(
            sizes,
            [r["plugin_rate"] for r in mine],
            style,
            color="tab:blue",
            marker="o",
            label=f"plugin, {fleet} cards",
        )
        axis.plot(
            sizes,
            [r["bare_rate"] for r in mine],
            style,
            color="tab:orange",
            marker="x",
            label=f"bare nats-py watch + json.loads, {fleet} cards",
        )
    axis.set_xscale("log")
    axis.set_xlabel("registrations in the bucket")
    axis.set_ylabel("initial sync rate (registrations/s)")
    axis.set_title("Initial sync: admission service vs bare KV watch")
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller fleets, one run each")
    parser.add_argument("--only", action="append", help="run only this bench (repeatable)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per benchmark")
    args = parser.parse_args(argv)
    benches = sorted(HERE.glob("bench_*.py"))
    if args.only:
        wanted = {name.removesuffix(".py") for name in args.only}
        benches = [b for b in benches if b.stem in wanted]
    RESULTS.mkdir(exist_ok=True)
    runs = [run_bench(path, args.timeout, args.quick) for path in benches]
    results: dict[str, Any] = {}
    for path in sorted(RESULTS.glob("bench_*.json")):
        try:
            results[path.stem] = json.loads(path.read_text())
        except (OSError, ValueError):  # noqa: PERF203 - a broken file is skipped, not fatal
            continue
    rows = summary_rows(results)
    print("\n=== summary")
    for run in runs:
        print(f"{run['bench']:28s} {run['status']:24s} {run['seconds']:>7.1f} s")
    if rows:
        width = max(len(r[1]) for r in rows)
        print()
        for bench, figure, value in rows:
            print(f"{bench:24s} {figure:{width}s}  {value}")
    chart = RESULTS / "bench_sync.png"
    if "bench_sync" in results and draw_sync_chart(results["bench_sync"], chart):
        print(f"\nchart: {chart}")
    (RESULTS / "run.json").write_text(
        json.dumps({"runs": runs, "summary": [list(r) for r in rows]}, indent=2) + "\n"
    )
    return 0 if all(r["status"] == "ok" for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
