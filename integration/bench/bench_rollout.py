"""Availability through faults and a rolling update: Dynamo alone beside the admitted view.

A plain script: ``python integration/bench/bench_rollout.py [--rows NAMES] [--repeat N]``
(``BENCH_QUICK=1`` shortens the outage to 5 s and the rolling update's spacing to 2 s). It
starts one side-by-side deployment (``integration/sidebyside.py``): three ``dynamo.mocker``
workers on their own file store, frontend "direct" on that store (Dynamo 1.6.1 alone), frontend
"view" on the plugin's admitted view, the plugin's own loopback nats-server and a second one as
Dynamo's event plane. Both frontends get the same steady load (15 requests/s each, 10 s
timeout, every request kept) through each row, in this order:

* ``outage``: the plugin's nats-server killed and restarted after 15 s, its store kept;
* ``drain``: one worker SIGTERMed (a new one replaces it afterwards);
* ``kill``: one worker SIGKILLed (its records stay until the file store's 10 s expiry);
* ``rolling``: two workers of another block size join (rejected), then the three incumbents
  are SIGTERMed 5 s apart;
* ``rolling-drained``: the same, but each incumbent is first drained (``workerset-admission
  drain --wait``), then SIGTERMed; frontends of Dynamo alone see only the SIGTERMs;
* ``versioned-drained``: two workers of the new configuration join in a namespace of their
  own (a deployment generation, served beside the old one at once), then each incumbent is
  drained and SIGTERMed, 5 s apart;
* ``wipe``: the plugin's nats-server killed and restarted after 2 s with an empty store (the
  bridge is not restarted).

Per row and frontend it prints the failed requests, the longest window with no successful
request (send time to send time; one request's spacing, 0.07 s, when nothing failed) and the
requests the rejected cohort served before the last incumbent's SIGTERM, as a table; for each
rolling update also the flip: the requests that failed from the last incumbent's SIGTERM to the
successor's first success, and how long after the SIGTERM that success was sent (``--rate``
raises the load, and the resolution, from 15 requests/s; ``--bridge-interval`` sets how often
the bridge scans the workers' store, 0.1 s by default). ``--control`` adds a second frontend
on the workers' own store, loaded the same: how far two frontends of Dynamo alone differ on
the same fault, so a difference between direct and view can be read against it; with more
than one rolling update the totals and how often each frontend lost more than another close
the table. Everything goes to ``results/bench_rollout.json`` with the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parents[1] / "tests"))

from sidebyside import Flip, Outcome, SideBySide, side_by_side  # noqa: E402
from workerset_admission.adapters.nats.embedded import EmbeddedNatsServer  # noqa: E402

RESULTS = HERE / "results"
ROWS = ("outage", "drain", "kill", "rolling", "rolling-drained", "versioned-drained", "wipe")


def run_row(running: SideBySide, row: str, quick: bool) -> Outcome:
    if row == "outage":
        return running.outage(5.0 if quick else 15.0)
    if row == "drain":
        return running.drain()
    if row == "kill":
        return running.kill()
    if row == "rolling":
        return running.rolling_update(rivals=2, spacing=2.0 if quick else 5.0)
    if row == "rolling-drained":
        return running.rolling_update(rivals=2, spacing=2.0 if quick else 5.0, drained=True)
    if row == "versioned-drained":
        return running.rolling_update(
            rivals=2, spacing=2.0 if quick else 5.0, drained=True, versioned=True
        )
    return running.wipe(downtime=2.0, settle=15.0)


def table(outcomes: list[Outcome]) -> str:
    names = list(outcomes[0].figures) if outcomes else ["direct", "view"]
    lines = [
        "| fault | "
        + " | ".join(f"{n}: failed" for n in names)
        + " | "
        + " | ".join(f"{n}: longest no-success" for n in names)
        + " | "
        + " | ".join(f"{n}: to rejected" for n in names)
        + " |",
        "|---" * (1 + 3 * len(names)) + "|",
    ]
    for outcome in outcomes:
        f = [outcome.figures[n] for n in names]
        lines.append(
            f"| {outcome.name} | "
            + " | ".join(f"{x.failed} of {x.sent}" for x in f)
            + " | "
            + " | ".join(f"{x.longest_gap:.2f} s" for x in f)
            + " | "
            + " | ".join(str(x.to_rejected) for x in f)
            + " |"
        )
    flips = [o for o in outcomes if o.flips]
    if flips:
        lines += [
            "",
            "| succession | "
            + " | ".join(f"{n}: failed at the flip" for n in names)
            + " | "
            + " | ".join(f"{n}: successor serves after" for n in names)
            + " |",
            "|---" * (1 + 2 * len(names)) + "|",
        ]
        for number, outcome in enumerate(flips, start=1):
            got = [outcome.flips.get(n) for n in names]
            lines.append(
                f"| {number} | "
                + " | ".join(_flip_failed(x) for x in got)
                + " | "
                + " | ".join(_flip_after(x) for x in got)
                + " |"
            )
    for kind in dict.fromkeys(o.name for o in outcomes if o.name.startswith("rolling update")):
        rolling = [o for o in outcomes if o.name == kind]
        if len(rolling) > 1:
            lines += ["", f"{kind}: {spread(rolling, names)}"]
    return "\n".join(lines)


def spread(rolling: list[Outcome], names: list[str]) -> str:
    """Totals over the rolling updates, and how often one frontend lost more than another."""
    totals = ", ".join(f"{n} {sum(o.figures[n].failed for o in rolling)}" for n in names)
    statuses = "; ".join(f"{n} {_statuses(rolling, n)}" for n in names)
    after_stop = ", ".join(f"{n} {sum(o.after_stop.get(n, 0) for o in rolling)}" for n in names)
    gaps = ", ".join(f"{n} {max(o.figures[n].longest_gap for o in rolling):.2f} s" for n in names)
    pairs = [(a, b) for a in names for b in names if a < b]
    counts = []
    for a, b in pairs:
        more = sum(o.figures[a].failed > o.figures[b].failed for o in rolling)
        fewer = sum(o.figures[a].failed < o.figures[b].failed for o in rolling)
        counts.append(f"{a} lost more than {b} in {more}, fewer in {fewer}")
    return (
        f"Over {len(rolling)} rolling updates, failed requests in all: {totals} "
        f"(by status: {statuses}; sent within 1 s after a SIGTERM: {after_stop}; longest "
        f"no-success window: {gaps}); " + "; ".join(counts) + "."
    )


def _statuses(outcomes: list[Outcome], name: str) -> str:
    counts: dict[int, int] = {}
    for outcome in outcomes:
        for status, count in outcome.figures[name].statuses:
            counts[status] = counts.get(status, 0) + count
    return ", ".join(f"{count} x {status}" for status, count in sorted(counts.items())) or "none"


def _flip_failed(f: Flip | None) -> str:
    return "never served" if f is None else str(f.failed)


def _flip_after(f: Flip | None) -> str:
    return "never" if f is None else f"{f.first_success:.3f} s"


def main(
    rows: list[str],
    repeat: int,
    quick: bool,
    rate: float,
    bridge_interval: float,
    control: bool = False,
) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="bench-rollout-"))
    plugin_nats = EmbeddedNatsServer(root / "plugin-nats")
    plugin_nats.start()
    outcomes: list[Outcome] = []
    loads: list[float] = []
    drain_waits: list[list[float]] = []
    marks: list[list[list[Any]]] = []
    try:
        with side_by_side(root / "deployment", plugin_nats) as running:
            running.rate = rate
            running.deployment.bridge_interval = bridge_interval
            running.start(control=control)
            running.serve(3)
            for _ in range(repeat):
                for row in rows:
                    outcomes.append(run_row(running, row, quick))
                    loads.append(os.getloadavg()[0])
                    if row.endswith("drained"):
                        drain_waits.append([round(w, 3) for w in running.drain_waits])
                        marks.append([[m[0], m[1], round(m[2], 3)] for m in running.marks])
                    print(
                        f"{outcomes[-1].name}: "
                        + "; ".join(
                            f"{name} {figures.row()}"
                            for name, figures in outcomes[-1].figures.items()
                        ),
                        flush=True,
                    )
    finally:
        plugin_nats.close()
        shutil.rmtree(root, ignore_errors=True)
    print()
    print(table(outcomes))
    return {
        "rows": [
            {
                "fault": outcome.name,
                "load_average": load,
                **{
                    name: {
                        "sent": f.sent,
                        "failed": f.failed,
                        "longest_no_success_seconds": round(f.longest_gap, 3),
                        "to_rejected": f.to_rejected,
                        "failed_by_status": {str(s): c for s, c in f.statuses},
                        "errors": list(f.errors),
                    }
                    for name, f in outcome.figures.items()
                },
                "failed_within_1s_after_a_sigterm": outcome.after_stop,
                "flips": {
                    name: None
                    if f is None
                    else {
                        "failed": f.failed,
                        "successor_serves_after_seconds": round(f.first_success, 3),
                        "errors": list(f.errors),
                    }
                    for name, f in outcome.flips.items()
                },
            }
            for outcome, load in zip(outcomes, loads, strict=True)
        ],
        "quick": quick,
        "rate_per_frontend": rate,
        "bridge_interval": bridge_interval,
        "control": control,
        "drain_waits_seconds": drain_waits,
        "drain_marks": marks,
        "cpus": os.cpu_count(),
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated, of {ROWS}")
    parser.add_argument("--repeat", type=int, default=1, help="run the rows this many times")
    parser.add_argument(
        "--rate", type=float, default=15.0, help="requests per second to each frontend"
    )
    parser.add_argument(
        "--bridge-interval",
        type=float,
        default=0.1,
        help="seconds between the bridge's scans of the workers' store",
    )
    parser.add_argument(
        "--control",
        action="store_true",
        help="a second frontend on the workers' own store: Dynamo alone against itself",
    )
    args = parser.parse_args()
    chosen = [row.strip() for row in args.rows.split(",") if row.strip()]
    unknown = sorted(set(chosen) - set(ROWS))
    if unknown:
        parser.error(f"unknown rows {unknown}; choose from {', '.join(ROWS)}")
    quick = os.environ.get("BENCH_QUICK") == "1"
    result = main(chosen, args.repeat, quick, args.rate, args.bridge_interval, args.control)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_rollout.json").write_text(json.dumps(result, indent=2) + "\n")
