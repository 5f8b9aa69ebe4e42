"""Each frontend's view directory on a small tmpfs of its own: filled up, and made read-only.

A disk-full episode writes a ballast file until the file system refuses (ENOSPC), holds it, and
removes it; a read-only episode lays a read-only bind of the folder over it, then lifts it.
:meth:`close` unmounts everything it mounted, even after a failure.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from soak.net import run_tool as _run

__all__ = ["SmallDisks"]

_BALLAST = ".soak-ballast"


@dataclass
class SmallDisks:
    """Mounted tmpfs folders by name, and which of them are hurt now."""

    size: str = "4m"
    mounts: dict[str, Path] = field(default_factory=dict)
    faults: dict[str, str] = field(default_factory=dict)

    def mount(self, name: str, path: Path) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        _run("mount", "-t", "tmpfs", "-o", f"size={self.size},mode=0755", "tmpfs", str(path))
        self.mounts[name] = path
        return path

    def fill(self, name: str) -> int:
        """Write a ballast file until the file system is full; the bytes written."""
        written = 0
        chunk = b"\0" * 65536
        with (self.mounts[name] / _BALLAST).open("wb", buffering=0) as out:
            while True:
                try:
                    written += out.write(chunk)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
                if written > 1 << 30:  # a tmpfs bigger than asked: never fill the machine
                    break
        # Fill the last few kilobytes too, one block at a time.
        with (
            (self.mounts[name] / _BALLAST).open("ab", buffering=0) as out,
            contextlib.suppress(OSError),
        ):
            while out.write(b"\0" * 512):
                written += 512
        self.faults[name] = "full"
        return written

    def read_only(self, name: str) -> None:
        """Make the folder read-only: a read-only bind of the tmpfs over itself.

        A remount of the tmpfs itself is refused while a writer holds a file open ("mount
        point is busy"); the bind is new, so it has no writers, and every path opened from now
        on resolves through it and is refused (EROFS), as on a disk remounted read-only.
        """
        path = str(self.mounts[name])
        _run("mount", "--bind", path, path)
        try:
            _run("mount", "-o", "remount,bind,ro", path)
        except RuntimeError:
            subprocess.run(("umount", "-l", path), capture_output=True, check=False, timeout=20)
            raise
        self.faults[name] = "read-only"

    def heal(self, name: str) -> None:
        kind = self.faults.pop(name, None)
        if kind == "full":
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.mounts[name] / _BALLAST)
        elif kind == "read-only":
            _run("umount", "-l", str(self.mounts[name]))

    def close(self) -> None:
        for name in list(self.faults):
            with contextlib.suppress(Exception):
                self.heal(name)
        for path in reversed(list(self.mounts.values())):
            # lazy: a process still holding a file open must not keep the mount.
            subprocess.run(
                ("umount", "-l", str(path)), capture_output=True, check=False, timeout=20
            )
        self.mounts.clear()
