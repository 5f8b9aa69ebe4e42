"""The worker listing: one row per worker, upstream's serving-state words, from the status alone."""

from __future__ import annotations

import json
from dataclasses import replace

from workerset_admission.identity import EndpointId, GroupKey, WorkerType
from workerset_admission.service.status_model import (
    CohortStatusView,
    GroupStatusReport,
    ServiceStatus,
)
from workerset_admission.service.worker_listing import (
    SERVING_STATES,
    render_worker_table,
    status_from_json,
    worker_listing,
)

GROUP = GroupKey.build("m", EndpointId("ns", "backend", "generate"), "chat", WorkerType.AGGREGATED)
A, B = "a" * 64, "b" * 64


def status(group: GroupStatusReport, synced: bool = True) -> ServiceStatus:
    return ServiceStatus(
        health="healthy",
        synced=synced,
        groups=(group,),
        readiness=(),
        invalid_total=0,
        recent_invalid=(),
        live_instances=3,
        builds_in_flight=0,
        listings_applied=1,
    )


SERVING = GroupStatusReport(
    group=GROUP,
    incumbent=A,
    status="ready",
    generation=3,
    committed_generation=3,
    receiver=1,
    admitted=(1, 2),
    routable=(1,),
    cohorts=(CohortStatusView(A, (1, 2)), CohortStatusView(B, (7,))),
)


def states(current: ServiceStatus) -> dict[int, tuple[str, str]]:
    return {r["instance_id"]: (r["admission"], r["serving_state"]) for r in worker_listing(current)}


def test_an_admitted_routable_worker_serves_and_the_others_are_unavailable() -> None:
    assert states(status(SERVING)) == {
        1: ("admitted", "serving"),
        2: ("admitted", "unavailable"),  # no live endpoint record here
        7: ("rejected", "unavailable"),
    }


def test_a_drained_worker_is_draining_while_a_handover_still_routes_to_it_then_drained() -> None:
    handing_over = replace(
        SERVING,
        incumbent=B,
        status="building",
        admitted=(7,),
        routable=(),
        cohorts=(CohortStatusView(B, (7,)),),
        drained=((1, "ops", 1.0), (2, "ops", 1.0)),
        handover=(A, 3, (1, 2)),
    )
    assert states(status(handing_over)) == {
        1: ("drained", "draining"),
        2: ("drained", "draining"),
        7: ("admitted", "unavailable"),
    }
    done = replace(handing_over, status="ready", routable=(7,), handover=None)
    assert states(status(done)) == {
        1: ("drained", "drained"),
        2: ("drained", "drained"),
        7: ("admitted", "serving"),
    }


def test_before_the_first_listing_and_during_a_hold_the_state_is_unknown() -> None:
    assert {s for _a, s in states(status(SERVING, synced=False)).values()} == {"unknown"}
    held = replace(SERVING, last_known=(1,))
    assert states(status(held))[1] == ("admitted", "unknown")
    assert {s for _a, s in states(status(SERVING)).values()} <= set(SERVING_STATES)


def test_status_workers_reads_the_status_reply_back_into_the_same_listing() -> None:
    handing_over = replace(SERVING, drained=((2, "ops", 1.0),), handover=(A, 3, (2,)))
    current = status(handing_over)
    reply = json.loads(json.dumps(current.to_json()))
    assert worker_listing(status_from_json(reply)) == worker_listing(current)
    table = render_worker_table(worker_listing(current))
    assert table.splitlines()[0].split()[-2:] == ["ADMISSION", "STATE"]
    assert "draining" in table


def test_a_drained_worker_keeps_its_checksum_in_the_listing_and_through_the_reply() -> None:
    drained = replace(
        SERVING,
        admitted=(2,),
        cohorts=(CohortStatusView(A, (2,)), CohortStatusView(B, (7,))),
        drained=((1, "ops", 1.0),),
        drained_checksums=((1, A),),
    )
    current = status(drained)
    rows = {row["instance_id"]: row for row in worker_listing(current)}
    assert (rows[1]["admission"], rows[1]["checksum"]) == ("drained", A)
    reply = json.loads(json.dumps(current.to_json()))
    assert worker_listing(status_from_json(reply)) == worker_listing(current)
