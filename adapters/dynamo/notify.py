"""Wake the file bridge when Dynamo's file store changes: Linux inotify, read on the event loop.

Dynamo 1.6.1's own file store watches the same directories with inotify, so a frontend on the
workers' store sees a worker's records vanish at once; a bridge that only polled would lag
behind it by its interval. This wrapper watches the store root, ``v1`` and the four bucket
folders for records created, written, renamed in or out, and removed, and sets the
:class:`asyncio.Event` the bridge waits on. A notification mostly says only when to look: the
bridge's scan is the one source of truth. The one thing it also says is which record files were
removed (:meth:`StoreNotifier.take_removed`), so the bridge can withdraw a departed worker's
records without waiting for a scan. Owners' refreshes (a new mtime) are not watched, since they
change no record. A folder created later is watched from then on, and a queue overflow just
wakes the bridge. Where inotify cannot be had (another OS, or the per-user watch limit
reached) :func:`open_notifier` returns ``None`` and the bridge polls.

The three libc calls are made through ctypes rather than a watcher library: watchfiles, say,
hands changes over from a thread in steps (50 ms by default), which is the very lag this is
here to remove, and it would be one more dependency for what is a single file descriptor.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import errno
import logging
import os
import struct
import sys
from pathlib import Path

from workerset_admission.discovery_paths import RECORD_KINDS, RecordKind

__all__ = ["StoreNotifier", "open_notifier"]

_log = logging.getLogger(__name__)

# From <sys/inotify.h>.
_IN_CLOSE_WRITE = 0x00000008
_IN_MOVED_FROM = 0x00000040
_IN_MOVED_TO = 0x00000080
_IN_CREATE = 0x00000100
_IN_DELETE = 0x00000200
_IN_DELETE_SELF = 0x00000400
_IN_MOVE_SELF = 0x00000800
_IN_Q_OVERFLOW = 0x00004000
_IN_IGNORED = 0x00008000
_IN_ONLYDIR = 0x01000000
_IN_ISDIR = 0x40000000
_IN_NONBLOCK = 0o4000
_IN_CLOEXEC = 0o2000000
_RECORD_EVENTS = _IN_CREATE | _IN_CLOSE_WRITE | _IN_MOVED_TO | _IN_MOVED_FROM | _IN_DELETE
_FOLDER_EVENTS = _RECORD_EVENTS | _IN_DELETE_SELF | _IN_MOVE_SELF | _IN_ONLYDIR
# A folder appeared or went: the set of watched folders must be made again.
_REARM = _IN_DELETE_SELF | _IN_MOVE_SELF | _IN_IGNORED | _IN_Q_OVERFLOW
_HEADER = struct.Struct("iIII")
# Dynamo stages new records under this prefix and links them into place; only the link counts.
_TEMP_PREFIX = b".tmp_"


class _Inotify:
    """The three libc calls, through ctypes (no extension module to build)."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        self._init1 = libc.inotify_init1
        self._add_watch = libc.inotify_add_watch
        self._add_watch.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32)

    def init(self) -> int:
        fd = int(self._init1(_IN_NONBLOCK | _IN_CLOEXEC))
        if fd < 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code))
        return fd

    def add_watch(self, fd: int, path: Path, mask: int) -> int | None:
        wd = int(self._add_watch(fd, os.fsencode(path), mask))
        if wd >= 0:
            return wd
        code = ctypes.get_errno()
        if code in (errno.ENOENT, errno.ENOTDIR):  # not there yet
            return None
        raise OSError(code, f"inotify_add_watch {path}: {os.strerror(code)}")


class StoreNotifier:
    """Watches one store root; ``changed`` is set whenever a record may have changed."""

    def __init__(self, root: Path, inotify: _Inotify, fd: int, changed: asyncio.Event) -> None:
        self._inotify = inotify
        self._fd = fd
        self._folders = (root, root / "v1", *(root / "v1" / kind for kind in RECORD_KINDS))
        self._watched: set[Path] = set()
        # Which bucket folder each watch descriptor is, and the record files seen removed.
        self._kinds: dict[int, RecordKind] = {}
        self._removed: set[tuple[RecordKind, str]] = set()
        self.changed = changed
        self.events = 0
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def watched(self) -> frozenset[Path]:
        """The folders watched now (the others do not exist yet)."""
        return frozenset(self._watched)

    def start(self) -> None:
        """Watch every folder that exists and read events on the running loop."""
        self.rearm()
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._fd, self._readable)

    def rearm(self) -> None:
        """Watch every folder that exists now (a store root that came back, say)."""
        if self._fd < 0:
            return
        # Adding a watch that exists returns the same descriptor, so re-arming is idempotent.
        watched: set[Path] = set()
        kinds: dict[int, RecordKind] = {}
        for folder in self._folders:
            wd = self._inotify.add_watch(self._fd, folder, _FOLDER_EVENTS)
            if wd is not None:
                watched.add(folder)
                if folder.parent.name == "v1" and folder.name in RECORD_KINDS:
                    kinds[wd] = folder.name
        self._watched = watched
        self._kinds = kinds

    def take_removed(self) -> set[tuple[RecordKind, str]]:
        """Hand over the (bucket, file name) of each record file removed since the last call."""
        removed, self._removed = self._removed, set()
        return removed

    def _readable(self) -> None:
        try:
            data = os.read(self._fd, 64 * 1024)
        except BlockingIOError:
            return
        except OSError as exc:
            _log.warning("file store notifications failed (%s); the bridge polls", exc)
            self.close()
            self.changed.set()
            return
        woke = rearm = False
        offset = 0
        while offset + _HEADER.size <= len(data):
            wd, mask, _cookie, length = _HEADER.unpack_from(data, offset)
            name = data[offset + _HEADER.size : offset + _HEADER.size + length].rstrip(b"\0")
            offset += _HEADER.size + length
            if mask & (_REARM | _IN_ISDIR):
                # A watched folder went, or a folder appeared or went under one.
                rearm = woke = True
            elif not name.startswith(_TEMP_PREFIX):
                woke = True
                kind = self._kinds.get(wd)
                if kind is not None and mask & (_IN_DELETE | _IN_MOVED_FROM):
                    self._removed.add((kind, os.fsdecode(name)))
        if rearm:
            try:
                self.rearm()
            except OSError as exc:
                _log.warning("file store notifications failed (%s); the bridge polls", exc)
        if woke:
            self.events += 1
            self.changed.set()

    def close(self) -> None:
        """Stop watching; safe to call more than once."""
        if self._fd < 0:
            return
        if self._loop is not None:
            self._loop.remove_reader(self._fd)
            self._loop = None
        os.close(self._fd)
        self._fd = -1


def open_notifier(root: Path, changed: asyncio.Event) -> StoreNotifier | None:
    """Watch ``root`` with inotify, setting ``changed``; ``None`` (logged) where it cannot."""
    if not sys.platform.startswith("linux"):
        _log.info("no inotify on %s: the file bridge polls the store", sys.platform)
        return None
    try:
        inotify = _Inotify()
        fd = inotify.init()
    except (OSError, AttributeError) as exc:
        _log.warning("file store notifications unavailable (%s); the bridge polls", exc)
        return None
    notifier = StoreNotifier(root, inotify, fd, changed)
    try:
        notifier.start()
    except OSError as exc:
        notifier.close()
        _log.warning("file store notifications unavailable (%s); the bridge polls", exc)
        return None
    return notifier
