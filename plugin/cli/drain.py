"""``workerset-admission drain`` and ``undrain``: take a worker out of routing before it stops.

``drain`` names a worker (an instance id as ``status`` prints it, or ``--host`` as a Kubernetes
``preStop`` hook knows it), writes one drain record per worker into the discovery bucket, and
with ``--wait`` answers "safe to stop" once no live frontend's serving record lists it (see
``rollout/drain.py``). ``undrain`` (or ``drain --cancel``) withdraws the drain records.

Exit statuses (the command line's table): 0 done, or with ``--wait`` safe to stop; 1 ``--wait``
timed out or was interrupted (the drain stays in place); 2 bad input, such as an instance no
worker in the bucket has; 3 NATS could not be reached before the timeout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol, TextIO

from workerset_admission.card.serving_record import BucketRead, Record, parse_record
from workerset_admission.cli.exits import EXIT_NO, EXIT_OK
from workerset_admission.errors import InvalidRecordError, UsageError, wire_text
from workerset_admission.identity import Drain
from workerset_admission.keys import drain_kv_key
from workerset_admission.rollout.drain import (
    DrainCheck,
    Worker,
    check_drained,
    find_workers,
    parse_instance_id,
)

__all__ = ["DrainStore", "arguments", "main", "run_drain", "run_undrain", "wait_until_safe"]

# The longest progress line a command prints: it may name many workers and frontends, and
# quotes what their records say (escaped, so no record can start a line of its own).
PROGRESS_LIMIT = 2000


class DrainStore(Protocol):
    """What the drain tools read and write (NATS, or a test's fake)."""

    async def open(self, deadline: float) -> None: ...

    async def close(self) -> None: ...

    async def workers_listing(self) -> list[tuple[str, bytes]]: ...

    async def serving(self) -> BucketRead: ...

    async def put(self, key: str, value: bytes, ttl: float | None) -> None: ...

    async def delete(self, key: str) -> bool: ...


def arguments(name: str, parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "instance",
        nargs="?",
        help="the worker's instance id, as status prints it (decimal, or hex with 0x)",
    )
    parser.add_argument("--namespace", help="the worker's namespace (when an id is not enough)")
    parser.add_argument(
        "--host",
        help="name the worker by the host its endpoint records carry (a pod's IP in preStop)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON for machines")
    parser.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="how long to wait for NATS and, with --wait, for every frontend (default 300)",
    )
    if name == "undrain":
        return
    parser.add_argument(
        "--cancel", action="store_true", help="withdraw the drain instead (as undrain does)"
    )
    parser.add_argument(
        "--wait",
        action="store_true",
        help="wait until no live frontend routes to the worker (and any successor serves)",
    )
    parser.add_argument(
        "--grace",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="with --wait, then wait this long more for requests in flight (default 0)",
    )
    parser.add_argument(
        "--by",
        default="",
        help="who drains it, kept in the drain record (default: the user and host)",
    )
    parser.add_argument(
        "--ttl",
        type=float,
        default=3600.0,
        metavar="SECONDS",
        help="the server removes the drain record after this long; 0 keeps it (default 3600)",
    )
    parser.add_argument(
        "--interval",
        type=float,
        default=0.25,
        metavar="SECONDS",
        help="how often --wait looks at the serving records (default 0.25)",
    )


def _record(key: str, value: bytes, published_at: float | None) -> Record | None:
    try:
        return parse_record(key, value, published_at)
    except InvalidRecordError:
        return None  # a record the gate refuses names no frontend it could trust


def _records(read: BucketRead) -> list[Record]:
    parsed = (_record(e.key, e.value, e.published_at) for e in read.entries)
    return [record for record in parsed if record is not None]


def _progress_line(check: DrainCheck, elapsed: float) -> str:
    confirmed = sum(f.confirmed for f in check.frontends)
    line = f"[{elapsed:6.1f}s] {confirmed}/{len(check.frontends)} live frontends let it go"
    if check.waiting_for:
        line += f"; waiting for {', '.join(check.waiting_for)}"
    return line


async def wait_until_safe(
    store: DrainStore,
    workers: Sequence[Worker],
    *,
    timeout: float,
    interval: float,
    progress: Callable[[str], None],
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> DrainCheck | None:
    """Look until no live frontend lists the workers or ``timeout`` passes (``None``: unread)."""
    started = clock()
    last: str | None = None
    check: DrainCheck | None = None
    while True:
        read = await store.serving()
        elapsed = clock() - started
        if read.problem is None:
            check = check_drained(_records(read), workers)
            line = _progress_line(check, elapsed)
            if check.safe:
                return check
        else:
            line = f"[{elapsed:6.1f}s] cannot read the serving records: {read.problem}"
        if last is None or line.split("] ", 1)[1] != last.split("] ", 1)[1]:
            progress(line)
            last = line
        if elapsed >= timeout:
            return check
        await sleep(min(interval, max(0.0, timeout - elapsed)))


async def _find(store: DrainStore, args: argparse.Namespace) -> list[Worker]:
    instance = None if args.instance is None else parse_instance_id(args.instance)
    if instance is None and args.host is None:
        raise UsageError("name the worker: an instance id, or --host")
    workers = find_workers(
        await store.workers_listing(),
        instance_id=instance,
        namespace=args.namespace,
        host=args.host,
    )
    if not workers:
        named = args.instance if args.host is None else f"host {args.host}"
        where = f" in namespace {args.namespace}" if args.namespace else ""
        raise UsageError(f"no worker {named}{where} is registered in the discovery bucket")
    return workers


def _default_by() -> str:
    import getpass
    import socket

    try:
        user = getpass.getuser()
    except Exception:
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


async def run_drain(
    args: argparse.Namespace,
    store: DrainStore,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
    *,
    clock: Callable[[], float] = time.monotonic,
    wall: Callable[[], float] = time.time,
) -> int:
    def progress(line: str) -> None:
        err.write(wire_text(line, PROGRESS_LIMIT) + "\n")
        err.flush()

    started = clock()
    timeout = max(0.0, args.timeout)
    await store.open(started + timeout)
    try:
        workers = await _find(store, args)
        if args.cancel:
            return await _lift(store, workers, args, out)
        by = args.by or _default_by()
        ttl = args.ttl if args.ttl > 0 else None
        for worker in workers:
            drain = Drain(worker.namespace, worker.instance_id, by, round(wall(), 3))
            from workerset_admission.card import encode_drain_record

            await store.put(
                drain_kv_key(worker.namespace, worker.instance_id), encode_drain_record(drain), ttl
            )
            progress(f"drained {worker} (by {by})")
        if not args.wait:
            if args.json:
                out.write(json.dumps({"drained": [_worker_json(w) for w in workers]}) + "\n")
            return EXIT_OK
        remaining = max(0.0, timeout - (clock() - started))
        check = await wait_until_safe(
            store, workers, timeout=remaining, interval=max(0.05, args.interval), progress=progress
        )
    finally:
        await store.close()
    if check is None or not check.safe:
        err.write(
            f"workerset-admission drain: still routed to after {args.timeout:g} s; "
            "the drain stays in place\n"
        )
        if args.json and check is not None:
            out.write(json.dumps(check.as_json(), indent=2, sort_keys=True) + "\n")
        return EXIT_NO
    if args.grace > 0:
        progress(f"safe to stop; waiting {args.grace:g} s for requests in flight")
        await asyncio.sleep(args.grace)
    if args.json:
        out.write(json.dumps(check.as_json(), indent=2, sort_keys=True) + "\n")
    else:
        out.write(f"safe to stop: no live frontend routes to {', '.join(map(str, workers))}\n")
    return EXIT_OK


def _worker_json(worker: Worker) -> dict[str, object]:
    return {"namespace": worker.namespace, "instance_id": worker.instance_id}


async def _lift(
    store: DrainStore, workers: Sequence[Worker], args: argparse.Namespace, out: TextIO
) -> int:
    lifted = [
        worker
        for worker in workers
        if await store.delete(drain_kv_key(worker.namespace, worker.instance_id))
    ]
    if args.json:
        out.write(json.dumps({"undrained": [_worker_json(w) for w in lifted]}) + "\n")
    elif lifted:
        out.write(f"undrained {', '.join(map(str, lifted))}\n")
    else:
        out.write(f"no drain to withdraw for {', '.join(map(str, workers))}\n")
    return EXIT_OK


async def run_undrain(args: argparse.Namespace, store: DrainStore, out: TextIO = sys.stdout) -> int:
    await store.open(time.monotonic() + max(0.0, args.timeout))
    try:
        return await _lift(store, await _find(store, args), args, out)
    finally:
        await store.close()


async def main(name: str, args: argparse.Namespace, stop: asyncio.Event) -> int:
    del stop
    from workerset_admission.adapters.nats.drain_store import NatsDrainStore
    from workerset_admission.cli.connection import client_options

    settings = args.settings
    options = client_options(settings, name)

    def progress(line: str) -> None:
        sys.stderr.write(wire_text(line, PROGRESS_LIMIT) + "\n")
        sys.stderr.flush()

    store = NatsDrainStore(
        options, settings.discovery_bucket, settings.admission_bucket, progress=progress
    )
    if name == "undrain":
        return await run_undrain(args, store)
    return await run_drain(args, store)
