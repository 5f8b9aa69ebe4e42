"""Property: a tenure hold delays a decision and never changes it.

For any sequence of discovery inputs, the core with a hold reaches, once every hold has
expired, the state of the same inputs with ``tenure_hold=0``: the same incumbent, the same
cohorts in the same order with the same members, the same admitted ids. The one exception is
the case the hold exists for: a member the incumbent had when a hold began registered again
before it expired (``TenureHoldEnded("rejoined")``), and the tenure went on.
"""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import example, given, settings
from hypothesis import strategies as st
from support.registrations import G, reg
from workerset_admission.admission import (
    AdmissionCore,
    BuildFinished,
    CoreSettings,
    Input,
    Listing,
    StartBuild,
    TenureHoldEnded,
    Tick,
    WorkerAdded,
    WorkerRemoved,
)

HOLD = 30.0
TTL = 10.0

# One operation: ("add", id, checksum), ("remove", id), ("listing", ids, reconnect),
# ("expire", id) (an expiry soon after the last reconnect) or ("tick", seconds).
Op = tuple[object, ...]
ids = st.integers(1, 5)
ops = st.one_of(
    st.tuples(st.just("add"), ids, st.sampled_from("ABC")),
    st.tuples(st.just("remove"), ids),
    st.tuples(st.just("listing"), st.frozensets(ids), st.booleans()),
    st.tuples(st.just("expire"), ids),
    st.tuples(st.just("tick"), st.sampled_from([1.0, 5.0, 9.0, 20.0, 40.0])),
)


class Driven:
    """A core whose builds all succeed at once, fed the same operations as its twin."""

    def __init__(self, hold: float) -> None:
        self.core = AdmissionCore(CoreSettings(tenure_hold=hold, registration_ttl=TTL))
        self.rejoined = False

    def apply(self, event: Input) -> None:
        pending = [event]
        while pending:
            for effect in self.core.apply(pending.pop(0)):
                if isinstance(effect, StartBuild):
                    group, checksum, generation = (
                        effect.group,
                        effect.mdc_checksum,
                        effect.generation,
                    )
                    pending.append(BuildFinished(group, checksum, generation, True))
                elif isinstance(effect, TenureHoldEnded) and effect.outcome == "rejoined":
                    self.rejoined = True

    def decision(self) -> tuple[object, ...]:
        view = self.core.group(G)
        if view is None:
            return (None, (), ())
        cohorts = tuple((c.mdc_checksum, c.instance_ids) for c in view.cohorts)
        return (view.incumbent, cohorts, view.admitted)


def run(operations: Sequence[Op]) -> tuple[Driven, Driven]:
    held, unheld = Driven(HOLD), Driven(0.0)
    now = 0.0
    checksum: dict[int, str] = {}  # the first incarnation of each key (later puts are refused)
    for op in operations:
        events: list[Input] = []
        match op:
            case ("add", int() as iid, str() as cs):
                checksum.setdefault(iid, cs)
                events = [WorkerAdded(reg(iid, cs))]
            case ("remove", int() as iid):
                events = [WorkerRemoved(reg(iid).key)]
            case ("expire", int() as iid):
                # What happened, and when: the core judges whether the outage did it.
                events = [WorkerRemoved(reg(iid).key, expired_at=now)]
            case ("listing", frozenset() as listed, bool() as reconnect):
                regs = [reg(i, checksum[i]) for i in sorted(listed) if i in checksum]
                events = [Listing(regs, reconnect=reconnect)]
            case ("tick", float() as seconds):
                now += seconds
                events = [Tick(now)]
        for event in events:
            held.apply(event)
            unheld.apply(event)
    # Past every hold and every last-known-good window.
    for driven in (held, unheld):
        driven.apply(Tick(now + HOLD + TTL + 1.0))
    return held, unheld


@settings(max_examples=400, deadline=None)
@given(st.lists(ops, max_size=25))
# The trace of the defect this rule answers: a new instance of the incumbent's checksum during
# the hold used to end it and take the WorkerSet back.
@example(
    [
        ("add", 1, "A"),
        ("add", 2, "B"),
        ("listing", frozenset({2}), True),
        ("tick", 5.0),
        ("add", 3, "A"),
    ]
)
def test_once_every_hold_has_expired_the_state_is_that_of_no_hold(operations: list[Op]) -> None:
    held, unheld = run(operations)
    if not held.rejoined:
        assert held.decision() == unheld.decision()


def test_a_pre_hold_member_returning_is_the_one_case_that_keeps_the_tenure() -> None:
    trace: list[Op] = [
        ("add", 1, "A"),
        ("add", 2, "B"),
        ("listing", frozenset({2}), True),
        ("tick", 5.0),
        ("add", 1, "A"),
    ]
    held, unheld = run(trace)
    assert held.rejoined
    assert held.decision()[0] == "A"
    assert unheld.decision()[0] == "B"
