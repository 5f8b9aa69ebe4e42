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
    Listing,
    OpenReceiver,
    RejectionReported,
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
from workerset_admission.service.receivers import AdmissionChannels, AdmissionReceiver

ENDPOINTS = [EndpointId(f"ns{i}", "workers", "generate") for i in range(3)]
GROUPS = [GroupKey.build("m", ep, "chat", WorkerType.AGGREGATED) for ep in ENDPOINTS]
CHECKSUMS = ["A", "B", "C"]
HOLD = 10.0
TTL = 4.0

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

    # Cohorts in order; while a hold tracks new instances of the incumbent's checksum, a
    # marker "+<checksum>" stands where their cohort would be with no hold.
    order: list[str] = field(default_factory=list)
    members: dict[str, dict[str, int]] = field(default_factory=dict)
    incarnation: dict[str, int] = field(default_factory=dict)
    # When an outage's removal emptied the incumbent: the clock value its hold ends at.
    held_until: float | None = None
    # The members it had then (only these end the hold), and those served on last known good.
    prehold: dict[str, int] = field(default_factory=dict)
    last_known: dict[str, int] = field(default_factory=dict)
    last_known_until: float | None = None
    arrivals: dict[str, int] = field(default_factory=dict)
    # Incumbent members taken by the removals of one reconnect: (its time, key -> id).
    gone: tuple[float, dict[str, int]] | None = None

    def cohorts(self) -> list[str]:
        return [cs for cs in self.order if not cs.startswith("+")]

    def add(self, key: str, cs: str, iid: int) -> None:
        incumbent = self.order[0] if self.order else None
        if self.held_until is not None and cs == incumbent:
            if key not in self.prehold:
                if not self.arrivals:
                    self.order.append("+" + cs)
                self.arrivals[key] = iid
                return
            self.members[cs].update(self.arrivals)
            self.arrivals = {}
            if self.order.count("+" + cs):
                self.order.remove("+" + cs)
            self.held_until = None
            self.prehold = {}
        if cs == incumbent:
            self.last_known.pop(key, None)
        if cs not in self.order:
            self.order.append(cs)
            self.members[cs] = {}
            self.incarnation[cs] = self.incarnation.get(cs, 0) + 1
        self.members[cs][key] = iid

    def remove(self, key: str, cs: str, now: float, outage: float | None = None) -> None:
        incumbent = self.order[0]
        if self.held_until is not None and cs == incumbent:
            del self.arrivals[key]
            if not self.arrivals:
                self.order.remove("+" + cs)
            return
        iid = self.members[cs].pop(key)
        if cs == incumbent and outage is not None:
            if self.gone is None or self.gone[0] != outage:
                self.gone = (outage, {})
            self.gone[1][key] = iid
        if self.members[cs]:
            return
        if cs == incumbent and outage is not None and outage + HOLD > now:
            taken = self.gone[1] if self.gone is not None and self.gone[0] == outage else {}
            self.gone = None
            self.held_until = outage + HOLD
            self.prehold = {**self.last_known, **taken}
            self.last_known_until = min(outage + TTL, self.held_until)
            self.last_known = dict(self.prehold) if self.last_known_until > now else {}
            return
        del self.members[cs]
        self.order.remove(cs)
        if cs == incumbent:
            self._tenure_ended()

    def _tenure_ended(self) -> None:
        self.held_until = None
        self.prehold, self.last_known, self.arrivals, self.gone = {}, {}, {}, None

    def tick(self, now: float) -> None:
        if self.last_known_until is not None and self.last_known_until <= now:
            self.last_known = {}
            self.last_known_until = None
        if self.held_until is not None and self.held_until <= now:
            cs = self.order.pop(0)
            del self.members[cs]
            if self.arrivals:
                # The new instances' cohort takes the place their first registration had.
                self.order[self.order.index("+" + cs)] = cs
                self.members[cs] = self.arrivals
                self.incarnation[cs] += 1
            self._tenure_ended()

    def admitted(self) -> tuple[int, ...]:
        if not self.order:
            return ()
        served = {**self.members[self.order[0]], **self.last_known}
        return tuple(sorted(set(served.values())))

    def incumbent_members(self) -> tuple[str | None, frozenset[str]]:
        if not self.order:
            return None, frozenset()
        return self.order[0], frozenset(self.members[self.order[0]])


class AdmissionMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.core = AdmissionCore(
            CoreSettings(max_concurrent_builds=2, tenure_hold=HOLD, registration_ttl=TTL)
        )
        # The clock value of the last reconnect listing: expiries may carry it.
        self.reconnected_at: float | None = None
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
        # Each group's incumbent cohort's incarnation as of the end of the last step.
        self.incumbent_incarnation = [0] * len(GROUPS)
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

    def _ref_remove(self, key: str, outage: float | None = None) -> None:
        registration = self.first.pop(key, None)
        if registration is not None:
            g = GROUPS.index(registration.group)
            self.ref[g].remove(key, registration.mdc_checksum, self.now, outage)

    def _check_succession(self, before: list[str | None]) -> None:
        for g, old in enumerate(before):
            view = self.core.group(GROUPS[g])
            new = None if view is None else view.incumbent
            if old is not None and new != old:
                # A cohort of the same checksum may be back, made by instances a hold tracked.
                same = self.ref[g].incarnation[old] == self.incumbent_incarnation[g]
                assert not (same and old in self.ref[g].members), (
                    "incumbent replaced while it had members"
                )
                assert self.ref[g].held_until is None, "incumbent replaced while it was held"
            ref = self.ref[g]
            self.incumbent_incarnation[g] = ref.incarnation[ref.order[0]] if ref.order else 0

    def _check_backoff(self, waiting: list[bool]) -> None:
        # A retry backoff is about the members it failed with: once the incumbent cohort
        # gains or loses a worker, the rebuild starts at once (Dynamo 1.6.1's rule).
        for g, was_waiting in enumerate(waiting):
            now = self.ref[g].incumbent_members()
            # A hold pauses the retry instead: there is nothing to build for.
            held = self.ref[g].held_until is not None
            if was_waiting and now != self.seen_members[g] and not held:
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

    @precondition(lambda self: self.reconnected_at is not None)
    @rule(g=group_index, iid=instance)
    def expire_after_a_reconnect(self, g: int, iid: int) -> None:
        key = instance_key(ENDPOINTS[g], iid)
        self._ref_remove(key, self.reconnected_at)
        self._step(WorkerRemoved(key, expired_at=self.now))

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
        outage = self.now if reconnect else None
        if reconnect:
            self.reconnected_at = self.now
        for key in [k for k in self.first if k not in listed_keys]:
            self._ref_remove(key, outage)
        self._step(Listing(listed, retain, reconnect=reconnect))

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
            assert view.last_known == tuple(sorted(self.ref[g].last_known.values()))
            assert view.arrivals == tuple(sorted(self.ref[g].arrivals.values()))
            live = self.channels.subscribe(key)
            if live is not None:
                assert tuple(sorted(live.current().admitted)) == expected

    @invariant()
    def cohort_order_is_first_observation_order_of_non_empty_cohorts(self) -> None:
        for g, key in enumerate(GROUPS):
            view = self.core.group(key)
            order = [] if view is None else [c.mdc_checksum for c in view.cohorts]
            assert order == self.ref[g].cohorts()

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
            # Members served on last known good keep the adapters they had when the outage took
            # their base cards, less those removed live since: never one no longer registered.
            last_known = set(view.last_known)
            admitted = set(view.admitted) - last_known
            registered = {
                (a.instance_id, a.key, a.lora_fingerprint)
                for a in self.adapters.values()
                if a.endpoint == ENDPOINTS[g]
            }
            expected = sorted(a for a in registered if a[0] in admitted)
            got = [
                (w.instance_id, a.key, a.lora_fingerprint) for w in view.lora for a in w.adapters
            ]
            assert sorted(a for a in got if a[0] not in last_known) == expected
            assert {a for a in got if a[0] in last_known} <= registered

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
