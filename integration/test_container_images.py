"""The images of deploy/container/, built by build.sh from a registry-free base and run with podman.

Marked ``images`` (a step of its own in .ci/run: ``-m images``); skipped, saying so, only where
podman is not installed. Podman runs with the settings and image store of
integration/container-engine.sh (``$WORKERSET_ADMISSION_ENGINE_DIR``, default the checkout's
.containers/), so a base or wheels made once are reused. ``serve``'s embedded nats-server listens
on the loopback of its container, so the other containers of a test join that container's network
(and process) namespace, as a pod's containers share one; the only port published is the
frontend's, on 127.0.0.1. Every container a test starts is removed by its teardown, failed or not.

The recipes of deploy/kubernetes/ run as a kubelet runs them (integration/kubepod.py: one podman
pod per manifest, its commands, environment and emptyDir as written, Debian's catatonit as the
pause process) on a network of the test's own with NATS as the Service ``nats`` and ``bridge``
mirroring the workers' store: the worker-prestop.yaml pod (the worker image on the mocker) and a
frontend manifest's pod, which answers /v1/models and a chat completion through the view; the
worker's preStop hook then runs in its container. The systemd units' ExecStart lines run in the
tools image (the units' /opt/workerset-admission) with their Environment and EnvironmentFile,
as their User, serve's Type=notify readiness and watchdog arriving on a real notify socket. And
both frontend shapes are measured: requests lost when the process that writes the view is
killed and restarted.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import kubepod
import pytest
import systemdunit
from dynamofrontend import free_port
from dynamoview import MODEL_NAME, Frontend, wait_for

ROOT = Path(__file__).resolve().parents[1]
ENGINE_DIR = Path(os.environ.get("WORKERSET_ADMISSION_ENGINE_DIR") or ROOT / ".containers")
VERSION = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
TOOLS = "localhost/workerset-admission"
FRONTEND = "localhost/workerset-admission-frontend"
MOCKER = "localhost/workerset-admission-mocker"
WORKER = "localhost/workerset-admission-worker"
KUBERNETES = ROOT / "deploy" / "kubernetes"
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

# Long enough for the first test, which builds the images (about two minutes from nothing).
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
    for image in (TOOLS, FRONTEND, MOCKER, WORKER):
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


# --- The Kubernetes manifests' pods, run as a kubelet runs them (integration/kubepod.py) -------

# Where the recipes name an image, build.sh's image of the same name (the last path part).
BUILT = {image.rsplit("/", 1)[1] for image in (TOOLS, FRONTEND, WORKER)}
SECRETS = {
    "workerset-admission": {"password": "frontend-secret"},
    "workerset-admission-drain": {"password": "drain-secret"},
}
WORKER_NAMESPACE = "dgd-v1"
# The NATS server's users: the manifests' (their Secrets above) and the bridge's.
NATS_USERS = {
    "workerset-admission": SECRETS["workerset-admission"]["password"],
    "drain-dgd-v1": SECRETS["workerset-admission-drain"]["password"],
    "bridge": "bridge-secret",
}
MODEL_MOUNT = f"{ROOT / 'examples' / 'tiny-model'}:/model:ro"


def local_images(spec: dict[str, Any]) -> dict[str, str]:
    """Map each image a pod spec names to build.sh's image of that name and tag."""
    assert VERSION is not None
    found = {}
    for container in spec["containers"]:
        named = container["image"]
        name, tag = named.rsplit("/", 1)[1].split(":")
        assert name in BUILT, f"{named}: build.sh makes no image {name} (it makes {BUILT})"
        assert tag == VERSION.group(1), f"{named}: build.sh tags {VERSION.group(1)}"
        found[named] = f"localhost/{name}:{tag}"
    return found


@pytest.fixture(scope="module")
def pause_process() -> None:
    """Podman's pods need Debian's catatonit (the infra container's process)."""
    if shutil.which("catatonit") is not None or Path("/usr/libexec/podman/catatonit").exists():
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.skip("catatonit is not installed (apt-get install catatonit): podman has no pods")
    done = subprocess.run(
        "apt-get update -qq && DEBIAN_FRONTEND=noninteractive "
        "apt-get install -y -qq --no-install-recommends catatonit",
        shell=True, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"apt-get install catatonit: {done.stderr[-2000:]}"


@dataclass
class Cluster:
    """A network with what a cluster gives the pods: NATS (the Service ``nats``), and the
    workers' discovery store with ``bridge`` mirroring it into NATS."""

    root: Path
    network: str = field(default_factory=lambda: f"wa-deploy-{uuid.uuid4().hex[:8]}")
    running: Containers = field(default_factory=Containers)
    pods: list[kubepod.Pod] = field(default_factory=list)
    nats_ip: str = ""

    def start(self, bridge: bool = True) -> None:
        podman("network", "create", self.network)
        # Users and passwords: the manifests' secrets and the bridge's own, so a password the
        # pods resolve wrongly is refused.
        users = ", ".join(
            f'{{user: "{user}", password: "{password}"}}' for user, password in NATS_USERS.items()
        )
        (self.root / "nats.conf").write_text(f"authorization {{ users = [{users}] }}\n")
        nats = self.running.start(
            "nats", TOOLS, "-js", "-m", "8222", "-c", "/etc/nats.conf",
            options=(
                "--network", self.network, "--entrypoint", "nats-server",
                "-v", f"{self.root / 'nats.conf'}:/etc/nats.conf:ro",
            ),
        )  # fmt: skip
        self.nats_ip = podman(
            "inspect", "--format", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
            nats,
        ).stdout.strip()  # fmt: skip
        (self.root / "workers-kv").mkdir()
        if not bridge:
            return
        self.running.start(
            "bridge", TOOLS, "bridge", "--file-kv", "/workers",
            options=(
                "--network", self.network, "--add-host", f"nats:{self.nats_ip}",
                "-e", "WORKERSET_ADMISSION_NATS_SERVERS=nats://nats:4222",
                "-e", "WORKERSET_ADMISSION_NATS_USER=bridge",
                "-e", f"WORKERSET_ADMISSION_NATS_PASSWORD={NATS_USERS['bridge']}",
                "-v", f"{self.root / 'workers-kv'}:/workers",
            ),
        )  # fmt: skip

    def pod(self, manifest: str, suffix: str, **extras: kubepod.Extra) -> kubepod.Pod:
        name, spec = kubepod.load_pod_spec(KUBERNETES / manifest)
        pod = kubepod.Pod(
            podman, f"{self.running.prefix}-{name}-{suffix}", spec, local_images(spec),
            self.root / f"{name}-{suffix}", self.network, hosts={"nats": self.nats_ip},
            secrets=SECRETS, extras=extras,
        )  # fmt: skip
        self.pods.append(pod)
        return pod

    def frontend(self, manifest: str, suffix: str) -> tuple[kubepod.Pod, int]:
        """A frontend manifest's pod, started; the loopback port of its HTTP port.

        The model's folder is mounted where the worker's card names it, as a model cache
        volume would be: the frontend reads the tokenizer from it.
        """
        pod = self.pod(manifest, suffix, frontend=kubepod.Extra(mounts=(MODEL_MOUNT,)))
        (ports,) = [c["ports"] for c in pod.spec["containers"] if c.get("ports")]
        (http,) = [p["containerPort"] for p in ports]
        pod.start({http: free_port()})
        return pod, pod.published[http]

    @contextlib.contextmanager
    def explained(self) -> Iterator[None]:
        """Print every container's log when the block fails."""
        try:
            yield
        except BaseException:
            print(self.logs())
            raise

    def worker(self, suffix: str) -> kubepod.Pod:
        """A worker-prestop.yaml pod; the stand-in worker's own command and discovery store."""
        model = MODEL_MOUNT
        pod = self.pod(
            "worker-prestop.yaml", suffix,
            worker=kubepod.Extra(
                env={"DYN_FILE_KV": "/workers", "DYN_LOG": "warn"},
                mounts=(f"{self.root / 'workers-kv'}:/workers", model),
                args=(
                    "--model-path", "/model", "--model-name", MODEL_NAME,
                    "--endpoint", f"dyn://{WORKER_NAMESPACE}.backend.generate",
                    "--discovery-backend", "file", "--block-size", "16", "--speedup-ratio", "0",
                ),
            ),
        )  # fmt: skip
        (ports,) = [c.get("ports", []) for c in pod.spec["containers"]]
        pod.start({p["containerPort"]: free_port() for p in ports})
        return pod

    def logs(self) -> str:
        return "\n".join([self.running.logs(), *(pod.logs() for pod in self.pods)])

    def close(self) -> None:
        for pod in reversed(self.pods):
            pod.close()
        self.running.close()
        podman("network", "rm", "-f", self.network, check=False)


@pytest.fixture
def cluster(
    images: dict[str, dict[str, Any]], pause_process: None, tmp_path: Path
) -> Iterator[Cluster]:
    """NATS, and bridge mirroring the workers' store into it."""
    made = Cluster(tmp_path)
    try:
        with made.explained():
            made.start()
        yield made
    finally:
        made.close()


@pytest.fixture
def bare_cluster(
    images: dict[str, dict[str, Any]], pause_process: None, tmp_path: Path
) -> Iterator[Cluster]:
    """NATS and the workers' store, no bridge (a test starts its own)."""
    made = Cluster(tmp_path)
    try:
        with made.explained():
            made.start(bridge=False)
        yield made
    finally:
        made.close()


def instance_ids(store: Path) -> set[int]:
    """The workers' instance ids in a discovery store (the view or the workers' own)."""
    folder = store / "v1" / "instances"
    names = os.listdir(folder) if folder.exists() else []
    found = set()
    for name in names:
        parts = unquote(name).split("/")
        if parts[:3] == [WORKER_NAMESPACE, "backend", "generate"] and len(parts) == 4:
            found.add(int(parts[3], 16))
    return found


def ask_frontend(port: int, *pods: kubepod.Pod) -> tuple[list[str], Any]:
    """GET /v1/models, then one chat completion through the frontend's published port; fail at
    once when a container of ``pods`` exits meanwhile."""
    import openai

    client = openai.OpenAI(
        base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=20
    )
    frontend = Frontend(port, None, client)  # type: ignore[arg-type]

    def serving() -> bool:
        gone = [name for pod in pods for name in pod.exited()]
        assert not gone, f"exited: {gone}"
        return MODEL_NAME in frontend.models()

    wait_for(serving, 240, "the frontend serves the model")
    return frontend.models(), frontend.ask()


@pytest.mark.parametrize("manifest", ["frontend-with-plugin.yaml", "frontend-with-serve.yaml"])
def test_a_frontend_manifests_pod_serves_a_worker_pod_through_the_view(
    cluster: Cluster, manifest: str
) -> None:
    """The manifest's pod as written, with build.sh's images: /v1/models, then a chat
    completion answered by the worker-prestop.yaml pod, whose preStop hook then runs."""
    with cluster.explained():
        worker = cluster.worker("a")
        workers_kv = cluster.root / "workers-kv"
        wait_for(lambda: instance_ids(workers_kv), 180, "the worker pod registers")
        frontend, port = cluster.frontend(manifest, "a")
        models, served = ask_frontend(port, frontend, worker)
        assert models == [MODEL_NAME]
        (instance,) = instance_ids(workers_kv)
        assert served.decode == instance
        views_and_hooks(frontend, port, worker, instance)


def views_and_hooks(frontend: kubepod.Pod, port: int, worker: kubepod.Pod, instance: int) -> None:
    # The pod's identity reached the plugin's settings as the kubelet expands them.
    for env in frontend.envs.values():
        if "WORKERSET_ADMISSION_FRONTEND_ID" in env:
            assert env["WORKERSET_ADMISSION_FRONTEND_ID"] == frontend.name
            assert env["WORKERSET_ADMISSION_NATS_INBOX_PREFIX"] == f"_INBOX_{frontend.name}"
    # The frontend routes by the view (its DYN_FILE_KV), which holds the admitted worker.
    view = frontend.folder / "view"
    assert instance_ids(view) == {instance}
    # One writer owns the view: serve where it runs beside the frontend, else the frontend.
    names = {c["name"] for c in frontend.spec["containers"]}
    owner = "serve" if "serve" in names else "frontend"
    lock = (view / ".workerset-admission.lock").read_text()
    assert lock.strip() == f"pid 1 on {frontend.name}", lock
    if owner == "serve":
        assert frontend.probe("serve") == 200
        # The frontend here is Dynamo alone: the image's route extension is off.
        with pytest.raises(urllib.error.HTTPError) as missing:
            workersets(port)
        missing.value.close()
        assert missing.value.code == 404
    else:
        (group,) = workersets(port)["workersets"]
        assert (group["status"], group["admitted"]) == ("ready", [instance])
    # The worker's preStop hook as the kubelet runs it: this worker is the model's last
    # routable one on a live frontend, so the drain refuses (6) and withdraws nothing.
    hook = worker.pre_stop("worker")
    assert hook.returncode == 6, hook.stdout + hook.stderr
    assert "last" in hook.stderr, hook.stderr
    assert frontend_asks_again(port) == instance


def frontend_asks_again(port: int) -> int | None:
    _, served = ask_frontend(port)
    decode: int | None = served.decode
    return decode


# --- The systemd units, run as systemd runs them (integration/systemdunit.py) -----------------

UNITS = ROOT / "deploy" / "systemd"
# The units' install: the tools image holds the package in the virtual environment the units'
# comment asks for, /opt/workerset-admission. The unit's User= (dynamo) is a user of uid 1000.
UNIT_USER = "1000:1000"


def unit_container(
    cluster: Cluster,
    name: str,
    etc: Path,
    srv: Path,
    notify: Path | None,
) -> tuple[str, systemdunit.Unit]:
    """Start a unit's ExecStart as its main process, in the tools image on the cluster."""
    unit = systemdunit.read_unit(UNITS / f"workerset-admission-{name}.service")
    argv = unit.argv
    assert argv[0] == "/opt/workerset-admission/bin/workerset-admission", argv
    env = unit.environment(root=etc.parent.parent)
    options = [
        "--network", cluster.network, "--add-host", f"nats:{cluster.nats_ip}",
        "--user", UNIT_USER, "--entrypoint", argv[0],
        "--stop-signal", unit.one("KillSignal"), "--stop-timeout", unit.one("TimeoutStopSec"),
        "-v", f"{etc}:/etc/workerset-admission:ro", "-v", f"{srv}:/srv/dynamo",
        "-v", f"{cluster.root / 'workers-kv'}:/srv/dynamo/workers-kv",
        *(f"--env={key}={value}" for key, value in env.items()),
    ]  # fmt: skip
    if notify is not None:
        options += [
            "-v",
            f"{notify.parent}:/run/notify",
            f"--env=NOTIFY_SOCKET=/run/notify/{notify.name}",
        ]
    container = cluster.running.start(name, TOOLS, *argv[1:], options=tuple(options))
    return container, unit


def test_the_systemd_units_run_as_written_and_serve_a_frontend_through_the_view(
    bare_cluster: Cluster, tmp_path: Path
) -> None:
    """bridge and serve from their units' ExecStart, Environment and EnvironmentFile, as the
    user the units name; serve's Type=notify readiness and watchdog pings on a real notify
    socket, from its main process; an unmodified frontend on the view serves the worker pod."""
    cluster = bare_cluster
    # The host's files, as the units' comment asks for them: the sample settings (the NATS
    # server changed to the cluster's), a secrets file, the two stores.
    etc = tmp_path / "host" / "etc" / "workerset-admission"
    etc.mkdir(parents=True)
    settings = (ROOT / "examples" / "settings.toml").read_text()
    assert 'servers = ["nats://127.0.0.1:4222"]' in settings
    (etc / "settings.toml").write_text(
        settings.replace("nats://127.0.0.1:4222", "nats://nats:4222")
    )
    (etc / "env").write_text(
        "WORKERSET_ADMISSION_NATS_USER=workerset-admission\n"
        f"WORKERSET_ADMISSION_NATS_PASSWORD={NATS_USERS['workerset-admission']}\n"
    )
    (etc / "env").chmod(0o600)
    srv = tmp_path / "host" / "srv" / "dynamo"
    (srv / "view-kv").mkdir(parents=True)
    srv.chmod(0o777)
    (srv / "view-kv").chmod(0o777)
    # The workers' store (mounted at /srv/dynamo/workers-kv) is the one the worker pod writes.
    (cluster.root / "workers-kv").chmod(0o777)
    notify_dir = tmp_path / "notify"
    notify_dir.mkdir()
    notify_dir.chmod(0o777)
    sockets = {
        name: systemdunit.NotifySocket(notify_dir / f"{name}.sock") for name in ("bridge", "serve")
    }
    try:
        with cluster.explained():
            units_and_frontend(cluster, etc, srv, sockets)
    finally:
        for notify in sockets.values():
            notify.close()


def notified(container: str, unit: systemdunit.Unit, notify: systemdunit.NotifySocket) -> None:
    """A Type=notify unit's READY=1, then watchdog pings well within WatchdogSec, all from its
    main process (NotifyAccess=main)."""
    watchdog = float(unit.one("WatchdogSec"))
    main_pid = int(podman("inspect", "--format", "{{.State.Pid}}", container).stdout)

    def ready_or_gone() -> bool:
        state = podman("inspect", "--format", "{{.State.Running}}", container).stdout.strip()
        return bool(notify.times("READY=1")) or state != "true"

    notify.receive(time.monotonic() + 60, stop=ready_or_gone)
    ready = notify.times("READY=1")
    assert ready, f"{unit.path.name}: no READY=1 within 60 s: {notify.messages}"
    notify.receive(time.monotonic() + 5)
    pings = [at for at, _ in notify.times("WATCHDOG=1") if at >= ready[0][0]]
    assert len(pings) >= 3, notify.messages
    gaps = [b - a for a, b in zip([ready[0][0], *pings], pings, strict=False)]
    assert max(gaps) < watchdog / 2, gaps
    assert unit.one("NotifyAccess") == "main"
    assert {pid for _, pid, _ in notify.messages} == {main_pid}


def units_and_frontend(
    cluster: Cluster, etc: Path, srv: Path, sockets: dict[str, systemdunit.NotifySocket]
) -> None:
    started = {}
    for name in ("bridge", "serve"):
        unit = systemdunit.read_unit(UNITS / f"workerset-admission-{name}.service")
        notify = sockets[name] if unit.one("Type") == "notify" else None
        started[name] = (*unit_container(cluster, name, etc, srv, notify and notify.path), notify)
    # serve says it is ready and beats (and so does any other unit of Type=notify).
    assert started["serve"][1].one("Type") == "notify"
    for container, unit, notify in started.values():
        if notify is not None:
            notified(container, unit, notify)
    serve, unit, _ = started["serve"]
    # A worker pod registers in the workers' store; an unmodified frontend (the frontend
    # image with its plugin off) reads the view serve writes at /srv/dynamo/view-kv.
    cluster.worker("u")
    workers_kv = cluster.root / "workers-kv"
    wait_for(lambda: instance_ids(workers_kv), 180, "the worker pod registers")
    port = free_port()
    cluster.running.start(
        "frontend", FRONTEND,
        options=(
            "--network", cluster.network, "-p", f"127.0.0.1:{port}:8000",
            "-e", "DYN_FRONTEND_ROUTE_EXTENSIONS=", "-e", "WORKERSET_ADMISSION_VIEW_DIR=",
            "-v", f"{srv / 'view-kv'}:/view", "-v", MODEL_MOUNT,
        ),
    )  # fmt: skip
    models, served = ask_frontend(port)
    (instance,) = instance_ids(workers_kv)
    assert (models, served.decode) == ([MODEL_NAME], instance)
    assert instance_ids(srv / "view-kv") == {instance}
    # KillSignal=SIGTERM stops serve cleanly within TimeoutStopSec.
    stop_started = time.monotonic()
    podman("stop", "-t", unit.one("TimeoutStopSec"), serve)
    assert time.monotonic() - stop_started < float(unit.one("TimeoutStopSec"))
    code = podman("inspect", "--format", "{{.State.ExitCode}}", serve).stdout.strip()
    assert code == "0", podman("logs", serve).stderr[-2000:]


# --- The two shapes measured: what a killed admission process costs through the frontend -------


@dataclass
class Paced:
    """Chat completions at ``rate`` a second on one frontend, each outcome kept with its time."""

    port: int
    rate: float = 5.0
    outcomes: list[tuple[float, bool]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        import openai

        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{self.port}/v1", api_key="unused", max_retries=0, timeout=5
        )
        frontend = Frontend(self.port, None, client)  # type: ignore[arg-type]
        next_at = time.monotonic()
        while not self._stop.is_set():
            try:
                frontend.ask()
                ok = True
            except (openai.OpenAIError, OSError):
                ok = False
            self.outcomes.append((time.monotonic(), ok))
            next_at += 1 / self.rate
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def stop(self) -> None:
        self._stop.set()

    def between(self, start: float, end: float) -> tuple[int, int, float]:
        """Requests, failed requests, and seconds from the first failure to the next success."""
        window = [(at, ok) for at, ok in self.outcomes if start <= at < end]
        failed = [at for at, ok in window if not ok]
        outage = 0.0
        if failed:
            back = [at for at, ok in window if ok and at > failed[0]]
            outage = (back[0] if back else end) - failed[0]
        return len(window), len(failed), outage


def resident_mb(container: str) -> int:
    """The resident memory of every process in a container, in MB."""
    rows = podman("top", container, "rss").stdout.split()[1:]
    return sum(int(rss) for rss in rows) // 1000


def kill_and_restart(container: str) -> None:
    """SIGKILL a container's process, then start it again, as a kubelet restarts it."""
    podman("kill", "-s", "KILL", container)
    podman("wait", container, timeout=30)
    podman("start", container)


@pytest.mark.parametrize("manifest", ["frontend-with-plugin.yaml", "frontend-with-serve.yaml"])
def test_what_a_killed_admission_process_costs_in_each_shape(
    cluster: Cluster, manifest: str
) -> None:
    """Requests at 5 a second through the pod's frontend while the process that writes the
    view is killed and restarted: serve beside the frontend, or the frontend itself where the
    plugin runs inside it; for serve's shape the frontend is killed too, for comparison."""
    with cluster.explained():
        cluster.worker("m")
        workers_kv = cluster.root / "workers-kv"
        wait_for(lambda: instance_ids(workers_kv), 180, "the worker pod registers")
        frontend, port = cluster.frontend(manifest, "m")
        ask_frontend(port, frontend)
        names = {c["name"] for c in frontend.spec["containers"]}
        writer = "serve" if "serve" in names else "frontend"
        victims = [writer] + (["frontend"] if writer == "serve" else [])
        traffic = Paced(port)
        thread = threading.Thread(target=traffic.run, daemon=True)
        thread.start()
        windows = []
        try:
            time.sleep(5)
            for victim in victims:
                started = time.monotonic()
                kill_and_restart(frontend.container_name(victim))
                # The restarted frontend serves again before the window ends (checked below).
                time.sleep(40)
                windows.append((victim, started, time.monotonic()))
        finally:
            traffic.stop()
            thread.join(30)
        memory = ", ".join(
            f"{name} {resident_mb(frontend.container_name(name))} MB" for name in sorted(names)
        )
        before = traffic.between(0, windows[0][1])
        print(f"{manifest}: before any kill: {before[0]} requests, {before[1]} failed")
        print(f"{manifest}: memory: {memory}")
        results = {}
        for victim, start, end in windows:
            total, failed, outage = traffic.between(start, end)
            results[victim] = (total, failed, outage)
            print(
                f"{manifest}: {victim} killed and restarted: {failed} of {total} requests "
                f"failed, {outage:.1f} s from the first failure to the next success"
            )
        assert before[1] == 0
        for victim, _, end in windows:
            # Served again within the window: the last requests of each window succeeded.
            assert traffic.between(end - 5, end)[1] == 0, (victim, traffic.outcomes[-30:])
        if writer == "serve":
            # The view fails static: the frontend never notices serve's death.
            assert results["serve"][1] == 0, results
        else:
            # The plugin shares the frontend's fate: its death is the frontend's.
            assert results["frontend"][1] > 0, results
