"""The LoRA projection: every adapter by the worker it rides on, and the rule a projection obeys.

Theory of operation
-------------------

*LoRA adapters* never create or keep a group. An adapter is projected into the group whose
incumbent cohort holds the base registration of the same (endpoint, instance id); adapters of
rejected or unknown workers are kept aside and change nothing until their base is admitted.
:class:`LoraProjection` keeps every adapter by the instance key of the base card it rides on,
and each worker's adapters as a change log (``lora.py``); the core names the host group
(it alone knows which cohort admits a base card) and asks for its projection
(:meth:`LoraProjection.project`), announced as ``LoraProjectionChanged`` (no rebuild).

One adapter name must mean one set of weights across a group: a hop routes a request for the
adapter to any worker serving it. :func:`projection_conflict` is the rule, read plainly: a
projection that serves one adapter name with two fingerprints is refused. The core judges every
projection it computes by it (:meth:`LoraProjection.judge`), and a refused projection is never
published (``LoraProjectionRefused``); on a committed group it is a failed replacement
(``blocked_ready`` in the status table) retried at a deadline. The projection has no states of
its own: what a refusal does to a group is the status table's.

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

from collections.abc import Iterable, Iterator, Sequence

from workerset_admission.admission.effects import LoraAdapter, LoraWorker
from workerset_admission.admission.lora import AdapterLog, Adapters
from workerset_admission.identity import EndpointId, GroupKey, Registration, instance_key

__all__ = [
    "LoraProjection",
    "ProjectionConflicts",
    "base_key",
    "projection_conflict",
    "same_projection",
]

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


def base_key(reg: Registration) -> str:
    """Return the instance key of the base card an adapter rides on (a base card's own key)."""
    return instance_key(reg.endpoint, reg.instance_id)


def _adapter(reg: Registration) -> LoraAdapter:
    return LoraAdapter(reg.key, reg.model_suffix or "", reg.lora_fingerprint, reg.card)


def same_projection(new: tuple[LoraWorker, ...], old: tuple[LoraWorker, ...] | None) -> bool:
    """Whether ``new`` is the projection ``old`` announced (``None``: announce it again)."""
    # Entries are remade only on a change, so identity says "unchanged" without reading any
    # worker's adapters (an adapter added and removed again counts as a change: one more
    # publication, never a missed one).
    return (
        old is not None
        and len(new) == len(old)
        and all(a is b for a, b in zip(new, old, strict=True))
    )


class LoraProjection:
    """Every adapter registration, by key and by the base card it rides on, and its judge."""

    __slots__ = ("by_base", "conflicts", "logs", "registered", "workers")

    def __init__(self) -> None:
        self.registered: dict[str, Registration] = {}
        # Adapters by the instance key of the base card they ride on, as registrations and
        # as the projection's change log, and each worker's latest projection entry.
        self.by_base: dict[str, dict[str, Registration]] = {}
        self.logs: dict[str, AdapterLog] = {}
        self.workers: dict[str, LoraWorker] = {}
        # Every projection's verdict under the one-name-one-fingerprint rule, kept per change.
        self.conflicts = ProjectionConflicts()

    def add(self, reg: Registration) -> str:
        """Register a new adapter; return the base card's key it rides on."""
        key = base_key(reg)
        self.registered[reg.key] = reg
        self.by_base.setdefault(key, {})[reg.key] = reg
        log = self.logs.get(key)
        if log is None:
            log = self.logs[key] = AdapterLog()
        log.put(_adapter(reg))
        return key

    def replace(self, reg: Registration) -> None:
        """Take an adapter's in-place change (its fingerprint or taints)."""
        key = base_key(reg)
        self.registered[reg.key] = reg
        self.by_base[key][reg.key] = reg
        self.logs[key].put(_adapter(reg))

    def remove(self, key: str) -> str | None:
        """Forget an adapter; return the base card's key it rode on (``None``: unknown key)."""
        reg = self.registered.pop(key, None)
        if reg is None:
            return None
        base = base_key(reg)
        adapters = self.by_base[base]
        del adapters[key]
        self.logs[base].remove(key)
        if not adapters:
            del self.by_base[base]
            del self.logs[base]
            self.workers.pop(base, None)
        return base

    def project(self, members: Iterable[Registration]) -> tuple[LoraWorker, ...]:
        """Return the adapters of each admitted worker: one entry per worker that has any.

        A worker's entry is made again only when its adapters or its base card changed, and
        its adapters are read from its change log (``lora.py``): an adapter that comes
        or goes costs O(1) amortised here, however many the worker carries, plus one step per
        admitted worker that has adapters.
        """
        workers = []
        logs = self.logs
        made = self.workers
        for reg in members:
            log = logs.get(reg.key)
            if log:
                adapters = log.adapters()
                worker = made.get(reg.key)
                if (
                    worker is None
                    or worker.adapters is not adapters
                    or worker.base_fingerprint != reg.lora_fingerprint
                    or worker.instance_id != reg.instance_id
                ):
                    worker = made[reg.key] = LoraWorker(
                        endpoint=reg.endpoint,
                        instance_id=reg.instance_id,
                        base_fingerprint=reg.lora_fingerprint,
                        adapters=adapters,
                    )
                workers.append(worker)
        workers.sort(key=lambda w: w.instance_id)
        return tuple(workers)

    def judge(self, group: GroupKey, receiver: int, projection: Sequence[LoraWorker]) -> str | None:
        """Name an adapter ``projection`` serves with two fingerprints, or ``None``: publish it."""
        return self.conflicts.check(group, receiver, projection)

    def __iter__(self) -> Iterator[Registration]:
        return iter(self.registered.values())
