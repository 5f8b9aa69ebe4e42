"""The admission core's builds: results, commit failures, retry timers and starting attempts."""

from __future__ import annotations

import heapq

from workerset_admission.admission import effects as fx
from workerset_admission.admission.inputs import BuildFinished, CommitFailed, Tick
from workerset_admission.admission.state import (
    _BLOCKED,
    _BLOCKED_READY,
    _READY,
    _RETRYING,
    _CoreState,
    _Group,
    _representative,
)
from workerset_admission.admission.status import StatusEvent


class _BuildsMixin(_CoreState):
    """Build and clock steps of ``AdmissionCore``."""

    def _on_build_finished(self, event: BuildFinished) -> None:
        group = self._groups.get((event.group.model, event.group.worker_set))
        if group is None or group.in_flight is None:
            self._discard(event.group, event.mdc_checksum, event.generation, "no build in flight")
            return
        if group.in_flight != event.generation or group.checksum != event.mdc_checksum:
            self._discard(
                event.group, event.mdc_checksum, event.generation, "stale checksum or generation"
            )
            return
        group.in_flight = None
        self.builds_in_flight -= 1
        checksum = group.checksum
        receiver = group.receiver
        assert checksum is not None
        assert receiver is not None
        if event.ok:
            self._transition(group, StatusEvent.BUILD_OK)
            group.committed_generation = event.generation
            group.attempt = 0
            cohort = group.cohorts[checksum]
            assert group.representative is not None
            served = cohort.snapshot(group.served_ids(cohort)).as_frozenset()
            hold = group.hold
            last_known = () if hold is None else hold.last_known.values()
            self._out.append(
                fx.CommitGroup(
                    group=group.key,
                    mdc_checksum=checksum,
                    generation=event.generation,
                    receiver=receiver,
                    members=tuple(sorted({r.key for r in (*cohort.members.values(), *last_known)})),
                    admitted=served,
                    representative=group.representative,
                    card=group.card,
                )
            )
        else:
            self._transition(group, StatusEvent.BUILD_FAILED)
            self._schedule_retry(group, event.generation, event.error or "build failed")

    def _on_commit_failed(self, event: CommitFailed) -> None:
        group = self._groups.get((event.group.model, event.group.worker_set))
        if (
            group is None
            or group.committed_generation != event.generation
            or group.checksum != event.mdc_checksum
            or not group.status.state.committed
        ):
            self._discard(event.group, event.mdc_checksum, event.generation, "no such commit")
            return
        if event.phase == "commit":
            if group.status.state is not _READY:
                self._discard(
                    event.group, event.mdc_checksum, event.generation, "commit already judged"
                )
                return
            self._transition(group, StatusEvent.COMMIT_FAILED)
            group.committed_generation = None
        else:
            self._transition(group, StatusEvent.REPLACE_FAILED)
        group.attempt += 1
        self._schedule_retry(group, event.generation, event.error or f"{event.phase} failed")

    def _schedule_retry(self, group: _Group, generation: int, error: str) -> None:
        assert group.checksum is not None
        delay = self._settings.retry_delay(group.attempt)
        deadline = self._now + delay
        group.deadline = deadline
        self._timer_seq += 1
        heapq.heappush(self._timers, (deadline, self._timer_seq, group, generation))
        self._out.append(
            fx.RetryScheduled(
                group.key, group.checksum, generation, group.attempt, delay, deadline, error
            )
        )

    def _on_tick(self, event: Tick) -> None:
        # The clock never runs backwards: an older tick only means a late delivery.
        if event.now > self._now:
            self._now = event.now
        if self._holds:
            self._expire_holds()
        timers = self._timers
        while timers and timers[0][0] <= self._now:
            deadline, _seq, group, generation = heapq.heappop(timers)
            if group.deadline != deadline or generation != group.generation:
                continue  # the timer outlived its tenure or attempt
            group.deadline = None
            state = group.status.state
            hold = group.hold
            if hold is not None and hold.held and (state is _RETRYING or state is _BLOCKED):
                # A hold pauses the retry: nothing to build for until a member is back, and
                # the rejoin that brings one rebuilds at once.
                continue
            if state is _RETRYING or state is _BLOCKED:
                group.generation = self._next_generation()
                self._transition(group, StatusEvent.RETRY_DUE)
                self._queue.append((group, group.generation))
                self._mark_dirty(group)
            elif state is _BLOCKED_READY:
                self._transition(group, StatusEvent.REPLACE_DUE)
                self._mark_dirty(group)
                group.lora = None
                self._mark_lora(group)

    def _rebuild_now(self, group: _Group) -> None:
        """Queue a rebuild at once: the incumbent's membership changed during a backoff."""
        # The failure being waited out was about other members, so the backoff restarts from
        # its first step (1.6.1 resets its attempt count too); the pending timer goes stale.
        group.deadline = None
        group.attempt = 0
        group.generation = self._next_generation()
        self._transition(group, StatusEvent.MEMBERS_CHANGED)
        self._queue.append((group, group.generation))
        self._mark_dirty(group)

    def _start_build(self, group: _Group) -> None:
        checksum = group.checksum
        generation = group.generation
        receiver = group.receiver
        assert checksum is not None
        assert generation is not None
        assert receiver is not None
        self._transition(group, StatusEvent.START_BUILD)
        cohort = group.cohorts[checksum]
        # A held tenure has no member: it builds from the card its tenure already holds.
        if cohort.members:
            representative = _representative(cohort)
            if representative.key != group.representative:
                # The card travels with the admissions: a new representative is news.
                group.representative = representative.key
                group.card = representative.card
                self._mark_dirty(group)
        assert group.representative is not None
        group.attempt += 1
        group.in_flight = generation
        self.builds_in_flight += 1
        self._out.append(
            fx.StartBuild(
                group=group.key,
                mdc_checksum=checksum,
                generation=generation,
                attempt=group.attempt,
                receiver=receiver,
                admitted=cohort.snapshot(group.served_ids(cohort)).as_frozenset(),
                representative=group.representative,
                card=group.card,
            )
        )
