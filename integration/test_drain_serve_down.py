"""A rolling update while ``serve`` is down: the drains wait for it, and the view loses nothing.

The side-by-side deployment (see ``sidebyside``): three ``dynamo.mocker`` workers, frontend
"direct" on their own file store (Dynamo alone), frontend "view" on the admitted view the
``serve`` sidecar writes, the same steady load on each. ``serve`` is SIGKILLed and left down
90 s (then started again), or SIGSTOPped for 60 s; meanwhile the workers are replaced one by
one as a Deployment's rolling update does it, each old one drained as the documented preStop
hook runs it (``deploy/kubernetes/worker-prestop.yaml``: ``drain --wait --timeout T``, then the
kubelet's SIGTERM whatever the drain said). The view frozen while ``serve`` is down still routes
to every worker it held: a drain must not answer "safe to stop" then, and with the recipe's
timeout it waits until ``serve`` is back and has let the worker go.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from natsfixture import restartable_server, show
from sidebyside import SideBySide, measured, side_by_side

pytestmark = [
    pytest.mark.dynamo,
    pytest.mark.integration,
    pytest.mark.rollout,
    pytest.mark.timeout(600),
]

_NEEDS = "needs ai-dynamo==1.6.1 (its runtime wheel, then `pip install --no-deps ai-dynamo==1.6.1`)"
pytest.importorskip("dynamo.frontend.main", reason=_NEEDS)
pytest.importorskip("openai", reason="needs the openai client (the test extra)")

# The preStop hook's --timeout (deploy/kubernetes/worker-prestop.yaml) and a short --grace.
TIMEOUT = 180.0
GRACE = 2.0


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SideBySide]:
    root = tmp_path_factory.mktemp("serve-down")
    servers = restartable_server(root / "plugin-nats")
    plugin_nats = next(servers)
    try:
        with side_by_side(root / "deployment", plugin_nats.handle) as running:
            running.start()
            running.serve(3)
            yield running
    finally:
        servers.close()


def _killed(deployment: SideBySide, seconds: float) -> tuple[Callable[[], None], threading.Event]:
    running = deployment.deployment
    back = threading.Event()

    def fault() -> None:
        running.kill_sidecar()
        time.sleep(seconds)
        running.start_sidecar()
        back.set()

    return fault, back


def _paused(deployment: SideBySide, seconds: float) -> tuple[Callable[[], None], threading.Event]:
    sidecar = deployment.deployment.sidecar
    assert sidecar is not None
    back = threading.Event()

    def fault() -> None:
        sidecar.send_signal(signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            sidecar.send_signal(signal.SIGCONT)
            back.set()

    return fault, back


@pytest.mark.parametrize(
    ("how", "seconds"), [("killed", 90.0), ("paused", 60.0)], ids=["sigkill-90s", "sigstop-60s"]
)
def test_a_rolling_update_while_serve_is_down_costs_the_view_no_more_than_dynamo_alone(
    deployment: SideBySide, record_property: pytest.RecordProperty, how: str, seconds: float
) -> None:
    running = deployment.deployment
    namespace = deployment.namespace
    fault, back = (_killed if how == "killed" else _paused)(deployment, seconds)
    answers: list[tuple[int, float, int, bool]] = []
    down_at = 0.0

    def rolling_update() -> None:
        nonlocal down_at
        down_at = time.monotonic()
        outage = threading.Thread(target=fault, name=f"serve {how}")
        outage.start()
        try:
            for old in list(deployment.incumbent):
                new = deployment.add_worker()  # the surge pod, registered
                began = time.monotonic()
                drained = deployment.drain_command(
                    str(old), "--namespace", namespace, "--wait", "--grace", str(GRACE),
                    "--by", "prestop", timeout=TIMEOUT,
                )  # fmt: skip
                answered = time.monotonic()
                answers.append((old, answered - down_at, drained.returncode, back.is_set()))
                show(
                    f"[serve down] {how}: drain {old:x} answered {drained.returncode} after "
                    f"{answered - began:.1f} s (+{answered - down_at:.1f} s; serve back: "
                    f"{back.is_set()}) {drained.stderr.strip().splitlines()[-1:]}"
                )
                running.stop_worker(old)  # the kubelet's SIGTERM, whatever the hook said
                deployment.incumbent.remove(old)
                deployment.incumbent.append(new)
        finally:
            outage.join()

    outcome = deployment._under_load(
        f"rolling update while serve is {how} {seconds:g} s", rolling_update, settle=8.0
    )
    view, direct = measured(outcome, record_property, "serve down")
    show(f"[serve down] {how} {seconds:g} s: drains (worker, +s, status, serve back) {answers}")
    # No drain said "safe to stop" while serve was down and its frozen view held the worker.
    assert all(status != 0 or was_back for _w, _at, status, was_back in answers), answers
    assert view.failed <= direct.failed + 2, (view.errors, direct.errors)
    deployment.wait_serving(deployment.incumbent)
