"""The soak's processes: nats-server nodes, ``serve --view-dir`` frontends and the bridge.

Each is a real process with its log in the run's folder, started again on the same ports and
store after a SIGKILL, and stopped (SIGSTOP) and continued (SIGCONT) in place. The frontends run
inside their own network namespace (``nsenter --net``), everything else in the soak's.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from clusterfixture import CLUSTER_NAME, node_config
from workerset_admission.adapters.nats.embedded import find_nats_server_binary

__all__ = ["CLI", "Proc", "bridge_argv", "free_port", "nats_nodes", "serve_argv"]

CLI = (sys.executable, "-m", "workerset_admission.cli")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("DYN_", "WORKERSET_"))}


@dataclass
class Proc:
    """One restartable process; ``kills``, ``stops`` and ``starts`` count what was done to it."""

    name: str
    argv: list[str]
    log: Path
    ready: tuple[str, int] | None = None  # a TCP address that answers once it is up
    popen: subprocess.Popen[bytes] | None = None
    stopped: bool = False
    starts: int = 0
    kills: int = 0
    # Killed by the soak and not started again yet: the supervisor leaves it down.
    held_down: bool = False
    # When it exited by itself, as the supervisor saw it (None while it runs).
    exited_at: float | None = None
    env: dict[str, str] = field(default_factory=_clean_env)

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.running and self.popen is not None else None

    @property
    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def start(self) -> None:
        with self.log.open("ab") as out:
            out.write(f"\n--- start {self.starts + 1} at {time.time():.3f}\n".encode())
            out.flush()
            self.popen = subprocess.Popen(
                self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=self.env,
            )  # fmt: skip
        self.starts += 1
        self.stopped = False
        self.held_down = False
        self.exited_at = None
        if self.ready is not None:
            self._wait_ready(*self.ready)

    def _wait_ready(self, host: str, port: int, seconds: float = 20.0) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if not self.running:
                raise RuntimeError(f"{self.name} exited at start; see {self.log}")
            with contextlib.suppress(OSError), socket.create_connection((host, port), 0.3):
                return
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} did not listen within {seconds:g} s; see {self.log}")

    def kill(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            if self.stopped:
                self.popen.send_signal(signal.SIGCONT)
            self.popen.kill()
            self.popen.wait(10)
            self.kills += 1
        self.stopped = False
        self.held_down = True

    def pause(self) -> None:
        assert self.popen is not None
        self.popen.send_signal(signal.SIGSTOP)
        self.stopped = True

    def resume(self) -> None:
        if self.popen is not None and self.stopped:
            self.popen.send_signal(signal.SIGCONT)
        self.stopped = False

    def close(self) -> None:
        """SIGTERM, then SIGKILL after 15 s (a stopped process is continued first)."""
        if self.popen is None or self.popen.poll() is not None:
            return
        self.resume()
        self.popen.terminate()
        try:
            self.popen.wait(15)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(10)


def nats_nodes(root: Path, host: str, count: int) -> list[Proc]:
    """One nats-server (``count`` 1) or a cluster of ``count``, clients on ``host``.

    Each node's monitoring endpoint listens on loopback: the soak reads each frontend's
    subscriptions from its ``/connz``.
    """
    binary = str(find_nats_server_binary())
    ports = [(free_port(), free_port(), free_port()) for _ in range(count)]
    nodes = []
    for index, (client, route, monitor) in enumerate(ports):
        name = f"n{index + 1}"
        directory = root / name
        store = directory / "store"
        store.mkdir(parents=True, exist_ok=True)
        if count == 1:
            text = f"server_name: {name}\nlisten: {host}:{client}\n"
            text += f'jetstream {{\n  store_dir: "{store}"\n}}\n'
        else:
            peers = [r for i, (_c, r, _m) in enumerate(ports) if i != index]
            text = node_config(name, client, route, peers, store, CLUSTER_NAME, host=host)
        text += f"http: 127.0.0.1:{monitor}\n"
        config = directory / "node.conf"
        config.write_text(text)
        proc = Proc(f"nats-{name}", [binary, "-c", str(config)], directory / "server.log")
        proc.ready = (host, client)
        proc.env["SOAK_MONITOR_PORT"] = str(monitor)
        nodes.append(proc)
    return nodes


def monitor_port(node: Proc) -> int:
    return int(node.env["SOAK_MONITOR_PORT"])


def servers_argv(urls: list[str]) -> list[str]:
    """``--nats-server URL`` for each server, as every command of the CLI takes them."""
    return [arg for url in urls for arg in ("--nats-server", url)]


def serve_argv(
    prefix: list[str], view: Path, urls: list[str], bucket: str, frontend: str, replicas: int
) -> list[str]:
    return [
        *prefix,
        *CLI,
        "serve",
        "--view-dir",
        str(view),
        *servers_argv(urls),
        "--discovery-bucket",
        bucket,
        "--admission-bucket",
        f"{bucket}-adm",
        "--bucket-replicas",
        str(replicas),
        "--frontend-id",
        frontend,
        "--status-subject",
        f"soak.status.{frontend}",
        "--registration-ttl",
        "10",
        "--tenure-hold",
        "10",
        "--reconcile-interval",
        "15",
    ]


def bridge_argv(store: Path, urls: list[str], bucket: str, replicas: int) -> list[str]:
    return [
        *CLI,
        "bridge",
        "--file-kv",
        str(store),
        "--interval",
        "0.5",
        "--ttl",
        "10",
        *servers_argv(urls),
        "--discovery-bucket",
        bucket,
        "--bucket-replicas",
        str(replicas),
    ]
