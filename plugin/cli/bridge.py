"""``workerset-admission bridge``: feed Dynamo's discovery store (etcd or files) into the bucket.

A supervisor watches it the way it watches ``serve`` (:mod:`workerset_admission.cli.supervision`):

* under systemd (``Type=notify`` with ``WatchdogSec=``), ``READY=1`` once it runs and
  ``WATCHDOG=1`` at every beat of its event loop while its source loop (the passes over the
  file store, or etcd's listing, watch and probes) has beaten within its stall limit;
* ``--health-port``: ``GET /livez`` answers 503 when the event loop or the source loop stands
  still (a restart cures that); ``GET /readyz`` answers 200 once the bucket held the whole
  source and while its lag stays below ``--max-lag`` (an unreadable store or a bucket that
  refuses writes: a restart does not cure that, so it is readiness, not liveness);
* ``--prometheus-port``: the lag and its companions as gauges
  (:mod:`workerset_admission.telemetry.bridge_metrics`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING

from workerset_admission.aio import cancel_and_wait, owned_task
from workerset_admission.errors import ConfigError

if TYPE_CHECKING:
    from workerset_admission.adapters.bridge_progress import BridgeProgress
    from workerset_admission.adapters.nats.bucket_writer import JetStreamBucketWriter
    from workerset_admission.ownership import WriterId
    from workerset_admission.settings import Settings

__all__ = ["DEFAULT_MAX_LAG", "arguments", "main", "source_stall_limit"]

_log = logging.getLogger(__name__)

DEFAULT_MAX_LAG = 30.0
"""Seconds the bucket may be behind its source before the bridge says it is not ready."""


def source_stall_limit(beat_interval: float) -> float:
    """Seconds without a beat of the source loop after which the bridge counts as stuck.

    Never below the event loop's own limit, and four of the longest waits the loop makes
    while it works (a file pass's interval; etcd's probe interval or longest backoff).
    """
    from workerset_admission.service.loop_watch import STALLED_AFTER

    return max(STALLED_AFTER, 4 * beat_interval)


def arguments(name: str, parser: argparse.ArgumentParser) -> None:
    from workerset_admission.adapters.dynamo.filestore import DEFAULT_FILE_TTL, default_store_root
    from workerset_admission.cli import positive_seconds

    parser.add_argument(
        "--file-kv",
        type=Path,
        default=None,
        help=f"Dynamo's file store root (default: $DYN_FILE_KV, now {default_store_root()})",
    )
    parser.add_argument(
        "--interval",
        type=float,
        default=0.5,
        help="seconds between passes when nothing changed (a change in the store starts one at "
        "once, through inotify)",
    )
    parser.add_argument(
        "--no-notify",
        dest="notify",
        action="store_false",
        help="do not watch the file store with inotify: only poll it every --interval",
    )
    parser.add_argument(
        "--heal-interval",
        type=positive_seconds,
        default=5.0,
        help="seconds between readings of the bucket's whole contents, after which every "
        "record the bucket lost is written again (a lost or re-created bucket is noticed "
        "within a second, or at once after a reconnect)",
    )
    parser.add_argument(
        "--ttl",
        type=float,
        default=DEFAULT_FILE_TTL,
        help="a record not refreshed for this many seconds is expired (Dynamo's file TTL)",
    )
    parser.add_argument(
        "--no-prune",
        dest="prune",
        action="store_false",
        help="never delete keys at start, not even ones this bridge wrote earlier",
    )
    parser.add_argument("--once", action="store_true", help="run one pass and exit")
    parser.add_argument(
        "--max-lag",
        type=positive_seconds,
        default=DEFAULT_MAX_LAG,
        help="/readyz answers 503 once the bucket has been behind the store this many seconds "
        f"(default {DEFAULT_MAX_LAG:g})",
    )
    parser.add_argument(
        "--bridge-id",
        default=None,
        help="this bridge's writer identity, stamped on every record it writes; it prunes "
        "only keys with its own stamp (default: this host and the store path, or with --etcd "
        "the etcd endpoints)",
    )


async def main(name: str, args: argparse.Namespace, stop: asyncio.Event) -> int:
    from workerset_admission.adapters.bridge_progress import BridgeProgress
    from workerset_admission.adapters.dynamo.bridge import DiscoveryBridge, check_store_root
    from workerset_admission.adapters.dynamo.filestore import FileStoreReader, default_store_root
    from workerset_admission.ownership import bridge_writer

    settings = args.settings
    if settings.etcd_endpoints:
        if args.file_kv is not None:
            raise ConfigError("give either --file-kv or etcd endpoints, not both")
        return await _bridge_etcd(settings, args, stop)
    root = _store_root(args.file_kv, default_store_root())
    # Refused before connecting: a wrong path must not get as far as a prune.
    check_store_root(root)
    owner = bridge_writer(root, args.bridge_id)
    progress = BridgeProgress()
    async with contextlib.AsyncExitStack() as stack:
        supervise(settings, stack, progress, args.max_lag, source_stall_limit(args.interval))
        writer, woken = await stack.enter_async_context(_bucket_writer(settings, owner))
        bridge = DiscoveryBridge(
            root,
            writer,
            interval=args.interval,
            ttl=args.ttl,
            prune=args.prune,
            notify=args.notify,
            reconcile_interval=args.heal_interval,
            # The reader itself, not its scan: its memory of the last scan is what deletes a
            # record inotify saw removed at once, before the pass that confirms it.
            reader=FileStoreReader(settings.max_value_bytes),
            progress=progress,
        )
        woken.append(bridge.wake)
        if args.once:
            await bridge.sync_once()
        else:
            bucket = settings.discovery_bucket
            print(f"bridging {root} -> bucket {bucket}", file=sys.stderr, flush=True)
            await bridge.run(stop)
    print(json.dumps(asdict(bridge.stats), sort_keys=True))
    return 0


def _store_root(given: Path | None, default: Path) -> Path:
    """Return the file store to mirror; an unnamed one must exist where Dynamo keeps it."""
    if given is not None:
        return given
    if not os.environ.get("DYN_FILE_KV") and not default.is_dir():
        # The user named no store, and Dynamo's own default place holds none either: naming
        # that place in an error would point at a path the user never typed.
        raise ConfigError(
            "no discovery store given: --file-kv DIR (the workers' DYN_FILE_KV) for Dynamo's "
            "file store, or --etcd ENDPOINTS for etcd"
        )
    return default


def supervise(
    settings: Settings,
    stack: contextlib.AsyncExitStack,
    progress: BridgeProgress,
    max_lag: float,
    stalled_after: float,
) -> tuple[str | None, str | None]:
    """Beat on this loop for supervisors, and show the bridge's progress (module docstring).

    Return where its health endpoints and its metrics are served (None: not asked for).
    """
    from workerset_admission.cli.serve import say
    from workerset_admission.cli.supervision import HealthServer, SystemdNotifier
    from workerset_admission.service.loop_watch import LoopWatch

    def source_turning() -> bool:
        return progress.silent_for() < stalled_after

    def liveness() -> tuple[bool, dict[str, object]]:
        turning = source_turning()
        silent = round(progress.silent_for(), 3)
        state = "turning" if turning else "stalled"
        return turning, {"source_loop": state, "source_silent_for": silent}

    def readiness() -> tuple[bool, dict[str, object]]:
        figures = progress.as_json()
        return progress.synced and progress.lag() < max_lag, figures

    watch = LoopWatch()
    beating = owned_task(watch.run(), name="the bridge's loop beat", log=_log)
    stack.push_async_callback(cancel_and_wait, [beating])
    notifier = SystemdNotifier()
    notifier.follow(watch, healthy=source_turning)
    stack.callback(notifier.close)
    health_url = metrics_url = None
    if settings.health_port is not None:
        health = HealthServer(
            watch,
            lambda: progress.synced,
            settings.health_host,
            settings.health_port,
            liveness=liveness,
            readiness=readiness,
        )
        health.start()
        stack.callback(health.close)
        health_url = health.url
        say(f"liveness on {health.url}/livez, readiness on {health.url}/readyz", sys.stderr)
    if settings.prometheus_address is not None:
        from workerset_admission.telemetry import setup_telemetry
        from workerset_admission.telemetry.bridge_metrics import observe_bridge

        # Scraped only: the bridge pushes nothing anywhere.
        handle = setup_telemetry(
            "workerset-admission-bridge",
            prometheus=settings.prometheus_address,
            otlp=False,
            set_global=False,
            log_correlation=False,
        )
        stack.callback(handle.shutdown)
        if handle.meter_provider is not None:
            observe_bridge(handle.meter_provider, progress)
        metrics_url = handle.prometheus_url
        if metrics_url is not None:
            say(f"Prometheus metrics on {metrics_url}", sys.stderr)
    return health_url, metrics_url


@contextlib.asynccontextmanager
async def _bucket_writer(
    settings: Settings, owner: WriterId
) -> AsyncIterator[tuple[JetStreamBucketWriter, list[Callable[[], None]]]]:
    """Connect, bind the bucket (created as configured) and yield its writer.

    Each callable the caller adds to the yielded list runs after every reconnect, once the
    writer has counted it: a bridge then checks at once whether the bucket is still the one it
    wrote to.
    """
    from workerset_admission.adapters.nats.bucket_writer import JetStreamBucketWriter
    from workerset_admission.adapters.nats.buckets import BucketSpec, ensure_bucket
    from workerset_admission.adapters.nats.connect import ConnectionCallbacks, connect

    woken: list[Callable[[], None]] = []
    writers: list[JetStreamBucketWriter] = []

    async def reconnected() -> None:
        for writer in writers:
            writer.note_reconnect()
        for wake in woken:
            wake()

    # A bridge is what refills a bucket a restarted server lost, so it retries at least every
    # second: it is back (and writing) before the frontends' longer backoff lets them re-read
    # the bucket. One process per store, so the extra attempts cost the server little.
    from workerset_admission.adapters.nats.connect import connect_options
    from workerset_admission.cli.connection import servers

    configured = connect_options(settings, servers(settings), client_name="workerset-bridge")
    options = replace(configured, max_reconnect_wait=min(1.0, configured.max_reconnect_wait))
    client = await connect(options, ConnectionCallbacks(reconnected=reconnected))
    try:
        bucket = settings.discovery_bucket
        spec = BucketSpec(name=bucket, replicas=settings.bucket_replicas)
        status = await ensure_bucket(client.jetstream(), spec)
        writers.append(
            JetStreamBucketWriter(status.kv, owner=owner, client=client, bucket=bucket, spec=spec)
        )
        yield writers[0], woken
    finally:
        await client.close()


async def _bridge_etcd(settings: Settings, args: argparse.Namespace, stop: asyncio.Event) -> int:
    try:
        from workerset_admission.adapters.etcd.bridge import EtcdDiscoveryBridge
        from workerset_admission.adapters.etcd.client import AetcdStoreReader, etcd_options
    except ModuleNotFoundError as missing:
        # The etcd client is an extra: say how to get it instead of a traceback.
        raise ConfigError(
            f"--etcd needs the etcd extra ({missing.name} is not installed): pip install "
            "'.[etcd]' in a checkout"
        ) from None
    from workerset_admission.adapters.bridge_progress import BridgeProgress
    from workerset_admission.ownership import etcd_bridge_writer

    options = etcd_options(settings)
    # Stable across restarts, so a restarted bridge owns (and may prune) what it wrote before,
    # and never what a worker, a register process or another bridge wrote.
    owner = etcd_bridge_writer([str(endpoint) for endpoint in options.endpoints], args.bridge_id)
    reader = AetcdStoreReader(options)
    progress = BridgeProgress()
    try:
        async with contextlib.AsyncExitStack() as stack:
            writer, woken = await stack.enter_async_context(_bucket_writer(settings, owner))
            bridge = EtcdDiscoveryBridge(
                reader,
                writer,
                prune=args.prune,
                reconcile_interval=args.heal_interval,
                progress=progress,
            )
            limit = source_stall_limit(bridge.beat_interval)
            supervise(settings, stack, progress, args.max_lag, limit)
            woken.append(bridge.wake)
            if args.once:
                # Only here does an unreadable etcd end the command; a running bridge retries.
                await bridge.resync()
            else:
                shown = ",".join(str(endpoint) for endpoint in options.endpoints)
                bucket = settings.discovery_bucket
                print(f"bridging etcd {shown} -> bucket {bucket}", file=sys.stderr, flush=True)
                await bridge.run(stop)
    finally:
        await reader.close()
    print(json.dumps(asdict(bridge.stats), sort_keys=True))
    return 0
