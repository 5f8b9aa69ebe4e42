"""The view's horizon is bounded on clocks the writer cannot set, not only on its own wall clock."""

from __future__ import annotations

import os
import time
from pathlib import Path

from support.viewworld import GROUP, mdc_file, table_of, worker_records
from workerset_admission.adapters.dynamo.view import (
    AdmittedView,
    DirectoryFiles,
    Horizon,
    LastKnownGood,
    Tenure,
    ViewHook,
)

DAY = 86400.0
LEASE = Horizon().lease
A1, A2 = 0xA1, 0xA2


def stamps(root: Path) -> list[float]:
    return [p.stat().st_mtime for p in (root / "v1").rglob("*") if p.is_file()]


def test_a_writer_whose_clock_runs_a_day_ahead_stamps_a_lease_beyond_the_file_systems_now(
    tmp_path: Path,
) -> None:
    files = DirectoryFiles.open(tmp_path, wall=lambda: time.time() + DAY)
    files.lease = LEASE
    view = AdmittedView(files, clock=lambda: 0.0)
    table = table_of(worker_records(A1), worker_records(A2))
    view.sync([Tenure(GROUP, 1, frozenset({A1, A2}))], table)
    written = stamps(tmp_path)
    assert len(written) == 10
    # The kernel's clock (what the frontend's file store expires by), not the writer's.
    assert max(written) <= time.time() + LEASE + 1.0
    assert min(written) >= time.time() + LEASE - 5.0
    # Each touch too.
    assert view.keep_alive(force=True) == 10
    assert max(stamps(tmp_path)) <= time.time() + LEASE + 1.0
    files.release()


def test_the_nats_servers_clock_bounds_the_stamp_where_the_writer_has_it(tmp_path: Path) -> None:
    files = DirectoryFiles.open(tmp_path)
    files.lease = LEASE
    server_behind = 120.0
    files.server_now = lambda: time.time() - server_behind
    AdmittedView(files).sync([Tenure(GROUP, 1, frozenset({A1}))], table_of(worker_records(A1)))
    assert max(stamps(tmp_path)) <= time.time() - server_behind + LEASE + 1.0
    # A server a day behind lowers the stamp by half the lease at most: no file expires
    # between two touches for it.
    files.server_now = lambda: time.time() - DAY
    assert files.touch(mdc_file(A1))
    stamped = os.stat(tmp_path / "v1" / "mdc" / mdc_file(A1)[1]).st_mtime
    assert time.time() + LEASE / 2 - 5.0 <= stamped <= time.time() + LEASE / 2 + 1.0
    # A server time not known (yet): the other clocks alone.
    files.server_now = lambda: None
    assert files.touch(mdc_file(A1))
    assert os.stat(tmp_path / "v1" / "mdc" / mdc_file(A1)[1]).st_mtime > time.time() + LEASE - 5
    files.release()


def test_the_file_systems_clock_is_read_once_per_interval_not_per_stamp(tmp_path: Path) -> None:
    monotonic = [100.0]
    files = DirectoryFiles.open(tmp_path, clock=lambda: monotonic[0])
    probe = tmp_path / ".workerset-admission.clock"
    files.now()
    first = probe.stat().st_mtime_ns
    time.sleep(0.02)
    for _ in range(50):
        files.now()
    assert probe.stat().st_mtime_ns == first
    monotonic[0] += 10.0
    files.now()
    assert probe.stat().st_mtime_ns > first
    files.release()


def test_files_a_predecessor_stamped_a_day_ahead_are_stamped_again_when_adopted(
    tmp_path: Path,
) -> None:
    ahead = DirectoryFiles.open(tmp_path)
    ahead.lease = LEASE + DAY  # what a writer whose clock ran a day ahead left
    AdmittedView(ahead).sync([Tenure(GROUP, 1, frozenset({A1}))], table_of(worker_records(A1)))
    ahead.release()
    assert min(stamps(tmp_path)) > time.time() + DAY

    files = DirectoryFiles.open(tmp_path)
    ViewHook(files, owns_files=False, horizon=Horizon())
    # Before any sync (its first listing may be slow to come): cut back to one lease.
    assert max(stamps(tmp_path)) <= time.time() + LEASE + 1.0
    files.release()


def test_a_writer_that_cannot_start_keeps_a_fast_predecessors_view_for_one_lease(
    tmp_path: Path,
) -> None:
    ahead = DirectoryFiles.open(tmp_path)
    ahead.lease = LEASE + DAY
    AdmittedView(ahead).sync([Tenure(GROUP, 1, frozenset({A1}))], table_of(worker_records(A1)))
    ahead.release()

    files = DirectoryFiles.open(tmp_path)
    started = time.monotonic()
    kept = LastKnownGood(files, lease=LEASE)
    assert kept.serving
    # The lease and the store's 10 s, not a day.
    assert kept.until - started <= LEASE + 10.0 + 1.0
    assert max(stamps(tmp_path)) <= time.time() + LEASE + 1.0
    files.release()


def test_files_stamped_within_the_lease_are_left_as_they_are(tmp_path: Path) -> None:
    files = DirectoryFiles.open(tmp_path)
    files.lease = LEASE
    AdmittedView(files).sync([Tenure(GROUP, 1, frozenset({A1}))], table_of(worker_records(A1)))
    before = sorted(stamps(tmp_path))
    assert files.restamp_ahead(files.registered()) == 0
    assert sorted(stamps(tmp_path)) == before
    files.release()


def test_a_writer_whose_lease_in_the_bucket_is_overdue_stamps_that_much_less_far_ahead(
    tmp_path: Path,
) -> None:
    # A writer cut off from the admission bucket cannot renew the lease its serving records
    # state; once the server drops them a drain counts the frontend as let go, so the view
    # must have expired by then: each touch stamps as a touch at the last renewal did.
    files = DirectoryFiles.open(tmp_path)
    files.lease = LEASE
    overdue: list[float | None] = [0.0]
    files.lease_overdue = lambda: overdue[0]
    AdmittedView(files).sync([Tenure(GROUP, 1, frozenset({A1}))], table_of(worker_records(A1)))
    assert min(stamps(tmp_path)) >= time.time() + LEASE - 5.0
    mdc = tmp_path / "v1" / "mdc" / mdc_file(A1)[1]
    overdue[0] = 300.0
    assert files.touch(mdc_file(A1))
    assert time.time() + LEASE - 300.0 - 5.0 <= mdc.stat().st_mtime <= time.time() + LEASE - 299.0
    # Past the whole lease, a touch leaves the file to the store's own 10 s.
    overdue[0] = LEASE + 60.0
    assert files.touch(mdc_file(A1))
    assert mdc.stat().st_mtime <= time.time() - 59.0
    # No lease in the bucket (no publisher, or a bucket without per-key TTLs): no bound.
    overdue[0] = None
    assert files.touch(mdc_file(A1))
    assert mdc.stat().st_mtime >= time.time() + LEASE - 5.0
    files.release()
