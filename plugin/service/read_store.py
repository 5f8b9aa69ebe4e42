"""One indexed store of what was decided, per group and per worker, rendered by every reader.

Theory of operation
-------------------

A status round (:mod:`~.status_fold`) reads each group a change named out of its copy into one
:class:`GroupEntry`: the group's readout as the status shows it (its
:class:`~.status_model.GroupStatusReport`: incumbent, cohorts, status, generation, admitted
and routable members), its standing rejections, its readiness unit, its entry in its
namespace's serving record, and one :class:`WorkerRecord` per worker it lists. A worker's
state is one word of one vocabulary (:class:`WorkerState`) from which each reader renders its
own: the listing's admission and serving state (:meth:`WorkerState.serving`), the gauges'
state in Dynamo's router words (``router``, a key of
:data:`~workerset_admission.telemetry.worker_states.STATE_TABLE`). The rule that picks a
worker's state runs once per entry, for its first reader (:attr:`GroupEntry.workers`), and
once per cell of alike workers, not per worker.

The store is a value, in the manner of client-go's thread-safe store with named indexers
(``tools/cache/thread_safe_store.go``): entries by group key, and the indexes
:data:`INDEXES` (by namespace, endpoint, WorkerSet and worker) from an index value to the keys
of the groups there (:meth:`ReadStore.by_index`; the worker index is each entry's sorted table
of worker ids, :class:`WorkerTable`, so no table holds a fleet's worker twice).
:meth:`ReadStore.applied` returns the store with the changed groups' entries swapped whole
(or gone) and their index entries moved, and leaves the store it was called on as it was:
so a round applies its changes in its own thread and publishes the new store at once, and a
reader in any other thread reads only frozen objects (entries are never changed after they
are made, and neither is any mapping a published store holds).

Each application has a version, and the store keeps which groups the last
:data:`CHANGE_LOG` applications changed (:meth:`ReadStore.changed_since`): a reader that
renders per group (the worker-state families) renders again only the groups changed since the
version it last rendered, and everything when it is further behind than the log reaches.

The status's tuples (groups, standing rejections, readiness) and the serving records are put
together from the entries as part of an application (the records of the namespaces it changed
only), so a reader takes them as they are; :func:`worker_listing` renders the listing from the
worker records. The plain path, from the core and the status alone, is
:func:`~.status_model.group_status_report`, :func:`~.status_model.serving_records`,
:func:`~.worker_listing.plain_worker_listing` and
:func:`~workerset_admission.telemetry.worker_states.worker_sets`; a differential test
(``tests/test_read_store.py``) holds the store and every rendering from it to them.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, ItemsView, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from types import MappingProxyType
from typing import Any, Final

from workerset_admission.admission.readiness import ReadinessUnit
from workerset_admission.admission.readout import GroupCopy
from workerset_admission.identity import EndpointId, GroupKey, group_fields
from workerset_admission.service.status_model import (
    GroupStatusReport,
    ModelReadiness,
    Routable,
    ServingRecord,
    StandingRejection,
    group_status_report,
    judge_readiness,
    readiness_unit,
    serving_group,
    serving_record,
    standing_rejections,
)
from workerset_admission.telemetry.worker_states import WAITING, GroupFacts, router_state

__all__ = [
    "CHANGE_LOG",
    "EMPTY_STORE",
    "INDEXES",
    "GroupEntry",
    "ReadStore",
    "Worker",
    "WorkerRecord",
    "WorkerState",
    "WorkerTable",
    "group_entry",
    "worker_listing",
    "worker_state",
]

INDEXES: Final = ("namespace", "endpoint", "worker_set", "worker")
"""The store's named indexes: a group's namespace, endpoint, WorkerSet key, each worker's id."""

# The indexes kept as tables (value -> keys); the worker index is the entries' own tables.
_TABLED: Final = INDEXES[:3]

CHANGE_LOG: Final = 64
"""How many applications' changed groups the store remembers for readers that fell behind."""


@dataclass(frozen=True, slots=True)
class WorkerState:
    """A worker's state in one group: the one vocabulary every reader's words are rendered from.

    ``admission`` is ``admitted``, ``drained``, ``rejected`` (in a cohort behind the first) or
    ``pending``; ``routed``: this frontend routes to it (routable, or a drained tenure's member
    still served in a handover); ``last_known``: served on its last known records during a
    hold; ``router``: its plugin state as the gauges show it (a key of ``STATE_TABLE``),
    ``None`` for a worker the gauges do not list (a handover's member alone).
    """

    admission: str
    routed: bool
    last_known: bool
    router: str | None

    @property
    def name(self) -> str:
        """The state as one word: ``admission[+routed][+last_known]/router``."""
        flags = ("+routed" if self.routed else "") + ("+last_known" if self.last_known else "")
        return f"{self.admission}{flags}/{self.router or '-'}"

    def serving(self, synced: bool) -> str:
        """Return the listing's serving state (``synced``: the service's)."""
        if not synced:
            return "unknown"
        if self.admission == "drained":
            return "draining" if self.routed else "drained"
        if self.last_known:
            return "unknown"
        if self.admission == "admitted" and self.routed:
            return "serving"
        return "unavailable"


@cache
def worker_state(admission: str, routed: bool, last_known: bool, router: str | None) -> WorkerState:
    """Return the one :class:`WorkerState` of these facts (they are few: each made once)."""
    return WorkerState(admission, routed, last_known, router)


@dataclass(frozen=True, slots=True)
class WorkerRecord:
    """One worker as its group's entry keeps it (shared by the workers whose facts are equal).

    ``checksum`` is the card checksum the listing shows (its first cohort's, else the
    handover's, else the one it was drained with); ``waits_in`` the cohort whose
    ``differs_in`` its gauge series shows (a worker rejected or held behind the incumbent).
    """

    state: WorkerState
    checksum: str | None
    waits_in: str | None


@dataclass(frozen=True, slots=True)
class Worker:
    """One worker in one group, as :meth:`ReadStore.workers` answers: where it is, its state."""

    group: GroupKey
    namespace: str
    endpoint: EndpointId
    instance_id: int
    state: WorkerState
    checksum: str | None


@dataclass(frozen=True, slots=True)
class GroupEntry:
    """What one group contributes to every reader: made once per change, never changed.

    Its :attr:`workers` are worked out from its ``status`` by the first reader that asks (the
    listing, the gauges, a lookup by worker), in that reader's thread, and kept: a round pays
    nothing per worker for the readers nobody runs, and the serving publication, which reads
    a round's entries on the service's loop, never pays for them. Two readers that ask at once
    each work out the same table; either one is kept.
    """

    status: GroupStatusReport
    rejections: tuple[StandingRejection, ...]
    unit: ReadinessUnit | None
    serving: dict[str, Any] | None
    table: WorkerTable | None = field(default=None, compare=False, repr=False)

    @property
    def workers(self) -> WorkerTable:
        """Return the group's worker records by instance id."""
        table = self.table
        if table is None:
            table = _workers(self.status)
            object.__setattr__(self, "table", table)  # a cache of what status determines
        return table


class WorkerTable(Mapping[int, WorkerRecord]):
    """One group's worker records by instance id: immutable, and small per worker.

    The ids are one sorted tuple, each worker's record a one-byte code into the group's few
    distinct records (workers whose facts are equal share one): a fleet's worker costs the
    table about nine bytes. A lookup bisects the ids.
    """

    __slots__ = ("_codes", "_ids", "_kinds")

    def __init__(
        self, ids: tuple[int, ...], codes: Sequence[int], kinds: tuple[WorkerRecord, ...]
    ) -> None:
        """Keep ``ids`` (sorted), each one's record ``kinds[codes[i]]``."""
        self._ids = ids
        self._kinds = kinds
        self._codes: bytes | tuple[int, ...] = bytes(codes) if len(kinds) <= 256 else tuple(codes)

    @property
    def ids(self) -> tuple[int, ...]:
        """The workers' instance ids, sorted."""
        return self._ids

    @property
    def codes(self) -> Sequence[int]:
        """Each worker's record as its index in :attr:`kinds`, in :attr:`ids` order."""
        return self._codes

    @property
    def kinds(self) -> tuple[WorkerRecord, ...]:
        """The group's distinct worker records (a reader works each out once, not per worker)."""
        return self._kinds

    def __getitem__(self, instance_id: int) -> WorkerRecord:
        ids = self._ids
        at = bisect_left(ids, instance_id)
        if at == len(ids) or ids[at] != instance_id:
            raise KeyError(instance_id)
        return self._kinds[self._codes[at]]

    def __contains__(self, instance_id: object) -> bool:
        if not isinstance(instance_id, int):
            return False
        ids = self._ids
        at = bisect_left(ids, instance_id)
        return at < len(ids) and ids[at] == instance_id

    def __iter__(self) -> Iterator[int]:
        return iter(self._ids)

    def __len__(self) -> int:
        return len(self._ids)

    def items(self) -> ItemsView[int, WorkerRecord]:
        return _Items(self)

    def __repr__(self) -> str:
        return f"WorkerTable({dict(self.items())!r})"


class _Items(ItemsView[int, WorkerRecord]):
    """The table's (id, record) pairs in id order, without a lookup per worker."""

    _mapping: WorkerTable

    def __iter__(self) -> Iterator[tuple[int, WorkerRecord]]:
        table = self._mapping
        kinds = table._kinds
        return zip(table._ids, (kinds[code] for code in table._codes), strict=True)


def group_entry(
    group: GroupCopy, live: Routable, clock: Callable[[], float] | None = None
) -> GroupEntry:
    """Read one group's entry out of its copy (pure: runs in any thread)."""
    view = group.view()
    served = group.serving
    status = group_status_report(view, live, clock)
    # Only a committed group (one that serves) has a readiness unit and a serving entry.
    return GroupEntry(
        status=status,
        rejections=standing_rejections(group, [view]),
        unit=None if served is None else readiness_unit(group, view, live),
        serving=None if served is None else serving_group(view, served),
    )


_Facts = tuple[str, bool, bool, "str | None", "str | None", "str | None"]


def _workers(report: GroupStatusReport) -> WorkerTable:
    """Each worker's record: the listing's facts and the gauges' state, worked out once.

    The one rule of a worker's state: its admission and whether it is routed here (below),
    and its gauge state by :func:`~workerset_admission.telemetry.worker_states.router_state`.
    A worker's facts depend only on its cohort and on whether it is drained, admitted,
    routable, routed and last known; so a cohort's members are split by those sets (set
    operations, in C) into a few cells whose members are alike, and the rule runs once per
    cell, not per worker. Workers outside every cohort (a handover's, a drained worker's, a
    last known one's) and workers listed in two cohorts are worked out one by one.
    """
    drained = {entry[0] for entry in report.drained}
    admitted = set(report.admitted)
    routable = set(report.routable)
    routed = set(routable)
    if report.handover is not None:
        routed.update(report.handover[2])
    last_known = set(report.last_known)
    facts = GroupFacts.of(report)
    kinds: dict[_Facts, int] = {}
    code_of: dict[int, int] = {}

    def kind(facts_: _Facts) -> int:
        code = kinds.get(facts_)
        if code is None:
            code = kinds[facts_] = len(kinds)
        return code

    def one(worker: int, checksum: str | None, index: int | None, in_cohort: bool) -> _Facts:
        """Work out one worker's facts (``index``: its cohort's, ``None``: outside every one)."""
        if worker in drained:
            admission = "drained"
        elif worker in admitted:
            admission = "admitted"
        elif index is not None and index > 0:
            admission = "rejected"
        else:
            admission = "pending"
        router: str | None = None
        waits_in: str | None = None
        if in_cohort:
            cohort = report.cohorts[index or 0]
            incumbent_member = index == 0 and cohort.mdc_checksum == report.incumbent
            router = router_state(facts, worker, incumbent_member)
            if not incumbent_member and router in WAITING:
                waits_in = cohort.mdc_checksum
        elif worker in admitted or worker in drained:
            router = router_state(facts, worker, True)
        return (admission, worker in routed, worker in last_known, router, checksum, waits_in)

    members = [set(cohort.members) for cohort in report.cohorts]
    listed: set[int] = set().union(*members)
    overlap = sum(map(len, members)) != len(listed)
    if overlap:
        # A worker in two cohorts: the listing names its first cohort, the gauges its last.
        first: dict[int, int] = {}
        last: dict[int, int] = {}
        for index, cohort in enumerate(report.cohorts):
            for member in cohort.members:
                first.setdefault(member, index)
                last[member] = index
        rejected = set().union(*members[1:])
        for worker in listed:
            rest = one(worker, report.cohorts[first[worker]].mdc_checksum, last[worker], True)
            if rest[0] == "pending" and worker in rejected:
                rest = ("rejected", *rest[1:])
            code_of[worker] = kind(rest)
    else:
        splits = (drained, admitted, routable, routed, last_known)
        for index, cohort in enumerate(report.cohorts):
            for cell in _cells(members[index], splits):
                code = kind(one(next(iter(cell)), cohort.mdc_checksum, index, True))
                code_of.update(dict.fromkeys(cell, code))
    checksums: dict[int, str] = dict(report.drained_checksums)
    if report.handover is not None:
        checksums.update(dict.fromkeys(report.handover[2], report.handover[0]))
    for worker in (*(report.handover[2] if report.handover else ()), *drained, *admitted):
        if worker not in code_of:
            code_of[worker] = kind(one(worker, checksums.get(worker), None, False))
    ids = tuple(sorted(code_of))
    records = tuple(
        WorkerRecord(worker_state(admission, routed_, known, router), checksum, waits_in)
        for admission, routed_, known, router, checksum, waits_in in kinds
    )
    return WorkerTable(ids, [code_of[worker] for worker in ids], records)


def _cells(workers: set[int], splits: Sequence[set[int]]) -> list[set[int]]:
    """Split ``workers`` by membership in each of ``splits``: the non-empty cells."""
    cells = [workers] if workers else []
    for split in splits:
        cells = [part for cell in cells for part in (cell & split, cell - split) if part]
    return cells


# An index: value -> the keys of the groups there, sorted; never changed once published.
_Index = Mapping[Any, tuple[GroupKey, ...]]


def _index_values(key: GroupKey) -> dict[str, Any]:
    endpoint = key.endpoint
    return {"namespace": endpoint.namespace, "endpoint": endpoint, "worker_set": key.worker_set}


@dataclass(frozen=True, slots=True)
class ReadStore:
    """The entries and their indexes as one application left them; immutable, any thread."""

    entries: Mapping[GroupKey, GroupEntry]
    indexes: Mapping[str, _Index]
    groups: tuple[GroupStatusReport, ...]
    rejections: tuple[StandingRejection, ...]
    readiness: tuple[ModelReadiness, ...]
    records: Mapping[str, ServingRecord]
    version: int
    # (version, the groups that application changed), the latest last, at most CHANGE_LOG.
    log: tuple[tuple[int, frozenset[GroupKey]], ...]
    # When the round whose application this is began (Unix time; None before the first).
    as_of: float | None

    def by_index(self, name: str, value: Any) -> tuple[GroupKey, ...]:
        """Return the keys of the groups whose index ``name`` has ``value``, sorted.

        As client-go's ``ByIndex``; a name not in :data:`INDEXES` raises ``KeyError``. The
        worker index is the entries' own sorted tables of ids, searched per group: a table
        of its own would hold every worker once more.
        """
        if name == "worker":
            entries = self.entries
            return tuple(key for key in sorted(entries) if value in entries[key].workers)
        return self.indexes[name].get(value, ())

    def workers(self, instance_id: int) -> tuple[Worker, ...]:
        """Return every group's record of one worker, in group order."""
        out = []
        for key in self.by_index("worker", instance_id):
            endpoint = key.endpoint
            record = self.entries[key].workers[instance_id]
            out.append(
                Worker(
                    key,
                    endpoint.namespace,
                    endpoint,
                    instance_id,
                    record.state,
                    record.checksum,
                )
            )
        return tuple(out)

    def changed_since(self, version: int) -> frozenset[GroupKey] | None:
        """Return the groups changed after ``version`` (``None``: the log does not reach it)."""
        if version == self.version:
            return frozenset()
        if not self.log or version < self.log[0][0] - 1 or version > self.version:
            return None
        return frozenset().union(*(keys for at, keys in self.log if at > version))

    def applied(
        self, changes: Mapping[GroupKey, GroupEntry | None], as_of: float | None
    ) -> ReadStore:
        """Return this store with ``changes`` applied (an entry, or ``None``: the group is gone).

        This store is left as it was. The cost is the changed groups' members, plus one copy
        of each index's table and one pass over the entries to put the status's tuples
        together.
        """
        entries = dict(self.entries)
        indexes = {name: dict(index) for name, index in self.indexes.items()}
        namespaces: set[str] = set()
        changed = set()
        for key, entry in changes.items():
            old = entries.get(key)
            if old is None and entry is None:
                continue
            changed.add(key)
            namespaces.add(key.endpoint.namespace)
            if old is None:
                for name, value in _index_values(key).items():
                    _index(indexes[name], value, key)
            if entry is None:
                for name, value in _index_values(key).items():
                    _unindex(indexes[name], value, key)
                del entries[key]
            else:
                entries[key] = entry
        records = dict(self.records)
        for namespace in namespaces:
            served = [
                serving
                for key in indexes["namespace"].get(namespace, ())
                if (serving := entries[key].serving) is not None
            ]
            if served:
                records[namespace] = serving_record(served)
            else:
                records.pop(namespace, None)
        version = self.version + 1
        log = (*self.log[-(CHANGE_LOG - 1) :], (version, frozenset(changed)))
        groups, rejections, readiness = _assembled(entries)
        return ReadStore(
            entries=MappingProxyType(entries),
            indexes=MappingProxyType(
                {name: MappingProxyType(index) for name, index in indexes.items()}
            ),
            groups=groups,
            rejections=rejections,
            readiness=readiness,
            records=MappingProxyType(records),
            version=version,
            log=log,
            as_of=as_of,
        )


def _index(index: dict[Any, tuple[GroupKey, ...]], value: Any, key: GroupKey) -> None:
    keys = index.get(value, ())
    if key not in keys:
        index[value] = tuple(sorted((*keys, key)))


def _unindex(index: dict[Any, tuple[GroupKey, ...]], value: Any, key: GroupKey) -> None:
    keys = tuple(k for k in index[value] if k != key)
    if keys:
        index[value] = keys
    else:
        del index[value]


def _assembled(
    entries: Mapping[GroupKey, GroupEntry],
) -> tuple[
    tuple[GroupStatusReport, ...], tuple[StandingRejection, ...], tuple[ModelReadiness, ...]
]:
    """Put the status's tuples together from the entries, in group order (linear)."""
    keys = sorted(entries)
    ordered = [entries[key] for key in keys]
    units = [(key, unit) for key in keys if (unit := entries[key].unit) is not None]
    return (
        tuple(e.status for e in ordered),
        tuple(r for e in ordered for r in e.rejections),
        judge_readiness(units),
    )


EMPTY_STORE: Final = ReadStore(
    entries=MappingProxyType({}),
    indexes=MappingProxyType({name: MappingProxyType({}) for name in _TABLED}),
    groups=(),
    rejections=(),
    readiness=(),
    records=MappingProxyType({}),
    version=0,
    log=(),
    as_of=None,
)


def worker_listing(store: ReadStore, synced: bool) -> list[dict[str, Any]]:
    """Render ``/workers`` from the store's worker records: one row per (worker, WorkerSet).

    Sorted by WorkerSet then id, as ``worker_listing.plain_worker_listing`` renders them from
    the status.
    """
    rows: list[dict[str, Any]] = []
    entries = store.entries
    for key in sorted(entries):
        entry = entries[key]
        fields = group_fields(key)
        drained = {instance: (by, at) for instance, by, at in entry.status.drained}
        for instance, record in entry.workers.items():
            by, at = drained.get(instance, (None, None))
            state = record.state
            rows.append(
                {
                    "instance_id": instance,
                    **fields,
                    "checksum": record.checksum,
                    "admission": state.admission,
                    "serving_state": state.serving(synced),
                    "drained_by": by,
                    "drained_at": at,
                }
            )
    rows.sort(key=lambda row: (row["worker_set_id"], row["model"], row["instance_id"]))
    return rows
