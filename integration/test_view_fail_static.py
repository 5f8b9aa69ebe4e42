"""When ``serve`` dies or stalls, the frontend on the view keeps serving: the view fails static.

The real 1.6.1 frontend's file store deletes a view file 10 s after its mtime. The view's files
carry a lease (``--view-horizon``, 600 s by default), so a writer killed and restarted late, or
paused for longer than the store's expiry, leaves the frontend its last view, and the restarted
writer adopts it. The side-by-side deployment (see ``sidebyside``) compares it with Dynamo
alone: three ``dynamo.mocker`` workers, frontend "direct" on their own file store, frontend
"view" on the admitted view, the same steady load on each, the same fault of ``serve`` (which
Dynamo alone does not have, so it must lose nothing to it). The last case makes a worker leave
while ``serve`` is dead: the view is frozen, so it keeps the departed worker until ``serve``
returns, and what that costs beside Dynamo alone is measured and reported.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import pytest
from dynamoview import wait_for
from natsfixture import restartable_server, show
from sidebyside import Outcome, SideBySide, measured, side_by_side

# The rollout tier (docs/testing.md): minutes of real workers under load, its own CI step.
pytestmark = [
    pytest.mark.dynamo,
    pytest.mark.integration,
    pytest.mark.rollout,
    pytest.mark.timeout(300),
]

_NEEDS = "needs ai-dynamo==1.6.1 (its runtime wheel, then `pip install --no-deps ai-dynamo==1.6.1`)"
pytest.importorskip("dynamo.frontend.main", reason=_NEEDS)
pytest.importorskip("openai", reason="needs the openai client (the test extra)")


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SideBySide]:
    root = tmp_path_factory.mktemp("fail-static")
    servers = restartable_server(root / "plugin-nats")
    plugin_nats = next(servers)
    try:
        with side_by_side(root / "deployment", plugin_nats.handle) as running:
            running.start()
            running.serve(3)
            yield running
    finally:
        servers.close()


def _view_files(deployment: SideBySide) -> set[str]:
    return {p.name for p in (deployment.deployment.view / "v1").rglob("*") if p.is_file()}


def _killed_for(deployment: SideBySide, seconds: float) -> Outcome:
    running = deployment.deployment
    before = _view_files(deployment)

    def fault() -> None:
        running.kill_sidecar()
        time.sleep(seconds)
        # Dead all along, and the view is still whole (the store would have emptied it at 10 s).
        assert _view_files(deployment) == before
        running.start_sidecar()

    return deployment._under_load(
        f"serve SIGKILLed, restarted after {seconds:g} s", fault, settle=8.0
    )


def _stopped_for(deployment: SideBySide, seconds: float) -> Outcome:
    sidecar = deployment.deployment.sidecar
    assert sidecar is not None

    def fault() -> None:
        sidecar.send_signal(signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            sidecar.send_signal(signal.SIGCONT)

    return deployment._under_load(f"serve SIGSTOPped for {seconds:g} s", fault, settle=5.0)


@pytest.mark.parametrize("seconds", [20.0, 60.0])
def test_serve_killed_and_restarted_late_costs_the_view_no_more_than_dynamo_alone(
    deployment: SideBySide, record_property: pytest.RecordProperty, seconds: float
) -> None:
    view, direct = measured(_killed_for(deployment, seconds), record_property, "fail static")

    assert view.failed <= direct.failed, (view.errors, direct.errors)
    # The restarted writer adopted the view and serves from it.
    assert deployment.deployment.sidecar is not None
    assert deployment.deployment.sidecar.poll() is None
    for name, frontend in deployment.frontends.items():
        assert frontend.ask().decode in set(deployment.incumbent), name


@pytest.mark.parametrize("seconds", [15.0, 60.0])
def test_serve_paused_past_the_stores_expiry_costs_the_view_no_more_than_dynamo_alone(
    deployment: SideBySide, record_property: pytest.RecordProperty, seconds: float
) -> None:
    view, direct = measured(_stopped_for(deployment, seconds), record_property, "fail static")

    assert view.failed <= direct.failed, (view.errors, direct.errors)
    for name, frontend in deployment.frontends.items():
        assert frontend.ask().decode in set(deployment.incumbent), name


def test_a_worker_that_leaves_while_serve_is_dead_is_measured_beside_dynamo_alone(
    deployment: SideBySide, record_property: pytest.RecordProperty
) -> None:
    """A frozen view keeps a departed worker until ``serve`` returns: what does it cost?"""
    running = deployment.deployment
    leaving = deployment.incumbent.pop(0)
    dead_for = 20.0

    def fault() -> None:
        running.kill_sidecar()
        time.sleep(2.0)
        running.stop_worker(leaving)  # SIGTERM: it deregisters from its own store and exits
        time.sleep(dead_for)
        running.start_sidecar()

    outcome = deployment._under_load(
        f"a worker SIGTERMed while serve is dead for {dead_for + 2:g} s", fault, settle=8.0
    )
    view, direct = measured(outcome, record_property, "fail static")
    show(
        f"[fail static] departed worker during a dead writer: view lost {view.failed} of "
        f"{view.sent}, Dynamo alone {direct.failed} of {direct.sent}"
    )
    # Both frontends kept serving the model through the gap (two workers remained).
    assert view.longest_gap < dead_for, view.errors
    # Once serve is back, the departed worker is gone from the view and nothing fails.
    wait_for(
        lambda: not any(f"{leaving:x}" in name for name in _view_files(deployment)),
        30,
        "the restarted writer removes the departed worker's files",
    )
    deployment.serve(len(deployment.incumbent) + 1)
    with deployment.load():
        started = time.monotonic()
        time.sleep(5.0)
        ended = time.monotonic()
    settled = deployment.figures(started, ended)
    assert settled["view"].failed == 0, settled["view"].errors
