"""``serve``, ``status`` and ``demo``: run the admission service, ask it, or watch it work.

``serve`` is the main job. Without a NATS server in the settings it starts an embedded
nats-server on loopback and says where it listens. ``status`` asks a running ``serve`` over NATS
request/reply and prints a table (or the JSON). ``demo`` plays a rolling update against an
embedded server, printing each admission decision as it is made.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from workerset_admission.card.differences import Difference, differences_of, summarize
from workerset_admission.cli import EXIT_FAILED, EXIT_OK, positive_seconds
from workerset_admission.errors import Unreachable, UsageError, WorkersetAdmissionError
from workerset_admission.settings import Settings

if TYPE_CHECKING:
    from workerset_admission.telemetry import TelemetryHandle

__all__ = [
    "SERVE_FILE_ENV",
    "STOPS_ON_SIGNAL",
    "arguments",
    "demo_card",
    "main",
    "play_demo",
    "render_status_table",
    "serve_file",
    "start_serve_telemetry",
]

# ``serve`` runs until a signal sets ``stop``; ``status`` and ``demo`` are simply cancelled.
STOPS_ON_SIGNAL = frozenset({"serve"})


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
    elif name == "demo":
        parser.add_argument(
            "--timeout",
            type=positive_seconds,
            default=60.0,
            help="seconds each step may take at most",
        )


async def main(name: str, args: argparse.Namespace, stop: asyncio.Event) -> int:
    if name == "serve":
        return await _serve(args.settings, args, stop)
    if name == "status":
        return await _status(args.settings, args)
    from workerset_admission.settings import load_settings

    # The demo brings its own embedded server: no settings from the environment apply.
    return await play_demo(load_settings(env={}), timeout=args.timeout, stream=sys.stdout)


# --------------------------------------------------------------------------- serve

SERVE_FILE_ENV = "WORKERSET_ADMISSION_SERVE_FILE"


def serve_file() -> Path:
    """Where a ``serve`` with an embedded server says where it listens, for ``status``."""
    override = os.environ.get(SERVE_FILE_ENV)
    if override:
        return Path(override)
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    return Path(base) / f"workerset-admission-{os.getuid()}.serve.json"


def _announce_local(url: str, subject: str) -> Callable[[], None]:
    path = serve_file()
    body = json.dumps({"url": url, "status_subject": subject, "pid": os.getpid()})
    try:
        path.write_text(body + "\n", encoding="utf-8")
    except OSError:
        return lambda: None

    def withdraw() -> None:
        # Only our own announcement: a newer serve may have replaced it meanwhile.
        with contextlib.suppress(OSError, ValueError):
            if json.loads(path.read_text(encoding="utf-8")).get("pid") == os.getpid():
                path.unlink()

    return withdraw


def _local_serve() -> dict[str, Any] | None:
    try:
        found = json.loads(serve_file().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) and isinstance(found.get("url"), str) else None


async def _serve(settings: Settings, args: argparse.Namespace, stop: asyncio.Event) -> int:
    from workerset_admission.telemetry import configure_logging

    configure_logging(args.log_format or settings.log_format, args.log_level)
    telemetry_handle = start_serve_telemetry(settings, otlp=args.telemetry or settings.telemetry)
    try:
        return await _serve_service(settings, args, telemetry_handle, stop)
    finally:
        if telemetry_handle is not None:
            telemetry_handle.shutdown()


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
        _say(f"Prometheus metrics on {handle.prometheus_url}")
    return handle


async def _serve_service(
    settings: Settings,
    args: argparse.Namespace,
    telemetry_handle: TelemetryHandle | None,
    stop: asyncio.Event,
) -> int:
    from workerset_admission.service.factory import create_service
    from workerset_admission.telemetry import AdmissionTelemetry

    telemetry = None
    if telemetry_handle is not None:
        telemetry = AdmissionTelemetry(
            tracer_provider=telemetry_handle.tracer_provider,
            meter_provider=telemetry_handle.meter_provider,
            bucket=settings.discovery_bucket,
        )
    async with contextlib.AsyncExitStack() as stack:
        view_files = None
        if settings.view_dir is not None:
            from workerset_admission.adapters.dynamo.view import DirectoryFiles

            # Checked and locked before anything starts: a bad directory costs no connection.
            view_files = DirectoryFiles.open(settings.view_dir)
            stack.callback(view_files.release)
        servers: Sequence[str] | None = None
        if settings.embedded:
            from workerset_admission.adapters.nats.embedded import EmbeddedNatsServer

            store = args.store_dir or settings.embedded_store_dir
            server = await EmbeddedNatsServer(store).astart()
            stack.push_async_callback(server.aclose)
            servers = (server.url,)
            _say(f"embedded nats-server listening on {server.url} (store {server.store_dir})")
            stack.callback(_announce_local(server.url, settings.status_subject))
        from workerset_admission.adapters.nats.connect import servers_for_display

        where = servers_for_display(servers or settings.nats_servers)
        service = await _with_progress(
            create_service(settings, servers=servers, telemetry=telemetry, view_files=view_files),
            f"connecting to NATS at {where}",
        )
        stack.push_async_callback(service.stop)
        stopper = asyncio.ensure_future(_stop_when(stop, service))
        stack.callback(stopper.cancel)
        _say(
            f"watching bucket {settings.discovery_bucket!r}; status on "
            f"{settings.status_subject!r}; publishing to {settings.admission_bucket!r}"
        )
        if settings.view_dir is not None:
            _say(f"writing the admitted discovery view to {settings.view_dir}")
        # A signal during the wait stops the service cleanly; run() then reports any failure.
        with contextlib.suppress(UsageError):
            await _with_progress(service.wait_synced(), "waiting for the first discovery snapshot")
        if service.synced:
            snap = service.snapshot()
            _say(f"synced: {len(snap.groups)} group(s), {snap.live_instances} live instance(s)")
            # This process is ours: what the initial sync built lives as long as the fleet, so
            # keep it out of full collections, whose pauses would otherwise grow with the fleet.
            gc.freeze()
        await service.run()
    return 0


async def _stop_when(stop: asyncio.Event, service: Any) -> None:
    await stop.wait()
    await service.stop()


async def _with_progress(awaitable: Awaitable[Any], what: str, every: float = 2.0) -> Any:
    """Await, printing a line every ``every`` seconds so a long wait never looks hung."""
    task = asyncio.ensure_future(awaitable)
    started = time.monotonic()
    try:
        while True:
            done, _pending = await asyncio.wait({task}, timeout=every)
            if done:
                return task.result()
            _say(f"{what}... ({time.monotonic() - started:.0f} s)")
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def _say(text: str, stream: TextIO | None = None) -> None:
    print(text, file=stream or sys.stdout, flush=True)


# --------------------------------------------------------------------------- status


async def _status(settings: Settings, args: argparse.Namespace) -> int:
    from workerset_admission.adapters.nats.connect import connect
    from workerset_admission.adapters.nats.errors import NatsTimeoutError, NoRespondersError

    subject = args.subject or settings.status_subject
    servers: Sequence[str] | None = None
    if settings.embedded:
        # No server configured: ask the local serve that runs an embedded one, if any.
        local = _local_serve()
        if local is None:
            raise Unreachable(
                "no NATS server given (--nats-server or settings) and no local serve "
                f"announced in {serve_file()}"
            )
        servers = (local["url"],)
        subject = args.subject or str(local.get("status_subject") or subject)
    from workerset_admission.adapters.nats.connect import connect_options

    options = connect_options(settings, servers, client_name="workerset-admission status")
    try:
        nc = await asyncio.wait_for(connect(options), args.timeout)
    except asyncio.TimeoutError:
        raise Unreachable(f"no NATS server answered within {args.timeout:g} s") from None
    try:
        reply = await nc.request(subject, b"", timeout=args.timeout)
    except (NoRespondersError, NatsTimeoutError):
        raise Unreachable(f"no admission service answers on {subject!r}") from None
    finally:
        await nc.close()
    status = json.loads(reply.data)
    if args.json:
        print(json.dumps(status, indent=2, sort_keys=True))
    else:
        print(render_status_table(status))
    return 0


def _short(checksum: object) -> str:
    return "-" if checksum is None else str(checksum)[:12]


def _ids(value: object) -> str:
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
            f"{_short(c['checksum'])} ({_ids(c['members'])})" for c in group["cohorts"][1:]
        )
        rows.append(
            (
                f"{group['model']} @ {group['namespace']}/{group['component']}/"
                f"{group['endpoint']} [{group['worker_type']}]",
                _short(group["incumbent"]),
                group["status"],
                "-" if group["generation"] is None else str(group["generation"]),
                _ids(group["admitted"]),
                rejected or "-",
                ready_text,
            )
        )
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
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
            f"rejected {_short(rejection['rejected_checksum'])} in {rejection['model']} @ "
            f"{rejection['namespace']}/{rejection['component']}/{rejection['endpoint']}: "
            f"differs in: {said}"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------- demo


def demo_card(block_size: int = 16) -> dict[str, Any]:
    """Return a small Dynamo 1.6.1 card; the block size tells configurations apart."""
    return {
        "display_name": "Qwen/Qwen3-0.6B",
        "slug": "qwen_qwen3-0_6b",
        "source_path": "Qwen/Qwen3-0.6B",
        "model_info": None,
        "tokenizer": None,
        "context_length": 4096,
        "kv_cache_block_size": block_size,
        "migration_limit": 0,
        "model_type": "Chat | Completions",
        "model_input": "Tokens",
        "worker_type": "aggregated",
        "needs": [],
    }


class _DecisionPrinter:
    """Prints each admission effect as one line, as it happens."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def __call__(self, effects: Sequence[object]) -> None:
        for effect in effects:
            line = self._line(effect)
            if line:
                _say(f"  -> {line}", self._stream)

    @staticmethod
    def _line(effect: Any) -> str | None:
        kind = type(effect).__name__
        if kind == "WorkerPlaced":
            verdict = "admitted" if effect.admitted else "NOT admitted (rejected cohort)"
            return f"{effect.key} joins cohort {_short(effect.mdc_checksum)}: {verdict}"
        if kind == "WorkerDeparted":
            return f"{effect.key} left cohort {_short(effect.mdc_checksum)}"
        if kind == "OpenReceiver":
            return (
                f"receiver #{effect.receiver} opened for incumbent "
                f"{_short(effect.mdc_checksum)} (generation {effect.generation})"
            )
        if kind == "StartBuild":
            return f"building the pipeline, generation {effect.generation}"
        if kind == "CommitGroup":
            return (
                f"committed generation {effect.generation}: serving {_ids(sorted(effect.admitted))}"
            )
        if kind == "PublishAdmissions":
            return f"receiver #{effect.receiver} admits {_ids(sorted(effect.admitted))}"
        if kind == "RejectionReported":
            differences = differences_of(effect.incumbent_card, effect.rejected_card)
            return (
                f"REJECTED cohort {_short(effect.rejected_checksum)} "
                f"(incumbent {_short(effect.incumbent_checksum)}), e.g. {effect.instance}"
                + (f"; differs in: {summarize(differences)}" if differences else "")
            )
        if kind == "WithdrawGroup":
            return f"withdrew committed generation {effect.generation}"
        if kind == "RetireReceiver":
            return f"receiver #{effect.receiver} retired"
        if kind == "Succession":
            if effect.new_checksum is None:
                return "the incumbent drained and no cohort is left"
            return (
                f"succession: {_short(effect.old_checksum)} -> {_short(effect.new_checksum)}, "
                f"generation {effect.new_generation}"
            )
        return None


async def play_demo(settings: Settings, *, timeout: float, stream: TextIO) -> int:
    """Play the rolling-update demo against an embedded server; return the exit status."""
    from workerset_admission.adapters.nats.connect import NatsConnectOptions, connect
    from workerset_admission.adapters.nats.embedded import EmbeddedNatsServer
    from workerset_admission.adapters.nats.publisher import DiscoveryPublisher
    from workerset_admission.errors import ReceiverRetired
    from workerset_admission.identity import EndpointId
    from workerset_admission.service.factory import create_service
    from workerset_admission.telemetry import configure_logging

    configure_logging("plain", "ERROR", stream=stream)
    endpoint = EndpointId("dgd", "backend", "generate")
    old, new = demo_card(16), demo_card(32)

    async def wait(condition: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + timeout
        next_note = time.monotonic() + 2.0
        while not condition():
            if time.monotonic() > deadline:
                raise WorkersetAdmissionError(f"timed out waiting until {what}")
            if time.monotonic() > next_note:
                _say(f"  ... still waiting until {what}", stream)
                next_note = time.monotonic() + 2.0
            await asyncio.sleep(0.02)

    async with contextlib.AsyncExitStack() as stack:
        server = await EmbeddedNatsServer().astart()
        stack.push_async_callback(server.aclose)
        _say(f"embedded nats-server on {server.url}", stream)
        demo_settings = settings.model_copy(
            update={"nats_servers": (server.url,), "frontend_id": "demo-frontend"}
        )
        service = await create_service(demo_settings)
        stack.push_async_callback(service.stop)
        service.on_effects(_DecisionPrinter(stream))
        nc = await connect(NatsConnectOptions(servers=(server.url,)))
        stack.push_async_callback(nc.close)
        workers = DiscoveryPublisher(nc.jetstream(), bucket=settings.discovery_bucket, ttl=None)
        await _with_progress(service.wait_synced(), "waiting for the first snapshot")

        def group() -> Any:
            groups = service.snapshot().groups
            return groups[0] if groups else None

        _say("\n== 1. the v1 workers register (kv_cache_block_size 16)", stream)
        for instance_id in (0x1A, 0x2B):
            await workers.register_endpoint(endpoint, instance_id)
            await workers.register(endpoint, instance_id, old)
        await wait(
            lambda: (
                (g := group()) is not None and g.status == "ready" and g.admitted == (0x1A, 0x2B)
            ),
            "v1 is served",
        )
        g1 = group()
        v1_receiver = service.receiver_for(g1.group)
        assert v1_receiver is not None
        _say(f"   serving {_ids(list(g1.admitted))} with generation {g1.generation}", stream)

        _say("\n== 2. v2 workers arrive with a different configuration (block size 32)", stream)
        for instance_id in (0x3C, 0x4D):
            await workers.register_endpoint(endpoint, instance_id)
            await workers.register(endpoint, instance_id, new)
        await wait(
            lambda: len(group().cohorts) == 2 and group().cohorts[1].members == (0x3C, 0x4D),
            "the v2 cohort is tracked",
        )
        _say(
            f"   still serving {_ids(list(group().admitted))}: the incumbent keeps the set", stream
        )

        _say("\n== 3. the v1 workers drain", stream)
        for instance_id in (0x1A, 0x2B):
            await workers.deregister(endpoint, instance_id, endpoint_record=True)
        await wait(
            lambda: (
                group().status == "ready"
                and group().admitted == (0x3C, 0x4D)
                and service.snapshot().live_instances == 2
            ),
            "v2 is served",
        )
        g2 = group()
        _say(f"   serving {_ids(list(g2.admitted))} with generation {g2.generation}", stream)
        try:
            v1_receiver.current()
            retired = False
        except ReceiverRetired:
            retired = True
        _say(f"   the v1 receiver is retired: {retired}; it never shows v2 ids", stream)
        _say("\n== final status", stream)
        _say(render_status_table(service.snapshot().to_json()), stream)
        ok = retired and g2.generation is not None and g2.generation > (g1.generation or 0)
    _say("\ndemo complete" if ok else "\ndemo finished with unexpected state", stream)
    return EXIT_OK if ok else EXIT_FAILED
