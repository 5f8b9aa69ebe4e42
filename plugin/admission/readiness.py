"""Frontend readiness over readiness units, with Dynamo 1.6.1's semantics.

A readiness unit is the projection of one committed WorkerSet: its worker type (``None`` for a
legacy untyped card), how many of its admitted workers are live, and the roles it needs, as a
list of alternatives (any one alternative fully present satisfies the need). The answer is
computed over the *set* of units, so the same units in any order and with any duplication give
the same ``ready``, ``present``, ``missing`` and ``has_legacy``. ``ambiguous`` and
``legacy_live_workers`` count units and workers and are diagnostics only: they never change
``ready`` (the 1.6.1 frontend keeps serving an ambiguous namespace in aggregated mode, because
topology binding then clears the prefill target).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from workerset_admission.identity import WorkerType

__all__ = ["ReadinessEval", "ReadinessUnit", "evaluate_readiness"]


@dataclass(frozen=True, slots=True)
class ReadinessUnit:
    """One committed WorkerSet as readiness sees it."""

    worker_type: WorkerType | None
    live_count: int
    needs: tuple[tuple[WorkerType, ...], ...] = ()


@dataclass(frozen=True, slots=True)
class ReadinessEval:
    """The verdict and its reasons; role tuples are sorted by their wire spelling."""

    ready: bool
    has_legacy: bool
    legacy_live_workers: int
    present: tuple[WorkerType, ...]
    missing: tuple[WorkerType, ...]
    ambiguous: tuple[WorkerType, ...]

    @property
    def reason(self) -> str:
        if self.ready:
            return "ready"
        if self.missing:
            return "missing worker types: " + ", ".join(r.value for r in self.missing)
        return "no live workers"


def _sorted(roles: Iterable[WorkerType]) -> tuple[WorkerType, ...]:
    return tuple(sorted(set(roles), key=lambda r: r.value))


def evaluate_readiness(units: Iterable[ReadinessUnit]) -> ReadinessEval:
    """Decide whether a namespace can serve, from its committed WorkerSets' units."""
    all_units = list(units)
    distinct = set(all_units)
    live = [u for u in distinct if u.live_count > 0]
    present = {u.worker_type for u in live if u.worker_type is not None}
    has_legacy = any(u.worker_type is None for u in distinct)
    legacy_live = sum(u.live_count for u in all_units if u.worker_type is None)
    per_role = Counter(
        u.worker_type for u in all_units if u.live_count > 0 and u.worker_type is not None
    )
    ambiguous = [r for r, n in per_role.items() if n > 1 and r.ambiguous_when_several]
    if has_legacy:
        # 1.6.1's compatibility bypass: any legacy card makes "any live worker" enough.
        return ReadinessEval(
            ready=bool(live),
            has_legacy=True,
            legacy_live_workers=legacy_live,
            present=_sorted(present),
            missing=(),
            ambiguous=_sorted(ambiguous),
        )
    declared = {u.worker_type for u in distinct if u.worker_type is not None}
    missing = declared - present
    for unit in live:
        if unit.needs and not any(set(alt) <= present for alt in unit.needs):
            for alternative in unit.needs:
                missing.update(r for r in alternative if r not in present)
    return ReadinessEval(
        ready=bool(live) and not missing,
        has_legacy=False,
        legacy_live_workers=0,
        present=_sorted(present),
        missing=_sorted(missing),
        ambiguous=_sorted(ambiguous),
    )
