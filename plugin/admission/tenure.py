"""The admission core's tenures: start, succession, rejection reports and the post-outage hold."""

from __future__ import annotations

import heapq
from typing import Literal

from workerset_admission.admission import effects as fx
from workerset_admission.admission.inputs import Snapshot
from workerset_admission.admission.state import _Cohort, _CoreState, _Group, _representative
from workerset_admission.admission.status import StatusEvent


class _TenureMixin(_CoreState):
    """Tenure steps of ``AdmissionCore``."""

    def _on_snapshot(self, event: Snapshot) -> None:
        listed: set[str] = set(event.retain)
        for reg in event.registrations:
            listed.add(reg.key)
            self._add(reg)
        self._holding = event.reconnect and self._settings.tenure_hold > 0
        try:
            for key in [k for k in self._regs if k not in listed]:
                self._remove(key)
        finally:
            self._holding = False
        for key in [k for k in self._loras if k not in listed]:
            self._remove(key)

    def _start_tenure(self, group: _Group) -> None:
        cohort = next(iter(group.cohorts.values()))
        # Changes were not logged while the cohort was not the incumbent.
        cohort.rebase(cohort.members)
        representative = _representative(cohort)
        self._last_receiver += 1
        group.checksum = cohort.checksum
        group.receiver = self._last_receiver
        group.generation = self._next_generation()
        group.representative = representative.key
        group.card = representative.card
        group.lora = ()
        self._out.append(
            fx.OpenReceiver(group.key, group.receiver, cohort.checksum, group.generation)
        )
        self._transition(group, StatusEvent.RESERVE)
        self._queue.append((group, group.generation))
        self._mark_dirty(group)
        self._mark_lora(group)

    def _end_tenure(self, group: _Group) -> None:
        checksum = group.checksum
        receiver = group.receiver
        assert checksum is not None
        assert receiver is not None
        if group.in_flight is not None:
            self._out.append(fx.CancelBuild(group.key, checksum, group.in_flight))
            self.builds_in_flight -= 1
            group.in_flight = None
        if group.status.state.committed:
            assert group.committed_generation is not None
            self._out.append(fx.WithdrawGroup(group.key, checksum, group.committed_generation))
        self._out.append(fx.RetireReceiver(group.key, receiver, checksum))
        self._transition(group, StatusEvent.DRAIN)
        group.checksum = None
        group.receiver = None
        group.committed_generation = None
        group.attempt = 0
        group.deadline = None
        group.representative = None
        group.card = None
        group.reported.clear()
        group.lora = ()
        group.dirty = False
        group.lora_dirty = False
        group.held_since = None
        group.held_until = None

    def _remove_holding(self, key: str) -> None:
        self._holding = self._settings.tenure_hold > 0
        try:
            self._remove(key)
        finally:
            self._holding = False

    def _hold(self, group: _Group) -> None:
        """Keep an emptied incumbent reserved, admitting nobody, until it returns or time is up."""
        assert group.checksum is not None
        assert group.receiver is not None
        if group.held_until is None:
            group.held_since = self._now
            group.held_until = self._now + self._settings.tenure_hold
            self._timer_seq += 1
            heapq.heappush(self._holds, (group.held_until, self._timer_seq, group))
            self._out.append(
                fx.TenureHeld(
                    group.key, group.checksum, group.receiver, group.generation, group.held_until
                )
            )
        self._mark_dirty(group)
        self._mark_lora(group)

    def _end_hold(self, group: _Group, outcome: Literal["rejoined", "expired"]) -> None:
        assert group.checksum is not None
        assert group.held_since is not None
        self._out.append(
            fx.TenureHoldEnded(group.key, group.checksum, outcome, self._now - group.held_since)
        )
        group.held_since = None
        group.held_until = None

    def _expire_holds(self) -> None:
        holds = self._holds
        while holds and holds[0][0] <= self._now:
            deadline, _seq, group = heapq.heappop(holds)
            if group.held_until != deadline:
                continue  # a member rejoined before the deadline
            checksum = group.checksum
            assert checksum is not None
            self._end_hold(group, "expired")
            del group.cohorts[checksum]
            group.reported.discard(checksum)
            self._succeed(group)

    def _succeed(self, group: _Group) -> None:
        old_checksum = group.checksum
        old_generation = group.generation
        old_receiver = group.receiver
        assert old_checksum is not None
        assert old_receiver is not None
        self._end_tenure(group)
        if not group.cohorts:
            self._out.append(
                fx.Succession(
                    group.key, old_checksum, None, old_generation, None, old_receiver, None
                )
            )
            return
        self._start_tenure(group)
        self._out.append(
            fx.Succession(
                group.key,
                old_checksum,
                group.checksum,
                old_generation,
                group.generation,
                old_receiver,
                group.receiver,
            )
        )
        # Every disagreement still standing is reported again against the new incumbent.
        for cohort in list(group.cohorts.values())[1:]:
            self._report(group, cohort)

    def _report(self, group: _Group, cohort: _Cohort) -> None:
        assert group.checksum is not None
        group.reported.add(cohort.checksum)
        incumbent = group.cohorts[group.checksum]
        representative = _representative(cohort)
        self._out.append(
            fx.RejectionReported(
                group=group.key,
                model=group.key.model,
                worker_set=group.key.worker_set,
                incumbent_checksum=group.checksum,
                rejected_checksum=cohort.checksum,
                instance=representative.key,
                incumbent_card=_representative(incumbent).card if incumbent.members else None,
                rejected_card=representative.card,
            )
        )
