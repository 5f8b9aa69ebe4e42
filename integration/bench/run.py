"""Measure every performance target with one command and say which are met.

``python integration/bench/run.py [--quick] [--all] [--only NAME] [--timeout SECONDS]``

Runs ``bench_sync.py`` (initial sync at 1k, 10k and 50k registrations against a bare nats-py
watch, the heap held per worker at each size, resync after a server restart, publish-to-receiver
latency) and ``bench_core.py`` (``apply()`` on the realistic mix), each in its own process and
bounded by ``--timeout``. ``--all`` adds the other ``bench_*.py`` scripts. Afterwards it prints
one row per target with its figure and whether it is met, writes ``results/run.json`` (with the
machine it ran on) and draws ``docs/bench/targets.png``: sync rate against fleet size, plugin
against bare nats-py, and the heap held against fleet size. ``--quick`` sets ``BENCH_QUICK=1``
(smaller fleets, one run each) for a smoke run; its figures are not the targets' figures and its
chart goes to ``results/targets-quick.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
RESULTS = HERE / "results"
CHART = HERE.parents[1] / "docs" / "bench" / "targets.png"
TARGET_BENCHES = ("bench_sync", "bench_core")
KIB = 1024


@dataclass(frozen=True, slots=True)
class Target:
    """One performance target, its measured figure and whether the figure meets it."""

    name: str
    target: str
    figure: str
    met: bool | None


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


def _missing(name: str, target: str) -> Target:
    return Target(name, target, "not measured", None)


def targets(sync: dict[str, Any] | None, core: dict[str, Any] | None) -> list[Target]:
    """The six performance targets, judged from the two benchmarks' result files."""
    rows: list[Target] = []
    fleets = {}
    if sync:
        largest = max(row["workers"] for row in sync["sync"])
        fleets = {r["fleet"]: r for r in sync["sync"] if r["workers"] == largest}
    for fleet, floor, label in (
        ("shared", 0.8, "cohort members sharing one card"),
        ("distinct", 0.5, "every card distinct"),
    ):
        name = f"initial sync, {label}"
        row = fleets.get(fleet)
        if row is None:
            rows.append(_missing(name, f">= {floor} x bare"))
            continue
        rows.append(
            Target(
                f"{name} ({row['workers']:,})",
                f">= {floor} x bare",
                f"{row['ratio']:.2f} x ({row['plugin_rate']:,.0f}/s vs {row['bare_rate']:,.0f}/s)",
                row["ratio"] >= floor,
            )
        )
    lat = sync.get("latency") if sync else None
    name = "publish -> receiver at 1,000/s"
    if lat:
        rows.append(
            Target(
                name,
                "p99 <= 5 ms, p50 <= 1 ms",
                f"p99 {lat['p99_ms']:.2f} ms, p50 {lat['p50_ms']:.2f} ms",
                lat["p99_ms"] <= 5.0 and lat["p50_ms"] <= 1.0,
            )
        )
    else:
        rows.append(_missing(name, "p99 <= 5 ms, p50 <= 1 ms"))
    resync = sync.get("resync") if sync else None
    name = "reconnect reconciliation, nothing changed"
    if resync:
        rows.append(
            Target(
                f"{name} ({resync['workers']:,})",
                "<= 1.5 x bare sync, no receiver notified",
                f"{resync['resync_vs_bare_sync']:.2f} x "
                f"({resync['resync_after_restart_s']:.3f} s), "
                f"notified: {'yes' if resync['receiver_notified'] else 'no'}",
                resync["resync_vs_bare_sync"] <= 1.5 and not resync["receiver_notified"],
            )
        )
    else:
        rows.append(_missing(name, "<= 1.5 x bare sync, no receiver notified"))
    single = None
    if core:
        single = next((r for r in core["core"] if r["mode"].startswith("apply (")), None)
    name = "core apply(), realistic mix"
    if single:
        rows.append(
            Target(
                f"{name} ({core['groups']:,} groups, {core['workers']:,} workers)",  # type: ignore[index]
                ">= 200,000 inputs/s",
                f"{single['inputs_per_second']:,}/s ({single['inputs_per_cpu_second']:,}/s of CPU)",
                single["inputs_per_second"] >= 200_000,
            )
        )
    else:
        rows.append(_missing(name, ">= 200,000 inputs/s"))
    memory = sync.get("memory") if sync else None
    name = "heap per tracked worker (shared card)"
    if memory:
        largest_row = max(memory, key=lambda r: r["workers"])
        rows.append(
            Target(
                f"{name} ({largest_row['workers']:,})",
                "<= 1 KiB",
                f"{largest_row['per_worker_bytes']} B",
                largest_row["per_worker_bytes"] <= KIB,
            )
        )
    else:
        rows.append(_missing(name, "<= 1 KiB"))
    return rows


def machine(sync: dict[str, Any] | None) -> dict[str, Any]:
    """What the figures were taken on."""
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        load = Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        load = "unknown"
    return {
        "nproc": os.cpu_count(),
        "cpu": model,
        "python": platform.python_version(),
        "nats_server": (sync or {}).get("nats_server", "unknown"),
        "load_average_at_end": load,
    }


def draw_chart(sync: dict[str, Any], path: Path) -> bool:
    """Sync rate and held heap against fleet size."""
    rows = sync.get("sync") or []
    if not rows:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (rates, heap) = plt.subplots(1, 2, figsize=(11, 4.2))
    for fleet, style in (("shared", "-"), ("distinct", "--")):
        mine = sorted((r for r in rows if r["fleet"] == fleet), key=lambda r: r["workers"])
        if not mine:
            continue
        sizes = [r["workers"] for r in mine]
        rates.plot(
            sizes,
            [r["plugin_rate"] for r in mine],
            style,
            color="tab:blue",
            marker="o",
            label=f"admission service, {fleet} cards",
        )
        rates.plot(
            sizes,
            [r["bare_rate"] for r in mine],
            style,
            color="tab:orange",
            marker="x",
            label=f"bare nats-py watch + json.loads, {fleet} cards",
        )
    rates.set_xscale("log")
    rates.set_ylim(bottom=0)
    rates.set_xlabel("registrations in the bucket")
    rates.set_ylabel("initial sync rate (registrations/s)")
    rates.set_title("Initial sync")
    rates.grid(True, which="both", alpha=0.3)
    rates.legend(fontsize=7)
    memory = sorted(sync.get("memory") or [], key=lambda r: r["workers"])
    if memory:
        sizes = [r["workers"] for r in memory]
        heap.plot(
            sizes,
            [r["heap_bytes"] / 2**20 for r in memory],
            "-o",
            color="tab:green",
            label="traced heap held by the service",
        )
        heap.plot(
            sizes,
            [n * KIB / 2**20 for n in sizes],
            ":",
            color="tab:red",
            label="target: 1 KiB per worker",
        )
        for row in memory:
            heap.annotate(
                f"{row['per_worker_bytes']} B/worker",
                (row["workers"], row["heap_bytes"] / 2**20),
                textcoords="offset points",
                xytext=(-60, 8),
                fontsize=7,
            )
        heap.set_xlabel("tracked workers (one shared card)")
        heap.set_ylabel("MiB")
        heap.set_title("Memory held after the initial sync")
        heap.grid(True, alpha=0.3)
        heap.legend(fontsize=7)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True


def _read(name: str) -> dict[str, Any] | None:
    try:
        data = json.loads((RESULTS / f"{name}.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller fleets, one run each")
    parser.add_argument("--all", action="store_true", help="also run the other benchmarks")
    parser.add_argument("--only", action="append", help="run only this bench (repeatable)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per benchmark")
    parser.add_argument("--chart", type=Path, help="where to draw the chart")
    args = parser.parse_args(argv)
    if args.chart is None:
        # A smoke run's small fleets must not replace the documented chart.
        args.chart = RESULTS / "targets-quick.png" if args.quick else CHART
    benches = sorted(HERE.glob("bench_*.py"))
    if args.only:
        wanted = {name.removesuffix(".py") for name in args.only}
        benches = [b for b in benches if b.stem in wanted]
    elif not args.all:
        benches = [b for b in benches if b.stem in TARGET_BENCHES]
    RESULTS.mkdir(exist_ok=True)
    started = time.monotonic()
    runs = [run_bench(path, args.timeout, args.quick) for path in benches]
    sync, core = _read("bench_sync"), _read("bench_core")
    rows = targets(sync, core)
    print("\n=== runs")
    for run in runs:
        print(f"{run['bench']:28s} {run['status']:24s} {run['seconds']:>7.1f} s")
    print(
        "\n=== targets"
        + (" (quick run: smaller fleets, not the targets' sizes)" if args.quick else "")
    )
    width = max(len(r.name) for r in rows)
    twidth = max(len(r.target) for r in rows)
    for row in rows:
        flag = {True: "MET", False: "MISSED", None: "-"}[row.met]
        print(f"{row.name:{width}s}  {row.target:{twidth}s}  {flag:6s}  {row.figure}")
    where = machine(sync)
    print(
        f"\n{where['nproc']} CPUs ({where['cpu']}), Python {where['python']}, "
        f"nats-server {where['nats_server']}, load {where['load_average_at_end']}"
    )
    if sync is not None and draw_chart(sync, args.chart):
        print(f"chart: {args.chart}")
    (RESULTS / "run.json").write_text(
        json.dumps(
            {
                "quick": args.quick,
                "seconds": round(time.monotonic() - started, 1),
                "machine": where,
                "runs": runs,
                "targets": [asdict(r) for r in rows],
            },
            indent=2,
        )
        + "\n"
    )
    return 0 if all(r["status"] == "ok" for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
