"""A discovery outage through the real Dynamo 1.6.1 frontend on the admitted view.

The plugin's nats-server (the discovery and admission buckets) is a private one the test stops
and starts; Dynamo's event plane is another server that stays up, so only discovery sees the
outage, as in a deployment whose control plane fails while its data plane runs. Mocker workers
register in their own file store and the ``bridge`` mirrors it into the bucket; requests go
through the OpenAI HTTP API all along. The cases run in file order on one deployment.
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from dynamoview import MODEL_NAME, Deployment, Frontend, Traffic, deployment, wait_for
from natsfixture import NatsServer, restartable_server

pytestmark = [
    pytest.mark.dynamo,
    pytest.mark.integration,
    pytest.mark.rollout,
    pytest.mark.timeout(300),
]

_NEEDS = "needs ai-dynamo==1.6.1 (its runtime wheel, then `pip install --no-deps ai-dynamo==1.6.1`)"
pytest.importorskip("dynamo.frontend.main", reason=_NEEDS)
pytest.importorskip("openai", reason="needs the openai client (the test extra)")

OUTAGE = 15.0
# Settings.registration_ttl's default: a live worker or bridge re-writes its record within it.
REGISTRATION_TTL = 10.0


@dataclass
class Outage:
    deployment: Deployment
    frontend: Frontend
    server: NatsServer
    workers: tuple[int, int]


@pytest.fixture(scope="module")
def outage(tmp_path_factory: pytest.TempPathFactory, nats_server: NatsServer) -> Iterator[Outage]:
    root = tmp_path_factory.mktemp("dynamo-view-outage")
    servers = restartable_server(root / "plugin-nats")
    plugin_server = next(servers)
    try:
        bucket = f"outage-{uuid.uuid4().hex[:10]}"
        with deployment(root, plugin_server.url, bucket, event_plane_url=nats_server.url) as run:
            run.start_bridge()
            run.start_sidecar()
            frontend = run.start_frontend("frontend-round-robin")
            workers = (run.start_worker("worker-1"), run.start_worker("worker-2"))
            wait_for(lambda: run.view_instance_ids() == set(workers), 60, "both workers admitted")
            wait_for(lambda: MODEL_NAME in frontend.models(), 60, "the frontend lists the model")
            yield Outage(run, frontend, plugin_server, workers)
    finally:
        servers.close()


def _announce(text: str) -> None:
    print(f"\n[view outage] {text}", file=sys.__stderr__)


def test_a_fifteen_second_outage_of_discovery_fails_no_request(
    outage: Outage, record_property: pytest.RecordProperty
) -> None:
    handle = outage.server.handle
    assert handle is not None
    with Traffic(outage.frontend) as traffic:
        time.sleep(2.0)
        started = time.monotonic()
        handle.restart(downtime=OUTAGE)
        back = time.monotonic()
        # Past the reconnect, the resync and one registration TTL of any hold it caused.
        time.sleep(REGISTRATION_TTL + 2.0)
    served = [worker for _at, worker in traffic.outcomes]
    during = [w for at, w in traffic.outcomes if started <= at <= back]
    failed = served.count(None)
    record_property("outage_seconds", round(back - started, 3))
    record_property("requests", len(served))
    record_property("requests_during_outage", len(during))
    record_property("failed", failed)
    _announce(
        f"{back - started:.1f} s outage: {len(served)} requests ({len(during)} during it), "
        f"{failed} failed; served by {sorted({w for w in served if w is not None})}"
    )
    assert failed == 0, traffic.errors[:5]
    assert during, "no request was sent during the outage"
    assert {w for w in served if w is not None} == set(outage.workers)
    assert outage.deployment.view_instance_ids() == set(outage.workers)


def test_a_worker_killed_during_an_outage_is_withdrawn_within_one_ttl_of_the_reconnect(
    outage: Outage, record_property: pytest.RecordProperty
) -> None:
    run = outage.deployment
    handle = outage.server.handle
    assert handle is not None
    doomed = run.start_worker("worker-doomed")
    wait_for(lambda: doomed in run.view_instance_ids(), 60, "the third worker is admitted")
    with Traffic(outage.frontend) as traffic:
        time.sleep(1.0)
        handle.stop()
        stopped = time.monotonic()
        run.kill_worker(doomed)
        time.sleep(OUTAGE)
        handle.start()
        back = time.monotonic()
        wait_for(lambda: doomed not in run.view_instance_ids(), 30, "the dead worker leaves")
        withdrawn = time.monotonic() - back
        time.sleep(2.0)
    alive = set(outage.workers)
    after = [w for at, w in traffic.outcomes if at > back + withdrawn + 1.0]
    failed = [at - stopped for at, w in traffic.outcomes if w is None]
    record_property("withdrawn_after_reconnect_seconds", round(withdrawn, 3))
    record_property("failed", len(failed))
    _announce(
        f"worker killed {OUTAGE:g} s before the reconnect: withdrawn {withdrawn:.1f} s after "
        f"it; {len(traffic.outcomes)} requests, {len(failed)} failed (to the dead worker, "
        f"{min(failed, default=0):.1f} to {max(failed, default=0):.1f} s after the stop)"
    )
    assert withdrawn < REGISTRATION_TTL
    assert run.view_instance_ids() == alive
    assert after
    assert set(after) <= alive


def test_after_a_wiped_store_the_last_known_workers_serve_for_one_ttl(
    outage: Outage, record_property: pytest.RecordProperty
) -> None:
    # Runs last. The bridge is killed first, so nothing writes the wiped bucket again (the
    # bridge's own healing is the availability tests' subject): what serves the frontend
    # within one registration TTL is the hold alone.
    run = outage.deployment
    handle = outage.server.handle
    assert handle is not None
    assert run.bridge is not None
    alive = set(outage.workers)
    window = REGISTRATION_TTL - 2.0
    with Traffic(outage.frontend) as traffic:
        time.sleep(1.0)
        run.bridge.kill()
        run.bridge.wait(10)
        handle.restart(wipe=True, downtime=0.3)
        wiped = time.monotonic()
        held = wait_for(
            lambda: [g for g in run.status().get("groups", []) if g.get("held")],
            window / 2,
            "the resync after the wipe holds the tenure",
        )
        while time.monotonic() < wiped + window:
            assert run.view_instance_ids() == alive, "a last-known worker left the view"
            time.sleep(0.5)
    inside = [w for at, w in traffic.outcomes if wiped <= at <= wiped + window]
    failed = inside.count(None)
    record_property("requests_within_ttl_after_wipe", len(inside))
    record_property("failed_within_ttl_after_wipe", failed)
    _announce(
        f"wiped store: {len(inside)} requests in the {window:g} s after it, {failed} failed; "
        f"held groups {[(g['held_until'], g['last_known']) for g in held]}"
    )
    assert failed == 0, traffic.errors[:5]
    assert set(held[0]["last_known"]) == alive
