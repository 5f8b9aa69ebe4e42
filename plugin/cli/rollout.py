"""``workerset-admission rollout``: gate a rolling update on what every frontend serves.

Reads the serving-admission bucket, asks :func:`workerset_admission.rollout.gate.evaluate_gate`, and
prints a table (or JSON with ``--json``). The exit status is the answer, so a rollout script can
branch on it: 0 the gate is open, 1 it is closed (or ``--wait`` timed out or was interrupted),
3 the bucket could not be read (the command line's table of exit statuses).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, TextIO

from workerset_admission.card.serving_record import BucketRead, RawEntry, Record, parse_record
from workerset_admission.cli.exits import EXIT_NO, EXIT_OK, EXIT_UNREACHABLE
from workerset_admission.cli.runner import seconds_within
from workerset_admission.errors import InvalidRecordError, wire_text
from workerset_admission.keys import ADMISSION_BUCKET
from workerset_admission.rollout.frontends import record_filters
from workerset_admission.rollout.gate import (
    GateReport,
    evaluate_gate,
    expand_checksum,
    render_table,
)

if TYPE_CHECKING:
    pass

__all__ = [
    "DEFAULT_BUCKET",
    "BucketRead",
    "GateQuery",
    "RawEntry",
    "RecordSource",
    "arguments",
    "check_gate",
    "main",
    "wait_for_gate",
    "waiting_line",
]

# The longest progress line a command prints: it may name many workers and frontends, and
# quotes what their records say (escaped, so no record can start a line of its own).
PROGRESS_LIMIT = 2000

DEFAULT_BUCKET = ADMISSION_BUCKET


class RecordSource(Protocol):
    """Where the serving-admission records come from (the NATS bucket, or a test's list)."""

    async def read(self, filters: Sequence[str] | None = None) -> BucketRead:
        """Read the records (only the keys ``filters`` name, when given)."""
        ...


@dataclass(frozen=True, slots=True)
class GateQuery:
    """What the operator asks: a model, the new generation's namespace, and how strictly."""

    model: str
    namespace: str
    expected_checksum: str | None = None
    previous_namespaces: tuple[str, ...] | None = None
    require_agreement: bool = False
    stale_after: float | None = None
    min_members: int = 1


@dataclass(frozen=True, slots=True)
class GateCheck:
    """One look at the bucket: the report, or the reason there is none."""

    report: GateReport | None
    problem: str | None = None
    refused: tuple[InvalidRecordError, ...] = field(default=())

    @property
    def open(self) -> bool:
        return self.report is not None and self.report.open


async def check_gate(
    source: RecordSource,
    query: GateQuery,
    now: Callable[[], float] = time.time,
    filters: Sequence[str] | None = None,
) -> GateCheck:
    """Read the bucket once and evaluate the gate; bad records are refused, never fatal.

    ``filters`` limits the read to the records the question names (the later looks of a wait).
    """
    read = await source.read(filters)
    if read.problem is not None:
        return GateCheck(report=None, problem=read.problem)
    records: list[Record] = []
    refused: list[InvalidRecordError] = []
    for entry in read.entries:
        parsed = _parse(entry)
        if isinstance(parsed, InvalidRecordError):
            refused.append(parsed)
        else:
            records.append(parsed)
    expected = query.expected_checksum
    if expected is not None:
        expected = expand_checksum(records, query.model, expected)
    report = evaluate_gate(
        records,
        model=query.model,
        namespace=query.namespace,
        expected_checksum=expected,
        previous_namespaces=query.previous_namespaces,
        require_agreement=query.require_agreement,
        now=now(),
        stale_after=query.stale_after,
        invalid=[(error.key or "", error.reason) for error in refused],
        min_members=query.min_members,
    )
    return GateCheck(report=report, refused=tuple(refused))


def _parse(entry: RawEntry) -> Record | InvalidRecordError:
    try:
        return parse_record(entry.key, entry.value, entry.published_at)
    except InvalidRecordError as error:
        return error


def progress_line(check: GateCheck, elapsed: float) -> str:
    """Summarize one look for the ``--wait`` progress output."""
    if check.report is None:
        return f"[{elapsed:6.1f}s] cannot read the bucket: {check.problem}"
    report = check.report
    state = "open" if report.open else "closed"
    line = (
        f"[{elapsed:6.1f}s] gate {state}: {len(report.serving)}/{len(report.live)} live"
        f" frontends serve {report.model} from {report.namespace}"
    )
    if report.missing:
        line += f"; waiting for {', '.join(report.missing)}"
    if report.disagreements:
        line += f"; {len(report.disagreements)} WorkerSet(s) in disagreement"
    return line


def waiting_line(query: GateQuery, timeout: float, interval: float) -> str:
    """Say, before the first look, what ``--wait`` waits for and for how long."""
    line = (
        f"waiting up to {timeout:g} s for every live frontend to serve {query.model} from "
        f"namespace {query.namespace}"
    )
    if query.expected_checksum:
        line += f" with checksum {query.expected_checksum}"
    if query.min_members > 1:
        line += f" with at least {query.min_members} members"
    return line + f" (a look every {interval:g} s)"


async def wait_for_gate(
    source: RecordSource,
    query: GateQuery,
    *,
    timeout: float,
    interval: float,
    progress: Callable[[str], None],
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    now: Callable[[], float] = time.time,
) -> GateCheck:
    """Look until the gate opens or ``timeout`` passes; report each change of the answer."""
    started = clock()
    last_line: str | None = None
    filters: Sequence[str] | None = None
    while True:
        check = await check_gate(source, query, now, filters)
        if filters is None and check.report is not None:
            # The first look read everything; the next ones read the new generation's records
            # and the older generations' the first look found (or the operator named).
            older = set(query.previous_namespaces or ())
            older.update(ns for view in check.report.frontends for ns in view.previous_namespaces)
            filters = record_filters({query.namespace, *older})
        elapsed = clock() - started
        line = progress_line(check, elapsed)
        # Only changes are printed, so a long wait does not flood the operator's terminal.
        if last_line is None or line.split("] ", 1)[1] != last_line.split("] ", 1)[1]:
            progress(line)
            first_look = last_line is None
            last_line = line
            if first_look and check.report is None:
                # Not even the first look could read the bucket (a wrong address, NATS down):
                # say so now instead of at the timeout. Later failures are waited through.
                return check
        if check.open or elapsed >= timeout:
            return check
        await sleep(min(interval, max(0.0, timeout - elapsed)))


def arguments(name: str, parser: argparse.ArgumentParser) -> None:
    del name
    parser.add_argument("--model", required=True, help="the model name being rolled out")
    parser.add_argument(
        "--namespace",
        required=True,
        help="the worker namespace of the new deployment generation",
    )
    parser.add_argument(
        "--checksum",
        help="count a frontend only when its incumbent has this mdc_checksum (or an "
        "unambiguous prefix of it, such as the 12-character form the tables print)",
    )
    parser.add_argument(
        "--previous",
        action="append",
        metavar="NAMESPACE",
        help="the namespace(s) of the previous generation (default: any other namespace)",
    )
    parser.add_argument(
        "--require-agreement",
        action="store_true",
        help="keep the gate closed while frontends admitted different incumbents",
    )
    parser.add_argument(
        "--stale-after",
        type=seconds_within(86400.0),
        metavar="SECONDS",
        help="also ignore frontends whose newest record is older than this",
    )
    parser.add_argument(
        "--min-members",
        type=_members,
        default=1,
        metavar="N",
        help="count a frontend only once it admitted at least N members of the new generation "
        "(its capacity, before the old one is drained; default 1)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON for machines")
    parser.add_argument("--wait", action="store_true", help="wait until the gate opens")
    parser.add_argument(
        "--timeout",
        type=seconds_within(86400.0, zero=True),
        default=600.0,
        metavar="SECONDS",
        help="how long --wait waits before giving up (default 600)",
    )
    parser.add_argument(
        "--interval",
        type=seconds_within(600.0),
        default=2.0,
        metavar="SECONDS",
        help="how often --wait looks again (default 2)",
    )


def _members(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 1 <= value <= 1_000_000:
        raise argparse.ArgumentTypeError(f"{value} is not between 1 and 1000000")
    return value


def query_from_args(args: argparse.Namespace) -> GateQuery:
    return GateQuery(
        model=args.model,
        namespace=args.namespace,
        expected_checksum=args.checksum,
        previous_namespaces=tuple(args.previous) if args.previous else None,
        require_agreement=args.require_agreement,
        stale_after=args.stale_after,
        min_members=args.min_members,
    )


def emit(check: GateCheck, *, as_json: bool, out: TextIO, err: TextIO) -> int:
    """Print the final answer and return the exit status."""
    if check.report is None:
        if as_json:
            out.write(json.dumps({"open": False, "error": check.problem}) + "\n")
        err.write(f"workerset-admission rollout: {wire_text(check.problem)}\n")
        return EXIT_UNREACHABLE
    if as_json:
        out.write(json.dumps(check.report.as_json(), indent=2, sort_keys=True) + "\n")
    else:
        out.write(render_table(check.report))
    return EXIT_OK if check.report.open else EXIT_NO


async def run_async(
    args: argparse.Namespace,
    source: RecordSource,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
) -> int:
    query = query_from_args(args)
    if args.wait:

        def progress(line: str) -> None:
            err.write(wire_text(line, PROGRESS_LIMIT) + "\n")
            err.flush()

        progress(waiting_line(query, args.timeout, args.interval))

        check = await wait_for_gate(
            source,
            query,
            timeout=args.timeout,
            interval=args.interval,
            progress=progress,
        )
        if not check.open and check.report is not None:
            err.write(f"workerset-admission rollout: gate still closed after {args.timeout:g} s\n")
            emit(check, as_json=args.json, out=out, err=err)
            return EXIT_NO
    else:
        check = await check_gate(source, query)
    return emit(check, as_json=args.json, out=out, err=err)


async def main(name: str, args: argparse.Namespace, stop: asyncio.Event) -> int:
    del name, stop
    from workerset_admission.adapters.nats.admission_reader import NatsRecordSource
    from workerset_admission.cli.connection import client_options

    settings = args.settings
    options = client_options(settings, "rollout")
    return await run_async(args, NatsRecordSource(options, settings.admission_bucket))
