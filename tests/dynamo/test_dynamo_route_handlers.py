"""The route extension's handlers, called with a hand-made context and service status."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from workerset_admission.card import Difference
from workerset_admission.frontend.host import HostState
from workerset_admission.frontend.routes import AdmissionRoutes
from workerset_admission.identity import EndpointId, GroupKey, WorkerType
from workerset_admission.service.admission_service import GroupStatusReport, ServiceStatus
from workerset_admission.service.loop_watch import STALLED_AFTER, LoopWatch
from workerset_admission.service.status_model import (
    CohortStatusView,
    InvalidRecord,
    ModelReadiness,
    StandingRejection,
)

GROUP = GroupKey.build("m", EndpointId("ns", "backend", "generate"), "chat", WorkerType.AGGREGATED)
BLOCK_SIZE_DIFFERENCE = Difference("kv_cache_block_size", "16", "32")


def _status(*, health: str = "healthy", synced: bool = True) -> ServiceStatus:
    return ServiceStatus(
        health=health,
        synced=synced,
        groups=(
            GroupStatusReport(
                group=GROUP,
                incumbent="a" * 64,
                status="ready",
                generation=3,
                committed_generation=3,
                receiver=2,
                admitted=(1, 2),
                routable=(1,),
                cohorts=(CohortStatusView("a" * 64, (1, 2)), CohortStatusView("b" * 64, (7,))),
            ),
        ),
        readiness=(ModelReadiness("m", "ns", True, ("aggregated",), ()),),
        invalid_total=1,
        recent_invalid=(InvalidRecord("v1.mdc.x", "bad_key", "three tokens", 0.0),),
        live_instances=2,
        builds_in_flight=0,
        listings_applied=1,
        rejections=(
            StandingRejection(
                GROUP, "a" * 64, "b" * 64, "ns/backend/generate/7", (BLOCK_SIZE_DIFFERENCE,)
            ),
        ),
    )


@dataclass
class _Service:
    current: ServiceStatus

    def settled_status(self, timeout: float = 1.0) -> ServiceStatus:
        return self.current

    async def stop(self) -> None:
        return None


@dataclass
class _Context:
    cancelled: bool = False
    ready_models: set[str] = field(default_factory=set)

    def is_cancelled(self) -> bool:
        return self.cancelled

    def is_model_ready_to_serve(self, model: str) -> bool:
        return model in self.ready_models


def _routes(state: HostState[_Service]) -> AdmissionRoutes:
    return AdmissionRoutes(lambda: state)  # type: ignore[arg-type, return-value]


def test_workersets_list_incumbent_generation_admitted_and_rejected_cohorts() -> None:
    reply = _routes(HostState("running", _Service(_status()))).workersets(_Context())

    assert reply.status == 200
    [workerset] = reply.body["workersets"]
    assert {key: workerset[key] for key in ("model", "namespace", "component", "endpoint")} == {
        "model": "m",
        "namespace": "ns",
        "component": "backend",
        "endpoint": "generate",
    }
    assert workerset["model_types"] == ["chat"]
    assert workerset["worker_type"] == "aggregated"
    assert workerset["group_id"] == GROUP.id
    assert workerset["worker_set_id"] == GROUP.worker_set
    assert workerset["incumbent"] == "a" * 64
    assert workerset["generation"] == 3
    assert workerset["admitted"] == [1, 2]
    assert workerset["admitted_str"] == ["1", "2"]
    assert workerset["routable"] == [1]
    assert workerset["cohorts"] == [
        {"checksum": "a" * 64, "members": [1, 2], "members_str": ["1", "2"]},
        {"checksum": "b" * 64, "members": [7], "members_str": ["7"]},
    ]
    assert workerset["rejected"] == ["b" * 64]
    [rejection] = reply.body["rejections"]
    assert rejection["group_id"] == GROUP.id
    assert rejection["instance"] == "ns/backend/generate/7"
    assert rejection["differences"] == [
        {"field": "kv_cache_block_size", "incumbent": "16", "rejected": "32"}
    ]
    assert reply.body["recent_invalid"] == [
        {"key": "v1.mdc.x", "reason": "bad_key", "detail": "three tokens"}
    ]


def test_readiness_reports_the_evaluator_beside_the_frontends_own_view() -> None:
    reply = _routes(HostState("running", _Service(_status()))).readiness(_Context())

    assert reply.status == 200
    assert reply.body["models"] == [
        {
            "model": "m",
            "namespace": "ns",
            "ready": True,
            "present": ["aggregated"],
            "missing": [],
            "frontend_ready": False,
        }
    ]


def test_health_is_ok_only_once_synced_and_not_draining() -> None:
    running = _routes(HostState("running", _Service(_status())))
    starting = _routes(HostState("running", _Service(_status(health="starting", synced=False))))

    assert running.health(_Context()).status == 200
    assert starting.health(_Context()).status == 503
    assert running.health(_Context(cancelled=True)).body == {"status": "shutting_down"}


def test_health_says_stalled_while_the_plugins_loop_stands_still() -> None:
    clock = [100.0]
    watch = LoopWatch(clock=lambda: clock[0])
    state = HostState("running", _Service(_status()))
    routes = AdmissionRoutes(lambda: state, watch)  # type: ignore[arg-type, return-value]

    assert routes.health(_Context()).status == 200
    clock[0] += STALLED_AFTER + 0.5
    reply = routes.health(_Context())
    assert (reply.status, reply.body["status"]) == (503, "stalled")
    assert reply.body["silent_for"] == STALLED_AFTER + 0.5
    watch.beat()
    assert routes.health(_Context()).status == 200


def test_every_route_answers_503_with_the_reason_while_the_service_is_not_running() -> None:
    routes = _routes(HostState("retrying", error="connection refused", attempts=2))

    for handler in (routes.workersets, routes.readiness, routes.workers, routes.health):
        reply = handler(_Context())
        assert reply.status == 503
        assert reply.body == {"status": "retrying", "attempts": 2, "error": "connection refused"}


def test_workers_lists_each_worker_with_upstreams_serving_state_words() -> None:
    drained = replace(
        _status().groups[0],
        admitted=(2,),
        routable=(2,),
        drained=((1, "ops", 5.0),),
    )
    routes = _routes(HostState("running", service=_Service(replace(_status(), groups=(drained,)))))
    reply = routes.workers(_Context())
    assert reply.status == 200
    states = {
        row["instance_id"]: (row["admission"], row["serving_state"])
        for row in reply.body["workers"]
    }
    assert states == {
        1: ("drained", "drained"),
        2: ("admitted", "serving"),
        7: ("rejected", "unavailable"),
    }
    (first,) = [row for row in reply.body["workers"] if row["instance_id"] == 1]
    assert (first["drained_by"], first["instance_id_str"], first["namespace"]) == ("ops", "1", "ns")
