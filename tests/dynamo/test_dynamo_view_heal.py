"""The view heals itself: failed writes and removals are tried again, a lost folder is made again,
a drained tenure hands over only once its successor is written, and a card that cannot be
removed stays in the frontend's serving record."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from support.viewworld import EP, GROUP, FakeFiles, mdc_file, table_of, worker_records
from workerset_admission.adapters.dynamo.view import (
    AdmittedView,
    DirectoryFiles,
    Tenure,
    ViewChanges,
)
from workerset_admission.identity import instance_key

A1, A2, B = 0x11, 0x12, 0x22


def test_a_write_that_failed_is_written_by_a_retry_with_no_discovery_change() -> None:
    files = FakeFiles()
    view = AdmittedView(files)
    table = table_of(worker_records(A1))
    files.fail_publish = True
    view.sync([Tenure(GROUP, 1, frozenset({A1}))], table)
    assert files.content == {}
    assert view.unsettled == 5

    files.fail_publish = False
    report = view.retry(table)

    assert len(report.written) == 5
    assert mdc_file(A1) in files.content
    assert view.unsettled == 0


def test_a_removed_bucket_folder_is_made_again_at_the_next_refresh(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    files = DirectoryFiles.open(tmp_path)
    try:
        view = AdmittedView(files)
        view.sync([Tenure(GROUP, 1, frozenset({A1}))], table_of(worker_records(A1)))
        mdc = tmp_path / "v1" / "mdc"
        for child in mdc.iterdir():
            child.unlink()
        mdc.rmdir()

        with caplog.at_level(logging.WARNING):
            view.keep_alive(force=True)

        assert (mdc / mdc_file(A1)[1]).exists()
        assert any("made" in r.getMessage() and "again" in r.getMessage() for r in caplog.records)
    finally:
        files.release()


def test_a_card_that_cannot_be_removed_is_tried_again_and_named_meanwhile(
    caplog: pytest.LogCaptureFixture,
) -> None:
    files = FakeFiles()
    view = AdmittedView(files)
    table = table_of(worker_records(A1), worker_records(A2))
    view.sync([Tenure(GROUP, 1, frozenset({A1, A2}))], table)
    files.fail_remove = True

    with caplog.at_level(logging.WARNING):
        view.update(ViewChanges({GROUP: Tenure(GROUP, 1, frozenset({A1}))}), table)
        view.retry(table)
        view.retry(table)

    assert mdc_file(A2) in files.content
    assert view.unremoved_cards() == {"pns": {instance_key(EP, A2)}}
    # Tried at every pass, said once.
    warned = [r for r in caplog.records if f"could not remove mdc/{mdc_file(A2)[1]}" in r.message]
    assert len(warned) == 1

    files.fail_remove = False
    view.retry(table)
    assert mdc_file(A2) not in files.content
    assert view.unremoved_cards() == {}
    assert view.unsettled == 0


def test_a_drained_tenure_handing_over_stays_until_its_successor_is_written() -> None:
    files = FakeFiles()
    view = AdmittedView(files)
    table = table_of(worker_records(A1), worker_records(B, block_size=32))
    view.sync([Tenure(GROUP, 1, frozenset({A1}))], table)
    files.fail_publish = True  # the view's file system is full

    view.update(
        ViewChanges({GROUP: Tenure(GROUP, 4, frozenset({B}), handover_from=1)}),
        table,
        {("pns", A1)},
    )

    # The successor could not be written: the drained tenure keeps serving from the view.
    assert mdc_file(A1) in files.content
    assert mdc_file(B) not in files.content

    files.fail_publish = False
    report = view.retry(table, {("pns", A1)})

    assert mdc_file(B) in files.content
    assert mdc_file(A1) not in files.content
    order = [f for f in report.written + report.removed if f in (mdc_file(A1), mdc_file(B))]
    assert order == [mdc_file(B), mdc_file(A1)]


def test_the_serving_record_keeps_naming_a_worker_whose_card_the_view_still_holds() -> None:
    from support.fakes import FakeSource
    from workerset_admission.service.admission_service import AdmissionService

    service = AdmissionService(FakeSource())
    files = FakeFiles()
    view = AdmittedView(files)
    table = table_of(worker_records(A1), worker_records(A2))
    view.sync([Tenure(GROUP, 1, frozenset({A1, A2}))], table)
    files.fail_remove = True
    view.update(ViewChanges({GROUP: Tenure(GROUP, 1, frozenset({A1}))}), table)
    service.also_serving(view.unremoved_cards)

    records = service.serving_records()

    # drain --wait reads members: A2 is still named while its card is in the view.
    assert instance_key(EP, A2) in records["pns"].members
    files.fail_remove = False
    view.retry(table)
    assert "pns" not in service.serving_records()


def test_files_that_cannot_be_registered_are_not_written_and_warned_about_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    files = FakeFiles()
    view = AdmittedView(files)
    table = table_of(worker_records(A1), worker_records(A2))
    files.fail_register = True  # the view's file system is full

    with caplog.at_level(logging.INFO):
        view.sync([Tenure(GROUP, 1, frozenset({A1, A2}))], table)
        view.retry(table)
        view.retry(table)
        warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        # One warning per record file name (a worker's card and endpoint record share one),
        # not one per file or per try.
        assert len(warned) == 6, warned
        # Nothing the next writer could not account for was written.
        assert files.content == {}
        assert view.unsettled == 10
        assert view.publish_errors == 30

        files.fail_register = False
        view.retry(table)
    assert set(files.content) == files.registry
    assert len(files.content) == 10
    # A pass stages what it is about to write, together.
    assert [len(batch) for batch in files.staged] == [10, 10, 10, 10]


def test_a_refresh_comes_in_slices_and_is_done_within_half_its_interval() -> None:
    workers = [0x100 + n for n in range(120)]
    table = table_of(*(worker_records(w) for w in workers))
    for interval, first_call in ((2.0, 500), (0.04, 600)):
        files = FakeFiles()
        view = AdmittedView(files, refresh_interval=interval)
        view.sync([Tenure(GROUP, 1, frozenset(workers))], table)
        assert len(view) == 600

        touched = [view.keep_alive(force=True)]
        while view.refreshing:
            touched.append(view.keep_alive())

        # 500 a call when that finishes in time; one call when the interval leaves no other.
        assert touched[0] == first_call
        assert sum(touched) == 600
