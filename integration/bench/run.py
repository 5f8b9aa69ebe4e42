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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
RESULTS = HERE / "results"
CHART = HERE.parents[1] / "docs" / "bench" / "targets.png"
TARGET_BENCHES = ("bench_sync", "bench_core")
KIB = 1024


@dataclass(frozen=True, slots=True)
class Target:
    """One performance target: the figure it bounds, the bound, and what was measured.

    ``measured`` and ``required`` are the bounded figure and its bound (a ratio, milliseconds
    or bytes); ``at_least`` says which side of the bound meets it. ``margin`` is measured over
    required as is; ``headroom`` turns it so that above 1 always means met (for an upper bound
    it is required over measured).
    """

    name: str
    target: str
    figure: str
    measured: float | None
    required: float
    at_least: bool
    condition: bool = True

    @property
    def met(self) -> bool | None:
        if self.measured is None:
            return None
        inside = self.measured >= self.required if self.at_least else self.measured <= self.required
        return inside and self.condition

    @property
    def margin(self) -> float | None:
        return None if self.measured is None else self.measured / self.required

    @property
    def headroom(self) -> float | None:
        if self.measured is None:
            return None
        if self.at_least:
            return self.measured / self.required
        return self.required / self.measured if self.measured > 0 else float("inf")

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "target": self.target,
            "figure": self.figure,
            "measured": self.measured,
            "required": self.required,
            "at_least": self.at_least,
            "met": self.met,
            "margin": None if self.margin is None else round(self.margin, 3),
            "headroom": None if self.headroom is None else round(self.headroom, 3),
        }


def run_bench(path: Path, timeout: float, quick: bool) -> dict[str, Any]:
    env = dict(os.environ)
    if quick:
        env["BENCH_QUICK"] = "1"
    print(f"\n=== {path.name}", flush=True)
    # A benchmark that fails must not leave an earlier run's figures to be read as its own.
    (RESULTS / f"{path.stem}.json").unlink(missing_ok=True)
    started = time.monotonic()
    try:
        completed = subprocess.run(
            [sys.executable, str(path)], env=env, timeout=timeout, check=False, cwd=HERE
        )
        status = "ok" if completed.returncode == 0 else f"exit {completed.returncode}"
    except subprocess.TimeoutExpired:
        status = f"timed out after {timeout:.0f} s"
    return {"bench": path.stem, "status": status, "seconds": round(time.monotonic() - started, 1)}


def _missing(name: str, target: str, required: float, at_least: bool) -> Target:
    return Target(name, target, "not measured", None, required, at_least)


# Floors (at least) and ceilings (at most) of the targets, all ratios or sizes taken in one run.
SHARED_FLOOR = 2.0
DISTINCT_FLOOR = 1.0
P99_MS = 5.0
P50_MS = 1.0
RESYNC_CEILING = 1.5
# The core is plain code (no construction tricks): 3.5 x the tracker, not the 3.0 x of old.
CORE_CEILING = 3.5
HEAP_CEILING = KIB


def targets(sync: dict[str, Any] | None, core: dict[str, Any] | None) -> list[Target]:
    """The performance targets, judged from the two benchmarks' result files."""
    rows: list[Target] = []
    fleets = {}
    if sync:
        largest = max(row["workers"] for row in sync["sync"])
        fleets = {r["fleet"]: r for r in sync["sync"] if r["workers"] == largest}
    for fleet, floor, label in (
        ("shared", SHARED_FLOOR, "one card shared by the fleet"),
        ("distinct", DISTINCT_FLOOR, "every card distinct"),
    ):
        name = f"initial sync, {label}"
        target = f">= {floor} x bare"
        row = fleets.get(fleet)
        if row is None:
            rows.append(_missing(name, target, floor, True))
            continue
        rows.append(
            Target(
                f"{name} ({row['workers']:,})",
                target,
                f"{row['ratio']:.2f} x ({row['plugin_rate']:,.0f}/s vs {row['bare_rate']:,.0f}/s)",
                row["ratio"],
                floor,
                True,
            )
        )
    lat = sync.get("latency") if sync else None
    for label, field, ceiling in (("p99", "p99_ms", P99_MS), ("p50", "p50_ms", P50_MS)):
        name = f"publish -> receiver at 1,000/s, {label}"
        target = f"<= {ceiling:g} ms"
        if lat:
            rows.append(
                Target(
                    name,
                    target,
                    f"{lat[field]:.2f} ms (max {lat['max_ms']:.2f} ms, {lat['updates']:,} updates)",
                    lat[field],
                    ceiling,
                    False,
                )
            )
        else:
            rows.append(_missing(name, target, ceiling, False))
    resync = sync.get("resync") if sync else None
    name = "reconnect reconciliation, nothing changed"
    target = f"<= {RESYNC_CEILING} x bare sync, no receiver notified"
    if resync:
        rows.append(
            Target(
                f"{name} ({resync['workers']:,})",
                target,
                f"{resync['resync_vs_bare_sync']:.2f} x "
                f"({resync['resync_after_restart_s']:.3f} s), "
                f"notified: {'yes' if resync['receiver_notified'] else 'no'}",
                resync["resync_vs_bare_sync"],
                RESYNC_CEILING,
                False,
                condition=not resync["receiver_notified"],
            )
        )
    else:
        rows.append(_missing(name, target, RESYNC_CEILING, False))
    versus = core.get("versus_tracker") if core else None
    name = "core apply(), realistic mix, CPU per input"
    target = f"<= {CORE_CEILING} x membership tracker"
    if versus and core:
        rows.append(
            Target(
                f"{name} ({core['groups']:,} groups, {core['workers']:,} workers)",
                target,
                f"{versus['ratio']:.2f} x ({versus['core_us_per_input']:.2f} us vs "
                f"{versus['tracker_us_per_input']:.2f} us)",
                versus["ratio"],
                CORE_CEILING,
                False,
            )
        )
    else:
        rows.append(_missing(name, target, CORE_CEILING, False))
    memory = sync.get("memory") if sync else None
    name = "heap per tracked worker (shared card)"
    target = "<= 1 KiB"
    if memory:
        largest_row = max(memory, key=lambda r: r["workers"])
        rows.append(
            Target(
                f"{name} ({largest_row['workers']:,})",
                target,
                f"{largest_row['per_worker_bytes']} B",
                largest_row["per_worker_bytes"],
                HEAP_CEILING,
                False,
            )
        )
    else:
        rows.append(_missing(name, target, HEAP_CEILING, False))
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


def draw_chart(sync: dict[str, Any] | None, rows: list[Target], path: Path) -> bool:
    """Each target's headroom, the sync ratio against fleet size, and held heap."""
    measured = [r for r in rows if r.headroom is not None]
    if not measured:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (margins, ratios, heap) = plt.subplots(
        1, 3, figsize=(17, 4.8), gridspec_kw={"width_ratios": [1.2, 1, 1]}
    )
    labels = [f"{r.name.split(' (')[0]}\n{r.target}" for r in measured]
    cap = 4.0
    values = [min(r.headroom or 0.0, cap) for r in measured]
    colours = ["tab:green" if r.met else "tab:red" for r in measured]
    positions = list(range(len(measured)))[::-1]
    margins.barh(positions, values, color=colours, alpha=0.8)
    margins.axvline(1.0, color="black", linestyle="--", linewidth=1, label="target (1.0)")
    margins.set_xlim(0, cap * 1.15)
    margins.set_yticks(positions)
    margins.set_yticklabels(labels, fontsize=6)
    for y, row in zip(positions, measured, strict=True):
        margins.annotate(
            f"{row.headroom:.2f} x",
            (min(row.headroom or 0.0, cap), y),
            textcoords="offset points",
            xytext=(3, -3),
            fontsize=7,
        )
    margins.set_xlabel(f"headroom (measured / required, inverted for upper bounds; cut at {cap:g})")
    margins.set_title("Every target against its bound")
    margins.grid(True, axis="x", which="both", alpha=0.3)
    margins.legend(fontsize=7, loc="lower right")
    sync_rows = (sync or {}).get("sync") or []
    for fleet, floor, colour in (
        ("shared", SHARED_FLOOR, "tab:blue"),
        ("distinct", DISTINCT_FLOOR, "tab:purple"),
    ):
        mine = sorted((r for r in sync_rows if r["fleet"] == fleet), key=lambda r: r["workers"])
        if not mine:
            continue
        sizes = [r["workers"] for r in mine]
        ratios.plot(
            sizes,
            [r["ratio"] for r in mine],
            "-o",
            color=colour,
            label=f"service / bare nats-py, {fleet} cards",
        )
        ratios.axhline(floor, color=colour, linestyle=":", label=f"target, {fleet}: {floor:g} x")
    ratios.set_xscale("log")
    ratios.set_ylim(bottom=0)
    ratios.set_xlabel("registrations in the bucket")
    ratios.set_ylabel("initial sync rate, service over bare (x)")
    ratios.set_title("Initial sync against a bare nats-py watch")
    ratios.grid(True, which="both", alpha=0.3)
    ratios.legend(fontsize=7)
    memory = sorted((sync or {}).get("memory") or [], key=lambda r: r["workers"])
    if memory:
        sizes = [r["workers"] for r in memory]
        heap.plot(
            sizes,
            [r["per_worker_bytes"] for r in memory],
            "-o",
            color="tab:green",
            label="traced heap held per worker",
        )
        heap.axhline(HEAP_CEILING, color="tab:red", linestyle=":", label="target: 1 KiB per worker")
        heap.set_xscale("log")
        heap.set_ylim(bottom=0, top=HEAP_CEILING * 1.25)
        heap.set_xlabel("tracked workers (one shared card)")
        heap.set_ylabel("bytes per worker")
        heap.set_title("Memory held after the initial sync")
        heap.grid(True, which="both", alpha=0.3)
        heap.legend(fontsize=7)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True


def table(rows: list[Target]) -> str:
    """The targets as a table: bound, met or not, margin and headroom, and the figure."""
    width = max(len(r.name) for r in rows)
    twidth = max(len(r.target) for r in rows)
    lines = [
        f"{'target':{width}s}  {'required':{twidth}s}  {'':6s}  {'margin':>7s}  "
        f"{'headroom':>8s}  measured"
    ]
    for row in rows:
        flag = {True: "MET", False: "MISSED", None: "-"}[row.met]
        margin = "-" if row.margin is None else f"{row.margin:.2f}"
        headroom = "-" if row.headroom is None else f"{row.headroom:.2f} x"
        lines.append(
            f"{row.name:{width}s}  {row.target:{twidth}s}  {flag:6s}  {margin:>7s}  "
            f"{headroom:>8s}  {row.figure}"
        )
    lines.append(
        "margin = measured / required; headroom = the same, inverted for an upper bound "
        "(above 1 is met)"
    )
    return "\n".join(lines)


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
    print(table(rows))
    where = machine(sync)
    print(
        f"\n{where['nproc']} CPUs ({where['cpu']}), Python {where['python']}, "
        f"nats-server {where['nats_server']}, load {where['load_average_at_end']}"
    )
    if draw_chart(sync, rows, args.chart):
        print(f"chart: {args.chart}")
    (RESULTS / "run.json").write_text(
        json.dumps(
            {
                "quick": args.quick,
                "seconds": round(time.monotonic() - started, 1),
                "machine": where,
                "runs": runs,
                "targets": [r.as_json() for r in rows],
            },
            indent=2,
        )
        + "\n"
    )
    if args.quick:
        # A smoke run reports its ratios and never judges them (small fleets on a busy CI
        # machine); only a benchmark that crashed fails it.
        missed = [r.name for r in rows if r.met is False]
        if missed:
            print(
                f"quick run: {len(missed)} target(s) below their bound at these sizes (not judged)"
            )
        return 0 if all(not r["status"].startswith("exit") for r in runs) else 1
    return 0 if all(r["status"] == "ok" for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
