"""A whole Dynamo deployment on loopback for the admitted-view tests and benchmark.

Real processes only: ``python -m dynamo.mocker`` workers on their own file store, the
``workerset-admission bridge`` mirroring that store into the NATS bucket, ``workerset-admission
serve --view-dir`` writing the admitted view, and ``python -m dynamo.frontend`` on the view
(``--discovery-backend file``, ``DYN_FILE_KV`` = the view). Every Dynamo process uses the test's
nats-server as its event plane (or ``event_plane_url``, another one), so no Dynamo socket
listens beyond loopback; ``event_plane="zmq"`` (Dynamo's default) binds every interface and
belongs in a network namespace with only loopback. Requests go through the OpenAI HTTP API with
the ``openai`` client; the serving worker is read from ``nvext.worker_id``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from dynamofrontend import free_port

__all__ = ["Deployment", "Served", "Traffic", "wait_for"]

MODEL_NAME = "tiny"


def wait_for(condition: Callable[[], Any], seconds: float, what: str, every: float = 0.2) -> Any:
    """Poll ``condition`` until it returns something truthy; fail naming ``what``."""
    deadline = time.monotonic() + seconds
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {seconds:g} s")
        time.sleep(every)


@dataclass(frozen=True)
class Served:
    """Who served one request (``None`` for a hop the request did not use)."""

    decode: int | None
    prefill: int | None


@dataclass
class Frontend:
    port: int
    process: subprocess.Popen[bytes]
    client: Any

    def models(self) -> list[str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/v1/models", timeout=5) as r:
                body = json.loads(r.read())
        except OSError:
            return []
        return [m["id"] for m in body.get("data", [])]

    def ask(
        self, model: str = MODEL_NAME, *, chat: bool = True, tokens: int | None = None
    ) -> Served:
        """Send one request; raise whatever the client raises when it fails.

        ``tokens`` asks for exactly that many output tokens (end of sequence ignored), for a
        request that stays in flight a while on a worker that takes its time.
        """
        extra: dict[str, Any] = {"nvext": {"extra_fields": ["worker_id"]}}
        if tokens is not None:
            extra["ignore_eos"] = True
        max_tokens = 2 if tokens is None else tokens
        if chat:
            reply: Any = self.client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": "a b a"}],
                max_tokens=max_tokens,
                extra_body=extra,
            )
        else:
            reply = self.client.completions.create(
                model=model, prompt="a b a", max_tokens=max_tokens, extra_body=extra
            )
        ids = ((reply.model_extra or {}).get("nvext") or {}).get("worker_id") or {}
        return Served(ids.get("decode_worker_id"), ids.get("prefill_worker_id"))


class Traffic:
    """Requests in a loop on one frontend, each outcome kept in order."""

    def __init__(self, frontend: Frontend) -> None:
        self.frontend = frontend
        self.outcomes: list[tuple[float, int | None]] = []  # (time, decode worker or None)
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        turn = 0
        while not self._stop.is_set():
            try:
                decode = self.frontend.ask(chat=turn % 2 == 0).decode
            except Exception as exc:
                decode = None
                self.errors.append(f"{time.monotonic():.3f} {exc}"[:300])
                time.sleep(0.01)  # a refused request comes back at once
            self.outcomes.append((time.monotonic(), decode))
            turn += 1

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)


@dataclass
class Deployment:
    """The processes of one test module, under ``root``; :meth:`close` stops every one."""

    root: Path
    nats_url: str
    bucket: str
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    workers: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)
    sidecar: subprocess.Popen[bytes] | None = None
    bridge: subprocess.Popen[bytes] | None = None
    status_subject: str = "workerset-admission.status.view-test"
    # Dynamo's own event plane: ``nats`` on ``event_plane_url``, the plugin's server
    # (``nats_url``) when not given (a test that stops the plugin's server gives Dynamo another
    # one, so only discovery sees the outage); or ``zmq``, Dynamo's default.
    event_plane: str = "nats"
    event_plane_url: str | None = None
    # How often the bridge scans the workers' store.
    bridge_interval: float = 0.1
    # The Python whose Dynamo runs the frontends and the mocker workers (another release's
    # environment, such as the 1.7 tier's), and arguments every ``serve`` sidecar gets.
    dynamo_python: str = sys.executable
    sidecar_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self.store = self.root / "workers-kv"
        self.view = self.root / "view-kv"
        self.logs = self.root / "logs"
        for directory in (self.store, self.view, self.logs, self.root / "tmp", self.root / "home"):
            directory.mkdir(parents=True, exist_ok=True)
        from support.workers import write_model_dir

        self.model_dir = write_model_dir(self.root / "model")

    # -- environments ------------------------------------------------------------------------

    def dynamo_env(self, file_kv: Path) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DYN_", "WORKERSET_"))}
        env.update(
            {
                "DYN_FILE_KV": str(file_kv),
                "TMPDIR": str(self.root / "tmp"),
                "HOME": str(self.root / "home"),
                "DYN_TCP_RPC_HOST": "127.0.0.1",
                "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1",
                "DYN_EVENT_PLANE_HOST": "127.0.0.1",
                "DYN_SELF_HOST_METADATA": "0",
                "DYN_EVENT_PLANE": self.event_plane,
                "NATS_SERVER": self.event_plane_url or self.nats_url,
                "DYN_LOG": "warn",
                # A failed request would otherwise print a whole backtrace.
                "RUST_BACKTRACE": "0",
            }
        )
        return env

    def _start(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        with (self.logs / f"{name}.log").open("ab") as log:
            process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.processes.append(process)
        return process

    def _cli(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "workerset_admission.cli", *args]

    # -- the pieces --------------------------------------------------------------------------

    def start_bridge(self) -> None:
        self.bridge = self._start(
            "bridge",
            self._cli(
                "bridge",
                "--file-kv",
                str(self.store),
                "--interval",
                str(self.bridge_interval),
                "--nats-server",
                self.nats_url,
                "--discovery-bucket",
                self.bucket,
            ),
            self.dynamo_env(self.store),
        )

    def start_sidecar(self, *extra: str) -> None:
        """Run ``workerset-admission serve --view-dir`` (again, after :meth:`kill_sidecar`).

        ``extra`` arguments go after the deployment's own (``--view-horizon 10``, say).
        """
        env = self.dynamo_env(self.view)
        env["WORKERSET_ADMISSION_SERVE_FILE"] = str(self.root / "serve.json")
        self.sidecar = self._start(
            "sidecar",
            self._cli(
                "serve",
                "--view-dir",
                str(self.view),
                "--nats-server",
                self.nats_url,
                "--discovery-bucket",
                self.bucket,
                "--admission-bucket",
                f"{self.bucket}-adm",
                "--status-subject",
                self.status_subject,
                "--frontend-id",
                "view-sidecar",
                *self.sidecar_args,
                *extra,
            ),
            env,
        )

    def kill_sidecar(self) -> None:
        """SIGKILL: the plugin dies without withdrawing anything."""
        assert self.sidecar is not None
        self.sidecar.send_signal(signal.SIGKILL)
        self.sidecar.wait(10)

    def extension_env(self, view: Path, subject: str) -> dict[str, str]:
        """Settings for the plugin inside a frontend: its own view, the shared bucket."""
        return {
            "WORKERSET_ADMISSION_NATS_SERVERS": self.nats_url,
            "WORKERSET_ADMISSION_DISCOVERY_BUCKET": self.bucket,
            "WORKERSET_ADMISSION_ADMISSION_BUCKET": f"{self.bucket}-adm",
            "WORKERSET_ADMISSION_STATUS_SUBJECT": subject,
            "WORKERSET_ADMISSION_FRONTEND_ID": subject,
            "WORKERSET_ADMISSION_VIEW_DIR": str(view),
        }

    def start_frontend(
        self,
        name: str,
        *extra: str,
        view: Path | None = None,
        env: dict[str, str] | None = None,
        wait: bool = True,
    ) -> Frontend:
        import openai

        port = free_port()
        process = self._start(
            name,
            [
                self.dynamo_python,
                "-m",
                "dynamo.frontend",
                "--discovery-backend",
                "file",
                "--http-host",
                "127.0.0.1",
                "--http-port",
                str(port),
                *extra,
            ],
            self.dynamo_env(view or self.view) | (env or {}),
        )
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=20
        )
        frontend = Frontend(port, process, client)
        if not wait:
            return frontend

        def live() -> bool:
            assert process.poll() is None, f"frontend {name} exited; see {self.logs}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/live", timeout=2):
                    return True
            except OSError:
                return False

        wait_for(live, 60, f"frontend {name} answers /live")
        return frontend

    def instance_ids(self, namespace: str, component: str) -> set[int]:
        """Instance ids with a ``generate`` endpoint record in the workers' store."""
        found = set()
        with contextlib.suppress(FileNotFoundError):
            for name in os.listdir(self.store / "v1" / "instances"):
                parts = unquote(name).split("/")
                if parts[:3] == [namespace, component, "generate"] and len(parts) == 4:
                    found.add(int(parts[3], 16))
        return found

    def start_worker(
        self,
        name: str,
        *,
        namespace: str = "viewns",
        model: str = MODEL_NAME,
        block_size: int = 16,
        mode: str | None = None,
        speedup: float = 0.0,
    ) -> int:
        """Start one mocker and return its instance id once it registered.

        ``speedup`` is the mocker's ``--speedup-ratio``: 0 answers at once, 1 takes as long as
        the simulated engine would.
        """
        component = "prefill" if mode == "prefill" else "backend"
        before = self.instance_ids(namespace, component)
        argv = [
            self.dynamo_python,
            "-m",
            "dynamo.mocker",
            "--model-path",
            str(self.model_dir),
            "--model-name",
            model,
            "--endpoint",
            f"dyn://{namespace}.{component}.generate",
            "--discovery-backend",
            "file",
            "--kv-bytes-per-token",
            "1024",
            "--speedup-ratio",
            f"{speedup:g}",
            "--block-size",
            str(block_size),
        ]
        if mode is not None:
            argv += ["--disaggregation-mode", mode]
        process = self._start(name, argv, self.dynamo_env(self.store))

        def registered() -> set[int]:
            assert process.poll() is None, f"worker {name} exited; see {self.logs}"
            return self.instance_ids(namespace, component) - before

        (instance_id,) = wait_for(registered, 90, f"worker {name} registers")
        self.workers[instance_id] = process
        return int(instance_id)

    def kill_worker(self, instance_id: int) -> None:
        """SIGKILL: the worker dies without deregistering; its files stay, unrefreshed."""
        process = self.workers.pop(instance_id)
        process.kill()
        process.wait(10)

    def stop_worker(self, instance_id: int) -> None:
        """SIGTERM: the worker deregisters (its files go at once) and exits."""
        process = self.workers.pop(instance_id)
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)

    def view_instance_ids(self, namespace: str = "viewns") -> set[int]:
        """Instance ids of a namespace with a model card in the view right now."""
        found = set()
        with contextlib.suppress(FileNotFoundError):
            for name in os.listdir(self.view / "v1" / "mdc"):
                parts = unquote(name).split("/")
                if not name.startswith(".") and parts[0] == namespace:
                    found.add(int(parts[3], 16))
        return found

    def status(self) -> dict[str, Any]:
        """Ask the sidecar for its admission state over NATS (``{}`` when it does not answer)."""

        async def ask() -> dict[str, Any]:
            import nats

            client = await nats.connect(self.nats_url)
            try:
                reply = await client.request(self.status_subject, b"", timeout=2)
            except Exception:
                return {}
            finally:
                await client.close()
            answer: dict[str, Any] = json.loads(reply.data)
            return answer

        return asyncio.run(ask())

    def rejected(self) -> set[int]:
        """Instance ids the sidecar holds in rejected cohorts."""
        out: set[int] = set()
        for group in self.status().get("groups", []):
            for cohort in group["cohorts"][1:]:
                out.update(cohort["members"])
        return out

    def close(self) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                process.terminate()
        deadline = time.monotonic() + 20
        for process in reversed(self.processes):
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(max(0.1, deadline - time.monotonic()))
            if process.poll() is None:
                process.kill()
                process.wait(5)


@contextlib.contextmanager
def deployment(
    root: Path, nats_url: str, bucket: str, event_plane_url: str | None = None
) -> Iterator[Deployment]:
    running = Deployment(root, nats_url, bucket, event_plane_url=event_plane_url)
    try:
        yield running
    finally:
        running.close()
