"""The admitted view's directory: Dynamo's file naming, one owning writer's lock, its manifest."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

from workerset_admission.adapters.dynamo.filestore import DEFAULT_FILE_TTL
from workerset_admission.errors import ViewDirectoryError, ViewDirectoryUnavailable
from workerset_admission.identity import store_file_name

__all__ = [
    "BUCKETS",
    "LOCK_NAME",
    "MANIFEST_NAME",
    "DirectoryFiles",
    "Horizon",
    "ViewFile",
    "ViewFiles",
    "check_frontend_store",
    "file_name_for",
    "read_manifest",
]

# Publication order inside one pass: the model card last, so the frontend finds the instance
# and event records already there when the card makes it build the model; removal is reversed.
BUCKETS: tuple[str, ...] = ("event_sources", "event_channels", "instances", "mdc")
LOCK_NAME = ".workerset-admission.lock"
MANIFEST_NAME = ".workerset-admission.files"
# The file store ignores names starting with ``.tmp_``; ours carry a mark so a restart can
# tell its own leftovers from a worker's.
_TEMP_PREFIX = ".tmp_wsa-"
_log = logging.getLogger("workerset_admission.adapters.dynamo.view")

ViewFile = tuple[str, str]
"""A file of the view: (bucket, file name)."""


def file_name_for(path: str) -> str:
    """Dynamo's file name for a discovery path: every byte outside ``[A-Za-z0-9]`` as ``%XX``."""
    return store_file_name(path)


@dataclass(frozen=True, slots=True)
class Horizon:
    """How long a frontend keeps the view after its writer's last touch: the view fails static.

    Each touch puts a file's mtime ``lease`` seconds ahead of the clock, and the store's sweep
    deletes it ``DEFAULT_FILE_TTL`` after that mtime; touching every ``refresh`` seconds keeps
    at least ``seconds`` ahead at any moment. So a writer that dies or stalls leaves a view that
    lasts at least ``seconds`` and at most ``seconds + refresh``, and at rest each file is
    touched once per ``refresh``: a quarter of the time beyond the store's own TTL, between 2 s
    (the horizon of Dynamo alone: 10 s) and 60 s (a file deleted from outside comes back within
    that).
    """

    seconds: float = 600.0

    def __post_init__(self) -> None:
        if not self.seconds >= DEFAULT_FILE_TTL:
            raise ValueError(f"a view horizon is at least {DEFAULT_FILE_TTL:g} s")

    @property
    def refresh(self) -> float:
        return min(60.0, max(2.0, (self.seconds - DEFAULT_FILE_TTL) / 4))

    @property
    def lease(self) -> float:
        return self.seconds - DEFAULT_FILE_TTL + self.refresh


class ViewFiles(Protocol):
    """The view directory as the writer needs it (real files, or a test's fake)."""

    def publish(self, file: ViewFile, value: bytes) -> None:
        """Replace the file's content atomically."""
        ...

    def touch(self, file: ViewFile) -> bool:
        """Refresh the file's mtime; ``False`` when it is gone."""
        ...

    def remove(self, file: ViewFile) -> None:
        """Delete the file (a missing file is fine)."""
        ...

    def identity(self, file: ViewFile) -> tuple[int, int] | None:
        """Return the file's size and inode (``None``: it is gone)."""
        ...

    def save_manifest(self, files: Iterable[ViewFile]) -> None:
        """Write the whole list of the files this writer holds."""
        ...

    def note_manifest(self, added: Iterable[ViewFile], removed: Iterable[ViewFile]) -> None:
        """Record files written and removed since the list was last saved or noted."""
        ...

    def load_manifest(self) -> list[ViewFile]: ...


def check_frontend_store(view_dir: Path, environ: Mapping[str, str] | None = None) -> None:
    """Refuse a view directory that is not the frontend's own file store (``DYN_FILE_KV``)."""
    from workerset_admission.adapters.dynamo.filestore import default_store_root

    env = os.environ if environ is None else environ
    store = default_store_root(env)
    if os.path.realpath(view_dir) != os.path.realpath(store):
        where = f"DYN_FILE_KV={store}" if env.get("DYN_FILE_KV") else f"its default {store}"
        raise ViewDirectoryError(
            f"view directory {view_dir} is not this frontend's file store ({where}): the "
            "frontend would never read the admitted view; set both to the same directory"
        )


def read_manifest(root: Path) -> list[ViewFile]:
    """Return the files a writer's manifest (its saved list and journal) says it holds."""
    try:
        text = (root / MANIFEST_NAME).read_text(encoding="utf-8")
    except OSError:
        return []
    first, _, journal = text.partition("\n")
    try:
        listed = json.loads(first) if first else []
    except ValueError:
        listed = []
    held: dict[str, None] = dict.fromkeys(
        str(item) for item in (listed if isinstance(listed, list) else [])
    )
    for line in journal.splitlines():
        if line[:1] == "+":
            held[line[1:]] = None
        elif line[:1] == "-":
            held.pop(line[1:], None)
    out: list[ViewFile] = []
    for item in held:
        bucket, _, name = item.partition("/")
        # Only names this writer could have made: a bucket of the view, a plain file name.
        if bucket in BUCKETS and name and "/" not in name and not name.startswith("."):
            out.append((bucket, name))
    return out


# A file system that is read-only or full may not stay so (a remount, space freed): a writer
# that meets one at start fails in a way its supervisor restarts, unlike a directory it may not
# write at all, which needs an operator.
_PASSING_ERRNOS = frozenset({errno.EROFS, errno.ENOSPC, errno.EDQUOT})


def _not_writable(root: Path, exc: OSError) -> ViewDirectoryError:
    reason = f"view directory {root} is not writable ({exc.strerror or exc})"
    if exc.errno in _PASSING_ERRNOS:
        return ViewDirectoryUnavailable(reason)
    return ViewDirectoryError(reason)


class DirectoryFiles:
    """:class:`ViewFiles` over a real directory, owned through a lock file.

    ``open`` refuses a directory that is missing, not writable, or locked by another live
    writer (the lock is an ``flock`` the kernel releases when the holder dies).

    Every file written or touched gets an mtime ``lease`` seconds ahead of the wall clock: the
    file store's sweep keeps it until then plus its TTL (``DEFAULT_FILE_TTL``, 10 s), so the
    frontend keeps the view for that long after this writer's last touch, whether the writer
    is alive or not (fail static). A lease of 0 is the store's own rule: gone 10 s after the
    last touch.
    """

    def __init__(self, root: Path, lock: IO[str], *, wall: Callable[[], float] = time.time) -> None:
        self.root = root
        self.lease = 0.0
        self._wall = wall
        self._lock: IO[str] | None = lock
        self._token = secrets.token_hex(4)
        self._serial = 0
        self._v1 = f"{root}/v1/"
        # The manifest's saved length and the journal lines noted after it.
        self._held = 0
        self._noted = 0
        self._saved = False

    @classmethod
    def open(cls, root: Path | str) -> DirectoryFiles:
        root = Path(root)
        if not root.is_dir():
            reason = "does not exist" if not root.exists() else "is not a directory"
            raise ViewDirectoryError(f"view directory {root} {reason}")
        lock_path = root / LOCK_NAME
        try:
            lock = lock_path.open("a+", encoding="utf-8")
        except OSError as exc:
            raise _not_writable(root, exc) from None
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            lock.seek(0)
            holder = lock.read().strip() or "unknown"
            lock.close()
            if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise ViewDirectoryError(
                    f"view directory {root} is owned by another live writer ({holder})"
                ) from None
            raise ViewDirectoryError(f"view directory {root}: cannot lock ({exc})") from None
        files = cls(root, lock)
        try:
            lock.seek(0)
            lock.truncate()
            lock.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
            lock.flush()
            for bucket in BUCKETS:
                (root / "v1" / bucket).mkdir(parents=True, exist_ok=True)
                # Prove the bucket takes a publication, the way every later one is made.
                probe = (bucket, f"{_TEMP_PREFIX}probe")
                os.unlink(files._write_temp(probe, b""))
        except OSError as exc:
            files.release()
            raise _not_writable(root, exc) from None
        files._remove_own_temp_files()
        return files

    def release(self) -> None:
        """Give the directory up (the lock file stays; only the lock goes)."""
        lock, self._lock = self._lock, None
        if lock is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
            lock.close()

    def _path(self, file: ViewFile) -> str:
        return f"{self._v1}{file[0]}/{file[1]}"

    def _write_temp(self, file: ViewFile, value: bytes) -> str:
        self._serial += 1
        temp = f"{self._v1}{file[0]}/{_TEMP_PREFIX}{self._token}-{self._serial}"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            left = memoryview(value)
            while left:  # a short write (a disk filling up) writes the rest, or raises
                left = left[os.write(fd, left) :]
        finally:
            os.close(fd)
        return temp

    def _stamp(self) -> tuple[float, float] | None:
        """Return the (atime, mtime) a write or touch sets: the lease ahead, or now (``None``)."""
        if self.lease <= 0:
            return None
        until = self._wall() + self.lease
        return (until, until)

    def publish(self, file: ViewFile, value: bytes) -> None:
        try:
            temp = self._write_temp(file, value)
        except FileNotFoundError:
            # Someone removed the bucket's folder: make it again, once, and say so.
            (self.root / "v1" / file[0]).mkdir(parents=True, exist_ok=True)
            _log.warning("admitted view: made %s again: it was gone", self.root / "v1" / file[0])
            temp = self._write_temp(file, value)
        try:
            # The lease goes on before the rename, so the file never shows without it.
            stamp = self._stamp()
            if stamp is not None:
                os.utime(temp, stamp)
            os.replace(temp, self._path(file))
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise

    def touch(self, file: ViewFile) -> bool:
        try:
            os.utime(self._path(file), self._stamp())
        except FileNotFoundError:
            return False
        return True

    def remove(self, file: ViewFile) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path(file))

    def identity(self, file: ViewFile) -> tuple[int, int] | None:
        try:
            stat = os.stat(self._path(file))
        except FileNotFoundError:
            return None
        return stat.st_size, stat.st_ino

    def modified(self, file: ViewFile) -> float | None:
        """When the file was last written or touched (wall clock), or ``None`` when it is gone."""
        try:
            return os.stat(self._path(file)).st_mtime
        except OSError:
            return None

    def save_manifest(self, files: Iterable[ViewFile]) -> None:
        listed = sorted(f"{bucket}/{name}" for bucket, name in files)
        temp = self.root / f"{MANIFEST_NAME}.tmp"
        temp.write_text(json.dumps(listed) + "\n", encoding="utf-8")
        os.replace(temp, self.root / MANIFEST_NAME)
        self._held = len(listed)
        self._noted = 0
        self._saved = True

    def note_manifest(self, added: Iterable[ViewFile], removed: Iterable[ViewFile]) -> None:
        """Append the change to the manifest, a journal: cost follows the change, not the view.

        The manifest is the saved list (its first line) and one ``+file`` or ``-file`` line per
        change after it. Once the journal outgrows the list it is written whole again, so its
        length stays within a small multiple of the view's and reading it stays cheap.
        """
        lines = [f"+{bucket}/{name}\n" for bucket, name in added]
        lines += [f"-{bucket}/{name}\n" for bucket, name in removed]
        if not self._saved or self._noted + len(lines) > 2 * self._held + 1024:
            # This writer's first word, or a journal grown long: the whole list, anew.
            gone = set(removed)
            held = [f for f in dict.fromkeys([*self.load_manifest(), *added]) if f not in gone]
            self.save_manifest(held)
            return
        with open(self.root / MANIFEST_NAME, "a", encoding="utf-8") as journal:
            journal.writelines(lines)
        self._noted += len(lines)
        self._held += sum(1 for line in lines if line[0] == "+")

    def load_manifest(self) -> list[ViewFile]:
        return read_manifest(self.root)

    def foreign_files(self, known: Iterable[ViewFile]) -> list[ViewFile]:
        """Record files in the view that this writer does not own (reported, never touched)."""
        mine = set(known)
        found: list[ViewFile] = []
        for bucket in BUCKETS:
            with contextlib.suppress(OSError):
                names = [entry.name for entry in os.scandir(self.root / "v1" / bucket)]
                found.extend(
                    (bucket, name)
                    for name in names
                    if not name.startswith(".") and (bucket, name) not in mine
                )
        return found

    def _remove_own_temp_files(self) -> None:
        for bucket in BUCKETS:
            with contextlib.suppress(OSError):
                for entry in os.scandir(self.root / "v1" / bucket):
                    if entry.name.startswith(_TEMP_PREFIX):
                        with contextlib.suppress(OSError):
                            os.unlink(entry.path)
