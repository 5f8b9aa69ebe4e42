"""The admission core's tenures: start, succession, rejection reports and the post-outage hold."""

from __future__ import annotations

import heapq
from operator import attrgetter
from typing import Literal

from workerset_admission.admission import effects as fx
from workerset_admission.admission.inputs import Snapshot
from workerset_admission.admission.state import (
    _BLOCKED,
    _QUEUED,
    _RETRYING,
    _Cohort,
    _CoreState,
    _Group,
    _Hold,
    _representative,
)
from workerset_admission.admission.status import StatusEvent
from workerset_admission.identity import Registration

_by_seq = attrgetter("seq")


class _TenureMixin(_CoreState):
    """Tenure steps of ``AdmissionCore``."""

    def _on_snapshot(self, event: Snapshot) -> None:
        listed: set[str] = set(event.retain)
        for reg in event.registrations:
            listed.add(reg.key)
            self._add(reg)
        # A listing after a lost connection removes what it omits as the outage's doing.
        outage = self._now if event.reconnect else None
        for key in [k for k in self._regs if k not in listed]:
            self._remove(key, outage)
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
        group.hold = None
        group.outage_gone = None

    def _note_outage_removal(self, group: _Group, reg: Registration, outage: float) -> None:
        """Remember an incumbent member an outage's removal took: a hold may serve it."""
        if not self._settings.tenure_hold > 0:
            return
        gone = group.outage_gone
        if gone is None or gone[0] != outage:
            gone = group.outage_gone = (outage, {})
        gone[1][reg.instance_id] = reg

    def _hold(self, group: _Group, outage: float) -> None:
        """Keep an emptied incumbent reserved, serving its last known members for a while.

        The hold counts from the reconnect (``outage``), so an expiry that empties the cohort
        later in the same outage never holds it past ``outage + tenure_hold``.
        """
        checksum = group.checksum
        assert checksum is not None
        assert group.receiver is not None
        settings = self._settings
        gone = group.outage_gone
        members = gone[1] if gone is not None and gone[0] == outage else {}
        group.outage_gone = None
        old = group.hold
        if old is not None:
            # A second emptying within an earlier hold's window: those not back stay served.
            members = {**old.last_known, **members}
        until = outage + settings.tenure_hold
        last_known_until = min(outage + settings.registration_ttl, until)
        hold = group.hold = _Hold(outage, until, members, last_known_until)
        self._timer_seq += 1
        heapq.heappush(self._holds, (until, self._timer_seq, group))
        if last_known_until > self._now and members:
            cohort = group.cohorts[checksum]
            log = cohort.log
            for iid in members:
                log.append(iid)  # served again (or still) on its last known record
            heapq.heappush(self._last_known_ends, (last_known_until, self._timer_seq, group))
        else:
            hold.last_known = {}
        self._out.append(
            fx.TenureHeld(
                group.key,
                checksum,
                group.receiver,
                group.generation,
                until,
                tuple(sorted(r.key for r in hold.last_known.values())),
                last_known_until if hold.last_known else None,
            )
        )
        self._mark_dirty(group)
        self._mark_lora(group)

    def _add_during_hold(self, group: _Group, hold: _Hold, reg: Registration) -> None:
        """Place an instance of the checksum a hold (or its last-known-good window) is about."""
        key = reg.key
        iid = reg.instance_id
        self._regs[key] = reg
        prior = hold.members.get(iid)
        returning = prior is not None and prior.key == key
        if hold.held and not returning:
            # A new instance does not end the hold: tracked, not admitted (see _expire_holds).
            if not hold.arrivals:
                group.seq += 1
                hold.arrival_seq = group.seq
            hold.arrivals[iid] = reg
            self._out.append(fx.WorkerPlaced(key, group.key, reg.mdc_checksum, False))
            return
        checksum = reg.mdc_checksum
        cohort = group.cohorts[checksum]
        cohort.members[iid] = reg
        cohort.log.append(iid)
        hold.last_known.pop(iid, None)
        self._out.append(fx.WorkerPlaced(key, group.key, checksum, True))
        rejoined = hold.held
        if rejoined:
            # A pre-hold member is back: the emptying was the outage's; the new instances
            # join the incumbent with it.
            for arrival in hold.arrivals.values():
                cohort.members[arrival.instance_id] = arrival
                cohort.log.append(arrival.instance_id)
            hold.arrivals = {}
            hold.arrival_seq = None
            self._end_hold(group, "rejoined")
        if not hold.last_known:
            group.hold = None
        self._mark_dirty(group)
        if key in self._adapters_at or rejoined:
            self._mark_lora(group)
        state = group.status.state
        if state is _RETRYING or state is _BLOCKED:
            self._rebuild_now(group)
        elif state is _QUEUED and rejoined:
            # Its queue entry may have been passed over while held: queue it again, under a
            # fresh generation so that no build starts after a newer one.
            group.generation = generation = self._next_generation()
            self._queue.append((group, generation))

    def _remove_arrival(self, group: _Group, hold: _Hold, reg: Registration) -> None:
        del hold.arrivals[reg.instance_id]
        if not hold.arrivals:
            hold.arrival_seq = None  # it would have emptied and left: a return is new again
        self._out.append(fx.WorkerDeparted(reg.key, group.key, reg.mdc_checksum, False))

    def _end_hold(self, group: _Group, outcome: Literal["rejoined", "expired"]) -> None:
        hold = group.hold
        assert group.checksum is not None
        assert hold is not None
        hold.held = False
        self._out.append(
            fx.TenureHoldEnded(group.key, group.checksum, outcome, self._now - hold.since)
        )

    def _expire_holds(self) -> None:
        now = self._now
        ends = self._last_known_ends
        while ends and ends[0][0] <= now:
            until, _seq, group = heapq.heappop(ends)
            hold = group.hold
            if hold is None or hold.last_known_until != until or not hold.last_known:
                continue  # the tenure ended, or every member is back
            self._stop_serving_last_known(group, hold)
        holds = self._holds
        while holds and holds[0][0] <= now:
            deadline, _seq, group = heapq.heappop(holds)
            hold = group.hold
            if hold is None or not hold.held or hold.until != deadline:
                continue  # a member rejoined before the deadline
            checksum = group.checksum
            assert checksum is not None
            self._end_hold(group, "expired")
            del group.cohorts[checksum]
            group.reported.discard(checksum)
            if hold.arrivals:
                # The new instances make the cohort they would have made with no hold, in the
                # place their first registration would have put it.
                assert hold.arrival_seq is not None
                cohort = _Cohort(checksum, hold.arrival_seq)
                cohort.members = hold.arrivals
                ordered = sorted([*group.cohorts.values(), cohort], key=_by_seq)
                group.cohorts = {c.checksum: c for c in ordered}
            self._succeed(group)

    def _stop_serving_last_known(self, group: _Group, hold: _Hold) -> None:
        """One registration TTL is over: members not back by now were not alive."""
        assert group.checksum is not None
        log = group.cohorts[group.checksum].log
        for iid in hold.last_known:
            log.append(~iid)
        hold.last_known = {}
        if not hold.held:
            group.hold = None
        self._mark_dirty(group)

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
        self._out.append(
            fx.RejectionReported(
                group=group.key,
                model=group.key.model,
                worker_set=group.key.worker_set,
                incumbent_checksum=group.checksum,
                rejected_checksum=cohort.checksum,
                instance=_representative(cohort).key,
            )
        )
