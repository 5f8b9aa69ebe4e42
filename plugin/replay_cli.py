"""The ``replay`` and ``explain`` subcommands: run a recorded trace offline."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from workerset_admission.admission import CoreSettings
from workerset_admission.card import BoundarySettings
from workerset_admission.errors import UsageError
from workerset_admission.replay import explain, render, replay

__all__ = ["add_arguments", "run"]


def add_arguments(name: str, parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace", metavar="TRACE", help="JSONL trace file ('-' for stdin)")
    if name == "explain":
        parser.add_argument(
            "instance",
            metavar="INSTANCE",
            help="instance key (ns/component/endpoint/<id hex>[/suffix]) or its KV key",
        )
    parser.add_argument(
        "--namespace", default=None, help="only watch this worker namespace (as the frontend)"
    )
    parser.add_argument(
        "--max-builds", type=int, default=8, help="builds allowed at once (default 8)"
    )
    parser.add_argument(
        "--retry-delays",
        default="1,2,4,8,16,30",
        help="comma-separated retry delays in seconds (default 1,2,4,8,16,30)",
    )


def run(name: str, args: argparse.Namespace) -> int:
    try:
        delays = tuple(float(d) for d in str(args.retry_delays).split(","))
        core_settings = CoreSettings(max_concurrent_builds=args.max_builds, retry_delays=delays)
        boundary = BoundarySettings(namespace=args.namespace)
        if args.trace == "-":
            lines = sys.stdin.read().splitlines()
        else:
            lines = Path(args.trace).read_text(encoding="utf-8").splitlines()
        result = replay(lines, boundary, core_settings)
    except (UsageError, ValueError, OSError) as exc:
        print(f"workerset-admission {name}: {exc}", file=sys.stderr)
        return 2
    out = render(result) if name == "replay" else explain(result, args.instance)
    sys.stdout.write(out)
    return 0
