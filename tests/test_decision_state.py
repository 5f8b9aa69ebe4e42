"""A live frontend's decision state: read from its status, written and read as a trace line."""

from __future__ import annotations

import json

import pytest
from workerset_admission.admission import TenureRecorded
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


def test_a_held_tenure_in_a_status_is_written_on_the_traces_clock_and_read_back() -> None:
    status = {
        "groups": [
            {
                "group_id": G.id,
                "cohorts": [{"checksum": "a", "members": []}, {"checksum": "b", "members": [3]}],
                "incumbent": "a",
                "receiver": 2,
                "generation": 5,
                "committed_generation": 5,
                "held": True,
                "held_until": 1_000_030.0,
                "hold_members": [2, 1],
                "last_known": [1],
                "last_known_until": 1_000_010.0,
            }
        ]
    }
    state = DecisionState.from_status("fe-1", status)
    # The trace began at Unix time 1,000,005: its clock reads 25 when the hold ends.
    line = json.loads(json.dumps(state.to_line(1_000_005.0)))
    [group] = line["groups"]
    assert group == {
        "group": G.id,
        "cohorts": ["a", "b"],
        "incumbent": "a",
        "receiver": 2,
        "generation": 5,
        "committed_generation": 5,
        "held_until": 25.0,
        "hold_members": [1, 2],
        "last_known": [1],
        "last_known_until": 5.0,
    }
    [recorded] = DecisionState.from_line(line).inputs()
    assert recorded == TenureRecorded(G, "a", 2, 5, 5, 25.0, (1, 2), (1,), 5.0)
    assert DecisionState.from_line(line).to_line() == line


def test_a_brief_status_keeps_a_holds_deadline_and_names_no_members() -> None:
    status = {
        "groups": [
            {
                "group_id": G.id,
                "cohorts": [{"checksum": "a", "members": 0}],
                "incumbent": "a",
                "receiver": 1,
                "generation": 1,
                "held_until": 50.0,
                "hold_members": 2,
                "last_known": 2,
                "last_known_until": 40.0,
            }
        ]
    }
    [recorded] = DecisionState.from_status("fe-1", status).inputs()
    assert (recorded.held_until, recorded.hold_members, recorded.last_known) == (50.0, (), ())


@pytest.mark.parametrize(
    "fields",
    [
        {"incumbent": "a"},
        {"incumbent": "b", "receiver": 1, "generation": 1},
        {"incumbent": "a", "receiver": "1", "generation": 1},
        {"incumbent": "a", "receiver": 1, "generation": True},
        {"incumbent": "a", "receiver": 1, "generation": 1, "committed_generation": 1.5},
        {"incumbent": "a", "receiver": 1, "generation": 1, "held_until": "soon"},
        {"incumbent": "a", "receiver": 1, "generation": 1, "held_until": 3, "hold_members": [1.5]},
        {
            "incumbent": "a",
            "receiver": 1,
            "generation": 1,
            "held_until": 3,
            "last_known_until": "x",
        },
    ],
)
def test_a_state_line_with_an_impossible_tenure_is_refused(fields: dict[str, object]) -> None:
    line = {
        "kind": "state",
        "frontend": "x",
        "groups": [{"group": G.id, "cohorts": ["a", "b"], **fields}],
    }
    with pytest.raises(DecisionStateError):
        DecisionState.from_line(line)
