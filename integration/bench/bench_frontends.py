"""100 frontends against one nats-server, simulated: what they cost it at rest and per change.

A plain script: ``python integration/bench/bench_frontends.py [--frontends 100]
[--sizes 2000,20000] [--watch-sizes 2000] [--rest 30] [--changes 10] [--polls 5] [--legacy]
[--out results/bench_frontends.json]``.

This machine cannot run 100 ``serve`` processes, so the frontends' NATS side runs in this one
process, each frontend with its own connection and the package's own code: a
:class:`NatsAdmissionPublisher` per frontend publishing its capability and one serving record
per worker namespace (every frontend serves the whole fleet, namespaces of 100 workers, one
WorkerSet each, as ``bench_fleet`` registers them), and at the sizes in ``--watch-sizes`` a
:class:`JetStreamDiscoverySource` per frontend watching the discovery bucket. What the
admission core and the view do with an event is not simulated (``bench_fleet`` measures one
frontend's whole cost); what nats-server receives and sends is exactly what 100 frontends
would make it receive and send.

For each fleet size it measures, from nats-server's own monitoring (``/connz``, the frontends'
connections, and ``/varz``):

* ``rest``: messages and bytes per second into and out of nats-server over ``--rest`` seconds
  with nothing changing;
* ``change``: one worker joins a namespace (its card and endpoint record put) and every
  frontend publishes that namespace's record again: the messages and bytes the change cost,
  from the put until every publisher has flushed (and every watch has the put);
* ``gate`` and ``drain``: one ``rollout`` gate look (``check_gate``: read the admission bucket,
  parse, judge liveness, evaluate), as its first look (the whole bucket) and as a later one
  (only the liveness records and the namespace's: subject filters), and one ``drain --wait`` look
  (the filtered read, parse, ``check_drained``) against the 100 frontends' records, ``--polls``
  times each.

``--legacy`` also runs each size on an admission bucket made with a max age (what an older
version made, and what a server without per-key TTLs gets): every record rewritten every 20 s
and read back every 2 s, the cost before liveness was kept apart from content.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import socket
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import nats
from nats.js.api import KeyValueConfig
from workerset_admission.adapters.nats.admission_publisher import NatsAdmissionPublisher
from workerset_admission.adapters.nats.admission_reader import NatsRecordSource
from workerset_admission.adapters.nats.buckets import BucketSpec, ensure_bucket
from workerset_admission.adapters.nats.connect import NatsConnectOptions
from workerset_admission.adapters.nats.embedded import EmbeddedNatsServer
from workerset_admission.adapters.nats.source import JetStreamDiscoverySource
from workerset_admission.card import (
    encode_endpoint_record,
    encode_model_record,
    endpoint_kv_key,
    model_kv_key,
)
from workerset_admission.card.serving_record import live_records, parse_record
from workerset_admission.cli.rollout import GateQuery, check_gate
from workerset_admission.identity import EndpointId
from workerset_admission.keys import ADMISSION_BUCKET, DISCOVERY_BUCKET
from workerset_admission.ports import SourceListing, SourcePut
from workerset_admission.rollout.drain import Worker, check_drained
from workerset_admission.rollout.frontends import record_filters

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent))

from support.fleet import MODEL, card  # noqa: E402 - integration/ is on the path from here on

RESULTS = HERE / "results"
PER_NAMESPACE = 100
CARD_JSON = json.dumps(card(16))
NAME = "workerset-admission sim"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def endpoint_of(index: int) -> EndpointId:
    return EndpointId(f"ns-{index // PER_NAMESPACE}", "backend", "generate")


def member(index: int) -> str:
    endpoint = endpoint_of(index)
    return f"{endpoint.namespace}/backend/generate/{index + 1:x}"


def monitoring(port: int, page: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/{page}", timeout=30) as response:
        data: dict[str, Any] = json.loads(response.read())
    return data


def counters(port: int) -> dict[str, int]:
    """The frontends' connections' counters (by name), and the server's totals."""
    totals = dict.fromkeys(("in_msgs", "in_bytes", "out_msgs", "out_bytes"), 0)
    for conn in monitoring(port, "connz?limit=4096")["connections"]:
        if str(conn.get("name") or "").startswith(NAME):
            for field in list(totals):
                totals[field] += int(conn[field])
    server = monitoring(port, "varz")
    for field in ("in_msgs", "in_bytes", "out_msgs", "out_bytes"):
        totals[f"server_{field}"] = int(server[field])
    return totals


def rates(before: dict[str, int], after: dict[str, int], seconds: float) -> dict[str, float]:
    return {k: round((after[k] - before[k]) / seconds, 1) for k in before}


def deltas(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in before}


async def every_watch_has(seen: Sequence[dict[str, float]], key: str) -> None:
    deadline = time.monotonic() + 60
    while not all(key in s for s in seen):
        if time.monotonic() > deadline:
            raise TimeoutError(f"not every watch received {key}")
        await asyncio.sleep(0.005)


def groups_for(namespace: str, members: Sequence[str]) -> list[dict[str, Any]]:
    worker_set = json.dumps([namespace, "backend", "generate", "chat|completions", "aggregated"])
    return [
        {
            "model": MODEL,
            "worker_set": worker_set,
            "checksum": "c" * 64,
            "generation": 1,
            "members": list(members),
        }
    ]


async def publish_fleet(
    publishers: Sequence[NatsAdmissionPublisher], served: dict[str, list[str]]
) -> None:
    for publisher in publishers:
        await publisher.publish_capability()
        for namespace, members in served.items():
            await publisher.publish_members(
                namespace, members, groups=groups_for(namespace, members)
            )
    await asyncio.gather(*(p.flushed() for p in publishers))


async def run_size(
    workers: int, frontends: int, watch: bool, rest: float, changes: int, polls: int, legacy: bool
) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="bench-frontends-"))
    monitor = free_port()
    server = EmbeddedNatsServer(store_dir=root / "js", extra_args=("--http_port", str(monitor)))
    server.start()
    clients: list[Any] = []
    publishers: list[NatsAdmissionPublisher] = []
    sources: list[JetStreamDiscoverySource] = []
    readers: list[asyncio.Task[None]] = []
    try:
        control = await nats.connect(server.url, name="bench")
        js = control.jetstream(timeout=60)
        kv = await js.create_key_value(KeyValueConfig(bucket=DISCOVERY_BUCKET, history=1))
        window = []
        for index in range(workers):
            endpoint = endpoint_of(index)
            window.append(
                kv.put(
                    endpoint_kv_key(endpoint, index + 1),
                    encode_endpoint_record(endpoint, index + 1),
                )
            )
            window.append(
                kv.put(
                    model_kv_key(endpoint, index + 1),
                    encode_model_record(endpoint, index + 1, CARD_JSON),
                )
            )
            if len(window) >= 512:
                await asyncio.gather(*window)
                window = []
        await asyncio.gather(*window)
        if legacy:
            # An admission bucket as an older version made it: a max age, no per-key TTLs.
            await ensure_bucket(
                js, BucketSpec(name=ADMISSION_BUCKET, limit_marker_ttl=None, max_age=60.0)
            )
        served: dict[str, list[str]] = {}
        for index in range(workers):
            served.setdefault(endpoint_of(index).namespace, []).append(member(index))

        for n in range(frontends):
            nc = await nats.connect(server.url, name=f"{NAME} fe-{n}")
            clients.append(nc)
            publishers.append(NatsAdmissionPublisher(nc.jetstream(timeout=60), f"fe-{n}"))
        started = time.monotonic()
        await publish_fleet(publishers, served)
        published_s = time.monotonic() - started

        seen: list[dict[str, float]] = [{} for _ in range(frontends)]
        if watch:
            synced = [asyncio.Event() for _ in range(frontends)]

            async def follow(n: int, source: JetStreamDiscoverySource) -> None:
                async for event in source.events():
                    if isinstance(event, SourceListing):
                        synced[n].set()
                    elif isinstance(event, SourcePut):
                        seen[n][event.entry.key] = time.monotonic()

            for n in range(frontends):
                options = NatsConnectOptions(servers=(server.url,), name=f"{NAME} w-{n}")
                source = JetStreamDiscoverySource(options, bucket=DISCOVERY_BUCKET)
                sources.append(source)
                readers.append(asyncio.ensure_future(follow(n, source)))
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in synced)), 1800)
        synced_s = time.monotonic() - started

        await asyncio.sleep(5.0)  # let the first heartbeats and audits settle
        before, t0 = counters(monitor), time.monotonic()
        await asyncio.sleep(rest)
        after, t1 = counters(monitor), time.monotonic()
        at_rest = rates(before, after, t1 - t0)

        per_change: list[dict[str, int]] = []
        change_ms: list[float] = []
        for k in range(changes):
            index = workers + k
            endpoint = endpoint_of((k * PER_NAMESPACE) % workers)
            namespace = endpoint.namespace
            joined = f"{namespace}/backend/generate/{index + 1:x}"
            before = counters(monitor)
            put_at = time.monotonic()
            key = model_kv_key(endpoint, index + 1)
            await kv.put(
                endpoint_kv_key(endpoint, index + 1), encode_endpoint_record(endpoint, index + 1)
            )
            await kv.put(key, encode_model_record(endpoint, index + 1, CARD_JSON))
            served[namespace].append(joined)
            members = served[namespace]
            for publisher in publishers:
                await publisher.publish_members(
                    namespace, members, groups=groups_for(namespace, members)
                )
            await asyncio.gather(*(p.flushed() for p in publishers))
            if watch:
                await every_watch_has(seen, key)
            change_ms.append((time.monotonic() - put_at) * 1000)
            await asyncio.sleep(0.3)  # the watches' flow control and acks land
            per_change.append(deltas(before, counters(monitor)))

        options = NatsConnectOptions(servers=(server.url,), name="bench gate")
        gate_ms, gate_later_ms, drain_ms = [], [], []
        query = GateQuery(model=MODEL, namespace="ns-0")
        drained = [Worker("ns-0", 1)]
        # What a look that names its namespace reads (``rollout --wait`` after its first look,
        # every look of ``drain --wait``): the liveness records and that namespace's records.
        filters = record_filters(["ns-0"])
        for _ in range(polls):
            asked = time.perf_counter()
            check = await check_gate(NatsRecordSource(options, ADMISSION_BUCKET), query)
            gate_ms.append((time.perf_counter() - asked) * 1000)
            assert check.report is not None
            assert len(check.report.live) == frontends
            asked = time.perf_counter()
            source = NatsRecordSource(options, ADMISSION_BUCKET)
            check = await check_gate(source, query, filters=filters)
            gate_later_ms.append((time.perf_counter() - asked) * 1000)
            assert check.report is not None
            assert len(check.report.live) == frontends
            asked = time.perf_counter()
            read = await NatsRecordSource(options, ADMISSION_BUCKET).read(filters)
            records = [parse_record(e.key, e.value, e.published_at) for e in read.entries]
            drain = check_drained(live_records(records), drained)
            drain_ms.append((time.perf_counter() - asked) * 1000)
            assert len(drain.frontends) == frontends
        bucket = await js.stream_info(f"KV_{ADMISSION_BUCKET}")
        return {
            "workers": workers,
            "frontends": frontends,
            "watching": watch,
            "legacy": legacy,
            "leased": publishers[0].leased,
            "published_s": round(published_s, 1),
            "synced_s": round(synced_s, 1),
            "admission_records": bucket.state.messages,
            "admission_bytes": bucket.state.bytes,
            "rest": at_rest,
            "rest_seconds": round(t1 - t0, 1),
            "change": {
                k: round(statistics.median(c[k] for c in per_change), 1) for k in per_change[0]
            },
            "change_ms": round(statistics.median(change_ms), 1),
            "gate_ms": round(statistics.median(gate_ms), 1),
            "gate_later_ms": round(statistics.median(gate_later_ms), 1),
            "drain_ms": round(statistics.median(drain_ms), 1),
        }
    finally:
        for source in sources:
            with contextlib.suppress(Exception):
                await source.close()
        for task in readers:
            task.cancel()
        for publisher in publishers:
            with contextlib.suppress(Exception):
                await publisher.withdraw_all()
        for nc in clients:
            with contextlib.suppress(Exception):
                await nc.close()
        server.close()
        shutil.rmtree(root, ignore_errors=True)


def table(rows: Sequence[dict[str, Any]]) -> Iterator[str]:
    yield (
        "| workers | frontends | admission bucket | watches | at rest, into nats-server "
        "| at rest, out of it | one change, into nats-server | one change, out of it "
        "| change to all flushed | gate, first look | gate, later look | drain look |"
    )
    yield "|---|---|---|---|---|---|---|---|---|---|---|---|"
    for r in rows:
        rest, change = r["rest"], r["change"]
        kind = "max age (older)" if not r["leased"] else "heartbeat + content"
        yield (
            f"| {r['workers']:,} | {r['frontends']} | {kind} | {'yes' if r['watching'] else 'no'} "
            f"| {rest['in_bytes'] / 1000:,.1f} KB/s, {rest['in_msgs']:,.1f} msgs/s "
            f"| {rest['out_bytes'] / 1000:,.1f} KB/s, {rest['out_msgs']:,.1f} msgs/s "
            f"| {change['in_bytes'] / 1000:,.1f} KB, {change['in_msgs']:,.0f} msgs "
            f"| {change['out_bytes'] / 1000:,.1f} KB, {change['out_msgs']:,.0f} msgs "
            f"| {r['change_ms']:,.0f} ms | {r['gate_ms']:,.0f} ms "
            f"| {r.get('gate_later_ms', float('nan')):,.0f} ms | {r['drain_ms']:,.0f} ms |"
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frontends", type=int, default=100)
    parser.add_argument("--sizes", default="2000,20000")
    parser.add_argument("--watch-sizes", default="2000", help="sizes with a watch per frontend")
    parser.add_argument("--rest", type=float, default=30.0)
    parser.add_argument("--changes", type=int, default=10)
    parser.add_argument("--polls", type=int, default=5)
    parser.add_argument("--legacy", action="store_true", help="also an older admission bucket")
    parser.add_argument("--out", type=Path, default=RESULTS / "bench_frontends.json")
    args = parser.parse_args(argv)
    watched = {int(s) for s in args.watch_sizes.split(",") if s}
    rows = []
    for workers in (int(s) for s in args.sizes.split(",")):
        for legacy in (False, True) if args.legacy else (False,):
            row = asyncio.run(
                run_size(
                    workers,
                    args.frontends,
                    workers in watched,
                    args.rest,
                    args.changes,
                    args.polls,
                    legacy,
                )
            )
            print(json.dumps(row), flush=True)
            rows.append(row)
    for line in table(rows):
        print(line)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
