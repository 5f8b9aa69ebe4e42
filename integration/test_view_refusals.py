"""What the core refuses never reaches the admitted view: a real nats-server, real ``serve`` views.

Each story runs a long-running ``serve --view-dir`` while the bucket changes under it, checks
its view file by file and byte by byte, then starts a second ``serve`` afresh on the same bucket
and compares the two directories:

* a worker's card re-put under its key with another checksum (``kv_cache_block_size``),
  another model or another worker type: the core refuses the in-place change and keeps the
  first incarnation, and so does the view: not a byte of the refused card is published;
* LoRA adapter cards whose projection the core refuses (one adapter name at two capacities,
  the group ``blocked_ready``): the refused card never reaches the view;
* view files replaced from outside while ``serve`` runs (in place, and by a rename keeping the
  size) are written again, and the view then equals a fresh start's;
* and what is not refused: an endpoint record put again for the same instance id with another
  transport address (a failover shadow taking the id) is the same worker at a new address.

A fresh start judges the bucket as it is now, never having seen a first incarnation or a
projection served before the refusal: where the core's own decisions differ (it keeps the
first incarnation, or the last projection it accepted), the views differ in exactly those
files, and the tests name them; every other file is the same, byte for byte.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import nats
import pytest
from natsfixture import NatsServer
from support.cards import base_card, lora_card
from workerset_admission.adapters.nats.registrar import WorkerRegistrar
from workerset_admission.card import encode_endpoint_record, encode_model_record
from workerset_admission.identity import EndpointId

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

CLI = [sys.executable, "-m", "workerset_admission.cli"]
EP = EndpointId("dgd", "backend", "generate")
A1, A2 = 0xA1, 0xA2
Files = dict[str, bytes]


@pytest.fixture
def buckets(nats_server: NatsServer) -> list[str]:
    suffix = uuid.uuid4().hex[:8]
    return [
        "--nats-server",
        nats_server.url,
        "--discovery-bucket",
        f"disc-{suffix}",
        "--admission-bucket",
        f"adm-{suffix}",
    ]


@contextlib.contextmanager
def serving(buckets: list[str], folder: Path, frontend: str) -> Iterator[Path]:
    """A ``serve --view-dir`` process for the block; yields its view folder."""
    view = folder / f"view-{frontend}"
    view.mkdir()
    with (folder / f"serve-{frontend}.log").open("w") as log:
        process = subprocess.Popen(
            [*CLI, "serve", *buckets, "--frontend-id", frontend, "--status-subject",
             f"status-{uuid.uuid4().hex[:8]}", "--view-dir", str(view)],
            stdout=subprocess.DEVNULL,
            stderr=log,
        )  # fmt: skip
        try:
            yield view
        finally:
            process.terminate()
            process.wait(timeout=20)


def files(view: Path) -> Files:
    """Every record file of the view: its path under ``v1`` (unquoted), and its bytes."""
    out = {}
    root = view / "v1"
    for folder in root.iterdir() if root.exists() else ():
        for name in os.listdir(folder):
            if not name.startswith("."):
                with contextlib.suppress(FileNotFoundError):
                    out[f"{folder.name}/{unquote(name)}"] = (folder / name).read_bytes()
    return out


def settled(view: Path, check: Callable[[Files], bool], what: str, timeout: float = 30) -> Files:
    """Wait until the view satisfies ``check`` and stays unchanged for a second; return it."""
    deadline = time.monotonic() + timeout
    last: Files | None = None
    since = time.monotonic()
    while True:
        now = files(view)
        if now != last:
            last, since = now, time.monotonic()
        elif check(now) and time.monotonic() - since >= 1.0:
            return now
        assert time.monotonic() < deadline, f"{what}: {sorted(now)}"
        time.sleep(0.1)


def card(instance: int, suffix: str | None = None) -> str:
    tail = f"/{suffix}" if suffix else ""
    return f"mdc/{EP.namespace}/{EP.component}/{EP.endpoint}/{instance:x}{tail}"


Card = tuple[int, dict[str, Any], str | None]


async def _register(url: str, bucket: str, cards: list[Card]) -> None:
    nc = await nats.connect(url)
    try:
        registrar = WorkerRegistrar(nc.jetstream(), bucket=bucket, ttl=None)
        for instance, body, suffix in cards:
            await registrar.register(EP, instance, body, suffix)
            if suffix is None:
                await registrar.register_endpoint(
                    EP, instance, transport={"tcp": f"10.0.0.{instance & 0xF}:4000/x"}
                )
    finally:
        await nc.close()


def register(url: str, bucket: str, *cards: Card) -> None:
    asyncio.run(_register(url, bucket, list(cards)))


def value(instance: int, body: dict[str, Any], suffix: str | None = None) -> bytes:
    return encode_model_record(EP, instance, body, suffix)


def fresh_view(buckets: list[str], folder: Path, check: Callable[[Files], bool]) -> Files:
    with serving(buckets, folder, "fe-fresh") as view:
        return settled(view, check, "the fresh view")


@pytest.mark.parametrize("change", ["checksum", "model", "worker_type"])
def test_a_card_re_put_with_another_checksum_or_model_keeps_its_first_bytes(
    nats_server: NatsServer, buckets: list[str], tmp_path: Path, change: str
) -> None:
    url, discovery = nats_server.url, buckets[3]
    first = base_card(16)
    offered = {
        "checksum": base_card(32),  # kv_cache_block_size
        "model": base_card(16, display_name="Qwen/Qwen3-8B", slug="qwen_qwen3-8b"),
        "worker_type": base_card(16, worker_type="decode"),
    }[change]
    register(url, discovery, (A1, first, None), (A2, first, None))
    with serving(buckets, tmp_path, "fe-long") as view:
        before = settled(view, lambda f: {card(A1), card(A2)} <= f.keys(), "both cards")
        assert before[card(A1)] == value(A1, first)

        for _ in range(3):
            register(url, discovery, (A1, offered, None))
            time.sleep(0.5)
        after = settled(view, lambda f: card(A2) in f, "the view after the re-puts")
        assert after == before, "a refused in-place change reached the view"
        assert value(A1, offered) not in after.values()

        # A fresh start never saw the first incarnation: it judges A1's card as it is now.
        # Another checksum is another configuration than the incumbent's, left out; another
        # model or worker type is a WorkerSet of its own, admitted. Beside A1's card the two
        # views are the same, byte for byte.
        fresh = fresh_view(buckets, tmp_path, lambda f: card(A2) in f)
        if change == "checksum":
            assert card(A1) not in fresh
            a1 = {name for name in after if name.endswith(f"/{A1:x}")}
            assert {n: v for n, v in after.items() if n not in a1} == fresh
        else:
            assert fresh[card(A1)] == value(A1, offered)
            assert {n: v for n, v in after.items() if n != card(A1)} == {
                n: v for n, v in fresh.items() if n != card(A1)
            }
        assert files(view) == before


def test_an_adapter_card_whose_projection_is_refused_stays_out_of_the_view(
    nats_server: NatsServer, buckets: list[str], tmp_path: Path
) -> None:
    url, discovery = nats_server.url, buckets[3]
    base = base_card(16)
    register(url, discovery, (A1, base, None), (A2, base, None))
    with serving(buckets, tmp_path, "fe-long") as view:
        settled(view, lambda f: {card(A1), card(A2)} <= f.keys(), "both cards")
        register(url, discovery, (A1, lora_card("sql", 4), "sql"))
        served = settled(view, lambda f: card(A1, "sql") in f, "the adapter of A1")
        # The same adapter name at another capacity: one name, two sets of weights.
        register(url, discovery, (A2, lora_card("sql", 8), "sql"))
        time.sleep(1.0)
        after = settled(view, lambda f: card(A2) in f, "the view after the refused adapter")
        assert card(A2, "sql") not in after
        assert after == served

        # A fresh start judges both adapters at once: the projection is refused before any was
        # served, so it serves none. The long-running one keeps the last projection the core
        # accepted (A1's adapter, as the core keeps it while ``blocked_ready``); beside that
        # card the two views are the same, byte for byte.
        fresh = fresh_view(buckets, tmp_path, lambda f: card(A2) in f)
        assert card(A2, "sql") not in fresh
        assert card(A1, "sql") not in fresh
        assert {n: v for n, v in after.items() if n != card(A1, "sql")} == fresh


def test_a_view_file_altered_from_outside_is_written_again(
    nats_server: NatsServer, buckets: list[str], tmp_path: Path
) -> None:
    url, discovery = nats_server.url, buckets[3]
    register(url, discovery, (A1, base_card(16), None), (A2, base_card(16), None))
    with serving(buckets, tmp_path, "fe-long") as view:
        before = settled(view, lambda f: {card(A1), card(A2)} <= f.keys(), "both cards")
        path = next(p for p in (view / "v1" / "mdc").iterdir() if unquote(p.name) == card(A1)[4:])
        # Replaced in place with other content, and another file replaced by a rename.
        path.write_bytes(json.dumps({"type": "Model", "altered": True}).encode())
        other = next(p for p in (view / "v1" / "instances").iterdir() if p.name[0] != ".")
        spare = other.with_name(".spare")
        spare.write_bytes(b"x" * len(other.read_bytes()))
        os.replace(spare, other)

        healed = settled(view, lambda f: f == before, "the altered files written again", 15)
        assert healed == before
        fresh = fresh_view(buckets, tmp_path, lambda f: {card(A1), card(A2)} <= f.keys())
        assert fresh == healed


def instance(worker: int) -> str:
    return f"instances/{EP.namespace}/{EP.component}/{EP.endpoint}/{worker:x}"


async def _move(url: str, bucket: str, worker: int, address: str) -> None:
    nc = await nats.connect(url)
    try:
        registrar = WorkerRegistrar(nc.jetstream(), bucket=bucket, ttl=None)
        await registrar.register_endpoint(EP, worker, transport={"tcp": address})
    finally:
        await nc.close()


def test_an_instance_id_back_at_a_new_address_keeps_its_admission_with_the_new_address(
    nats_server: NatsServer, buckets: list[str], tmp_path: Path
) -> None:
    # A failover shadow takes A1's instance id at another address: its endpoint record is put
    # again under the same key with another transport. It is the same worker with a new
    # address: the view's instance file carries the new record, nothing else changes, and
    # nothing is refused.
    url, discovery = nats_server.url, buckets[3]
    register(url, discovery, (A1, base_card(16), None), (A2, base_card(16), None))
    with serving(buckets, tmp_path, "fe-long") as view:
        before = settled(
            view, lambda f: {card(A1), card(A2), instance(A1)} <= f.keys(), "both workers"
        )
        asyncio.run(_move(url, discovery, A1, "10.0.9.9:4100/shadow"))
        moved = encode_endpoint_record(EP, A1, {"tcp": "10.0.9.9:4100/shadow"})
        after = settled(view, lambda f: f.get(instance(A1)) == moved, "A1 at its new address")
        assert {n: v for n, v in after.items() if n != instance(A1)} == {
            n: v for n, v in before.items() if n != instance(A1)
        }
        assert before[instance(A1)] != moved
        # A fresh start on the bucket as it is now gives the same view, byte for byte.
        fresh = fresh_view(buckets, tmp_path, lambda f: f.get(instance(A1)) == moved)
        assert fresh == after
    # Nothing was refused on the way.
    log = (tmp_path / "serve-fe-long.log").read_text().lower()
    assert "refused" not in log, log[-2000:]
    assert "invalid" not in log, log[-2000:]
