"""Reservation: the first valid card holds the WorkerSet, matching workers join, size never wins."""

from __future__ import annotations

from admission_support import EP, G, finish, group_key, of, one, reg
from workerset_admission.admission import (
    AdmissionCore,
    CoreSettings,
    GroupStatus,
    OpenReceiver,
    PublishAdmissions,
    StartBuild,
    Tick,
    WorkerAdded,
    WorkerPlaced,
)
from workerset_admission.identity import EndpointId, WorkerType


def test_the_first_valid_card_reserves_the_workerset_before_any_build_finishes() -> None:
    core = AdmissionCore()
    effects = core.apply(WorkerAdded(reg(1, "A")))
    opened = one(effects, OpenReceiver)
    assert (opened.group, opened.mdc_checksum) == (G, "A")
    view = core.group(G)
    assert view is not None
    assert view.incumbent == "A"
    assert view.status is GroupStatus.BUILDING
    assert one(effects, PublishAdmissions).admitted == frozenset({1})


def test_a_reservation_holds_while_the_build_is_queued() -> None:
    core = AdmissionCore(CoreSettings(max_concurrent_builds=1))
    core.apply(WorkerAdded(reg(100, "A", group=group_key("other"))))
    core.apply(WorkerAdded(reg(1, "A")))
    assert core.group(G).status is GroupStatus.QUEUED  # type: ignore[union-attr]
    effects = core.apply_many([WorkerAdded(reg(i, "B")) for i in range(2, 12)])
    assert of(effects, PublishAdmissions) == []
    assert core.group(G).incumbent == "A"  # type: ignore[union-attr]


def test_a_reservation_holds_while_the_build_is_retrying_after_failure() -> None:
    core = AdmissionCore()
    finish(core, core.apply(WorkerAdded(reg(1, "A"))), ok=False)
    assert core.group(G).status is GroupStatus.RETRYING  # type: ignore[union-attr]
    effects = core.apply_many([WorkerAdded(reg(i, "B")) for i in range(2, 12)])
    assert of(effects, StartBuild) == []
    view = core.group(G)
    assert view is not None
    assert (view.incumbent, view.admitted) == ("A", (1,))


def test_matching_workers_join_the_incumbent_cohort() -> None:
    core = AdmissionCore()
    core.apply(WorkerAdded(reg(1, "A")))
    effects = core.apply(WorkerAdded(reg(2, "A")))
    assert one(effects, WorkerPlaced).admitted is True
    assert one(effects, PublishAdmissions).admitted == frozenset({1, 2})


def test_a_larger_competing_cohort_never_displaces_the_incumbent() -> None:
    core = AdmissionCore()
    finish(core, core.apply(WorkerAdded(reg(1, "A"))))
    for i in range(2, 50):
        effects = core.apply(WorkerAdded(reg(i, "B")))
        assert of(effects, PublishAdmissions) == []
        assert one(effects, WorkerPlaced).admitted is False
    view = core.group(G)
    assert view is not None
    assert (view.incumbent, view.admitted, view.status) == ("A", (1,), GroupStatus.READY)
    assert [c.mdc_checksum for c in view.cohorts] == ["A", "B"]


def test_a_workerset_is_namespace_component_endpoint_model_and_worker_type() -> None:
    core = AdmissionCore()
    variants = [
        group_key(),
        group_key(model="m2"),
        group_key(endpoint=EndpointId("ns2", "workers", "generate")),
        group_key(endpoint=EndpointId("ns1", "other", "generate")),
        group_key(endpoint=EndpointId("ns1", "workers", "other")),
        group_key(worker_type=WorkerType.PREFILL),
    ]
    for n, key in enumerate(variants):
        core.apply(WorkerAdded(reg(n + 1, f"C{n}", group=key)))
    views = core.groups()
    assert len(views) == len(variants)
    assert all(v.incumbent is not None and len(v.cohorts) == 1 for v in views)


def test_versioned_namespaces_are_admitted_independently_and_concurrently() -> None:
    core = AdmissionCore()
    v1 = group_key(endpoint=EndpointId("dgd-v1", "workers", "generate"))
    v2 = group_key(endpoint=EndpointId("dgd-v2", "workers", "generate"))
    finish(core, core.apply(WorkerAdded(reg(1, "OLD", group=v1))))
    effects = core.apply(WorkerAdded(reg(2, "NEW", group=v2)))
    assert one(effects, OpenReceiver).group == v2
    finish(core, effects)
    assert core.group(v1).incumbent == "OLD"  # type: ignore[union-attr]
    assert core.group(v2).incumbent == "NEW"  # type: ignore[union-attr]
    assert core.group(v1).status is core.group(v2).status is GroupStatus.READY  # type: ignore[union-attr]


def test_a_legacy_untyped_card_with_the_same_checksum_joins_the_cohort() -> None:
    core = AdmissionCore()
    core.apply(WorkerAdded(reg(1, "A")))
    effects = core.apply(WorkerAdded(reg(2, "A", worker_type=None)))
    assert one(effects, PublishAdmissions).admitted == frozenset({1, 2})


def test_frontends_that_observe_registrations_in_different_orders_keep_their_own_winner() -> None:
    first, second = AdmissionCore(), AdmissionCore()
    a, b = reg(1, "A"), reg(2, "B")
    for core, order in ((first, (a, b)), (second, (b, a))):
        for registration in order:
            core.apply(WorkerAdded(registration))
    assert core.group(G) is not None
    assert first.group(G).incumbent == "A"  # type: ignore[union-attr]
    assert second.group(G).incumbent == "B"  # type: ignore[union-attr]


def test_a_group_key_id_is_dynamos_compact_json_pair() -> None:
    assert (
        G.id
        == '["m","[\\"ns1\\",\\"workers\\",\\"generate\\",\\"chat|completions\\",\\"decode\\"]"]'
    )
    assert G.endpoint == EP


def test_ticks_before_any_failure_change_nothing() -> None:
    core = AdmissionCore()
    core.apply(WorkerAdded(reg(1, "A")))
    before = core.groups()
    assert core.apply(Tick(100.0)) == []
    assert core.groups() == before
