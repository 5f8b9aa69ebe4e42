"""The real Dynamo 1.6.1 frontend routes only to what the plugin admits, on every hop.

One deployment serves the whole module (its processes start in a few seconds, and every case
uses its own workers or namespace): mocker workers register in their own file store, the
``bridge`` mirrors it into NATS, ``serve --view-dir`` writes the admitted view, and two
frontends (round-robin and KV router) read only the view. The cases run in file order: the
succession drains the aggregated incumbent of the first case, and the last one kills the
plugin.
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from dynamoview import MODEL_NAME, Deployment, Frontend, Served, Traffic, deployment, wait_for
from natsfixture import NatsServer
from workerset_admission.adapters.dynamo.view_directory import read_registry

pytestmark = [pytest.mark.dynamo, pytest.mark.integration, pytest.mark.timeout(240)]

_NEEDS = "needs ai-dynamo==1.6.1 (its runtime wheel, then `pip install --no-deps ai-dynamo==1.6.1`)"
pytest.importorskip("dynamo.frontend.main", reason=_NEEDS)
pytest.importorskip("openai", reason="needs the openai client (the test extra)")

# A 10 s horizon (the file store's own expiry) plus one refresh of the writer (2 s), the store's
# sweep period and slack: how long a dead plugin's view may outlive it at that horizon.
FAIL_CLOSED_WITHIN = 10.0 + 2.0 + 3.4 + 2.0


@dataclass
class Cluster:
    deployment: Deployment
    round_robin: Frontend
    kv: Frontend
    # The plugin inside this one, as a route extension writing its own view.
    extension: Frontend
    incumbent: tuple[int, int] = (0, 0)
    conflicting: int = 0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, nats_server: NatsServer) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("dynamo-view")
    with deployment(root, nats_server.url, f"view-{uuid.uuid4().hex[:10]}") as running:
        running.start_bridge()
        running.start_sidecar()
        round_robin = running.start_frontend("frontend-round-robin")
        kv = running.start_frontend("frontend-kv", "--router-mode", "kv")
        own_view = root / "extension-view-kv"
        own_view.mkdir()
        extension = running.start_frontend(
            "frontend-extension",
            "--frontend-route-extension",
            "workerset-admission",
            view=own_view,
            env=running.extension_env(own_view, "workerset-admission.status.extension"),
        )
        yield Cluster(running, round_robin, kv, extension)


def _announce(text: str) -> None:
    # Shown in CI logs even with output capture on.
    print(f"\n[admitted view] {text}", file=sys.__stderr__)


def _served_by(frontend: Frontend, count: int, model: str = MODEL_NAME) -> list[Served]:
    """Send ``count`` requests, chat and completions alternating."""
    return [frontend.ask(model, chat=i % 2 == 0) for i in range(count)]


def test_a_conflicting_worker_never_serves_in_round_robin_or_kv_mode(cluster: Cluster) -> None:
    view = cluster.deployment
    a1 = view.start_worker("a1", block_size=16)
    a2 = view.start_worker("a2", block_size=16)
    wait_for(lambda: view.view_instance_ids() >= {a1, a2}, 30, "both A workers in the view")
    for frontend in (cluster.round_robin, cluster.kv, cluster.extension):
        wait_for(lambda f=frontend: MODEL_NAME in f.models(), 30, "the model is served")

    b = view.start_worker("b", block_size=32)
    wait_for(lambda: b in view.rejected(), 30, "the plugin rejects the B worker")
    # Real mocker cards that differ in their block size differ in nothing else the checksum reads.
    [rejection] = view.status()["rejections"]
    assert rejection["differences"] == [
        {"field": "kv_cache_block_size", "incumbent": "16", "rejected": "32"}
    ]
    cluster.incumbent, cluster.conflicting = (a1, a2), b

    frontends = [
        ("round-robin", cluster.round_robin),
        ("kv", cluster.kv),
        ("route-extension", cluster.extension),
    ]
    for name, frontend in frontends:
        chat = [frontend.ask(chat=True) for _ in range(30)]
        completions = [frontend.ask(chat=False) for _ in range(30)]
        for kind, served in (("chat", chat), ("completions", completions)):
            decoders = {s.decode for s in served}
            assert b not in decoders, f"{name} {kind}: a request reached the rejected worker"
            assert decoders <= {a1, a2}, f"{name} {kind}: served by {decoders}"
        if name != "kv":
            assert {s.decode for s in chat + completions} == {a1, a2}
    # The view never held B's records, whatever a running frontend would have done with them.
    assert view.view_instance_ids() == {a1, a2}
    assert not any(f"{b:x}" in p.name for p in view.view.rglob("*"))


def test_disaggregated_prefill_and_decode_serve_only_admitted_workers(cluster: Cluster) -> None:
    view = cluster.deployment
    model = "tiny-pd"
    common = {"namespace": "pdns", "model": model}
    decode = view.start_worker("decode-1", mode="decode", block_size=16, **common)
    prefill = view.start_worker("prefill-1", mode="prefill", block_size=16, **common)
    # Both in the view before the first request: a request the frontend takes while it has the
    # decode worker and not yet the prefill one fails (503), and the next one was once seen to
    # hang until its client timeout. This case is about which workers serve, not that start-up.
    wait_for(lambda: view.view_instance_ids("pdns") >= {decode, prefill}, 60, "both in the view")
    wait_for(lambda: model in cluster.kv.models(), 60, "the disaggregated model is served")
    wait_for(
        lambda: (cluster.kv.ask(model).prefill or 0) == prefill, 30, "prefill goes to the worker"
    )
    rival_decode = view.start_worker("decode-2", mode="decode", block_size=32, **common)
    rival_prefill = view.start_worker("prefill-2", mode="prefill", block_size=32, **common)
    wait_for(
        lambda: {rival_decode, rival_prefill} <= view.rejected(), 30, "both rivals are rejected"
    )

    served = _served_by(cluster.kv, 50, model)

    assert {s.decode for s in served} == {decode}
    assert {s.prefill for s in served} == {prefill}
    assert view.view_instance_ids("pdns") == {decode, prefill}


def test_when_the_incumbent_drains_the_successor_serves_after_a_short_gap(
    cluster: Cluster, record_property: pytest.RecordProperty
) -> None:
    view = cluster.deployment
    a1, a2 = cluster.incumbent
    b = cluster.conflicting
    assert b, "runs after the conflicting-worker case"

    with Traffic(cluster.round_robin) as rr, Traffic(cluster.kv) as kv:
        time.sleep(1.0)
        # A member leaves first: a request the frontend already routed to it may fail while
        # its removal travels (worker store, bridge, bucket, view); that window is measured.
        member_drain = time.monotonic()
        view.stop_worker(a1)
        wait_for(lambda: a1 not in view.view_instance_ids(), 30, "A1 leaves the view")
        member_gone = time.monotonic()
        time.sleep(1.0)
        view.stop_worker(a2)
        wait_for(lambda: view.view_instance_ids() == {b}, 30, "B is admitted")
        for traffic in (rr, kv):
            wait_for(lambda t=traffic: any(d == b for _at, d in t.outcomes[-5:]), 30, "B serves")
        time.sleep(1.0)

    for name, traffic in (("round-robin", rr), ("kv", kv)):
        served = [d for _at, d in traffic.outcomes]
        first_b = served.index(b)
        last_a = max(i for i, d in enumerate(served) if d in (a1, a2))
        failures = [i for i, d in enumerate(served) if d is None]
        gap = [i for i in failures if last_a < i < first_b]
        at_member_drain = [
            i for i in failures if member_drain <= traffic.outcomes[i][0] <= member_gone + 0.5
        ]
        elsewhere = sorted(set(failures) - set(gap) - set(at_member_drain))
        assert not elsewhere, f"{name}: failed outside the drains: {traffic.errors}"
        assert set(served[first_b:]) == {b}, f"{name}: the successor is not the only server"
        gap_seconds = traffic.outcomes[first_b][0] - traffic.outcomes[last_a][0]
        record_property(f"{name}_failed_in_gap", len(gap))
        record_property(f"{name}_failed_at_member_drain", len(at_member_drain))
        record_property(f"{name}_gap_seconds", round(gap_seconds, 3))
        _announce(
            f"{name}: {len(served)} requests; {len(gap)} failed in the {gap_seconds:.3f} s "
            f"succession gap, {len(at_member_drain)} while one member drained"
        )
        assert gap_seconds < 10.0
    # The frontend with the plugin inside followed the same succession through its own view.
    wait_for(lambda: cluster.extension.ask().decode == b, 30, "the extension frontend moves to B")


def test_a_killed_plugin_leaves_its_view_for_the_horizon_and_past_it_the_frontend_fails_closed(
    cluster: Cluster, record_property: pytest.RecordProperty
) -> None:
    view = cluster.deployment
    b = cluster.conflicting
    assert cluster.round_robin.ask().decode == b

    # Dead past the file store's 10 s expiry: the view's lease keeps every file, and both
    # frontends go on serving (fail static, the default horizon of 600 s).
    view.kill_sidecar()
    killed = time.monotonic()
    while time.monotonic() - killed < 10.0 + 5.0:
        for frontend in (cluster.round_robin, cluster.kv):
            assert frontend.ask().decode == b
        time.sleep(1.0)
    _announce(f"plugin dead {time.monotonic() - killed:.1f} s: both frontends still serve")

    # A writer with Dynamo's own horizon (10 s) adopts the view without a gap ...
    view.start_sidecar("--view-horizon", "10")
    wait_for(lambda: view.status().get("synced") is True, 60, "the restarted plugin syncs")

    def restamped() -> bool:
        stamps = [p.stat().st_mtime for p in (view.view / "v1").rglob("*") if p.is_file()]
        return bool(stamps) and max(stamps) < time.time() + 5.0

    wait_for(restamped, 30, "the restarted plugin stamps the view with its own horizon")
    for frontend in (cluster.round_robin, cluster.kv):
        assert {s.decode for s in _served_by(frontend, 6)} == {b}
    # ... and once it is dead past that horizon, the frontends fail closed.
    view.kill_sidecar()
    killed = time.monotonic()
    for frontend in (cluster.round_robin, cluster.kv):
        wait_for(lambda f=frontend: MODEL_NAME not in f.models(), 30, "the model is dropped")
    dropped = time.monotonic() - killed
    # Refused either way: the model is gone (404), or its last pipeline is being torn down
    # with no worker left to serve it (503, not ready).
    with pytest.raises(Exception, match=r"404|not found|Not Found|503 - Model `\w+` is not ready"):
        cluster.round_robin.ask()
    record_property("fail_closed_seconds", round(dropped, 3))
    _announce(f"plugin killed past a 10 s horizon: the model dropped after {dropped:.1f} s")
    assert dropped < FAIL_CLOSED_WITHIN

    view.start_sidecar()
    restarted = time.monotonic()
    for frontend in (cluster.round_robin, cluster.kv):
        wait_for(lambda f=frontend: MODEL_NAME in f.models(), 30, "the model is back")
        assert {s.decode for s in _served_by(frontend, 6)} == {b}
    _announce(f"plugin restarted: routing resumed after {time.monotonic() - restarted:.1f} s")


def test_no_process_of_the_deployment_listens_beyond_loopback(cluster: Cluster) -> None:
    listening = {
        connection.laddr.ip
        for process in cluster.deployment.processes
        if process.poll() is None
        for connection in psutil.Process(process.pid).net_connections(kind="inet")
        if connection.status == psutil.CONN_LISTEN
    }
    assert listening
    assert listening <= {"127.0.0.1"}


def test_a_frontend_whose_view_is_not_its_file_store_refuses_to_start(cluster: Cluster) -> None:
    view = cluster.deployment
    elsewhere = view.root / "not-the-store"
    elsewhere.mkdir()
    frontend = view.start_frontend(
        "frontend-misconfigured",
        "--frontend-route-extension",
        "workerset-admission",
        env=view.extension_env(elsewhere, "workerset-admission.status.misconfigured"),
        wait=False,
    )
    assert frontend.process.wait(60) != 0
    log = (view.logs / "frontend-misconfigured.log").read_text()
    assert f"view directory {elsewhere} is not this frontend's file store" in log
    assert "Traceback" not in log
    assert list(elsewhere.iterdir()) == []


def test_the_view_directory_holds_only_files_the_plugin_wrote(cluster: Cluster) -> None:
    view = cluster.deployment.view

    def written() -> list[str]:
        # The registry names every file the writer may hold, before it appears.
        return [f"{bucket}/{name}" for bucket, name in read_registry(view)]

    wait_for(lambda: any(n.startswith("mdc/") for n in written()), 30, "the view is written")
    registered = written()
    on_disk = sorted(
        f"{p.parent.name}/{p.name}"
        for p in (view / "v1").rglob("*")
        if p.is_file() and not p.name.startswith(".")
    )
    # Frontends may register records of their own there; the writer's are all in its registry.
    assert set(registered) <= set(on_disk)
    assert any(name.startswith("mdc/") for name in registered)
    assert not list(Path(view).rglob(".tmp_wsa-*"))
