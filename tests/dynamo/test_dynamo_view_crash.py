"""The view directory is crash consistent: killed at any system call, a restart is a fresh view.

A writer over a real temporary directory is stopped at its k-th system call that changes the
directory (:class:`Killing`, for every k over one or two passes), the directory is left exactly
as that instant left it, and a new writer opens it, adopts what it finds and syncs once, with the
same input or one changed while nobody wrote. Its directory must then equal, name for name and
byte for byte, what a fresh writer makes of the same input in an empty directory, beside the
files others put there (left alone). The same holds for a previous release's directory, whose
manifest may be whole, emptied, truncated or missing, and through random histories of passes,
kills and restarts (Hypothesis).
"""

from __future__ import annotations

import errno
import functools
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.viewworld import GROUP, mdc_file, table_of, worker_records
from workerset_admission.adapters.dynamo.view import (
    BUCKETS,
    MANIFEST_NAME,
    AdmittedView,
    DirectoryFiles,
    Horizon,
    RecordTable,
    Tenure,
    ViewHook,
)
from workerset_admission.adapters.dynamo.view_directory import FileOps, read_registry

LEASE = Horizon().lease
# A Dynamo 1.7 frontend's own records in its discovery store (the view directory), and a
# worker registering into the view by mistake: never the writer's to touch.
FOREIGN = {
    "mdc/pns%2Fbackend%2Fgenerate%2Fabc": b'{"type":"Model","foreign":true}',
    "instances/frontend%2Fhttp%2Fself%2F1": b'{"foreign":true}',
}


class Killed(BaseException):
    """The writer's process died here: nothing after this system call happens."""


class Killing(FileOps):
    """The directory's system calls, the ``at``-th of which (counting from 1) is never made."""

    def __init__(self, at: int | None = None) -> None:
        self.at = at
        self.calls = 0
        self.fds: set[int] = set()

    def _next(self) -> None:
        self.calls += 1
        if self.at is not None and self.calls >= self.at:
            raise Killed(self.calls)

    def open(self, *args: Any) -> int:  # type: ignore[override]
        self._next()
        fd = os.open(*args)
        self.fds.add(fd)
        return fd

    def write(self, fd: int, data: Any) -> int:  # type: ignore[override]
        self._next()
        return os.write(fd, data)

    def close(self, fd: int) -> None:  # type: ignore[override]
        self._next()
        self.fds.discard(fd)
        os.close(fd)

    def fsync(self, fd: int) -> None:  # type: ignore[override]
        self._next()
        os.fsync(fd)

    def utime(self, *args: Any) -> None:  # type: ignore[override]
        self._next()
        os.utime(*args)

    def replace(self, *args: Any) -> None:  # type: ignore[override]
        self._next()
        os.replace(*args)

    def unlink(self, *args: Any) -> None:  # type: ignore[override]
        self._next()
        os.unlink(*args)

    def bury(self) -> None:
        """What the kernel does for a dead process: its open files are closed."""
        for fd in self.fds:
            os.close(fd)
        self.fds.clear()


@dataclass(frozen=True)
class State:
    """What discovery holds: one cohort (its KV block size) and its admitted workers."""

    block: int
    ids: frozenset[int]

    def tenures(self) -> list[Tenure]:
        # A cohort of another configuration is another tenure (a succession).
        return [Tenure(GROUP, self.block, self.ids)] if self.ids else []

    def table(self) -> RecordTable:
        # Made once per state: a pass reads the table and forgets no record of a listing.
        return _table(self)


@functools.cache
def _table(state: State) -> RecordTable:
    return table_of(*(worker_records(i, state.block) for i in sorted(state.ids)))


FLEET_A = State(16, frozenset({0xA1, 0xA2}))
FLEET_A_CHANGED = State(16, frozenset({0xA2, 0xA3}))
FLEET_B = State(32, frozenset({0xB1, 0xB2}))
# Real directories, on a memory file system where there is one: the kill tests open and sync
# thousands of them, and this machine's disk makes each file creation cost a millisecond.
_FAST_DIR = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


@pytest.fixture
def folder() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(dir=_FAST_DIR) as made:
        yield Path(made)


def listing(root: Path) -> dict[str, bytes]:
    """Every record file of the view (names starting with a dot are not records), its bytes."""
    out = {}
    for bucket in BUCKETS:
        folder = root / "v1" / bucket
        for name in os.listdir(folder) if folder.exists() else ():
            if not name.startswith("."):
                out[f"{bucket}/{name}"] = (folder / name).read_bytes()
    return out


def add_foreign(root: Path) -> None:
    for name, value in FOREIGN.items():
        path = root / "v1" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(value)


Fresh = Callable[[State], dict[str, bytes]]


@pytest.fixture
def fresh_view() -> Iterator[Fresh]:
    """What a fresh writer makes of a state in an empty directory (made once per state)."""
    made: dict[State, dict[str, bytes]] = {}
    with tempfile.TemporaryDirectory(dir=_FAST_DIR) as folder:

        def fresh(state: State) -> dict[str, bytes]:
            if state not in made:
                root = Path(folder) / f"fresh-{len(made)}"
                root.mkdir()
                run_writer(root, [state])
                made[state] = listing(root)
            return made[state]

        yield fresh


def run_writer(root: Path, states: list[State], ops: FileOps | None = None) -> None:
    """One writer's life: open, adopt what it finds (as ``ViewHook`` does), one pass per state."""
    files = DirectoryFiles.open(root, ops=ops)
    try:
        hook = ViewHook(files, owns_files=False)
        for state in states:
            hook.view.sync(state.tenures(), state.table())
    finally:
        files.release()


def restart_and_check(root: Path, state: State, fresh: dict[str, bytes]) -> None:
    """A new writer over what was left: its first sync must give what a fresh one gives."""
    run_writer(root, [state])
    assert listing(root) == {**fresh, **FOREIGN}
    # It accounts for exactly its own files: the registry names them and nothing else.
    assert {f"{b}/{n}" for b, n in read_registry(root)} == set(fresh)
    assert not list(root.rglob(".tmp_*"))


def count_calls(states: list[State]) -> int:
    with tempfile.TemporaryDirectory(dir=_FAST_DIR) as folder:
        root = Path(folder)
        add_foreign(root)
        counting = Killing()
        run_writer(root, states, counting)
        return counting.calls


@pytest.mark.parametrize(
    ("before", "killed_in", "after"),
    [
        pytest.param([], [FLEET_A], FLEET_A, id="first-pass-same-input"),
        pytest.param([], [FLEET_A], FLEET_B, id="first-pass-cohort-replaced-while-down"),
        pytest.param([FLEET_A], [FLEET_B], FLEET_B, id="succession-pass"),
        pytest.param([FLEET_A], [FLEET_A_CHANGED], FLEET_B, id="member-pass-then-replaced"),
        pytest.param([FLEET_B], [FLEET_A, FLEET_B], FLEET_A_CHANGED, id="two-passes"),
    ],
)
def test_a_writer_killed_at_every_system_call_leaves_what_a_restart_makes_fresh(
    folder: Path,
    fresh_view: Fresh,
    before: list[State],
    killed_in: list[State],
    after: State,
) -> None:
    total = count_calls(before + killed_in)
    assert total > 30  # the passes make real system calls, each a point to die at
    for at in range(1, total + 2):
        root = folder / f"kill-{at}"
        root.mkdir()
        add_foreign(root)
        if before:
            run_writer(root, before)
        killing = Killing(at)
        try:
            run_writer(root, killed_in, killing)
        except Killed:
            pass
        finally:
            killing.bury()
        restart_and_check(root, after, fresh_view(after))


def write_previous_release(root: Path, folder: Path, manifest: str) -> None:
    """The files of FLEET_A as the previous release wrote them: leased, with its manifest."""
    written = folder / f"{root.name}-old"
    written.mkdir()
    files = DirectoryFiles.open(written)
    files.lease = LEASE
    AdmittedView(files).sync(FLEET_A.tenures(), FLEET_A.table())
    files.release()
    for name, value in listing(written).items():
        path = root / "v1" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(value)
        ahead = time.time() + LEASE
        os.utime(path, (ahead, ahead))
    text = json.dumps(sorted(listing(written))) + "\n"
    body = {
        "whole": text,
        "emptied": "",
        "truncated": text[: len(text) // 2],
        "garbage": "\x00" * 40,
    }.get(manifest)
    if body is not None:
        (root / MANIFEST_NAME).write_text(body)


@pytest.mark.parametrize("manifest", ["whole", "emptied", "truncated", "missing", "garbage"])
def test_a_previous_releases_directory_is_adopted_whatever_its_manifest_says(
    tmp_path: Path, fresh_view: Fresh, manifest: str
) -> None:
    """A directory the previous release wrote (a manifest, no registry) is migrated at open.

    The manifest a crash left may be whole, empty, cut anywhere or gone; the files that
    release's writer stamped with its lease are its own whatever the manifest says.
    """
    root = tmp_path / "view"
    root.mkdir()
    add_foreign(root)
    write_previous_release(root, tmp_path, manifest)
    restart_and_check(root, FLEET_B, fresh_view(FLEET_B))
    assert not (root / MANIFEST_NAME).exists()


@pytest.mark.parametrize("manifest", ["whole", "missing"])
def test_a_migration_killed_at_every_system_call_is_done_again_by_the_next_writer(
    folder: Path, fresh_view: Fresh, manifest: str
) -> None:
    template = folder / "template"
    template.mkdir()
    add_foreign(template)
    write_previous_release(template, folder, manifest)
    counting = Killing()
    first = folder / "counted"
    shutil.copytree(template, first)
    run_writer(first, [FLEET_A_CHANGED], counting)
    for at in range(1, counting.calls + 2):
        root = folder / f"kill-{at}"
        shutil.copytree(template, root)  # mtimes kept: the files are still leased
        killing = Killing(at)
        try:
            run_writer(root, [FLEET_A_CHANGED], killing)
        except Killed:
            pass
        finally:
            killing.bury()
        restart_and_check(root, FLEET_B, fresh_view(FLEET_B))


def test_a_stray_manifest_beside_the_registry_changes_nothing_it_names_wrongly(
    tmp_path: Path, fresh_view: Fresh
) -> None:
    """A manifest found beside a registry (a downgrade and back) adds its names; none is lost."""
    add_foreign(tmp_path)
    run_writer(tmp_path, [FLEET_A])
    (tmp_path / MANIFEST_NAME).write_text('["mdc/pns%2Fbackend%2Fgenerate%2Fabc"')
    restart_and_check(tmp_path, FLEET_A, fresh_view(FLEET_A))


def test_files_others_stamped_now_are_never_claimed_at_migration(tmp_path: Path) -> None:
    add_foreign(tmp_path)
    (tmp_path / MANIFEST_NAME).write_text("")
    run_writer(tmp_path, [FLEET_A])
    assert {f"{b}/{n}" for b, n in read_registry(tmp_path)}.isdisjoint(FOREIGN)
    run_writer(tmp_path, [State(16, frozenset())])
    assert listing(tmp_path) == FOREIGN


STATES = st.builds(
    State,
    st.sampled_from([16, 32]),
    st.frozensets(st.sampled_from([0xA1, 0xA2, 0xA3, 0xA4]), max_size=3),
)
STEP = st.tuples(STATES, st.one_of(st.none(), st.integers(min_value=1, max_value=90)))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=st.lists(STEP, min_size=1, max_size=6), last=STATES)
def test_any_history_of_passes_kills_and_restarts_ends_as_a_fresh_start(
    history: list[tuple[State, int | None]], last: State
) -> None:
    """Passes over random states, some killed at a random system call, each followed by a
    restart; whatever happened, the next writer's first sync is a fresh writer's view."""
    with tempfile.TemporaryDirectory(dir=_FAST_DIR) as folder:
        root, fresh_root = Path(folder) / "view", Path(folder) / "fresh"
        root.mkdir()
        fresh_root.mkdir()
        add_foreign(root)
        for state, kill_at in history:
            killing = Killing(kill_at)
            try:
                run_writer(root, [state], killing)
            except Killed:
                pass
            finally:
                killing.bury()
        run_writer(fresh_root, [last])
        restart_and_check(root, last, listing(fresh_root))


def test_the_registry_is_made_durable_once_per_folder_per_pass_not_per_file(tmp_path: Path) -> None:
    counting = Killing()
    files = DirectoryFiles.open(tmp_path, ops=counting)
    view = AdmittedView(files)
    big = State(16, frozenset(range(0x100, 0x100 + 40)))
    syncs = []
    original = counting.fsync

    def fsync(fd: int) -> None:
        syncs.append(fd)
        original(fd)

    counting.fsync = fsync  # type: ignore[method-assign]
    view.sync(big.tenures(), big.table())
    assert len(view) == 200
    assert len(syncs) == len(BUCKETS)  # one per registry folder, for 200 new files
    syncs.clear()
    # Keeping the view alive and rewriting registered names cost no sync.
    view.keep_alive(force=True)
    while view.refreshing:
        view.keep_alive()
    view.sync([Tenure(GROUP, 17, big.ids)], big.table())
    assert syncs == []
    files.release()
    assert mdc_file(0x100) in read_registry(tmp_path)


def test_a_view_file_is_registered_before_it_appears_and_unregistered_after_it_goes(
    tmp_path: Path,
) -> None:
    seen: list[tuple[str, bool]] = []
    registry = tmp_path / ".workerset-admission.d" / "mdc"
    card = mdc_file(0xA1)

    class Watching(FileOps):
        def replace(self, src: Any, dst: Any) -> None:  # type: ignore[override]
            if str(dst).endswith(f"/v1/mdc/{card[1]}"):
                seen.append(("appears", (registry / card[1]).exists()))
            os.replace(src, dst)

        def unlink(self, path: Any) -> None:  # type: ignore[override]
            if str(path).endswith(f"/v1/mdc/{card[1]}"):
                seen.append(("goes", (registry / card[1]).exists()))
            os.unlink(path)

    files = DirectoryFiles.open(tmp_path, ops=Watching())
    view = AdmittedView(files)
    view.sync(FLEET_A.tenures(), FLEET_A.table())
    view.sync([], FLEET_A.table())
    files.release()
    assert seen == [("appears", True), ("goes", True)]
    assert not (registry / card[1]).exists()


def test_a_file_system_without_hard_links_registers_by_empty_entries(
    tmp_path: Path, fresh_view: Fresh
) -> None:
    class NoLinks(FileOps):
        def link(self, *args: Any) -> None:  # type: ignore[override]
            raise OSError(errno.EPERM, "Operation not permitted")

    add_foreign(tmp_path)
    run_writer(tmp_path, [FLEET_A], NoLinks())
    entries = tmp_path / ".workerset-admission.d" / "mdc"
    assert {p.stat().st_size for p in entries.iterdir()} == {0}
    restart_and_check(tmp_path, FLEET_B, fresh_view(FLEET_B))


def test_a_removed_registry_folder_is_made_again(tmp_path: Path) -> None:
    files = DirectoryFiles.open(tmp_path)
    view = AdmittedView(files)
    shutil.rmtree(tmp_path / ".workerset-admission.d" / "mdc")
    view.sync(FLEET_A.tenures(), FLEET_A.table())
    files.release()
    assert {f"{b}/{n}" for b, n in read_registry(tmp_path)} == set(listing(tmp_path))
