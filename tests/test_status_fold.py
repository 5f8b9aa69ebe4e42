"""The status read-model's fold against the full rebuild: the same picture after every step.

The service keeps its status and serving records per group, rebuilding the groups a core step
named or whose endpoint's liveness changed (:class:`StatusFold`). Driven by a random history
(cards and endpoint records put and removed, listings, drains set and lifted, builds
finishing, conflicting configurations, successions), what the fold shows equals what the full
path (``group_status_report`` over every group, ``standing_rejections``, ``readiness``,
``serving_records``) computes from the core at that moment.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from support.cards import base_card
from support.fakes import FakeSource
from workerset_admission.admission import BuildFinished, StartBuild
from workerset_admission.card import (
    encode_drain_record,
    encode_endpoint_record,
    encode_model_record,
    endpoint_kv_key,
    model_kv_key,
)
from workerset_admission.identity import Drain, EndpointId
from workerset_admission.keys import drain_kv_key
from workerset_admission.ports import DiscoveryEntry, SourceDelete, SourceListing, SourcePut
from workerset_admission.service.admission_service import AdmissionService
from workerset_admission.service.status_model import (
    group_status_report,
    readiness,
    serving_records,
    standing_rejections,
)
from workerset_admission.service.step import EffectReader

ENDPOINTS = (
    EndpointId("ns-a", "backend", "generate"),
    EndpointId("ns-b", "backend", "generate"),
)
endpoints = st.integers(0, len(ENDPOINTS) - 1)
ids = st.integers(1, 5)
operations = st.one_of(
    st.tuples(st.just("card"), endpoints, ids, st.sampled_from((16, 32))),
    st.tuples(st.just("endpoint"), endpoints, ids),
    st.tuples(st.just("remove_card"), endpoints, ids),
    st.tuples(st.just("remove_endpoint"), endpoints, ids),
    st.tuples(st.just("drain"), endpoints, ids),
    st.tuples(st.just("undrain"), endpoints, ids),
    st.tuples(st.just("builds"), st.booleans()),
    st.just(("listing",)),
)


class History:
    """An unstarted service driven step by step, its builds answered by the test."""

    def __init__(self) -> None:
        self.service = AdmissionService(FakeSource())
        self.bucket: dict[str, bytes] = {}
        self.builds: list[StartBuild] = []
        self.revision = 0
        self.service.subscribe(
            EffectReader(
                lambda effects: self.builds.extend(e for e in effects if isinstance(e, StartBuild))
            )
        )

    def put(self, key: str, value: bytes) -> None:
        self.bucket[key] = value
        self.revision += 1
        self.service.handle_event(SourcePut(DiscoveryEntry(key, value, self.revision)))

    def delete(self, key: str) -> None:
        if self.bucket.pop(key, None) is not None:
            self.revision += 1
            self.service.handle_event(SourceDelete(key, self.revision))

    def run(self, op: tuple[Any, ...]) -> None:
        kind = op[0]
        if kind == "listing":
            entries = [DiscoveryEntry(k, v, 1) for k, v in sorted(self.bucket.items())]
            self.service.handle_event(SourceListing(entries))
            return
        if kind == "builds":
            started, self.builds = self.builds, []
            for build in started:
                self.service.step.build_finished(
                    BuildFinished(build.group, build.mdc_checksum, build.generation, op[1])
                )
            return
        endpoint, instance_id = ENDPOINTS[op[1]], op[2]
        if kind == "card":
            card = json.dumps(base_card(op[3]))
            self.put(
                model_kv_key(endpoint, instance_id),
                encode_model_record(endpoint, instance_id, card),
            )
        elif kind == "endpoint":
            self.put(
                endpoint_kv_key(endpoint, instance_id),
                encode_endpoint_record(endpoint, instance_id),
            )
        elif kind == "remove_card":
            self.delete(model_kv_key(endpoint, instance_id))
        elif kind == "remove_endpoint":
            self.delete(endpoint_kv_key(endpoint, instance_id))
        elif kind == "drain":
            drain = Drain(endpoint.namespace, instance_id, "test", None)
            self.put(drain_kv_key(endpoint.namespace, instance_id), encode_drain_record(drain))
        else:
            self.delete(drain_kv_key(endpoint.namespace, instance_id))


def _timeless(view: Any) -> dict[str, Any]:
    out: dict[str, Any] = view.to_json()
    # Unix times are worked out from the clock when a group's picture is made.
    out.pop("held_until")
    out.pop("last_known_until")
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(operations, min_size=1, max_size=40))
def test_the_fold_shows_what_the_full_rebuild_shows_after_every_step(ops: list[Any]) -> None:
    history = History()
    service = history.service
    for step, op in enumerate(ops):
        history.run(op)
        core, liveness = service.core, service.liveness
        views = core.groups()
        status = service.status()
        full = [group_status_report(v, liveness) for v in views]
        assert [_timeless(g) for g in status.groups] == [_timeless(g) for g in full], (step, op)
        assert status.rejections == standing_rejections(core, views), (step, op)
        assert status.readiness == readiness(core, core.serving(), liveness), (step, op)
        expected = serving_records(core, core.serving())
        assert service.serving_records() == expected, (step, op)


def test_a_change_rebuilds_only_the_group_it_names() -> None:
    history = History()
    for index in range(len(ENDPOINTS)):
        for instance_id in (1, 2, 3):
            history.run(("endpoint", index, instance_id))
            history.run(("card", index, instance_id, 16))
    history.run(("builds", True))
    fold = history.service._fold
    history.service.status()
    before = fold.rebuilt

    history.run(("card", 0, 4, 16))
    history.service.status()

    assert fold.rebuilt - before == 1


def test_an_endpoint_record_alone_makes_an_admitted_worker_routable_in_the_status() -> None:
    history = History()
    history.run(("card", 0, 1, 16))
    history.run(("builds", True))
    (group,) = history.service.status().groups
    assert group.admitted == (1,)
    assert group.routable == ()

    history.run(("endpoint", 0, 1))

    (group,) = history.service.status().groups
    assert group.routable == (1,)


def test_a_serving_record_names_each_member_by_its_registrations_own_key() -> None:
    # One instance key string per worker, the core's: a fleet's serving records hold one per
    # worker, and a copy of each made for them would add a string per worker to what it costs.
    history = History()
    for instance_id in (1, 2, 3):
        history.run(("endpoint", 0, instance_id))
        history.run(("card", 0, instance_id, 16))
    history.run(("builds", True))
    (view,) = history.service.core.groups()
    registered = {m.instance_id: m.key for m in view.cohorts[0].members}

    record = history.service.serving_records()[ENDPOINTS[0].namespace]

    assert record.members == (
        "ns-a/backend/generate/1",
        "ns-a/backend/generate/2",
        "ns-a/backend/generate/3",
    )
    (group,) = record.groups
    assert [m is registered[i] for i, m in zip((1, 2, 3), group["members"], strict=True)] == [
        True
    ] * 3
