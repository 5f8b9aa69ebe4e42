"""On Dynamo's default zmq event plane the view frontend hears every channel Dynamo alone does.

The scenario (``eventplane_scenario.py``) runs in a network namespace of its own with only
loopback, because Dynamo's zmq publishers bind every interface: three ``dynamo.mocker``
workers, a KV-router frontend on their own store and one on the admitted view, then a
fourth worker of another configuration that the plugin rejects.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from natsfixture import show
from phoenixfixture import network_namespace_problem, run_in_own_session

pytestmark = [
    pytest.mark.dynamo,
    pytest.mark.integration,
    pytest.mark.rollout,
    pytest.mark.timeout(240),
]

_NEEDS = "needs ai-dynamo==1.6.1 (its runtime wheel, then `pip install --no-deps ai-dynamo==1.6.1`)"
pytest.importorskip("dynamo.frontend.main", reason=_NEEDS)
pytest.importorskip("openai", reason="needs the openai client (the test extra)")

SCENARIO = Path(__file__).with_name("eventplane_scenario.py")
SCENARIO_TIMEOUT = 200.0
WORKERS = 3


def test_the_view_frontend_opens_as_many_zmq_event_streams_as_the_direct_one(
    tmp_path: Path, record_property: pytest.RecordProperty
) -> None:
    problem = network_namespace_problem()
    if problem is not None:
        pytest.skip(problem)
    unshare = shutil.which("unshare")
    assert unshare is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DYN_", "WORKERSET_"))}
    # The scenario imports the shared test support the way pytest's pythonpath finds it.
    roots = [str(SCENARIO.parents[1] / "tests"), str(SCENARIO.parent)]
    env["PYTHONPATH"] = os.pathsep.join([*roots, *filter(None, [env.get("PYTHONPATH")])])
    out = tmp_path / "result.json"
    command = [unshare, "--net", "--", sys.executable, str(SCENARIO), "--out", str(out)]
    command += ["--root", str(tmp_path / "run"), "--workers", str(WORKERS)]
    returncode, output = run_in_own_session(command, env, SCENARIO_TIMEOUT)
    if returncode is None:
        pytest.fail(f"the scenario overran {SCENARIO_TIMEOUT:g} s: {output[-3000:]}")
    assert returncode == 0, output[-3000:]
    result = json.loads(out.read_text())
    streams = result["streams"]
    show(f"[event plane] zmq streams connected: {json.dumps(streams)}")
    for name, topics in streams.items():
        record_property(f"{name}_streams", sum(topics.values()))

    assert streams["view"] == streams["direct"]
    # Every channel the frontend subscribes to, one per worker: not the KV events alone.
    assert {"kv-events", "kv_metrics", "active_sequences_events"} <= set(streams["view"])
    assert all(count == WORKERS for count in streams["view"].values()), streams
    for name, served in result["served"].items():
        assert set(served) <= set(result["workers"]), name
    # With a rejected worker beside them: its load channels come along on both, its KV events
    # only on Dynamo alone, and KV routing on the view still reaches admitted workers only.
    rival = result["streams_with_rival"]
    show(f"[event plane] with a rejected worker: {json.dumps(rival)}")
    assert rival["view"]["kv-events"] == WORKERS
    for topic in ("kv_metrics", "active_sequences_events"):
        assert rival["view"][topic] == rival["direct"][topic] == WORKERS + 1, rival
    assert set(result["served_with_rival"]["view"]) <= set(result["workers"])
