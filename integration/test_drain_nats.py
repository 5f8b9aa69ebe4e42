"""``drain`` and ``undrain`` end to end: a real nats-server, a real ``serve``, the real commands.

The story: incumbent A has two workers and B (another configuration) waits. Draining one A
worker takes it out at once; draining the last A worker hands over: ``drain --wait`` answers
only once the frontend serves B. ``undrain`` gives the A worker back behind B. Bad input
(an unknown instance, a hand-written malformed drain record) changes nothing.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import nats
import pytest
from natsfixture import NatsServer
from support.buckets import live_keys
from support.cards import base_card
from workerset_admission.adapters.nats.registrar import WorkerRegistrar
from workerset_admission.identity import EndpointId
from workerset_admission.keys import drain_kv_key

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

CLI = [sys.executable, "-m", "workerset_admission.cli"]
EP = EndpointId("dgd", "backend", "generate")
A1, A2, B1 = 0xA1, 0xA2, 0xB1


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


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture
def serve(buckets: list[str], tmp_path: Path) -> Iterator[list[str]]:
    subject = f"status-{uuid.uuid4().hex[:8]}"
    with (tmp_path / "serve.log").open("w") as log:
        process = subprocess.Popen(
            [*CLI, "serve", *buckets, "--frontend-id", "fe-1", "--status-subject", subject],
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
        try:
            yield ["--nats-server", buckets[1], "--status-subject", subject]
        finally:
            process.terminate()
            process.wait(timeout=20)


def status(flags: list[str]) -> dict[str, Any]:
    answer = run("status", *flags, "--json")
    assert answer.returncode == 0, answer.stderr
    result: dict[str, Any] = json.loads(answer.stdout)
    return result


def status_until(flags: list[str], done: Any, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        try:
            answer = status(flags)
        except AssertionError:
            answer = {}
        if answer and done(answer):
            return answer
        assert time.monotonic() < deadline, answer
        time.sleep(0.2)


def group(answer: dict[str, Any]) -> dict[str, Any]:
    (only,) = answer["groups"]
    result: dict[str, Any] = only
    return result


async def register(url: str, bucket: str, *workers: tuple[int, int]) -> None:
    nc = await nats.connect(url)
    try:
        publisher = WorkerRegistrar(nc.jetstream(), bucket=bucket, ttl=None)
        for instance, block_size in workers:
            await publisher.register(EP, instance, base_card(block_size))
            await publisher.register_endpoint(
                EP, instance, transport={"tcp": f"10.0.0.{instance & 0xF}:4000/x"}
            )
    finally:
        await nc.close()


async def drain_ttl(url: str, bucket: str, key: str) -> str | None:
    """The per-key TTL the server keeps the drain record under (its ``Nats-TTL`` header)."""
    nc = await nats.connect(url)
    try:
        msg = await nc.jetstream().get_last_msg(f"KV_{bucket}", f"$KV.{bucket}.{key}")
        return (msg.headers or {}).get("Nats-TTL")
    finally:
        await nc.close()


async def bucket_keys(url: str, bucket: str) -> list[str]:
    nc = await nats.connect(url)
    try:
        kv = await nc.jetstream().key_value(bucket)
        return await live_keys(kv)
    finally:
        await nc.close()


def test_drain_takes_a_worker_out_hands_over_at_the_last_one_and_undrain_gives_it_back(
    nats_server: NatsServer, buckets: list[str], serve: list[str]
) -> None:
    discovery = buckets[3]
    asyncio.run(register(nats_server.url, discovery, (A1, 16), (A2, 16), (B1, 32)))
    ready = status_until(serve, lambda s: s["groups"] and group(s)["status"] == "ready")
    incumbent = group(ready)["incumbent"]
    assert group(ready)["admitted"] == [A1, A2]

    # One of two A workers, named by id in hex: out of routing, nothing else changes.
    drained = run("drain", f"0x{A1:x}", "--wait", "--json", "--by", "ops", *buckets)
    assert drained.returncode == 0, drained.stderr
    answer = json.loads(drained.stdout)
    assert answer["safe"] is True
    assert answer["frontends"] == [{"frontend": "fe-1", "confirmed": True, "still_serving": []}]
    now = group(status(serve))
    assert (now["incumbent"], now["admitted"]) == (incumbent, [A2])
    assert [(d["instance_id"], d["by"]) for d in now["drained"]] == [(A1, "ops")]
    # The record outlives its worker by the drain's TTL at most (an hour by default).
    assert asyncio.run(drain_ttl(nats_server.url, discovery, drain_kv_key("dgd", A1))) == "3600"

    # The last A worker, named by host as a preStop hook would: B succeeds, and --wait
    # returns only once B serves.
    drained = run("drain", "--host", f"10.0.0.{A2 & 0xF}", "--wait", "--json", *buckets)
    assert drained.returncode == 0, drained.stderr
    now = group(status(serve))
    assert now["incumbent"] != incumbent
    assert (now["status"], now["admitted"]) == ("ready", [B1])

    # Given back, the A worker rejoins behind B as a returning cohort member.
    undrained = run("undrain", str(A2), *buckets[:4])
    assert undrained.returncode == 0, undrained.stderr
    back = status_until(serve, lambda s: len(group(s)["cohorts"]) == 2)
    cohorts = group(back)["cohorts"]
    assert [c["members"] for c in cohorts] == [[B1], [A2]]
    assert group(back)["admitted"] == [B1]


def test_drain_refuses_an_unknown_worker_and_writes_nothing(
    nats_server: NatsServer, buckets: list[str]
) -> None:
    discovery = buckets[3]
    asyncio.run(register(nats_server.url, discovery, (A1, 16)))
    refused = run("drain", "0x1234", "--wait", "--timeout", "5", *buckets)
    assert refused.returncode == 2
    assert "no worker 0x1234 is registered in the discovery bucket" in refused.stderr
    bad = run("drain", "zz", *buckets)
    assert bad.returncode == 2
    assert "is not an instance id" in bad.stderr
    keys = asyncio.run(bucket_keys(nats_server.url, discovery))
    assert not [k for k in keys if k.startswith("v1.drain.")]


def test_a_malformed_drain_record_is_refused_and_the_worker_stays_admitted(
    nats_server: NatsServer, buckets: list[str], serve: list[str]
) -> None:
    discovery = buckets[3]
    asyncio.run(register(nats_server.url, discovery, (A1, 16)))
    status_until(serve, lambda s: s["groups"] and group(s)["status"] == "ready")

    async def forge() -> None:
        nc = await nats.connect(nats_server.url)
        try:
            kv = await nc.jetstream().key_value(discovery)
            # Names another worker in its value than in its key; and one that is not JSON.
            await kv.put(
                drain_kv_key(EP.namespace, A1),
                json.dumps({"type": "Drain", "namespace": "dgd", "instance_id": 7}).encode(),
            )
            await kv.put(drain_kv_key("dgd", 0xFF), b"{not json")
        finally:
            await nc.close()

    asyncio.run(forge())
    answer = status_until(serve, lambda s: s["invalid_total"] >= 2)
    reasons = {r["key"]: r["reason"] for r in answer["recent_invalid"]}
    assert reasons[drain_kv_key(EP.namespace, A1)] == "identity_mismatch"
    assert reasons[drain_kv_key("dgd", 0xFF)] == "invalid_json"
    assert group(answer)["admitted"] == [A1]
    assert group(answer)["drained"] == []


def test_drain_wait_on_a_worker_no_frontend_admits_returns_at_once(
    nats_server: NatsServer, buckets: list[str], serve: list[str]
) -> None:
    asyncio.run(register(nats_server.url, buckets[3], (A1, 16), (B1, 32)))
    status_until(serve, lambda s: s["groups"] and group(s)["status"] == "ready")
    started = time.monotonic()
    drained = run("drain", str(B1), "--wait", *buckets)
    assert drained.returncode == 0, drained.stderr
    assert "safe to stop" in drained.stdout
    assert time.monotonic() - started < 10


def test_drain_wait_on_a_frontend_that_died_reports_it_unconfirmed_when_its_records_expire(
    nats_server: NatsServer, buckets: list[str]
) -> None:
    discovery, admission = buckets[3], buckets[5]
    record_age = 3.0

    async def a_frontend_that_died() -> None:
        # Its last words: it served the worker. Nobody rewrites the record now.
        nc = await nats.connect(nats_server.url)
        try:
            js = nc.jetstream()
            await js.create_key_value(bucket=admission, history=1, ttl=record_age)
            kv = await js.key_value(admission)
            member = f"{EP.namespace}/{EP.component}/{EP.endpoint}/{A1:x}"
            await kv.put(
                "v1.fe-gone.capability",
                json.dumps({"protocol": "v1", "frontend": "fe-gone", "capability": True}).encode(),
            )
            await kv.put(
                f"v1.fe-gone.members.{EP.namespace}",
                json.dumps(
                    {
                        "protocol": "v1",
                        "frontend": "fe-gone",
                        "namespace": EP.namespace,
                        "members": [member],
                    }
                ).encode(),
            )
        finally:
            await nc.close()

    asyncio.run(register(nats_server.url, discovery, (A1, 16)))
    asyncio.run(a_frontend_that_died())
    started = time.monotonic()
    # The dead frontend's last record says it served the model by A1 alone: draining it needs
    # --allow-empty (the frontend is live until its records expire).
    drained = run(
        "drain", str(A1), "--wait", "--json", "--timeout", "30", "--allow-empty", *buckets
    )
    took = time.monotonic() - started
    # It never said it let A1 go: it may still route to it. Not safe, a status of its own.
    assert drained.returncode == 7, drained.stderr
    assert "waiting for fe-gone" in drained.stderr
    assert "unconfirmed: fe-gone went away without confirming" in drained.stderr
    answer = json.loads(drained.stdout)
    assert (answer["frontends"], answer["unconfirmed"], answer["safe"]) == ([], ["fe-gone"], False)
    assert asyncio.run(bucket_keys(nats_server.url, discovery)).count(drain_kv_key("dgd", A1)) == 1
    # The answer comes when the dead frontend's records expire (the bucket's max age; 60 s
    # for the serving-admission bucket serve creates), not before and not much after.
    print(f"\n[drain] a dead frontend's records expired; drain --wait answered after {took:.2f} s")
    assert record_age - 0.5 <= took <= record_age + 5.0


def test_a_recording_carries_the_drain_and_its_replay_shows_it(
    nats_server: NatsServer, buckets: list[str], serve: list[str], tmp_path: Path
) -> None:
    asyncio.run(register(nats_server.url, buckets[3], (A1, 16), (A2, 16)))
    status_until(serve, lambda s: s["groups"] and group(s)["status"] == "ready")
    trace = tmp_path / "trace.jsonl"
    recorder = subprocess.Popen(
        [*CLI, "record", *buckets, *serve[2:], "--duration", "6", "-o", str(trace)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(2.0)  # the recording has begun
        drained = run("drain", str(A2), "--by", "ops", *buckets)
        assert drained.returncode == 0, drained.stderr
        _out, err = recorder.communicate(timeout=60)
    finally:
        if recorder.poll() is None:
            recorder.kill()
            recorder.wait(10)
    assert recorder.returncode == 0, err
    assert any('"v1.drain.dgd.a2"' in line for line in trace.read_text().splitlines())
    replayed = run("replay", str(trace))
    assert replayed.returncode == 0, replayed.stderr
    (only,) = json.loads(replayed.stdout)["groups"]
    assert only["admitted"] == [A1]
    assert [(d["instance_id"], d["by"]) for d in only["drained"]] == [(A2, "ops")]


# -- the last routable worker, a namespace at once, bounded input (on the admitted view) ------

OLD_EP, NEW_EP = EndpointId("old", "backend", "generate"), EndpointId("new", "backend", "generate")


@pytest.fixture
def serve_view(buckets: list[str], tmp_path: Path) -> Iterator[tuple[list[str], Path]]:
    """``serve --view-dir``: the status flags, and the view folder the frontend would read."""
    subject = f"status-{uuid.uuid4().hex[:8]}"
    view = tmp_path / "view"
    view.mkdir()
    with (tmp_path / "serve-view.log").open("w") as log:
        process = subprocess.Popen(
            [*CLI, "serve", *buckets, "--frontend-id", "fe-1", "--status-subject", subject,
             "--view-dir", str(view)],
            stdout=subprocess.DEVNULL,
            stderr=log,
        )  # fmt: skip
        try:
            yield ["--nats-server", buckets[1], "--status-subject", subject], view
        finally:
            process.terminate()
            process.wait(timeout=20)


def view_cards(view: Path) -> set[tuple[str, int]]:
    """(namespace, instance id) of every model card in the view right now."""
    folder = view / "v1" / "mdc"
    names = [] if not folder.exists() else os.listdir(folder)
    found = set()
    for name in names:
        parts = unquote(name).split("/")
        if not name.startswith(".") and len(parts) == 4:
            found.add((parts[0], int(parts[3], 16)))
    return found


def wait_for(check: Any, what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


async def register_at(url: str, bucket: str, endpoint: EndpointId, *instances: int) -> None:
    nc = await nats.connect(url)
    try:
        publisher = WorkerRegistrar(nc.jetstream(), bucket=bucket, ttl=None)
        for instance in instances:
            await publisher.register(endpoint, instance, base_card(16))
            await publisher.register_endpoint(
                endpoint, instance, transport={"tcp": f"10.1.0.{instance & 0xFF}:4000/generate"}
            )
    finally:
        await nc.close()


def drain_keys(url: str, bucket: str) -> list[str]:
    return [k for k in asyncio.run(bucket_keys(url, bucket)) if k.startswith("v1.drain.")]


def test_the_last_routable_worker_is_refused_and_allow_empty_drains_it(
    nats_server: NatsServer, buckets: list[str], serve_view: tuple[list[str], Path]
) -> None:
    flags, view = serve_view
    discovery = buckets[3]
    asyncio.run(register_at(nats_server.url, discovery, EP, A1))
    wait_for(lambda: view_cards(view) == {("dgd", A1)}, "A1's card in the view")
    status_until(flags, lambda s: s["groups"] and group(s)["status"] == "ready")
    # The frontend's serving record must list A1 before the drain asks it.
    time.sleep(1.0)

    refused = run("drain", f"0x{A1:x}", "--wait", "--timeout", "10", *buckets)
    assert refused.returncode == 6, refused.stderr
    (line,) = refused.stderr.splitlines()
    model = base_card(16)["display_name"]
    assert line.startswith("workerset-admission drain: refused: ")
    assert f"model {model} would be left with no routable worker on frontend fe-1" in line
    assert "nothing was drained" in line
    assert drain_keys(nats_server.url, discovery) == []
    time.sleep(1.0)
    assert view_cards(view) == {("dgd", A1)}

    drained = run("drain", f"0x{A1:x}", "--allow-empty", "--wait", "--timeout", "30", *buckets)
    assert drained.returncode == 0, drained.stderr
    assert f"--allow-empty: model {model}" in drained.stderr
    assert drain_keys(nats_server.url, discovery) == [drain_kv_key("dgd", A1)]
    wait_for(lambda: view_cards(view) == set(), "A1's card leaves the view")


def test_a_namespace_drains_at_once_and_leaves_only_the_new_namespace_in_the_view(
    nats_server: NatsServer, buckets: list[str], serve_view: tuple[list[str], Path]
) -> None:
    flags, view = serve_view
    discovery = buckets[3]
    asyncio.run(register_at(nats_server.url, discovery, OLD_EP, 1, 2))
    asyncio.run(register_at(nats_server.url, discovery, NEW_EP, 3, 4))
    everything = {("old", 1), ("old", 2), ("new", 3), ("new", 4)}
    wait_for(lambda: view_cards(view) == everything, "both namespaces in the view")
    status_until(
        flags, lambda s: len(s["groups"]) == 2 and all(g["status"] == "ready" for g in s["groups"])
    )
    time.sleep(1.0)

    drained = run(
        "drain", "--namespace", "old", "--all", "--wait", "--timeout", "60", "--json", *buckets
    )
    assert drained.returncode == 0, drained.stderr
    answer = json.loads(drained.stdout)
    assert answer["safe"] is True
    assert sorted(w["instance_id"] for w in answer["workers"]) == [1, 2]
    assert answer["lost_models"] == []
    assert view_cards(view) == {("new", 3), ("new", 4)}
    assert drain_keys(nats_server.url, discovery) == [
        drain_kv_key("old", 1),
        drain_kv_key("old", 2),
    ]
    # status --workers says the same in upstream's words.
    listed = run("status", *flags, "--workers", "--json")
    assert listed.returncode == 0, listed.stderr
    states = {
        (row["namespace"], row["instance_id"]): (row["admission"], row["serving_state"])
        for row in json.loads(listed.stdout)["workers"]
    }
    assert states == {
        ("old", 1): ("drained", "drained"),
        ("old", 2): ("drained", "drained"),
        ("new", 3): ("admitted", "serving"),
        ("new", 4): ("admitted", "serving"),
    }
    table = run("status", *flags, "--workers")
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[0].split()[-2:] == ["ADMISSION", "STATE"]

    # The new namespace alone is now the model's last: draining it all is refused.
    refused = run("drain", "--namespace", "new", "--all", *buckets)
    assert refused.returncode == 6, refused.stderr
    # undrain takes the same selectors.
    undrained = run("undrain", "--namespace", "old", "--all", *buckets[:4])
    assert undrained.returncode == 0, undrained.stderr
    assert drain_keys(nats_server.url, discovery) == []


def test_a_300_character_by_is_refused_and_nothing_is_written(
    nats_server: NatsServer, buckets: list[str]
) -> None:
    discovery = buckets[3]
    asyncio.run(register(nats_server.url, discovery, (A1, 16), (A2, 16)))
    refused = run("drain", str(A1), "--by", "x" * 300, *buckets)
    assert refused.returncode == 2
    (line,) = refused.stderr.splitlines()
    assert "argument --by: at most 256 characters, not 300" in line
    for argv in (["--ttl", "-5"], ["--grace", "-1"], ["--host", "10.0.0.1"]):
        bad = run("drain", str(A1), *argv, *buckets)
        assert bad.returncode == 2, (argv, bad.stderr)
        assert len(bad.stderr.splitlines()) == 1
    assert drain_keys(nats_server.url, discovery) == []


@pytest.mark.rollout  # a minute's wait for a heartbeat to expire: the slower tier
def test_a_frontend_stopped_while_a_drain_waits_is_reported_unconfirmed_never_safe(
    nats_server: NatsServer, buckets: list[str], tmp_path: Path
) -> None:
    """A real frontend frozen (SIGSTOP: alive, routing, silent on NATS) mid-drain."""
    discovery, admission = buckets[3], buckets[5]
    frontends = []
    for name in ("fe-1", "fe-2"):
        with (tmp_path / f"{name}.log").open("w") as log:
            frontends.append(
                subprocess.Popen(
                    [
                        *CLI,
                        "serve",
                        *buckets,
                        "--frontend-id",
                        name,
                        "--status-subject",
                        f"status-{uuid.uuid4().hex[:8]}",
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=log,
                )
            )
    try:
        asyncio.run(register(nats_server.url, discovery, (A1, 16), (A2, 16)))

        def both_serve() -> bool:
            keys = asyncio.run(bucket_keys_or_none(nats_server.url, admission))
            return {"v1.fe-1.members.dgd", "v1.fe-2.members.dgd"} <= set(keys)

        deadline = time.monotonic() + 30
        while not both_serve():
            assert time.monotonic() < deadline
            time.sleep(0.2)
        time.sleep(1.0)
        frontends[1].send_signal(signal.SIGSTOP)  # cut off: it still holds A1 in its routing
        started = time.monotonic()
        drained = run("drain", str(A1), "--wait", "--json", "--timeout", "120", *buckets,
                      timeout=150)  # fmt: skip
        took = time.monotonic() - started
        assert drained.returncode == 7, drained.stderr
        answer = json.loads(drained.stdout)
        assert answer["unconfirmed"] == ["fe-2"]
        assert answer["safe"] is False
        assert [f["frontend"] for f in answer["frontends"] if f["confirmed"]] == ["fe-1"]
        assert "waiting for fe-2" in drained.stderr
        print(f"\n[drain] a frozen frontend's records expired: unconfirmed after {took:.1f} s")
    finally:
        frontends[1].send_signal(signal.SIGCONT)
        for process in frontends:
            process.terminate()
            process.wait(timeout=20)


async def bucket_keys_or_none(url: str, bucket: str) -> list[str]:
    try:
        return await bucket_keys(url, bucket)
    except Exception:
        return []
