"""The trace tools: ``record`` a trace from the bucket, ``replay`` and ``explain`` one offline.

``record`` is a second watch beside the frontends: one listing holding every value's raw text,
then every change, each with the time it was seen (a frontend records what it observed itself
with ``serve --trace-out``). ``replay`` and ``explain`` run a trace through the live step code.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import IO, Any

from workerset_admission.admission import CoreSettings
from workerset_admission.card import BoundarySettings
from workerset_admission.cli import positive_seconds
from workerset_admission.cli.connection import client_options
from workerset_admission.cli.exits import EXIT_NO, EXIT_OK
from workerset_admission.errors import Unreachable, UsageError
from workerset_admission.identity import with_id_strings
from workerset_admission.settings import Settings
from workerset_admission.traces.format import read_trace, recorded_settings
from workerset_admission.traces.replay import ReplayResult, explain, is_admitted, replay
from workerset_admission.traces.state_line import DecisionState, DecisionStateError

__all__ = ["LISTING_TIMEOUT", "arguments", "main", "record_trace"]


def _retry_delays(text: str) -> tuple[float, ...]:
    try:
        delays = tuple(float(d) for d in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError("expected comma-separated seconds, e.g. 1,2,4") from None
    if not delays or any(d < 0 for d in delays):
        raise argparse.ArgumentTypeError("retry delays are non-negative seconds")
    return delays


def arguments(name: str, parser: argparse.ArgumentParser) -> None:
    if name == "record":
        _record_arguments(parser)
        return
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
    parser.add_argument(
        "--dynamo-version",
        choices=("1.6", "1.7"),
        default=None,
        help="judge cards as a frontend of this Dynamo line (default: as recorded, else 1.6)",
    )


def _output(text: str) -> Path:
    """Check an output file's folder exists, before anything connects."""
    path = Path(text)
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"no such folder for the output file: {folder}")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{path} is a folder, not a file")
    return path


def _record_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--output", "-o", type=_output, help="trace file to write (default: standard output)"
    )
    parser.add_argument(
        "--json", action="store_true", help="end with a JSON summary on standard output"
    )
    parser.add_argument(
        "--duration",
        type=positive_seconds,
        help="record changes for this many seconds after the listing (default: until interrupted)",
    )
    parser.add_argument(
        "--frontend",
        default=None,
        help="start the trace with this live frontend's decision state, so replay and "
        "explain reproduce what it decided (default: the only live frontend)",
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
        if args.dynamo_version is not None:
            boundary = dataclasses.replace(boundary, dynamo_line=args.dynamo_version)
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
    if name == "record":
        return await _record(args, args.settings, stop)
    # A replay is short and offline: a signal simply cancels it.
    result = _replay(args)
    if name == "replay":
        # Every id list also as decimal strings, which jq 1.6 and JavaScript read without loss.
        document = with_id_strings(result.to_json())
        sys.stdout.write(json.dumps(document, indent=2, ensure_ascii=False) + "\n")
        return 0
    text = explain(result, args.instance)
    admitted = is_admitted(result, args.instance)
    if args.json:
        answer = {"instance": args.instance, "admitted": admitted, "explanation": text}
        print(json.dumps(answer, indent=2))
    else:
        sys.stdout.write(text)
    return EXIT_OK if admitted else EXIT_NO


# --------------------------------------------------------------------------- record


LISTING_TIMEOUT = 30.0
"""How long ``record --duration`` waits for the bucket's listing before giving up."""


async def record_trace(
    settings: Settings,
    out: IO[str],
    *,
    duration: float | None = None,
    stop: asyncio.Event | None = None,
    state: DecisionState | None = None,
) -> int:
    """Write a trace from the live discovery bucket: its listing, then changes for a while.

    Changes are written for ``duration`` seconds, or until ``stop``. The duration counts from
    the listing on, so a short recording over a slow connection still holds the listing; the
    listing itself may take up to :data:`LISTING_TIMEOUT`. This is a second watch beside the
    frontends (``observer: bucket`` in the header): it sees every record and when it saw it,
    but no frontend's builds or timers. With a frontend's
    decision ``state`` the trace opens with it (a ``state`` line), before the listing, so a
    replay chooses the incumbents that frontend chose. A frontend's own observations, builds
    and timers included, are recorded by that frontend: ``serve --trace-out``.
    """
    from workerset_admission.adapters.nats.source import JetStreamDiscoverySource
    from workerset_admission.ports import SourceListing
    from workerset_admission.traces.writer import TraceWriter

    source = JetStreamDiscoverySource(
        client_options(settings, "record"), bucket=settings.discovery_bucket
    )
    stop = stop or asyncio.Event()
    listing_deadline = time.monotonic() + LISTING_TIMEOUT
    deadline = None
    started = time.time()
    writer = TraceWriter(out, observer="bucket", wall=lambda: started)
    # The state's times are Unix times: the line counts them from the trace's start.
    writer.begin(time.monotonic(), None if state is None else state.to_line(started))
    events = source.events()
    try:
        while not stop.is_set():
            # Until the listing, a recording with a duration waits for it (bounded); after it,
            # until the duration is over.
            limit = deadline if deadline is not None or duration is None else listing_deadline
            timeout = None if limit is None else max(0.0, limit - time.monotonic())
            next_event = asyncio.ensure_future(anext(events))
            stopped = asyncio.ensure_future(stop.wait())
            done, _pending = await asyncio.wait(
                {next_event, stopped}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
            stopped.cancel()
            if next_event not in done:
                next_event.cancel()
                with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                    await next_event
                if stop.is_set() or deadline is not None:
                    break
                raise Unreachable(
                    f"no listing of bucket {settings.discovery_bucket!r} within "
                    f"{LISTING_TIMEOUT:g} s"
                )
            event = next_event.result()
            if isinstance(event, SourceListing) and deadline is None and duration is not None:
                deadline = time.monotonic() + duration
            # ASCII escapes keep lone surrogates (invalid UTF-8 in a value) valid JSON text.
            writer.write_event(event, time.monotonic())
            writer.flush()
    finally:
        # The recording ends now: a last tick carries the clock there, so a deadline that fell
        # due after the last change (a hold's end, a retry) falls due in the replay too.
        writer.tick(time.monotonic())
        await source.close()
        await events.aclose()
        writer.flush()
    return writer.lines


async def _record(args: argparse.Namespace, settings: Settings, stop: asyncio.Event) -> int:
    from workerset_admission.adapters.nats.connect import probe_bucket

    options = client_options(settings, "record")
    await probe_bucket(options, settings.discovery_bucket)
    state = await _decision_state(args, settings)
    with contextlib.ExitStack() as stack:
        out: IO[str] = (
            stack.enter_context(args.output.open("w", encoding="utf-8"))
            if args.output
            else sys.stdout
        )
        lines = await record_trace(settings, out, duration=args.duration, stop=stop, state=state)
    if args.json:
        print(json.dumps({"lines": lines, "output": str(args.output or "-")}), flush=True)
    else:
        print(f"recorded {lines} line(s)", file=sys.stderr)
    return 0


async def _decision_state(args: argparse.Namespace, settings: Settings) -> DecisionState | None:
    """Pick the frontend whose decisions the trace starts from, and read its state."""
    from workerset_admission.adapters.nats.frontend_state import live_frontends

    options = client_options(settings, "record")
    frontends = await live_frontends(options, settings.admission_bucket)
    chosen = args.frontend
    if chosen is None:
        if not frontends:
            print(
                "record: no live frontend publishes its admissions; the trace starts from the "
                "listing alone",
                file=sys.stderr,
            )
            return None
        if len(frontends) > 1:
            raise UsageError(
                f"several live frontends: {', '.join(frontends)}; choose one with --frontend"
            )
        chosen = frontends[0]
    elif chosen not in frontends:
        listed = ", ".join(frontends) or "none"
        raise UsageError(f"frontend {chosen!r} is not live (live frontends: {listed})")
    return await decision_state_of(options, settings.status_subject, chosen)


async def decision_state_of(
    options: Any, status_subject: str, frontend: str, timeout: float = 5.0
) -> DecisionState:
    """Ask one frontend, by its own status subject, for the decision state it holds now."""
    from workerset_admission.adapters.nats.frontend_state import frontend_status

    answer = await frontend_status(options, status_subject, frontend, timeout)
    try:
        status = json.loads(answer)
    except ValueError:
        raise DecisionStateError(f"frontend {frontend} answered with no JSON") from None
    return DecisionState.from_status(frontend, status)
