"""The ``replay`` and ``explain`` subcommands: run a recorded trace offline."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
from pathlib import Path

from workerset_admission.admission import CoreSettings
from workerset_admission.card import BoundarySettings
from workerset_admission.errors import UsageError
from workerset_admission.traces.format import read_trace, recorded_settings
from workerset_admission.traces.replay import ReplayResult, explain, is_admitted, render, replay

__all__ = ["arguments", "main"]

EXIT_ADMITTED = 0
EXIT_NOT_ADMITTED = 1


def _retry_delays(text: str) -> tuple[float, ...]:
    try:
        delays = tuple(float(d) for d in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError("expected comma-separated seconds, e.g. 1,2,4") from None
    if not delays or any(d < 0 for d in delays):
        raise argparse.ArgumentTypeError("retry delays are non-negative seconds")
    return delays


def arguments(name: str, parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace", metavar="TRACE", help="JSONL trace file ('-' for stdin)")
    if name == "explain":
        parser.add_argument(
            "instance",
            metavar="INSTANCE",
            help="instance key (ns/component/endpoint/<id hex>[/suffix]), its KV key, or the "
            "instance id alone (decimal, or hex with 0x)",
        )
        parser.add_argument(
            "--json", action="store_true", help="print the answer as JSON for machines"
        )
    # Unset flags take what the trace's header records (a frontend's own recording holds its
    # settings), else Dynamo's defaults.
    parser.add_argument(
        "--namespace",
        default=None,
        help="only watch this worker namespace (as the frontend; default: as recorded, else all)",
    )
    parser.add_argument(
        "--max-builds",
        type=int,
        default=None,
        help="builds allowed at once (default: as recorded, else 8)",
    )
    parser.add_argument(
        "--retry-delays",
        type=_retry_delays,
        default=None,
        help="comma-separated retry delays in seconds (default: as recorded, else 1,2,4,8,16,30)",
    )
    parser.add_argument(
        "--tenure-hold",
        type=float,
        default=None,
        help="seconds a tenure is held after a reconnect snapshot omits it (default: as "
        "recorded, else 30; 0 off)",
    )
    parser.add_argument(
        "--registration-ttl",
        type=float,
        default=None,
        help="seconds a held tenure serves its members on their last known records (default: "
        "as recorded, else 10)",
    )


def _lines(trace: str) -> list[str]:
    if trace == "-":
        return sys.stdin.read().splitlines()
    try:
        return Path(trace).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read trace {trace}: {exc}") from None


def _replay(args: argparse.Namespace) -> ReplayResult:
    lines = _lines(args.trace)
    recorded_core, recorded_boundary = recorded_settings(read_trace(lines))
    core = recorded_core or CoreSettings()
    overrides = {
        name: value
        for name, value in (
            ("max_concurrent_builds", args.max_builds),
            ("retry_delays", args.retry_delays),
            ("tenure_hold", args.tenure_hold),
            ("registration_ttl", args.registration_ttl),
        )
        if value is not None
    }
    boundary = recorded_boundary or BoundarySettings()
    try:
        core = dataclasses.replace(core, **overrides)
        if args.namespace is not None:
            boundary = dataclasses.replace(boundary, namespace=args.namespace)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    result = replay(lines, boundary, core)
    if result.version < 2:
        print(
            f"{args.trace}: a version 1 trace carries no times: its clock moves only at its "
            "tick lines, and its builds are simulated",
            file=sys.stderr,
        )
    return result


async def main(name: str, args: argparse.Namespace, stop: asyncio.Event) -> int:
    del stop  # a replay is short and offline: a signal simply cancels it
    result = _replay(args)
    if name == "replay":
        sys.stdout.write(render(result))
        return 0
    text = explain(result, args.instance)
    admitted = is_admitted(result, args.instance)
    if args.json:
        answer = {"instance": args.instance, "admitted": admitted, "explanation": text}
        print(json.dumps(answer, indent=2))
    else:
        sys.stdout.write(text)
    return EXIT_ADMITTED if admitted else EXIT_NOT_ADMITTED
