"""Drains as a property: a drain decides what a departure decides; a handover serves drained ids.

A core that is given drains and a shadow core that is given, instead, the drained workers'
removals (and their registrations again when a drain is lifted) must agree at every step on
every group's incumbent, status and cohorts: for admission a drain is a departure. What only
the drained core has, the handover, is held to its own invariants: it serves drained members
only, through the old receiver, which is retired once it ends and never sees a successor's ids.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from support.registrations import group_key, reg
from workerset_admission.admission import (
    AdmissionCore,
    BuildFinished,
    Drain,
    DrainLifted,
    DrainSet,
    Effect,
    Input,
    Listing,
    PublishAdmissions,
    RetireReceiver,
    Tick,
    WorkerAdded,
    WorkerRemoved,
)
from workerset_admission.identity import EndpointId, Registration

NAMESPACE = "ns1"
GROUPS = [
    group_key("m", EndpointId(NAMESPACE, "workers", "generate")),
    group_key("n", EndpointId(NAMESPACE, "prefill", "generate")),
]
instance = st.integers(min_value=1, max_value=4)
checksum = st.sampled_from(["A", "B", "C"])


class DrainMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.core = AdmissionCore()
        self.shadow = AdmissionCore()
        # Registrations by key as the bucket holds them, and the drained workers.
        self.present: dict[str, Registration] = {}
        self.drained: set[int] = set()
        self.now = 0.0
        self.retired: set[int] = set()
        self.published: dict[int, frozenset[int]] = {}

    # -- stepping both cores -----------------------------------------------------------------

    def _core(self, event: Input) -> None:
        effects = self.core.apply(event)
        self._watch(effects)

    def _shadow(self, event: Input) -> None:
        self.shadow.apply(event)

    def _watch(self, effects: list[Effect]) -> None:
        for effect in effects:
            if isinstance(effect, PublishAdmissions):
                assert effect.receiver not in self.retired, "a retired receiver published"
                self.published[effect.receiver] = effect.admitted
            elif isinstance(effect, RetireReceiver):
                self.retired.add(effect.receiver)

    def _placed_in_shadow(self, iid: int) -> list[Registration]:
        return sorted(
            (r for r in self.present.values() if r.instance_id == iid), key=lambda r: r.key
        )

    # -- rules ---------------------------------------------------------------------------------

    @rule(g=st.sampled_from([0, 1]), iid=instance, cs=checksum)
    def add(self, g: int, iid: int, cs: str) -> None:
        registration = reg(iid, cs, group=GROUPS[g])
        if registration.key in self.present:
            return  # an in-place change is refused alike; not the subject here
        self.present[registration.key] = registration
        self._core(WorkerAdded(registration))
        if iid not in self.drained:
            self._shadow(WorkerAdded(registration))

    @rule(data=st.data())
    def remove(self, data: st.DataObject) -> None:
        if not self.present:
            return
        key = data.draw(st.sampled_from(sorted(self.present)))
        registration = self.present.pop(key)
        self._core(WorkerRemoved(key))
        if registration.instance_id not in self.drained:
            self._shadow(WorkerRemoved(key))

    @rule(iid=instance)
    def drain(self, iid: int) -> None:
        self._core(DrainSet(Drain(NAMESPACE, iid, "ops")))
        if iid in self.drained:
            return
        self.drained.add(iid)
        self.shadow.apply_many([WorkerRemoved(r.key) for r in self._placed_in_shadow(iid)])

    @rule(iid=instance)
    def lift(self, iid: int) -> None:
        self._core(DrainLifted(NAMESPACE, iid))
        if iid not in self.drained:
            return
        self.drained.discard(iid)
        for registration in self._placed_in_shadow(iid):
            self._shadow(WorkerAdded(registration))

    @rule()
    def relist(self) -> None:
        listed = sorted(self.present.values(), key=lambda r: r.key)
        drains = [Drain(NAMESPACE, iid, "ops") for iid in sorted(self.drained)]
        self._core(Listing(listed, drains=drains))
        self._shadow(Listing([r for r in listed if r.instance_id not in self.drained]))

    @rule(g=st.sampled_from([0, 1]), ok=st.booleans())
    def build_result(self, g: int, ok: bool) -> None:
        for core, step in ((self.core, self._core), (self.shadow, self._shadow)):
            view = core.group(GROUPS[g])
            if view is None or view.incumbent is None or view.generation is None:
                continue
            step(BuildFinished(GROUPS[g], view.incumbent, view.generation, ok))

    @rule()
    def builds_succeed(self) -> None:
        # Handovers begin only from a committed tenure: make commits common.
        for g in (0, 1):
            self.build_result(g, True)

    @rule(dt=st.sampled_from([1.0, 4.0, 30.0]))
    def tick(self, dt: float) -> None:
        self.now += dt
        self._core(Tick(self.now))
        self._shadow(Tick(self.now))

    # -- invariants ----------------------------------------------------------------------------

    @invariant()
    def a_drain_decides_what_a_departure_decides(self) -> None:
        for key in GROUPS:
            mine, theirs = self.core.group(key), self.shadow.group(key)
            if theirs is None or mine is None:
                # A drained worker's registration may make a group the shadow never saw.
                assert theirs is None
                assert mine is None or mine.incumbent is None
                continue
            assert (mine.incumbent, mine.status) == (theirs.incumbent, theirs.status)
            assert [(c.mdc_checksum, c.instance_ids) for c in mine.cohorts] == [
                (c.mdc_checksum, c.instance_ids) for c in theirs.cohorts
            ]
            assert mine.admitted == theirs.admitted

    @invariant()
    def no_drained_worker_is_admitted_except_by_the_tenure_it_hands_over(self) -> None:
        for key in GROUPS:
            view = self.core.group(key)
            if view is None:
                continue
            assert not set(view.admitted) & self.drained
            handover = view.handover
            if handover is not None:
                # The successor's commit ends the handover in the same step.
                assert not view.status.committed
                assert view.incumbent is not None
                assert handover.mdc_checksum != view.incumbent or view.cohorts[0].members
                assert set(handover.members) <= self.drained
                assert handover.receiver not in self.retired
                assert self.published[handover.receiver] == frozenset(handover.members)


TestDrainMachine = DrainMachine.TestCase
TestDrainMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
