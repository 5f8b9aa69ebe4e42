"""The real Dynamo 1.6.1 frontend as a test process: file discovery, loopback, the extension on."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

__all__ = ["free_port", "running_frontend"]


def free_port() -> int:
    """Return a loopback port nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def running_frontend(
    http_port: int,
    env: Mapping[str, str],
    log_path: Path,
    *,
    stop_timeout: float = 20.0,
    extension: bool = True,
) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``python -m dynamo.frontend`` (with the route extension unless told not to).

    The frontend listens on 127.0.0.1 only; its output goes to ``log_path``. On exit it gets
    SIGTERM, and SIGKILL if it has not stopped within ``stop_timeout`` seconds.
    """
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dynamo.frontend",
                "--discovery-backend",
                "file",
                *(("--frontend-route-extension", "workerset-admission") if extension else ()),
                "--http-host",
                "127.0.0.1",
                "--http-port",
                str(http_port),
            ],
            env=dict(env),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(stop_timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
