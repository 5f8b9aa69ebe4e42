"""``workerset-admission bridge``: feed Dynamo's file discovery store into the NATS bucket."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from dataclasses import asdict
from pathlib import Path

__all__ = ["add_arguments", "run"]

_DEFAULT_BUCKET = "dynamo-discovery"


def add_arguments(name: str, parser: argparse.ArgumentParser) -> None:
    from workerset_admission.adapters.dynamo.filestore import DEFAULT_FILE_TTL, default_store_root

    parser.add_argument(
        "--file-kv",
        type=Path,
        default=None,
        help=f"Dynamo's file store root (default: $DYN_FILE_KV, now {default_store_root()})",
    )
    parser.add_argument(
        "--servers",
        default=os.environ.get("NATS_SERVER", "nats://127.0.0.1:4222"),
        help="comma-separated NATS URLs (default: $NATS_SERVER or nats://127.0.0.1:4222)",
    )
    parser.add_argument("--bucket", default=_DEFAULT_BUCKET, help="discovery bucket name")
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
        help="keep bucket keys the store does not hold at start (another writer shares it)",
    )
    parser.add_argument("--once", action="store_true", help="run one pass and exit")


async def _bridge(args: argparse.Namespace) -> int:
    from workerset_admission.adapters.dynamo.bridge import DiscoveryBridge, JetStreamBucketWriter
    from workerset_admission.adapters.dynamo.filestore import default_store_root
    from workerset_admission.adapters.nats.buckets import BucketSpec, ensure_bucket
    from workerset_admission.adapters.nats.connect import (
        NatsConnectOptions,
        connect,
        servers_from_text,
    )

    root: Path = args.file_kv or default_store_root()
    client = await connect(
        NatsConnectOptions(servers=servers_from_text(args.servers), name="workerset-bridge")
    )
    try:
        status = await ensure_bucket(client.jetstream(), BucketSpec(name=args.bucket))
        bridge = DiscoveryBridge(
            root,
            JetStreamBucketWriter(status.kv),
            interval=args.interval,
            ttl=args.ttl,
            prune=args.prune,
        )
        if args.once:
            await bridge.sync_once()
        else:
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            print(f"bridging {root} -> bucket {args.bucket}", file=sys.stderr, flush=True)
            await bridge.run(stop)
    finally:
        await client.close()
    print(json.dumps(asdict(bridge.stats), sort_keys=True))
    return 0


def run(name: str, args: argparse.Namespace) -> int:
    return asyncio.run(_bridge(args))
