"""Stateful property test: the core against a small reference model, checked after every step."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from support.fakes import handle_all
from support.registrations import lora, reg
from workerset_admission.admission import (
    AdmissionCore,
    BuildDiscarded,
    BuildFinished,
    CancelBuild,
    CommitFailed,
    CommitGroup,
    CoreSettings,
    Effect,
    GroupStatus,
    Input,
    OpenReceiver,
    RejectionReported,
    Snapshot,
    StartBuild,
    Tick,
    WorkerAdded,
    WorkerRemoved,
)
from workerset_admission.errors import ReceiverRetired
from workerset_admission.identity import (
    EndpointId,
    GroupKey,
    Registration,
    WorkerType,
    instance_key,
)
from workerset_admission.receivers import AdmissionChannels, AdmissionReceiver

ENDPOINTS = [EndpointId(f"ns{i}", "workers", "generate") for i in range(3)]
GROUPS = [GroupKey.build("m", ep, "chat", WorkerType.AGGREGATED) for ep in ENDPOINTS]
CHECKSUMS = ["A", "B", "C"]
HOLD = 10.0

group_index = st.integers(0, len(GROUPS) - 1)
instance = st.integers(1, 6)
checksum = st.sampled_from(CHECKSUMS)


def base(g: int, iid: int, cs: str, fingerprint: str = "f") -> Registration:
    return reg(iid, cs, group=GROUPS[g], fingerprint=fingerprint)


def adapter(g: int, iid: int, suffix: str, fingerprint: str) -> Registration:
    return lora(
        iid,
        suffix,
        fingerprint=fingerprint,
        endpoint=ENDPOINTS[g],
        checksum="lora",
        worker_type=WorkerType.AGGREGATED,
    )


@dataclass
class RefGroup:
    """What the contract says a group must look like, computed independently of the core."""

    order: list[str] = field(default_factory=list)
    members: dict[str, dict[str, int]] = field(default_factory=dict)
    incarnation: dict[str, int] = field(default_factory=dict)
    # When a post-outage resync emptied the incumbent: the clock value its hold ends at.
    held_until: float | None = None

    def add(self, key: str, cs: str, iid: int) -> None:
        if cs not in self.order:
            self.order.append(cs)
            self.members[cs] = {}
            self.incarnation[cs] = self.incarnation.get(cs, 0) + 1
        self.members[cs][key] = iid
        if self.order[0] == cs:
            self.held_until = None

    def remove(self, key: str, cs: str, hold_until: float | None = None) -> None:
        del self.members[cs][key]
        if not self.members[cs]:
            if hold_until is not None and self.order[0] == cs:
                # The tenure is held: the empty incumbent stays in front, admitting nobody.
                if self.held_until is None:
                    self.held_until = hold_until
                return
            del self.members[cs]
            self.order.remove(cs)

    def tick(self, now: float) -> None:
        if self.held_until is not None and self.held_until <= now:
            self.held_until = None
            del self.members[self.order.pop(0)]

    def admitted(self) -> tuple[int, ...]:
        return tuple(sorted(self.members[self.order[0]].values())) if self.order else ()

    def incumbent_members(self) -> tuple[str | None, frozenset[str]]:
        if not self.order:
            return None, frozenset()
        return self.order[0], frozenset(self.members[self.order[0]])


class AdmissionMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.core = AdmissionCore(CoreSettings(max_concurrent_builds=2, tenure_hold=HOLD))
        self.channels = AdmissionChannels()
        self.ref = [RefGroup() for _ in GROUPS]
        self.first: dict[str, Registration] = {}  # first incarnation per key
        self.adapters: dict[str, Registration] = {}
        self.in_flight: dict[GroupKey, tuple[str, int]] = {}
        self.commits: dict[GroupKey, tuple[str, int]] = {}
        self.old_results: list[tuple[GroupKey, str, int]] = []
        self.now = 0.0
        self.last_start = 0
        self.last_open = 0
        self.reports: set[tuple[GroupKey, str, int, str, int]] = set()
        self.retired: list[AdmissionReceiver] = []
        self.receivers: dict[GroupKey, AdmissionReceiver] = {}
        self.incumbents: list[str | None] = [None] * len(GROUPS)
        # Each group's incumbent cohort and members as of the end of the last step.
        self.seen_members = [ref.incumbent_members() for ref in self.ref]

    # ------------------------------------------------------------------ driving

    def _apply(self, event: Input) -> list[Effect]:
        effects = self.core.apply(event)
        handle_all(self.channels, effects)
        for effect in effects:
            if isinstance(effect, StartBuild):
                assert effect.generation > self.last_start, "build generations must increase"
                self.last_start = effect.generation
                self.in_flight[effect.group] = (effect.mdc_checksum, effect.generation)
            elif isinstance(effect, CancelBuild):
                self.old_results.append((effect.group, effect.mdc_checksum, effect.generation))
                del self.in_flight[effect.group]
            elif isinstance(effect, CommitGroup):
                self.commits[effect.group] = (effect.mdc_checksum, effect.generation)
            elif isinstance(effect, OpenReceiver):
                assert effect.generation > self.last_open
                assert effect.generation > self.last_start
                self.last_open = effect.generation
            elif isinstance(effect, RejectionReported):
                g = GROUPS.index(effect.group)
                ref = self.ref[g]
                pair = (
                    effect.group,
                    effect.incumbent_checksum,
                    ref.incarnation[effect.incumbent_checksum],
                    effect.rejected_checksum,
                    ref.incarnation[effect.rejected_checksum],
                )
                assert pair not in self.reports, f"reported twice: {pair}"
                self.reports.add(pair)
        return effects

    def _ref_add(self, registration: Registration) -> None:
        if registration.key in self.first:
            return  # a duplicate or a refused in-place change: the first incarnation stays
        self.first[registration.key] = registration
        g = GROUPS.index(registration.group)
        self.ref[g].add(registration.key, registration.mdc_checksum, registration.instance_id)

    def _ref_remove(self, key: str, hold_until: float | None = None) -> None:
        registration = self.first.pop(key, None)
        if registration is not None:
            g = GROUPS.index(registration.group)
            self.ref[g].remove(key, registration.mdc_checksum, hold_until)

    def _check_succession(self, before: list[str | None]) -> None:
        for g, old in enumerate(before):
            view = self.core.group(GROUPS[g])
            new = None if view is None else view.incumbent
            if old is not None and new != old:
                assert old not in self.ref[g].members, "incumbent replaced while it had members"
                assert self.ref[g].held_until is None, "incumbent replaced while it was held"

    def _check_backoff(self, waiting: list[bool]) -> None:
        # A retry backoff is about the members it failed with: once the incumbent cohort
        # gains or loses a worker, the rebuild starts at once (Dynamo 1.6.1's rule).
        for g, was_waiting in enumerate(waiting):
            now = self.ref[g].incumbent_members()
            if was_waiting and now != self.seen_members[g]:
                view = self.core.group(GROUPS[g])
                assert view is not None
                assert view.status not in (GroupStatus.RETRYING, GroupStatus.BLOCKED)
            self.seen_members[g] = now

    def _step(self, event: Input) -> None:
        views = [self.core.group(key) for key in GROUPS]
        before = [None if v is None else v.incumbent for v in views]
        waiting = [
            v is not None and v.status in (GroupStatus.RETRYING, GroupStatus.BLOCKED) for v in views
        ]
        self._apply(event)
        self._check_succession(before)
        self._check_backoff(waiting)

    # ------------------------------------------------------------------ rules

    @rule(g=group_index, iid=instance, cs=checksum)
    def add(self, g: int, iid: int, cs: str) -> None:
        registration = base(g, iid, cs)
        self._ref_add(registration)
        self._step(WorkerAdded(registration))

    @precondition(lambda self: bool(self.first))
    @rule(data=st.data())
    def duplicate(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.first)))
        before = self.core.groups()
        assert self.core.apply(WorkerAdded(self.first[key])) == []
        assert self.core.groups() == before

    @rule(g=group_index, iid=instance)
    def remove(self, g: int, iid: int) -> None:
        key = instance_key(ENDPOINTS[g], iid)
        self._ref_remove(key)
        self._step(WorkerRemoved(key))

    @rule(data=st.data(), reconnect=st.booleans())
    def snapshot(self, data: st.DataObject, reconnect: bool) -> None:
        keep = data.draw(st.lists(st.sampled_from(sorted(self.first) or ["none"]), unique=True))
        fresh = data.draw(
            st.lists(st.tuples(group_index, instance, checksum), max_size=3).map(
                lambda xs: [base(*x) for x in xs]
            )
        )
        retain = data.draw(st.lists(st.sampled_from(sorted(self.first) or ["none"]), unique=True))
        retain = [k for k in retain if k in self.first and k not in keep]
        listed = [self.first[k] for k in keep if k in self.first] + fresh
        listed += list(self.adapters.values())
        for registration in fresh:
            self._ref_add(registration)
        listed_keys = {r.key for r in listed} | set(retain)
        hold_until = self.now + HOLD if reconnect else None
        for key in [k for k in self.first if k not in listed_keys]:
            self._ref_remove(key, hold_until)
        self._step(Snapshot(listed, retain, reconnect=reconnect))

    @precondition(lambda self: bool(self.in_flight))
    @rule(data=st.data(), ok=st.booleans())
    def build_result(self, data: st.DataObject, ok: bool) -> None:
        group = data.draw(st.sampled_from(sorted(self.in_flight)))
        cs, generation = self.in_flight.pop(group)
        self.old_results.append((group, cs, generation))
        self._step(BuildFinished(group, cs, generation, ok))

    @precondition(lambda self: bool(self.old_results))
    @rule(data=st.data(), ok=st.booleans())
    def stale_result(self, data: st.DataObject, ok: bool) -> None:
        group, cs, generation = data.draw(st.sampled_from(self.old_results))
        before = self.core.groups()
        effects = self.core.apply(BuildFinished(group, cs, generation, ok))
        assert [type(e) for e in effects] == [BuildDiscarded]
        assert self.core.groups() == before

    @precondition(lambda self: bool(self.commits))
    @rule(data=st.data(), phase=st.sampled_from(["commit", "replace"]))
    def commit_failed(self, data: st.DataObject, phase: str) -> None:
        group = data.draw(st.sampled_from(sorted(self.commits)))
        cs, generation = self.commits[group]
        self._step(CommitFailed(group, cs, generation, phase))  # type: ignore[arg-type]

    @rule(dt=st.sampled_from([0.5, 1.0, 2.0, 8.0, 30.0]))
    def tick(self, dt: float) -> None:
        self.now += dt
        for ref in self.ref:
            ref.tick(self.now)
        self._step(Tick(self.now))

    @rule(
        g=group_index,
        iid=instance,
        suffix=st.sampled_from(["x", "y"]),
        fp=st.sampled_from(["1", "2"]),
    )
    def add_adapter(self, g: int, iid: int, suffix: str, fp: str) -> None:
        registration = adapter(g, iid, suffix, fp)
        self.adapters[registration.key] = registration
        self._step(WorkerAdded(registration))

    @precondition(lambda self: bool(self.adapters))
    @rule(data=st.data())
    def remove_adapter(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.adapters)))
        del self.adapters[key]
        self._step(WorkerRemoved(key))

    @rule(g=group_index)
    def hold_receiver(self, g: int) -> None:
        receiver = self.channels.subscribe(GROUPS[g])
        if receiver is not None:
            self.receivers.setdefault(GROUPS[g], receiver)

    # ------------------------------------------------------------------ invariants

    @invariant()
    def admitted_ids_are_the_live_members_of_the_incumbent_cohort(self) -> None:
        for g, key in enumerate(GROUPS):
            view = self.core.group(key)
            expected = self.ref[g].admitted()
            if view is None:
                assert expected == ()
                continue
            assert view.admitted == expected
            assert view.incumbent == (self.ref[g].order[0] if self.ref[g].order else None)
            assert view.held_until == self.ref[g].held_until
            live = self.channels.subscribe(key)
            if live is not None:
                assert tuple(sorted(live.current().admitted)) == expected

    @invariant()
    def cohort_order_is_first_observation_order_of_non_empty_cohorts(self) -> None:
        for g, key in enumerate(GROUPS):
            view = self.core.group(key)
            order = [] if view is None else [c.mdc_checksum for c in view.cohorts]
            assert order == self.ref[g].order

    @invariant()
    def a_retired_receiver_never_shows_ids_again(self) -> None:
        for key, receiver in list(self.receivers.items()):
            if receiver.retired:
                self.retired.append(receiver)
                del self.receivers[key]
        for receiver in self.retired:
            with pytest.raises(ReceiverRetired):
                receiver.current()

    @invariant()
    def adapters_project_only_onto_admitted_workers(self) -> None:
        for g, key in enumerate(GROUPS):
            view = self.core.group(key)
            if view is None:
                continue
            admitted = set(view.admitted)
            expected = sorted(
                (a.instance_id, a.key, a.lora_fingerprint)
                for a in self.adapters.values()
                if a.endpoint == ENDPOINTS[g] and a.instance_id in admitted
            )
            got = sorted(
                (w.instance_id, a.key, a.lora_fingerprint) for w in view.lora for a in w.adapters
            )
            assert got == expected

    @invariant()
    def builds_in_flight_stay_within_the_limit(self) -> None:
        assert self.core.builds_in_flight <= 2
        assert self.core.builds_in_flight == len(self.in_flight)


TestAdmissionMachine = AdmissionMachine.TestCase
TestAdmissionMachine.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
