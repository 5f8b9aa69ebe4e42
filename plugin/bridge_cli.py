"""``workerset-admission bridge``: feed Dynamo's discovery store (etcd or files) into the bucket."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from workerset_admission.errors import ConfigError

if TYPE_CHECKING:
    from workerset_admission.config import Settings

__all__ = ["STOPS_ON_SIGNAL", "arguments", "main"]


# The bridge runs until a signal sets ``stop``, then prints what it did.
STOPS_ON_SIGNAL = frozenset({"bridge"})


def arguments(name: str, parser: argparse.ArgumentParser) -> None:
    from workerset_admission.adapters.dynamo.filestore import DEFAULT_FILE_TTL, default_store_root

    parser.add_argument(
        "--file-kv",
        type=Path,
        default=None,
        help=f"Dynamo's file store root (default: $DYN_FILE_KV, now {default_store_root()})",
    )
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between passes")
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
        "--bridge-id",
        default=None,
        help="this bridge's writer identity, stamped on every record it writes; it prunes "
        "only keys with its own stamp (default: this host and the store path, or with --etcd "
        "the etcd endpoints)",
    )


async def main(name: str, args: argparse.Namespace, stop: asyncio.Event) -> int:
    from workerset_admission.adapters.dynamo.bridge import DiscoveryBridge, check_store_root
    from workerset_admission.adapters.dynamo.filestore import FileStoreReader, default_store_root
    from workerset_admission.adapters.nats.bucket_writer import JetStreamBucketWriter
    from workerset_admission.adapters.nats.buckets import BucketSpec, ensure_bucket
    from workerset_admission.adapters.nats.connect import connect
    from workerset_admission.ownership import bridge_writer

    settings = args.settings
    if settings.embedded:
        raise ConfigError(
            "the bridge writes the bucket the frontends read: give their NATS server "
            "(--nats-server or WORKERSET_ADMISSION_NATS_SERVERS)"
        )
    if settings.etcd_endpoints:
        if args.file_kv is not None:
            raise ConfigError("give either --file-kv or etcd endpoints, not both")
        return await _bridge_etcd(settings, args, stop)
    root: Path = args.file_kv or default_store_root()
    # Refused before connecting: a wrong path must not get as far as a prune.
    check_store_root(root)
    owner = bridge_writer(root, args.bridge_id)
    client = await connect(settings.nats_connect_options(client_name="workerset-bridge"))
    try:
        bucket = settings.discovery_bucket
        status = await ensure_bucket(client.jetstream(), BucketSpec(name=bucket))
        bridge = DiscoveryBridge(
            root,
            JetStreamBucketWriter(status.kv, owner=owner, js=client.jetstream(), bucket=bucket),
            interval=args.interval,
            ttl=args.ttl,
            prune=args.prune,
            scan=FileStoreReader(settings.max_value_bytes).scan,
        )
        if args.once:
            await bridge.sync_once()
        else:
            print(f"bridging {root} -> bucket {bucket}", file=sys.stderr, flush=True)
            await bridge.run(stop)
    finally:
        await client.close()
    print(json.dumps(asdict(bridge.stats), sort_keys=True))
    return 0


async def _bridge_etcd(settings: Settings, args: argparse.Namespace, stop: asyncio.Event) -> int:
    from workerset_admission.adapters.etcd.bridge import EtcdDiscoveryBridge
    from workerset_admission.adapters.nats.bucket_writer import JetStreamBucketWriter
    from workerset_admission.adapters.nats.buckets import BucketSpec, ensure_bucket
    from workerset_admission.adapters.nats.connect import connect
    from workerset_admission.ownership import etcd_bridge_writer

    options = settings.etcd_options()
    from workerset_admission.adapters.etcd.client import AetcdStoreReader

    # Stable across restarts, so a restarted bridge owns (and may prune) what it wrote before,
    # and never what a worker, a register process or another bridge wrote.
    owner = etcd_bridge_writer([str(endpoint) for endpoint in options.endpoints], args.bridge_id)
    reader = AetcdStoreReader(options)
    client = await connect(settings.nats_connect_options(client_name="workerset-bridge"))
    try:
        bucket = settings.discovery_bucket
        status = await ensure_bucket(client.jetstream(), BucketSpec(name=bucket))
        writer = JetStreamBucketWriter(status.kv, owner=owner, js=client.jetstream(), bucket=bucket)
        bridge = EtcdDiscoveryBridge(reader, writer, prune=args.prune)
        if args.once:
            # Only here does an unreadable etcd end the command; a running bridge retries.
            await bridge.resync()
        else:
            shown = ",".join(str(endpoint) for endpoint in options.endpoints)
            print(f"bridging etcd {shown} -> bucket {bucket}", file=sys.stderr, flush=True)
            await bridge.run(stop)
    finally:
        await reader.close()
        await client.close()
    print(json.dumps(asdict(bridge.stats), sort_keys=True))
    return 0
