"""Rejections: one report per new rejected cohort, no repeats, re-reported after succession."""

from __future__ import annotations

from admission_support import G, finish, lora, of, one, reg
from workerset_admission.admission import (
    AdmissionCore,
    Listing,
    LoraProjectionChanged,
    PublishAdmissions,
    RejectionReported,
    RetryScheduled,
    StartBuild,
    Tick,
    WorkerAdded,
    WorkerRemoved,
)


def test_a_newly_rejected_cohort_is_reported_with_model_workerset_checksums_and_an_instance() -> (
    None
):
    core = AdmissionCore()
    core.apply(WorkerAdded(reg(1, "A")))
    report = one(core.apply(WorkerAdded(reg(7, "B"))), RejectionReported)
    assert report.model == G.model
    assert report.worker_set == G.worker_set
    assert (report.incumbent_checksum, report.rejected_checksum) == ("A", "B")
    assert report.instance == "ns1/workers/generate/7"


def test_unchanged_repeats_of_a_rejected_cohort_are_not_reported_again() -> None:
    core = AdmissionCore()
    core.apply(WorkerAdded(reg(1, "A")))
    core.apply(WorkerAdded(reg(2, "B")))
    effects = core.apply_many(
        [
            WorkerAdded(reg(2, "B")),
            WorkerAdded(reg(3, "B")),
            Listing([reg(1, "A"), reg(2, "B"), reg(3, "B")]),
        ]
    )
    assert of(effects, RejectionReported) == []


def test_every_remaining_disagreement_is_reported_again_after_a_succession() -> None:
    core = AdmissionCore()
    core.apply_many([WorkerAdded(reg(1, "A")), WorkerAdded(reg(2, "B")), WorkerAdded(reg(3, "C"))])
    effects = core.apply(WorkerRemoved(reg(1, "A").key))
    reports = of(effects, RejectionReported)
    assert [(r.incumbent_checksum, r.rejected_checksum) for r in reports] == [("B", "C")]


def test_a_rejected_cohort_that_empties_and_returns_is_reported_again() -> None:
    core = AdmissionCore()
    core.apply_many([WorkerAdded(reg(1, "A")), WorkerAdded(reg(2, "B"))])
    core.apply(WorkerRemoved(reg(2, "B").key))
    assert len(of(core.apply(WorkerAdded(reg(2, "B"))), RejectionReported)) == 1


def test_rejected_workers_and_their_adapters_change_nothing_of_the_incumbent() -> None:
    core = AdmissionCore()
    effects = core.apply_many([WorkerAdded(reg(1, "A")), WorkerAdded(lora(1, "ok-adapter"))])
    retry = one(finish(core, effects, ok=False), RetryScheduled)
    before = core.group(G)
    assert before is not None
    noise = core.apply_many(
        [
            WorkerAdded(reg(2, "B")),
            WorkerAdded(reg(3, "B")),
            WorkerAdded(lora(2, "rejected-adapter")),
            WorkerAdded(lora(3, "other", fingerprint="x")),
            WorkerRemoved(reg(3, "B").key),
            WorkerAdded(lora(2, "rejected-adapter", fingerprint="changed")),
            WorkerRemoved(lora(3, "other").key),
        ]
    )
    for kind in (PublishAdmissions, StartBuild, RetryScheduled, LoraProjectionChanged):
        assert of(noise, kind) == []
    after = core.group(G)
    assert after is not None
    assert (after.admitted, after.generation, after.receiver, after.deadline, after.lora) == (
        before.admitted,
        before.generation,
        before.receiver,
        retry.deadline,
        before.lora,
    )
    assert one(core.apply(Tick(retry.deadline)), StartBuild).mdc_checksum == "A"


def test_rejected_workers_stay_tracked_for_removal_and_reconsideration() -> None:
    core = AdmissionCore()
    core.apply_many([WorkerAdded(reg(1, "A")), WorkerAdded(reg(2, "B")), WorkerAdded(reg(3, "B"))])
    core.apply(WorkerRemoved(reg(3, "B").key))
    view = core.group(G)
    assert view is not None
    assert [c.instance_ids for c in view.cohorts] == [(1,), (2,)]
    core.apply(WorkerRemoved(reg(1, "A").key))
    assert core.group(G).admitted == (2,)  # type: ignore[union-attr]
