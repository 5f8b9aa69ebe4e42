"""The admitted discovery view: what it holds, in what order it changes, and who owns it."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
from support.cards import base_card as demo_card
from support.viewworld import (
    EP,
    GROUP,
    FakeFiles,
    FedTable,
    entry_of,
    mdc_file,
    table_of,
    worker_records,
)
from workerset_admission.adapters.dynamo.view import (
    BUCKETS,
    LOCK_NAME,
    AdmittedView,
    DirectoryFiles,
    RecordTable,
    Tenure,
    ViewFile,
    ViewWriter,
    check_frontend_store,
    file_name_for,
)
from workerset_admission.adapters.dynamo.view_directory import CLOCK_PROBE_NAME, read_registry
from workerset_admission.card import (
    BoundarySettings,
    encode_drain_record,
    encode_endpoint_record,
    encode_model_record,
    endpoint_kv_key,
    model_kv_key,
)
from workerset_admission.errors import ViewDirectoryError, ViewDirectoryUnavailable
from workerset_admission.identity import Drain, EndpointId
from workerset_admission.keys import drain_kv_key
from workerset_admission.ports import (
    SourceDelete,
    SourceEvent,
    SourceListing,
    SourcePut,
    StepDelta,
)
from workerset_admission.service.admission_service import AdmissionService
from workerset_admission.service.delta import accepted_changes
from workerset_admission.service.ingest import Ingestor
from workerset_admission.service.step import DeltaReader

A1, A2, B = 0x6030FDDB01885992, 0x11, 0x22


def instance_file(instance_id: int, endpoint: EndpointId = EP) -> ViewFile:
    path = f"{endpoint.namespace}/{endpoint.component}/{endpoint.endpoint}/{instance_id:x}"
    return ("instances", file_name_for(path))


def files_of(instance_id: int, files: Iterable[ViewFile]) -> list[ViewFile]:
    """The view files that belong to one worker of these tests."""
    marks = (f"{instance_id:x}", f"{instance_id % 1000 + 5000:x}")
    return [f for f in files if any(f[1].endswith(f"%2F{m}") for m in marks)]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_view_holds_exactly_the_admitted_live_workers_records() -> None:
    files = FakeFiles()
    view = AdmittedView(files)

    view.sync([Tenure(GROUP, 1, frozenset({A1}))], table_of(worker_records(A1), worker_records(B)))

    publisher = A1 % 1000 + 5000
    kv_events = "namespace%2Fpns%2Fcomponent%2Fbackend%2Fendpoint%2Fgenerate%2Ftopic%2Fkv%2Devents"
    query = EndpointId("pns", "backend", f"worker_kv_query_source_{A1:x}")
    assert sorted(files.content) == sorted(
        [
            ("event_sources", f"{kv_events}%2F{publisher:x}"),
            ("event_channels", f"{kv_events}%2F{publisher:x}"),
            instance_file(A1),
            instance_file(A1, query),
            mdc_file(A1),
        ]
    )
    # The bytes are the worker's own record, untouched.
    assert files.content[mdc_file(A1)] == worker_records(A1)[2].value
    # Event and instance records are in place before the card that makes the model appear.
    assert [op[1][0] for op in files.ops][-1] == "mdc"


def test_the_view_names_each_file_by_its_records_own_file_tuple() -> None:
    # The view keys what it wants, what it wrote and who owns it by file: at a fleet's size,
    # one tuple per file, the record's, serves them all, where a tuple per map was built again.
    files = FakeFiles()
    view = AdmittedView(files)
    table = table_of(worker_records(A1), worker_records(A2))
    view.sync([Tenure(GROUP, 1, frozenset({A1, A2}))], table)

    records = {(r.bucket, r.file_name): r for r in table.records()}
    assert len(view.files) == 10
    assert all(file is records[file].file for file in view.files)
    assert all(file is records[file].file for file in view.wanted())


def test_a_member_joining_is_added_before_a_member_leaving_is_removed() -> None:
    files = FakeFiles()
    view = AdmittedView(files)
    table = table_of(worker_records(A1), worker_records(A2))
    view.sync([Tenure(GROUP, 1, frozenset({A1}))], table)
    files.ops.clear()

    view.sync([Tenure(GROUP, 1, frozenset({A2}))], table)

    kinds = [op for op, _file in files.ops]
    assert kinds == ["publish"] * 5 + ["remove"] * 5
    assert set(files.content) == set(files_of(A2, files.content))
    # Removal takes the card first, so the frontend never holds a card without its instance.
    assert files.ops[5] == ("remove", mdc_file(A1))


def test_on_succession_the_old_incumbents_records_go_before_the_successors_appear() -> None:
    files = FakeFiles()
    view = AdmittedView(files)
    table = table_of(worker_records(A1), worker_records(B, block_size=32))
    view.sync([Tenure(GROUP, 1, frozenset({A1}))], table)
    files.ops.clear()

    report = view.sync([Tenure(GROUP, 4, frozenset({B}))], table)

    # The view never holds both configurations: a frontend starting in between could take
    # either, and a request routed to the departed cohort while B's files go in would fail.
    kinds = [op for op, _file in files.ops]
    assert kinds == ["remove"] * 5 + ["publish"] * 5
    assert files.ops[0] == ("remove", mdc_file(A1))
    assert files.ops[-1] == ("publish", mdc_file(B))
    assert set(report.withdrawn) == set(files_of(A1, report.withdrawn))
    assert set(files.content) == set(files_of(B, files.content))


def test_a_drained_tenure_handing_over_goes_after_its_successor_is_written() -> None:
    files = FakeFiles()
    view = AdmittedView(files)
    table = table_of(worker_records(A1), worker_records(B, block_size=32))
    view.sync([Tenure(GROUP, 1, frozenset({A1}))], table)
    files.ops.clear()

    # The successor's commit names the drained tenure it takes over from: A1 still serves.
    report = view.sync([Tenure(GROUP, 4, frozenset({B}), handover_from=1)], table)

    kinds = [op for op, _file in files.ops]
    assert kinds == ["publish"] * 5 + ["remove"] * 5
    assert files.ops[4] == ("publish", mdc_file(B))
    assert files.ops[5] == ("remove", mdc_file(A1))
    assert report.withdrawn == ()
    assert set(files.content) == set(files_of(B, files.content))


def test_a_drained_members_endpoint_records_stay_until_it_leaves_the_bucket() -> None:
    files = FakeFiles()
    view = AdmittedView(files)
    table = table_of(worker_records(A1), worker_records(A2))
    view.sync([Tenure(GROUP, 1, frozenset({A1, A2}))], table)
    files.ops.clear()
    drained = {("pns", A1)}

    report = view.sync([Tenure(GROUP, 1, frozenset({A2}))], table, drained)

    # Its card goes (no new request reaches it); its endpoint records stay, so the frontend
    # does not cancel the requests still in flight on it.
    query = EndpointId("pns", "backend", f"worker_kv_query_source_{A1:x}")
    kept = {instance_file(A1), instance_file(A1, query)}
    assert mdc_file(A1) in report.removed
    assert kept <= set(files.content)
    assert not kept & set(report.removed)
    # They are kept alive like every file of the view, and go once the worker's own go.
    assert kept <= set(view.files)
    table.apply(SourceDelete(endpoint_kv_key(EP, A1), 9))
    table.apply(SourceDelete(endpoint_kv_key(query, A1), 10))
    report = view.sync([Tenure(GROUP, 1, frozenset({A2}))], table, drained)
    assert set(report.removed) == kept
    assert set(files.content) == set(files_of(A2, files.content))


def test_a_drained_tenure_handing_over_takes_its_endpoint_records_along() -> None:
    files = FakeFiles()
    view = AdmittedView(files)
    table = table_of(worker_records(A1), worker_records(A2), worker_records(B, block_size=32))
    view.sync([Tenure(GROUP, 1, frozenset({A1, A2}))], table)
    # A1 drained first, beside A2: its endpoint records stay.
    view.sync([Tenure(GROUP, 1, frozenset({A2}))], table, {("pns", A1)})
    assert instance_file(A1) in files.content
    files.ops.clear()

    # A2 drained too: B succeeds. The frontend admits B's configuration only once the old
    # one's last instance is gone, so every drained worker's records go with the handover.
    drained = {("pns", A1), ("pns", A2)}
    view.sync([Tenure(GROUP, 4, frozenset({B}), handover_from=1)], table, drained)

    assert files.ops[4] == ("publish", mdc_file(B))
    assert set(files.content) == set(files_of(B, files.content))


def test_a_drained_last_member_with_no_successor_keeps_its_endpoint_records() -> None:
    files = FakeFiles()
    view = AdmittedView(files)
    table = table_of(worker_records(A1))
    view.sync([Tenure(GROUP, 1, frozenset({A1}))], table)

    # An old generation's last worker drained (the new one serves under another WorkerSet):
    # the tenure ends, its card goes, and the requests in flight on it are not cancelled.
    report = view.sync([], table, {("pns", A1)})

    assert mdc_file(A1) in report.withdrawn
    assert instance_file(A1) in files.content


def test_a_drained_worker_the_view_never_held_is_not_written() -> None:
    files = FakeFiles()
    view = AdmittedView(files)
    table = table_of(worker_records(A1), worker_records(B, block_size=32))
    view.sync([Tenure(GROUP, 1, frozenset({A1}))], table)

    view.sync([Tenure(GROUP, 1, frozenset({A1}))], table, {("pns", B)})

    assert files_of(B, files.content) == []


def test_a_handover_from_another_generation_does_not_delay_an_ended_tenure() -> None:
    files = FakeFiles()
    view = AdmittedView(files)
    table = table_of(worker_records(A1), worker_records(B, block_size=32))
    view.sync([Tenure(GROUP, 1, frozenset({A1}))], table)
    files.ops.clear()

    view.sync([Tenure(GROUP, 4, frozenset({B}), handover_from=2)], table)

    assert [op for op, _file in files.ops] == ["remove"] * 5 + ["publish"] * 5


def test_a_member_leaving_beside_others_is_removed_at_once() -> None:
    files = FakeFiles()
    view = AdmittedView(files)
    table = table_of(worker_records(A1), worker_records(A2))
    view.sync([Tenure(GROUP, 1, frozenset({A1, A2}))], table)
    files.ops.clear()

    report = view.sync([Tenure(GROUP, 1, frozenset({A2}))], table)

    assert report.withdrawn == ()
    assert set(report.removed) == set(files_of(A1, report.removed))
    assert len(report.removed) == 5


def test_a_retired_tenure_with_no_successor_yet_empties_the_view() -> None:
    files = FakeFiles()
    view = AdmittedView(files)
    table = table_of(worker_records(A1))
    view.sync([Tenure(GROUP, 1, frozenset({A1}))], table)

    report = view.sync([], table)

    assert len(report.withdrawn) == 5
    assert files.content == {}
    assert files.registry == set()


LOAD_TOPICS = ("kv_metrics", "forward-pass-metrics", "active_sequences_events")


def test_a_serving_tenure_carries_its_endpoints_load_channels_and_only_admitted_kv_events() -> None:
    files = FakeFiles()
    view = AdmittedView(files)
    table = table_of(
        worker_records(A1, channels=LOAD_TOPICS),
        worker_records(B, block_size=32, channels=LOAD_TOPICS),
    )

    view.sync([Tenure(GROUP, 1, frozenset({A1}))], table)

    channels = sorted(name for bucket, name in files.content if bucket == "event_channels")
    topics = [unquote(name).split("/")[-2] for name in channels]
    # Every topic of the admitted worker; the rejected one's load channels come along (their
    # records name no worker), its KV events never.
    assert sorted(topics) == sorted(["kv-events", *LOAD_TOPICS, *LOAD_TOPICS])
    assert not files_of(B, [f for f in files.content if f[0] != "event_channels"])
    assert [f for f in files.content if f[0] == "event_sources"] == files_of(A1, files.content)[:1]


def test_no_serving_tenure_means_no_load_channels() -> None:
    files = FakeFiles()
    view = AdmittedView(files)
    table = table_of(worker_records(A1, channels=LOAD_TOPICS))
    view.sync([Tenure(GROUP, 1, frozenset({A1}))], table)

    view.sync([Tenure(GROUP, 1, frozenset())], table)

    assert files.content == {}


def test_a_channel_topic_the_view_cannot_tie_is_left_out_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    files = FakeFiles()
    view = AdmittedView(files)
    table = table_of(worker_records(A1, channels=("kv_metrics", "brand-new-topic")))

    with caplog.at_level("WARNING"):
        view.sync([Tenure(GROUP, 1, frozenset({A1}))], table)
        view.sync([Tenure(GROUP, 1, frozenset({A1}))], table)

    names = [unquote(name) for _bucket, name in files.content]
    assert not [n for n in names if "brand-new-topic" in n]
    assert [n for n in names if "/kv_metrics/" in n]
    warnings = [r.getMessage() for r in caplog.records if "brand-new-topic" in r.getMessage()]
    assert len(warnings) == 1
    assert "does not hear it" in warnings[0]


def test_files_are_touched_only_when_a_refresh_is_due_and_a_lost_file_is_rewritten() -> None:
    files = FakeFiles()
    clock = Clock()
    view = AdmittedView(files, refresh_interval=2.0, clock=clock)
    view.sync([Tenure(GROUP, 1, frozenset({A1}))], table_of(worker_records(A1)))
    files.ops.clear()

    clock.now += 1.0
    assert view.keep_alive() == 0
    clock.now += 1.5
    assert view.keep_alive() == 5
    assert {op for op, _file in files.ops} == {"touch"}

    # Someone swept a file while the writer was stalled: the next refresh puts it back.
    del files.content[mdc_file(A1)]
    clock.now += 2.0
    view.keep_alive()
    assert mdc_file(A1) in files.content
    assert ("publish", mdc_file(A1)) in files.ops


def test_a_failed_write_is_retried_by_the_next_pass() -> None:
    files = FakeFiles()
    view = AdmittedView(files)
    table = table_of(worker_records(A1))
    files.fail_publish = True

    view.sync([Tenure(GROUP, 1, frozenset({A1}))], table)
    assert files.content == {}
    assert view.publish_errors == 5

    files.fail_publish = False
    view.sync([Tenure(GROUP, 1, frozenset({A1}))], table)
    assert len(files.content) == 5


def test_a_previous_writers_files_are_settled_by_the_first_sync_and_not_kept_alive_before() -> None:
    files = FakeFiles()
    first = AdmittedView(files)
    table = table_of(worker_records(A1), worker_records(A2))
    first.sync([Tenure(GROUP, 1, frozenset({A1, A2}))], table)
    files.ops.clear()

    second = AdmittedView(files)
    assert second.adopt_leftovers() == 10
    assert second.keep_alive(force=True) == 0
    second.sync([Tenure(GROUP, 7, frozenset({A2}))], table)

    assert set(files.content) == set(files_of(A2, files.content))
    assert len(files.content) == 5
    # No tenure owns the leftovers A1 had: they are withdrawn first. Then A2's are written
    # again over themselves (their content was unknown), so they never leave the view.
    assert [op for op, _file in files.ops] == ["remove"] * 5 + ["publish"] * 5


def test_a_refused_value_keeps_the_last_valid_record_in_the_view() -> None:
    table = table_of(worker_records(A1))
    valid = table.get(model_kv_key(EP, A1))

    table.apply(SourcePut(entry_of(model_kv_key(EP, A1), b'{"type":"Model"')))
    table.apply(SourcePut(entry_of(model_kv_key(EP, A1), encode_model_record(EP, A2, demo_card()))))

    assert table.get(model_kv_key(EP, A1)) == valid
    table.apply(SourceDelete(model_kv_key(EP, A1), 3))
    assert table.get(model_kv_key(EP, A1)) is None


def test_records_outside_the_namespace_filter_are_not_held() -> None:
    table = FedTable(BoundarySettings(namespace="other"))
    table.apply(SourceListing(worker_records(A1)))
    assert len(table) == 0


async def test_each_step_hands_a_read_model_one_delta_with_what_the_core_accepted() -> None:
    deltas: list[StepDelta] = []
    source = QueueSource()
    service = AdmissionService(source)

    class _Recorder:
        def step(self, delta: StepDelta) -> None:
            deltas.append(delta)

    service.subscribe(DeltaReader(_Recorder()))
    await service.start()
    try:
        source.queue.put_nowait(SourceListing(worker_records(A1)))
        # The same key with another checksum: the core keeps the first incarnation.
        source.queue.put_nowait(SourcePut(worker_records(A1, 32)[2]))
        source.queue.put_nowait(SourceDelete(model_kv_key(EP, A1), 2))
        await _until(lambda: any(model_kv_key(EP, A1) in d.records for d in deltas[1:]))
    finally:
        await service.stop()
    listing, removal = deltas[0], deltas[-1]
    # The refused put changed nothing a read model keeps: no delta carries its bytes.
    refused = worker_records(A1, 32)[2].value
    assert all(r is None or r.value != refused for d in deltas for r in d.records.values())
    assert listing.relisted
    assert {r.key for r in listing.records.values() if r is not None} == {
        e.key for e in worker_records(A1)
    }
    assert GROUP in listing.groups
    assert listing.endpoints == {EP, EndpointId("pns", "backend", f"worker_kv_query_source_{A1:x}")}
    assert removal.records == {model_kv_key(EP, A1): None}
    assert removal.groups == {GROUP: None}


async def test_an_endpoint_record_leaving_names_the_tenure_at_its_endpoint() -> None:
    deltas: list[StepDelta] = []
    source = QueueSource()
    service = AdmissionService(source)

    class _Recorder:
        def step(self, delta: StepDelta) -> None:
            deltas.append(delta)

    service.subscribe(DeltaReader(_Recorder()))
    await service.start()
    try:
        source.queue.put_nowait(SourceListing([*worker_records(A1), *worker_records(A2)]))
        await _until(lambda: any(d.groups.get(GROUP) is not None for d in deltas))
        committed = [d.groups[GROUP] for d in deltas if d.groups.get(GROUP) is not None]
        assert committed[-1].routable == {A1, A2}
        deltas.clear()
        # Only A2's endpoint record goes: no effect names the group, its liveness does.
        source.queue.put_nowait(SourceDelete(endpoint_kv_key(EP, A2), 3))
        await _until(lambda: bool(deltas))
    finally:
        await service.stop()
    (delta,) = deltas[:1]
    assert delta.endpoints == {EP}
    facts = delta.groups[GROUP]
    assert facts is not None
    assert facts.routable == {A1}
    assert delta.records == {endpoint_kv_key(EP, A2): None}


def test_a_refused_listed_value_and_a_key_touched_meanwhile_keep_what_they_hold() -> None:
    table = table_of(worker_records(A1), worker_records(A2))
    valid = table.get(model_kv_key(EP, A1))
    touched = endpoint_kv_key(EP, A2)
    listed = [
        entry if entry.key != model_kv_key(EP, A1) else entry_of(entry.key, b'{"type":"Model"')
        for entry in worker_records(A1)
    ]
    event = SourceListing(listed)
    records, kept = accepted_changes(event, {touched}, Ingestor().listing(event, now=0.0), ())
    table.listing([r for r in records.values() if r is not None], kept)

    assert table.get(model_kv_key(EP, A1)) == valid
    assert table.get(touched) is not None
    assert table.get(model_kv_key(EP, A2)) is None


def test_a_card_the_core_refused_in_place_keeps_its_first_bytes() -> None:
    table = table_of(worker_records(A1))
    first = table.get(model_kv_key(EP, A1))
    assert table.apply(SourcePut(worker_records(A1, 32)[2])) == set()
    assert table.refused == [f"pns/backend/generate/{A1:x}"]
    assert table.get(model_kv_key(EP, A1)) == first
    # Relisted with the refused value, the key keeps its first incarnation still.
    table.apply(SourceListing([*worker_records(A1, 32)]))
    assert table.get(model_kv_key(EP, A1)) == first


# --------------------------------------------------------------------------- real files


def test_a_missing_directory_is_refused_with_its_name(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(ViewDirectoryError, match=f"view directory {missing} does not exist"):
        DirectoryFiles.open(missing)
    assert not missing.exists()


def test_an_unwritable_directory_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        # Root writes through permission bits; sysfs refuses new files even to root.
        target = Path("/sys/kernel")
        before = sorted(os.listdir(target))
    else:
        target = tmp_path / "locked"
        target.mkdir()
        target.chmod(0o555)
        before = []
    with pytest.raises(ViewDirectoryError, match=f"view directory {target} is not writable"):
        DirectoryFiles.open(target)
    assert sorted(os.listdir(target)) == before


@pytest.mark.parametrize(
    ("code", "passing"),
    [(errno.EROFS, True), (errno.ENOSPC, True), (errno.EDQUOT, True), (errno.EACCES, False)],
)
def test_a_read_only_or_full_directory_is_refused_as_a_state_that_may_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, passing: bool
) -> None:
    # A read-only remount or a full disk at start is what a supervisor's restart may cure; a
    # directory this user may not write is not.
    def refused(self: DirectoryFiles, key: tuple[str, str], data: bytes) -> str:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(DirectoryFiles, "_write_temp", refused)
    with pytest.raises(ViewDirectoryError, match=f"view directory {tmp_path} is not writable") as e:
        DirectoryFiles.open(tmp_path)
    assert isinstance(e.value, ViewDirectoryUnavailable) is passing
    # The lock was let go: a writer started once the state passes takes the directory.
    monkeypatch.undo()
    DirectoryFiles.open(tmp_path).release()


def test_a_directory_another_live_writer_owns_is_refused(tmp_path: Path) -> None:
    owner = DirectoryFiles.open(tmp_path)
    try:
        with pytest.raises(ViewDirectoryError, match="owned by another live writer"):
            DirectoryFiles.open(tmp_path)
    finally:
        owner.release()
    # Released: the next writer takes it.
    DirectoryFiles.open(tmp_path).release()


def test_the_frontend_store_must_be_the_view_directory(tmp_path: Path) -> None:
    check_frontend_store(tmp_path, {"DYN_FILE_KV": str(tmp_path / ".")})
    with pytest.raises(ViewDirectoryError, match="not this frontend's file store"):
        check_frontend_store(tmp_path, {"DYN_FILE_KV": str(tmp_path / "elsewhere")})
    with pytest.raises(ViewDirectoryError, match="its default"):
        check_frontend_store(tmp_path, {"TMPDIR": str(tmp_path)})


def test_publication_is_atomic_and_a_restart_removes_only_the_previous_writers_files(
    tmp_path: Path,
) -> None:
    files = DirectoryFiles.open(tmp_path)
    view = AdmittedView(files)
    table = table_of(worker_records(A1), worker_records(A2))
    view.sync([Tenure(GROUP, 1, frozenset({A1, A2}))], table)
    mdc = tmp_path / "v1" / "mdc"
    assert sorted(os.listdir(mdc)) == sorted(f[1] for f in (mdc_file(A1), mdc_file(A2)))
    assert read_registry(tmp_path) == sorted(view.files, key=lambda f: (BUCKETS.index(f[0]), f[1]))
    # A worker wrongly registering into the view: never the writer's to delete.
    foreign = mdc / "pns%2Fbackend%2Fgenerate%2Fabc"
    foreign.write_bytes(b"{}")
    files.release()  # the writer dies without clearing

    files = DirectoryFiles.open(tmp_path)
    restarted = AdmittedView(files)
    restarted.adopt_leftovers()
    assert files.foreign_files(restarted.files) == [("mdc", foreign.name)]
    restarted.sync([Tenure(GROUP, 2, frozenset({A2}))], table)
    assert sorted(os.listdir(mdc)) == sorted([mdc_file(A2)[1], foreign.name])

    # Every tenure ended: the writer withdraws its own files, and only those.
    restarted.sync([], table)
    files.release()
    leftovers = [p.name for p in tmp_path.rglob("*") if p.is_file()]
    assert sorted(leftovers) == sorted([foreign.name, CLOCK_PROBE_NAME, LOCK_NAME])
    assert read_registry(tmp_path) == []


def test_a_file_altered_from_outside_is_found_by_its_size_or_inode_and_written_again(
    tmp_path: Path,
) -> None:
    files = DirectoryFiles.open(tmp_path)
    view = AdmittedView(files)
    table = table_of(worker_records(A1), worker_records(A2))
    view.sync([Tenure(GROUP, 1, frozenset({A1, A2}))], table)
    mdc = tmp_path / "v1" / "mdc"
    card, other = mdc / mdc_file(A1)[1], mdc / mdc_file(A2)[1]
    written = card.read_bytes(), other.read_bytes()
    assert view.verify() == 0

    card.write_bytes(b'{"type":"Model"}')  # in place, another size
    spare = mdc / ".spare"
    spare.write_bytes(b"x" * len(written[1]))  # the same size, by a rename: another inode
    os.replace(spare, other)
    assert view.verify() == 2
    report = view.retry(table)

    assert set(report.written) == {mdc_file(A1), mdc_file(A2)}
    assert (card.read_bytes(), other.read_bytes()) == written
    assert view.verify() == 0
    files.release()


def test_the_store_reader_sees_the_view_as_dynamo_files(tmp_path: Path) -> None:
    from workerset_admission.adapters.dynamo.bridge import bucket_key_for
    from workerset_admission.adapters.dynamo.filestore import scan_file_store

    files = DirectoryFiles.open(tmp_path)
    try:
        AdmittedView(files).sync([Tenure(GROUP, 1, frozenset({A1}))], table_of(worker_records(A1)))
    finally:
        files.release()

    keys = {bucket_key_for(r) for r in scan_file_store(tmp_path).records}
    wanted = {e.key for e in worker_records(A1) if "kv_metrics" not in e.key}
    assert keys == wanted


# --------------------------------------------------------------------------- the writer


class QueueSource:
    def __init__(self) -> None:
        self.queue: asyncio.Queue[SourceEvent | None] = asyncio.Queue()

    async def events(self) -> AsyncIterator[SourceEvent]:
        while (event := await self.queue.get()) is not None:
            yield event

    async def list_all(self) -> SourceListing:
        return SourceListing(())

    async def close(self) -> None:
        self.queue.put_nowait(None)


async def _until(condition: Any, seconds: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not condition():
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def writing_service() -> AsyncIterator[tuple[FakeFiles, QueueSource, AdmissionService]]:
    """A running service fed by a queue, with a view writer on fake files; both stop after."""
    files = FakeFiles()
    table = RecordTable()
    source = QueueSource()
    service = AdmissionService(source)
    writer = ViewWriter(AdmittedView(files, refresh_interval=0.2), table)
    writer.attach(service)
    await service.start()
    try:
        yield files, source, service
    finally:
        await service.stop()
        await writer.close()


async def test_the_writer_follows_the_services_receivers_through_a_succession() -> None:
    async with writing_service() as (files, source, _service):
        # Nothing is written before the first snapshot.
        await asyncio.sleep(0.05)
        assert files.ops == []
        # A listing is observed in key order; B registers after A1 to be the one rejected.
        source.queue.put_nowait(SourceListing(worker_records(A1)))
        for entry in worker_records(B, 32):
            source.queue.put_nowait(SourcePut(entry))
        await _until(lambda: mdc_file(A1) in files.content)
        assert set(files.content) == set(files_of(A1, files.content))

        # The incumbent drains: its last records go, then the successor's appear.
        for entry in worker_records(A1):
            source.queue.put_nowait(SourceDelete(entry.key, 3))
        await _until(lambda: mdc_file(B) in files.content and mdc_file(A1) not in files.content)
        removed = files.ops.index(("remove", mdc_file(A1)))
        added = files.ops.index(("publish", mdc_file(B)))
        assert removed < added
        assert set(files.content) == set(files_of(B, files.content))

        # Kept alive while nothing changes (NATS away: no events at all).
        files.ops.clear()
        await _until(lambda: ("touch", mdc_file(B)) in files.ops)
    # A writer that stops leaves its view in place: the frontend keeps it for its horizon.
    assert set(files.content) == set(files_of(B, files.content))
    assert not any(op == "remove" for op, _file in files.ops)


async def test_the_writer_follows_a_drain_of_the_last_incumbent_successor_first() -> None:
    async with writing_service() as (files, source, _service):
        source.queue.put_nowait(SourceListing(worker_records(A1)))
        for entry in worker_records(B, 32):
            source.queue.put_nowait(SourcePut(entry))
        await _until(lambda: mdc_file(A1) in files.content)
        files.ops.clear()

        # A1 is drained, not gone: B goes in before A1 goes out.
        drain = Drain(EP.namespace, A1, "ops", 1.0)
        source.queue.put_nowait(
            SourcePut(entry_of(drain_kv_key(EP.namespace, A1), encode_drain_record(drain)))
        )
        await _until(lambda: mdc_file(B) in files.content and mdc_file(A1) not in files.content)
        assert files.ops.index(("publish", mdc_file(B))) < files.ops.index(("remove", mdc_file(A1)))
        # The successor serves: the drained worker's endpoint records go too, or the
        # frontend would not admit B's configuration.
        assert set(files.content) == set(files_of(B, files.content))


async def test_the_writer_keeps_a_drained_members_endpoint_records_until_it_leaves() -> None:
    async with writing_service() as (files, source, service):
        source.queue.put_nowait(SourceListing([*worker_records(A1), *worker_records(A2)]))
        await _until(lambda: mdc_file(A1) in files.content and mdc_file(A2) in files.content)

        drain = Drain(EP.namespace, A1, "ops", 1.0)
        key = drain_kv_key(EP.namespace, A1)
        source.queue.put_nowait(SourcePut(entry_of(key, encode_drain_record(drain))))
        await _until(lambda: mdc_file(A1) not in files.content)
        assert service.drained_workers() == {(EP.namespace, A1)}
        assert instance_file(A1) in files.content

        # Given back: its card returns. Drained again, then gone: everything of it goes.
        source.queue.put_nowait(SourceDelete(key, 40))
        await _until(lambda: mdc_file(A1) in files.content)
        assert service.drained_workers() == frozenset()
        source.queue.put_nowait(SourcePut(entry_of(key, encode_drain_record(drain))))
        await _until(lambda: mdc_file(A1) not in files.content)
        for entry in worker_records(A1):
            source.queue.put_nowait(SourceDelete(entry.key, 50))
        await _until(lambda: set(files.content) == set(files_of(A2, files.content)))


def test_the_index_follows_puts_removals_and_listings() -> None:
    table = table_of(worker_records(A1), worker_records(A2))
    view = AdmittedView(FakeFiles())

    table.apply(SourceDelete(endpoint_kv_key(EP, A1), 5))
    table.apply(SourcePut(entry_of(model_kv_key(EP, A2), worker_records(A2, 32)[2].value)))
    plan = view.sync([Tenure(GROUP, 1, frozenset({A1, A2}))], table)

    written = set(plan.written)
    assert instance_file(A1) not in written
    assert mdc_file(A1) in written
    assert mdc_file(A2) in written
    # The core refused the in-place change of checksum: the first incarnation's bytes stay.
    assert view.files[mdc_file(A2)] == worker_records(A2)[2].value

    table.apply(SourceListing(worker_records(A2)))
    assert table.lookup("worker", "pns", "backend", A1) == []
    assert len(table.lookup("worker", "pns", "backend", A2)) == 3


def test_a_held_tenures_last_known_members_keep_their_records_while_the_core_names_them() -> None:
    clock = Clock()
    files = FakeFiles()
    view = AdmittedView(files, clock=clock)
    table = FedTable()
    table.apply(SourceListing([*worker_records(A1), *worker_records(A2)]))
    view.sync([Tenure(GROUP, 1, frozenset({A1, A2}))], table)
    published = dict(files.content)
    # A wiped store: the listing after the reconnect holds nothing at all.
    table.apply(SourceListing([]))
    report = view.sync([Tenure(GROUP, 1, frozenset({A1, A2}), frozenset({A1, A2}))], table)
    assert not report.changed
    assert files.content == published
    # The core's window, not a clock of the view's: still served a minute later.
    clock.now += 60.0
    report = view.sync([Tenure(GROUP, 1, frozenset({A1, A2}), frozenset({A1, A2}))], table)
    assert not report.changed
    # Only the members the core serves on last known good: a plain routable id is not.
    view.sync([Tenure(GROUP, 1, frozenset({A1, A2}), frozenset({A1}))], table)
    assert set(files.content) == set(files_of(A1, published))
    # A2's records were forgotten: the core naming it again later brings nothing back.
    view.sync([Tenure(GROUP, 1, frozenset({A1, A2}), frozenset({A1, A2}))], table)
    assert set(files.content) == set(files_of(A1, published))
    # The core's last known window ends: A1 is no longer named, and its records go.
    view.sync([Tenure(GROUP, 1, frozenset({A1}))], table)
    assert files.content == {}
    assert table.lookup_last_known("worker", "pns", "backend", A1) == []


def test_records_that_left_the_bucket_are_forgotten_at_the_next_pass_nobody_needs_them() -> None:
    table = table_of(worker_records(A1))
    view = AdmittedView(FakeFiles())
    table.apply(SourceDelete(model_kv_key(EP, A1), 2))
    # A pass whose tenures name no last known member: the removed card is not kept.
    view.sync([Tenure(GROUP, 1, frozenset({A1}))], table)
    assert len(table.lookup_last_known("worker", "pns", "backend", A1)) == 2
    assert table.get(model_kv_key(EP, A1)) is None


def test_a_record_back_in_the_bucket_is_served_from_the_bucket_again() -> None:
    clock = Clock()
    table = FedTable()
    old, new = worker_records(A1), worker_records(A1, block_size=32)
    table.apply(SourceListing(old))
    table.apply(SourceDelete(old[2].key, 2))
    assert [r.value for r in table.lookup("worker", "pns", "backend", A1)] == [
        old[0].value,
        old[1].value,
    ]
    assert old[2].value in [
        r.value for r in table.lookup_last_known("worker", "pns", "backend", A1)
    ]
    table.apply(SourcePut(entry_of(new[2].key, new[2].value)))
    values = [r.value for r in table.lookup_last_known("worker", "pns", "backend", A1)]
    assert new[2].value in values
    assert old[2].value not in values
    clock.now += 60.0
    table.apply(SourceListing(new))
    assert len(table.lookup_last_known("worker", "pns", "backend", A1)) == 3


def test_a_held_tenure_keeps_its_load_channels_while_serving_last_known_members() -> None:
    clock = Clock()
    files = FakeFiles()
    view = AdmittedView(files, clock=clock)
    table = FedTable()
    table.apply(SourceListing(worker_records(A1, channels=LOAD_TOPICS)))
    view.sync([Tenure(GROUP, 1, frozenset({A1}))], table)
    published = dict(files.content)
    assert len([f for f in published if f[0] == "event_channels"]) == 1 + len(LOAD_TOPICS)

    table.apply(SourceListing([]))  # a wiped store
    clock.now += 5.0
    report = view.sync([Tenure(GROUP, 1, frozenset({A1}), frozenset({A1}))], table)

    assert not report.changed
    assert files.content == published


def test_a_file_that_cannot_be_written_is_warned_about_once_and_counted_until_it_is(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tenure = [Tenure(GROUP, 1, frozenset({A1}))]
    table = table_of(worker_records(A1))
    # The record names the worker's files take (its instance and card files share one).
    written = FakeFiles()
    AdmittedView(written).sync(tenure, table)
    names = {name for _bucket, name in written.content}
    files = FakeFiles()
    view = AdmittedView(files)
    files.fail_publish = True
    with caplog.at_level("INFO", logger="workerset_admission.adapters.dynamo.view"):
        for _ in range(5):  # five passes, each trying every file again
            view.sync(tenure, table)
        warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        # One line per record name, not one per file per pass; the failures are counted.
        assert len(warnings) == len(names), warnings
        assert all("retried at every pass" in line for line in warnings)
        assert view.publish_errors == 5 * len(written.content)
        caplog.clear()
        files.fail_publish = False
        view.sync(tenure, table)
    assert set(files.content) == set(written.content)
    said = [r.getMessage() for r in caplog.records]
    assert any("after 5 failed attempt(s)" in line for line in said), said


async def test_an_instance_id_back_at_a_new_address_is_the_same_worker_with_a_new_address() -> None:
    # A failover shadow takes the worker's instance id at another address: the endpoint record
    # is put again under its key with another transport. The view's instance file carries the
    # new record, and admission does not move: no refusal, no new build, the same members.
    async with writing_service() as (files, source, service):
        source.queue.put_nowait(SourceListing([*worker_records(A1), *worker_records(A2)]))
        await _until(lambda: mdc_file(A1) in files.content and mdc_file(A2) in files.content)
        await _until(lambda: service.status().groups[0].status == "ready")
        [before] = service.status().groups
        assert set(before.routable) == {A1, A2}
        card_bytes = files.content[mdc_file(A1)]

        moved = encode_endpoint_record(EP, A1, {"tcp": f"127.0.0.2:4242/{A1:x}"})
        assert moved != files.content[instance_file(A1)]
        source.queue.put_nowait(SourcePut(entry_of(endpoint_kv_key(EP, A1), moved)))
        await _until(lambda: files.content.get(instance_file(A1)) == moved)

        status = service.status()
        [after] = status.groups
        assert status.invalid_total == 0
        assert (after.incumbent, after.admitted, after.routable) == (
            before.incumbent,
            before.admitted,
            before.routable,
        )
        assert (after.generation, after.committed_generation) == (
            before.generation,
            before.committed_generation,
        )
        assert files.content[mdc_file(A1)] == card_bytes
        assert set(files.content) == set(files_of(A1, files.content)) | set(
            files_of(A2, files.content)
        )


def _on_disk(root: Path) -> dict[str, bytes]:
    out = {}
    for path in sorted((root / "v1").rglob("*")):
        if path.is_file():
            out[str(path.relative_to(root))] = path.read_bytes()
    return out


async def test_the_frontends_own_records_and_unknown_kinds_are_left_alone_and_not_carried(
    tmp_path: Path,
) -> None:
    # A frontend on the view writes into its own store: a 1.7 frontend's rollout-handoff
    # records (event sources on topic frontend-model-admission), its store's temp files; and a
    # later release may write a record kind the view does not know (velo-peers). The view never
    # touches them, through admissions, a succession and a withdrawal; a record of an unknown
    # kind that reaches the service (the NATS source does not watch such keys; a source of
    # another store might pass one on) is refused as a bad key and reaches no file of the view.
    files = DirectoryFiles.open(tmp_path)
    handoff = "namespace%2Ffe%2Ftopic%2Ffrontend%2Dmodel%2Dadmission%2F2a"
    theirs = {
        f"v1/event_sources/{handoff}": b'{"protocol":"v1","capability":true}',
        "v1/mdc/.tmp_0123456789abcdef": b"half written",
        "v1/velo-peers/by%2Dinstance%2F0b7a": b'{"peer":"tcp://127.0.0.1:9"}',
    }
    for name, data in theirs.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
    source = QueueSource()
    service = AdmissionService(source)
    writer = ViewWriter(AdmittedView(files, refresh_interval=0.2), RecordTable())
    writer.attach(service)
    await service.start()
    try:
        source.queue.put_nowait(SourceListing(worker_records(A1)))
        for entry in worker_records(B, 32):
            source.queue.put_nowait(SourcePut(entry))
        unknown = "v1.velo-peers.by-instance.0b7a"
        source.queue.put_nowait(SourcePut(entry_of(unknown, b'{"peer":"tcp://127.0.0.1:9"}')))
        await _until(lambda: mdc_file(A1) in files.registered())
        for entry in worker_records(A1):
            source.queue.put_nowait(SourceDelete(entry.key, 3))
        await _until(lambda: mdc_file(B) in files.registered())
        for entry in worker_records(B, 32):
            source.queue.put_nowait(SourceDelete(entry.key, 4))
        await _until(lambda: not files.registered())
        await asyncio.sleep(0.5)  # a keep-alive pass or two
        status = service.status()
    finally:
        await service.stop()
        await writer.close()
        files.release()
    assert {k: v for k, v in _on_disk(tmp_path).items() if k in theirs} == theirs
    assert set(_on_disk(tmp_path)) == set(theirs)
    assert [(r.key, r.reason) for r in status.recent_invalid] == [(unknown, "bad_key")]


def test_the_view_holds_the_very_bytes_the_sources_listing_and_put_carried() -> None:
    # The raw record is held once: the table files the bytes object the source handed in
    # (through ingestion, the core's step and the delta), not a copy of it.
    endpoint, card = worker_records(A1)[0], worker_records(A1)[2]
    table = FedTable()
    table.apply(SourceListing([endpoint]))
    table.apply(SourcePut(card))
    held_endpoint, held_card = table.get(endpoint.key), table.get(card.key)
    assert held_endpoint is not None
    assert held_card is not None
    assert held_endpoint.file == instance_file(A1)
    assert held_card.file == mdc_file(A1)
    assert held_endpoint.value is endpoint.value
    assert held_card.value is card.value
