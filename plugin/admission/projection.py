"""The LoRA projection's one rule, read plainly, and the same rule kept up to date change by change.

One adapter name must mean one set of weights across a group: a hop routes a request for the
adapter to any worker serving it. :func:`projection_conflict` is the rule, read plainly: a
projection that serves one adapter name with two fingerprints is refused. The core judges every
projection it computes by it (``core.py``, "LoRA adapters"), and a refused projection is never
published; on a committed group it is a failed replacement (``blocked_ready``) retried at a
deadline.

The plain rule reads every adapter of every worker, O(N) for each projection, so a worker
registering N adapters one by one would cost O(N^2) in checks alone. :class:`ProjectionConflicts`
answers the same question from counts kept per group (adapter name -> fingerprint -> how many),
updated from the changes between a worker's last projected adapters and its new ones
(``Adapters.changes_since``), which cost O(1) amortised per adapter change. A worker whose
adapters share no log (its log was folded into a new base, or it is new) is counted afresh;
that happens once per log length, so it stays amortised O(1).

``tests/test_projection_check.py`` holds the shortcut to the plain rule on random projections
and change sequences: the same verdict every time, naming an adapter that does conflict.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from workerset_admission.admission.effects import LoraAdapter, LoraWorker
from workerset_admission.admission.lora import Adapters
from workerset_admission.identity import EndpointId, GroupKey

__all__ = ["ProjectionConflicts", "projection_conflict"]

_Worker = tuple[EndpointId, int]


class _Counts:
    """One group's projection: each worker's adapters, and fingerprints counted per name."""

    __slots__ = ("adapters", "by_name", "conflicting", "receiver")

    def __init__(self, receiver: int) -> None:
        self.receiver = receiver
        self.adapters: dict[_Worker, Sequence[LoraAdapter]] = {}
        self.by_name: dict[str, dict[str, int]] = {}
        self.conflicting: set[str] = set()

    def add(self, adapter: LoraAdapter) -> None:
        held = self.by_name.setdefault(adapter.model_suffix, {})
        held[adapter.lora_fingerprint] = held.get(adapter.lora_fingerprint, 0) + 1
        if len(held) > 1:
            self.conflicting.add(adapter.model_suffix)

    def drop(self, adapter: LoraAdapter) -> None:
        held = self.by_name[adapter.model_suffix]
        left = held[adapter.lora_fingerprint] - 1
        if left:
            held[adapter.lora_fingerprint] = left
        else:
            del held[adapter.lora_fingerprint]
        if len(held) < 2:
            self.conflicting.discard(adapter.model_suffix)
        if not held:
            del self.by_name[adapter.model_suffix]

    def replace(self, old: Iterable[LoraAdapter], new: Iterable[LoraAdapter]) -> None:
        for adapter in old:
            self.drop(adapter)
        for adapter in new:
            self.add(adapter)

    def move(self, worker: _Worker, new: Sequence[LoraAdapter] | None) -> None:
        old = self.adapters.get(worker)
        if old is new:
            return
        changes = (
            new.changes_since(old)
            if isinstance(new, Adapters) and isinstance(old, Adapters)
            else None
        )
        if changes is None:
            self.replace(old or (), new or ())
        else:
            for _key, before, after in changes:
                if before is not None:
                    self.drop(before)
                if after is not None:
                    self.add(after)
        if new is None:
            del self.adapters[worker]
        else:
            self.adapters[worker] = new


class ProjectionConflicts:
    """Answer ``projection_conflict`` for each group's successive projections, incrementally."""

    def __init__(self) -> None:
        self._groups: dict[GroupKey, _Counts] = {}

    def check(self, group: GroupKey, receiver: int, workers: Sequence[LoraWorker]) -> str | None:
        """Name an adapter the projection serves with two fingerprints, or ``None``."""
        counts = self._groups.get(group)
        if counts is None or counts.receiver != receiver:
            counts = self._groups[group] = _Counts(receiver)
        seen: set[_Worker] = set()
        for worker in workers:
            key = (worker.endpoint, worker.instance_id)
            seen.add(key)
            counts.move(key, worker.adapters)
        for key in [k for k in counts.adapters if k not in seen]:
            counts.move(key, None)
        if not counts.conflicting:
            return None
        name = min(counts.conflicting)
        first, second = sorted(counts.by_name[name])[:2]
        return (
            f"adapter {name!r} is projected with two fingerprints ({first[:12]}…, {second[:12]}…)"
        )

    def forget(self, group: GroupKey) -> None:
        self._groups.pop(group, None)


def projection_conflict(workers: Sequence[LoraWorker]) -> str | None:
    """Name an adapter the projection serves under one name with two fingerprints, if any."""
    seen: dict[str, str] = {}
    for worker in workers:
        for adapter in worker.adapters:
            held = seen.setdefault(adapter.model_suffix, adapter.lora_fingerprint)
            if held != adapter.lora_fingerprint:
                return (
                    f"adapter {adapter.model_suffix!r} is projected with two fingerprints "
                    f"({held[:12]}…, {adapter.lora_fingerprint[:12]}…)"
                )
    return None
