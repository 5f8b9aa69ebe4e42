"""Builds: bounded concurrency, retry schedule on the injected clock, and result fencing."""

from __future__ import annotations

import pytest
from admission_support import G, finish, group_key, lora, of, one, reg
from workerset_admission.admission import (
    AdmissionCore,
    BuildDiscarded,
    BuildFinished,
    CommitFailed,
    CommitGroup,
    CoreSettings,
    GroupStatus,
    LoraProjectionChanged,
    PublishAdmissions,
    RetryScheduled,
    StartBuild,
    Tick,
    WithdrawGroup,
    WorkerAdded,
    WorkerRemoved,
)
from workerset_admission.errors import ConfigError
from workerset_admission.identity import AttemptId


def test_at_most_eight_builds_run_at_once_by_default() -> None:
    core = AdmissionCore()
    effects = core.apply_many(
        [WorkerAdded(reg(n, "A", group=group_key(f"m{n:02}"))) for n in range(12)]
    )
    starts = of(effects, StartBuild)
    assert len(starts) == 8
    assert core.builds_in_flight == 8
    queued = [v for v in core.groups() if v.status is GroupStatus.QUEUED]
    assert len(queued) == 4
    more = finish(core, [starts[0]])
    assert len(of(more, StartBuild)) == 1
    assert core.builds_in_flight == 8


def test_queued_builds_start_in_the_order_they_were_queued() -> None:
    core = AdmissionCore(CoreSettings(max_concurrent_builds=1))
    names = ["z", "a", "m"]
    effects = core.apply_many(
        [WorkerAdded(reg(i, "A", group=group_key(n))) for i, n in enumerate(names)]
    )
    order = [one(effects, StartBuild).group.model]
    while len(order) < 3:
        effects = finish(core, effects)
        order.append(one(effects, StartBuild).group.model)
    assert order == names


def test_the_concurrency_limit_is_configurable() -> None:
    core = AdmissionCore(CoreSettings(max_concurrent_builds=2))
    effects = core.apply_many(
        [WorkerAdded(reg(n, "A", group=group_key(f"m{n}"))) for n in range(5)]
    )
    assert len(of(effects, StartBuild)) == 2


def test_failed_builds_retry_after_1_2_4_8_16_then_30_seconds() -> None:
    core = AdmissionCore()
    effects = core.apply(WorkerAdded(reg(1, "A")))
    delays = []
    now = 0.0
    for _ in range(8):
        retry = one(finish(core, effects, ok=False), RetryScheduled)
        delays.append(retry.delay)
        assert retry.deadline == now + retry.delay
        assert core.apply(Tick(retry.deadline - 0.5)) == []
        now = retry.deadline
        effects = core.apply(Tick(now))
    assert delays == [1, 2, 4, 8, 16, 30, 30, 30]


def test_the_retry_schedule_is_configurable() -> None:
    core = AdmissionCore(CoreSettings(retry_delays=(0.5, 5.0)))
    effects = core.apply(WorkerAdded(reg(1, "A")))
    delays = []
    for _ in range(3):
        retry = one(finish(core, effects, ok=False), RetryScheduled)
        delays.append(retry.delay)
        effects = core.apply(Tick(retry.deadline))
    assert delays == [0.5, 5.0, 5.0]


def test_a_retry_is_not_due_before_its_deadline() -> None:
    core = AdmissionCore()
    core.apply(Tick(10.0))
    retry = one(finish(core, core.apply(WorkerAdded(reg(1, "A"))), ok=False), RetryScheduled)
    assert retry.deadline == 11.0
    assert core.apply(Tick(10.99)) == []
    assert core.group(G).status is GroupStatus.RETRYING  # type: ignore[union-attr]
    effects = core.apply(Tick(11.0))
    start = one(effects, StartBuild)
    assert start.attempt == 2
    assert start.generation > retry.generation


def test_a_successful_retry_commits_and_resets_the_backoff() -> None:
    core = AdmissionCore()
    retry = one(finish(core, core.apply(WorkerAdded(reg(1, "A"))), ok=False), RetryScheduled)
    commit = one(finish(core, core.apply(Tick(retry.deadline))), CommitGroup)
    view = core.group(G)
    assert view is not None
    assert (view.status, view.attempt, view.committed_generation) == (
        GroupStatus.READY,
        0,
        commit.generation,
    )


def test_every_build_attempt_gets_a_fresh_generation() -> None:
    core = AdmissionCore(CoreSettings(retry_delays=(1.0,)))
    effects = core.apply(WorkerAdded(reg(1, "A")))
    generations = []
    for n in range(4):
        generations.append(one(effects, StartBuild).generation)
        finish(core, effects, ok=False)
        effects = core.apply(Tick(float(n + 1)))
    assert generations == sorted(set(generations))


def test_a_result_for_an_older_attempt_of_the_same_tenure_is_discarded() -> None:
    core = AdmissionCore()
    first = one(core.apply(WorkerAdded(reg(1, "A"))), StartBuild)
    core.apply(BuildFinished(G, "A", first.generation, False))
    core.apply(Tick(1.0))
    effects = core.apply(BuildFinished(G, "A", first.generation, True))
    assert one(effects, BuildDiscarded).generation == first.generation
    assert core.group(G).status is GroupStatus.BUILDING  # type: ignore[union-attr]


def test_a_result_for_an_unknown_group_is_discarded_without_state_change() -> None:
    core = AdmissionCore()
    core.apply(WorkerAdded(reg(1, "A")))
    before = core.groups()
    effects = core.apply(BuildFinished(group_key("nobody"), "A", 1, True))
    assert [type(e) for e in effects] == [BuildDiscarded]
    assert core.groups() == before


def test_a_ready_group_takes_membership_changes_without_a_rebuild() -> None:
    core = AdmissionCore()
    finish(core, core.apply(WorkerAdded(reg(1, "A"))))
    effects = core.apply_many([WorkerAdded(reg(2, "A")), WorkerRemoved(reg(1, "A").key)])
    assert of(effects, StartBuild) == []
    assert of(effects, CommitGroup) == []
    assert one(effects, PublishAdmissions).admitted == frozenset({2})
    assert core.group(G).status is GroupStatus.READY  # type: ignore[union-attr]


def test_a_failed_commit_blocks_and_rebuilds_at_the_deadline() -> None:
    core = AdmissionCore()
    commit = one(finish(core, core.apply(WorkerAdded(reg(1, "A")))), CommitGroup)
    effects = core.apply(CommitFailed(G, "A", commit.generation, "commit", "alias taken"))
    retry = one(effects, RetryScheduled)
    assert core.group(G).status is GroupStatus.BLOCKED  # type: ignore[union-attr]
    start = one(core.apply(Tick(retry.deadline)), StartBuild)
    assert start.generation > commit.generation


def test_a_failed_replacement_keeps_serving_the_last_safe_commit() -> None:
    core = AdmissionCore()
    commit = one(finish(core, core.apply(WorkerAdded(reg(1, "A")))), CommitGroup)
    retry = one(
        core.apply(CommitFailed(G, "A", commit.generation, "replace", "adapter clash")),
        RetryScheduled,
    )
    view = core.group(G)
    assert view is not None
    assert (view.status, view.committed_generation) == (
        GroupStatus.BLOCKED_READY,
        commit.generation,
    )
    effects = core.apply(Tick(retry.deadline))
    assert one(effects, PublishAdmissions).generation == commit.generation
    assert core.group(G).status is GroupStatus.READY  # type: ignore[union-attr]
    drained = core.apply(WorkerRemoved(reg(1, "A").key))
    assert one(drained, WithdrawGroup).generation == commit.generation


def test_a_commit_failure_for_another_generation_is_discarded() -> None:
    core = AdmissionCore()
    commit = one(finish(core, core.apply(WorkerAdded(reg(1, "A")))), CommitGroup)
    effects = core.apply(CommitFailed(G, "A", commit.generation + 5, "commit"))
    assert [type(e) for e in effects] == [BuildDiscarded]
    assert core.group(G).status is GroupStatus.READY  # type: ignore[union-attr]


def test_a_retry_timer_of_a_drained_tenure_never_fires() -> None:
    core = AdmissionCore()
    retry = one(finish(core, core.apply(WorkerAdded(reg(1, "A"))), ok=False), RetryScheduled)
    core.apply(WorkerRemoved(reg(1, "A").key))
    core.apply(WorkerAdded(reg(2, "B")))
    assert of(core.apply(Tick(retry.deadline + 100)), StartBuild) == []


def test_a_compatible_worker_joining_during_a_retry_backoff_rebuilds_at_once() -> None:
    core = AdmissionCore()
    core.apply(Tick(5.0))
    retry = one(finish(core, core.apply(WorkerAdded(reg(1, "A"))), ok=False), RetryScheduled)
    effects = core.apply(WorkerAdded(reg(2, "A")))
    start = one(effects, StartBuild)
    assert (start.admitted, start.attempt) == (frozenset({1, 2}), 1)
    assert start.generation > retry.generation
    assert one(effects, PublishAdmissions).generation == start.generation
    view = core.group(G)
    assert view is not None
    assert (view.status, view.deadline) == (GroupStatus.BUILDING, None)
    # The abandoned backoff's deadline passes without a second build.
    assert of(core.apply(Tick(retry.deadline)), StartBuild) == []
    assert one(finish(core, effects), CommitGroup).members == (reg(1).key, reg(2).key)


def test_a_compatible_worker_leaving_during_a_retry_backoff_rebuilds_at_once() -> None:
    core = AdmissionCore()
    effects = core.apply_many([WorkerAdded(reg(1, "A")), WorkerAdded(reg(2, "A"))])
    finish(core, effects, ok=False)
    start = one(core.apply(WorkerRemoved(reg(1, "A").key)), StartBuild)
    assert start.admitted == frozenset({2})


def test_a_rebuild_forced_by_a_membership_change_restarts_the_backoff() -> None:
    core = AdmissionCore()
    effects = core.apply(WorkerAdded(reg(1, "A")))
    for _ in range(3):
        retry = one(finish(core, effects, ok=False), RetryScheduled)
        effects = core.apply(Tick(retry.deadline))
    assert retry.delay == 4.0
    finish(core, effects, ok=False)
    effects = core.apply(WorkerAdded(reg(2, "A")))
    assert one(finish(core, effects, ok=False), RetryScheduled).delay == 1.0


def test_a_membership_change_after_a_failed_commit_rebuilds_at_once() -> None:
    core = AdmissionCore()
    commit = one(finish(core, core.apply(WorkerAdded(reg(1, "A")))), CommitGroup)
    core.apply(CommitFailed(G, "A", commit.generation, "commit", "alias taken"))
    start = one(core.apply(WorkerAdded(reg(2, "A"))), StartBuild)
    assert start.admitted == frozenset({1, 2})


def test_rejected_workers_and_adapters_leave_a_retry_backoff_alone() -> None:
    core = AdmissionCore()
    retry = one(finish(core, core.apply(WorkerAdded(reg(1, "A"))), ok=False), RetryScheduled)
    effects = core.apply_many(
        [WorkerAdded(reg(2, "B")), WorkerAdded(lora(1)), WorkerRemoved(reg(2, "B").key)]
    )
    assert of(effects, StartBuild) == []
    view = core.group(G)
    assert view is not None
    assert (view.status, view.deadline) == (GroupStatus.RETRYING, retry.deadline)


def test_an_admitted_workers_adapter_changing_during_a_retry_backoff_starts_no_build() -> None:
    core = AdmissionCore()
    effects = core.apply_many([WorkerAdded(reg(1, "A")), WorkerAdded(lora(1))])
    retry = one(finish(core, effects, ok=False), RetryScheduled)
    changes = [
        WorkerAdded(lora(1, fingerprint="capacity-8")),
        WorkerAdded(lora(1, "second-lora")),
        WorkerRemoved(lora(1).key),
    ]
    for change in changes:
        effects = core.apply(change)
        # The projection follows the adapter; the build waits for its own deadline.
        assert one(effects, LoraProjectionChanged).workers[0].instance_id == 1
        assert of(effects, StartBuild) == []
    view = core.group(G)
    assert view is not None
    assert (view.status, view.deadline) == (GroupStatus.RETRYING, retry.deadline)
    start = one(core.apply(Tick(retry.deadline)), StartBuild)
    assert (start.admitted, start.attempt) == (frozenset({1}), 2)


def test_an_admitted_workers_adapter_changing_after_a_failed_commit_starts_no_build() -> None:
    core = AdmissionCore()
    effects = core.apply_many([WorkerAdded(reg(1, "A")), WorkerAdded(lora(1))])
    commit = one(finish(core, effects), CommitGroup)
    core.apply(CommitFailed(G, "A", commit.generation, "commit", "alias taken"))
    deadline = core.group(G).deadline  # type: ignore[union-attr]
    effects = core.apply(WorkerAdded(lora(1, fingerprint="capacity-8")))
    assert one(effects, LoraProjectionChanged).workers[0].adapters[0].lora_fingerprint == (
        "capacity-8"
    )
    assert of(effects, StartBuild) == []
    view = core.group(G)
    assert view is not None
    assert (view.status, view.deadline) == (GroupStatus.BLOCKED, deadline)


def test_a_failed_replacement_is_not_rebuilt_by_a_membership_change() -> None:
    core = AdmissionCore()
    commit = one(finish(core, core.apply(WorkerAdded(reg(1, "A")))), CommitGroup)
    core.apply(CommitFailed(G, "A", commit.generation, "replace", "adapter clash"))
    effects = core.apply(WorkerAdded(reg(2, "A")))
    assert of(effects, StartBuild) == []
    assert one(effects, PublishAdmissions).admitted == frozenset({1, 2})
    assert core.group(G).status is GroupStatus.BLOCKED_READY  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "settings",
    [{"max_concurrent_builds": 0}, {"retry_delays": ()}, {"retry_delays": (1.0, -1.0)}],
)
def test_invalid_core_settings_are_refused(settings: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        CoreSettings(**settings)  # type: ignore[arg-type]


def test_every_value_naming_a_build_attempt_gives_it_as_one_attempt_id() -> None:
    core = AdmissionCore()
    [start] = of(core.apply(WorkerAdded(reg(1, "A"))), StartBuild)
    done = BuildFinished(start.group, start.mdc_checksum, start.generation, ok=True)
    [commit] = of(core.apply(done), CommitGroup)
    attempt = AttemptId(G, start.mdc_checksum, start.generation)
    assert start.attempt_id == done.attempt_id == commit.attempt_id == attempt
    # The attempt number is a count, a different thing from the attempt's identity.
    assert start.attempt == 1


def test_a_result_for_another_attempt_is_discarded_with_that_attempt() -> None:
    core = AdmissionCore()
    [start] = of(core.apply(WorkerAdded(reg(1, "A"))), StartBuild)
    stale = BuildFinished(start.group, start.mdc_checksum, start.generation + 1, ok=True)
    [discarded] = of(core.apply(stale), BuildDiscarded)
    assert discarded.attempt_id == stale.attempt_id
    assert discarded.reason == "stale checksum or generation"
