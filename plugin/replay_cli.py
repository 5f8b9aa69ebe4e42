"""The ``replay`` and ``explain`` subcommands: run a recorded trace offline."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from workerset_admission.admission import CoreSettings
from workerset_admission.card import BoundarySettings
from workerset_admission.errors import UsageError
from workerset_admission.replay import ReplayResult, explain, is_admitted, render, replay

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
    parser.add_argument(
        "--namespace", default=None, help="only watch this worker namespace (as the frontend)"
    )
    parser.add_argument(
        "--max-builds", type=int, default=8, help="builds allowed at once (default 8)"
    )
    parser.add_argument(
        "--retry-delays",
        type=_retry_delays,
        default=(1.0, 2.0, 4.0, 8.0, 16.0, 30.0),
        help="comma-separated retry delays in seconds (default 1,2,4,8,16,30)",
    )
    parser.add_argument(
        "--tenure-hold",
        type=float,
        default=30.0,
        help="seconds a tenure is held after a reconnect snapshot omits it (default 30; 0 off)",
    )
    parser.add_argument(
        "--registration-ttl",
        type=float,
        default=10.0,
        help="seconds a held tenure serves its members on their last known records (default 10)",
    )


def _lines(trace: str) -> list[str]:
    if trace == "-":
        return sys.stdin.read().splitlines()
    try:
        return Path(trace).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read trace {trace}: {exc}") from None


def _replay(args: argparse.Namespace) -> ReplayResult:
    try:
        core_settings = CoreSettings(
            max_concurrent_builds=args.max_builds,
            retry_delays=args.retry_delays,
            tenure_hold=args.tenure_hold,
            registration_ttl=args.registration_ttl,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return replay(_lines(args.trace), BoundarySettings(namespace=args.namespace), core_settings)


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
