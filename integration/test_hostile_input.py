"""Hostile or huge input through a real bucket: it hides no worker, blinds no operator.

A service runs with an admitted view on a real nats-server and a writer puts what a worker's
permissions let it put: names the view cannot hold, names that would make two keys one worker,
values that quote hundreds of kilobytes back in their refusal. Every case checks what an
operator and the frontend see: ``status`` answers, every routable worker is in the view, and
nothing is admitted that the view cannot name.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from natsfixture import NatsServer, restartable_server
from support.buckets import live_keys
from support.cards import lora_card
from support.fleet import (
    ADMISSION,
    DISCOVERY,
    NEW,
    OLD,
    Builder,
    admin,
    fresh_buckets,
    group_of,
    settings_for,
    until,
)
from support.serve_process import ServeProcess
from workerset_admission.adapters.dynamo.view import DirectoryFiles, file_name_for
from workerset_admission.card import encode_endpoint_record, encode_model_record
from workerset_admission.card.events import dynamo_event_path, parse_event_key
from workerset_admission.errors import DETAIL_LIMIT, InvalidRecordError
from workerset_admission.identity import EndpointId, instance_key
from workerset_admission.keys import STATUS_SUBJECT, escape_token, parse_key, unescape_token
from workerset_admission.service.admission_service import AdmissionService
from workerset_admission.wiring.compose import create_service

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


@contextlib.asynccontextmanager
async def serving_view(
    url: str, view_dir: Path, **overrides: Any
) -> AsyncIterator[AdmissionService]:
    """A service writing its admitted view into ``view_dir``; stopped on exit."""
    files = DirectoryFiles.open(view_dir)
    service = await create_service(
        settings_for(url, **overrides), builder=Builder(), view_files=files
    )
    try:
        await service.wait_synced(30)
        yield service
    finally:
        await service.stop()
        files.release()


def view_names(view_dir: Path) -> set[tuple[str, str]]:
    return {
        (path.parent.name, path.name)
        for path in (view_dir / "v1").glob("*/*")
        if not path.name.startswith(".")
    }


def routable_in_view(service: AdmissionService, view_dir: Path) -> list[str]:
    """Every routable worker's instance key the view holds no card or instance file for."""
    names = view_names(view_dir)
    missing = []
    for binding in service.bindings():
        endpoint = binding.id.group.endpoint
        for instance_id in binding.routable():
            name = file_name_for(instance_key(endpoint, instance_id))
            if not {("mdc", name), ("instances", name)} <= names:
                missing.append(instance_key(endpoint, instance_id))
    return missing


async def register(kv: Any, ep: EndpointId, instance_id: int) -> None:
    from workerset_admission.keys import endpoint_kv_key, model_kv_key

    await kv.put(endpoint_kv_key(ep, instance_id), encode_endpoint_record(ep, instance_id))
    await kv.put(model_kv_key(ep, instance_id), encode_model_record(ep, instance_id, OLD))


async def status_reply(nc: Any) -> dict[str, Any]:
    reply = await nc.request(STATUS_SUBJECT, b"", timeout=5)
    return json.loads(reply.data)


async def test_a_worker_the_view_cannot_name_is_refused_with_a_reason_and_never_routable(
    nats_server_fn: NatsServer, tmp_path: Path
) -> None:
    plain = EndpointId("ns-plain", "backend", "generate")
    # 250 bytes of namespace: the file name would be 265 bytes (ENAMETOOLONG).
    long_ns = EndpointId("n" * 250, "backend", "generate")
    async with admin(nats_server_fn.url) as nc:
        fleet = await fresh_buckets(nc)
        async with serving_view(nats_server_fn.url, tmp_path) as service:
            await register(fleet.kv, plain, 1)
            await register(fleet.kv, long_ns, 2)
            await until(
                lambda: len(service.status().recent_invalid) >= 2, 20, "both long keys refused"
            )
            await until(lambda: not routable_in_view(service, tmp_path), 20, "the view")
            snapshot = service.status()
            assert {g.group for g in snapshot.groups} == {group_of(plain)}
            assert {r.reason for r in snapshot.recent_invalid} == {"bad_key"}
            assert all("over the 255" in r.detail for r in snapshot.recent_invalid)
            routable = {i for b in service.bindings() for i in b.routable()}
            assert routable == {1}
            assert (await status_reply(nc))["invalid_total"] == 2


async def test_two_keys_that_would_be_one_worker_are_both_refused_and_nothing_is_withdrawn(
    nats_server_fn: NatsServer, tmp_path: Path
) -> None:
    # Namespace "dgd/backend" and namespace "dgd" with component "backend/generate" are both
    # the path dgd/backend/generate/x/1: one registration, one view file for two keys. A writer
    # of `v1.mdc.dgd.>` used to withdraw the other's worker by putting and deleting its own.
    neighbour = EndpointId("dgd", "backend", "generate")
    keys = ("v1.mdc.dgd=2Fbackend.generate.x.1", "v1.mdc.dgd.backend=2Fgenerate.x.1")
    async with admin(nats_server_fn.url) as nc:
        fleet = await fresh_buckets(nc)
        async with serving_view(nats_server_fn.url, tmp_path) as service:
            await register(fleet.kv, neighbour, 1)
            await until(
                lambda: {i for b in service.bindings() for i in b.routable()} == {1}, 20, "served"
            )
            await until(lambda: not routable_in_view(service, tmp_path), 20, "in the view")
            before = view_names(tmp_path)
            victim = EndpointId("dgd/backend", "generate", "x")
            await fleet.kv.put(keys[0], encode_model_record(victim, 1, OLD))
            forger = EndpointId("dgd", "backend/generate", "x")
            await fleet.kv.put(keys[1], encode_model_record(forger, 1, OLD))
            await fleet.kv.delete(keys[1])

            def refused() -> dict[str, str]:
                return {r.key: r.detail for r in service.status().recent_invalid}

            await until(lambda: set(keys) <= set(refused()), 20, "both keys refused")
            assert all("separator" in refused()[key] for key in keys)
            assert [g.group for g in service.status().groups] == [group_of(neighbour)]
            assert {i for b in service.bindings() for i in b.routable()} == {1}
            assert view_names(tmp_path) == before
            assert not routable_in_view(service, tmp_path)


async def test_one_huge_refused_value_leaves_status_answering_with_a_bounded_detail(
    nats_server_fn: NatsServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ep = EndpointId("ns-a", "backend", "generate")
    caplog.set_level(logging.DEBUG)
    async with admin(nats_server_fn.url) as nc:
        fleet = await fresh_buckets(nc)
        async with serving_view(nats_server_fn.url, tmp_path) as service:
            await register(fleet.kv, ep, 1)
            # The value claims an 800 KB namespace under the writer's own key: refused for
            # disagreeing with it, and the refusal used to quote the whole value.
            record = json.loads(encode_model_record(ep, 1, OLD))
            record["namespace"] = "x" * 800_000
            js = nc.jetstream()
            for n in range(3):
                key = f"v1.mdc.ns-a.backend.generate.{n + 10:x}"
                record["instance_id"] = n + 10
                await js.publish(f"$KV.{DISCOVERY}.{key}", json.dumps(record).encode())
            await until(lambda: service.status().invalid_total >= 3, 20, "refused")
            status = await status_reply(nc)
            assert status["invalid_total"] == 3
            assert status["groups"]
            for refused in status["recent_invalid"]:
                assert refused["reason"] == "identity_mismatch"
                assert len(refused["detail"]) < DETAIL_LIMIT + 40
            # A restarted service reads the same values back and still answers.
        async with serving_view(nats_server_fn.url, tmp_path) as service:
            await until(lambda: service.status().invalid_total >= 3, 20, "refused again")
            assert (await status_reply(nc))["invalid_total"] >= 3
    longest = max(len(r.getMessage()) for r in caplog.records)
    assert longest < 4 * DETAIL_LIMIT, f"a log line of {longest} characters"


# -- a serve started while NATS is down -----------------------------------------------------------


def _serve(url: str, view_dir: Path, *extra: str) -> ServeProcess:
    return ServeProcess(
        [
            *("--nats-server", url, "--view-dir", str(view_dir)),
            *("--discovery-bucket", DISCOVERY, "--admission-bucket", ADMISSION),
            *("--frontend-id", "fe-restarted", *extra),
        ],
        view_dir=view_dir,
    )


def _record_files(view_dir: Path) -> dict[str, float]:
    return {
        f"{path.parent.name}/{path.name}": path.stat().st_mtime
        for path in (view_dir / "v1").glob("*/*")
        if not path.name.startswith(".")
    }


def _wait(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not hold within {timeout:.0f} s")
        time.sleep(0.05)


@pytest.mark.timeout(120)
async def test_a_serve_started_while_nats_is_down_keeps_the_last_view_and_retries(
    tmp_path: Path,
) -> None:
    servers = restartable_server(tmp_path / "nats")
    # In a thread: a container server's set-up runs an event loop of its own.
    server = await asyncio.to_thread(next, servers)
    view_dir = tmp_path / "view"
    view_dir.mkdir()
    ep = EndpointId("ns-lkg", "backend", "generate")
    first = second = None
    try:
        async with admin(server.url) as nc:
            fleet = await fresh_buckets(nc)
            await register(fleet.kv, ep, 1)
        first = _serve(server.url, view_dir)
        name = file_name_for(instance_key(ep, 1))
        wanted = {f"mdc/{name}", f"instances/{name}"}
        _wait(lambda: wanted <= set(_record_files(view_dir)), 30, "the worker in the view")
        # The sidecar crashes, and NATS goes away before its supervisor restarts it.
        first.kill()
        await asyncio.to_thread(server.handle.stop)
        crashed_at = time.time()
        second = _serve(server.url, view_dir, "--registration-ttl", "8")
        await asyncio.sleep(4.0)
        assert second.process.poll() is None, "serve exited while NATS was down"
        files = _record_files(view_dir)
        assert wanted <= set(files), "the predecessor's view was emptied"
        assert min(files[f] for f in wanted) > crashed_at, "the view was not kept alive"
        # NATS comes back: the retrying serve connects and takes the view over.
        await asyncio.to_thread(server.handle.start)
        _wait(lambda: wanted <= set(_record_files(view_dir)), 30, "the view after reconnect")
        _wait(
            lambda: min(_record_files(view_dir).get(f, 0) for f in wanted) > time.time() - 3,
            30,
            "the new writer refreshing the view",
        )
        code, output = second.stop()
        assert code == 0, output
        assert "cannot reach NATS yet" in output
        assert "keeping the previous writer's" in output
        assert "Traceback" not in output
    finally:
        for process in (first, second):
            if process is not None:
                process.stop()
        await asyncio.to_thread(servers.close)


# -- fuzzing the boundary --------------------------------------------------------------------------

FUZZ_RECORDS = int(os.environ.get("WORKERSET_ADMISSION_FUZZ_RECORDS", "400"))
FUZZ_SEED = int(os.environ.get("WORKERSET_ADMISSION_FUZZ_SEED", "20261201"))
# Names as the wire grammar allows them and as hostile writers spell them.
_NAME_POOL = (
    "fz",
    "fz-b",
    "a/b",
    "..",
    "%2F",
    "=2F",
    "back\\slash",
    "nul\x00byte",
    "ünïcødé",
    "\U0001f600",
    "x" * 84,
    "%" * 85,
    "n" * 230,
    "_" * 90,
)


def _token(rng: random.Random) -> str:
    """A key token: mostly an escaped name, sometimes a malformed or non-canonical escape."""
    roll = rng.random()
    if roll < 0.35:
        return rng.choice(["fz", "backend", "generate"])
    if roll < 0.8:
        name = rng.choice(_NAME_POOL)
        if rng.random() < 0.3:
            name += "".join(chr(rng.randrange(1, 0x2FF)) for _ in range(rng.randrange(1, 6)))
        return escape_token(name)
    return rng.choice(["=2f", "=41", "=4", "=ZZ", "a=", "=C3", "=E2=82", "-_-", "0" * 300])


def _fuzz_key(rng: random.Random) -> tuple[str, EndpointId | None, int, str | None]:
    ns, comp, ep = _token(rng), _token(rng), _token(rng)
    instance = rng.choice([1, 2, 0xFFFFFFFFFFFFFFFF, rng.randrange(1 << 64)])
    hex_id = rng.choice([f"{instance:x}", f"{instance:x}", f"0{instance:x}", f"{instance:X}"])
    kind = rng.choice(["mdc", "mdc", "instances", "adapter", "event_sources", "event_channels"])
    try:
        endpoint = EndpointId(*(unescape_token(t) for t in (ns, comp, ep)))
    except Exception:
        endpoint = None
    if kind == "adapter":
        suffix = _token(rng)
        return f"v1.mdc.{ns}.{comp}.{ep}.{hex_id}.{suffix}", endpoint, instance, suffix
    if kind.startswith("event"):
        topic = rng.choice(["kv-events", "kv_metrics", _token(rng)])
        key = f"v1.{kind}.namespace.{ns}.component.{comp}.endpoint.{ep}.topic.{topic}.{hex_id}"
        return key, endpoint, instance, topic
    return f"v1.{kind}.{ns}.{comp}.{ep}.{hex_id}", endpoint, instance, None


def _fuzz_value(
    rng: random.Random, key: str, endpoint: EndpointId | None, instance: int, extra: str | None
) -> bytes:
    claimed = endpoint or EndpointId("fz", "backend", "generate")
    if rng.random() < 0.15:  # the value claims another identity than its key
        claimed = EndpointId(claimed.namespace + "-other", claimed.component, claimed.endpoint)
    roll = rng.random()
    if roll < 0.1:
        return rng.choice([b"", b"{", b"[]", b"null", b"\xff\xfe", b'{"type":"Model"}'])
    if roll < 0.15:
        return json.dumps(
            {"type": "Model", "namespace": "y" * rng.randrange(10**4, 3 * 10**5)}
        ).encode()
    if key.startswith("v1.instances."):
        return encode_endpoint_record(claimed, instance)
    if key.startswith("v1.event_"):
        scope = {
            "namespace": claimed.namespace,
            "component": claimed.component,
            "name": claimed.endpoint,
        }
        kind = "EventSource" if key.startswith("v1.event_sources") else "EventChannel"
        record: dict[str, Any] = {"type": kind, "scope": {"kind": "endpoint", "endpoint": scope}}
        record["topic"] = _name(extra)
        if kind == "EventSource":
            record |= {"publisher_id": instance, "metadata": {"worker": {"worker_id": instance}}}
        else:
            record |= {"instance_id": instance, "transport": {"kind": "Nats", "config": {}}}
        return json.dumps(record).encode()
    if extra is not None:
        name = _name(extra)
        return encode_model_record(claimed, instance, lora_card(name), name)
    return encode_model_record(claimed, instance, OLD if rng.random() < 0.8 else NEW)


def _name(token: str | None) -> str:
    """The name a key token stands for, or a plain one when the token is malformed."""
    try:
        return unescape_token(token or "")
    except InvalidRecordError:
        return "malformed"


def _subject_safe(key: str) -> bool:
    return all(part and not any(c in part for c in " \t\r\n*>") for part in key.split("."))


def _files_outside(root: Path, view_dir: Path) -> set[str]:
    return {
        str(path.relative_to(root))
        for path in root.rglob("*")
        if view_dir not in path.parents and path != view_dir
    }


@pytest.mark.timeout(180)
async def test_fuzzed_keys_and_values_from_the_wire_grammar_keep_every_invariant(
    nats_server_fn: NatsServer, tmp_path: Path
) -> None:
    rng = random.Random(FUZZ_SEED)
    view_dir = tmp_path / "view"
    view_dir.mkdir()
    (tmp_path / "beside").mkdir()
    (tmp_path / "beside" / "keep.txt").write_text("not the view's")
    honest = EndpointId("fz-honest", "backend", "generate")
    async with admin(nats_server_fn.url) as nc:
        fleet = await fresh_buckets(nc)
        outside = _files_outside(tmp_path, view_dir)
        js = nc.jetstream()
        async with serving_view(nats_server_fn.url, view_dir) as service:
            sent: list[str] = []
            started = time.monotonic()
            for _ in range(FUZZ_RECORDS):
                key, endpoint, instance, extra = _fuzz_key(rng)
                if not _subject_safe(key):
                    continue
                if sent and rng.random() < 0.1:
                    await js.publish(
                        f"$KV.{DISCOVERY}.{rng.choice(sent)}", b"", headers={"KV-Operation": "DEL"}
                    )
                    continue
                value = _fuzz_value(rng, key, endpoint, instance, extra)
                await js.publish(f"$KV.{DISCOVERY}.{key}", value)
                sent.append(key)
                if key.startswith("v1.mdc.") and extra is None and rng.random() < 0.7:
                    # Its worker is live too: an instance record under the same names.
                    live = "v1.instances." + key.removeprefix("v1.mdc.")
                    claimed = endpoint or EndpointId("fz", "backend", "generate")
                    await js.publish(
                        f"$KV.{DISCOVERY}.{live}", encode_endpoint_record(claimed, instance)
                    )
                    sent.append(live)
            # The watch applies in order: once an honest worker written last is served, every
            # fuzzed record before it has been judged.
            await register(fleet.kv, honest, 7)
            await until(lambda: 7 in _routable_of(service, honest), 60, "the honest worker")
            await until(lambda: not routable_in_view(service, view_dir), 30, "the view settles")
            assert time.monotonic() - started < 120
            status = await status_reply(nc)
            assert status["invalid_total"] == service.status().invalid_total
            assert status["invalid_total"] > 0
            assert not routable_in_view(service, view_dir)
            _assert_one_key_per_file(service, view_dir)
            _assert_one_file_per_key(await live_keys(fleet.kv))
            snapshot = service.status()
            assert snapshot.health == "healthy"
            served = sum(len(b.routable()) for b in service.bindings())
            print(
                f"\n[fuzz] seed {FUZZ_SEED}: {len(sent)} records sent, {snapshot.invalid_total} "
                f"refused, {len(snapshot.groups)} group(s), {served} routable worker(s), "
                f"{len(view_names(view_dir))} view file(s)"
            )
        assert _files_outside(tmp_path, view_dir) == outside
        for path in view_dir.rglob("*"):
            relative = path.relative_to(view_dir).parts
            assert relative[0] in (
                "v1",
                ".workerset-admission.lock",
                ".workerset-admission.d",
                ".workerset-admission.clock",
            )
            assert len(relative) <= 3
            assert len(path.name.encode()) <= 255


def _assert_one_file_per_key(keys: list[str]) -> None:
    """No two keys the boundary accepts name one registration or one view file."""
    files: dict[tuple[str, str], str] = {}
    for key in keys:
        try:
            if key.startswith("v1.event_"):
                event = parse_event_key(key)
                file = (event.bucket, file_name_for(dynamo_event_path(event)))
            else:
                parsed = parse_key(key)
                bucket = "mdc" if parsed.kind == "model" else "instances"
                file = (bucket, file_name_for(parsed.instance_key))
        except InvalidRecordError:
            continue
        assert files.setdefault(file, key) == key, f"{key} and {files[file]} are one file"
        assert len(file[1].encode()) <= 255


def _routable_of(service: AdmissionService, ep: EndpointId) -> set[int]:
    return {i for b in service.bindings() if b.id.group.endpoint == ep for i in b.routable()}


def _assert_one_key_per_file(service: AdmissionService, view_dir: Path) -> None:
    """Every card or instance file in the view is one registration's, and named for it alone."""
    names: dict[str, str] = {}
    for reg in service.core.registrations():
        name = file_name_for(reg.key)
        assert names.setdefault(name, reg.key) == reg.key, f"{reg.key} and {names[name]} collide"
    for bucket in ("mdc", "instances"):
        for path in (view_dir / "v1" / bucket).glob("*"):
            if not path.name.startswith("."):
                assert path.name in names, f"{bucket}/{path.name} is no registration's"
