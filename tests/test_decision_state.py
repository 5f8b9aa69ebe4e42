"""A live frontend's decision state: read from its status, written and read as a trace line."""

from __future__ import annotations

import json

import pytest
from workerset_admission.identity import EndpointId, GroupKey, WorkerType
from workerset_admission.traces.state_line import DecisionState, DecisionStateError

G = GroupKey.build("m", EndpointId("ns", "backend", "generate"), "chat", WorkerType.AGGREGATED)


def test_a_status_answer_becomes_a_state_line_and_back() -> None:
    status = {
        "groups": [
            {
                "group_id": G.id,
                "cohorts": [{"checksum": "b", "members": [2]}, {"checksum": "a", "members": 1}],
            },
            {"group_id": G.id.replace("ns", "idle"), "cohorts": []},
        ]
    }
    state = DecisionState.from_status("fe-1", status)
    assert state.cohorts == {(G.model, G.worker_set): ("b", "a")}
    line = json.loads(json.dumps(state.to_line()))
    assert line == {
        "kind": "state",
        "frontend": "fe-1",
        "groups": [{"group": G.id, "cohorts": ["b", "a"]}],
    }
    assert DecisionState.from_line(line) == state


def test_the_status_of_a_frontend_that_names_its_groups_group_is_read_too() -> None:
    # Frontends of earlier releases gave the group id as "group".
    status = {"groups": [{"group": G.id, "cohorts": [{"checksum": "a", "members": [1]}]}]}
    assert DecisionState.from_status("fe-1", status).cohorts == {(G.model, G.worker_set): ("a",)}


@pytest.mark.parametrize(
    "line",
    [
        {"kind": "state"},
        {"kind": "state", "frontend": "x", "groups": [{"group": "nope", "cohorts": []}]},
        {"kind": "state", "frontend": "x", "groups": [{"group": G.id, "cohorts": [1]}]},
        {"kind": "state", "frontend": "x", "groups": ["g"]},
    ],
)
def test_a_malformed_state_line_is_refused(line: dict[str, object]) -> None:
    with pytest.raises(DecisionStateError):
        DecisionState.from_line(line)


def test_a_status_without_groups_is_refused() -> None:
    with pytest.raises(DecisionStateError):
        DecisionState.from_status("fe-1", {"health": "starting"})
