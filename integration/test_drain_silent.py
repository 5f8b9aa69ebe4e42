"""A frontend whose ``serve`` fell silent routes by its view: ``drain --wait`` never says safe.

Real nats-server, real ``serve --view-dir`` processes, the real commands. ``serve`` is killed
and its heartbeat expires (60 s), while the files of the view it wrote live on for their
horizon: every drain answers "could not confirm" (status 7) until ``serve`` comes back under
the same frontend id, confirms, and the drain answers safe. A ``serve`` restarted under the
same id withdraws what its predecessor published and it no longer serves. A serving record the
server cannot take (over its ``max_payload``) reads as "not confirmed", never as "let go".
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client as NatsClient
from natsfixture import NatsServer
from secfixture import configured_server
from support.buckets import live_keys
from test_drain_nats import CLI, bucket_keys_or_none, register_at, run, view_cards
from workerset_admission.adapters.nats.admission_publisher import NatsAdmissionPublisher
from workerset_admission.identity import EndpointId

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

EP = EndpointId("dgd", "backend", "generate")
OLD, NEW = EndpointId("old", "backend", "generate"), EndpointId("new", "backend", "generate")
A1, A2 = 0xA1, 0xA2


def flags(url: str, suffix: str) -> list[str]:
    return [
        "--nats-server",
        url,
        "--discovery-bucket",
        f"disc-{suffix}",
        "--admission-bucket",
        f"adm-{suffix}",
    ]


class Serve:
    """One ``serve --view-dir`` under frontend id fe-1, started again under the same id."""

    def __init__(self, buckets: list[str], tmp_path: Path) -> None:
        self.buckets = buckets
        self.folder = tmp_path
        self.view = tmp_path / "view"
        self.view.mkdir()
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        with (self.folder / f"serve-{self.starts}.log").open("w") as log:
            self.process = subprocess.Popen(
                [*CLI, "serve", *self.buckets, "--frontend-id", "fe-1",
                 "--status-subject", f"status-{uuid.uuid4().hex[:8]}",
                 "--view-dir", str(self.view)],
                stdout=subprocess.DEVNULL,
                stderr=log,
            )  # fmt: skip

    def signal(self, number: int) -> None:
        assert self.process is not None
        self.process.send_signal(number)
        self.process.wait(timeout=30)
        self.process = None

    def stop(self) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGCONT)
            self.signal(signal.SIGTERM)


@pytest.fixture
def deployment(nats_server: NatsServer, tmp_path: Path) -> Iterator[tuple[Serve, str, str]]:
    suffix = uuid.uuid4().hex[:8]
    serve = Serve(flags(nats_server.url, suffix), tmp_path)
    try:
        yield serve, f"disc-{suffix}", f"adm-{suffix}"
    finally:
        serve.stop()


def admission_keys(url: str, bucket: str) -> set[str]:
    return set(asyncio.run(bucket_keys_or_none(url, bucket)))


def wait_for(check: object, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def members_record(url: str, bucket: str, namespace: str) -> list[str] | None:
    async def read() -> list[str] | None:
        nc = await nats.connect(url)
        try:
            kv = await nc.jetstream().key_value(bucket)
            entry = await kv.get(f"v1.fe-1.members.{namespace}")
            return list(json.loads(entry.value or b"{}").get("members", []))
        except Exception:
            return None
        finally:
            await nc.close()

    return asyncio.run(read())


@pytest.mark.rollout
def test_drain_wait_never_answers_safe_while_a_killed_serves_view_holds_the_worker(
    nats_server: NatsServer, deployment: tuple[Serve, str, str]
) -> None:
    serve, discovery, admission = deployment
    url = nats_server.url
    asyncio.run(register_at(url, discovery, EP, A1, A2))
    serve.start()
    wait_for(lambda: {(EP.namespace, A1), (EP.namespace, A2)} <= view_cards(serve.view), "view")
    wait_for(lambda: len(members_record(url, admission, "dgd") or []) == 2, "serving record")
    serve.signal(signal.SIGKILL)
    killed = time.monotonic()
    answers: list[tuple[float, int]] = []

    def drain(timeout: float) -> subprocess.CompletedProcess[str]:
        done = run("drain", str(A1), "--wait", "--json", "--timeout", str(timeout),
                   *serve.buckets, timeout=timeout + 60)  # fmt: skip
        answers.append((time.monotonic() - killed, done.returncode))
        return done

    # Its heartbeat still stands: a live frontend that lists the worker, still routed to.
    first = drain(3)
    assert first.returncode == 1, first.stderr
    # Its heartbeat expires (60 s after the last); its lease on its view does not.
    wait_for(lambda: "v1.fe-1.heartbeat" not in admission_keys(url, admission), "expiry", 80)
    later = drain(3)
    assert later.returncode == 7, later.stderr
    assert "could not confirm: fe-1 fell silent" in later.stderr
    answer = json.loads(later.stdout)
    assert answer["safe"] is False
    assert answer["silent_routing"] == ["fe-1"]
    # The view it routes by does hold the worker still.
    assert (EP.namespace, A1) in view_cards(serve.view)

    # serve comes back under the same id: it sees the drain, lets go, and the drain is safe.
    serve.start()
    back = drain(60)
    assert back.returncode == 0, back.stderr
    assert (EP.namespace, A1) not in view_cards(serve.view)
    print(f"\n[drain silent] (seconds after SIGKILL, status): {answers}")


async def forget_namespace(url: str, bucket: str, namespace: str) -> None:
    """The namespace's workers leave the discovery bucket (while nobody watches)."""
    nc = await nats.connect(url)
    try:
        kv = await nc.jetstream().key_value(bucket)
        for key in await live_keys(kv):
            if f".{namespace}." in key:
                await kv.delete(key)
    finally:
        await nc.close()


@pytest.mark.rollout
@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGTERM], ids=["killed", "stopped"])
def test_a_serve_restarted_under_the_same_id_withdraws_what_it_no_longer_serves(
    nats_server: NatsServer, deployment: tuple[Serve, str, str], stop: int
) -> None:
    serve, discovery, admission = deployment
    url = nats_server.url
    asyncio.run(register_at(url, discovery, OLD, 0x1))
    asyncio.run(register_at(url, discovery, NEW, 0x2))
    serve.start()
    both = {"v1.fe-1.members.old", "v1.fe-1.members.new"}
    wait_for(lambda: both <= admission_keys(url, admission), "both namespaces served")
    serve.signal(stop)
    # A stop leaves the records the view still routes by; a kill leaves them anyway.
    assert both <= admission_keys(url, admission)
    asyncio.run(forget_namespace(url, discovery, "old"))
    serve.start()
    wait_for(
        lambda: "v1.fe-1.members.old" not in admission_keys(url, admission),
        "the predecessor's record of a namespace no longer served withdrawn",
        30,
    )
    assert members_record(url, admission, "new") == ["new/backend/generate/2"]
    assert "v1.fe-1.heartbeat" in admission_keys(url, admission)


async def publish_oversized(
    nc: NatsClient, bucket: str, **options: float
) -> NatsAdmissionPublisher:
    """Publish fe-1's record of dgd, then grow it past what a 4 KB max_payload server takes."""
    publisher = NatsAdmissionPublisher(nc.jetstream(), "fe-1", bucket=bucket, **options)
    await publisher.publish_capability()
    small = [f"dgd/backend/generate/{i:x}" for i in (A1, A2)]
    await publisher.publish_members("dgd", small)
    await asyncio.wait_for(publisher.flushed(), 10)
    # Grown past what the server takes: hundreds of members of the namespace.
    huge = small + [f"dgd/backend/generate/{0x1000 + i:x}" for i in range(400)]
    await publisher.publish_members("dgd", huge)
    await asyncio.wait_for(publisher.flushed(), 10)
    return publisher


def test_a_record_too_large_to_publish_reads_as_not_confirmed_never_as_let_go(
    tmp_path: Path,
) -> None:
    with configured_server(tmp_path, {"max_payload": 4096}) as server:
        url, suffix = server.url, uuid.uuid4().hex[:8]
        asyncio.run(register_at(url, f"disc-{suffix}", EP, A1, A2))

        async def scenario() -> subprocess.CompletedProcess[str]:
            nc = await nats.connect(url)
            publisher = await publish_oversized(nc, f"adm-{suffix}")
            try:
                kv = await nc.jetstream().key_value(f"adm-{suffix}")
                marker = json.loads((await kv.get("v1.fe-1.members.dgd")).value or b"{}")
                assert marker["unpublished"] > 4096
                assert marker["members"] == []
                # Live, with its record unpublished: still routed to at the timeout.
                return await asyncio.to_thread(
                    run, "drain", str(A1), "--wait", "--json", "--timeout", "1.5",
                    *flags(url, suffix),
                )  # fmt: skip
            finally:
                await publisher.close()
                await nc.close()

        live = asyncio.run(scenario())
        assert live.returncode == 1, live.stderr
        (fe,) = json.loads(live.stdout)["frontends"]
        assert "too large to publish" in fe["still_serving"][0]


def test_a_stopped_frontends_unpublished_record_reads_as_could_not_confirm(
    tmp_path: Path,
) -> None:
    with configured_server(tmp_path, {"max_payload": 4096}) as server:
        url, suffix = server.url, uuid.uuid4().hex[:8]
        asyncio.run(register_at(url, f"disc-{suffix}", EP, A1, A2))

        async def scenario() -> subprocess.CompletedProcess[str]:
            nc = await nats.connect(url)
            publisher = await publish_oversized(nc, f"adm-{suffix}", view_outlives=30.0)
            try:
                # Stopped, its view outliving it: the marker stays, and the lease with it.
                await publisher.withdraw_all()
                return await asyncio.to_thread(
                    run, "drain", str(A1), "--wait", "--json", "--timeout", "1.5",
                    *flags(url, suffix),
                )  # fmt: skip
            finally:
                await publisher.close()
                await nc.close()

        silent = asyncio.run(scenario())
        assert silent.returncode == 7, silent.stderr
        assert json.loads(silent.stdout)["silent_routing"] == ["fe-1"]


def capability_routes_for(url: str, bucket: str) -> float | None:
    async def read() -> float | None:
        nc = await nats.connect(url)
        try:
            kv = await nc.jetstream().key_value(bucket)
            entry = await kv.get("v1.fe-1.capability")
            routes_for = json.loads(entry.value or b"{}").get("routes_for")
            return None if routes_for is None else float(routes_for)
        except Exception:
            return None
        finally:
            await nc.close()

    return asyncio.run(read())


def view_stamps(view: Path) -> list[float]:
    return [p.stat().st_mtime for p in (view / "v1").rglob("*") if p.is_file()]


@pytest.mark.rollout
def test_a_serve_cut_off_from_nats_lets_its_view_expire_before_the_lease_that_says_it_routes(
    nats_server_fn: NatsServer, tmp_path: Path
) -> None:
    # A drain counts a silent frontend as let go once the server drops its lease, so a serve
    # that lives on without NATS must not keep its view alive past that lease.
    url = nats_server_fn.url
    suffix = uuid.uuid4().hex[:8]
    serve = Serve([*flags(url, suffix), "--view-horizon", "20"], tmp_path)
    try:
        asyncio.run(register_at(url, f"disc-{suffix}", EP, A1, A2))
        serve.start()
        wait_for(lambda: {(EP.namespace, A1), (EP.namespace, A2)} <= view_cards(serve.view), "view")
        wait_for(lambda: capability_routes_for(url, f"adm-{suffix}") is not None, "the lease")
        routes_for = capability_routes_for(url, f"adm-{suffix}")
        assert routes_for is not None
        time.sleep(3.0)  # a lease rewrite or two
        assert nats_server_fn.handle is not None
        nats_server_fn.handle.stop(kill=True)
        cut = time.time()  # the last lease went out before this
        # Its server's TTL would drop the lease by cut + routes_for: until then serve goes on
        # touching the view (it is alive), but never so far that the view outlives the lease.
        deadline = cut + routes_for - 10.0 + 2.0
        highest = 0.0
        while time.time() < deadline:
            stamps = view_stamps(serve.view)
            assert stamps, "the view is gone early"
            highest = max(highest, *stamps)
            time.sleep(0.5)
        # The file store keeps a file 10 s past its mtime.
        assert highest + 10.0 <= cut + routes_for + 1.0, (highest + 10.0 - cut, routes_for)
        assert serve.process is not None
        assert serve.process.poll() is None
    finally:
        serve.stop()
