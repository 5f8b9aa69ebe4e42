"""``workerset-admission drain`` and ``undrain``: take workers out of routing before they stop.

``drain`` names workers (an instance id as ``status`` prints it; ``--host`` as a Kubernetes
``preStop`` hook knows its pod; or ``--namespace NS --all``, narrowed to a WorkerSet or a model),
refuses before writing anything when that would leave a model with no routable worker on a live
frontend (``--allow-empty`` drains anyway), writes one drain record per worker into the
discovery bucket, and with ``--wait`` answers "safe to stop" once no live frontend's serving
record lists them (see ``rollout/drain.py``). ``undrain`` (or ``drain --cancel``) withdraws the
drain records of the workers the same selectors name.

A drain is prepared, then committed. Prepared: the workers found, the last-worker check
passed, and every namespace's drain record and every model's budget record tried for this
user's right to write it (a write the server can only refuse or answer "wrong revision", so
nothing is stored). Committed: the budgets swapped by revision (a drain that raced another
checks again), then the drain records written. A drain refused at any point before the commit
has written nothing a frontend reads. What to do when, and what a lost race or a refusal
leads to, is the pure machine of ``rollout/drain_protocol.py``; this module keeps the flags,
the printing, and the small driver (:func:`_check_and_commit`) that carries its actions out on
the store.

Exit statuses (the command line's table): 0 done, or with ``--wait`` safe to stop; 1 ``--wait``
timed out or was interrupted (the drain stays in place); 2 bad input, such as an instance no
worker in the bucket has; 3 NATS could not be reached before the timeout; 5 NATS refused this
user a write it needs (nothing was drained); 6 refused, a model would be left with no routable
worker; 7 ``--wait``: every live frontend let the workers go, but another could not confirm: a
silent one (its ``serve`` stopped, stalled or cut off) still routes to them by its last view
until the timeout passed, or one live when the drain began went away without confirming and
without a lease on its view (``--allow-unconfirmed`` counts either as let go).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import json
import os
import random
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Protocol, TextIO

from workerset_admission.card import BoundarySettings
from workerset_admission.card.drain_record import MAX_BY_LENGTH, budget_kv_key
from workerset_admission.card.serving_record import (
    BucketRead,
    NamespaceRecord,
    Record,
    parse_record,
)
from workerset_admission.cli.exits import EXIT_NO, EXIT_OK, EXIT_UNCONFIRMED
from workerset_admission.cli.runner import seconds_within, text_within
from workerset_admission.errors import (
    InvalidRecordError,
    LastWorkerRefused,
    Unreachable,
    UsageError,
    wire_text,
)
from workerset_admission.identity import Drain
from workerset_admission.keys import drain_kv_key, key_matches, parse_drain_key
from workerset_admission.rollout.drain import (
    PENDING_WINDOW,
    BudgetRead,
    DrainCheck,
    Selection,
    Worker,
    check_drained,
    check_last_workers,
    find_workers,
    gone_unconfirmed,
    lost_models,
    models_of,
    nats_subjects,
    parse_instance_id,
    wait_namespaces,
)
from workerset_admission.rollout.drain_protocol import (
    DrainProtocol,
    Prepare,
    Read,
    Release,
    Snapshot,
    State,
    Swap,
    Write,
)
from workerset_admission.rollout.frontends import leased_frontends, record_filters

__all__ = [
    "DrainStore",
    "arguments",
    "main",
    "run_drain",
    "run_undrain",
    "selection_from_args",
    "wait_until_safe",
]

# The longest a drain command waits, for NATS and for the frontends: a day.
_MOST_TIMEOUT = 86400.0
# A drain record outlives its worker by its TTL at most: a month is already forgetful.
_MOST_TTL = 30 * 86400.0

# The longest progress line a command prints: it may name many workers and frontends, and
# quotes what their records say (escaped, so no record can start a line of its own).
PROGRESS_LIMIT = 2000


class DrainStore(Protocol):
    """What the drain tools read and write (NATS, or a test's fake)."""

    async def open(self, deadline: float) -> None: ...

    async def close(self) -> None: ...

    async def workers_listing(self) -> list[tuple[str, bytes]]: ...

    async def drains(self) -> list[tuple[str, bytes]]: ...

    async def serving(self, filters: Sequence[str] | None = None) -> BucketRead:
        """Read the serving records (only the keys ``filters`` name, when given)."""
        ...

    async def put(self, key: str, value: bytes, ttl: float | None) -> None: ...

    async def delete(self, key: str) -> bool: ...

    async def may_write(self, key: str) -> None:
        """Raise ``CredentialsRefused`` unless this user may write ``key``; store nothing."""
        ...

    async def budget(self, key: str) -> BudgetRead:
        """Read a budget record's revision, value and the server's time of it."""
        ...

    async def swap_budget(
        self, key: str, value: bytes, revision: int | None, ttl: float | None
    ) -> bool:
        """Write a budget record if it is still at ``revision``; False when it moved.

        ``ttl``: the server removes the record that long after this write.
        """
        ...

    async def server_time(self) -> float | None:
        """Return the NATS server's time now (Unix seconds), or None when it does not say it."""
        ...


# Where the NATS request plane's subscribers are (subject -> host): the NATS server's monitoring.
SubjectHosts = Callable[[str, Sequence[str]], Awaitable[Mapping[str, str]]]


def arguments(name: str, parser: argparse.ArgumentParser) -> None:
    verb = "drain" if name == "drain" else "undrain"
    parser.add_argument(
        "instance",
        nargs="?",
        help="the worker's instance id, as status prints it (decimal, or hex with 0x)",
    )
    parser.add_argument(
        "--namespace",
        action="append",
        metavar="NS",
        help=f"only workers of this namespace (repeat for more); with --all, {verb} all of it",
    )
    parser.add_argument(
        "--all",
        action="store_true",
        dest="every",
        help=f"{verb} every worker of --namespace (narrowed by --component, --endpoint, --model)",
    )
    parser.add_argument("--component", help="with --all: only this component's workers")
    parser.add_argument("--endpoint", help="with --all: only this endpoint's workers")
    parser.add_argument("--model", help="with --all: only workers with a card of this model")
    parser.add_argument(
        "--host",
        type=text_within(MAX_BY_LENGTH),
        help="the workers on this host, as their endpoint records carry it (a pod's IP)",
    )
    parser.add_argument(
        "--host-from-env",
        metavar="VARIABLE",
        help="as --host, with the host read from this environment variable (a preStop hook's "
        "POD_IP: the kubelet does not expand $(VAR) in a hook's command)",
    )
    parser.add_argument(
        "--port",
        type=int,
        help="with --host: only the worker whose request plane listens on this port (pods "
        "sharing one IP, hostNetwork)",
    )
    parser.add_argument(
        "--port-from-env",
        metavar="VARIABLE",
        help="as --port, read from this environment variable (a preStop hook's DYN_TCP_RPC_PORT)",
    )
    parser.add_argument(
        "--nats-monitor",
        metavar="URL",
        help="the request plane's NATS monitoring address (http://nats:8222): finds --host "
        "among workers on the NATS request plane, whose records carry no host",
    )
    parser.add_argument("--json", action="store_true", help="print JSON for machines")
    wait_help = " and, with --wait, for every frontend" if name == "drain" else ""
    parser.add_argument(
        "--timeout",
        type=seconds_within(_MOST_TIMEOUT),
        default=300.0,
        metavar="SECONDS",
        help=f"how long to wait for NATS{wait_help} (default 300)",
    )
    if name == "undrain":
        return
    parser.add_argument(
        "--cancel", action="store_true", help="withdraw the drain instead (as undrain does)"
    )
    parser.add_argument(
        "--allow-empty",
        action="store_true",
        help="drain even when a model would be left with no routable worker (scale to zero)",
    )
    parser.add_argument(
        "--wait",
        action="store_true",
        help="wait until no live frontend routes to the workers (and any successor serves)",
    )
    parser.add_argument(
        "--allow-unconfirmed",
        action="store_true",
        help="with --wait, count a frontend that went away without confirming (its records "
        "expired: stopped, or cut off from NATS), or a silent one still routing by its last "
        "view, as one that let the workers go",
    )
    parser.add_argument(
        "--grace",
        type=seconds_within(3600.0, zero=True),
        default=0.0,
        metavar="SECONDS",
        help="with --wait, then wait this long more for requests in flight (default 0)",
    )
    parser.add_argument(
        "--by",
        type=text_within(MAX_BY_LENGTH),
        default="",
        help=f"who drains it, kept in the drain record, at most {MAX_BY_LENGTH} characters "
        "(default: the user and host)",
    )
    parser.add_argument(
        "--ttl",
        type=seconds_within(_MOST_TTL, zero=True),
        default=3600.0,
        metavar="SECONDS",
        help="the server removes the drain record after this long; 0 keeps it (default 3600)",
    )
    parser.add_argument(
        "--interval",
        type=seconds_within(60.0),
        default=0.25,
        metavar="SECONDS",
        help="how often --wait looks at the serving records (default 0.25)",
    )


def selection_from_args(
    args: argparse.Namespace, environ: Mapping[str, str] = os.environ
) -> Selection:
    """Read which workers the flags name; refuse conflicts and missing parts (status 2)."""
    host = args.host
    variable = getattr(args, "host_from_env", None)
    if variable is not None:
        if host is not None:
            raise UsageError("name the host one way: --host and --host-from-env conflict")
        host = environ.get(variable, "")
        if not host:
            raise UsageError(f"--host-from-env: the environment variable {variable} is not set")
        if len(host) > MAX_BY_LENGTH:
            raise UsageError(f"--host-from-env: {variable} is longer than {MAX_BY_LENGTH}")
    port = _port(args.port, getattr(args, "port_from_env", None), environ)
    selection = Selection(
        instance_id=None if args.instance is None else parse_instance_id(args.instance),
        host=host,
        port=port,
        every=args.every,
        namespaces=tuple(args.namespace or ()),
        component=args.component,
        endpoint=args.endpoint,
        model=args.model,
    )
    selection.check()
    return selection


def _port(given: int | None, variable: str | None, environ: Mapping[str, str]) -> int | None:
    if variable is not None:
        if given is not None:
            raise UsageError("name the port one way: --port and --port-from-env conflict")
        text = environ.get(variable, "")
        if not text:
            raise UsageError(f"--port-from-env: the environment variable {variable} is not set")
        if not text.isdigit():
            raise UsageError(f"--port-from-env: {variable} is not a port number")
        given = int(text)
    if given is not None and not 0 < given < 65536:
        raise UsageError(f"--port {given} is not a port number (1 to 65535)")
    return given


def _record(key: str, value: bytes, published_at: float | None) -> Record | None:
    try:
        return parse_record(key, value, published_at)
    except InvalidRecordError:
        return None  # a record the gate refuses names no frontend it could trust


def _records(read: BucketRead) -> list[Record]:
    parsed = (_record(e.key, e.value, e.published_at) for e in read.entries)
    return [record for record in parsed if record is not None]


def _progress_line(check: DrainCheck, elapsed: float) -> str:
    live = [f for f in check.frontends if not f.silent]
    confirmed = sum(f.confirmed for f in live)
    line = f"[{elapsed:6.1f}s] {confirmed}/{len(live)} live frontends let it go"
    if check.waiting_for:
        line += f"; waiting for {', '.join(check.waiting_for)}"
    silent = [f for f in check.frontends if f.silent and not f.confirmed]
    if silent:
        line += "; silent, still routing by its last view: " + ", ".join(
            f.frontend if f.routes_until is None else f"{f.frontend} (until {_utc(f.routes_until)})"
            for f in silent
        )
    if check.unconfirmed:
        line += f"; went away without confirming: {', '.join(check.unconfirmed)}"
    return line


def _utc(stamp: float) -> str:
    return time.strftime("%H:%M:%SZ", time.gmtime(stamp))


async def wait_until_safe(
    store: DrainStore,
    workers: Sequence[Worker],
    *,
    timeout: float,
    interval: float,
    progress: Callable[[str], None],
    before: Sequence[Record] = (),
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    wait_for_silent: bool = True,
) -> DrainCheck | None:
    """Look until every frontend let the workers go or ``timeout`` passes (``None``: unread).

    ``before`` is what the frontends served when the drain was written: a model one of them
    served then and serves no member of now is reported, once, as lost while waiting; a
    frontend live then that went away before it ever listed none of the workers, and stated no
    lease on its view, is reported as unconfirmed (the answer comes as soon as every live
    frontend let go; it is not "safe"). A silent frontend whose last view lists a worker is
    waited for (unless ``wait_for_silent`` is false): until it comes back and lets go, or the
    server removes its lease (its view has expired), or the timeout.
    """
    started = clock()
    last: str | None = None
    check: DrainCheck | None = None
    lost: list[tuple[str, str]] = []
    confirmed: set[str] = set()
    # Frontends seen stating a lease on their view: gone from the bucket, that lease ran out.
    leased: set[str] = set()
    # Each look reads only what it asks about, not the whole bucket.
    filters = record_filters(wait_namespaces(before, workers))
    before = [r for r in before if key_matches(r.key, filters)]
    while True:
        read = await store.serving(filters)
        elapsed = clock() - started
        if read.problem is None:
            records = _records(read)
            for frontend, model in lost_models(before, records):
                if (frontend, model) not in lost:
                    lost.append((frontend, model))
                    progress(
                        f"[{elapsed:6.1f}s] model {model} lost its last routable worker on "
                        f"frontend {frontend} while waiting"
                    )
            now = check_drained(records, workers)
            confirmed.update(f.frontend for f in now.frontends if f.confirmed)
            leased |= leased_frontends(records)
            unconfirmed = gone_unconfirmed(before, records, confirmed, leased)
            check = dataclasses.replace(now, lost=tuple(lost), unconfirmed=unconfirmed)
            line = _progress_line(check, elapsed)
        else:
            line = f"[{elapsed:6.1f}s] cannot read the serving records: {read.problem}"
        if last is None or line.split("] ", 1)[1] != last.split("] ", 1)[1]:
            progress(line)
            last = line
        # A silent frontend may come back and let go, or its lease run out: worth waiting for.
        silent = wait_for_silent and check is not None and bool(check.silent_routing)
        if check is not None and read.problem is None and check.settled and not silent:
            return check
        if elapsed >= timeout:
            return check
        await sleep(min(interval, max(0.0, timeout - elapsed)))


def _default_by() -> str:
    import getpass
    import socket

    try:
        user = getpass.getuser()
    except (OSError, KeyError, ImportError):  # no login name and no password entry for the uid
        user = "unknown"
    return f"{user}@{socket.gethostname()}"[:MAX_BY_LENGTH]


async def _prepare(
    store: DrainStore, workers: Sequence[Worker], budget_keys: Sequence[str]
) -> None:
    """Try this user's right to write every record the drain will write, storing none.

    NATS cannot be asked what a user may do; a write the server must refuse, or answer with
    "wrong revision", tells it without changing anything. A user's right to write drain records
    covers a namespace, so one record per namespace is tried, and each model's budget.
    """
    by_namespace: dict[str, str] = {}
    for worker in sorted(workers):
        key = drain_kv_key(worker.namespace, worker.instance_id)
        by_namespace.setdefault(worker.namespace, key)
    for key in [*by_namespace.values(), *budget_keys]:
        await store.may_write(key)


async def _release(store: DrainStore, protocol: DrainProtocol, models: Sequence[str]) -> None:
    """Take the drain's workers out of the budgets it swapped them into (a few tries each).

    After its drain records are written (a drain reading the budget after this reads those
    records too), or when it is refused after all. A budget left holding them lapses by the
    server's clock (rollout/drain.py, the budgets).
    """
    for model in models:
        key = budget_kv_key(model)
        for _attempt in range(20):
            budget = await store.budget(key)
            value = protocol.release_value(model, budget)
            if value is None or await store.swap_budget(
                key, value, budget.revision, protocol.window
            ):
                break


async def _read(store: DrainStore, action: Read, listing: Sequence[tuple[str, bytes]]) -> Snapshot:
    """Read what the protocol asks for, in its order: budgets, drains, serving, listing, time."""
    if action.pause:
        await asyncio.sleep(action.pause)
    budgets = {model: await store.budget(budget_kv_key(model)) for model in action.models}
    in_force = _drained(await store.drains())
    read = await store.serving()
    if read.problem is not None:
        raise Unreachable(f"cannot tell what the frontends serve: {read.problem}")
    if action.listing:
        listing = await store.workers_listing()
    return Snapshot(budgets, in_force, _records(read), listing, await store.server_time())


def _boundary(args: argparse.Namespace) -> BoundarySettings | None:
    """Return the discovery boundary's settings the frontends run with, as given here."""
    settings = getattr(args, "settings", None)
    if settings is None:
        return None
    from workerset_admission.wiring.compose import boundary_settings

    return boundary_settings(settings)


async def _check_and_commit(
    store: DrainStore,
    args: argparse.Namespace,
    listing: Sequence[tuple[str, bytes]],
    workers: Sequence[Worker],
    progress: Callable[[str], None],
    *,
    drain: Callable[[Worker], Drain],
    clock: Callable[[], float],
    deadline: float,
    window: float,
) -> list[Record]:
    """Carry the drain protocol (rollout/drain_protocol.py) out on the store.

    Returns what the frontends served at the check that passed. Raises ``LastWorkerRefused``
    or ``Unreachable`` when the protocol ends refused or gave up (nothing was drained).
    """
    boundary = _boundary(args)
    protocol = DrainProtocol(
        tuple(workers),
        tuple(models_of(listing, workers, boundary=boundary)),
        functools.partial(check_last_workers, boundary=boundary),
        allow_empty=args.allow_empty,
        window=window,
        jitter=random.random,
    )
    before: list[Record] = []
    while True:
        action = protocol.next_action()
        if isinstance(action, Read):
            snapshot = await _read(store, action, listing)
            listing = snapshot.listing
            protocol.read(snapshot)
            before = list(snapshot.serving)
        elif isinstance(action, Prepare):
            await _prepare(store, workers, action.budget_keys)
            protocol.prepare_done()
        elif isinstance(action, Swap):
            if await store.swap_budget(action.key, action.value, action.revision, action.ttl):
                protocol.swapped_one()
            else:
                protocol.raced(past_deadline=clock() >= deadline)
        elif isinstance(action, Write):
            for item in action.allowed:
                progress(f"--allow-empty: {item}")
            ttl = args.ttl if args.ttl > 0 else None
            await _write_all(store, action.workers, drain, ttl, progress)
            protocol.written()
        elif isinstance(action, Release):
            await _release(store, protocol, action.models)
            protocol.released()
        elif action.state is State.DONE:
            return before
        elif action.state is State.REFUSED:
            raced = " (other drains took their workers first)" if action.raced else ""
            raise LastWorkerRefused(
                f"refused{raced}: {'; '.join(map(str, action.emptied))}; nothing was drained "
                "(--allow-empty drains anyway)"
            )
        else:
            raise Unreachable(
                f"the drain budget of model {action.model} kept moving (other drains) until the "
                "timeout; nothing was drained"
            )


async def _write_all(
    store: DrainStore,
    workers: Sequence[Worker],
    drain: Callable[[Worker], Drain],
    ttl: float | None,
    progress: Callable[[str], None],
) -> None:
    """Write every drain record (the prepare step found each of them writable)."""
    from workerset_admission.card import encode_drain_record

    for worker in workers:
        key = drain_kv_key(worker.namespace, worker.instance_id)
        await store.put(key, encode_drain_record(drain(worker)), ttl)
        progress(f"drained {worker} (by {drain(worker).by})")


async def run_drain(
    args: argparse.Namespace,
    store: DrainStore,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
    *,
    clock: Callable[[], float] = time.monotonic,
    wall: Callable[[], float] = time.time,
    environ: Mapping[str, str] = os.environ,
    subject_hosts: SubjectHosts | None = None,
    window: float = PENDING_WINDOW,
) -> int:
    """Run ``drain`` (or ``drain --cancel``); ``window`` is how long a budget entry counts."""

    def progress(line: str) -> None:
        err.write(wire_text(line, PROGRESS_LIMIT) + "\n")
        err.flush()

    selection = selection_from_args(args, environ)
    started = clock()
    timeout = args.timeout
    await store.open(started + timeout)
    try:
        listing = await store.workers_listing()
        workers = await _find(listing, selection, args.nats_monitor, subject_hosts)
        if args.cancel:
            return await _lift(store, workers, args, out)
        already = set(_drained(await store.drains()))
        by = args.by or _default_by()
        # ``at`` is only reported (status shows when); no decision reads a host's clock.
        before = await _check_and_commit(
            store, args, listing, workers, progress,
            drain=lambda worker: Drain(worker.namespace, worker.instance_id, by, round(wall(), 3)),
            clock=clock, deadline=started + timeout, window=window,
        )  # fmt: skip
        if not args.wait:
            if args.json:
                out.write(json.dumps({"drained": [_worker_json(w) for w in workers]}) + "\n")
            return EXIT_OK
        remaining = max(0.0, timeout - (clock() - started))
        check = await wait_until_safe(
            store,
            workers,
            timeout=remaining,
            interval=args.interval,
            progress=progress,
            before=before,
            wait_for_silent=not args.allow_unconfirmed,
        )
    finally:
        await store.close()
    if check is None or not check.settled:
        err.write(
            f"workerset-admission drain: still routed to after {args.timeout:g} s; "
            "the drain stays in place\n"
        )
        if args.json and check is not None:
            out.write(json.dumps(check.as_json(), indent=2, sort_keys=True) + "\n")
        return EXIT_NO
    if (check.unconfirmed or check.silent_routing) and not args.allow_unconfirmed:
        if args.json:
            out.write(json.dumps(check.as_json(), indent=2, sort_keys=True) + "\n")
        if check.silent_routing:
            err.write(
                f"workerset-admission drain: could not confirm: {', '.join(check.silent_routing)}"
                f" fell silent (its serve stopped, stalled or lost NATS) and still routes by its "
                f"last view, which holds the workers, after {args.timeout:g} s; the drain stays "
                "in place (--allow-unconfirmed counts it as let go)\n"
            )
        if check.unconfirmed:
            err.write(
                f"workerset-admission drain: unconfirmed: {', '.join(check.unconfirmed)} went "
                "away without confirming (stopped, or cut off from NATS: it may still route to "
                "the workers); the drain stays in place (--allow-unconfirmed counts it as let "
                "go)\n"
            )
        return EXIT_UNCONFIRMED
    # A hook run again on workers it drained before, that no live frontend listed even when
    # this run began: no request can be in flight to them, so there is no grace to wait.
    rerun = set(workers) <= already and not any(
        worker.owns(member)
        for record in before
        if isinstance(record, NamespaceRecord)
        for member in _all_members(record)
        for worker in workers
    )
    if args.grace > 0 and not rerun:
        progress(f"safe to stop; waiting {args.grace:g} s for requests in flight")
        await asyncio.sleep(args.grace)
    if args.json:
        out.write(json.dumps(check.as_json(), indent=2, sort_keys=True) + "\n")
    else:
        out.write(f"safe to stop: no live frontend routes to {', '.join(map(str, workers))}\n")
    return EXIT_OK


def _all_members(record: NamespaceRecord) -> list[str]:
    return [*record.members, *(m for group in record.groups or () for m in group.members)]


async def _find(
    listing: Sequence[tuple[str, bytes]],
    selection: Selection,
    monitor: str | None,
    subject_hosts: SubjectHosts | None,
) -> list[Worker]:
    hosts: Mapping[str, str] = {}
    subjects = nats_subjects(listing) if selection.host is not None else []
    if subjects and monitor is not None and subject_hosts is not None:
        hosts = await subject_hosts(monitor, subjects)
    workers = find_workers(listing, selection, subject_hosts=hosts)
    if not workers:
        line = f"{selection.describe()} in the discovery bucket"
        if subjects and monitor is None:
            line += (
                f" ({len(subjects)} endpoint(s) are on the NATS request plane, whose records "
                "name no host: give --nats-monitor http://<nats>:8222 to find them by host)"
            )
        raise UsageError(line)
    return workers


def _drained(entries: Sequence[tuple[str, bytes]]) -> list[Worker]:
    found = []
    for key, _value in entries:
        # A key that does not parse drains nothing (the boundary reports it).
        with contextlib.suppress(InvalidRecordError):
            found.append(Worker(*parse_drain_key(key)))
    return found


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


async def run_undrain(
    args: argparse.Namespace,
    store: DrainStore,
    out: TextIO = sys.stdout,
    *,
    environ: Mapping[str, str] = os.environ,
    subject_hosts: SubjectHosts | None = None,
) -> int:
    selection = selection_from_args(args, environ)
    await store.open(time.monotonic() + args.timeout)
    try:
        listing = await store.workers_listing()
        workers = await _find(listing, selection, args.nats_monitor, subject_hosts)
        return await _lift(store, workers, args, out)
    finally:
        await store.close()


async def main(name: str, args: argparse.Namespace, stop: asyncio.Event) -> int:
    del stop
    from workerset_admission.adapters.nats.drain_store import NatsDrainStore
    from workerset_admission.adapters.nats.monitor import subject_hosts
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
        return await run_undrain(args, store, subject_hosts=subject_hosts)
    return await run_drain(args, store, subject_hosts=subject_hosts)
