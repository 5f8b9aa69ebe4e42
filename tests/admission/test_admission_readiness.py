"""Readiness: DNF needs, legacy bypass, and equal answers for equivalent units."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st
from workerset_admission.admission.readiness import ReadinessUnit, evaluate_readiness
from workerset_admission.identity import WorkerType

P, D, E, A = WorkerType.PREFILL, WorkerType.DECODE, WorkerType.ENCODE, WorkerType.AGGREGATED


def test_no_units_means_not_ready() -> None:
    verdict = evaluate_readiness([])
    assert not verdict.ready
    assert verdict.reason == "no live workers"


def test_a_disaggregated_pair_with_both_roles_live_is_ready() -> None:
    verdict = evaluate_readiness([ReadinessUnit(P, 1, ((D,),)), ReadinessUnit(D, 2, ((P,),))])
    assert verdict.ready
    assert verdict.present == (D, P)


def test_a_decode_set_needing_a_prefill_that_is_not_live_is_missing_prefill() -> None:
    verdict = evaluate_readiness([ReadinessUnit(D, 2, ((P,),)), ReadinessUnit(P, 0, ((D,),))])
    assert not verdict.ready
    assert verdict.missing == (P,)
    assert verdict.reason == "missing worker types: prefill"


def test_any_one_alternative_of_the_needs_is_enough() -> None:
    encoder = ReadinessUnit(E, 1, ((P, D), (A,)))
    assert evaluate_readiness([encoder, ReadinessUnit(A, 1)]).ready
    assert not evaluate_readiness([encoder, ReadinessUnit(D, 1)]).ready
    missing = evaluate_readiness([encoder, ReadinessUnit(D, 1)]).missing
    assert set(missing) == {P, A}


def test_a_legacy_untyped_unit_bypasses_the_strict_check() -> None:
    verdict = evaluate_readiness([ReadinessUnit(None, 1), ReadinessUnit(D, 0, ((P,),))])
    assert verdict.ready
    assert verdict.has_legacy
    assert verdict.legacy_live_workers == 1


def test_several_live_units_of_one_role_are_ambiguous_but_still_ready() -> None:
    verdict = evaluate_readiness([ReadinessUnit(D, 1), ReadinessUnit(D, 3)])
    assert verdict.ready
    assert verdict.ambiguous == (D,)


units = st.builds(
    ReadinessUnit,
    st.sampled_from([None, P, D, E, A]),
    st.integers(0, 3),
    st.lists(st.lists(st.sampled_from([P, D, E, A]), max_size=2).map(tuple), max_size=2).map(tuple),
)


@given(st.lists(units, max_size=6), st.randoms(use_true_random=False))
def test_the_same_units_in_any_order_or_duplication_give_the_same_answer(
    sample: list[ReadinessUnit], rnd: object
) -> None:
    reference = evaluate_readiness(sample)
    shuffled = list(sample) + list(sample[:2])
    rnd.shuffle(shuffled)  # type: ignore[attr-defined]
    other = evaluate_readiness(shuffled)
    assert (other.ready, other.present, other.missing, other.has_legacy) == (
        reference.ready,
        reference.present,
        reference.missing,
        reference.has_legacy,
    )


def test_every_permutation_of_a_mixed_namespace_agrees() -> None:
    sample = [ReadinessUnit(P, 1, ((D,),)), ReadinessUnit(D, 1, ((P,),)), ReadinessUnit(E, 0)]
    answers = {evaluate_readiness(list(p)) for p in itertools.permutations(sample)}
    assert len(answers) == 1
