"""A systemd unit of deploy/systemd/, read as systemd reads it, and the notify socket it talks to.

These machines run no systemd (no ``systemd-run``, no user manager), so a test runs a unit's
``ExecStart=`` itself: split as systemd splits it (no shell), with the unit's ``Environment=``
and ``EnvironmentFile=`` (a leading ``-``: optional), and a real ``NOTIFY_SOCKET`` that the test
owns, where ``Type=notify`` readiness and ``WatchdogSec=`` pings arrive as systemd would get them.
With ``SO_PASSCRED`` each message carries its sender's process id (in the receiver's namespace),
which is how ``NotifyAccess=main`` is checked.
"""

from __future__ import annotations

import os
import shlex
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["NotifySocket", "Unit", "read_unit"]

# The [Service] keys a test runs or checks; any other key fails read_unit, so a unit that gains
# one is not run as something else.
SERVICE_KEYS = frozenset(
    {
        "Type",
        "NotifyAccess",
        "WatchdogSec",
        "User",
        "EnvironmentFile",
        "Environment",
        "ExecStart",
        "KillSignal",
        "TimeoutStopSec",
        "Restart",
        "RestartSec",
        "RestartPreventExitStatus",
    }
)


@dataclass
class Unit:
    path: Path
    service: dict[str, list[str]] = field(default_factory=dict)

    def one(self, key: str, default: str | None = None) -> str:
        values = self.service.get(key)
        if not values:
            if default is None:
                raise KeyError(f"{self.path.name}: no {key}=")
            return default
        (value,) = values
        return value

    @property
    def argv(self) -> list[str]:
        return shlex.split(self.one("ExecStart"))

    def environment(self, root: Path = Path("/")) -> dict[str, str]:
        """The unit's environment: its files (read under ``root``), then its Environment= lines."""
        env: dict[str, str] = {}
        for entry in self.service.get("EnvironmentFile", []):
            optional = entry.startswith("-")
            path = root / entry.removeprefix("-").lstrip("/")
            if not path.exists():
                if optional:
                    continue
                raise FileNotFoundError(f"{self.path.name}: EnvironmentFile {path} is missing")
            for line in path.read_text().splitlines():
                line = line.strip()
                if line and not line.startswith(("#", ";")):
                    name, _, value = line.partition("=")
                    env[name.strip()] = value.strip().strip('"')
        for entry in self.service.get("Environment", []):
            for word in shlex.split(entry):
                name, _, value = word.partition("=")
                env[name] = value
        return env


def read_unit(path: Path) -> Unit:
    unit = Unit(path)
    section = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line
            continue
        if section == "[Service]":
            key, _, value = line.partition("=")
            if key not in SERVICE_KEYS:
                raise AssertionError(f"{path.name}: [Service] {key}= is not run here")
            unit.service.setdefault(key, []).append(value)
    return unit


class NotifySocket:
    """A datagram socket at ``path`` that receives sd_notify messages, with their senders."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.sock.bind(str(path))
        # The service runs as another user: it must be able to send here.
        os.chmod(path, 0o777)
        self.messages: list[tuple[float, int, str]] = []

    def receive(self, until: float, stop: Callable[[], bool] = lambda: False) -> None:
        """Collect messages until the monotonic time ``until``, or until ``stop()`` is true."""
        space = socket.CMSG_SPACE(struct.calcsize("3i"))
        while not stop() and (left := until - time.monotonic()) > 0:
            self.sock.settimeout(left)
            try:
                data, ancillary, _, _ = self.sock.recvmsg(4096, space)
            except TimeoutError:
                return
            pid = -1
            for level, kind, body in ancillary:
                if (level, kind) == (socket.SOL_SOCKET, socket.SCM_CREDENTIALS):
                    pid = struct.unpack("3i", body[: struct.calcsize("3i")])[0]
            for message in data.decode().splitlines():
                self.messages.append((time.monotonic(), pid, message))

    def times(self, message: str) -> list[tuple[float, int]]:
        return [(at, pid) for at, pid, said in self.messages if said == message]

    def close(self) -> None:
        self.sock.close()
        self.path.unlink(missing_ok=True)
