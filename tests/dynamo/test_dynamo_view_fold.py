"""The view's fold against its plain plan: the same directory after every change, whatever came.

The writer hands :meth:`AdmittedView.update` only what changed (tenures read anew, workers and
endpoints whose records moved); :meth:`AdmittedView.sync` plans everything from scratch. Driven
by the same random history (records put, removed and listed; tenures begun, changed, handed
over and ended; drains set and lifted; holds), a view on the fold and a view on the plan hold
the same files, and the fold wants exactly what :func:`plan_view` says.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st
from support.viewworld import EP, FakeFiles, FedTable, worker_records
from workerset_admission.adapters.dynamo.view import (
    AdmittedView,
    SyncReport,
    Tenure,
    ViewChanges,
    note_record_changes,
    plan_view,
)
from workerset_admission.identity import GroupKey, WorkerType
from workerset_admission.ports import SourceDelete, SourceListing, SourcePut

GROUPS = (
    GroupKey.build("Qwen/Qwen3-0.6B", EP, "chat|completions", WorkerType.AGGREGATED),
    GroupKey.build("Qwen/Qwen3-8B", EP, "chat|completions", WorkerType.AGGREGATED),
)
WORKERS = (0x11, 0x12, 0x13, 0x14, 0x6030FDDB01885992)
ids = st.sampled_from(WORKERS)
groups = st.integers(0, len(GROUPS) - 1)

operations = st.one_of(
    st.tuples(st.just("put"), ids, st.sampled_from((16, 32)), st.booleans()),
    st.tuples(st.just("remove_card"), ids),
    st.tuples(st.just("remove_all"), ids),
    st.tuples(st.just("listing"), st.frozensets(ids)),
    st.tuples(
        st.just("tenure"),
        groups,
        st.booleans(),  # a new generation (a succession), or the same one changing
        st.frozensets(ids),
        st.booleans(),  # a hold: some routable members served on last known records
        st.booleans(),  # the new generation takes over from a drained one
    ),
    st.tuples(st.just("end"), groups),
    st.tuples(st.just("drain"), ids),
    st.tuples(st.just("undrain"), ids),
)


@dataclass
class World:
    """Two tables fed alike, the tenures in force, the drains, and the two views."""

    folded_table: FedTable = field(default_factory=FedTable)
    planned_table: FedTable = field(default_factory=FedTable)
    folded_files: FakeFiles = field(default_factory=FakeFiles)
    planned_files: FakeFiles = field(default_factory=FakeFiles)
    tenures: dict[GroupKey, Tenure] = field(default_factory=dict)
    drained: set[tuple[str, int]] = field(default_factory=set)
    generation: int = 0
    revision: int = 0

    def __post_init__(self) -> None:
        self.folded = AdmittedView(self.folded_files)
        self.planned = AdmittedView(self.planned_files)
        self.records: dict[int, list] = {}
        self.reports: tuple[SyncReport, SyncReport] = (SyncReport(), SyncReport())

    def feed(self, event: SourcePut | SourceDelete | SourceListing) -> None:
        self.folded_table.apply(event)
        self.planned_table.apply(event)

    def run(self, op: tuple) -> None:
        kind = op[0]
        touched: set[GroupKey] = set()
        drains_before = set(self.drained)
        if kind == "put":
            _, worker, block, channels = op
            entries = worker_records(worker, block, ("kv_metrics",) if channels else ())
            self.records[worker] = entries
            for entry in entries:
                self.feed(SourcePut(entry))
        elif kind in ("remove_card", "remove_all"):
            entries = self.records.get(op[1], [])
            for entry in entries if kind == "remove_all" else entries[2:3]:
                self.revision += 1
                self.feed(SourceDelete(entry.key, self.revision))
        elif kind == "listing":
            listed = [e for w in sorted(op[1]) for e in self.records.get(w, [])]
            self.feed(SourceListing(listed))
        elif kind == "tenure":
            _, index, succeed, routable, hold, handover = op
            group = GROUPS[index]
            old = self.tenures.get(group)
            if old is None or succeed:
                self.generation += 1
                generation = self.generation
                handover_from = old.generation if old is not None and handover else None
            else:
                generation, handover_from = old.generation, old.handover_from
            last_known = frozenset(sorted(routable)[:1]) if hold else frozenset()
            self.tenures[group] = Tenure(group, generation, routable, last_known, handover_from)
            touched.add(group)
        elif kind == "end":
            group = GROUPS[op[1]]
            if self.tenures.pop(group, None) is not None:
                touched.add(group)
        elif kind == "drain":
            self.drained.add((EP.namespace, op[1]))
        else:
            self.drained.discard((EP.namespace, op[1]))
        self.step(touched, drains_before)

    def step(self, touched: set[GroupKey], drains_before: set[tuple[str, int]]) -> None:
        tenures = list(self.tenures.values())
        # The writer's way: what changed, the groups of the namespaces it touched read anew,
        # and the full plan while anything is held.
        changes = ViewChanges(workers=set(drains_before ^ self.drained))
        note_record_changes(self.folded_table, changes)
        for namespace, _ in changes.workers:
            touched |= self.folded.groups_in(namespace)
        changes.tenures = {group: self.tenures.get(group) for group in touched}
        if self.folded.holding or any(t.last_known for t in tenures):
            folded = self.folded.sync(tenures, self.folded_table, self.drained)
        else:
            folded = self.folded.update(changes, self.folded_table, self.drained)
        planned = self.planned.sync(tenures, self.planned_table, self.drained)
        # The same files written, withdrawn first (an ended tenure) and removed last.
        self.reports = (folded, planned)


@settings(max_examples=300, deadline=None)
@given(st.lists(operations, min_size=1, max_size=40))
def test_the_fold_holds_the_files_the_full_plan_holds_after_every_change(ops: list) -> None:
    world = World()
    for step, op in enumerate(ops):
        world.run(op)
        assert world.folded_files.content == world.planned_files.content, (step, op)
        assert world.folded.files == world.planned.files, (step, op)
        folded, planned = world.reports
        assert folded == planned, (step, op)
        if not world.folded.holding:
            planned = plan_view(world.tenures.values(), world.folded_table)
            assert world.folded.wanted() == planned, (step, op)


def test_a_member_joining_writes_its_own_files_and_touches_no_other() -> None:
    world = World()
    for worker in WORKERS:
        world.run(("put", worker, 16, False))
    members = frozenset(WORKERS[:-1])
    world.run(("tenure", 0, False, members, False, False))
    before = set(world.folded.files)
    world.folded_files.ops.clear()

    world.run(("tenure", 0, False, members | {WORKERS[-1]}, False, False))

    joined = set(world.folded.files) - before
    assert joined
    assert before <= set(world.folded.files)
    ops = world.folded_files.ops
    assert [op for op, _ in ops] == ["publish"] * len(joined)
    assert {file for _, file in ops} == joined
