"""``workerset-admission rollout``: gate a rolling update on what every frontend serves.

Reads the serving-admission bucket, asks :func:`workerset_admission.rollout.evaluate_gate`, and
prints a table (or JSON with ``--json``). The exit status is the answer, so a rollout script can
branch on it: 0 the gate is open, 1 it is closed (or ``--wait`` timed out), 2 the bucket could
not be read.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, TextIO

from workerset_admission.config import add_settings_arguments, flags_from_args, load_settings
from workerset_admission.errors import ConfigError, InvalidRecordError
from workerset_admission.rollout import (
    GateReport,
    Record,
    evaluate_gate,
    parse_record,
    render_table,
)

if TYPE_CHECKING:
    from nats.aio.msg import Msg
    from nats.js import JetStreamContext
    from workerset_admission.adapters.nats.connect import NatsConnectOptions

__all__ = [
    "DEFAULT_BUCKET",
    "EXIT_CLOSED",
    "EXIT_OPEN",
    "EXIT_UNREADABLE",
    "BucketRead",
    "GateQuery",
    "NatsRecordSource",
    "RawEntry",
    "RecordSource",
    "add_arguments",
    "check_gate",
    "run",
    "wait_for_gate",
]

DEFAULT_BUCKET = "frontend-model-admission"

EXIT_OPEN = 0
EXIT_CLOSED = 1
EXIT_UNREADABLE = 2

# KV conventions: a removal carries one of these headers instead of a value.
_KV_OPERATION = "KV-Operation"
_MARKER_REASON = "Nats-Marker-Reason"
# Seconds to wait for the bucket's current values before calling it unreadable.
_READ_PATIENCE = 10


@dataclass(frozen=True, slots=True)
class RawEntry:
    """One bucket entry: key, value bytes, and the wall-clock time the server stored it."""

    key: str
    value: bytes
    published_at: float | None = None


@dataclass(frozen=True, slots=True)
class BucketRead:
    """The bucket's current entries, or why they could not be read (``problem``)."""

    entries: tuple[RawEntry, ...] = ()
    problem: str | None = None


class RecordSource(Protocol):
    """Where the serving-admission records come from (the NATS bucket, or a test's list)."""

    async def read(self) -> BucketRead: ...


@dataclass(frozen=True, slots=True)
class GateQuery:
    """What the operator asks: a model, the new generation's namespace, and how strictly."""

    model: str
    namespace: str
    expected_checksum: str | None = None
    previous_namespaces: tuple[str, ...] | None = None
    require_agreement: bool = False
    stale_after: float | None = None


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
    source: RecordSource, query: GateQuery, now: Callable[[], float] = time.time
) -> GateCheck:
    """Read the bucket once and evaluate the gate; bad records are refused, never fatal."""
    read = await source.read()
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
    report = evaluate_gate(
        records,
        model=query.model,
        namespace=query.namespace,
        expected_checksum=query.expected_checksum,
        previous_namespaces=query.previous_namespaces,
        require_agreement=query.require_agreement,
        now=now(),
        stale_after=query.stale_after,
        invalid=[(error.key or "", error.reason) for error in refused],
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
    while True:
        check = await check_gate(source, query, now)
        elapsed = clock() - started
        line = progress_line(check, elapsed)
        # Only changes are printed, so a long wait does not flood the operator's terminal.
        if last_line is None or line.split("] ", 1)[1] != last_line.split("] ", 1)[1]:
            progress(line)
            last_line = line
        if check.open or elapsed >= timeout:
            return check
        await sleep(min(interval, max(0.0, timeout - elapsed)))


class NatsRecordSource:
    """Reads the whole serving-admission bucket with one watch (initial values only)."""

    def __init__(
        self, options: NatsConnectOptions, bucket: str = DEFAULT_BUCKET, *, timeout: float = 10.0
    ) -> None:
        self._options = options
        self._bucket = bucket
        self._timeout = timeout

    async def read(self) -> BucketRead:
        # Imported here so ``rollout --help`` and the pure gate never load nats-py.
        from nats.errors import Error as NatsError
        from nats.js.errors import NotFoundError
        from workerset_admission.adapters.nats.connect import connect, servers_for_display

        try:
            # nats-py keeps trying unreachable servers on a first connect when reconnects are
            # unlimited; a gate must answer, so the attempt is bounded here.
            client = await asyncio.wait_for(
                connect(self._options, allow_reconnect=False), timeout=self._timeout
            )
        except asyncio.TimeoutError:
            servers = servers_for_display(self._options.servers)
            wait = f"{self._timeout:g} s"
            return BucketRead(problem=f"no NATS server answered within {wait}: {servers}")
        except (OSError, NatsError) as error:
            servers = servers_for_display(self._options.servers)
            return BucketRead(problem=f"cannot connect to {servers}: {error!r}")
        try:
            entries = await _current_entries(client.jetstream(timeout=5), self._bucket)
            return BucketRead(entries=tuple(entries))
        except NotFoundError:
            # No frontend has published yet: an empty bucket, and a closed gate.
            return BucketRead()
        except (OSError, NatsError, asyncio.TimeoutError) as error:
            return BucketRead(problem=f"cannot read bucket {self._bucket}: {error!r}")
        finally:
            await client.close()


async def _current_entries(js: JetStreamContext, bucket: str) -> list[RawEntry]:
    """Every key's current value: the latest message per subject, removals left out.

    nats-py's ``watchall()`` decides that the initial values are over from a consumer-info
    call made right after the consumer is created; on a clustered stream that call sometimes
    answers "nothing pending" too early, and the watch then reports an empty bucket. Here the
    end is read from the messages themselves: the one delivered with nothing left pending.
    """
    from nats.js.api import DeliverPolicy

    stream = f"KV_{bucket}"
    prefix = f"$KV.{bucket}."
    info = await js.stream_info(stream)
    if info.state.messages == 0:
        return []
    latest: dict[str, RawEntry | None] = {}
    complete = asyncio.Event()

    async def on_message(msg: Msg) -> None:
        metadata = msg.metadata
        key = msg.subject[len(prefix) :]
        headers = msg.headers or {}
        removed = _KV_OPERATION in headers or _MARKER_REASON in headers
        stamp = metadata.timestamp.timestamp() if metadata.timestamp else None
        latest[key] = None if removed else RawEntry(key, msg.data, stamp)
        if metadata.num_pending == 0:
            complete.set()

    subscription = await js.subscribe(
        f"{prefix}>",
        stream=stream,
        cb=on_message,
        ordered_consumer=True,
        deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
    )
    try:
        for _ in range(_READ_PATIENCE):
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(complete.wait(), timeout=1.0)
            if complete.is_set():
                break
            # Nothing delivered: every message may have aged out since the stream was asked.
            if (await js.stream_info(stream)).state.messages == 0:
                return []
        else:
            raise asyncio.TimeoutError(f"bucket {bucket} was not read within {_READ_PATIENCE} s")
    finally:
        with contextlib.suppress(Exception):
            await subscription.unsubscribe()
    return [entry for entry in latest.values() if entry is not None]


def add_arguments(name: str, parser: argparse.ArgumentParser) -> None:
    del name
    # The shared NATS flags: --nats-server (repeat it, or list several nodes of a cluster),
    # credentials, TLS, --admission-bucket, --config.
    add_settings_arguments(parser)
    parser.add_argument("--model", required=True, help="the model name being rolled out")
    parser.add_argument(
        "--namespace",
        required=True,
        help="the worker namespace of the new deployment generation",
    )
    parser.add_argument(
        "--checksum",
        help="count a frontend only when its incumbent has this mdc_checksum",
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
        type=float,
        metavar="SECONDS",
        help="also ignore frontends whose newest record is older than this",
    )
    parser.add_argument("--json", action="store_true", help="print JSON for machines")
    parser.add_argument("--wait", action="store_true", help="wait until the gate opens")
    parser.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="how long --wait waits before giving up (default 600)",
    )
    parser.add_argument(
        "--interval",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="how often --wait looks again (default 2)",
    )


def query_from_args(args: argparse.Namespace) -> GateQuery:
    return GateQuery(
        model=args.model,
        namespace=args.namespace,
        expected_checksum=args.checksum,
        previous_namespaces=tuple(args.previous) if args.previous else None,
        require_agreement=args.require_agreement,
        stale_after=args.stale_after,
    )


def emit(check: GateCheck, *, as_json: bool, out: TextIO, err: TextIO) -> int:
    """Print the final answer and return the exit status."""
    if check.report is None:
        if as_json:
            out.write(json.dumps({"open": False, "error": check.problem}) + "\n")
        err.write(f"rollout: {check.problem}\n")
        return EXIT_UNREADABLE
    if as_json:
        out.write(json.dumps(check.report.as_json(), indent=2, sort_keys=True) + "\n")
    else:
        out.write(render_table(check.report))
    return EXIT_OPEN if check.report.open else EXIT_CLOSED


async def run_async(
    args: argparse.Namespace,
    source: RecordSource,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
) -> int:
    query = query_from_args(args)
    if args.wait:

        def progress(line: str) -> None:
            err.write(line + "\n")
            err.flush()

        check = await wait_for_gate(
            source,
            query,
            timeout=max(0.0, args.timeout),
            interval=max(0.05, args.interval),
            progress=progress,
        )
        if not check.open and check.report is not None:
            err.write(f"rollout: gate still closed after {args.timeout:g} s\n")
            emit(check, as_json=args.json, out=out, err=err)
            return EXIT_CLOSED
    else:
        check = await check_gate(source, query)
    return emit(check, as_json=args.json, out=out, err=err)


def run(name: str, args: argparse.Namespace) -> int:
    from workerset_admission.adapters.nats.connect import DEFAULT_SERVERS

    try:
        settings = load_settings(flags=flags_from_args(args), config_file=args.config_file)
        # A tool reads an existing deployment; with no servers configured, the local default.
        options = settings.nats_connect_options(settings.nats_servers or DEFAULT_SERVERS)
    except ConfigError as error:
        print(f"workerset-admission {name}: {error}", file=sys.stderr)
        return EXIT_UNREADABLE
    source = NatsRecordSource(options, settings.admission_bucket)
    try:
        return asyncio.run(run_async(args, source))
    except KeyboardInterrupt:
        # An operator gave up waiting: the gate was not seen open.
        print(f"workerset-admission {name}: interrupted", file=sys.stderr)
        return EXIT_CLOSED
