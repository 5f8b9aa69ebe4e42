"""How the commands that connect reach NATS: the configured servers, else the local ``serve``.

A ``serve`` that starts an embedded nats-server announces where it listens in one file
(:func:`serve_file`); every other command that connects, given no server, reads that file, so
``status``, ``register``, ``record``, ``rollout`` and ``bridge`` all find it the same way and say
the same thing when there is none.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workerset_admission.errors import Unreachable
from workerset_admission.settings import Settings

if TYPE_CHECKING:
    from workerset_admission.adapters.nats.connect import NatsConnectOptions

__all__ = [
    "SERVE_FILE_ENV",
    "announce_local_serve",
    "client_options",
    "local_serve",
    "serve_file",
    "servers",
]

SERVE_FILE_ENV = "WORKERSET_ADMISSION_SERVE_FILE"


def serve_file() -> Path:
    """Where a ``serve`` with an embedded server says where it listens."""
    override = os.environ.get(SERVE_FILE_ENV)
    if override:
        return Path(override)
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    return Path(base) / f"workerset-admission-{os.getuid()}.serve.json"


def announce_local_serve(url: str, subject: str) -> Callable[[], None]:
    """Write the announcement; return what withdraws it (only if it is still ours)."""
    path = serve_file()
    body = json.dumps({"url": url, "status_subject": subject, "pid": os.getpid()})
    try:
        path.write_text(body + "\n", encoding="utf-8")
    except OSError:
        return lambda: None

    def withdraw() -> None:
        # Only our own announcement: a newer serve may have replaced it meanwhile.
        with contextlib.suppress(OSError, ValueError):
            if json.loads(path.read_text(encoding="utf-8")).get("pid") == os.getpid():
                path.unlink()

    return withdraw


def local_serve() -> dict[str, Any] | None:
    """Return the announcement of a local ``serve`` that still runs, or ``None``."""
    try:
        found = json.loads(serve_file().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(found, dict) or not isinstance(found.get("url"), str):
        return None
    pid = found.get("pid")
    if isinstance(pid, int) and not _alive(pid):
        # A serve that was killed could not withdraw its announcement.
        return None
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def servers(settings: Settings) -> tuple[str, ...]:
    """Return the configured servers, else the local ``serve``'s embedded one, else raise."""
    if settings.nats_servers:
        return settings.nats_servers
    local = local_serve()
    if local is None:
        raise Unreachable(
            "no NATS server given (--nats-server, WORKERSET_ADMISSION_NATS_SERVERS or the "
            f"settings file) and no running local serve announced in {serve_file()}"
        )
    return (str(local["url"]),)


def client_options(settings: Settings, command: str) -> NatsConnectOptions:
    """Connect options for a command, named after it, to :func:`servers`."""
    from workerset_admission.adapters.nats.connect import connect_options

    return connect_options(
        settings, servers(settings), client_name=f"workerset-admission {command}"
    )
