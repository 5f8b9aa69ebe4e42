"""The ``preStop`` hook of ``deploy/kubernetes/worker-prestop.yaml``, run as a kubelet runs it.

Real ``python -m dynamo.mocker`` workers register in their own file store; ``bridge`` mirrors
them into the NATS bucket and ``serve`` admits them. The hook's command is read from the
manifest and run with no shell, its environment variables set as the kubelet would set them
(``status.podIP``, and the manifest's own ``DYN_TCP_RPC_PORT``, which each worker listens on).
Only the addresses of the services (NATS, its monitoring) are this test's own.

Two pods share one IP (127.0.0.2, as ``hostNetwork`` pods on one node do), each worker on the
TCP request plane at a port of its own: each pod's hook drains its own worker and no other, a
hook run again returns at once, and the last worker is refused. On the NATS request plane
(whose record names a subject only; the nats-server sees its connection from 127.0.0.1) the
manifest's hook without its port, as the manifest says, drains that pod's worker.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import nats
import pytest
from support.buckets import live_keys
from support.workers import file_discovery_environment, write_model_dir
from workerset_admission.adapters.nats.embedded import EmbeddedNatsServer, free_loopback_port

pytestmark = [pytest.mark.integration, pytest.mark.dynamo, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = ROOT / "deploy" / "kubernetes" / "worker-prestop.yaml"
CLI = [sys.executable, "-m", "workerset_admission.cli"]
NAMESPACE = "dgd-v1"


def hook_command() -> list[str]:
    """The preStop hook's command, exactly as the manifest gives it."""
    yaml = pytest.importorskip("yaml", reason="needs pyyaml (the dynamo extra)")
    manifest = yaml.safe_load(MANIFEST.read_text())
    (container,) = manifest["spec"]["template"]["spec"]["containers"]
    command: list[str] = container["lifecycle"]["preStop"]["exec"]["command"]
    return command


def wait_for(check: Any, what: str, timeout: float = 90) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


class Pods:
    """A nats-server with monitoring, the workers' file store, bridge, serve and the mockers."""

    def __init__(self, root: Path) -> None:
        pytest.importorskip("dynamo.mocker", reason="needs ai-dynamo==1.6.1 (see the README)")
        self.root = root
        self.monitor_port = free_loopback_port()
        self.server = EmbeddedNatsServer(
            root / "js", extra_args=("-m", str(self.monitor_port)), die_with_owner=False
        )
        self.server.start()
        self.monitor = f"http://127.0.0.1:{self.monitor_port}"
        suffix = uuid.uuid4().hex[:8]
        self.discovery, self.admission = f"disc-{suffix}", f"adm-{suffix}"
        self.env = file_discovery_environment(root / "store")
        self.model = write_model_dir(root / "model")
        self.processes: list[subprocess.Popen[bytes]] = []
        self.subject = ""
        (root / "logs").mkdir()

    def buckets(self) -> list[str]:
        return [
            "--nats-server", self.server.url,
            "--discovery-bucket", self.discovery,
            "--admission-bucket", self.admission,
        ]  # fmt: skip

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        base = {k: v for k, v in os.environ.items() if not k.startswith(("DYN_", "WORKERSET_"))}
        with (self.root / "logs" / f"{name}.log").open("ab") as log:
            self.processes.append(
                subprocess.Popen(argv, env={**base, **(env or {})}, stdout=log, stderr=log)
            )

    def worker(self, name: str, plane: str, host: str, port: int | None = None) -> int:
        before = self.instances()
        env = {
            **self.env,
            "DYN_REQUEST_PLANE": plane,
            "DYN_TCP_RPC_HOST": host,
            "DYN_EVENT_PLANE": "nats",
            "NATS_SERVER": self.server.url,
        }
        if port is not None:
            env["DYN_TCP_RPC_PORT"] = str(port)
        self.start(
            name,
            [sys.executable, "-m", "dynamo.mocker", "--model-path", str(self.model),
             "--model-name", "tiny", "--endpoint", f"dyn://{NAMESPACE}.backend.generate",
             "--discovery-backend", "file", "--speedup-ratio", "0", "--kv-bytes-per-token", "1024"],
            env,
        )  # fmt: skip
        process = self.processes[-1]

        def registered() -> set[int]:
            assert process.poll() is None, f"{name} exited; see {self.root / 'logs'}"
            return self.instances() - before

        (instance,) = wait_for(registered, f"{name} registers")
        return int(instance)

    def instances(self) -> set[int]:
        folder = Path(self.env["DYN_FILE_KV"]) / "v1" / "instances"
        names = os.listdir(folder) if folder.exists() else []
        found = set()
        for name in names:
            parts = unquote(name).split("/")
            if parts[:3] == [NAMESPACE, "backend", "generate"] and len(parts) == 4:
                found.add(int(parts[3], 16))
        return found

    def close(self) -> None:
        for process in reversed(self.processes):
            process.terminate()
        for process in self.processes:
            _end(process)
        self.server.close()


def _end(process: subprocess.Popen[bytes]) -> None:
    try:
        process.wait(20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)


@pytest.fixture
def pods(tmp_path: Path) -> Iterator[Pods]:
    running = Pods(tmp_path)
    try:
        yield running
    finally:
        running.close()


def without_port(command: list[str]) -> list[str]:
    """The hook as the manifest says to run it on the NATS request plane: no port."""
    at = command.index("--port-from-env")
    return command[:at] + command[at + 2 :]


def run_hook(
    pods: Pods, pod_ip: str, port: int | None = None, command: list[str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the manifest's hook as the kubelet does: its argv as written, no shell of its own."""
    given = hook_command() if command is None else command
    argv = [pods.monitor if word == "http://nats:8222" else word for word in given]
    assert argv[0] == "workerset-admission"
    argv[0] = str(Path(sys.executable).with_name("workerset-admission"))
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(pods.root),
        "POD_IP": pod_ip,
        "DYN_TCP_RPC_PORT": str(port) if port is not None else "",
        "WORKERSET_ADMISSION_NATS_SERVERS": pods.server.url,
        "WORKERSET_ADMISSION_DISCOVERY_BUCKET": pods.discovery,
        "WORKERSET_ADMISSION_ADMISSION_BUCKET": pods.admission,
    }
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=200, check=False)


async def drains(url: str, bucket: str) -> list[str]:
    nc = await nats.connect(url)
    try:
        kv = await nc.jetstream().key_value(bucket)
        return await live_keys(kv, "v1.drain.>")
    finally:
        await nc.close()


def start_frontend(pods: Pods, expected: list[int]) -> None:
    """``bridge`` and ``serve``, until serve admits ``expected`` and its record lists them."""
    pods.start(
        "bridge",
        [*CLI, "bridge", "--file-kv", pods.env["DYN_FILE_KV"], "--interval", "0.2",
         *pods.buckets()[:4]],
    )  # fmt: skip
    subject = f"status-{uuid.uuid4().hex[:8]}"
    pods.start(
        "serve",
        [*CLI, "serve", *pods.buckets(), "--frontend-id", "fe-1", "--status-subject", subject],
    )
    pods.subject = subject
    wait_for(lambda: admitted(pods) == sorted(expected), "serve admits the workers")
    time.sleep(1.0)  # its serving record lists them


def admitted(pods: Pods) -> list[int]:
    answer = subprocess.run(
        [*CLI, "status", "--json", "--nats-server", pods.server.url, "--subject", pods.subject],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    if answer.returncode != 0:
        return []
    groups = json.loads(answer.stdout)["groups"]
    return sorted(groups[0]["admitted"]) if groups else []


def undrain(pods: Pods, instance: int) -> None:
    back = subprocess.run(
        [*CLI, "undrain", f"{instance:#x}", *pods.buckets()[:4]],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert back.returncode == 0, back.stderr


@pytest.mark.rollout  # about 20 s: two pods' workers through the real frontend
def test_two_pods_sharing_one_ip_each_drain_only_their_own_worker(pods: Pods) -> None:
    command = hook_command()
    assert "$(" not in " ".join(command)  # the kubelet would not expand it
    port_1, port_2 = free_loopback_port(), free_loopback_port()
    first = pods.worker("pod-1", "tcp", "127.0.0.2", port_1)
    second = pods.worker("pod-2", "tcp", "127.0.0.2", port_2)
    start_frontend(pods, [first, second])

    # Pod 1's hook: its worker alone, though pod 2's worker has the same IP.
    drained = run_hook(pods, "127.0.0.2", port_1)
    assert drained.returncode == 0, drained.stderr
    assert "safe to stop" in drained.stdout
    assert asyncio.run(drains(pods.server.url, pods.discovery)) == [
        f"v1.drain.{NAMESPACE}.{first:x}"
    ]
    # Run again (a kubelet may): the worker is drained and no frontend routes to it, so the
    # hook returns at once instead of waiting out its grace again.
    started = time.monotonic()
    again = run_hook(pods, "127.0.0.2", port_1)
    took = time.monotonic() - started
    assert again.returncode == 0, again.stderr
    assert "waiting" not in again.stderr, again.stderr
    assert took < 4.5, (took, again.stderr)

    # Given back; then pod 2's hook drains its own worker only.
    undrain(pods, first)
    wait_for(lambda: admitted(pods) == sorted([first, second]), "pod 1's worker admitted again")
    time.sleep(1.0)
    drained = run_hook(pods, "127.0.0.2", port_2)
    assert drained.returncode == 0, drained.stderr
    keys = asyncio.run(drains(pods.server.url, pods.discovery))
    assert keys == [f"v1.drain.{NAMESPACE}.{second:x}"]

    # Now pod 1's worker is the model's last: its hook is refused, nothing written.
    refused = run_hook(pods, "127.0.0.2", port_1)
    assert refused.returncode == 6, refused.stderr
    assert "model tiny would be left with no routable worker on frontend fe-1" in refused.stderr
    assert asyncio.run(drains(pods.server.url, pods.discovery)) == keys


def test_the_hook_without_its_port_drains_a_nats_plane_pods_worker(pods: Pods) -> None:
    tcp = pods.worker("tcp-worker", "tcp", "127.0.0.2", free_loopback_port())
    on_nats = pods.worker("nats-worker", "nats", "127.0.0.1")
    records = {
        name: json.loads((Path(pods.env["DYN_FILE_KV"]) / "v1" / "instances" / name).read_text())
        for name in os.listdir(Path(pods.env["DYN_FILE_KV"]) / "v1" / "instances")
        if unquote(name).endswith((f"/generate/{tcp:x}", f"/generate/{on_nats:x}"))
    }
    transports = sorted(next(iter(r["transport"])) for r in records.values())
    assert transports == ["nats_tcp", "tcp"]
    start_frontend(pods, [tcp, on_nats])
    # Found through the server's /connz, the NATS-plane pod's worker alone is drained.
    drained = run_hook(pods, "127.0.0.1", command=without_port(hook_command()))
    assert drained.returncode == 0, drained.stderr
    assert "safe to stop" in drained.stdout
    keys = asyncio.run(drains(pods.server.url, pods.discovery))
    assert keys == [f"v1.drain.{NAMESPACE}.{on_nats:x}"]
