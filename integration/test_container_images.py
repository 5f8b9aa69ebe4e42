"""The images of deploy/container/, built by build.sh from a registry-free base and run with podman.

Marked ``images`` (a step of its own in .ci/run: ``-m images``); skipped, saying so, only where
podman is not installed. Podman runs with the settings and image store of
integration/container-engine.sh (``$WORKERSET_ADMISSION_ENGINE_DIR``, default the checkout's
.containers/), so a base or wheels made once are reused. ``serve``'s embedded nats-server listens
on the loopback of its container, so the other containers of a test join that container's network
(and process) namespace, as a pod's containers share one; the only port published is the
frontend's, on 127.0.0.1. Every container a test starts is removed by its teardown, failed or not.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from dynamofrontend import free_port
from dynamoview import MODEL_NAME, Frontend, wait_for

ROOT = Path(__file__).resolve().parents[1]
ENGINE_DIR = Path(os.environ.get("WORKERSET_ADMISSION_ENGINE_DIR") or ROOT / ".containers")
VERSION = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
TOOLS = "localhost/workerset-admission"
FRONTEND = "localhost/workerset-admission-frontend"
SERVE_FILE = "/run/workerset-admission/serve.json"
# Dynamo's listeners on the shared loopback; NATS (serve's embedded server) as its event plane.
DYNAMO_LOOPBACK = {
    "DYN_TCP_RPC_HOST": "127.0.0.1",
    "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1",
    "DYN_EVENT_PLANE_HOST": "127.0.0.1",
    "DYN_SELF_HOST_METADATA": "0",
    "DYN_EVENT_PLANE": "nats",
    "DYN_LOG": "warn",
}

if shutil.which("podman") is None:
    pytest.skip(
        "podman is not installed: the container images are not built "
        "(apt-get install podman runc, see the README's container section)",
        allow_module_level=True,
    )

# Long enough for the first test, which builds both images (about two minutes from nothing).
pytestmark = [pytest.mark.images, pytest.mark.timeout(1800)]


def podman(
    *args: str, timeout: float = 120, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run podman with the engine folder's settings and image store."""
    env = os.environ | {
        "CONTAINERS_CONF": str(ENGINE_DIR / "containers.conf"),
        "CONTAINERS_STORAGE_CONF": str(ENGINE_DIR / "storage.conf"),
    }
    done = subprocess.run(
        ["podman", *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and done.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)}: {done.returncode}: {done.stderr[-2000:]}")
    return done


@dataclass
class Containers:
    """The containers of one test, all removed by :meth:`close`; logs kept for a failure."""

    prefix: str = field(default_factory=lambda: f"wa-images-{uuid.uuid4().hex[:8]}")
    names: list[str] = field(default_factory=list)

    def start(
        self,
        role: str,
        image: str,
        *args: str,
        join: str | None = None,
        options: tuple[str, ...] = (),
    ) -> str:
        """Start a detached container; ``join`` shares that one's network and processes."""
        name = f"{self.prefix}-{role}"
        self.names.append(name)
        joined = ("--network", f"container:{join}", "--pid", f"container:{join}") if join else ()
        podman("run", "-d", "--name", name, *joined, *options, image, *args)
        return name

    def logs(self) -> str:
        told = {name: podman("logs", name, check=False) for name in self.names}
        return "\n".join(
            f"--- {name}\n{done.stdout[-1500:]}{done.stderr[-3000:]}" for name, done in told.items()
        )

    def close(self) -> None:
        # The joined ones first: the one they join cannot go while they use its namespaces.
        for name in reversed(self.names):
            podman("rm", "-f", "-t", "0", name, check=False)
        left = podman("ps", "-a", "-q", "--filter", f"name={self.prefix}", check=False)
        assert not left.stdout.strip(), f"containers left behind: {left.stdout}"


@contextlib.contextmanager
def containers() -> Iterator[Containers]:
    running = Containers()
    try:
        yield running
    except BaseException:
        print(running.logs())
        raise
    finally:
        running.close()


def announced(run_dir: Path, serve: str) -> dict[str, Any]:
    """Wait for serve's announcement of its embedded server (the folder is its run folder)."""
    path = run_dir / Path(SERVE_FILE).name

    def found() -> dict[str, Any] | None:
        state = podman("inspect", "--format", "{{.State.Running}}", serve, check=False)
        assert state.stdout.strip() == "true", f"serve stopped: {podman('logs', serve).stderr}"
        with contextlib.suppress(OSError, ValueError):
            body: dict[str, Any] = json.loads(path.read_text())
            return body
        return None

    result: dict[str, Any] = wait_for(found, 60, "serve announces its embedded nats-server")
    return result


def serve_options(run_dir: Path, *more: str) -> tuple[str, ...]:
    """Options of a container that finds serve's embedded server through its announcement."""
    folder = f"{run_dir}:{Path(SERVE_FILE).parent}"
    return ("-v", folder, "-e", f"WORKERSET_ADMISSION_SERVE_FILE={SERVE_FILE}", *more)


@pytest.fixture(scope="module")
def images() -> dict[str, dict[str, Any]]:
    """Build both images with build.sh (reusing what an earlier build made); inspect them."""
    assert VERSION is not None
    done = subprocess.run(
        ["bash", str(ROOT / "deploy" / "container" / "build.sh")],
        env=os.environ | {"PYTHON": sys.executable, "ENGINE_DIR": str(ENGINE_DIR)},
        capture_output=True,
        text=True,
        timeout=1500,
        check=False,
    )
    # The build times and sizes, for the log (.ci/run shows passed tests' output).
    print(done.stderr)
    assert done.returncode == 0, done.stderr[-3000:]
    found = {}
    for image in (TOOLS, FRONTEND):
        (found[image],) = json.loads(
            podman("image", "inspect", f"{image}:{VERSION.group(1)}").stdout
        )
    return found


def test_both_images_build_from_the_local_base_and_run_their_commands(
    images: dict[str, dict[str, Any]],
) -> None:
    assert VERSION is not None
    tools, frontend = images[TOOLS], images[FRONTEND]
    assert tools["Config"]["Entrypoint"] == ["workerset-admission"]
    assert frontend["Config"]["Entrypoint"][:3] == ["python", "-m", "dynamo.frontend"]
    version = podman("run", "--rm", "--network=none", TOOLS, "--version").stdout
    assert version.strip() == f"workerset-admission {VERSION.group(1)}"
    # The frontend image holds Dynamo 1.6.1, its mocker and the plugin's route extension.
    probe = (
        "from importlib import metadata; import dynamo.frontend.main, dynamo.mocker; "
        "from dynamo.frontend.main import load_frontend_route_extensions as load; "
        "print(metadata.version('ai-dynamo'), len(load(['workerset-admission'])))"
    )
    loaded = podman(
        "run", "--rm", "--network=none", "--entrypoint", "python", FRONTEND, "-c", probe
    ).stdout.split()
    assert loaded[0] == "1.6.1"
    assert int(loaded[1]) >= 1


def test_serve_with_its_embedded_nats_answers_status_from_a_second_container(
    images: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with containers() as running:
        serve = running.start("serve", TOOLS, "serve", options=serve_options(run_dir))
        url = announced(run_dir, serve)["url"]
        assert url.startswith("nats://127.0.0.1:")
        status = podman(
            "run", "--rm", "--network", f"container:{serve}", "--pid", f"container:{serve}",
            *serve_options(run_dir), TOOLS, "status", "--json",
        )  # fmt: skip
        answer = json.loads(status.stdout)
        # The answer comes from that serve: its frontend id is its host name and its process id
        # (1, the container's first process).
        assert answer["frontend"] == f"{hostname(serve)}-1"
        assert (answer["health"], answer["synced"], answer["groups"]) == ("healthy", True, [])


@pytest.mark.parametrize("writer", ["serve", "frontend"])
def test_the_frontend_image_serves_a_mocker_through_the_admitted_view(
    images: dict[str, dict[str, Any]], tmp_path: Path, writer: str
) -> None:
    """The view is written by ``serve`` in the tools image, or by the frontend's own plugin."""
    run_dir, workers, view = tmp_path / "run", tmp_path / "workers-kv", tmp_path / "view-kv"
    for folder in (run_dir, workers, view):
        folder.mkdir()
    port = free_port()
    model = ("-v", f"{ROOT / 'examples' / 'tiny-model'}:/model:ro")
    serve_writes = writer == "serve"
    with containers() as running:
        # serve holds the network namespace, so it publishes the frontend's port (loopback only).
        serve = running.start(
            "serve", TOOLS, "serve", *(("--view-dir", "/view") if serve_writes else ()),
            options=serve_options(run_dir, "-v", f"{view}:/view", "-p", f"127.0.0.1:{port}:8000"),
        )  # fmt: skip
        url = announced(run_dir, serve)["url"]
        dynamo = tuple(
            f"--env={name}={value}"
            for name, value in (DYNAMO_LOOPBACK | {"NATS_SERVER": url}).items()
        )
        running.start(
            "bridge", TOOLS, "bridge", "--file-kv", "/workers", join=serve,
            options=serve_options(run_dir, "-v", f"{workers}:/workers"),
        )  # fmt: skip
        running.start(
            "mocker", FRONTEND, "-m", "dynamo.mocker", "--model-path", "/model",
            "--model-name", MODEL_NAME, "--endpoint", "dyn://prod.backend.generate",
            "--discovery-backend", "file", "--block-size", "16", "--speedup-ratio", "0",
            join=serve,
            options=(
                "--entrypoint", "python", "-e", "DYN_FILE_KV=/workers",
                "-v", f"{workers}:/workers", *model, *dynamo,
            ),
        )  # fmt: skip
        # Beside a serve that writes the view, the plugin in the frontend only observes.
        frontend_name = running.start(
            "frontend", FRONTEND, join=serve,
            options=(
                *(("--unsetenv", "WORKERSET_ADMISSION_VIEW_DIR") if serve_writes else ()),
                "-e", f"WORKERSET_ADMISSION_NATS_SERVERS={url}",
                "-v", f"{view}:/view", *model, *dynamo,
            ),
        )  # fmt: skip
        import openai

        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=20
        )
        # The frontend runs in a container: no local process to hold.
        frontend = Frontend(port, None, client)  # type: ignore[arg-type]
        wait_for(lambda: MODEL_NAME in frontend.models(), 180, "the frontend serves the model")
        served = frontend.ask()
        (group,) = workersets(port)["workersets"]
        assert served.decode is not None
        # The plugin in the frontend agrees: the worker that answered is the one admitted.
        assert (group["status"], group["admitted"]) == ("ready", [served.decode])
        # The files the frontend routes by hold the admitted worker's instance record, and the
        # view's lock names the container that wrote them.
        records = [p.name for p in (view / "v1" / "instances").iterdir()]
        assert any(name.endswith(f"{served.decode:x}") for name in records), records
        owner = serve if serve_writes else frontend_name
        lock = (view / ".workerset-admission.lock").read_text()
        assert re.fullmatch(rf"pid \d+ on {hostname(owner)}", lock.strip()), lock


def hostname(container: str) -> str:
    return podman("inspect", "--format", "{{.Config.Hostname}}", container).stdout.strip()


def workersets(port: int) -> dict[str, Any]:
    """The route extension's answer in the frontend container."""
    address = f"http://127.0.0.1:{port}/workerset-admission/v1/workersets"
    with urllib.request.urlopen(address, timeout=10) as reply:
        body: dict[str, Any] = json.loads(reply.read())
    return body
