"""One worker's LoRA adapters as immutable values read lazily from a change log.

A worker may carry thousands of adapters, and each one registers or leaves on its own. Handing
out a sorted tuple of all of them at every change costs O(N) per change and O(N^2) for a worker
that registers N adapters one by one. The worker's adapters are therefore kept the way a
cohort's admitted ids are (``admitted.py``): a frozen base mapping plus an append-only log of
changes; an ``Adapters`` value is the base, the log and the log's length at that moment, sorted
into a tuple only when someone reads it, once. The log is folded into a new base once it is longer
than the base, so a change costs O(1) amortised.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from itertools import islice
from typing import Any, overload

from workerset_admission.admission.effects import LoraAdapter

__all__ = ["AdapterChange", "AdapterLog", "Adapters"]

AdapterChange = tuple[str, LoraAdapter | None, LoraAdapter | None]
"""One change to a worker's adapters: (registration key, the adapter before, the one after)."""

_NO_CHANGES: Sequence[AdapterChange] = ()
_EMPTY: Mapping[str, LoraAdapter] = {}
_MIN_LOG = 32


class Adapters(Sequence[LoraAdapter]):
    """A worker's adapters at one moment, sorted by registration key when read.

    A value: it compares equal to any sequence of the same adapters in the same order (a
    tuple included) and hashes as that tuple.
    """

    __slots__ = ("_base", "_items", "_length", "_log")

    def __init__(
        self,
        base: Mapping[str, LoraAdapter] = _EMPTY,
        log: Sequence[AdapterChange] = _NO_CHANGES,
        length: int = 0,
    ) -> None:
        # Neither the base nor the log's first ``length`` entries ever change afterwards.
        self._base = base
        self._log = log
        self._length = length
        self._items: tuple[LoraAdapter, ...] | None = None

    def as_tuple(self) -> tuple[LoraAdapter, ...]:
        """Return the adapters sorted by key, worked out on the first call only."""
        items = self._items
        if items is None:
            current = dict(self._base)
            for key, _old, new in islice(self._log, self._length):
                if new is None:
                    current.pop(key, None)
                else:
                    current[key] = new
            items = self._items = tuple(current[key] for key in sorted(current))
        return items

    def changes_since(self, older: Adapters) -> Sequence[AdapterChange] | None:
        """Return the changes from ``older`` to these adapters, when both read one log."""
        if older._log is self._log and older._length <= self._length:
            return self._log[older._length : self._length]
        return None

    @overload
    def __getitem__(self, index: int) -> LoraAdapter: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[LoraAdapter]: ...

    def __getitem__(self, index: int | slice) -> LoraAdapter | Sequence[LoraAdapter]:
        return self.as_tuple()[index]

    def __len__(self) -> int:
        return len(self.as_tuple())

    def __iter__(self) -> Iterator[LoraAdapter]:
        return iter(self.as_tuple())

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if isinstance(other, Adapters):
            return self.as_tuple() == other.as_tuple()
        if isinstance(other, tuple):
            return self.as_tuple() == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.as_tuple())

    def __repr__(self) -> str:
        return f"Adapters({list(self.as_tuple())!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        # Copies carry the adapters, not the log they share with its worker.
        return (_from_tuple, (self.as_tuple(),))


def _from_tuple(items: tuple[LoraAdapter, ...]) -> Adapters:
    return Adapters({adapter.key: adapter for adapter in items})


class AdapterLog:
    """One worker's adapters, changed in place and handed out as :class:`Adapters` values."""

    __slots__ = ("base", "current", "last", "limit", "log")

    def __init__(self) -> None:
        self.current: dict[str, LoraAdapter] = {}
        self.base: Mapping[str, LoraAdapter] = _EMPTY
        self.log: list[AdapterChange] = []
        self.limit = _MIN_LOG
        # The latest adapters handed out, handed out again while the log has not moved.
        self.last = Adapters()

    def __len__(self) -> int:
        return len(self.current)

    def put(self, adapter: LoraAdapter) -> None:
        old = self.current.get(adapter.key)
        self.current[adapter.key] = adapter
        self.log.append((adapter.key, old, adapter))

    def remove(self, key: str) -> None:
        old = self.current.pop(key, None)
        if old is not None:
            self.log.append((key, old, None))

    def adapters(self) -> Adapters:
        """Return the adapters now; a long log is folded into a new base first (O(1) amortised)."""
        log = self.log
        length = len(log)
        last = self.last
        if last._length == length and last._log is log:
            return last
        if length > self.limit:
            # A new base and a new log: adapters already handed out keep the old ones.
            self.base = dict(self.current)
            self.log = log = []
            self.limit = max(_MIN_LOG, len(self.base))
            length = 0
        last = self.last = Adapters(self.base, log, length)
        return last
