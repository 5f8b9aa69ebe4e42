"""Run the soak: ``python -m integration.soak --minutes 30 --seed N [--mode MODE]``.

Modes: ``views`` (frontends on views, one nats-server), ``cluster`` (the same on a
three-node cluster), ``frontend`` (the real Dynamo 1.6.1 frontend beside Dynamo alone).

Needs root (network namespaces, tmpfs mounts) and ``ip``, ``iptables``, ``tc``, ``nsenter``.
Writes the run's folder (logs, ``trace.jsonl``, ``report.json``, ``leaks.png``) under ``--out``,
prints the report, and exits 1 on a violation or a leak (a figure of the steady frontend
growing 5 % or more over the second half), 2 when it cannot run here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

from soak.engine import Options, Soak  # noqa: E402
from soak.leaks import as_rows, plot  # noqa: E402
from soak.net import tools_missing  # noqa: E402

LEAK_LIMIT = 0.05


def leak_failures(report: dict[str, object], process: str) -> list[str]:
    """Figures of ``process`` that grew by the limit or more over the run's second half."""
    figures = report["leaks"].get(process, {})  # type: ignore[attr-defined]
    out = []
    for name, figure in figures.items():
        if isinstance(figure, dict):
            growth = figure.get("second_half_growth")
            if growth is not None and growth >= LEAK_LIMIT:
                out.append(f"{process} {name} grew {growth:.1%} over the second half")
    return out


def _interrupt(_signum: int, _frame: object) -> None:
    # A SIGTERM (a CI timeout, a test's cleanup) unwinds like ^C, so namespaces, mounts and
    # processes are removed on the way out.
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _interrupt)
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=None, help="default: from the clock, printed")
    parser.add_argument("--mode", choices=("views", "cluster", "frontend"), default="views")
    parser.add_argument("--frontends", type=int, default=3)
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--active", type=float, default=45.0, help="seconds between quiet points")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--no-leak-verdict", action="store_true", help="report leaks, never fail on them"
    )
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else int(time.time()) % 100000
    print(f"soak: mode {args.mode}, seed {seed}, {args.minutes:g} minutes", flush=True)
    if args.minutes <= 0 or args.frontends < 2 or args.groups < 1:
        print(
            "soak: --minutes must be positive, --frontends at least 2, --groups at least 1",
            file=sys.stderr,
        )
        return 2
    if os.geteuid() != 0 or (missing := tools_missing()):
        print(
            f"soak: needs root and ip, iptables, tc, nsenter (missing: {missing})", file=sys.stderr
        )
        return 2
    out = args.out or Path(os.environ.get("TMPDIR", "/tmp")) / f"soak-{args.mode}-{seed}"
    if args.mode == "frontend":
        from soak.frontend import run_frontend_mode

        report = run_frontend_mode(args.minutes, seed, out)
    else:
        options = Options(
            minutes=args.minutes, seed=seed, out=out, mode=args.mode,
            frontends=args.frontends, groups=args.groups, active=args.active,
        )  # fmt: skip
        soak = Soak(options)
        report = asyncio.run(soak.run())
        if soak.samples:
            (out / "samples.json").write_text(json.dumps(as_rows(soak.samples)) + "\n")
            plot(soak.samples, out / "leaks.png", f"soak, {args.mode} mode, seed {seed}")
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    failures = list(report.get("violations", []))
    if not args.no_leak_verdict and args.mode != "frontend":
        failures += leak_failures(report, "fe-0")
    for failure in failures:
        print(f"FAIL: {failure}", file=sys.stderr)
    print(f"soak: seed {seed}; {'FAILED' if failures else 'passed'}; folder {out}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
