"""A Kubernetes manifest's pod, run with podman the way a kubelet runs it.

The pod template of a Deployment (or a bare Pod) becomes one podman pod: one network namespace
(an infra container, Debian's ``catatonit``), the manifest's containers in it, each with the
manifest's image, ``command`` and ``args`` (``$(VAR)`` expanded from the container's
environment, ``$$`` kept as ``$``), its environment in order (``$(VAR)`` expanded from the
variables before it; ``fieldRef`` to ``metadata.name`` and ``status.podIP``; ``secretKeyRef``
from the secrets the caller holds) and its ``emptyDir`` volumes (a folder of the caller's,
shared by the containers that mount it, as a pod's emptyDir is). Container ports are published
on 127.0.0.1 only. What a cluster would add around the pod, a Service's name (``nats``) and a
stand-in worker's own settings, the caller passes explicitly: it never rewrites the manifest.

A field the translation does not know fails loudly (:class:`UnknownField`), so a manifest that
gains one is not run as something else. Probes and lifecycle hooks are kept for the caller to
exercise (:meth:`Pod.probe`, :meth:`Pod.pre_stop`).
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

__all__ = ["Extra", "Pod", "UnknownField", "expand", "load_pod_spec", "resolve_env"]

# podman(*args, check=..., timeout=...) -> CompletedProcess: the caller's podman, with its store.
Podman = Callable[..., "subprocess.CompletedProcess[str]"]

POD_FIELDS = frozenset({"volumes", "containers", "terminationGracePeriodSeconds"})
CONTAINER_FIELDS = frozenset(
    {
        "name",
        "image",
        "command",
        "args",
        "env",
        "volumeMounts",
        "ports",
        "livenessProbe",
        "readinessProbe",
        "lifecycle",
    }
)
_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


class UnknownField(AssertionError):
    """The manifest has a field this translation does not run."""


def load_pod_spec(path: Path) -> tuple[str, dict[str, Any]]:
    """Return the workload's name and its pod spec (a Deployment's template, or a Pod's spec)."""
    manifest = yaml.safe_load(path.read_text())
    kind = manifest["kind"]
    if kind == "Deployment":
        spec: dict[str, Any] = manifest["spec"]["template"]["spec"]
    elif kind == "Pod":
        spec = manifest["spec"]
    else:
        raise UnknownField(f"{path.name}: kind {kind} is not a Deployment or a Pod")
    unknown = set(spec) - POD_FIELDS
    if unknown:
        raise UnknownField(f"{path.name}: pod fields not run here: {sorted(unknown)}")
    for container in spec["containers"]:
        unknown = set(container) - CONTAINER_FIELDS
        if unknown:
            raise UnknownField(f"{path.name}: {container['name']}: not run here: {sorted(unknown)}")
    for volume in spec.get("volumes", []):
        if set(volume) != {"name", "emptyDir"}:
            raise UnknownField(f"{path.name}: volume {volume['name']} is not an emptyDir")
    return str(manifest["metadata"]["name"]), spec


def expand(text: str, env: Mapping[str, str]) -> str:
    """Expand ``$(VAR)`` as the kubelet does: known names replaced, others kept, ``$$`` is ``$``."""

    def one(found: re.Match[str]) -> str:
        if found.group(0) == "$$":
            return "$"
        name = found.group(1)
        return env[name] if name in env else found.group(0)

    return _REFERENCE.sub(one, text)


def resolve_env(
    entries: Sequence[Mapping[str, Any]],
    fields: Mapping[str, str],
    secrets: Mapping[str, Mapping[str, str]],
) -> dict[str, str]:
    """A container's environment, in the manifest's order, as the kubelet gives it."""
    env: dict[str, str] = {}
    for entry in entries:
        name = entry["name"]
        if "value" in entry:
            env[name] = expand(str(entry["value"]), env)
            continue
        source = entry["valueFrom"]
        if "fieldRef" in source:
            path = source["fieldRef"]["fieldPath"]
            if path not in fields:
                raise UnknownField(f"env {name}: fieldRef {path} is not given here")
            env[name] = fields[path]
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            env[name] = secrets[ref["name"]][ref["key"]]
        else:
            raise UnknownField(f"env {name}: valueFrom {sorted(source)} is not given here")
    return env


@dataclass(frozen=True)
class Extra:
    """What the cluster adds to one container beside the manifest, said out loud.

    ``args`` apply only where the manifest gives no command and no args (the image's own
    command then runs: a stand-in image's command is the caller's to choose); ``env`` may not
    name a variable the manifest sets.
    """

    env: Mapping[str, str] = field(default_factory=dict)
    mounts: Sequence[str] = ()
    args: Sequence[str] = ()


@dataclass
class Pod:
    """One manifest's pod in podman: created by :meth:`start`, removed by :meth:`close`."""

    podman: Podman
    name: str
    spec: dict[str, Any]
    images: Mapping[str, str]
    folder: Path
    network: str
    hosts: Mapping[str, str] = field(default_factory=dict)
    secrets: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    extras: Mapping[str, Extra] = field(default_factory=dict)
    published: dict[int, int] = field(default_factory=dict)
    envs: dict[str, dict[str, str]] = field(default_factory=dict)
    ip: str = ""

    def container(self, name: str) -> dict[str, Any]:
        (found,) = [c for c in self.spec["containers"] if c["name"] == name]
        return found

    def container_name(self, name: str) -> str:
        return f"{self.name}-{name}"

    def start(self, ports: Mapping[int, int]) -> None:
        """Create the pod (publishing ``ports``: container port to loopback port), then its
        containers in the manifest's order, each started at once as the kubelet starts them."""
        wanted = {p["containerPort"] for c in self.spec["containers"] for p in c.get("ports", [])}
        if set(ports) != wanted:
            raise AssertionError(f"ports to publish: {sorted(wanted)}, given {sorted(ports)}")
        self.published = dict(ports)
        publish = [f"--publish=127.0.0.1:{host}:{inside}" for inside, host in ports.items()]
        added = [f"--add-host={host}:{ip}" for host, ip in self.hosts.items()]
        self.podman(
            "pod", "create", "--name", self.name, "--hostname", self.name,
            "--network", self.network, *publish, *added,
        )  # fmt: skip
        self.podman("pod", "start", self.name)
        infra = self.podman("pod", "inspect", "--format", "{{.InfraContainerID}}", self.name)
        self.ip = self.podman(
            "inspect", "--format", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
            infra.stdout.strip(),
        ).stdout.strip()  # fmt: skip
        assert self.ip, f"pod {self.name} has no address on {self.network}"
        volumes = {}
        for volume in self.spec.get("volumes", []):
            volumes[volume["name"]] = self.folder / volume["name"]
            volumes[volume["name"]].mkdir(parents=True)
        fields = {"metadata.name": self.name, "status.podIP": self.ip}
        for container in self.spec["containers"]:
            self._run(container, volumes, fields)

    def _run(
        self, container: dict[str, Any], volumes: Mapping[str, Path], fields: Mapping[str, str]
    ) -> None:
        name = container["name"]
        extra = self.extras.get(name, Extra())
        env = resolve_env(container.get("env", []), fields, self.secrets)
        clash = set(extra.env) & set(env)
        if clash:
            raise AssertionError(f"{name}: the manifest already sets {sorted(clash)}")
        env |= extra.env
        self.envs[name] = env
        options = [f"--env={key}={value}" for key, value in env.items()]
        options += [
            f"--volume={volumes[mount['name']]}:{mount['mountPath']}"
            for mount in container.get("volumeMounts", [])
        ]
        options += [f"--volume={mount}" for mount in extra.mounts]
        command = [expand(word, env) for word in container.get("command", [])]
        args = [expand(word, env) for word in container.get("args", [])]
        if command:
            # The kubelet's command replaces the image's ENTRYPOINT and its CMD.
            options.append(f"--entrypoint={json.dumps(command)}")
        elif not args:
            args = list(extra.args)
        image = self.images[container["image"]]
        self.podman(
            "run", "-d", "--pod", self.name, "--name", self.container_name(name), *options,
            image, *args,
        )  # fmt: skip

    def exited(self) -> list[str]:
        """The manifest's containers of this pod that are not running (a kubelet would restart
        them; a test that waits on the pod fails instead)."""
        gone = []
        for container in self.spec["containers"]:
            name = self.container_name(container["name"])
            state = self.podman("inspect", "--format", "{{.State.Running}}", name, check=False)
            if state.stdout.strip() != "true":
                gone.append(name)
        return gone

    def pre_stop(self, container: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        """Run the container's preStop exec hook in it, with no shell, as the kubelet does."""
        command = self.container(container)["lifecycle"]["preStop"]["exec"]["command"]
        return self.podman(
            "exec", self.container_name(container), *command, check=False, timeout=timeout
        )

    def probe(self, container: str, kind: str = "livenessProbe") -> int:
        """Run an httpGet probe from inside the pod's network; return the HTTP status."""
        get = self.container(container)[kind]["httpGet"]
        script = (
            "import sys, urllib.request, urllib.error\n"
            "try:\n"
            f"    r = urllib.request.urlopen('http://127.0.0.1:{get['port']}{get['path']}', "
            f"timeout={self.container(container)[kind].get('timeoutSeconds', 1)})\n"
            "    print(r.status)\n"
            "except urllib.error.HTTPError as e:\n"
            "    print(e.code)\n"
        )
        done = self.podman("exec", self.container_name(container), "python", "-c", script)
        return int(done.stdout.strip())

    def logs(self) -> str:
        told = []
        for container in self.spec["containers"]:
            name = self.container_name(container["name"])
            done = self.podman("logs", name, check=False)
            told.append(f"--- {name}\n{done.stdout[-1500:]}{done.stderr[-3000:]}")
        return "\n".join(told)

    def close(self) -> None:
        self.podman("pod", "rm", "-f", "-t", "0", self.name, check=False)
