"""The view fails static: files stamped a lease ahead outlive their writer for the horizon."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from workerset_admission.adapters.dynamo.filestore import DEFAULT_FILE_TTL
from workerset_admission.adapters.dynamo.view import AdmittedView, DirectoryFiles, Horizon

FILE = ("mdc", "ns%2Fbackend%2Fgenerate%2F1")


def expires_at(mtime: float) -> float:
    """When Dynamo's file store sweep deletes a file with this mtime (its rule: mtime + TTL)."""
    return mtime + DEFAULT_FILE_TTL


@pytest.mark.parametrize("seconds", [10.0, 11.0, 30.0, 120.0, 600.0, 3600.0, 7 * 86400.0])
def test_a_view_touched_on_time_always_has_the_whole_horizon_left(seconds: float) -> None:
    horizon = Horizon(seconds)
    touched = 1_000.0
    # Just before the next touch is due, the file is furthest from its last stamp.
    latest = touched + horizon.refresh
    assert expires_at(touched + horizon.lease) - latest == pytest.approx(seconds)
    # And it never lasts more than one refresh beyond the horizon.
    assert expires_at(touched + horizon.lease) - touched == pytest.approx(seconds + horizon.refresh)


def test_a_longer_horizon_touches_less_often_within_bounds() -> None:
    assert Horizon(10).refresh == 2.0  # Dynamo alone's own rhythm (every third of its TTL)
    assert Horizon(600).refresh == 60.0
    assert Horizon(86400).refresh == 60.0  # a file deleted from outside is back within a minute
    refreshes = [Horizon(s).refresh for s in (10, 20, 50, 100, 250, 600)]
    assert refreshes == sorted(refreshes)


@pytest.mark.parametrize("seconds", [0.0, 9.99, -1.0, float("nan")])
def test_a_horizon_shorter_than_the_stores_own_expiry_is_refused(seconds: float) -> None:
    with pytest.raises(ValueError, match="at least 10 s"):
        Horizon(seconds)


def test_published_and_touched_files_carry_the_lease_ahead_of_the_clock(tmp_path: Path) -> None:
    wall = [5_000.0]
    files = DirectoryFiles.open(tmp_path)
    try:
        files._wall = lambda: wall[0]
        files.lease = Horizon(600).lease
        files.publish(FILE, b"{}")
        path = tmp_path / "v1" / FILE[0] / FILE[1]
        assert os.stat(path).st_mtime == pytest.approx(5_000.0 + 650.0)
        wall[0] = 5_060.0
        assert files.touch(FILE)
        assert os.stat(path).st_mtime == pytest.approx(5_060.0 + 650.0)
        assert files.modified(FILE) == pytest.approx(5_710.0)
        # No temporary file is left behind by a publication.
        assert sorted(p.name for p in path.parent.iterdir()) == [FILE[1]]
    finally:
        files.release()


def test_without_a_lease_files_are_stamped_now_as_dynamo_stamps_its_own(tmp_path: Path) -> None:
    files = DirectoryFiles.open(tmp_path)
    try:
        files.publish(FILE, b"{}")
        stamp = os.stat(tmp_path / "v1" / FILE[0] / FILE[1]).st_mtime
        assert abs(stamp - time.time()) < 5
    finally:
        files.release()


def test_the_view_touches_its_files_once_per_refresh_not_every_two_seconds(
    tmp_path: Path,
) -> None:
    clock = [0.0]
    files = DirectoryFiles.open(tmp_path)
    try:
        horizon = Horizon(600)
        files.lease = horizon.lease
        view = AdmittedView(files, refresh_interval=horizon.refresh, clock=lambda: clock[0])
        view._written[FILE] = b"{}"
        files.publish(FILE, b"{}")
        touches = 0
        # Ten minutes of the writer's loop waking every second.
        for second in range(1, 601):
            clock[0] = float(second)
            touches += view.keep_alive()
        assert touches == 10  # once a minute: 300 at Dynamo's every two seconds
    finally:
        files.release()


@pytest.mark.parametrize("owned", [True, False], ids=["serve", "route extension"])
def test_both_ways_of_running_the_view_stamp_the_horizon_the_settings_name(
    tmp_path: Path, owned: bool
) -> None:
    from workerset_admission.settings import Settings
    from workerset_admission.wiring.compose import _view_hook

    settings = Settings(view_dir=tmp_path, view_horizon=120.0)
    # serve opens the directory itself; the route extension hands its locked one over.
    opened = None if owned else DirectoryFiles.open(tmp_path)
    hook = _view_hook(settings, opened)
    assert hook is not None
    try:
        assert hook.files.lease == Horizon(120.0).lease
        assert hook.view.refresh_interval == Horizon(120.0).refresh
    finally:
        hook.files.release()


def test_the_horizon_setting_is_bounded() -> None:
    from pydantic import ValidationError
    from workerset_admission.settings import Settings

    assert Settings().view_horizon == 600.0
    for wrong in (5.0, 8 * 86400.0):
        with pytest.raises(ValidationError, match="view_horizon"):
            Settings(view_horizon=wrong)
