"""Where the memory per worker goes: the heap of a synced ``serve --view-dir``, by line and owner.

A plain script: ``python integration/bench/bench_memory.py [--sizes 2000,20000] [--rss]
[--top 30] [--out results/bench_memory.json]``.

For each size it runs a fresh interpreter that starts its own loopback nats-server, puts the
fleet of ``bench_fleet.py`` (N workers, a card and an endpoint record each, in namespaces of
100 workers) into the discovery bucket, and starts the service the way ``serve --view-dir
--prometheus-port`` does (its telemetry, ``create_service`` with a locked view directory),
under ``tracemalloc``. Once the view holds N cards and the first serving publication has
gone out, it collects garbage and takes:

* a ``tracemalloc`` snapshot grouped by the line that allocated each block (and by file);
* what each part of the service holds, by walking the objects reachable from it (each object
  counted once, for the first part that reaches it, in the order listed; only objects
  allocated after tracing began, so the interpreter's own constants are left out).

The parent subtracts the smallest size from the largest and divides by the workers added:
bytes per worker, by line and by owner. ``--rss`` also starts a real ``serve`` process on each
fleet (as ``bench_fleet.py`` does) and reads its RSS once the view is complete, and again after
a few seconds at rest (``--only-rss``: that alone). ``--gets N`` times instead what a view that
kept no record bytes would pay to write a file: a ``kv.get`` of each record of N workers, one at
a time and all at once. ``--copies`` also lists, for one worker of the smallest fleet, each
object held for it (its records' bytes, its keys and names, its instance id, and what holds
those directly) with every path from the service's parts that reaches it: which structure
holds which copy. Results go to ``results/bench_memory.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
import types
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import nats
import psutil
from bench_fleet import (
    DISCOVERY,
    Frontends,
    cards_in,
    file_name_for,
    fill,
    free_port,
    records,
    wait_until,
    worker,
)
from nats.js.api import KeyValueConfig
from workerset_admission.adapters.nats.embedded import EmbeddedNatsServer

HERE = Path(__file__).parent
RESULTS = HERE / "results"
ROOT = str(HERE.parents[1])
SETTLE_S = 2.0
# Python objects that belong to no one part: code, classes and the loop are not the fleet's.
_OPAQUE = (
    types.ModuleType,
    type,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.CodeType,
    types.FrameType,
    asyncio.AbstractEventLoop,
)


def scratch() -> str | None:
    """Where the nats-server's store and the view go: memory, where the machine has it.

    Forty thousand view files written to a loaded disk took minutes; what is measured here is
    the heap, which the file system does not change.
    """
    return os.environ.get("BENCH_MEMORY_TMP") or ("/dev/shm" if os.path.isdir("/dev/shm") else None)


def deep_sizes(roots: Sequence[tuple[str, Any]], stop: Sequence[Any]) -> dict[str, list[int]]:
    """Bytes and objects reachable from each root and from no root before it.

    Only objects ``tracemalloc`` saw allocated are counted; walking stops at modules, classes,
    functions, frames, the loop and at every object of ``stop`` (the service itself).
    """
    seen = {id(obj) for obj in stop}
    seen.update(id(obj) for _, obj in roots)
    out: dict[str, list[int]] = {}
    traced = tracemalloc.get_object_traceback
    for name, root in roots:
        total = count = 0
        todo = [root]
        first = True
        while todo:
            obj = todo.pop()
            if not first:
                if id(obj) in seen:
                    continue
                seen.add(id(obj))
            first = False
            if isinstance(obj, _OPAQUE):
                continue
            if traced(obj) is not None:
                total += sys.getsizeof(obj)
                count += 1
            todo.extend(gc.get_referents(obj))
        out[name] = [total, count]
    return out


def fields(obj: Any) -> list[tuple[str, Any]]:
    """An object's attributes, from its ``__dict__`` or its slots, by name."""
    if hasattr(obj, "__dict__"):
        return sorted(vars(obj).items(), key=lambda item: item[0])
    names = {n for cls in type(obj).__mro__ for n in getattr(cls, "__slots__", ())}
    return sorted((n, getattr(obj, n)) for n in names if hasattr(obj, n))


def expand(name: str, obj: Any, depth: int) -> list[tuple[str, Any]]:
    """``obj``'s fields (to ``depth`` levels) before ``obj`` itself, each named by its path."""
    out: list[tuple[str, Any]] = []
    if depth > 0 and not isinstance(obj, (dict, list, set, tuple, frozenset)):
        for field, value in fields(obj):
            out += expand(f"{name}.{field.lstrip('_')}", value, depth - 1)
    out.append((name, obj))
    return out


def held_paths(
    parts: Sequence[tuple[str, Any]], depth: int = 10
) -> dict[int, tuple[Any, set[str]]]:
    """Every object reachable from each part (to ``depth`` steps), with each path that reaches it.

    A path names the part, then each step: ``.field`` of an object, ``{k}`` a mapping's key,
    ``[v]`` its value, ``[i]`` a member of a sequence or set; an object held twice is reached
    by each holder (along the first path to that holder). Unlike :func:`deep_sizes`, an object
    reached from two parts is listed under both; a walk stops at another part (what that part
    holds is listed under its own name).
    """
    roots = {id(root) for _, root in parts}
    found: dict[int, tuple[Any, set[str]]] = {}
    for name, root in parts:
        todo: list[tuple[Any, str, int]] = [(root, name, 0)]
        seen: set[int] = set()
        while todo:
            obj, path, steps = todo.pop()
            if steps > depth or isinstance(obj, _OPAQUE) or (steps and id(obj) in roots):
                continue
            found.setdefault(id(obj), (obj, set()))[1].add(path)
            if id(obj) in seen:
                continue  # each holder of it is listed; what it holds, once
            seen.add(id(obj))
            if isinstance(obj, dict):
                for key, value in obj.items():
                    todo += [(key, path + "{k}", steps + 1), (value, path + "[v]", steps + 1)]
            elif isinstance(obj, (list, tuple, set, frozenset)):
                todo += [(member, path + "[i]", steps + 1) for member in obj]
            elif not isinstance(obj, (str, bytes, int, float)):
                todo += [(value, f"{path}.{field}", steps + 1) for field, value in fields(obj)]
    return found


def copies_of(index: int, parts: Sequence[tuple[str, Any]]) -> list[dict[str, Any]]:
    """The objects held for the fleet's worker ``index``, largest first, each with its holders.

    Its own objects are its two records' bytes, the strings that end in its instance id (its
    keys, its instance key, its file names) and the ``int`` of that id; besides them, each
    object that holds one of those directly and is no collection of the fleet (a tuple of at
    most a few members, or an object with fields), such as a record, a tie or a registration.
    """
    endpoint, instance_id = worker(index)
    values = {value for _, value in records(index)}
    suffixes = tuple(f"{sep}{instance_id:x}" for sep in (".", "/", "%2F"))
    namespaces = (endpoint.namespace, file_name_for(endpoint.namespace))  # a file name escapes it
    found = held_paths([(name, part) for name, part in parts if "." not in name])

    def own(obj: Any) -> bool:
        if isinstance(obj, bytes):
            return obj in values
        if isinstance(obj, str):
            return obj.endswith(suffixes) and any(ns in obj for ns in namespaces)
        return type(obj) is int and obj == instance_id

    mine = {key for key, (obj, _) in found.items() if own(obj)}
    for key, (obj, _) in found.items():
        if isinstance(obj, (dict, list, set, frozenset, str, bytes, int)):
            continue
        if isinstance(obj, tuple) and len(obj) > 4:
            continue
        if any(id(member) in mine for member in gc.get_referents(obj)):
            mine.add(key)
    rows = []
    for key in mine:
        obj, paths = found[key]
        text = repr(obj)
        rows.append(
            {
                "size": sys.getsizeof(obj),
                "type": type(obj).__name__,
                "value": text if len(text) <= 60 else text[:57] + "...",
                "held_by": sorted(paths),
            }
        )
    rows.sort(key=lambda row: (-row["size"], row["value"]))
    return rows


def parts_of(service: Any, view: Any) -> list[tuple[str, Any]]:
    """The service's parts, in the order their memory is charged to them.

    The view's record table first (the raw records it publishes), then the rest of the view,
    the records as ingested, the core, the source, and the service's other parts.
    """
    parts = expand("view.table", view.table, 1)
    parts += expand("view.view", view.view, 1)
    parts += expand("view", view, 1)
    parts += expand("ingest", service.ingest, 1)
    parts += expand("core", service.core, 1)
    parts += expand("source", service._source, 2)
    parts += expand("fold", service._fold, 1)
    named = {"core", "ingest", "_source", "_fold"}
    for name, value in fields(service):
        if name not in named:
            parts += expand(name.lstrip("_"), value, 1)
    return parts


def view_of(service: Any) -> Any:
    """The view hook ``create_service`` attached (it closes with the service)."""
    for close in service._closers:
        owner = getattr(close, "__self__", None)
        if type(owner).__name__ == "ViewHook":
            return owner
    raise RuntimeError("no view attached to the service")


def short(filename: str) -> str:
    """A file's name from the package, or from the interpreter's library, down."""
    for marker in ("/workerset_admission/", "/site-packages/", "/lib/python3."):
        if marker in filename:
            tail = filename.split(marker, 1)[1]
            return tail if marker != "/lib/python3." else tail.split("/", 1)[-1]
    return filename


def grouped(snapshot: tracemalloc.Snapshot, key: str) -> dict[str, list[int]]:
    """Traced blocks by the line (or file) that allocated them; for ``site``, by the innermost
    line of the package on the way there (which of its lines asked a library for them)."""
    out: dict[str, list[int]] = {}
    for trace in snapshot.traces:
        stack = list(reversed(trace.traceback))  # the allocating line first
        frame = stack[0]
        if key == "site":
            frame = next((f for f in stack if "/workerset_admission/" in f.filename), frame)
        name = short(frame.filename)
        label = name if key == "filename" else f"{name}:{frame.lineno}"
        entry = out.setdefault(label, [0, 0])
        entry[0] += trace.size
        entry[1] += 1
    return out


async def measure(
    workers: int, frames: int, scraped: bool = False, copies: bool = False
) -> dict[str, Any]:
    """One fleet of ``workers``, one service under ``tracemalloc``: its heap, by line and part.

    ``scraped``: ``/metrics`` is read once before the heap is, so what a scrape keeps (the
    worker families' text) is counted as a Prometheus that scrapes the service would see it.
    """
    from workerset_admission.adapters.dynamo.view import DirectoryFiles
    from workerset_admission.cli.serve import start_serve_telemetry
    from workerset_admission.settings import Settings
    from workerset_admission.wiring.compose import admission_telemetry, create_service

    root = Path(tempfile.mkdtemp(prefix="bench-memory-", dir=scratch()))
    server = EmbeddedNatsServer(store_dir=root / "js")
    server.start()
    try:
        nc = await nats.connect(server.url)
        js = nc.jetstream(timeout=30)
        await js.create_key_value(KeyValueConfig(bucket=DISCOVERY, history=1))
        await fill(js, [item for i in range(workers) for item in records(i)])
        await nc.close()
        view_dir = root / "view"
        view_dir.mkdir()
        settings = Settings(
            view_dir=view_dir,
            frontend_id="fe-memory",
            status_subject="bench.status.memory",
            prometheus_port=free_port(),
        )
        gc.collect()
        tracemalloc.start(frames)
        base = tracemalloc.get_traced_memory()[0]
        handle = start_serve_telemetry(settings, otlp=False)
        telemetry = None if handle is None else admission_telemetry(settings, handle)
        files = DirectoryFiles.open(view_dir)
        started = time.monotonic()
        service = await create_service(
            settings, servers=[server.url], telemetry=telemetry, view_files=files
        )
        try:
            await service.wait_synced(600)
            await asyncio.to_thread(wait_until, lambda: cards_in(view_dir) >= workers, 600, 0.05)
            synced_s = time.monotonic() - started
            await asyncio.sleep(SETTLE_S)  # the first serving publication goes out
            if scraped:
                url = f"http://127.0.0.1:{settings.prometheus_port}/metrics"
                await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=120).read())
            gc.collect()
            held = tracemalloc.get_traced_memory()[0] - base
            snapshot = tracemalloc.take_snapshot().filter_traces(
                (tracemalloc.Filter(False, tracemalloc.__file__),)
            )
            parts = parts_of(service, view_of(service))
            owners = deep_sizes(parts, stop=[service])
            result = {
                "workers": workers,
                "synced_s": round(synced_s, 2),
                "traced_bytes": held,
                "by_line": grouped(snapshot, "lineno"),
                "by_file": grouped(snapshot, "filename"),
                "by_site": grouped(snapshot, "site") if frames > 1 else {},
                "by_owner": owners,
            }
            if copies:
                result["copies"] = copies_of(workers // 2, parts)
        finally:
            tracemalloc.stop()
            await service.stop()
            files.release()
            if handle is not None:
                await asyncio.to_thread(handle.shutdown)
        return result
    finally:
        server.close()
        shutil.rmtree(root, ignore_errors=True)


async def serve_rss(workers: int, settle: float) -> dict[str, Any]:
    """A real ``serve --view-dir`` on ``workers``: its RSS once synced, and after ``settle`` s."""
    root = Path(tempfile.mkdtemp(prefix="bench-memory-rss-", dir=scratch()))
    server = EmbeddedNatsServer(store_dir=root / "js")
    server.start()
    fleet: Frontends | None = None
    try:
        nc = await nats.connect(server.url)
        js = nc.jetstream(timeout=30)
        await js.create_key_value(KeyValueConfig(bucket=DISCOVERY, history=1))
        await fill(js, [item for i in range(workers) for item in records(i)])
        await nc.close()
        fleet = Frontends(server.url, 1, root)
        view = fleet.views[0]
        await asyncio.to_thread(wait_until, lambda: cards_in(view) >= workers, 900, 0.05)
        synced = fleet.rss_mb()[0]
        await asyncio.sleep(settle)
        info = psutil.Process(fleet.procs[0].pid).memory_full_info()
        return {
            "workers": workers,
            "rss_mb_synced": synced,
            "rss_mb_settled": round(info.rss / 2**20, 1),
            "uss_mb_settled": round(info.uss / 2**20, 1),
        }
    finally:
        if fleet is not None:
            fleet.close()
        server.close()
        shutil.rmtree(root, ignore_errors=True)


async def kv_gets(workers: int) -> dict[str, Any]:
    """What a view that kept no bytes would pay to write a file: a ``kv.get`` of its record.

    Each of the fleet's records read back one at a time, then all at once.
    """
    root = Path(tempfile.mkdtemp(prefix="bench-memory-gets-", dir=scratch()))
    server = EmbeddedNatsServer(store_dir=root / "js")
    server.start()
    try:
        nc = await nats.connect(server.url)
        js = nc.jetstream(timeout=30)
        kv = await js.create_key_value(KeyValueConfig(bucket=DISCOVERY, history=1))
        items = [item for i in range(workers) for item in records(i)]
        await fill(js, items)
        serial = []
        for key, _ in items:
            started = time.perf_counter()
            await kv.get(key)
            serial.append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        await asyncio.gather(*(kv.get(key) for key, _ in items))
        together = (time.perf_counter() - started) * 1000
        await nc.close()
        serial.sort()
        return {
            "gets": len(items),
            "value_bytes": sorted({len(value) for _, value in items}),
            "serial_p50_ms": round(serial[len(serial) // 2], 3),
            "serial_p90_ms": round(serial[int(len(serial) * 0.9)], 3),
            "all_at_once_ms": round(together, 1),
        }
    finally:
        server.close()
        shutil.rmtree(root, ignore_errors=True)


def child(workers: int, frames: int, scraped: bool = False, copies: bool = False) -> dict[str, Any]:
    """Measure one size in a fresh interpreter, so no size inherits another's heap."""
    done = subprocess.run(
        [sys.executable, __file__, "--child", str(workers), "--frames", str(frames)]
        + (["--scraped"] if scraped else [])
        + (["--copies"] if copies else []),
        check=True,
        capture_output=True,
        text=True,
        cwd=HERE,
    )
    found: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return found


def per_worker(
    small: dict[str, list[int]], large: dict[str, list[int]], added: int
) -> list[tuple[str, float, float]]:
    """(name, bytes per worker, blocks per worker), largest first."""
    rows = []
    for name in set(small) | set(large):
        size = large.get(name, [0, 0])[0] - small.get(name, [0, 0])[0]
        count = large.get(name, [0, 0])[1] - small.get(name, [0, 0])[1]
        rows.append((name, size / added, count / added))
    rows.sort(key=lambda row: -abs(row[1]))
    return rows


def report(points: Sequence[dict[str, Any]], top: int) -> Iterator[str]:
    small, large = points[0], points[-1]
    added = large["workers"] - small["workers"]
    total = (large["traced_bytes"] - small["traced_bytes"]) / added
    yield (
        f"traced heap: {small['traced_bytes'] / 2**20:.1f} MiB at {small['workers']:,} workers, "
        f"{large['traced_bytes'] / 2**20:.1f} MiB at {large['workers']:,}: "
        f"{total:,.0f} B per worker added"
    )
    for key, title in (
        ("by_owner", "owner"),
        ("by_file", "file"),
        ("by_line", "line"),
        ("by_site", "the package's line"),
    ):
        if not large[key]:
            continue
        yield ""
        yield f"| {title} | B per worker | blocks per worker |"
        yield "|---|---:|---:|"
        rows = per_worker(small[key], large[key], added)
        shown = [row for row in rows if abs(row[1]) >= 1][:top]
        for name, size, count in shown:
            yield f"| {name} | {size:,.0f} | {count:.2f} |"
        rest = sum(row[1] for row in rows) - sum(row[1] for row in shown)
        yield f"| (the rest) | {rest:,.0f} | |"


def copies_report(point: dict[str, Any]) -> Iterator[str]:
    """The table of one worker's objects and their holders (``--copies``)."""
    rows = point["copies"]
    yield ""
    yield (
        f"worker {point['workers'] // 2} of {point['workers']:,}: {len(rows)} objects, "
        f"{sum(row['size'] for row in rows):,} B"
    )
    yield "| B | type | object | held by |"
    yield "|---:|---|---|---|"
    for row in rows:
        held = "<br>".join(row["held_by"][:8]) + (" ..." if len(row["held_by"]) > 8 else "")
        yield f"| {row['size']} | {row['type']} | `{row['value']}` | {held} |"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="2000,20000")
    parser.add_argument("--top", type=int, default=30, help="rows of each table")
    parser.add_argument("--rss", action="store_true", help="also a real serve's RSS per size")
    parser.add_argument("--only-rss", action="store_true", help="a real serve's RSS alone")
    parser.add_argument(
        "--gets",
        type=int,
        default=0,
        help="time instead a kv.get of each record of a fleet of this many workers",
    )
    parser.add_argument("--settle", type=float, default=10.0, help="seconds before the RSS")
    parser.add_argument("--out", type=Path, default=RESULTS / "bench_memory.json")
    parser.add_argument(
        "--frames",
        type=int,
        default=1,
        help="frames traced per block; above 1 also groups by the package's line under a "
        "library's allocation (several times slower)",
    )
    parser.add_argument(
        "--scraped", action="store_true", help="read /metrics once before the heap is measured"
    )
    parser.add_argument(
        "--copies",
        action="store_true",
        help="list one worker's objects of the smallest fleet and every path that holds each",
    )
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        found = asyncio.run(measure(args.child, args.frames, args.scraped, args.copies))
        print(json.dumps(found), flush=True)
        return 0
    if args.gets:
        print(json.dumps(asyncio.run(kv_gets(args.gets))), flush=True)
        return 0
    sizes = sorted(int(s) for s in args.sizes.split(","))
    points = []
    for size in () if args.only_rss else sizes:
        point = child(size, args.frames, args.scraped, args.copies and size == sizes[0])
        print(
            f"{size:>7,} workers: traced {point['traced_bytes'] / 2**20:.1f} MiB, "
            f"synced in {point['synced_s']} s",
            flush=True,
        )
        points.append(point)
    for line in report(points, args.top) if points else ():
        print(line)
    for line in copies_report(points[0]) if points and args.copies else ():
        print(line)
    rss = []
    if args.rss or args.only_rss:
        for size in sizes:
            row = asyncio.run(serve_rss(size, args.settle))
            print(json.dumps(row), flush=True)
            rss.append(row)
        small, large = rss[0], rss[-1]
        added = large["workers"] - small["workers"]
        for field in ("rss_mb_synced", "rss_mb_settled", "uss_mb_settled"):
            per = (large[field] - small[field]) * 2**20 / added / 1024
            print(f"{field} per worker added: {per:.2f} KiB")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"sizes": sizes, "rss": rss}
    if points:
        added = points[-1]["workers"] - points[0]["workers"]
        summary["traced_per_worker"] = round(
            (points[-1]["traced_bytes"] - points[0]["traced_bytes"]) / added
        )
        for key in ("by_owner", "by_line"):
            summary[f"{key}_per_worker"] = {
                name: round(size)
                for name, size, _ in per_worker(points[0][key], points[-1][key], added)
                if abs(size) >= 1
            }
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
