"""The view's fold against its plain plan and a fresh start: the same files after every step.

The writer is handed one delta per step (:class:`~workerset_admission.ports.StepDelta`) and
plans again only the contributions it names; a relisting makes every contribution dirty through
the same path. Driven by a random history (records put, changed in place, removed and listed;
LoRA adapter cards the tenure's projection serves or not; tenures begun, changed, handed over
and ended; drains set and lifted; holds), after every step:

* the live writer's directory equals that of a view planning everything at every step, with
  the same pass reports (what was written, withdrawn and removed, in order);
* what the live view wants is exactly the pure plan's full re-plan (:func:`plan_view`), and
  a plan started afresh and told what the live directory holds asks for no change at all;
* a view started afresh on the same records and tenures holds the same files (the drained
  workers' endpoint records a live view keeps until they leave the bucket aside: a fresh
  start never writes them);
* no refused bytes reach a file: every card file holds the bytes the core last accepted under
  its key (it refuses an in-place change of checksum, model or worker type and keeps the first
  incarnation's), and no adapter card the tenure's projection does not name is published.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import unquote

from hypothesis import given, settings
from hypothesis import strategies as st
from support.cards import base_card, lora_card, model_entry
from support.viewworld import EP, FakeFiles, worker_records
from workerset_admission.adapters.dynamo.view import (
    AdmittedView,
    RecordTable,
    SyncReport,
    Tenure,
    ViewWriter,
    file_name_for,
)
from workerset_admission.admission import AdmissionCore, MutationRefused
from workerset_admission.identity import GroupKey, WorkerType
from workerset_admission.ports import (
    DiscoveryEntry,
    SourceDelete,
    SourceListing,
    SourcePut,
    StepDelta,
)
from workerset_admission.service.delta import accepted_changes
from workerset_admission.service.ingest import Ingestor
from workerset_admission.view import ViewChanges, ViewPlan, plan_view

MODELS = ("Qwen/Qwen3-0.6B", "Qwen/Qwen3-8B")
SLUGS = ("qwen_qwen3-0_6b", "qwen_qwen3-8b")
GROUPS = tuple(
    GroupKey.build(model, EP, "chat|completions", WorkerType.AGGREGATED) for model in MODELS
)
WORKERS = (0x11, 0x12, 0x13, 0x14, 0x6030FDDB01885992)
ADAPTERS = ("sql", "chat")
ids = st.sampled_from(WORKERS)
groups = st.integers(0, len(GROUPS) - 1)
adapter_pairs = st.frozensets(st.tuples(ids, st.sampled_from(ADAPTERS)))

operations = st.one_of(
    st.tuples(
        st.just("put"),
        ids,
        st.sampled_from((16, 32)),  # another block size: another checksum, in place
        st.integers(0, len(MODELS)),  # another model or worker type, in place
        st.booleans(),
    ),
    st.tuples(st.just("adapter"), ids, st.sampled_from(ADAPTERS), st.sampled_from((4, 8))),
    st.tuples(st.just("remove_card"), ids),
    st.tuples(st.just("remove_adapter"), ids, st.sampled_from(ADAPTERS)),
    st.tuples(st.just("remove_all"), ids),
    st.tuples(st.just("listing"), st.frozensets(ids)),
    st.tuples(st.just("relist")),
    st.tuples(
        st.just("tenure"),
        groups,
        st.booleans(),  # a new generation (a succession), or the same one changing
        st.frozensets(ids),
        st.booleans(),  # a hold: some routable members served on last known records
        st.booleans(),  # the new generation takes over from a drained one
        adapter_pairs,  # the adapters the projection serves (any other is refused)
    ),
    st.tuples(st.just("end"), groups),
    st.tuples(st.just("drain"), ids),
    st.tuples(st.just("undrain"), ids),
)


def _card_entries(worker: int, block: int, model: int, channels: bool) -> list[DiscoveryEntry]:
    entries = worker_records(worker, block, ("kv_metrics",) if channels else ())
    if model < len(MODELS):
        card = base_card(block, display_name=MODELS[model], slug=SLUGS[model])
    else:
        card = base_card(block, worker_type="decode")
    entries[2] = model_entry(worker, card, endpoint=EP)
    assert Ingestor().put(entries[2].key, entries[2].value).verdicts[0].registration
    return entries


@dataclass
class World:
    """The records in the bucket, the tenures in force, the drains, and the views."""

    live_files: FakeFiles = field(default_factory=FakeFiles)
    planned_files: FakeFiles = field(default_factory=FakeFiles)
    tenures: dict[GroupKey, Tenure] = field(default_factory=dict)
    drained: set[tuple[str, int]] = field(default_factory=set)
    bucket: dict[str, DiscoveryEntry] = field(default_factory=dict)
    # The keys each worker ever registered (its card first, then its other records).
    keys: dict[int, list[str]] = field(default_factory=dict)
    generation: int = 0
    revision: int = 0

    def __post_init__(self) -> None:
        self.ingest = Ingestor()
        self.core = AdmissionCore()
        self.writer = ViewWriter(AdmittedView(self.live_files), RecordTable())
        self.planned = AdmittedView(self.planned_files)
        self.planned_table = RecordTable()
        # The bytes the core last accepted under each card key: a change of checksum or model
        # it refuses leaves the first incarnation's; a change of taints or LoRA capacity
        # alone it takes in place.
        self.first: dict[str, bytes] = {}
        self.reports: tuple[SyncReport, SyncReport] = (SyncReport(), SyncReport())
        # A service's first step is its first listing: nothing is written before it.
        self.writer.step(self.feed(SourceListing([])))

    @property
    def live(self) -> AdmittedView:
        return self.writer.view

    def feed(self, event: SourcePut | SourceDelete | SourceListing) -> StepDelta:
        """One step's records, as the service's step makes them, with a real core deciding."""
        if isinstance(event, SourcePut):
            self.bucket[event.entry.key] = event.entry
            result = self.ingest.put(event.entry.key, event.entry.value)
        elif isinstance(event, SourceDelete):
            self.bucket.pop(event.key, None)
            self.first.pop(event.key, None)
            result = self.ingest.removal(event, now=0.0)
        else:
            self.bucket = {e.key: e for e in event.entries}
            self.first = {k: v for k, v in self.first.items() if k in self.bucket}
            result = self.ingest.listing(event, now=0.0)
        effects = self.core.apply_many(result.inputs)
        refused = {e.key for e in effects if isinstance(e, MutationRefused)}
        records, kept = accepted_changes(event, (), result, refused)
        for key, record in records.items():
            if record is not None and record.kind == "model":
                self.first[key] = record.value
        relisted = isinstance(event, SourceListing)
        if relisted:
            self.planned_table.listing([r for r in records.values() if r is not None], kept)
        else:
            for key, record in records.items():
                self.planned_table.put(key, record)
        return StepDelta(records=records, relisted=relisted, kept=kept)

    def run(self, op: tuple) -> None:
        kind = op[0]
        deltas: list[StepDelta] = []
        touched: set[GroupKey] = set()
        drains_before = frozenset(self.drained)
        if kind == "put":
            _, worker, block, model, channels = op
            entries = _card_entries(worker, block, model, channels)
            keys = self.keys.setdefault(worker, [])
            keys += [e.key for e in entries if e.key not in keys]
            deltas += [self.feed(SourcePut(e)) for e in entries]
        elif kind == "adapter":
            _, worker, name, capacity = op
            entry = model_entry(worker, lora_card(name, capacity), suffix=name, endpoint=EP)
            keys = self.keys.setdefault(worker, [])
            keys += [entry.key] if entry.key not in keys else []
            deltas.append(self.feed(SourcePut(entry)))
        elif kind in ("remove_card", "remove_all", "remove_adapter"):
            worker = op[1]
            keys = [k for k in self.keys.get(worker, []) if k in self.bucket]
            if kind == "remove_card":
                keys = [k for k in keys if k.startswith("v1.mdc.") and k.endswith(f".{worker:x}")]
            elif kind == "remove_adapter":
                keys = [k for k in keys if k.startswith("v1.mdc.") and k.endswith(f".{op[2]}")]
            for key in keys:
                self.revision += 1
                deltas.append(self.feed(SourceDelete(key, self.revision)))
        elif kind == "listing":
            listed = [
                self.bucket[k]
                for w in sorted(op[1])
                for k in self.keys.get(w, [])
                if k in self.bucket
            ]
            deltas.append(self.feed(SourceListing(listed)))
        elif kind == "relist":
            deltas.append(self.feed(SourceListing(list(self.bucket.values()))))
        elif kind == "tenure":
            _, index, succeed, routable, hold, handover, adapters = op
            group = GROUPS[index]
            old = self.tenures.get(group)
            if old is None or succeed:
                self.generation += 1
                generation = self.generation
                handover_from = old.generation if old is not None and handover else None
            else:
                generation, handover_from = old.generation, old.handover_from
            last_known = frozenset(sorted(routable)[:1]) if hold else frozenset()
            served = frozenset(pair for pair in adapters if pair[0] in routable)
            self.tenures[group] = Tenure(
                group, generation, routable, last_known, handover_from, served
            )
            touched.add(group)
        elif kind == "end":
            group = GROUPS[op[1]]
            if self.tenures.pop(group, None) is not None:
                touched.add(group)
        elif kind == "drain":
            self.drained.add((EP.namespace, op[1]))
        else:
            self.drained.discard((EP.namespace, op[1]))
        drained = frozenset(self.drained)
        deltas.append(
            StepDelta(
                groups={group: self.tenures.get(group) for group in touched},
                drained=drained if drained != drains_before else None,
            )
        )
        for delta in deltas:
            self.writer.step(delta)
        live = self.writer.sync_now()
        planned = self.planned.sync(list(self.tenures.values()), self.planned_table, drained)
        self.reports = (live, planned)

    def fresh(self) -> FakeFiles:
        """A view started now, on the same records and tenures."""
        files = FakeFiles()
        AdmittedView(files).sync(list(self.tenures.values()), self.planned_table, self.drained)
        return files


def _drained_endpoint_files(world: World) -> set[tuple[str, str]]:
    return {
        file
        for file in world.live_files.content
        if file[0] == "instances"
        and any(file[1].endswith(file_name_for(f"/{iid:x}")) for _, iid in world.drained)
    }


@settings(max_examples=300, deadline=None)
@given(st.lists(operations, min_size=1, max_size=40))
def test_the_live_view_is_the_full_plan_and_a_fresh_start_after_every_step(ops: list) -> None:
    world = World()
    for step, op in enumerate(ops):
        world.run(op)
        live, planned = world.reports
        assert world.live_files.content == world.planned_files.content, (step, op)
        assert world.live.files == world.planned.files, (step, op)
        assert live == planned, (step, op)
        if not world.live.holding:
            plan = plan_view(world.tenures.values(), world.writer.table)
            assert world.live.wanted() == plan, (step, op)
        replan = ViewPlan()
        held = dict(world.live_files.content)
        replan.adopt(held)
        everything = ViewChanges(tenures=dict(world.tenures), everything=True)
        assert replan.update(everything, world.planned_table, held, world.drained) == (), (
            step,
            op,
        )
        fresh = world.fresh().content
        lingering = _drained_endpoint_files(world)
        kept = {f: v for f, v in world.live_files.content.items() if f not in lingering}
        assert {f: v for f, v in fresh.items() if f not in lingering} == kept, (step, op)
        served = {(iid, suffix) for t in world.tenures.values() for iid, suffix in t.adapters}
        # Members a hold serves on their last known records: the core's window keeps them.
        held_over = {iid for t in world.tenures.values() for iid in t.last_known}
        for key, first in world.first.items():
            held = world.writer.table.get(key)
            assert held is None or held.value == first, (step, op, key)
        for file, value in world.live_files.content.items():
            if file[0] != "mdc":
                continue
            # The card a file holds is the registration the core holds under its key.
            key = "v1.mdc." + unquote(file[1]).replace("/", ".")
            decoded = Ingestor().put(key, value).verdicts[0].registration
            assert decoded is not None, (step, op, file)
            if decoded.instance_id not in held_over:
                assert decoded == world.core.registration(decoded.key), (step, op, file)
            parts = file[1].split("%2F")
            if len(parts) > 4:
                assert (int(parts[3], 16), parts[4]) in served, (step, op, file)


def test_a_member_joining_writes_its_own_files_and_touches_no_other() -> None:
    world = World()
    for worker in WORKERS:
        world.run(("put", worker, 16, 0, False))
    members = frozenset(WORKERS[:-1])
    world.run(("tenure", 0, False, members, False, False, frozenset()))
    before = set(world.live.files)
    world.live_files.ops.clear()

    world.run(("tenure", 0, False, members | {WORKERS[-1]}, False, False, frozenset()))

    joined = set(world.live.files) - before
    assert joined
    assert before <= set(world.live.files)
    ops = world.live_files.ops
    assert [op for op, _ in ops] == ["publish"] * len(joined)
    assert {file for _, file in ops} == joined


def test_a_card_changed_in_place_keeps_its_first_bytes_and_a_refused_adapter_stays_out() -> None:
    world = World()
    worker = WORKERS[0]
    world.run(("put", worker, 16, 0, False))
    world.run(("adapter", worker, "sql", 4))
    world.run(("tenure", 0, False, frozenset({worker}), False, False, frozenset()))
    card = ("mdc", file_name_for(f"pns/backend/generate/{worker:x}"))
    adapter = ("mdc", file_name_for(f"pns/backend/generate/{worker:x}/sql"))
    first = world.live_files.content[card]
    # The projection does not name the adapter: its card stays out.
    assert adapter not in world.live_files.content

    world.run(("put", worker, 32, 0, False))  # another checksum under the same key
    world.run(("put", worker, 16, 1, False))  # another model under the same key
    world.run(("put", worker, 16, 2, False))  # another worker type under the same key
    world.run(("relist",))

    assert world.live_files.content[card] == first
    assert world.live_files.content == world.fresh().content
    world.run(("tenure", 0, False, frozenset({worker}), False, False, frozenset({(worker, "sql")})))
    assert adapter in world.live_files.content
