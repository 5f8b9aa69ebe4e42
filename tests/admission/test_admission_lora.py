"""LoRA adapters: attach to admitted workers only, never create or keep a group, no rebuilds."""

from __future__ import annotations

from admission_support import EP, G, finish, lora, of, one, reg
from workerset_admission.admission import (
    AdmissionCore,
    CommitGroup,
    LoraProjectionChanged,
    OpenReceiver,
    PublishAdmissions,
    StartBuild,
    Succession,
    WorkerAdded,
    WorkerRemoved,
)
from workerset_admission.identity import EndpointId


def test_a_lora_card_never_creates_a_group() -> None:
    core = AdmissionCore()
    effects = core.apply(WorkerAdded(lora(1)))
    assert effects == []
    assert core.groups() == []
    placement = core.placement(lora(1).key)
    assert placement is not None
    assert (placement.admitted, placement.attached_to) == (False, None)


def test_a_lora_card_never_keeps_a_group_alive() -> None:
    core = AdmissionCore()
    core.apply_many([WorkerAdded(reg(1, "A")), WorkerAdded(lora(1))])
    effects = core.apply(WorkerRemoved(reg(1, "A").key))
    assert one(effects, Succession).new_checksum is None
    assert core.group(G).incumbent is None  # type: ignore[union-attr]


def test_an_adapter_on_an_admitted_worker_updates_the_projection_without_a_rebuild() -> None:
    core = AdmissionCore()
    finish(core, core.apply(WorkerAdded(reg(1, "A"))))
    effects = core.apply(WorkerAdded(lora(1, "my-lora")))
    change = one(effects, LoraProjectionChanged)
    assert [(w.instance_id, [a.model_suffix for a in w.adapters]) for w in change.workers] == [
        (1, ["my-lora"])
    ]
    for kind in (StartBuild, CommitGroup, PublishAdmissions):
        assert of(effects, kind) == []


def test_a_lora_fingerprint_change_updates_the_binding_without_a_rebuild() -> None:
    core = AdmissionCore()
    finish(core, core.apply_many([WorkerAdded(reg(1, "A")), WorkerAdded(lora(1))]))
    effects = core.apply(WorkerAdded(lora(1, fingerprint="capacity-8")))
    change = one(effects, LoraProjectionChanged)
    assert change.workers[0].adapters[0].lora_fingerprint == "capacity-8"
    assert of(effects, StartBuild) == []


def test_a_base_card_fingerprint_change_reprojects_its_adapters_without_a_rebuild() -> None:
    core = AdmissionCore()
    finish(core, core.apply_many([WorkerAdded(reg(1, "A")), WorkerAdded(lora(1))]))
    effects = core.apply(WorkerAdded(reg(1, "A", fingerprint="base-2")))
    assert one(effects, LoraProjectionChanged).workers[0].base_fingerprint == "base-2"
    assert of(effects, StartBuild) == []


def test_a_lora_fingerprint_is_not_part_of_workerset_compatibility() -> None:
    core = AdmissionCore()
    core.apply_many(
        [WorkerAdded(reg(1, "A", fingerprint="x")), WorkerAdded(reg(2, "A", fingerprint="y"))]
    )
    view = core.group(G)
    assert view is not None
    assert view.admitted == (1, 2)
    assert len(view.cohorts) == 1


def test_an_adapter_only_attaches_where_the_incumbent_holds_the_same_endpoint_and_instance() -> (
    None
):
    core = AdmissionCore()
    core.apply(WorkerAdded(reg(1, "A")))
    other_endpoint = EndpointId("ns1", "workers", "other")
    effects = core.apply_many([WorkerAdded(lora(2)), WorkerAdded(lora(1, endpoint=other_endpoint))])
    assert of(effects, LoraProjectionChanged) == []


def test_adapters_of_a_rejected_worker_attach_once_it_is_admitted_by_succession() -> None:
    core = AdmissionCore()
    core.apply_many([WorkerAdded(reg(1, "A")), WorkerAdded(reg(2, "B")), WorkerAdded(lora(2))])
    assert core.group(G).lora == ()  # type: ignore[union-attr]
    effects = core.apply(WorkerRemoved(reg(1, "A").key))
    opened = one(effects, OpenReceiver)
    change = one(effects, LoraProjectionChanged)
    assert change.receiver == opened.receiver
    assert [w.instance_id for w in change.workers] == [2]


def test_removing_an_adapter_removes_it_from_the_projection() -> None:
    core = AdmissionCore()
    core.apply_many([WorkerAdded(reg(1, "A")), WorkerAdded(lora(1))])
    effects = core.apply(WorkerRemoved(lora(1).key))
    assert one(effects, LoraProjectionChanged).workers == ()


def test_an_admitted_worker_leaving_takes_its_adapters_out_of_the_projection() -> None:
    core = AdmissionCore()
    core.apply_many(
        [
            WorkerAdded(reg(1, "A")),
            WorkerAdded(reg(2, "A")),
            WorkerAdded(lora(1)),
            WorkerAdded(lora(2)),
        ]
    )
    effects = core.apply(WorkerRemoved(reg(1, "A").key))
    assert [w.instance_id for w in one(effects, LoraProjectionChanged).workers] == [2]
    placement = core.placement(lora(2).key)
    assert placement is not None
    assert placement.attached_to == G
    assert G.endpoint == EP
