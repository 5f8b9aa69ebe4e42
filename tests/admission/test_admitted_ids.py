"""Admitted ids: lazy, immutable, equal by value, and exact after any changes."""

from __future__ import annotations

import copy
import pickle

from hypothesis import given, settings
from hypothesis import strategies as st
from support.registrations import reg
from workerset_admission.admission import (
    AdmissionCore,
    BuildFinished,
    PublishAdmissions,
    StartBuild,
    WorkerAdded,
    WorkerRemoved,
)
from workerset_admission.admission.admitted import AdmittedIds, AdmittedLog


class _Ids(AdmittedLog):
    """An AdmittedLog driven like a cohort drives it, beside the plain set it must match."""

    __slots__ = ("ids",)

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[int] = set()

    def add(self, iid: int) -> None:
        self.ids.add(iid)
        self.log.append(iid)

    def remove(self, iid: int) -> None:
        self.ids.discard(iid)
        self.log.append(~iid)

    def take(self) -> AdmittedIds:
        return self.admitted_ids(self.ids)


def test_admitted_ids_read_as_the_base_with_their_share_of_the_log_applied() -> None:
    ids = _Ids()
    for iid in range(20):
        ids.add(iid)
    for iid in range(0, 20, 3):
        ids.remove(iid)
    ids.add(0)
    handed_out = ids.take()
    assert handed_out.as_frozenset() == frozenset(ids.ids)
    assert type(handed_out.as_frozenset()) is frozenset
    # Worked out once: the second read hands back the same object.
    assert handed_out.as_frozenset() is handed_out.as_frozenset()


def test_admitted_ids_are_unaffected_by_changes_made_after_them() -> None:
    ids = _Ids()
    ids.add(1)
    ids.add(2)
    before = ids.take()
    ids.remove(1)
    ids.add(3)
    after = ids.take()
    # Neither was read before the changes: each still sees exactly its own moment.
    assert before == frozenset({1, 2})
    assert after == frozenset({2, 3})


def test_the_log_is_folded_into_a_new_base_once_it_outgrows_the_old_one() -> None:
    ids = _Ids()
    first_log = ids.log
    for iid in range(40):
        ids.add(iid)
    handed_out = ids.take()
    # 40 changes over an empty base: the ids handed out start from a fresh base and a new log.
    assert ids.log is not first_log
    assert ids.log == []
    assert ids.base == frozenset(range(40))
    assert handed_out == frozenset(range(40))
    assert ids.limit == 40


def test_old_admitted_ids_stay_right_across_several_rebases() -> None:
    ids = _Ids()
    for iid in range(40):
        ids.add(iid)
    ids.take()
    # Old ids handed out that depend on their log: five joins and two departures past the base.
    for iid in range(40, 45):
        ids.add(iid)
    ids.remove(0)
    ids.remove(41)
    old = ids.take()
    expected = frozenset(range(1, 45)) - {41}
    logs = [ids.log]
    for round_ in range(5):
        # More changes than ids: every round's hand-out rebases.
        for iid in range(len(ids.ids) + 1):
            ids.add(10_000 * (round_ + 1) + iid)
        ids.take()
        assert ids.log == []
        logs.append(ids.log)
    assert len({id(log) for log in logs}) == 6
    assert old == expected
    assert len(old) == 43


def test_an_unchanged_log_hands_out_the_same_admitted_ids_again() -> None:
    ids = _Ids()
    ids.add(7)
    first = ids.take()
    assert ids.take() is first
    ids.remove(7)
    assert ids.take() is not first


def test_admitted_ids_equal_and_hash_like_the_frozenset_of_their_ids() -> None:
    ids = _Ids()
    for iid in (5, 3, 9):
        ids.add(iid)
    ids.remove(3)
    handed_out = ids.take()
    assert handed_out == frozenset({5, 9})
    assert frozenset({5, 9}) == handed_out
    assert handed_out == {5, 9}
    assert handed_out != frozenset({5})
    assert handed_out == AdmittedIds.of(frozenset({9, 5}))
    assert hash(handed_out) == hash(frozenset({5, 9}))
    assert handed_out != [5, 9]
    assert repr(handed_out) == "AdmittedIds([5, 9])"
    assert (len(handed_out), 5 in handed_out, 3 in handed_out) == (2, True, False)
    assert sorted(handed_out) == [5, 9]
    assert handed_out & {9, 10} == frozenset({9})


def test_copies_and_pickles_of_admitted_ids_carry_the_ids() -> None:
    ids = _Ids()
    ids.add(1)
    ids.add(2)
    handed_out = ids.take()
    ids.remove(2)
    assert copy.deepcopy(handed_out) == frozenset({1, 2})
    assert pickle.loads(pickle.dumps(handed_out)) == frozenset({1, 2})


def test_of_wraps_any_set_of_ids_and_keeps_admitted_ids_as_they_are() -> None:
    handed_out = AdmittedIds.of([3, 1, 3])
    assert handed_out == frozenset({1, 3})
    assert AdmittedIds.of(handed_out) is handed_out


def test_a_publication_made_from_a_frozenset_equals_one_the_core_made() -> None:
    core = AdmissionCore()
    effects = core.apply(WorkerAdded(reg(1)))
    published = next(e for e in effects if isinstance(e, PublishAdmissions))
    made = PublishAdmissions(
        published.group, published.receiver, "A", published.generation, frozenset({1})
    )
    assert made == published
    assert hash(made) == hash(published)
    assert made.admitted == published.admitted == frozenset({1})


_CHANGES = st.lists(st.tuples(st.booleans(), st.integers(0, 40)), max_size=300)


@settings(max_examples=150, deadline=None)
@given(_CHANGES)
def test_every_admitted_ids_of_a_log_matches_a_plain_set_of_the_same_changes(
    changes: list[tuple[bool, int]],
) -> None:
    ids = _Ids()
    taken: list[tuple[AdmittedIds, frozenset[int]]] = []
    for add, iid in changes:
        if add and iid not in ids.ids:
            ids.add(iid)
        elif not add and iid in ids.ids:
            ids.remove(iid)
        taken.append((ids.take(), frozenset(ids.ids)))
    # Read only now, after every later change and rebase.
    for handed_out, expected in taken:
        assert handed_out == expected


_STEPS = st.lists(
    st.tuples(st.booleans(), st.integers(1, 60), st.sampled_from(["A", "B"])), max_size=250
)


@settings(max_examples=100, deadline=None)
@given(_STEPS)
def test_every_publication_of_the_core_is_exactly_the_registered_ids_of_its_checksum(
    steps: list[tuple[bool, int, str]],
) -> None:
    core = AdmissionCore()
    # The naive model: which checksum each registered instance id carries.
    registered: dict[int, str] = {}
    published: list[tuple[PublishAdmissions, frozenset[int]]] = []

    def run(event: WorkerAdded | WorkerRemoved | BuildFinished) -> None:
        pending = [event]
        while pending:
            for effect in core.apply(pending.pop()):
                if isinstance(effect, PublishAdmissions):
                    expected = frozenset(
                        i for i, cs in registered.items() if cs == effect.mdc_checksum
                    )
                    published.append((effect, expected))
                elif isinstance(effect, StartBuild):
                    pending.append(
                        BuildFinished(effect.group, effect.mdc_checksum, effect.generation, True)
                    )

    for add, iid, checksum in steps:
        if add and iid not in registered:
            registered[iid] = checksum
            run(WorkerAdded(reg(iid, checksum)))
        elif not add and iid in registered:
            checksum = registered.pop(iid)
            run(WorkerRemoved(reg(iid, checksum).key))
    # Every publication is read only now, after all later changes, rebases and successions.
    for effect, expected in published:
        assert effect.admitted == expected


def test_published_admitted_ids_read_as_the_frozenset_of_the_ids() -> None:
    core = AdmissionCore()
    effects = core.apply(WorkerAdded(reg(1, "A")))
    effects += core.apply(WorkerAdded(reg(2, "A")))
    effects += core.apply(WorkerAdded(reg(3, "B")))
    effects += core.apply(WorkerRemoved(reg(1, "A").key))
    publications = [e for e in effects if isinstance(e, PublishAdmissions)]
    assert [p.admitted for p in publications] == [
        frozenset({1}),
        frozenset({1, 2}),
        frozenset({2}),
    ]
    assert all(type(p.admitted) is frozenset for p in publications)
