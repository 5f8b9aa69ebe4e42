"""What one worker change costs a fleet of frontends: put -> card in every view, against fleet size.

A plain script: ``python integration/bench/bench_fleet.py [--sizes 500,5000,20000]
[--frontends 1,4] [--changes 15] [--out results/bench_fleet.json]`` (``BENCH_QUICK=1``: 200
and 2,000 workers, 1 and 2 frontends, 5 changes).

For each (workers, frontends) it starts its own loopback nats-server (the pinned binary, data
in a temporary folder), puts N workers (a card and an endpoint record each, over N/100
namespaces of 100 workers, one WorkerSet per namespace) straight into the discovery bucket,
starts F ``workerset-admission serve --view-dir`` processes, each with its own view directory
and Prometheus port, and waits until every view holds N cards (the initial sync). Then:

* ``put``: 15 new workers, one at a time, in namespaces of the fleet; each timed from its put
  to its card file in every view (and, as the baseline, to a raw nats-py watch of the bucket
  in this process receiving it);
* ``remove``: the same 15 deleted (card and endpoint record), timed to the card leaving every
  view;
* ``drain``: 15 drain records for workers of the fleet, timed to the card leaving every view;
  then undrained;
* ``put_scraping``: 15 more puts while a thread scrapes frontend 0's ``/metrics`` back to
  back, and the scrapes' own times (after one scrape of its own, ``scrape_first_ms``, as a
  running Prometheus would have scraped before);
* ``status``: one ``status`` request/reply round trip to frontend 0, 5 times;
* RSS of each ``serve`` after the initial sync and at the end.

``--rest SECONDS`` adds the at-rest rows (``--rest-sizes``, default 2,000 and 20,000 workers;
``--only-rest`` runs nothing else): one ``serve`` synced on the fleet, left alone for a settling
period and then measured for SECONDS: its CPU (user and system, per cent of one core), and what
nats-server received from it and sent to it meanwhile (messages and bytes per second, from its
monitoring endpoint: the counters of the ``serve``'s own connections, ``/connz``). Each size
is measured twice: with a view directory (``--view-dir``, the file keep-alive included) and
without, so the view's part is visible.

Every figure is in milliseconds. Results go to ``results/bench_fleet.json``, and the chart of
cost against fleet size to ``docs/bench/fleet.png`` (``--chart``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import nats
import psutil
from nats.js.api import KeyValueConfig
from workerset_admission.adapters.dynamo.view_directory import file_name_for
from workerset_admission.adapters.nats.embedded import EmbeddedNatsServer
from workerset_admission.card import (
    encode_endpoint_record,
    encode_model_record,
    endpoint_kv_key,
    model_kv_key,
)
from workerset_admission.card.drain_record import encode_drain_record
from workerset_admission.identity import Drain, EndpointId, GroupKey, WorkerType
from workerset_admission.keys import drain_kv_key
from workerset_admission.settings import Settings
from workerset_admission.wiring.compose import create_service

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent))

from support.fleet import MODEL, card  # noqa: E402 - integration/ is on the path from here on

RESULTS = HERE / "results"
CHART = HERE.parents[1] / "docs" / "bench" / "fleet.png"
DISCOVERY = "dynamo-discovery"
PER_NAMESPACE = 100
# The fleet's one card, as the fault and burst tests register it.
CARD_JSON = json.dumps(card(16))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def worker(index: int, per_namespace: int = PER_NAMESPACE) -> tuple[EndpointId, int]:
    """The fleet's worker number ``index``: its endpoint and instance id."""
    return EndpointId(f"ns-{index // per_namespace}", "backend", "generate"), index + 1


def card_file(view: Path, endpoint: EndpointId, instance_id: int) -> Path:
    path = f"{endpoint.namespace}/{endpoint.component}/{endpoint.endpoint}/{instance_id:x}"
    return view / "v1" / "mdc" / file_name_for(path)


def records(index: int, per_namespace: int = PER_NAMESPACE) -> list[tuple[str, bytes]]:
    endpoint, instance_id = worker(index, per_namespace)
    return [
        (endpoint_kv_key(endpoint, instance_id), encode_endpoint_record(endpoint, instance_id)),
        (
            model_kv_key(endpoint, instance_id),
            encode_model_record(endpoint, instance_id, CARD_JSON),
        ),
    ]


def percentiles(values: Sequence[float]) -> dict[str, float]:
    ordered = sorted(values)
    if not ordered:
        return {"p50": float("nan"), "max": float("nan"), "n": 0}
    return {
        "p50": round(statistics.median(ordered), 2),
        "max": round(ordered[-1], 2),
        "n": len(ordered),
    }


def wait_until(predicate: Any, timeout: float, poll: float = 0.0005) -> float:
    """Spin on ``predicate`` until true; return the monotonic time it became true."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return time.monotonic()
        if time.monotonic() > deadline:
            raise TimeoutError("timed out")
        time.sleep(poll)


class Scraper(threading.Thread):
    """Scrape one ``/metrics`` back to back until stopped; keep each scrape's time."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.times: list[float] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            self.times.append(scrape_ms(self.url))


def scrape_ms(url: str) -> float:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as response:
        response.read()
    return (time.perf_counter() - started) * 1000


class Frontends:
    """F ``serve --view-dir`` processes on one nats-server, each with its own view."""

    def __init__(self, url: str, count: int, root: Path) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.views: list[Path] = []
        self.metrics: list[str] = []
        self.subjects: list[str] = []
        for index in range(count):
            view = root / f"view-{index}"
            view.mkdir()
            port = free_port()
            subject = f"bench.status.fe{index}"
            log = (root / f"serve-{index}.log").open("wb")
            env = dict(os.environ, DYN_FILE_KV=str(view))
            self.procs.append(
                subprocess.Popen(
                    [
                        sys.executable, "-m", "workerset_admission.cli", "serve",
                        "--nats-server", url, "--view-dir", str(view),
                        "--frontend-id", f"fe{index}", "--status-subject", subject,
                        "--prometheus-port", str(port), "--prometheus-host", "127.0.0.1",
                        "--log-level", "WARNING",
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                )
            )  # fmt: skip
            self.views.append(view)
            self.metrics.append(f"http://127.0.0.1:{port}/metrics")
            self.subjects.append(subject)

    def rss_mb(self) -> list[float]:
        return [round(psutil.Process(p.pid).memory_info().rss / 2**20, 1) for p in self.procs]

    def close(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:  # noqa: PERF203 - each process gets its wait
                proc.kill()
                proc.wait()


def cards_in(view: Path) -> int:
    try:
        with os.scandir(view / "v1" / "mdc") as entries:
            return sum(1 for entry in entries if not entry.name.startswith("."))
    except FileNotFoundError:
        return 0  # the writer has not opened its directory yet


async def receiver_sees(receiver: Any, instance_id: int, timeout: float = 60) -> float:
    """Wait until an admission receiver lists ``instance_id``; return when it did."""
    while instance_id not in receiver.current().admitted:
        await asyncio.wait_for(receiver.changed(), timeout)
    return time.monotonic()


async def run_point(
    workers: int, frontends: int, changes: int, per_namespace: int = PER_NAMESPACE
) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    server = EmbeddedNatsServer(store_dir=root / "js")
    server.start()
    fleet: Frontends | None = None
    try:
        nc = await nats.connect(server.url)
        js = nc.jetstream(timeout=30)
        kv = await js.create_key_value(KeyValueConfig(bucket=DISCOVERY, history=1))
        await fill(js, [item for i in range(workers) for item in records(i, per_namespace)])
        fleet = Frontends(server.url, frontends, root)
        started = time.monotonic()
        for view in fleet.views:
            await asyncio.to_thread(wait_until, lambda v=view: cards_in(v) >= workers, 600, 0.05)
        initial_sync = time.monotonic() - started
        rss_synced = fleet.rss_mb()
        await asyncio.sleep(1.0)  # let the first serving publication settle

        seen: dict[str, float] = {}
        watcher = await kv.watch("v1.mdc.>", include_history=False)

        async def follow() -> None:
            async for entry in watcher:
                if entry is not None and entry.key is not None:
                    seen[entry.key] = time.monotonic()

        watching = asyncio.ensure_future(follow())
        # A service in this process, for put -> admission receiver (the routing hops' input).
        service = await create_service(
            Settings(), servers=[server.url], publish=False, status=False
        )
        await service.wait_synced(600)
        await asyncio.sleep(0.5)
        result: dict[str, Any] = {
            "workers": workers,
            "frontends": frontends,
            "per_namespace": per_namespace,
            "initial_sync_s": round(initial_sync, 2),
        }
        spread = max(1, workers // changes)
        new_ids = [workers + k for k in range(changes)]

        async def timed_puts(indices: Sequence[int]) -> tuple[list[float], list[float]]:
            view_ms, raw_ms = [], []
            for n, index in enumerate(indices):
                # A new worker in a namespace of the fleet (its id is past the fleet's).
                endpoint, instance_id = worker((n * spread) % workers, per_namespace)
                instance_id = index + 1
                group = GroupKey.build(MODEL, endpoint, "chat|completions", WorkerType.AGGREGATED)
                receiver = service.receiver_for(group)
                assert receiver is not None
                items = [
                    (endpoint_kv_key(endpoint, instance_id),
                     encode_endpoint_record(endpoint, instance_id)),
                    (model_kv_key(endpoint, instance_id),
                     encode_model_record(endpoint, instance_id, CARD_JSON)),
                ]  # fmt: skip
                await kv.put(*items[0])
                put_at = time.monotonic()
                await kv.put(*items[1])
                files = [card_file(v, endpoint, instance_id) for v in fleet.views]
                received, done = await asyncio.gather(
                    receiver_sees(receiver, instance_id),
                    asyncio.to_thread(wait_until, lambda fs=files: all(f.exists() for f in fs), 60),
                )
                receiver.close()
                receiver_ms.append((received - put_at) * 1000)
                view_ms.append((done - put_at) * 1000)
                key = items[1][0]
                raw = await asyncio.to_thread(wait_until, lambda k=key: k in seen, 60)
                raw_ms.append((seen[key] - put_at) * 1000 if raw else float("nan"))
                await asyncio.sleep(0.05)
            return view_ms, raw_ms

        receiver_ms: list[float] = []
        view_ms, raw_ms = await timed_puts(new_ids)
        result["put_ms"] = percentiles(view_ms)
        result["receiver_ms"] = percentiles(receiver_ms)
        result["raw_watch_ms"] = percentiles(raw_ms)

        # Removal: the same new workers leave (card first, as a stopping worker's lease goes).
        remove_ms = []
        for n, index in enumerate(new_ids):
            endpoint, _ = worker((n * spread) % workers, per_namespace)
            instance_id = index + 1
            removed_at = time.monotonic()
            await kv.delete(model_kv_key(endpoint, instance_id))
            await kv.delete(endpoint_kv_key(endpoint, instance_id))
            files = [card_file(v, endpoint, instance_id) for v in fleet.views]
            done = await asyncio.to_thread(
                wait_until, lambda fs=files: not any(f.exists() for f in fs), 60
            )
            remove_ms.append((done - removed_at) * 1000)
            await asyncio.sleep(0.05)
        result["remove_ms"] = percentiles(remove_ms)

        # Drain: workers of the fleet (each namespace keeps 99 others).
        drain_ms = []
        drained = []
        for n in range(changes):
            endpoint, instance_id = worker((n * spread + 1) % workers, per_namespace)
            key = drain_kv_key(endpoint.namespace, instance_id)
            value = encode_drain_record(Drain(endpoint.namespace, instance_id, "bench", None))
            drained.append(key)
            drained_at = time.monotonic()
            await kv.put(key, value)
            files = [card_file(v, endpoint, instance_id) for v in fleet.views]
            done = await asyncio.to_thread(
                wait_until, lambda fs=files: not any(f.exists() for f in fs), 60
            )
            drain_ms.append((done - drained_at) * 1000)
            await asyncio.sleep(0.05)
        result["drain_ms"] = percentiles(drain_ms)
        for key in drained:
            await kv.delete(key)
        await asyncio.sleep(1.0)

        # Puts again, while frontend 0's /metrics is scraped back to back. One scrape first: a
        # deployment's Prometheus has scraped long before, and the first scrape of a page that
        # keeps its worker series builds them (timed on its own, ``scrape_first_ms``).
        result["scrape_first_ms"] = round(await asyncio.to_thread(scrape_ms, fleet.metrics[0]), 2)
        scraper = Scraper(fleet.metrics[0])
        scraper.start()
        view_ms, _ = await timed_puts([workers + changes + k for k in range(changes)])
        scraper.stopping.set()
        await asyncio.to_thread(scraper.join, 120)
        result["put_scraping_ms"] = percentiles(view_ms)
        result["scrape_ms"] = percentiles(scraper.times)
        idle_scrapes = [await asyncio.to_thread(scrape_ms, fleet.metrics[0]) for _ in range(5)]
        result["scrape_idle_ms"] = percentiles(idle_scrapes)

        status_ms = []
        for _ in range(5):
            asked = time.perf_counter()
            await nc.request(fleet.subjects[0], b"", timeout=60)
            status_ms.append((time.perf_counter() - asked) * 1000)
        result["status_ms"] = percentiles(status_ms)
        result["rss_mb_synced"] = rss_synced
        result["rss_mb_end"] = fleet.rss_mb()
        await service.stop()
        watching.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await watching
        await nc.close()
        return result
    finally:
        if fleet is not None:
            fleet.close()
        server.close()
        shutil.rmtree(root, ignore_errors=True)


def monitoring(port: int, page: str) -> dict[str, Any]:
    url = f"http://127.0.0.1:{port}/{page}"
    with urllib.request.urlopen(url, timeout=10) as response:
        data: dict[str, Any] = json.loads(response.read())
    return data


def traffic(port: int, name_prefix: str = "workerset-admission") -> dict[str, int]:
    """What nats-server counted for the connections of ``serve`` processes (by their name).

    The server's own totals (``/varz``) also count its internal messages (JetStream's own
    bookkeeping sends a few hundred small ones a second here whatever the clients do); the
    connections' counters are what the frontend costs it.
    """
    totals = {"in_msgs": 0, "in_bytes": 0, "out_msgs": 0, "out_bytes": 0}
    for conn in monitoring(port, "connz?limit=4096")["connections"]:
        if str(conn.get("name") or "").startswith(name_prefix):
            for field in totals:
                totals[field] += int(conn[field])
    return totals


def start_process(command: list[str], log: Any, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)


async def wait_serve_synced(nc: Any, subject: str, timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            reply = await nc.request(subject, b"", timeout=30)
            if json.loads(reply.data).get("synced"):
                return
        except Exception:
            pass  # not answering yet is what is waited for
        await asyncio.sleep(0.5)
    raise TimeoutError(f"{subject} never said it was synced")


async def run_rest(
    workers: int, view: bool, seconds: float, settle: float, per_namespace: int = PER_NAMESPACE
) -> dict[str, Any]:
    """One ``serve`` synced on ``workers`` and left alone: its CPU and nats-server's traffic."""
    root = Path(tempfile.mkdtemp(prefix="bench-rest-"))
    monitor = free_port()
    server = EmbeddedNatsServer(store_dir=root / "js", extra_args=("--http_port", str(monitor)))
    server.start()
    proc: subprocess.Popen[bytes] | None = None
    try:
        nc = await nats.connect(server.url)
        js = nc.jetstream(timeout=30)
        await js.create_key_value(KeyValueConfig(bucket=DISCOVERY, history=1))
        await fill(js, [item for i in range(workers) for item in records(i, per_namespace)])
        subject = "bench.status.rest"
        command = [
            sys.executable, "-m", "workerset_admission.cli", "serve",
            "--nats-server", server.url, "--frontend-id", "fe-rest",
            "--status-subject", subject, "--log-level", "WARNING",
        ]  # fmt: skip
        env = dict(os.environ)
        view_dir = root / "view"
        if view:
            view_dir.mkdir()
            command += ["--view-dir", str(view_dir)]
            env["DYN_FILE_KV"] = str(view_dir)
        log = (root / "serve.log").open("wb")
        proc = start_process(command, log, env)
        started = time.monotonic()
        await wait_serve_synced(nc, subject)
        if view:
            await asyncio.to_thread(wait_until, lambda: cards_in(view_dir) >= workers, 900, 0.05)
        synced_s = time.monotonic() - started
        await asyncio.sleep(settle)
        handle = psutil.Process(proc.pid)
        cpu_before, before, t0 = handle.cpu_times(), traffic(monitor), time.monotonic()
        server_before = monitoring(monitor, "varz")
        await asyncio.sleep(seconds)
        cpu_after, after, t1 = handle.cpu_times(), traffic(monitor), time.monotonic()
        server_after = monitoring(monitor, "varz")
        elapsed = t1 - t0
        used = (cpu_after.user - cpu_before.user) + (cpu_after.system - cpu_before.system)
        await nc.close()
        return {
            "workers": workers,
            "view": view,
            "seconds": round(elapsed, 1),
            "synced_s": round(synced_s, 1),
            "cpu_percent": round(100 * used / elapsed, 2),
            "in_msgs_s": round((after["in_msgs"] - before["in_msgs"]) / elapsed, 2),
            "in_bytes_s": round((after["in_bytes"] - before["in_bytes"]) / elapsed, 1),
            "out_msgs_s": round((after["out_msgs"] - before["out_msgs"]) / elapsed, 2),
            "out_bytes_s": round((after["out_bytes"] - before["out_bytes"]) / elapsed, 1),
            "server_in_msgs_s": round(
                (server_after["in_msgs"] - server_before["in_msgs"]) / elapsed, 2
            ),
            "server_out_msgs_s": round(
                (server_after["out_msgs"] - server_before["out_msgs"]) / elapsed, 2
            ),
            "rss_mb": round(handle.memory_info().rss / 2**20, 1),
        }
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        server.close()
        shutil.rmtree(root, ignore_errors=True)


def rest_table(rows: Sequence[dict[str, Any]]) -> Iterator[str]:
    yield ("| workers | view | CPU of `serve` | into nats-server | out of nats-server |")
    yield "|---|---|---|---|---|"
    for r in rows:
        yield (
            f"| {r['workers']:,} | {'yes' if r['view'] else 'no'} | {r['cpu_percent']:.2f} % "
            f"| {r['in_bytes_s'] / 1000:,.2f} KB/s, {r['in_msgs_s']:,.1f} msgs/s "
            f"| {r['out_bytes_s'] / 1000:,.2f} KB/s, {r['out_msgs_s']:,.1f} msgs/s |"
        )


def rest_ratios(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Each at-rest figure at the largest size over the smallest, with and without a view."""
    out: dict[str, float] = {}
    for view in (True, False):
        mine = sorted((r for r in rows if r["view"] == view), key=lambda r: r["workers"])
        if len(mine) < 2:
            continue
        small, large = mine[0], mine[-1]
        label = f"{large['workers']}/{small['workers']} {'with' if view else 'without'} view"
        for field in ("cpu_percent", "in_bytes_s", "in_msgs_s"):
            if small[field]:
                out[f"rest {field} {label}"] = round(large[field] / small[field], 2)
    return out


async def fill(js: Any, items: Sequence[tuple[str, bytes]], window: int = 512) -> None:
    subjects = [(f"$KV.{DISCOVERY}.{key}", value) for key, value in items]
    for start in range(0, len(subjects), window):
        await asyncio.gather(*(js.publish(s, v) for s, v in subjects[start : start + window]))


def table(rows: Sequence[dict[str, Any]]) -> Iterator[str]:
    yield (
        "| workers | per WorkerSet | frontends | put -> card in every view, p50 (max) "
        "| same, while scraping | put -> receiver | removal | drain | raw nats-py watch "
        "| one /metrics scrape, p50 (max) | status | initial sync | RSS per frontend |"
    )
    yield "|---|---|---|---|---|---|---|---|---|---|---|---|---|"

    def pm(entry: dict[str, float]) -> str:
        return f"{entry['p50']:,.1f} ms ({entry['max']:,.0f})"

    for r in rows:
        yield (
            f"| {r['workers']:,} | {r.get('per_namespace', PER_NAMESPACE):,} | {r['frontends']} "
            f"| {pm(r['put_ms'])} | {pm(r['put_scraping_ms'])} | {pm(r['receiver_ms'])} "
            f"| {pm(r['remove_ms'])} | {pm(r['drain_ms'])} "
            f"| {pm(r['raw_watch_ms'])} | {pm(r['scrape_ms'])} | {pm(r['status_ms'])} "
            f"| {r['initial_sync_s']} s | {max(r['rss_mb_end'])} MB |"
        )


def ratios(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """The bounded ratios, where the run has both points (namespaces of 100 workers)."""
    spread = [r for r in rows if r.get("per_namespace", PER_NAMESPACE) == PER_NAMESPACE]
    one = {r["workers"]: r for r in spread if r["frontends"] == 1}
    four = {r["workers"]: r for r in spread if r["frontends"] > 1}
    out: dict[str, float] = {}
    small = min(one) if one else None
    for size, row in sorted(one.items()):
        if small is None or size == small:
            continue
        base = one[small]
        out[f"put p50 {size}/{small}"] = row["put_ms"]["p50"] / base["put_ms"]["p50"]
        out[f"scrape p50 {size}/{small}"] = row["scrape_ms"]["p50"] / base["scrape_ms"]["p50"]
        out[f"initial sync {size}/{small}"] = row["initial_sync_s"] / base["initial_sync_s"]
        out[f"RSS KiB per worker {small}->{size}"] = (
            (max(row["rss_mb_synced"]) - max(base["rss_mb_synced"])) * 1024 / (size - small)
        )
    for size, row in sorted(one.items()):
        scraping, idle = row["put_scraping_ms"]["p50"], row["put_ms"]["p50"]
        out[f"put scraping/idle p50 at {size}"] = scraping / idle
    for size, row in sorted(four.items()):
        if size in one:
            out[f"put p50 {row['frontends']} frontends/1 at {size}"] = (
                row["put_ms"]["p50"] / one[size]["put_ms"]["p50"]
            )
    return {k: round(v, 2) for k, v in out.items()}


def chart(
    rows: Sequence[dict[str, Any]], path: Path, before: Sequence[dict[str, Any]] = ()
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for frontends in sorted({r["frontends"] for r in rows}):
        mine = sorted((r for r in rows if r["frontends"] == frontends), key=lambda r: r["workers"])
        sizes = [r["workers"] for r in mine]
        left.plot(sizes, [r["put_ms"]["p50"] for r in mine], "o-",
                  label=f"put -> card in every view, {frontends} frontend(s)")  # fmt: skip
        if frontends == 1:
            left.plot(sizes, [r["raw_watch_ms"]["p50"] for r in mine], "s--",
                      label="raw nats-py watch (baseline)")  # fmt: skip
            left.plot(sizes, [r["remove_ms"]["p50"] for r in mine], "^-", label="removal")
            right.plot(sizes, [r["scrape_ms"]["p50"] for r in mine], "o-", label="/metrics scrape")
            right.plot(sizes, [r["status_ms"]["p50"] for r in mine], "s-", label="status")
    earlier = sorted((r for r in before if r["frontends"] == 1), key=lambda r: r["workers"])
    if earlier:
        sizes = [r["workers"] for r in earlier]
        left.plot(sizes, [r["put_ms"]["p50"] for r in earlier], "x:", color="grey",
                  label="put -> card in every view, before (full re-plan)")  # fmt: skip
        right.plot(sizes, [r["scrape_ms"]["p50"] for r in earlier], "x:", color="grey",
                   label="/metrics scrape, before")  # fmt: skip
    for axis, title in ((left, "one worker change, p50"), (right, "one read, p50")):
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_xlabel("workers in the fleet")
        axis.set_ylabel("ms")
        axis.set_title(title)
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv: Sequence[str] | None = None) -> int:
    quick = os.environ.get("BENCH_QUICK") == "1"
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="200,2000" if quick else "500,5000,20000")
    parser.add_argument("--frontends", default="1,2" if quick else "1,4")
    parser.add_argument(
        "--four-at",
        type=int,
        default=None,
        help="the one size run with more than one frontend (default: the middle one)",
    )
    parser.add_argument(
        "--one-set",
        type=int,
        default=0,
        help="also a fleet of this many workers in one WorkerSet (one namespace)",
    )
    parser.add_argument("--changes", type=int, default=5 if quick else 15)
    parser.add_argument("--rest", type=float, default=0, help="seconds of each at-rest row")
    parser.add_argument("--rest-settle", type=float, default=15, help="seconds before measuring")
    parser.add_argument("--rest-sizes", default="2000,20000")
    parser.add_argument("--only-rest", action="store_true", help="run the at-rest rows alone")
    parser.add_argument("--out", type=Path, default=RESULTS / "bench_fleet.json")
    parser.add_argument("--chart", action="store_true")
    parser.add_argument(
        "--before", type=Path, default=None, help="a results file of an earlier run, charted beside"
    )
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    counts = [int(f) for f in args.frontends.split(",")]
    many_at = args.four_at or sizes[len(sizes) // 2]
    points = [(s, 1, PER_NAMESPACE) for s in sizes]
    points += [(many_at, f, PER_NAMESPACE) for f in counts if f > 1]
    if args.one_set:
        points.append((args.one_set, 1, args.one_set))
    rows = []
    rest: list[dict[str, Any]] = []
    if args.rest:
        for workers in (int(n) for n in args.rest_sizes.split(",")):
            for view in (True, False):
                row = asyncio.run(run_rest(workers, view, args.rest, args.rest_settle))
                print(json.dumps(row), flush=True)
                rest.append(row)
        for line in rest_table(rest):
            print(line)
        for name, value in rest_ratios(rest).items():
            print(f"{name}: {value}")
    if args.only_rest:
        points = []
    for workers, frontends, per_namespace in points:
        row = asyncio.run(run_point(workers, frontends, args.changes, per_namespace))
        print(json.dumps(row), flush=True)
        rows.append(row)
    for line in table(rows) if rows else ():
        print(line)
    found = ratios(rows) if rows else {}
    for name, value in found.items():
        print(f"{name}: {value}")
    found.update(rest_ratios(rest))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {"rows": rows, "rest": rest, "ratios": found}
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    if args.chart and rows:
        before = json.loads(args.before.read_text())["rows"] if args.before else []
        chart(
            [r for r in rows if r.get("per_namespace", PER_NAMESPACE) == PER_NAMESPACE],
            CHART,
            before,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
