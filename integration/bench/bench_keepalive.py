"""What keeping the admitted view alive costs at rest: files touched per second and CPU, by horizon.

A plain script: ``python integration/bench/bench_keepalive.py [--workers 2000,20000]
[--minutes 10] [--files-per-worker 5] [--out results/bench_keepalive.json]``.

For each fleet size it writes a real view directory (five files a worker, as a worker's
endpoint, KV-query endpoint, card, KV-event source and channel records make) and drives the
writer's keep-alive (:meth:`AdmittedView.keep_alive`, the view's own code, on real files) the
way the writer's loop wakes it, over ``--minutes`` of a simulated clock: every second, and
every 20 ms while a refresh is spread over slices. The touches are real ``utime`` calls; the
CPU is this process's, measured around them. Two horizons:

* 10 s: the file store's own expiry, which the view used before it failed static (every file
  touched every 2 s, stamped now);
* 600 s: the default horizon (every file touched once a minute, stamped 650 s ahead).

Printed as a table; results to ``results/bench_keepalive.json``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from workerset_admission.adapters.dynamo.view import (
    REFRESH_SLICE_EVERY,
    AdmittedView,
    DirectoryFiles,
    Horizon,
)
from workerset_admission.adapters.dynamo.view_directory import BUCKETS

HORIZONS = (10.0, 600.0)


def measure(
    workers: int, horizon_seconds: float, minutes: float, per_worker: int
) -> dict[str, Any]:
    horizon = Horizon(horizon_seconds)
    with tempfile.TemporaryDirectory(prefix="bench-keepalive-") as root:
        files = DirectoryFiles.open(Path(root))
        try:
            files.lease = horizon.lease
            now = [0.0]
            view = AdmittedView(files, refresh_interval=horizon.refresh, clock=lambda: now[0])
            value = b'{"type": "Model", "bench": true}'
            for worker in range(workers):
                for index in range(per_worker):
                    file = (BUCKETS[index % len(BUCKETS)], f"ns%2Fbackend%2F{worker:x}-{index}")
                    files.publish(file, value)
                    # As a pass would leave it: the file published with this value.
                    view._written[file] = value
            touched = 0
            cpu = 0.0
            longest = 0.0
            end = minutes * 60.0
            while now[0] < end:
                started = time.process_time()
                touched += view.keep_alive()
                spent = time.process_time() - started
                cpu += spent
                longest = max(longest, spent)
                idle = min(1.0, view.refresh_interval / 2)
                now[0] += REFRESH_SLICE_EVERY if view.refreshing else idle
        finally:
            files.release()
    return {
        "workers": workers,
        "files": workers * per_worker,
        "horizon_s": horizon_seconds,
        "refresh_s": horizon.refresh,
        "touches_per_s": round(touched / end, 1),
        "cpu_percent_of_a_core": round(100.0 * cpu / end, 3),
        "longest_call_ms": round(longest * 1000.0, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="2000,20000")
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--files-per-worker", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("results/bench_keepalive.json"))
    args = parser.parse_args()
    rows = [
        measure(int(size), horizon, args.minutes, args.files_per_worker)
        for size in args.workers.split(",")
        for horizon in HORIZONS
    ]
    print("| workers | files | horizon | refresh | touches/s | CPU (% of a core) | longest call |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['workers']:,} | {r['files']:,} | {r['horizon_s']:g} s | {r['refresh_s']:g} s "
            f"| {r['touches_per_s']:,} | {r['cpu_percent_of_a_core']} % "
            f"| {r['longest_call_ms']} ms |"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
