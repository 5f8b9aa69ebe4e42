"""``serve`` and ``status``: run the admission service, or ask a running one what it decided.

``serve`` is the main job. Without a NATS server in the settings it starts an embedded
nats-server on loopback and says where it listens. ``status`` asks a running ``serve`` over NATS
request/reply and prints a table (or the JSON).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import logging
import os
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from workerset_admission.aio import cancel_and_wait, owned_task
from workerset_admission.card.differences import Difference, summarize
from workerset_admission.cli import connection, positive_seconds
from workerset_admission.errors import (
    TABLE_LINE_LIMIT,
    Unreachable,
    UsageError,
    error_in_words,
    wire_text,
)
from workerset_admission.identity import with_id_strings
from workerset_admission.rollout.gate import Disagreement, disagreements_with
from workerset_admission.settings import Settings

if TYPE_CHECKING:
    from workerset_admission.telemetry import TelemetryHandle

__all__ = [
    "SERVE_FILE_ENV",
    "arguments",
    "brief",
    "id_list",
    "main",
    "render_status_table",
    "say",
    "serve_file",
    "start_serve_telemetry",
    "view_store_mismatch",
    "with_progress",
]

_cli_log = logging.getLogger("workerset_admission.cli")


def arguments(name: str, parser: argparse.ArgumentParser) -> None:
    if name == "serve":
        parser.add_argument(
            "--log-format", choices=("plain", "json"), default=None, help="log line format"
        )
        parser.add_argument(
            "--telemetry",
            action="store_true",
            help="install the OpenTelemetry SDK with exporters chosen by the OTEL_* environment",
        )
        parser.add_argument(
            "--store-dir",
            type=Path,
            default=None,
            help="JetStream store of the embedded server (default: a temporary directory)",
        )
    elif name == "status":
        parser.add_argument("--json", action="store_true", help="print the service's JSON")
        parser.add_argument(
            "--timeout", type=positive_seconds, default=5.0, help="seconds to wait for an answer"
        )
        parser.add_argument("--subject", default=None, help="status subject of the service")
        which = parser.add_mutually_exclusive_group()
        which.add_argument(
            "--frontend",
            metavar="ID",
            default=None,
            help="ask this frontend (its frontend_id) and no other; without it, whichever "
            "frontend answers first answers (the table's last lines name it)",
        )
        which.add_argument(
            "--all-frontends",
            action="store_true",
            help="ask every live frontend (those the admission bucket lists) and show each "
            "answer under its name; exit 3 when one of them does not answer",
        )
        parser.add_argument(
            "--card",
            metavar="MODEL",
            default=None,
            help="print the card the service serves MODEL with now, as JSON that diff reads "
            "(with several WorkerSets of MODEL, choose one with --namespace)",
        )
        parser.add_argument(
            "--namespace", default=None, help="with --card: the WorkerSet's worker namespace"
        )
        parser.add_argument(
            "--workers",
            action="store_true",
            help="list every worker with its admission and serving state (serving, draining, "
            "drained, unavailable, unknown), as the route extension's /workers does",
        )


async def main(name: str, args: argparse.Namespace, stop: asyncio.Event) -> int:
    if name == "serve":
        return await _serve(args.settings, args, stop)
    return await _status(args.settings, args)


# --------------------------------------------------------------------------- serve

_SWITCH_INTERVAL = 0.0005

# Kept here for callers that found them in this module first.
SERVE_FILE_ENV = connection.SERVE_FILE_ENV
serve_file = connection.serve_file


async def _serve(settings: Settings, args: argparse.Namespace, stop: asyncio.Event) -> int:
    from workerset_admission.telemetry import configure_logging

    configure_logging(args.log_format or settings.log_format, args.log_level)
    telemetry_handle = start_serve_telemetry(settings, otlp=args.telemetry or settings.telemetry)
    if telemetry_handle is not None:
        # A metric collection is pure Python in a thread of its own, and holds the GIL for as
        # long as the interpreter lets it: by default 5 ms each time the service's loop comes
        # back from a socket or a file write. A pass of the view makes several such calls, so
        # a scrape of a large fleet added tens of milliseconds to every change (measured:
        # integration/bench/bench_fleet.py). This process is serve's own; a shorter switch
        # interval hands the loop the GIL back within half a millisecond.
        sys.setswitchinterval(_SWITCH_INTERVAL)
    try:
        return await _serve_service(settings, args, telemetry_handle, stop)
    finally:
        if telemetry_handle is not None:
            # Off the loop: the final metric collection reads the service's state, which it
            # asks of this loop; blocking the loop here made each gauge wait out its timeout.
            await asyncio.to_thread(telemetry_handle.shutdown)


def start_serve_telemetry(settings: Settings, *, otlp: bool) -> TelemetryHandle | None:
    """Install what ``serve`` was asked for: OTLP export, the Prometheus endpoint, or both.

    The process is ``serve``'s own, so the providers also become the global ones. None when
    neither was asked for.
    """
    from workerset_admission.telemetry import setup_telemetry

    prometheus = settings.prometheus_address
    if not otlp and prometheus is None:
        return None
    # service.instance.id tells this frontend's spans and metrics from its siblings'.
    handle = setup_telemetry(
        otlp=otlp,
        prometheus=prometheus,
        resource_attributes={"service.instance.id": settings.frontend_id},
    )
    if handle.prometheus_url is not None:
        say(f"Prometheus metrics on {handle.prometheus_url}")
    return handle


async def _serve_service(
    settings: Settings,
    args: argparse.Namespace,
    telemetry_handle: TelemetryHandle | None,
    stop: asyncio.Event,
) -> int:
    from workerset_admission.wiring.compose import admission_telemetry, create_service

    telemetry = None
    if telemetry_handle is not None:
        telemetry = admission_telemetry(settings, telemetry_handle)
    async with contextlib.AsyncExitStack() as stack:
        running: list[Any] = []  # the service, once started: what /readyz asks
        _supervise(settings, stack, lambda: bool(running) and running[0].synced)
        view_files = None
        if settings.view_dir is not None:
            from workerset_admission.adapters.dynamo.view import DirectoryFiles

            # Checked and locked before anything starts: a bad directory costs no connection.
            view_files = DirectoryFiles.open(settings.view_dir)
            mismatch = view_store_mismatch(settings.view_dir, os.environ)
            if mismatch is not None:
                logging.getLogger("workerset_admission.cli").warning("%s", mismatch)
            stack.callback(view_files.release)
        servers: Sequence[str] | None = None
        if settings.embedded:
            from workerset_admission.adapters.nats.embedded import EmbeddedNatsServer

            store = args.store_dir or settings.embedded_store_dir
            server = await EmbeddedNatsServer(store, die_with_owner=True).astart()
            stack.push_async_callback(server.aclose)
            servers = (server.url,)
            say(f"embedded nats-server listening on {server.url} (store {server.store_dir})")
            stack.callback(connection.announce_local_serve(server.url, settings.status_subject))
        from workerset_admission.adapters.nats.connect import servers_for_display

        where = servers_for_display(servers or settings.nats_servers)

        def start(started_in_outage: bool = False) -> Awaitable[Any]:
            return create_service(
                settings,
                servers=servers,
                telemetry=telemetry,
                view_files=view_files,
                started_in_outage=started_in_outage,
            )

        if view_files is None:
            service = await with_progress(start(), f"connecting to NATS at {where}")
        else:
            service = await _start_keeping_the_view(start, view_files, settings, where, stop)
            if service is None:
                return 0  # stopped while NATS was still out of reach
        stack.push_async_callback(service.stop)
        running.append(service)
        stopper = owned_task(_stop_when(stop, service), name="serve's stop", log=_cli_log)
        stack.push_async_callback(cancel_and_wait, [stopper])
        say(
            f"watching bucket {settings.discovery_bucket!r}; status on "
            f"{settings.status_subject!r}; publishing to {settings.admission_bucket!r}"
        )
        if settings.view_dir is not None:
            say(f"writing the admitted discovery view to {settings.view_dir}")
        # A signal during the wait stops the service cleanly; run() then reports any failure.
        with contextlib.suppress(UsageError):
            await with_progress(service.wait_synced(), "waiting for the first discovery snapshot")
        if service.synced:
            current = service.status()
            say(
                f"synced: {len(current.groups)} group(s), {current.live_instances} live instance(s)"
            )
            # This process is ours: what the initial sync built lives as long as the fleet, so
            # keep it out of full collections, whose pauses would otherwise grow with the fleet.
            gc.freeze()
        await service.run()
    return 0


def view_store_mismatch(view_dir: Path, environ: Mapping[str, str]) -> str | None:
    """Say when ``DYN_FILE_KV`` in serve's own environment names another directory than the view.

    Only a warning: serve usually runs in another container or unit than the frontend, whose
    ``DYN_FILE_KV`` it cannot see; where the two share an environment (one pod's env, one
    settings file), a frontend reading that other directory would never see the admitted view.
    Without ``DYN_FILE_KV`` nothing is said.
    """
    store = environ.get("DYN_FILE_KV")
    if not store or os.path.realpath(store) == os.path.realpath(view_dir):
        return None
    return (
        f"the view directory {view_dir} is not DYN_FILE_KV={store} of this environment: the "
        "frontend must have the view directory as its DYN_FILE_KV (a frontend on "
        f"{store} never sees the admitted view); if {store} is the workers' store, as a "
        "bridge beside serve reads it, this is as it should be"
    )


def _supervise(
    settings: Settings, stack: contextlib.AsyncExitStack, ready: Callable[[], bool]
) -> None:
    """Beat on this loop for supervisors: systemd's watchdog, and ``--health-port``'s probes."""
    from workerset_admission.cli.supervision import HealthServer, SystemdNotifier
    from workerset_admission.service.loop_watch import LoopWatch

    watch = LoopWatch()
    beating = owned_task(watch.run(), name="serve's loop beat", log=_cli_log)
    stack.push_async_callback(cancel_and_wait, [beating])
    notifier = SystemdNotifier()
    notifier.follow(watch)
    stack.callback(notifier.close)
    if settings.health_port is not None:
        health = HealthServer(watch, ready, settings.health_host, settings.health_port)
        health.start()
        stack.callback(health.close)
        say(f"liveness on {health.url}/livez, readiness on {health.url}/readyz")


async def _start_keeping_the_view(
    start: Callable[[bool], Awaitable[Any]],
    view_files: Any,
    settings: Settings,
    where: str,
    stop: asyncio.Event,
) -> Any:
    """Start the service, retrying while NATS is out of reach; the view stays last known good.

    Exiting would leave the frontend without the view a predecessor left (a sidecar
    restarted during a NATS outage would take its models down for the rest of the outage),
    so the predecessor's files are kept until the horizon that predecessor set runs out, and
    every attempt that fails says so. ``None`` when ``stop`` is set first. The attempt that
    connects after a failed one says it started during an outage: its workers could not
    refresh their records either, so the core holds what an outage may have faked.
    """
    from workerset_admission.adapters.dynamo.view import Horizon, LastKnownGood
    from workerset_admission.cli.exits import EXIT_UNREACHABLE, exit_status, unreachable_errors

    keeper = None
    delay = 1.0
    while True:
        try:
            return await with_progress(start(keeper is not None), f"connecting to NATS at {where}")
        except unreachable_errors() as exc:
            # Only an unreachable server is worth waiting for; a refused secret never heals.
            if exit_status(exc) != EXIT_UNREACHABLE or "authorization" in str(exc).lower():
                raise
            if keeper is None:
                keeper = LastKnownGood(view_files, lease=Horizon(settings.view_horizon).lease)
            kept = (
                f"keeping the previous writer's {len(keeper.kept)} view file(s) for "
                f"{max(0.0, keeper.until - time.monotonic()):.0f} s more"
                if keeper.serving
                else "the view is empty until the first sync"
            )
            say(f"cannot reach NATS yet ({error_in_words(exc)}); {kept}; retrying in {delay:g} s")
        deadline = time.monotonic() + delay
        while time.monotonic() < deadline and keeper is not None:
            keeper.keep_alive()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), min(1.0, deadline - time.monotonic()))
            if stop.is_set():
                return None
        delay = min(delay * 2, 8.0)


async def _stop_when(stop: asyncio.Event, service: Any) -> None:
    await stop.wait()
    await service.stop()


async def with_progress(awaitable: Awaitable[Any], what: str, every: float = 2.0) -> Any:
    """Await, printing a line every ``every`` seconds so a long wait never looks hung."""
    task = asyncio.ensure_future(awaitable)
    started = time.monotonic()
    try:
        while True:
            done, _pending = await asyncio.wait({task}, timeout=every)
            if done:
                return task.result()
            say(f"{what}... ({time.monotonic() - started:.0f} s)")
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def say(text: str, stream: TextIO | None = None) -> None:
    print(text, file=stream or sys.stdout, flush=True)


# --------------------------------------------------------------------------- status


async def _status(settings: Settings, args: argparse.Namespace) -> int:
    from workerset_admission.adapters.nats.errors import NatsTimeoutError, NoRespondersError

    subject = args.subject or settings.status_subject
    # Where --card reads the served card from.
    bucket = settings.discovery_bucket
    if not settings.nats_servers:
        # No server configured: ask the local serve that runs an embedded one, if any.
        local = connection.local_serve()
        if local is not None:
            subject = args.subject or str(local.get("status_subject") or subject)
    options = connection.client_options(settings, "status")
    if args.all_frontends:
        if args.card is not None or args.workers:
            raise UsageError(
                "--all-frontends shows each frontend's status: not with --card or --workers"
            )
        return await _status_of_every_frontend(settings, args, options, subject)
    nc = await _connect_for_status(options, args.timeout)
    if args.frontend is not None:
        from workerset_admission.adapters.nats.status import frontend_subject

        subject = frontend_subject(subject, args.frontend)
    try:
        reply = await nc.request(subject, b"", timeout=args.timeout)
    except (NoRespondersError, NatsTimeoutError):
        await nc.close()
        if args.frontend is not None:
            raise Unreachable(
                f"frontend {args.frontend!r} does not answer on {subject!r} (status "
                "--all-frontends lists the live ones)"
            ) from None
        raise Unreachable(f"no admission service answers on {subject!r}") from None
    try:
        if args.card is not None:
            card = await _served_card(nc, bucket, status_of(reply), args)
            print(json.dumps(card, indent=2, sort_keys=True))
            return 0
    finally:
        await nc.close()
    status = status_of(reply)
    if args.workers:
        from workerset_admission.service.worker_listing import (
            render_worker_table,
            status_from_json,
            worker_listing,
        )

        rows = worker_listing(status_from_json(status))
        if args.json:
            document = {"synced": status.get("synced"), "workers": rows}
            print(json.dumps(with_id_strings(document), indent=2, sort_keys=True))
        else:
            print(render_worker_table(rows), end="")
        return 0
    found = await _disagreements(options, settings.admission_bucket, status, args.timeout)
    if found:
        status["disagreements"] = [item.as_json() for item in found]
    if args.json:
        print(json.dumps(with_id_strings(status), indent=2, sort_keys=True))
    else:
        print(render_status_table(status))
    return 0


async def _connect_for_status(options: Any, timeout: float) -> Any:
    """Connect within ``timeout``, or say in words which servers did not answer."""
    from workerset_admission.adapters.nats.connect import connect, servers_for_display
    from workerset_admission.adapters.nats.errors import NatsError
    from workerset_admission.errors import error_in_words

    where = servers_for_display(options.servers)
    try:
        return await asyncio.wait_for(connect(options), timeout)
    except asyncio.TimeoutError:
        raise Unreachable(f"no NATS server answered within {timeout:g} s: {where}") from None
    except (OSError, NatsError) as error:
        words = error_in_words(error, where=where, timeout=timeout)
        raise Unreachable(f"cannot reach NATS: {words}") from None


async def _status_of_every_frontend(
    settings: Settings, args: argparse.Namespace, options: Any, subject: str
) -> int:
    """Ask each live frontend by its own subject; print every answer, and every silence."""
    from workerset_admission.adapters.nats.errors import NatsTimeoutError, NoRespondersError
    from workerset_admission.adapters.nats.frontend_state import live_frontends
    from workerset_admission.adapters.nats.status import frontend_subject
    from workerset_admission.cli.exits import EXIT_UNREACHABLE

    frontends = await live_frontends(options, settings.admission_bucket, args.timeout)
    if not frontends:
        raise Unreachable(
            f"no live frontend publishes its admissions in bucket {settings.admission_bucket!r}"
        )
    nc = await _connect_for_status(options, args.timeout)

    async def ask(frontend: str) -> dict[str, Any]:
        own = frontend_subject(subject, frontend)
        try:
            reply = await nc.request(own, b"", timeout=args.timeout)
        except (NoRespondersError, NatsTimeoutError):
            return {
                "frontend": frontend,
                "error": f"no answer on {own!r} within {args.timeout:g} s",
            }
        return {"frontend": frontend, "status": status_of(reply)}

    try:
        answers = await asyncio.gather(*(ask(frontend) for frontend in frontends))
    finally:
        await nc.close()
    if args.json:
        document = {"frontends": [with_id_strings(answer) for answer in answers]}
        print(json.dumps(document, indent=2, sort_keys=True))
    else:
        sections = []
        for answer in answers:
            body = answer.get("error") or render_status_table(answer["status"])
            sections.append(f"== frontend {wire_text(answer['frontend'])}\n{body}")
        print("\n\n".join(sections))
    silent = [answer["frontend"] for answer in answers if "error" in answer]
    if silent:
        print(
            f"workerset-admission status: {len(silent)} of {len(answers)} live frontend(s) did "
            f"not answer: {', '.join(wire_text(f) for f in silent)}",
            file=sys.stderr,
        )
        return EXIT_UNREACHABLE
    return 0


async def _disagreements(
    options: Any, bucket: str, status: Mapping[str, Any], timeout: float
) -> tuple[Disagreement, ...]:
    """Read the other frontends' serving records: where they serve another configuration.

    Frontends choose alone, so they can disagree (after an outage a frontend restarted during
    it once did); status says so, naming which frontends serve which checksum. A bucket that
    cannot be read adds nothing: status answers what the frontend said.
    """
    from workerset_admission.adapters.nats.admission_reader import NatsRecordSource
    from workerset_admission.card.serving_record import parse_record
    from workerset_admission.errors import InvalidRecordError, PermissionRefused

    frontend = status.get("frontend")
    incumbents = {
        (group["model"], group["worker_set_id"]): group["incumbent"]
        for group in status.get("groups", [])
        if group.get("incumbent") and "worker_set_id" in group
    }
    if not frontend or not incumbents:
        return ()
    try:
        read = await NatsRecordSource(options, bucket, timeout=timeout).read()
    except PermissionRefused:
        return ()  # a status user need not read serving records (docs/security.md)
    records = []
    for entry in read.entries:
        with contextlib.suppress(InvalidRecordError):
            records.append(parse_record(entry.key, entry.value, entry.published_at))
    return disagreements_with(records, str(frontend), incumbents)


def status_of(reply: Any) -> dict[str, Any]:
    """Decode a status reply."""
    status: dict[str, Any] = json.loads(reply.data)
    return status


async def _served_card(
    nc: Any, bucket: str, status: Mapping[str, Any], args: argparse.Namespace
) -> Any:
    """Read the incumbent card of one WorkerSet of ``args.card`` from the discovery bucket.

    The card is that of an admitted worker (every admitted worker's card has the incumbent's
    checksum), as the worker wrote it: ``diff`` takes it as is.
    """
    from workerset_admission.identity import EndpointId
    from workerset_admission.keys import model_kv_key

    groups = [
        g
        for g in status.get("groups", [])
        if g["model"] == args.card
        and args.namespace in (None, g["namespace"])
        and isinstance(g.get("admitted"), list)
        and g["admitted"]
    ]
    if not groups:
        where = "" if args.namespace is None else f" in namespace {args.namespace!r}"
        raise UsageError(f"the service admits no worker of model {args.card!r}{where}")
    if len(groups) > 1:
        choices = ", ".join(sorted({g["namespace"] for g in groups}))
        raise UsageError(
            f"model {args.card!r} is served by {len(groups)} WorkerSets: choose one with "
            f"--namespace ({choices})"
        )
    (group,) = groups
    endpoint = EndpointId(group["namespace"], group["component"], group["endpoint"])
    key = model_kv_key(endpoint, int(group["admitted"][0]))
    kv = await nc.jetstream().key_value(bucket)
    record = json.loads((await kv.get(key)).value)
    return record.get("card_json", record)


def brief(checksum: object) -> str:
    return "-" if checksum is None else str(checksum)[:12]


def id_list(value: object) -> str:
    # Instance ids print as integers everywhere (this table, status JSON, replay, register).
    if isinstance(value, list):
        return ",".join(str(i) for i in value) if value else "-"
    return f"{value} ids"


def render_status_table(status: Mapping[str, Any]) -> str:
    """Render a status reply as a plain-text table, one row per group."""
    readiness = {(r["model"], r["namespace"]): r for r in status.get("readiness", [])}
    headers = ("group", "incumbent", "status", "gen", "admitted", "rejected", "readiness")
    rows: list[tuple[str, ...]] = []
    for group in status.get("groups", []):
        ready = readiness.get((group["model"], group["namespace"]))
        if ready is None:
            ready_text = "-"
        elif ready["ready"]:
            ready_text = "ready"
        else:
            ready_text = "missing " + ",".join(ready["missing"]) if ready["missing"] else "no"
        rejected = ", ".join(
            f"{brief(c['checksum'])} ({id_list(c['members'])})" for c in group["cohorts"][1:]
        )
        rows.append(
            (
                f"{group['model']} @ {group['namespace']}/{group['component']}/"
                f"{group['endpoint']} [{group['worker_type']}]",
                brief(group["incumbent"]),
                group["status"],
                "-" if group["generation"] is None else str(group["generation"]),
                id_list(group["admitted"]),
                rejected or "-",
                ready_text,
            )
        )
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.append(
        f"health: {status.get('health')}  groups: {len(rows)}  live instances: "
        f"{status.get('live_instances', 0)}  invalid records: {status.get('invalid_total', 0)}"
    )
    if status.get("frontend"):
        lines.append(f"frontend: {status['frontend']}")
    for rejection in status.get("rejections", []):
        differences = rejection.get("differences")
        said = (
            "unknown" if differences is None else summarize([Difference(**d) for d in differences])
        )
        lines.append(
            f"rejected {brief(rejection['rejected_checksum'])} in {rejection['model']} @ "
            f"{rejection['namespace']}/{rejection['component']}/{rejection['endpoint']}: "
            f"differs in: {said}"
        )
    for item in status.get("disagreements", []):
        served = tuple((checksum, tuple(f)) for checksum, f in item["incumbents"].items())
        said = Disagreement(item["worker_set"], served).in_words()
        lines.append(f"disagreement on {item['worker_set']}: {said}")
    for group in status.get("groups", []):
        drained = group.get("drained")
        if not isinstance(drained, list):
            continue  # a brief reply counts them only
        for worker in drained:
            by = f" by {worker['by']}" if worker.get("by") else ""
            lines.append(
                f"drained {worker['instance_id']} in {group['model']} @ {group['namespace']}/"
                f"{group['component']}/{group['endpoint']}{by} (out of routing; safe to stop "
                "once drain --wait says so)"
            )
    # One line per entry, whatever a worker's card or a drain names (a model, an author).
    return "\n".join(wire_text(line, TABLE_LINE_LIMIT) for line in lines)
