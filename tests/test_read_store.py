"""The read store against a full re-plan from the core, and every rendering against its plain path.

The service keeps one store of what was decided (:mod:`~workerset_admission.service.read_store`),
applied per status round from the groups a step named. Driven by a random history (cards and
endpoint records put and removed, listings, drains set and lifted, builds finishing,
conflicting configurations, successions; status rounds run in a thread, some overtaken by an
inline refresh), after every step the store equals a re-plan of every group from the core, its
indexes equal indexes built from scratch, and every rendering from it (the status's tuples, the
serving records, the worker listing, the worker families) equals what the plain path makes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.cards import base_card
from support.fakes import FakeSource
from workerset_admission.admission import BuildFinished, StartBuild
from workerset_admission.card import (
    encode_drain_record,
    encode_endpoint_record,
    encode_model_record,
    endpoint_kv_key,
    model_kv_key,
)
from workerset_admission.card.differences import Difference
from workerset_admission.identity import Drain, EndpointId, GroupKey, WorkerType
from workerset_admission.keys import drain_kv_key
from workerset_admission.ports import DiscoveryEntry, SourceDelete, SourceListing, SourcePut
from workerset_admission.service import read_store
from workerset_admission.service.admission_service import AdmissionService
from workerset_admission.service.read_store import EMPTY_STORE, GroupEntry, ReadStore, group_entry
from workerset_admission.service.rejections import StandingRejection
from workerset_admission.service.status_fold import _LiveAt
from workerset_admission.service.status_model import (
    EMPTY_STATUS,
    CohortStatusView,
    GroupStatusReport,
    group_status_report,
    readiness,
    serving_records,
    standing_rejections,
)
from workerset_admission.service.step import EffectReader
from workerset_admission.service.worker_listing import plain_worker_listing, worker_listing
from workerset_admission.telemetry.worker_state_page import (
    STATES,
    WorkerStateFold,
    exposition,
)
from workerset_admission.telemetry.worker_states import worker_sets

ENDPOINTS = (
    EndpointId("ns-a", "backend", "generate"),
    EndpointId("ns-b", "backend", "generate"),
)
endpoints = st.integers(0, len(ENDPOINTS) - 1)
ids = st.integers(1, 5)
operations = st.one_of(
    # Block sizes make cohorts; a model type of its own makes another group of one WorkerSet.
    st.tuples(st.just("card"), endpoints, ids, st.sampled_from((16, 32, "chat"))),
    st.tuples(st.just("endpoint"), endpoints, ids),
    st.tuples(st.just("remove_card"), endpoints, ids),
    st.tuples(st.just("remove_endpoint"), endpoints, ids),
    st.tuples(st.just("drain"), endpoints, ids),
    st.tuples(st.just("undrain"), endpoints, ids),
    st.tuples(st.just("builds"), st.booleans()),
    st.just(("listing",)),
    st.just(("round",)),
    st.tuples(st.just("overtaken"), st.integers(0, len(ENDPOINTS) - 1), ids),
)


class History:
    """An unstarted service driven step by step, its builds answered by the test."""

    def __init__(self) -> None:
        self.service = AdmissionService(FakeSource())
        self.bucket: dict[str, bytes] = {}
        self.builds: list[StartBuild] = []
        self.revision = 0
        self.service.subscribe(
            EffectReader(
                lambda effects: self.builds.extend(e for e in effects if isinstance(e, StartBuild))
            )
        )

    def put(self, key: str, value: bytes) -> None:
        self.bucket[key] = value
        self.revision += 1
        self.service.handle_event(SourcePut(DiscoveryEntry(key, value, self.revision)))

    def delete(self, key: str) -> None:
        if self.bucket.pop(key, None) is not None:
            self.revision += 1
            self.service.handle_event(SourceDelete(key, self.revision))

    def run(self, op: tuple[Any, ...]) -> None:
        kind = op[0]
        if kind == "round":
            asyncio.run(self.service._fold.refresh_off_loop())
            return
        if kind == "overtaken":
            asyncio.run(self._overtaken(("card", op[1], op[2], 32)))
            return
        if kind == "listing":
            entries = [DiscoveryEntry(k, v, 1) for k, v in sorted(self.bucket.items())]
            self.service.handle_event(SourceListing(entries))
            return
        if kind == "builds":
            started, self.builds = self.builds, []
            for build in started:
                self.service.step.build_finished(
                    BuildFinished(build.group, build.mdc_checksum, build.generation, op[1])
                )
            return
        endpoint, instance_id = ENDPOINTS[op[1]], op[2]
        if kind == "card":
            shape = op[3]
            card = json.dumps(
                base_card(16, model_type="Chat") if shape == "chat" else base_card(shape)
            )
            self.put(
                model_kv_key(endpoint, instance_id),
                encode_model_record(endpoint, instance_id, card),
            )
        elif kind == "endpoint":
            self.put(
                endpoint_kv_key(endpoint, instance_id),
                encode_endpoint_record(endpoint, instance_id),
            )
        elif kind == "remove_card":
            self.delete(model_kv_key(endpoint, instance_id))
        elif kind == "remove_endpoint":
            self.delete(endpoint_kv_key(endpoint, instance_id))
        elif kind == "drain":
            drain = Drain(endpoint.namespace, instance_id, "test", None)
            self.put(drain_kv_key(endpoint.namespace, instance_id), encode_drain_record(drain))
        else:
            self.delete(drain_kv_key(endpoint.namespace, instance_id))

    async def _overtaken(self, op: tuple[Any, ...]) -> None:
        """A round in its thread while a step and an inline refresh (a reader on the loop) run."""
        fold = self.service._fold
        fold._dirty_keys()  # the round copies something even when nothing else is dirty
        round_ = asyncio.ensure_future(fold.refresh_off_loop())
        await asyncio.sleep(0)  # the round has taken its copies and is in its thread
        self.run(op)
        fold.refresh()
        await round_


def _timeless(entry: GroupEntry) -> tuple[GroupEntry, dict[int, Any]]:
    # Unix times are worked out from the clock when a group's picture is made.
    status = dataclasses.replace(entry.status, held_until=None, last_known_until=None)
    return dataclasses.replace(entry, status=status), dict(entry.workers)


def replan(service: AdmissionService) -> dict[GroupKey, tuple[GroupEntry, dict[int, Any]]]:
    """Every group's entry read out from scratch from the core and the liveness index."""
    core, liveness = service.core, service.liveness
    out = {}
    for key in sorted(core.group_keys()):
        group = core.group_copy(key)
        assert group is not None
        out[key] = _timeless(group_entry(group, _LiveAt(liveness.live_ids(key.endpoint))))
    return out


def indexes_of(
    entries: dict[GroupKey, tuple[GroupEntry, dict[int, Any]]],
) -> dict[str, dict[Any, tuple[GroupKey, ...]]]:
    """The store's four indexes, built plainly from ``entries``."""
    out: dict[str, dict[Any, list[GroupKey]]] = {
        "namespace": {},
        "endpoint": {},
        "worker_set": {},
        "worker": {},
    }
    for key in sorted(entries):
        out["namespace"].setdefault(key.endpoint.namespace, []).append(key)
        out["endpoint"].setdefault(key.endpoint, []).append(key)
        out["worker_set"].setdefault(key.worker_set, []).append(key)
        for worker in entries[key][1]:
            out["worker"].setdefault(worker, []).append(key)
    return {name: {v: tuple(keys) for v, keys in index.items()} for name, index in out.items()}


def check(service: AdmissionService, fold: WorkerStateFold, remembered: dict[Any, str]) -> None:
    """The store equals the re-plan, and each rendering from it equals its plain path."""
    status = service.status()
    store = status.store
    assert isinstance(store, ReadStore)
    assert store is service._fold.snapshot
    planned = replan(service)
    assert {key: _timeless(entry) for key, entry in store.entries.items()} == planned
    plain = indexes_of(planned)
    for name, index in plain.items():
        for value, keys in index.items():
            assert store.by_index(name, value) == keys, (name, value)
    assert {name: dict(index) for name, index in store.indexes.items()} == {
        name: index for name, index in plain.items() if name != "worker"
    }
    for worker, keys in plain["worker"].items():
        found = store.workers(worker)
        assert [(w.group, w.instance_id) for w in found] == [(k, worker) for k in keys]
        assert [(w.namespace, w.endpoint) for w in found] == [
            (k.endpoint.namespace, k.endpoint) for k in keys
        ]
        assert [w.state for w in found] == [planned[k][1][worker].state for k in keys]

    core, liveness = service.core, service.liveness
    views = core.groups()
    full = [group_status_report(v, liveness) for v in views]
    assert [_json(g) for g in status.groups] == [_json(g) for g in full]
    assert status.rejections == standing_rejections(core, views)
    assert status.readiness == readiness(core, core.serving(), liveness)
    assert service.serving_records() == serving_records(core, core.serving())

    made_otherwise = dataclasses.replace(status, store=None)
    assert worker_listing(status) == plain_worker_listing(made_otherwise)
    for synced in (True, False):
        assert worker_listing(dataclasses.replace(status, synced=synced)) == plain_worker_listing(
            dataclasses.replace(made_otherwise, synced=synced)
        )
    # What the whole path would remember at this read: the same memory, before the read.
    whole = worker_sets(status.groups, status.rejections, dict(remembered))
    fold.refresh(status.groups, status.rejections, store)
    assert fold.sets() == whole
    assert [(labels, dict(counts)) for labels, counts in fold.counts()] == [
        (s.labels, s.counts()) for s in whole
    ]
    assert fold.text() == exposition(whole)


def _json(view: Any) -> dict[str, Any]:
    out: dict[str, Any] = view.to_json()
    out.pop("held_until")
    out.pop("last_known_until")
    return out


@settings(max_examples=150, deadline=None)
@given(st.lists(operations, min_size=1, max_size=40), st.sets(st.integers(0, 39)))
def test_the_store_equals_a_replan_and_every_rendering_its_plain_path_after_every_step(
    ops: list[Any], unread: set[int]
) -> None:
    history = History()
    remembered: dict[Any, str] = {}
    fold = WorkerStateFold(remembered)
    for step, op in enumerate(ops):
        history.run(op)
        if step in unread and step != len(ops) - 1:
            continue  # the worker families are not read at every step: they follow the log
        try:
            check(history.service, fold, remembered)
        except AssertionError as exc:
            raise AssertionError(f"after step {step}: {op}") from exc


def test_a_change_reads_out_only_the_group_it_names() -> None:
    history = History()
    for index in range(len(ENDPOINTS)):
        for instance_id in (1, 2, 3):
            history.run(("endpoint", index, instance_id))
            history.run(("card", index, instance_id, 16))
    history.run(("builds", True))
    fold = history.service._fold
    before_store = history.service.status().store
    assert before_store is not None
    before = fold.rebuilt

    history.run(("card", 0, 4, 16))
    after = history.service.status().store
    assert after is not None

    assert fold.rebuilt - before == 1
    (changed,) = after.changed_since(before_store.version) or ()
    assert changed.endpoint == ENDPOINTS[0]
    # The other group's entry is the same object: swapped only when its group changed.
    (other,) = after.by_index("endpoint", ENDPOINTS[1])
    assert after.entries[other] is before_store.entries[other]


def test_the_worker_families_write_only_the_lines_of_the_workers_a_change_moved() -> None:
    history = History()
    for instance_id in range(1, 6):
        history.run(("endpoint", 0, instance_id))
        history.run(("card", 0, instance_id, 16))
    history.run(("builds", True))
    fold = WorkerStateFold()
    status = history.service.status()
    fold.refresh(status.groups, status.rejections, status.store)
    first = fold.text()[STATES]
    assert fold.lines_written == 5

    history.run(("remove_endpoint", 0, 2))
    status = history.service.status()
    fold.refresh(status.groups, status.rejections, status.store)

    assert fold.lines_written == 5 + 1
    assert fold.text()[STATES] != first
    assert fold.text() == exposition(worker_sets(status.groups, status.rejections))


def test_a_store_is_left_as_it_was_when_a_change_is_applied_to_it() -> None:
    history = History()
    history.run(("endpoint", 0, 1))
    history.run(("card", 0, 1, 16))
    history.run(("builds", True))
    store = history.service.status().store
    assert store is not None
    entries, indexes = dict(store.entries), {n: dict(i) for n, i in store.indexes.items()}

    history.run(("card", 0, 2, 16))
    newer = history.service.status().store

    assert newer is not store
    assert dict(store.entries) == entries
    assert {n: dict(i) for n, i in store.indexes.items()} == indexes
    assert store.by_index("worker", 2) == ()
    assert newer is not None
    assert len(newer.by_index("worker", 2)) == 1


def test_a_reader_further_behind_than_the_log_reads_everything_again() -> None:
    history = History()
    history.run(("card", 0, 1, 16))
    first = history.service.status().store
    assert first is not None
    for instance_id in range(70):
        history.run(("card", 1, 100 + instance_id, 16))
        history.service.status()
    last = history.service.status().store
    assert last is not None
    assert last.changed_since(first.version) is None
    assert last.changed_since(last.version) == frozenset()


def test_an_endpoint_record_alone_makes_an_admitted_worker_routable_in_the_status() -> None:
    history = History()
    history.run(("card", 0, 1, 16))
    history.run(("builds", True))
    (group,) = history.service.status().groups
    assert group.admitted == (1,)
    assert group.routable == ()

    history.run(("endpoint", 0, 1))

    (group,) = history.service.status().groups
    assert group.routable == (1,)


def test_a_serving_record_names_each_member_by_its_registrations_own_key() -> None:
    # One instance key string per worker, the core's: a fleet's serving records hold one per
    # worker, and a copy of each made for them would add a string per worker to what it costs.
    history = History()
    for instance_id in (1, 2, 3):
        history.run(("endpoint", 0, instance_id))
        history.run(("card", 0, instance_id, 16))
    history.run(("builds", True))
    (view,) = history.service.core.groups()
    registered = {m.instance_id: m.key for m in view.cohorts[0].members}

    record = history.service.serving_records()[ENDPOINTS[0].namespace]

    assert record.members == (
        "ns-a/backend/generate/1",
        "ns-a/backend/generate/2",
        "ns-a/backend/generate/3",
    )
    (group,) = record.groups
    assert [m is registered[i] for i, m in zip((1, 2, 3), group["members"], strict=True)] == [
        True
    ] * 3


def test_a_drained_incumbent_handing_over_is_draining_in_the_store_and_its_renderings() -> None:
    # The incumbent's last worker drained, a successor waiting for its build: the drained
    # tenure still serves its drained member, which the listing says is draining.
    history = History()
    for op in (
        ("endpoint", 0, 1),
        ("card", 0, 1, 16),
        ("builds", True),
        ("endpoint", 0, 2),
        ("card", 0, 2, 32),
        ("drain", 0, 1),
    ):
        history.run(op)
    status = history.service.status()
    (group,) = status.groups
    assert group.handover is not None
    assert 1 in group.handover[2]
    store = status.store
    assert store is not None
    (worker,) = store.workers(1)
    assert (worker.state.admission, worker.state.routed) == ("drained", True)
    listed = worker_listing(dataclasses.replace(status, synced=True))
    rows = {row["instance_id"]: row for row in listed}
    assert rows[1]["serving_state"] == "draining"
    check(history.service, WorkerStateFold(), {})


CHECKSUMS = ("a" * 64, "b" * 64, "c" * 64)
STATUSES = ("ready", "building", "retrying", "blocked", "committed")
FIELDS = ("kv_cache_block_size", "tokenizer", "router_config.kv_router_config.x")


def group_key(namespace: int, types: str, model: str = "Qwen/Qwen3-0.6B") -> GroupKey:
    return GroupKey.build(
        model, EndpointId(f"ns-{namespace}", "backend", "generate"), types, WorkerType.AGGREGATED
    )


class Reports:
    """A random sequence of group reports, one step at a time: shapes the service's history
    reaches rarely (holds, last known workers, drained workers beside pending ones).

    Keys differ in their model types, which Dynamo's labels leave out, so two groups may be one
    WorkerSet; a worker may be listed in both.
    """

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.keys = [group_key(ns, types) for ns in range(3) for types in ("chat", "chat|embed")]
        self.groups: dict[GroupKey, GroupStatusReport] = {}
        self.rejections: dict[GroupKey, tuple[StandingRejection, ...]] = {}

    def report(self, key: GroupKey) -> tuple[GroupStatusReport, tuple[StandingRejection, ...]]:
        rng = self.rng
        pool = list(range(1, 25))
        rng.shuffle(pool)
        cohorts = []
        for checksum in rng.sample(CHECKSUMS, rng.randint(1, 3)):
            take = rng.randint(0, 4)
            cohorts.append(CohortStatusView(checksum, tuple(sorted(pool[:take]))))
            del pool[:take]
        incumbent = rng.choice((cohorts[0].mdc_checksum, cohorts[0].mdc_checksum, None))
        members = cohorts[0].members
        committed = rng.random() < 0.7
        # Mostly the whole incumbent cohort; now and then a member not admitted yet.
        admitted = (
            tuple(m for m in members if rng.random() < 0.9)
            if committed and incumbent is not None
            else ()
        )
        routable = tuple(m for m in admitted if rng.random() < 0.8)
        held = rng.random() < 0.2
        drained = tuple(
            (worker, "ops", None) for worker in sorted(rng.sample(pool, rng.randint(0, 2)))
        )
        report = GroupStatusReport(
            group=key,
            incumbent=incumbent,
            status=rng.choice(STATUSES),
            generation=1,
            committed_generation=1 if committed else None,
            receiver=rng.randint(1, 3),
            admitted=admitted,
            routable=routable,
            cohorts=tuple(cohorts),
            held_until=123.0 if held else None,
            last_known=tuple(m for m in admitted if rng.random() < 0.2),
            drained=drained,
            drained_checksums=tuple((worker, CHECKSUMS[2]) for worker, _, _ in drained),
            handover=None
            if not drained or rng.random() < 0.5
            else (CHECKSUMS[2], 1, tuple(worker for worker, _, _ in drained)),
        )
        rejections = tuple(
            StandingRejection(
                key,
                cohorts[0].mdc_checksum,
                cohort.mdc_checksum,
                "x",
                None if rng.random() < 0.4 else (Difference(rng.choice(FIELDS), "1", "2"),),
            )
            for cohort in cohorts[1:]
            if incumbent is not None
        )
        return report, rejections

    def step(self) -> None:
        rng = self.rng
        for _ in range(rng.choice((0, 1, 1, 2))):
            key = rng.choice(self.keys)
            if key in self.groups and rng.random() < 0.25:
                del self.groups[key]
                self.rejections.pop(key, None)
            elif rng.random() < 0.2 and key in self.rejections:
                # The same group, its rejections' cards now at hand or gone.
                self.rejections[key] = tuple(
                    dataclasses.replace(
                        r, differences=None if r.differences else (Difference(FIELDS[0], "1", "2"),)
                    )
                    for r in self.rejections[key]
                )
            else:
                self.groups[key], self.rejections[key] = self.report(key)

    def status(self) -> tuple[tuple[GroupStatusReport, ...], tuple[StandingRejection, ...]]:
        ordered = sorted(self.groups)
        return (
            tuple(self.groups[key] for key in ordered),
            tuple(r for key in ordered for r in self.rejections.get(key, ())),
        )


@pytest.mark.parametrize("seed", range(30))
def test_renderings_from_the_store_equal_the_plain_path_for_reports_of_every_shape(
    seed: int,
) -> None:
    reports = Reports(seed)
    store = EMPTY_STORE
    remembered: dict[Any, str] = {}
    fold = WorkerStateFold(remembered)
    for _ in range(40):
        before = dict(reports.groups), dict(reports.rejections)
        reports.step()
        changes: dict[GroupKey, GroupEntry | None] = {}
        for key in {*before[0], *reports.groups}:
            report = reports.groups.get(key)
            if report is None:
                changes[key] = None
            elif report is not before[0].get(key) or reports.rejections.get(key) != before[1].get(
                key
            ):
                changes[key] = GroupEntry(report, reports.rejections.get(key, ()), None, None)
        store = store.applied(changes, None)
        groups, rejections = reports.status()
        assert store.groups == groups
        assert store.rejections == rejections
        status = dataclasses.replace(EMPTY_STATUS, groups=groups, rejections=rejections)
        for synced in (True, False):
            assert read_store.worker_listing(store, synced) == plain_worker_listing(
                dataclasses.replace(status, synced=synced)
            )
        whole = worker_sets(groups, rejections, dict(remembered))
        fold.refresh(groups, rejections, store)
        assert fold.sets() == whole
        assert fold.text() == exposition(whole)
