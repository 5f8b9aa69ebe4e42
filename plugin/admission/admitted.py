"""Admitted ids: immutable sets read lazily from a cohort's change log; which ones are routable."""

from __future__ import annotations

from collections.abc import Container, Iterable, Iterator, Sequence, Set
from itertools import islice
from typing import Any

__all__ = ["AdmittedIds", "AdmittedLog", "ChangeLog", "HoldsAdmittedIds", "routable_ids"]

ChangeLog = list[int]
"""Append-only changes to a set of ids: ``iid`` adds an id, ``~iid`` (negative) removes it."""

_NO_CHANGES: Sequence[int] = ()
# A log is folded into a new base once it is longer than the base (and than this): each change
# then costs O(1) amortised, and reading an ``AdmittedIds`` costs O(ids), once.
_MIN_LOG = 32


def routable_ids(
    admitted: Iterable[int], live: Container[int], last_known: Iterable[int] = ()
) -> frozenset[int]:
    """Say which ids a hop may route to (the one rule): admitted and live, or held as last known.

    A hop never routes to an admitted id without a live instance record, nor to a live
    instance that is not admitted; an empty answer means none, never "every instance". The
    members a held tenure serves on their last known records (``last_known``) count as live:
    their instance records may be missing only because the store lost them in an outage.
    The hop bindings, the Dynamo hops and the liveness index all answer with this rule.
    """
    routable = frozenset(i for i in admitted if i in live)
    return routable.union(last_known) if last_known else routable


class AdmittedIds(Set[int]):
    """The admitted instance ids at one moment: a frozen base plus a prefix of a change log.

    Publishing a cohort's ids must not cost a copy of the whole cohort per change, so an
    ``AdmittedIds`` holds the cohort's base set, a reference to its change log and how long that
    log was when it was handed out. The log is only ever appended to, and the cohort replaces it
    (rather than clearing it) when it rebases, so the entries it covers never change. The ids
    are worked out on the first read and kept; later reads cost nothing. It is a value:
    it compares and hashes as the set of ids it stands for, frozensets included.
    """

    __slots__ = ("_base", "_ids", "_length", "_log")

    def __init__(
        self, base: frozenset[int], log: Sequence[int] = _NO_CHANGES, length: int = 0
    ) -> None:
        # Nothing writes these afterwards except the one-time cache of the worked-out ids.
        self._base = base
        self._log = log
        self._length = length
        self._ids: frozenset[int] | None = None

    @classmethod
    def of(cls, ids: Iterable[int]) -> AdmittedIds:
        """Return ``AdmittedIds`` of exactly ``ids`` (``ids`` itself when it already is one)."""
        if isinstance(ids, AdmittedIds):
            return ids
        return cls(ids if type(ids) is frozenset else frozenset(ids))

    def as_frozenset(self) -> frozenset[int]:
        """Return the ids as a frozenset, worked out from base and log on the first call only."""
        ids = self._ids
        if ids is None:
            ids = self._ids = self._materialise()
        return ids

    def _materialise(self) -> frozenset[int]:
        length = self._length
        if not length:
            return self._base
        ids = set(self._base)
        add, discard = ids.add, ids.discard
        for change in islice(self._log, length):
            if change >= 0:
                add(change)
            else:
                discard(~change)
        return frozenset(ids)

    def __len__(self) -> int:
        return len(self.as_frozenset())

    def __contains__(self, item: object) -> bool:
        return item in self.as_frozenset()

    def __iter__(self) -> Iterator[int]:
        return iter(self.as_frozenset())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, AdmittedIds):
            return self is other or self.as_frozenset() == other.as_frozenset()
        if isinstance(other, (set, frozenset)):
            return self.as_frozenset() == other
        return NotImplemented

    def __hash__(self) -> int:
        # Equal to a frozenset of the same ids, as equality requires.
        return hash(self.as_frozenset())

    def __repr__(self) -> str:
        return f"AdmittedIds({sorted(self.as_frozenset())})"

    @classmethod
    def _from_iterable(cls, it: Iterable[Any]) -> frozenset[Any]:
        # What the Set mixins (``&``, ``|``, ``-``) build their results from: a plain frozenset.
        return frozenset(it)

    def __reduce__(self) -> tuple[Any, ...]:
        # Copies and pickles carry the ids, not the log they share with their cohort.
        return (AdmittedIds.of, (self.as_frozenset(),))


class HoldsAdmittedIds:
    """Base of a frozen dataclass that carries admitted ids (a receiver's ``AdmissionState``).

    It keeps an :class:`AdmittedIds` in ``ids`` (any other set given is wrapped in one
    when the dataclass is made) and show it to readers as a frozenset, ``admitted``, worked out
    on the first read.
    """

    __slots__ = ()
    ids: AdmittedIds

    def __post_init__(self) -> None:
        if type(self.ids) is not AdmittedIds:
            object.__setattr__(self, "ids", AdmittedIds.of(self.ids))

    @property
    def admitted(self) -> frozenset[int]:
        """The admitted ids as a frozenset (materialised once per ``AdmittedIds``)."""
        return self.ids.as_frozenset()


class AdmittedLog:
    """A set of ids kept as a frozen base plus an append-only change log, handed out as a value.

    The owner appends ``iid`` or ``~iid`` to ``log`` for each change (a list append, the
    cheapest step there is) and calls :meth:`admitted_ids` when it publishes. ``rebase`` replaces
    the log with a new, empty list, so no ``AdmittedIds`` already handed out sees a later change.
    """

    __slots__ = ("base", "last", "limit", "log")

    def __init__(self) -> None:
        self.base: frozenset[int] = frozenset()
        self.log: ChangeLog = []
        self.limit = _MIN_LOG
        # The latest ``AdmittedIds`` handed out, handed out again while the log has not moved.
        self.last = AdmittedIds.of(())

    def rebase(self, ids: Iterable[int]) -> None:
        """Start over from ``ids``, which must be the set the log describes now (or a reset)."""
        self.base = base = frozenset(ids)
        self.log = []
        self.limit = max(_MIN_LOG, len(base))

    def admitted_ids(self, ids: Iterable[int]) -> AdmittedIds:
        """Return the ids now as ``AdmittedIds``; ``ids`` (the same set) only folds the log."""
        log = self.log
        length = len(log)
        last = self.last
        if last._length == length and last._log is log:
            return last
        if length > self.limit:
            self.rebase(ids)
            log, length = self.log, 0
        last = self.last = AdmittedIds(self.base, log, length)
        return last
