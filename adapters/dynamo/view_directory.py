"""The admitted view's directory: Dynamo's file naming, one owning writer's lock, its registry.

Theory of operation
-------------------

Crash consistency. Whatever instant the writer dies at (SIGKILL, an OOM kill, a host that
loses power), the next writer must be able to tell every record file of the view it or a
predecessor wrote from the files others put there (a worker registering into the view by
mistake, a Dynamo 1.7 frontend's own records in its discovery store), because it must remove
the first kind and never touch the second. So a file names its writer before it appears: the
view root holds a registry, ``.workerset-admission.d/<bucket>/<name>``, one entry per record
file the writer may have in ``v1/<bucket>/<name>``. The invariant is one inclusion:

    every record file of ours in a bucket has its entry in the registry.

It is kept by the order of operations alone, as a write-ahead log keeps a database's. A file
is published by writing a ``.tmp_wsa-`` file beside it (the file store ignores ``.tmp_``
names), stamping its lease, hard-linking it into the registry if its name has no entry yet,
making the registry folder durable (``fsync``), and only then renaming the temp file into
place; a file is removed by unlinking it from its bucket, then its entry. A death between any
two of these steps leaves at worst an entry whose file is missing or an older version (the
next writer owns the name and settles it at its first sync: rewritten if its plan holds it,
removed if not) or a temp file (removed at open, by its mark). An entry is a directory entry,
not file content, so there is nothing to be found empty or half written; a host crash leaves
the operations' effects up to some point, and the ``fsync`` before the first rename of a new
name puts its entry before that point whenever the file is there. The Dynamo file store reads
only ``v1/<bucket>/`` (as ``filestore.py`` does), so the registry, the lock and the clock
probe beside ``v1`` are never records to it.

A pass stages its files together (:meth:`DirectoryFiles.stage`): every temp file written and
linked, then one ``fsync`` per registry folder, then the renames in publication order. A first
pass over a large fleet so costs four ``fsync`` calls, not one per file; a hard link is a
directory entry, not a new file, so it costs next to nothing (a file's creation costs a
millisecond on a busy disk, a link some microseconds); a pass that only rewrites or removes
names the registry has costs no sync. Keeping the view alive costs what it did: a touch per
file per refresh.

A registry is read once, when a writer opens the directory. A directory a previous release
wrote has no registry but a manifest (``.workerset-admission.files``, a list and a journal);
it is migrated then: every file the manifest names, and every record file stamped further
ahead than the file store's own TTL (no Dynamo writer stamps a file in the future: only a
writer with a lease does, and that is this plugin, the directory's only writer by its lock),
is linked into the registry, made durable, and only then is the manifest removed. So a
manifest truncated or emptied by a crash of the old release still loses nothing stamped with a
lease. (A file system without hard links gets an empty file as the entry: the same order,
one file creation more per new name.)

The lease's clock. The frontend's file store expires a file ``DEFAULT_FILE_TTL`` after its
mtime, on the frontend's clock; a stamp is the writer's clock plus the lease. A writer whose
wall clock runs ahead (a host a day fast, a clock stepped back by NTP after stamping) would
make the view outlive it by as much, so the stamp is bounded on clocks the writer cannot set:
the file system's own (a probe file at the view root, ``.workerset-admission.clock``, touched
with "now" and read back: the kernel, or a network file system's server, stamps it) and, where
the writer is given one (``server_now``: ``serve`` and the route extension take it from the
peers' bucket read at every start and resync), the NATS server's. The stamp's base is the
earliest of the writer's wall clock and those, except that the server's clock lowers it by at
most half the lease (a server whose clock lags shortens the horizon, never so far that a file
expires between two touches); the probe is read again once every ``_PROBE_EVERY``
seconds and extrapolated on the monotonic clock meanwhile, so at rest it costs one touch and
one stat per interval. A file found stamped more than ``lease + _AHEAD_MARGIN`` beyond that
now (left by a writer whose clock ran ahead) is stamped again to ``lease`` beyond it
(:meth:`DirectoryFiles.restamp_ahead`), once, when a writer adopts the directory.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import secrets
import shutil
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
    "CLOCK_PROBE_NAME",
    "LOCK_NAME",
    "MANIFEST_NAME",
    "REGISTRY_NAME",
    "DirectoryFiles",
    "FileOps",
    "Horizon",
    "ViewFile",
    "ViewFiles",
    "check_frontend_store",
    "file_name_for",
    "read_manifest",
    "read_registry",
]

# Publication order inside one pass: the model card last, so the frontend finds the instance
# and event records already there when the card makes it build the model; removal is reversed.
BUCKETS: tuple[str, ...] = ("event_sources", "event_channels", "instances", "mdc")
LOCK_NAME = ".workerset-admission.lock"
# The registry of the files this writer (or a predecessor) may hold: one entry per file.
REGISTRY_NAME = ".workerset-admission.d"
# What a previous release kept instead: a list and a journal; migrated at open, then removed.
MANIFEST_NAME = ".workerset-admission.files"
# Touched with "now" and read back: the file system's clock, which bounds the lease's stamp.
CLOCK_PROBE_NAME = ".workerset-admission.clock"
# The file store ignores names starting with ``.tmp_``; ours carry a mark so a restart can
# tell its own leftovers from a worker's.
_TEMP_PREFIX = ".tmp_wsa-"
# How often the file system's clock is read again (monotonic seconds).
_PROBE_EVERY = 10.0
# A file stamped further than the lease and this beyond now was stamped by a clock that ran
# ahead: stamped again when a writer adopts the directory.
_AHEAD_MARGIN = 30.0
# A record file stamped further ahead than this was stamped by a lease (a previous release's
# writer whose manifest was lost): Dynamo's own writers stamp now.
_LEASED_AHEAD = DEFAULT_FILE_TTL + 5.0
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

    def stage(self, files: Iterable[tuple[ViewFile, bytes]]) -> None:
        """Prepare a pass's publications together: written aside and registered, durably.

        Nothing of them shows yet; :meth:`publish` then makes each appear. Best effort: a file
        that cannot be staged is written (or refused) by its own :meth:`publish`.
        """
        ...

    def registered(self) -> list[ViewFile]:
        """Return every file this writer (or a predecessor) may hold in the view."""
        ...

    def publish(self, file: ViewFile, value: bytes) -> None:
        """Replace the file's content atomically, registered before it appears."""
        ...

    def touch(self, file: ViewFile) -> bool:
        """Refresh the file's mtime; ``False`` when it is gone."""
        ...

    def remove(self, file: ViewFile) -> None:
        """Delete the file, then its registration (a missing file is fine)."""
        ...

    def identity(self, file: ViewFile) -> tuple[int, int] | None:
        """Return the file's size and inode (``None``: it is gone)."""
        ...


class FileOps:
    """The system calls by which the writer changes the directory, in one place.

    A test hands :meth:`DirectoryFiles.open` a subclass that stops the writer at any of them.
    """

    open = staticmethod(os.open)
    write = staticmethod(os.write)
    close = staticmethod(os.close)
    fsync = staticmethod(os.fsync)
    link = staticmethod(os.link)
    utime = staticmethod(os.utime)
    replace = staticmethod(os.replace)
    unlink = staticmethod(os.unlink)


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
    """Return the files a previous release's manifest (its list and journal) says it held."""
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


def read_registry(root: Path) -> list[ViewFile]:
    """Return the files the registry of the view at ``root`` names, in publication order."""
    out: list[ViewFile] = []
    for bucket in BUCKETS:
        with contextlib.suppress(OSError):
            out.extend(
                (bucket, entry.name)
                for entry in sorted(os.scandir(root / REGISTRY_NAME / bucket), key=_name)
                if not entry.name.startswith(".")
            )
    return out


def _name(entry: os.DirEntry[str]) -> str:
    return entry.name


# A file system that is read-only or full may not stay so (a remount, space freed): a writer
# that meets one at start fails in a way its supervisor restarts, unlike a directory it may not
# write at all, which needs an operator.
_PASSING_ERRNOS = frozenset({errno.EROFS, errno.ENOSPC, errno.EDQUOT})
# What a file system without hard links answers a link with.
_NO_HARD_LINKS = frozenset(
    {errno.EPERM, errno.EXDEV, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK}
)


def _not_writable(root: Path, exc: OSError) -> ViewDirectoryError:
    reason = f"view directory {root} is not writable ({exc.strerror or exc})"
    if exc.errno in _PASSING_ERRNOS:
        return ViewDirectoryUnavailable(reason)
    return ViewDirectoryError(reason)


class DirectoryFiles:
    """:class:`ViewFiles` over a real directory, owned through a lock file.

    ``open`` refuses a directory that is missing, not writable, or locked by another live
    writer (the lock is an ``flock`` the kernel releases when the holder dies). It reads the
    registry (migrating a previous release's manifest into it) and removes this writer's
    leftover temp files; the module's theory of operation says why a file is registered before
    it appears and unregistered after it goes.

    Every file written or touched gets an mtime ``lease`` seconds ahead of now: the file
    store's sweep keeps it until then plus its TTL (``DEFAULT_FILE_TTL``, 10 s), so the
    frontend keeps the view for that long after this writer's last touch, whether the writer
    is alive or not (fail static). "Now" is the earliest of the wall clock, the file system's
    and ``server_now`` (the NATS server's, when set). A lease of 0 is the store's own rule:
    gone 10 s after the last touch.
    """

    def __init__(
        self,
        root: Path,
        lock: IO[str],
        *,
        wall: Callable[[], float] = time.time,
        ops: FileOps | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.root = root
        self.lease = 0.0
        # The NATS server's clock, where the writer has it (``None``: not known).
        self.server_now: Callable[[], float | None] | None = None
        # How far the writer's lease on the view in the admission bucket is overdue (seconds;
        # ``None``: no such lease): the stamp is lowered by as much (see ``_stamp``).
        self.lease_overdue: Callable[[], float | None] | None = None
        self._wall = wall
        self._clock = clock
        self._ops = ops or FileOps()
        self._lock: IO[str] | None = lock
        self._token = secrets.token_hex(4)
        self._serial = 0
        self._v1 = f"{root}/v1/"
        self._registry = f"{root}/{REGISTRY_NAME}/"
        self._registered: set[ViewFile] = set()
        # Registry folders with entries not yet made durable.
        self._unsynced: set[str] = set()
        # Files a pass staged: their temp file (stamped, registered) and its value.
        self._staged: dict[ViewFile, tuple[str, bytes]] = {}
        # The file system's clock as last read: (its time, the monotonic time it was read).
        self._probed: tuple[float, float] | None = None

    @classmethod
    def open(
        cls,
        root: Path | str,
        *,
        wall: Callable[[], float] = time.time,
        ops: FileOps | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> DirectoryFiles:
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
        files = cls(root, lock, wall=wall, ops=ops, clock=clock)
        opened = False
        try:
            lock.seek(0)
            lock.truncate()
            lock.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
            lock.flush()
            if not (root / REGISTRY_NAME).is_dir():
                files._migrate()
            for bucket in BUCKETS:
                (root / "v1" / bucket).mkdir(parents=True, exist_ok=True)
                (root / REGISTRY_NAME / bucket).mkdir(parents=True, exist_ok=True)
                # Prove the bucket takes a publication, the way every later one is made.
                probe = (bucket, f"{_TEMP_PREFIX}probe")
                files._ops.unlink(files._write_temp(probe, b""))
            files._registered = set(read_registry(root))
            if (root / MANIFEST_NAME).exists():
                # Beside a registry (a downgrade and back, or a migration cut short after
                # its registry was in place): what it names is ours too.
                for file in read_manifest(root):
                    with contextlib.suppress(FileNotFoundError):
                        files._link(files._path(file), file)
                files._sync_registry()
                files._drop_manifest()
            files._remove_own_temp_files()
            opened = True
        except OSError as exc:
            raise _not_writable(root, exc) from None
        finally:
            if not opened:
                files.release()  # nothing of a writer that did not open is left holding the lock
        return files

    def release(self) -> None:
        """Give the directory up (the lock file stays; only the lock goes)."""
        lock, self._lock = self._lock, None
        if lock is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
            lock.close()

    def _migrate(self) -> None:
        """Make the registry from a previous release's manifest and leased files; drop it.

        Built aside and renamed into place, so a writer killed meanwhile leaves either no
        registry (the next one migrates again, from the same files) or a whole one.
        """
        named = read_manifest(self.root)
        ahead = self.now() + _LEASED_AHEAD
        leased = [file for file in self._bucket_files() if (self.modified(file) or 0.0) > ahead]
        claimed = list(dict.fromkeys([*named, *leased]))
        building = self.root / f"{REGISTRY_NAME}.new"
        shutil.rmtree(building, ignore_errors=True)
        for bucket in BUCKETS:
            (building / bucket).mkdir(parents=True)
        for file in claimed:
            with contextlib.suppress(FileNotFoundError):  # named, but gone: nothing to own
                self._make_entry(self._path(file), str(building / file[0] / file[1]))
        for bucket in BUCKETS:
            self._sync_dir(str(building / bucket))
        self._sync_dir(str(building))
        self._ops.replace(str(building), str(self.root / REGISTRY_NAME))
        self._sync_dir(str(self.root))
        self._drop_manifest()
        if claimed:
            _log.info(
                "admitted view %s: %d file(s) of a previous release's writer registered "
                "(%d named by its manifest, %d by their lease)",
                self.root,
                len(claimed),
                len(named),
                len(leased),
            )

    def _drop_manifest(self) -> None:
        for leftover in (MANIFEST_NAME, f"{MANIFEST_NAME}.tmp"):
            with contextlib.suppress(FileNotFoundError):
                self._ops.unlink(str(self.root / leftover))

    def _bucket_files(self) -> list[ViewFile]:
        found: list[ViewFile] = []
        for bucket in BUCKETS:
            with contextlib.suppress(OSError):
                found.extend(
                    (bucket, entry.name)
                    for entry in os.scandir(f"{self._v1}{bucket}")
                    if not entry.name.startswith(".")
                )
        return found

    def _path(self, file: ViewFile) -> str:
        return f"{self._v1}{file[0]}/{file[1]}"

    def _entry(self, file: ViewFile) -> str:
        return f"{self._registry}{file[0]}/{file[1]}"

    def _write_temp(self, file: ViewFile, value: bytes) -> str:
        self._serial += 1
        temp = f"{self._v1}{file[0]}/{_TEMP_PREFIX}{self._token}-{self._serial}"
        ops = self._ops
        fd = ops.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            left = memoryview(value)
            while left:  # a short write (a disk filling up) writes the rest, or raises
                left = left[ops.write(fd, left) :]
        finally:
            ops.close(fd)
        return temp

    def _sync_dir(self, path: str) -> None:
        ops = self._ops
        fd = ops.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            ops.fsync(fd)
        except OSError as exc:
            # A file system that cannot sync a folder (some network ones) orders nothing
            # more for being asked.
            if exc.errno not in (errno.EINVAL, errno.ENOTSUP):
                raise
        finally:
            ops.close(fd)

    def _link(self, source: str, file: ViewFile) -> None:
        """Register ``file`` by a hard link to ``source``; made durable by the next sync."""
        if file in self._registered:
            return
        try:
            self._make_entry(source, self._entry(file))
        except FileNotFoundError:
            if not os.path.exists(source):
                raise
            # Someone removed the registry's folder: make it again (its entries are gone,
            # so the files they named are no longer told from others').
            os.makedirs(f"{self._registry}{file[0]}", exist_ok=True)
            _log.warning("admitted view: made %s%s again: it was gone", self._registry, file[0])
            self._make_entry(source, self._entry(file))
        self._registered.add(file)
        self._unsynced.add(file[0])

    def _make_entry(self, source: str, entry: str) -> None:
        try:
            self._ops.link(source, entry)
        except FileExistsError:
            pass  # registered already (by a writer before this one's registry was read)
        except FileNotFoundError:
            raise
        except OSError as exc:
            if exc.errno not in _NO_HARD_LINKS:
                raise
            # A file system without hard links: an empty entry says the same.
            self._ops.close(self._ops.open(entry, os.O_WRONLY | os.O_CREAT, 0o644))

    def _sync_registry(self) -> None:
        while self._unsynced:
            bucket = min(self._unsynced)
            self._sync_dir(f"{self._registry}{bucket}")
            self._unsynced.discard(bucket)

    def registered(self) -> list[ViewFile]:
        return sorted(self._registered, key=lambda f: (BUCKETS.index(f[0]), f[1]))

    # -- the clocks ------------------------------------------------------------------------------

    def _fs_now(self) -> float | None:
        """Read the file system's clock: a probe touched with "now" and read back, extrapolated."""
        at = self._clock()
        if self._probed is None or at - self._probed[1] >= _PROBE_EVERY:
            probe = f"{self.root}/{CLOCK_PROBE_NAME}"
            try:
                try:
                    self._ops.utime(probe, None)
                except FileNotFoundError:
                    self._ops.close(self._ops.open(probe, os.O_WRONLY | os.O_CREAT, 0o644))
                self._probed = (os.stat(probe).st_mtime, at)
            except OSError as exc:
                _log.debug("admitted view: cannot read the file system's clock: %s", exc)
                return None
        stamped, read_at = self._probed
        return stamped + (at - read_at)

    def now(self) -> float:
        """Return the earliest of the wall clock, the file system's and the NATS server's clocks.

        The server's clock lowers it by at most half the lease: a server whose clock lags the
        frontend's shortens the view's horizon by that much at worst, and never so far that a
        file expires between two touches (half any lease, plus the store's 10 s, outlasts a
        refresh).
        """
        now = self._wall()
        fs_now = self._fs_now()
        if fs_now is not None:
            now = min(now, fs_now)
        if self.server_now is not None:
            server = self.server_now()
            if server is not None:
                now = max(min(now, server), now - self.lease / 2)
        return now

    def _stamp(self) -> tuple[float, float] | None:
        """Return the (atime, mtime) a write or touch sets: the lease ahead, or now (``None``)."""
        if self.lease <= 0:
            return None
        until = self.now() + self.lease
        if self.lease_overdue is not None:
            # A writer cut off from the admission bucket cannot renew the lease its records
            # state there, and a drain counts its frontend as let go once the server drops
            # them: its view must be gone by then. So a touch stamps no further ahead than a
            # touch at the last renewal did (the records outlive that stamp by a rewrite).
            overdue = self.lease_overdue()
            if overdue is not None and overdue > 0:
                until -= overdue
        return (until, until)

    def restamp_ahead(self, files: Iterable[ViewFile], lease: float | None = None) -> int:
        """Stamp again, ``lease`` beyond now, every file stamped implausibly far ahead of it.

        Implausibly: more than the lease (this writer's, unless given) and ``_AHEAD_MARGIN``
        beyond now, which only a clock that ran ahead of this one stamps. Returns how many
        were stamped again.
        """
        lease = max(self.lease if lease is None else lease, 0.0)
        now = self.now()
        limit = now + lease + _AHEAD_MARGIN
        stamp = now + lease
        restamped = 0
        for file in files:
            when = self.modified(file)
            if when is None or when <= limit:
                continue
            with contextlib.suppress(FileNotFoundError):
                self._ops.utime(self._path(file), (stamp, stamp))
                restamped += 1
        if restamped:
            _log.warning(
                "admitted view %s: %d file(s) were stamped more than %.0f s beyond now (a "
                "clock that ran ahead); stamped again to %.0f s beyond now",
                self.root,
                restamped,
                limit - now,
                stamp - now,
            )
        return restamped

    # -- the files -------------------------------------------------------------------------------

    def _write_leased(self, file: ViewFile, value: bytes) -> str:
        """Write a temp file with the value and the lease's stamp; return its path."""
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
                self._ops.utime(temp, stamp)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise
        return temp

    def stage(self, files: Iterable[tuple[ViewFile, bytes]]) -> None:
        """Write each file aside, link each new name into the registry, sync once per folder."""
        self._drop_staged()
        for file, value in files:
            try:
                temp = self._write_leased(file, value)
            except OSError:
                continue  # its publish writes it, or reports why not
            try:
                self._link(temp, file)
            except OSError:
                with contextlib.suppress(OSError):
                    os.unlink(temp)
                continue
            self._staged[file] = (temp, value)
        with contextlib.suppress(OSError):
            self._sync_registry()  # else each publish tries again, and fails, on its own

    def _drop_staged(self) -> None:
        staged, self._staged = self._staged, {}
        for temp, _value in staged.values():
            with contextlib.suppress(OSError):
                os.unlink(temp)

    def publish(self, file: ViewFile, value: bytes) -> None:
        staged = self._staged.pop(file, None)
        if staged is not None and staged[1] == value:
            temp = staged[0]
        else:
            if staged is not None:
                with contextlib.suppress(OSError):
                    os.unlink(staged[0])
            temp = self._write_leased(file, value)
        try:
            self._link(temp, file)
            # The entry is durable before the file appears: whatever instant this writer
            # dies at, the next one owns the file.
            self._sync_registry()
            self._ops.replace(temp, self._path(file))
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise

    def touch(self, file: ViewFile) -> bool:
        try:
            self._ops.utime(self._path(file), self._stamp())
        except FileNotFoundError:
            return False
        return True

    def remove(self, file: ViewFile) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._ops.unlink(self._path(file))
        # Only once the file is gone: an entry left behind names a missing file, harmless.
        with contextlib.suppress(FileNotFoundError):
            self._ops.unlink(self._entry(file))
        self._registered.discard(file)

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

    def foreign_files(self, known: Iterable[ViewFile]) -> list[ViewFile]:
        """Record files in the view that this writer does not own (reported, never touched)."""
        mine = self._registered | set(known)
        return [file for file in self._bucket_files() if file not in mine]

    def _remove_own_temp_files(self) -> None:
        for bucket in BUCKETS:
            with contextlib.suppress(OSError):
                names = [entry.path for entry in os.scandir(self.root / "v1" / bucket)]
                for path in names:
                    if os.path.basename(path).startswith(_TEMP_PREFIX):
                        with contextlib.suppress(OSError):
                            self._ops.unlink(path)
