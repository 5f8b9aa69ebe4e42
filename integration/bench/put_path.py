"""The path of one discovery put through the package: from the watch to the card file's rename.

``python put_path.py [--url nats://...] [--puts 3] [--warmup 2] [--new-model] [--json | --stays]``.
Run with another tree's venv, it measures that tree: it imports only the package the interpreter
imports.

It runs the service as ``serve --view-dir`` does (``create_service``: the JetStream source, the
serving publisher, the status responder, the view writer on a temporary directory) against a
real nats-server: its own on loopback with a temporary store (the pinned binary), or the one
``--url`` names. A WorkerSet of two workers sharing one card is put in the bucket and committed,
and ``--warmup`` more workers join it unprofiled. Then each of ``--puts`` new workers of that
WorkerSet is put in the bucket by a client of its own, one at a time, with a ``sys.setprofile``
hook in place that starts recording when the watch's handler (``Watch.on_raw``, or
``Watch.on_message`` where nats-py cannot deliver raw) takes that worker's message, and stops
when the view's directory has renamed that worker's card file (``v1/mdc/...``) into place.
With ``--new-model`` each profiled put is instead the first worker of a model of its own: the
path then takes in the group's reservation, its build task and the commit.

Recorded are the Python calls and returns (coroutine resumptions and suspensions among them)
whose code is in the package's own files; the standard library and third parties are left
out. The path is that sequence of files: the files crossed (in first-entry order), its stays
(maximal runs of consecutive events in one file) and its returns (stays in a file the path had
already left; every stay but each file's first is one, so returns = stays - files). A return
is told by how the path came back: *to the caller* when control came back into a frame of that
file (a callee of another file returned, or a coroutine of another file suspended), or a
*re-entry* when a function of that file was called (or a coroutine of it resumed) from another
file (a callback, a hook, a subscriber, a value's constructor used again) or from the event
loop (a task woken, a callback it ran): returns = returns to the caller + re-entries. Anything
else the service's loop runs meanwhile (a timer, a keep-alive) would lengthen a path; the put
with the fewest events is the one reported, and the output says how many of the puts crossed
the same files in the same order.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

import nats
import workerset_admission
from workerset_admission.adapters.dynamo.view_directory import DirectoryFiles
from workerset_admission.adapters.nats.buckets import BucketSpec, ensure_bucket
from workerset_admission.adapters.nats.embedded import EmbeddedNatsServer
from workerset_admission.adapters.nats.watch import Watch
from workerset_admission.card import (
    encode_endpoint_record,
    encode_model_record,
    endpoint_kv_key,
    model_kv_key,
)
from workerset_admission.identity import EndpointId
from workerset_admission.settings import Settings
from workerset_admission.wiring.compose import create_service

PACKAGE = os.path.dirname(os.path.abspath(workerset_admission.__file__)) + os.sep
EP = EndpointId("putpath", "backend", "generate")
CARD: dict[str, Any] = {
    "display_name": "Qwen/Qwen3-8B",
    "slug": "qwen_qwen3-8b",
    "source_path": "Qwen/Qwen3-8B",
    "model_info": None,
    "tokenizer": None,
    "context_length": 40960,
    "kv_cache_block_size": 16,
    "migration_limit": 0,
    "model_type": "Chat|Completions",
    "model_input": "Tokens",
    "runtime_config": {
        "total_kv_blocks": 1000,
        "max_num_seqs": 256,
        "max_num_batched_tokens": 8192,
        "tool_call_parser": None,
        "reasoning_parser": None,
        "enable_local_indexer": False,
        "data_parallel_size": 1,
        "runtime_data": {},
    },
    "media_decoder": None,
    "media_fetcher": None,
}
_HANDLERS = frozenset({Watch.on_raw.__code__, Watch.on_message.__code__})
_PUBLISH = DirectoryFiles.publish.__code__


def _qualname(code: CodeType) -> str:
    # Python 3.10's code objects have only the bare name.
    name: str = getattr(code, "co_qualname", code.co_name)
    return name


def repo_path(filename: str) -> str | None:
    """The tree's path of a package file (``plugin/...``, ``adapters/...``), else ``None``."""
    if not filename.startswith(PACKAGE):
        return None
    inside = filename[len(PACKAGE) :].replace(os.sep, "/")
    top = inside.split("/", 1)[0]
    return inside if top in ("adapters", "telemetry") else f"plugin/{inside}"


@dataclass
class Recorder:
    """The profile hook of one put: waits for its message at the watch, records to its rename."""

    key: bytes
    known_cards: frozenset[str]
    # (event, file, function, caller): the caller is the nearest package file below a call
    # ("" when none is: the event loop ran it), ``None`` for returns.
    events: list[tuple[str, str, str, str | None]] = field(default_factory=list)
    recording: bool = False
    done: bool = False
    renamed: str | None = None
    _files: dict[str, str | None] = field(default_factory=dict)

    def _file(self, filename: str) -> str | None:
        try:
            return self._files[filename]
        except KeyError:
            found = self._files[filename] = repo_path(filename)
            return found

    def hook(self, frame: FrameType, event: str, arg: Any) -> None:
        if self.done:
            return
        code = frame.f_code
        if not self.recording:
            if event == "call" and code in _HANDLERS and self._is_ours(frame):
                self.recording = True
            else:
                return
        if event == "call":
            where = self._file(code.co_filename)
            if where is not None:
                self.events.append((event, where, _qualname(code), self._caller(frame)))
        elif event == "return":
            where = self._file(code.co_filename)
            if where is not None:
                self.events.append((event, where, _qualname(code), None))
        elif event == "c_return" and code is _PUBLISH and arg is os.replace:
            file = frame.f_locals.get("file")
            if isinstance(file, tuple) and file[0] == "mdc" and file[1] not in self.known_cards:
                self.renamed = f"v1/mdc/{file[1]}"
                where = self._file(code.co_filename)
                assert where is not None
                self.events.append(("rename", where, _qualname(code), None))
                self.done = True

    def _caller(self, frame: FrameType) -> str:
        """The package file of the nearest package frame below ``frame`` ("": none, the loop)."""
        below = frame.f_back
        while below is not None:
            where = self._file(below.f_code.co_filename)
            if where is not None:
                return where
            below = below.f_back
        return ""

    def finished(self) -> bool:
        return self.done

    def _is_ours(self, frame: FrameType) -> bool:
        local = frame.f_locals
        subject = local.get("subject")
        if subject is None:  # on_message(self, msg)
            msg = local.get("msg")
            subject = getattr(msg, "subject", "")
        if isinstance(subject, str):
            subject = subject.encode()
        return isinstance(subject, bytes) and subject.endswith(self.key)


def path_of(events: Sequence[tuple[str, ...]]) -> dict[str, Any]:
    """Files in first-entry order, stays (runs in one file), returns and re-entries.

    An event is (event, file, function[, caller]); a call's caller is the package file below
    it ("" for the event loop). A stay in a file already left is a re-entry when it begins with
    a call from another file or from the loop, else a return to the caller.
    """
    files: list[str] = []
    stays: list[str] = []
    # Each stay's file and the functions it entered (a resumed coroutine counts as entered).
    entered: list[tuple[str, list[str]]] = []
    # How each stay began: "first" (the file's first), "return", "call" or "wake".
    entries: list[str] = []
    reentries: list[dict[str, Any]] = []
    for event, where, name, *rest in events:
        if not stays or stays[-1] != where:
            caller = rest[0] if rest else (stays[-1] if stays else "")
            if where not in files:
                files.append(where)
                entry = "first"
            elif event != "call" or caller == where:
                entry = "return"
            else:
                entry = "call" if caller else "wake"
                reentries.append(
                    {"stay": len(stays) + 1, "file": where, "function": name, "from": caller}
                )
            stays.append(where)
            entered.append((where, []))
            entries.append(entry)
        if event == "call" and name not in entered[-1][1]:
            entered[-1][1].append(name)
    returns = sum(1 for i, where in enumerate(stays) if where in stays[:i])
    return {
        "files": files,
        "file_count": len(files),
        "stays": len(stays),
        "returns": returns,
        "returns_to_caller": returns - len(reentries),
        "reentries": len(reentries),
        "woken": sum(1 for r in reentries if not r["from"]),
        "events": len(events),
        "stay_files": stays,
        "stays_per_file": {f: stays.count(f) for f in files},
        "stay_calls": entered,
        "stay_entries": entries,
        "reentry_list": reentries,
        "reentries_per_file": {
            f: sum(1 for r in reentries if r["file"] == f)
            for f in files
            if any(r["file"] == f for r in reentries)
        },
        "first": list(events[0][:3]) if events else None,
        "last": list(events[-1][:3]) if events else None,
    }


def _endpoint_of(index: int, new_model: bool) -> EndpointId:
    # A new model's worker serves in a namespace of its own.
    return EndpointId(f"putpath{index}", "backend", "generate") if new_model else EP


def _record(index: int, new_model: bool = False) -> tuple[str, bytes]:
    """A worker's card record: of the committed WorkerSet's model, or of a model of its own."""
    card = CARD
    if new_model:
        name = f"{CARD['display_name']}-{index}"
        card = dict(CARD, display_name=name, slug=f"{CARD['slug']}-{index}", source_path=name)
    text = json.dumps(card, separators=(",", ":"))
    ep = _endpoint_of(index, new_model)
    return model_kv_key(ep, index), encode_model_record(ep, index, text)


def _endpoint(index: int, new_model: bool = False) -> tuple[str, bytes]:
    """A worker's endpoint record: the worker is live (its card then makes it routable)."""
    ep = _endpoint_of(index, new_model)
    return endpoint_kv_key(ep, index), encode_endpoint_record(ep, index)


def _holds(folder: Path, count: int) -> Callable[[], bool]:
    """Whether ``folder`` holds at least ``count`` files."""
    return lambda: folder.is_dir() and len(os.listdir(folder)) >= count


async def _wait(condition: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {seconds:g} s")
        await asyncio.sleep(0.01)


async def profile(
    url: str,
    scratch: Path,
    puts: int = 3,
    warmup: int = 2,
    base: int = 2,
    new_model: bool = False,
) -> dict[str, Any]:
    """Profile ``puts`` puts, one at a time, on a service against the server at ``url``.

    Each is a new worker's card joining the committed WorkerSet or, with ``new_model``, the
    first worker of a model of its own (reserved, built and committed before its card file).
    """
    bucket = f"putpath-{uuid.uuid4().hex[:8]}"
    view_dir = scratch / "view"
    view_dir.mkdir(parents=True)
    cards = view_dir / "v1" / "mdc"
    client = await nats.connect(url)
    service = None
    results: list[dict[str, Any]] = []
    try:
        kv = (await ensure_bucket(client.jetstream(), BucketSpec(name=bucket))).kv
        for i in range(1, base + 1):
            await kv.put(*_endpoint(i))
            await kv.put(*_record(i))
        settings = Settings(
            nats_servers=(url,),
            discovery_bucket=bucket,
            admission_bucket=f"{bucket}-adm",
            view_dir=view_dir,
            frontend_id="put-path",
        )
        service = await create_service(settings)
        await _wait(_holds(cards, base), 30, "the WorkerSet committed, its cards in the view")
        index = base
        for _ in range(warmup):
            index += 1
            await kv.put(*_endpoint(index))
            await kv.put(*_record(index))
            await _wait(_holds(cards, index), 10, "a warm-up put")
        for _ in range(puts):
            index += 1
            await kv.put(*_endpoint(index, new_model))
            await asyncio.sleep(0.3)  # the last pass, its publication and their logs are done
            key, value = _record(index, new_model)
            recorder = Recorder(key.encode(), frozenset(os.listdir(cards)))
            sys.setprofile(recorder.hook)
            try:
                await kv.put(key, value)
                await _wait(recorder.finished, 10, "the card file's rename")
            finally:
                sys.setprofile(None)
            result = path_of(recorder.events)
            result["key"] = key
            result["card_file"] = recorder.renamed
            results.append(result)
    finally:
        if service is not None:
            await service.stop()
        await client.close()
    best = min(results, key=lambda r: r["events"])
    same = sum(1 for r in results if r["stay_files"] == best["stay_files"])
    return {
        "package": PACKAGE,
        "put": "a new model's first worker" if new_model else "a worker joining its WorkerSet",
        "python": sys.version.split()[0],
        "puts": len(results),
        "same_path": same,
        "per_put": [
            {k: r[k] for k in ("key", "file_count", "stays", "returns", "reentries", "events")}
            for r in results
        ],
        **best,
    }


def report(result: dict[str, Any], with_stays: bool = False) -> str:
    reentered = result["reentries_per_file"]
    lines = [
        f"one discovery put ({result['put']}), from the watch's handler to the card file's "
        f"rename ({result['card_file']}), package at {result['package']}:",
        f"  files crossed: {result['file_count']}",
    ]
    for n, where in enumerate(result["files"], 1):
        again = f", {reentered[where]} re-entered" if where in reentered else ""
        lines.append(f"    {n:2}. {where}  ({result['stays_per_file'][where]} stay(s){again})")
    lines += [
        f"  stays: {result['stays']}",
        f"  returns to a file already left: {result['returns']} "
        f"({result['returns_to_caller']} to the caller, {result['reentries']} re-entries)",
        f"  re-entries: {result['reentries']} ({result['reentries'] - result['woken']} called "
        f"from another file, {result['woken']} woken by the event loop)",
        f"  events: {result['events']} (first {' '.join(result['first'])}; "
        f"last {' '.join(result['last'])})",
        f"  {result['same_path']} of {result['puts']} puts took this path; per put "
        + ", ".join(
            f"{p['file_count']} files/{p['stays']} stays/{p['returns']} returns/"
            f"{p['reentries']} re-entries"
            for p in result["per_put"]
        ),
    ]
    if with_stays:
        lines.append(
            "  the stays in order, how each began (+: the file's first; <: a return to the "
            "caller; !: a re-entry, with the file it was called from, or the event loop that "
            "woke it), with the functions each entered:"
        )
        callers = {r["stay"]: r["from"] for r in result["reentry_list"]}
        marks = {"first": "+", "return": "<"}
        for n, ((where, names), entry) in enumerate(
            zip(result["stay_calls"], result["stay_entries"], strict=True), 1
        ):
            mark = marks.get(entry, "!")
            came = f" (from {callers[n] or 'the event loop'})" if n in callers else ""
            entered = ", ".join(names) or "(returns only)"
            lines.append(f"    {n:3}. {mark} {where}{came}: {entered}")
    return "\n".join(lines)


async def main(options: argparse.Namespace) -> dict[str, Any]:
    scratch = Path(tempfile.mkdtemp(prefix="put-path-"))
    server = None
    try:
        url = options.url
        if url is None:
            server = EmbeddedNatsServer(scratch / "jetstream")
            server.start()
            url = server.url
        return await profile(
            url, scratch, options.puts, options.warmup, new_model=options.new_model
        )
    finally:
        if server is not None:
            server.close()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a running nats-server (default: start one on loopback)")
    parser.add_argument("--puts", type=int, default=3, help="puts profiled, one at a time")
    parser.add_argument("--warmup", type=int, default=2, help="joining puts before those")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--stays", action="store_true", help="also list every stay")
    parser.add_argument(
        "--new-model", action="store_true", help="profile a new model's first worker instead"
    )
    options = parser.parse_args()
    if options.puts < 1 or options.warmup < 0:
        parser.error("--puts must be at least 1 and --warmup at least 0")
    result = asyncio.run(main(options))
    print(json.dumps(result, indent=2) if options.json else report(result, options.stays))
