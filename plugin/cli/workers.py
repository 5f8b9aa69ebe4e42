"""Worker registration: ``register`` and ``deregister`` a worker's records as a Dynamo worker would.

``register`` publishes a model card (and the endpoint's liveness record), then keeps it alive
with a heartbeat until interrupted, when it deregisters; with ``--once`` it writes and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from workerset_admission.aio import cancel_and_wait
from workerset_admission.cli import EXIT_FAILED, positive_seconds
from workerset_admission.cli.connection import client_options
from workerset_admission.cli.exits import transport_errors
from workerset_admission.errors import ConfigError, Unreachable, error_in_words
from workerset_admission.identity import EndpointId, instance_key, parse_instance_id
from workerset_admission.ownership import register_writer
from workerset_admission.settings import Settings

__all__ = ["DEFAULT_START_TIMEOUT", "arguments", "check_card", "main", "until_accepted"]

T = TypeVar("T")

DEFAULT_START_TIMEOUT = 30.0
"""Seconds ``register`` keeps trying its first write through an outage of the bucket's leader."""


async def until_accepted(
    write: Callable[[], Awaitable[T]],
    *,
    within: float,
    unavailable: Callable[[BaseException], bool],
    what: str,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
) -> T:
    """Await ``write()`` until it succeeds, retrying for ``within`` seconds what ``unavailable``.

    A stream electing a leader refuses writes for a few seconds (docs/operations.md, "What
    happens when a node dies"): the first write is tried again, waiting a quarter of a second
    and then longer, up to two; the first refusal is said once on standard error. Past the
    deadline the last refusal is raised as :class:`~workerset_admission.errors.Unreachable`.
    """
    deadline = clock() + within
    delay = 0.25
    told = False
    while True:
        try:
            return await write()
        except transport_errors() as error:
            if not unavailable(error):
                raise
            words = error_in_words(error)
            if clock() + delay > deadline:
                raise Unreachable(
                    f"{what}: the bucket did not accept it within {within:g} s ({words})"
                ) from None
            if not told:
                print(
                    f"workerset-admission register: {what}: not accepted yet ({words}); "
                    f"retrying for up to {within:g} s",
                    file=sys.stderr,
                    flush=True,
                )
                told = True
        await sleep(delay)
        delay = min(2.0, delay * 2)


def _instance_id(text: str) -> int:
    try:
        return parse_instance_id(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


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
        parser.add_argument(
            "--start-timeout",
            type=positive_seconds,
            default=DEFAULT_START_TIMEOUT,
            help="seconds to keep trying the first write while the bucket does not accept it "
            "(a cluster electing a leader refuses writes for a few seconds; default "
            f"{DEFAULT_START_TIMEOUT:g}); then exit 3",
        )
    elif name == "deregister":
        _add_worker_arguments(parser, id_required=True)
        parser.add_argument(
            "--endpoint-record",
            action="store_true",
            help="also delete the endpoint's liveness record",
        )
    else:  # pragma: no cover - the dispatch table only routes the two names here
        raise ValueError(name)


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
    from workerset_admission.card.entry import EntryDecoder
    from workerset_admission.keys import model_kv_key
    from workerset_admission.wiring.compose import boundary_settings

    key = model_kv_key(endpoint, instance_id, suffix)
    decoded = EntryDecoder(boundary_settings(settings)).decode(
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
    from workerset_admission.adapters.nats.errors import is_unavailable_for_now
    from workerset_admission.adapters.nats.registrar import WorkerRegistrar

    card = _read_card(args.card)
    endpoint = EndpointId(args.namespace, args.component, args.endpoint)
    instance_id = args.instance_id if args.instance_id is not None else secrets.randbits(63)
    check_card(settings, endpoint, instance_id, card, args.suffix)
    publishers: list[WorkerRegistrar] = []

    async def reconnected() -> None:
        # The server may have come back on an empty store: refresh (and heal) at once.
        for publisher in publishers:
            publisher.refresh_now()

    nc = await connect(
        client_options(settings, "register"), ConnectionCallbacks(reconnected=reconnected)
    )
    try:
        publisher = WorkerRegistrar(
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

        async def first_writes() -> list[str]:
            # Both again after a refusal: a card written before the endpoint was refused is
            # the same key and value written twice.
            keys = [await publisher.register(endpoint, instance_id, card, args.suffix)]
            if not args.no_endpoint_record:
                keys.append(await publisher.register_endpoint(endpoint, instance_id))
            return keys

        keys = await until_accepted(
            first_writes,
            within=args.start_timeout,
            unavailable=is_unavailable_for_now,
            what="the registration",
        )
        # The id as a string too: a 64-bit id loses digits as a number in jq 1.6 and JavaScript.
        said = {"registered": keys, "instance_id": instance_id, "instance_id_str": str(instance_id)}
        print(json.dumps(said), flush=True)
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
    from workerset_admission.adapters.nats.registrar import WorkerRegistrar

    endpoint = EndpointId(args.namespace, args.component, args.endpoint)
    nc = await connect(client_options(settings, "deregister"))
    try:
        publisher = WorkerRegistrar(
            nc.jetstream(), bucket=settings.discovery_bucket, create_bucket=False
        )
        keys = await publisher.deregister(
            endpoint, args.instance_id, args.suffix, endpoint_record=args.endpoint_record
        )
        print(json.dumps({"deregistered": keys}), flush=True)
        return 0
    finally:
        await nc.close()


async def main(name: str, args: argparse.Namespace, stop: asyncio.Event) -> int:
    handler = {"register": _register, "deregister": _deregister}[name]
    return await handler(args, args.settings, stop)
