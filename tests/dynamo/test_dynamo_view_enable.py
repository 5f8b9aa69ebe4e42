"""Turning the admitted view on: the sidecar flag, the route extension, and bad directories."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from workerset_admission.adapters.dynamo.view import DirectoryFiles
from workerset_admission.errors import ViewDirectoryError
from workerset_admission.frontend import routes


def _serve(view_dir: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WORKERSET_ADMISSION_")}
    env["WORKERSET_ADMISSION_SERVE_FILE"] = str(tmp_path / "serve.json")
    return subprocess.run(
        [sys.executable, "-m", "workerset_admission.cli", "serve", "--view-dir", str(view_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


def test_serve_refuses_a_missing_view_directory_in_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-view"
    done = _serve(missing, tmp_path)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        f"workerset-admission serve: view directory {missing} does not exist"
    ]


def test_serve_refuses_a_view_directory_another_writer_owns_and_deletes_nothing(
    tmp_path: Path,
) -> None:
    view = tmp_path / "view"
    (view / "v1" / "mdc").mkdir(parents=True)
    record = view / "v1" / "mdc" / "ns%2Fbackend%2Fgenerate%2F1"
    record.write_bytes(b"{}")
    owner = DirectoryFiles.open(view)
    try:
        done = _serve(view, tmp_path)
    finally:
        owner.release()
    assert done.returncode != 0
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(
        f"workerset-admission serve: view directory {view} is owned by another live writer (pid "
    )
    assert record.read_bytes() == b"{}"


def test_serve_refuses_an_unwritable_view_directory(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        # Root writes through permission bits; sysfs refuses new files even to root.
        target = Path("/sys/kernel")
    else:
        target = tmp_path / "read-only"
        target.mkdir()
        target.chmod(0o555)
    before = sorted(os.listdir(target))
    done = _serve(target, tmp_path)
    assert done.returncode != 0
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"workerset-admission serve: view directory {target} is not writable")
    assert sorted(os.listdir(target)) == before


@pytest.fixture
def no_shared_view() -> Iterator[None]:
    yield
    routes._release_view()


def test_the_extension_refuses_a_view_that_is_not_the_frontends_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_shared_view: None
) -> None:
    monkeypatch.setenv("WORKERSET_ADMISSION_VIEW_DIR", str(tmp_path / "view"))
    monkeypatch.setenv("DYN_FILE_KV", str(tmp_path / "workers"))
    with pytest.raises(ViewDirectoryError, match=r"not this frontend's file store \(DYN_FILE_KV="):
        routes.open_extension_view()
    # The provider Dynamo calls says it in one line and exits, without a traceback.
    with pytest.raises(SystemExit) as stopped:
        routes.frontend_routes()
    (line,) = str(stopped.value.code).splitlines()
    assert line.startswith("workerset-admission refuses to start: view directory ")


def test_the_extension_locks_its_view_once_for_the_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_shared_view: None
) -> None:
    monkeypatch.setenv("WORKERSET_ADMISSION_VIEW_DIR", str(tmp_path))
    monkeypatch.setenv("DYN_FILE_KV", str(tmp_path))
    first = routes.open_extension_view()
    assert first is not None
    assert routes.open_extension_view() is first
    with pytest.raises(ViewDirectoryError, match="owned by another live writer"):
        DirectoryFiles.open(tmp_path)


def test_the_extension_writes_no_view_unless_asked(
    monkeypatch: pytest.MonkeyPatch, no_shared_view: None
) -> None:
    monkeypatch.delenv("WORKERSET_ADMISSION_VIEW_DIR", raising=False)
    assert routes.open_extension_view() is None
