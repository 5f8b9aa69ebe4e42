"""Decisions the core makes itself: a conflicting LoRA projection, an outage's expiry, taints.

Each was once judged by the service (the hop bindings, ingestion, a read back into the core) and
fed back; here the core alone judges it from its inputs, and its effects say what follows.
"""

from __future__ import annotations

from dataclasses import replace

from admission_support import G, finish, lora, of, one, reg
from workerset_admission.admission import (
    AdmissionCore,
    BuildFinished,
    CommitFailed,
    CommitGroup,
    CoreSettings,
    GroupStatus,
    Listing,
    LoraProjectionChanged,
    LoraProjectionRefused,
    RetryScheduled,
    StartBuild,
    StatusChanged,
    Succession,
    TaintsUpdated,
    TenureHeld,
    Tick,
    WorkerAdded,
    WorkerRemoved,
)
from workerset_admission.identity import GroupKey

# ------------------------------------------------------------------ LoRA projection conflicts


def _ready(core: AdmissionCore, *ids: int) -> None:
    finish(core, core.apply_many([WorkerAdded(reg(i, "A")) for i in ids]))


def test_a_committed_group_s_conflicting_projection_is_refused_and_retried_in_the_same_step() -> (
    None
):
    core = AdmissionCore(CoreSettings(retry_delays=(5.0,)))
    _ready(core, 1, 2)
    core.apply(WorkerAdded(lora(1, "x", fingerprint="one")))
    effects = core.apply(WorkerAdded(lora(2, "x", fingerprint="two")))
    refused = one(effects, LoraProjectionRefused)
    assert refused.group == G
    assert "'x'" in refused.reason
    # Never published: the hops keep the last projection.
    assert of(effects, LoraProjectionChanged) == []
    change = one(effects, StatusChanged)
    assert (change.old, change.new) == (GroupStatus.READY, GroupStatus.BLOCKED_READY)
    retry = one(effects, RetryScheduled)
    assert (retry.delay, retry.error) == (5.0, refused.reason)
    assert core.group(G).status is GroupStatus.BLOCKED_READY  # type: ignore[union-attr]


def test_a_refused_projection_is_judged_again_at_the_deadline_and_published_once_it_is_whole() -> (
    None
):
    core = AdmissionCore(CoreSettings(retry_delays=(5.0,)))
    _ready(core, 1, 2)
    core.apply(WorkerAdded(lora(1, "x", fingerprint="one")))
    core.apply(WorkerAdded(lora(2, "x", fingerprint="two")))
    # Still conflicting at the deadline: refused again, still serving the last safe commit.
    again = core.apply(Tick(5.0))
    assert one(again, LoraProjectionRefused).group == G
    assert core.group(G).status is GroupStatus.BLOCKED_READY  # type: ignore[union-attr]
    # The conflicting adapter goes: the projection is published; the next deadline clears it.
    fixed = core.apply(WorkerRemoved(lora(2, "x").key))
    assert [
        a.model_suffix for w in one(fixed, LoraProjectionChanged).workers for a in w.adapters
    ] == ["x"]
    core.apply(Tick(20.0))
    assert core.group(G).status is GroupStatus.READY  # type: ignore[union-attr]


def test_a_conflict_before_any_commit_is_refused_without_a_status_change() -> None:
    core = AdmissionCore()
    effects = core.apply_many(
        [
            WorkerAdded(reg(1, "A")),
            WorkerAdded(reg(2, "A")),
            WorkerAdded(lora(1, "x", fingerprint="one")),
            WorkerAdded(lora(2, "x", fingerprint="two")),
        ]
    )
    assert one(effects, LoraProjectionRefused).group == G
    assert of(effects, RetryScheduled) == []
    assert core.group(G).status is GroupStatus.BUILDING  # type: ignore[union-attr]


def test_a_commit_refused_after_its_projection_was_blocks_the_group() -> None:
    core = AdmissionCore(CoreSettings(retry_delays=(5.0,)))
    start = one(
        core.apply_many(
            [
                WorkerAdded(reg(1, "A")),
                WorkerAdded(reg(2, "A")),
                WorkerAdded(lora(1, "x", fingerprint="one")),
            ]
        ),
        StartBuild,
    )
    # One step commits the build and refuses the projection a new adapter makes.
    committed = core.apply_many(
        [
            BuildFinished(G, start.mdc_checksum, start.generation, True),
            WorkerAdded(lora(2, "x", fingerprint="two")),
        ]
    )
    commit = one(committed, CommitGroup)
    assert one(committed, LoraProjectionRefused).generation == commit.generation
    assert core.group(G).status is GroupStatus.BLOCKED_READY  # type: ignore[union-attr]
    # A hop then refuses the commit itself: nothing is served, the build is retried.
    failed = core.apply(
        CommitFailed(G, commit.mdc_checksum, commit.generation, "commit", "no channel")
    )
    assert one(failed, StatusChanged).new is GroupStatus.BLOCKED
    assert core.group(G).status is GroupStatus.BLOCKED  # type: ignore[union-attr]


# ------------------------------------------------------------------ expiries and outages


def _ready_a_with_b_waiting() -> AdmissionCore:
    core = AdmissionCore(CoreSettings(tenure_hold=30.0, registration_ttl=10.0))
    core.apply(Tick(100.0))
    _ready(core, 1, 2)
    core.apply(WorkerAdded(reg(3, "B")))
    return core


def test_an_expiry_with_no_reconnect_before_it_never_holds() -> None:
    core = _ready_a_with_b_waiting()
    core.apply(WorkerRemoved(reg(1, "A").key, expired_at=101.0))
    effects = core.apply(WorkerRemoved(reg(2, "A").key, expired_at=102.0))
    assert of(effects, TenureHeld) == []
    assert one(effects, Succession).new_checksum == "B"


def test_an_expiry_within_the_hold_of_the_last_reconnect_is_the_outage_s_and_holds() -> None:
    core = _ready_a_with_b_waiting()
    core.apply(Listing([reg(1, "A"), reg(2, "A"), reg(3, "B")], reconnect=True))
    core.apply(WorkerRemoved(reg(1, "A").key, expired_at=129.0))
    effects = core.apply(WorkerRemoved(reg(2, "A").key, expired_at=129.5))
    assert one(effects, TenureHeld).deadline == 130.0
    # The expiry moved the clock, as a tick would.
    assert core.now == 129.5


def test_an_expiry_at_the_end_of_the_hold_is_not_the_outage_s() -> None:
    core = _ready_a_with_b_waiting()
    core.apply(Listing([reg(1, "A"), reg(2, "A"), reg(3, "B")], reconnect=True))
    core.apply(WorkerRemoved(reg(1, "A").key, expired_at=130.0))
    effects = core.apply(WorkerRemoved(reg(2, "A").key, expired_at=130.0))
    assert of(effects, TenureHeld) == []
    assert one(effects, Succession).new_checksum == "B"


def test_only_a_reconnect_listing_counts_and_the_latest_one_wins() -> None:
    core = _ready_a_with_b_waiting()
    core.apply(Listing([reg(1, "A"), reg(2, "A"), reg(3, "B")], reconnect=True))  # at 100
    core.apply(Tick(140.0))
    core.apply(Listing([reg(1, "A"), reg(2, "A"), reg(3, "B")]))  # periodic: not an outage
    core.apply(WorkerRemoved(reg(1, "A").key, expired_at=141.0))
    assert one(core.apply(WorkerRemoved(reg(2, "A").key, expired_at=141.0)), Succession)
    core.apply(WorkerAdded(reg(4, "B")))
    core.apply(Tick(150.0))
    core.apply(Listing([reg(3, "B"), reg(4, "B")], reconnect=True))  # at 150
    core.apply(WorkerRemoved(reg(3, "B").key, expired_at=155.0))
    held = core.apply(WorkerRemoved(reg(4, "B").key, expired_at=155.0))
    assert one(held, TenureHeld).deadline == 180.0


def test_a_zero_hold_never_counts_an_expiry_as_the_outage_s() -> None:
    core = AdmissionCore(CoreSettings(tenure_hold=0.0))
    _ready(core, 1)
    core.apply(WorkerAdded(reg(3, "B")))
    core.apply(Listing([reg(1, "A"), reg(3, "B")], reconnect=True))
    effects = core.apply(WorkerRemoved(reg(1, "A").key, expired_at=0.0))
    assert one(effects, Succession).new_checksum == "B"


# ------------------------------------------------------------------ taints


def _serving(effects: list[object]) -> tuple[str, GroupKey | None]:
    (update,) = [e for e in effects if isinstance(e, TaintsUpdated)]
    return update.key, update.serving


def test_a_taint_change_names_the_group_serving_an_admitted_worker() -> None:
    core = AdmissionCore()
    _ready(core, 1)
    effects = core.apply(WorkerAdded(reg(1, "A", taints=("gpu-hot",))))
    assert _serving(effects) == (reg(1).key, G)
    assert one(effects, TaintsUpdated).taints == ("gpu-hot",)


def test_a_taint_change_of_a_rejected_worker_names_no_group() -> None:
    core = AdmissionCore()
    _ready(core, 1)
    core.apply(WorkerAdded(reg(2, "B")))
    assert _serving(core.apply(WorkerAdded(reg(2, "B", taints=("t",))))) == (reg(2).key, None)


def test_a_taint_change_of_an_adapter_names_the_group_admitting_its_base() -> None:
    core = AdmissionCore()
    _ready(core, 1)
    adapter = lora(1, "x")
    core.apply(WorkerAdded(adapter))
    tainted = replace(adapter, taints=("t",))
    assert _serving(core.apply(WorkerAdded(tainted))) == (adapter.key, G)
    # An adapter whose base is not admitted is served by no group.
    core.apply(WorkerAdded(reg(2, "B")))
    other = lora(2, "y")
    core.apply(WorkerAdded(other))
    retainted = replace(other, taints=("t",))
    assert _serving(core.apply(WorkerAdded(retainted))) == (other.key, None)
