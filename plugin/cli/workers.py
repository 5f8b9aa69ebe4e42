"""The NATS-side subcommands: ``register`` and ``deregister`` a worker, ``record`` a trace.

``register`` publishes a model card (and the endpoint's liveness record) as a Dynamo worker
would, then keeps it alive with a heartbeat until interrupted, when it deregisters; with
``--once`` it writes and exits. ``record`` writes a replay trace from a live bucket: one
snapshot line holding every value's raw text, then ``put`` and ``delete`` lines as they happen.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import secrets
import sys
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from workerset_admission.aio import cancel_and_wait
from workerset_admission.cli import EXIT_FAILED, positive_seconds
from workerset_admission.errors import ConfigError, Unreachable, UsageError
from workerset_admission.identity import EndpointId, instance_key
from workerset_admission.ownership import register_writer
from workerset_admission.settings import Settings
from workerset_admission.traces.state_line import DecisionState

if TYPE_CHECKING:
    from workerset_admission.adapters.nats.connect import NatsConnectOptions

__all__ = ["STOPS_ON_SIGNAL", "arguments", "check_card", "main", "record_trace"]


def _instance_id(text: str) -> int:
    base = 16 if text.lower().startswith("0x") else 10
    try:
        value = int(text, base)
    except ValueError:
        raise argparse.ArgumentTypeError("an instance id is a decimal or 0x-hex integer") from None
    if not 0 <= value < 2**64:
        raise argparse.ArgumentTypeError("an instance id is an unsigned 64-bit integer")
    return value


def _add_worker_arguments(parser: argparse.ArgumentParser, *, id_required: bool) -> None:
    parser.add_argument("--namespace", required=True, help="worker namespace")
    parser.add_argument("--component", required=True, help="worker component")
    parser.add_argument("--endpoint", required=True, help="worker endpoint")
    parser.add_argument(
        "--instance-id",
        type=_instance_id,
        required=id_required,
        help="instance id (decimal or 0x-hex)" + ("" if id_required else "; default random"),
    )
    parser.add_argument("--suffix", help="LoRA adapter suffix (registers an adapter card)")


def _output(text: str) -> Path:
    """Check an output file's folder exists, before anything connects."""
    path = Path(text)
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"no such folder for the output file: {folder}")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{path} is a folder, not a file")
    return path


def arguments(name: str, parser: argparse.ArgumentParser) -> None:
    if name == "register":
        _add_worker_arguments(parser, id_required=False)
        parser.add_argument(
            "--card",
            type=Path,
            required=True,
            help="JSON file: a model deployment card, or a whole Model discovery record",
        )
        parser.add_argument(
            "--ttl",
            type=positive_seconds,
            default=10.0,
            help="seconds a registration lives without a heartbeat (default 10)",
        )
        parser.add_argument(
            "--heartbeat", type=positive_seconds, help="seconds between refreshes (default ttl/3)"
        )
        parser.add_argument(
            "--once",
            action="store_true",
            help="write the registration without a TTL and exit (no heartbeat, nothing watched)",
        )
        parser.add_argument(
            "--exit-on-loss",
            action="store_true",
            help="exit with status 4 when the registration is deleted while running, instead "
            "of registering it again",
        )
        parser.add_argument(
            "--no-endpoint-record",
            action="store_true",
            help="register only the model card, not the endpoint's liveness record",
        )
    elif name == "deregister":
        _add_worker_arguments(parser, id_required=True)
        parser.add_argument(
            "--endpoint-record",
            action="store_true",
            help="also delete the endpoint's liveness record",
        )
    elif name == "record":
        parser.add_argument(
            "--output", "-o", type=_output, help="trace file to write (default: standard output)"
        )
        parser.add_argument(
            "--json", action="store_true", help="end with a JSON summary on standard output"
        )
        parser.add_argument(
            "--duration",
            type=positive_seconds,
            help="record changes for this many seconds after the listing (default: until "
            "interrupted)",
        )
        parser.add_argument(
            "--frontend",
            default=None,
            help="start the trace with this live frontend's decision state, so replay and "
            "explain reproduce what it decided (default: the only live frontend)",
        )
    else:  # pragma: no cover - the dispatch table only routes the three names here
        raise ValueError(name)


def _options(settings: Settings, command: str) -> NatsConnectOptions:
    from workerset_admission.adapters.nats.connect import connect_options

    return connect_options(
        settings, _servers(settings), client_name=f"workerset-admission {command}"
    )


def _servers(settings: Settings) -> tuple[str, ...]:
    from workerset_admission.adapters.nats.connect import DEFAULT_SERVERS

    # A tool talks to an existing server; with none configured, the conventional local one.
    return settings.nats_servers or DEFAULT_SERVERS


def _read_card(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"card file {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"card file {path}: expected a JSON object")
    if data.get("type") == "Model" and isinstance(data.get("card_json"), dict):
        card: dict[str, Any] = data["card_json"]
        return card
    return data


def check_card(
    settings: Settings, endpoint: EndpointId, instance_id: int, card: Any, suffix: str | None
) -> None:
    """Refuse a card the service would refuse, for the same reason, before anything is written.

    The record is encoded as it will be published and judged by the service's own ingestion
    path, with the service's boundary settings (a namespace outside the filter included).
    """
    from workerset_admission.card import encode_model_record
    from workerset_admission.keys import model_kv_key
    from workerset_admission.service.factory import boundary_settings
    from workerset_admission.service.ingest import CardRecordDecoder

    key = model_kv_key(endpoint, instance_id, suffix)
    decoded = CardRecordDecoder(boundary_settings(settings)).decode(
        key, encode_model_record(endpoint, instance_id, card, suffix)
    )
    if decoded is None:
        raise ConfigError(
            f"namespace {endpoint.namespace!r} is outside the frontends' namespace filter: "
            "the service would ignore this registration"
        )


async def _register(args: argparse.Namespace, settings: Settings, stop: asyncio.Event) -> int:
    from workerset_admission.adapters.nats.buckets import BucketSpec
    from workerset_admission.adapters.nats.connect import ConnectionCallbacks, connect
    from workerset_admission.adapters.nats.publisher import DiscoveryPublisher

    card = _read_card(args.card)
    endpoint = EndpointId(args.namespace, args.component, args.endpoint)
    instance_id = args.instance_id if args.instance_id is not None else secrets.randbits(63)
    check_card(settings, endpoint, instance_id, card, args.suffix)
    publishers: list[DiscoveryPublisher] = []

    async def reconnected() -> None:
        # The server may have come back on an empty store: refresh (and heal) at once.
        for publisher in publishers:
            publisher.refresh_now()

    nc = await connect(_options(settings, "register"), ConnectionCallbacks(reconnected=reconnected))
    try:
        publisher = DiscoveryPublisher(
            nc.jetstream(),
            bucket=settings.discovery_bucket,
            bucket_spec=BucketSpec(
                name=settings.discovery_bucket, replicas=settings.bucket_replicas
            ),
            ttl=None if args.once else args.ttl,
            heartbeat=args.heartbeat,
            writer=register_writer(instance_key(endpoint, instance_id, args.suffix)),
            # A key deleted under a live worker comes back, unless asked to give up; a key
            # another writer took over is never fought for.
            on_removed="report" if args.exit_on_loss else "reregister",
        )
        publishers.append(publisher)
        key = await publisher.register(endpoint, instance_id, card, args.suffix)
        keys = [key]
        if not args.no_endpoint_record:
            keys.append(await publisher.register_endpoint(endpoint, instance_id))
        print(json.dumps({"registered": keys, "instance_id": instance_id}), flush=True)
        if args.once:
            return 0
        await _first(stop, publisher.lost_event)
        await publisher.close(withdraw=True)
        if publisher.lost:
            lost = ", ".join(f"{key} ({how})" for key, how in sorted(publisher.lost.items()))
            print(
                f"workerset-admission register: registration lost, exiting: {lost}",
                file=sys.stderr,
                flush=True,
            )
            return EXIT_FAILED
        print(json.dumps({"deregistered": keys}), flush=True)
        return 0
    finally:
        await nc.close()


async def _first(*events: asyncio.Event) -> None:
    """Wait until the first of ``events`` is set."""
    waits = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        await cancel_and_wait(waits)


async def _deregister(args: argparse.Namespace, settings: Settings, stop: asyncio.Event) -> int:
    del stop
    from workerset_admission.adapters.nats.connect import connect
    from workerset_admission.adapters.nats.publisher import DiscoveryPublisher

    endpoint = EndpointId(args.namespace, args.component, args.endpoint)
    nc = await connect(_options(settings, "deregister"))
    try:
        publisher = DiscoveryPublisher(
            nc.jetstream(), bucket=settings.discovery_bucket, create_bucket=False
        )
        keys = await publisher.deregister(
            endpoint, args.instance_id, args.suffix, endpoint_record=args.endpoint_record
        )
        print(json.dumps({"deregistered": keys}), flush=True)
        return 0
    finally:
        await nc.close()


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
    from workerset_admission.ports import SourceSnapshot
    from workerset_admission.traces.writer import TraceWriter

    source = JetStreamDiscoverySource(
        _options(settings, "record"), bucket=settings.discovery_bucket
    )
    stop = stop or asyncio.Event()
    listing_deadline = time.monotonic() + LISTING_TIMEOUT
    deadline = None
    writer = TraceWriter(out, observer="bucket")
    writer.begin(time.monotonic(), None if state is None else state.to_line())
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
            if isinstance(event, SourceSnapshot) and deadline is None and duration is not None:
                deadline = time.monotonic() + duration
            # ASCII escapes keep lone surrogates (invalid UTF-8 in a value) valid JSON text.
            writer.write_event(event, time.monotonic())
            writer.flush()
    finally:
        await source.close()
        await events.aclose()
        writer.flush()
    return writer.lines


async def _record(args: argparse.Namespace, settings: Settings, stop: asyncio.Event) -> int:
    from workerset_admission.adapters.nats.connect import probe_bucket

    options = _options(settings, "record")
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
    from workerset_admission.adapters.nats.frontend_state import decision_state_of, live_frontends

    options = _options(settings, "record")
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


# ``register`` and ``record`` run until a signal sets ``stop``, then finish cleanly.
STOPS_ON_SIGNAL = frozenset({"register", "record"})


async def main(name: str, args: argparse.Namespace, stop: asyncio.Event) -> int:
    handler = {"register": _register, "deregister": _deregister, "record": _record}[name]
    return await handler(args, args.settings, stop)
