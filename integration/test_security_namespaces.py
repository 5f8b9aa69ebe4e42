"""One namespace cannot affect another, under the documented permission lists.

A real nats-server configured with ``docs/security.md``'s lists (``secfixture``), a real
``serve`` as frontend ``frontend-1`` and the real commands, each as its own user. The worker of
``ns-a`` registers three cards whose model names are 400,000 characters: they are refused at
the boundary as invalid, and the other namespaces' rollout gate and drains answer as before.
On a server that takes small messages only, ``ns-a``'s cards with names within the bound make
its serving record too large to publish: it is withdrawn and said by key, and the others are
published all the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.js.api import KeyValueConfig
from secfixture import SecurityMaterial, configured_server, inbox_prefix, users_config
from support.cards import base_card
from workerset_admission.adapters.nats.registrar import WorkerRegistrar
from workerset_admission.identity import EndpointId

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

DISCOVERY = "dynamo-discovery"
ADMISSION = "frontend-model-admission"
STATUS = "workerset-admission.status"
NAMESPACES = ("ns-a", "ns-b", "ns-v2")
CLI = [sys.executable, "-m", "workerset_admission.cli"]
HUGE = 400_000


@pytest.fixture
def material(tmp_path: Path) -> SecurityMaterial:
    return SecurityMaterial.generate(
        tmp_path / "material",
        discovery_bucket=DISCOVERY,
        admission_bucket=ADMISSION,
        status_subject=STATUS,
    )


@contextlib.contextmanager
def server_url(
    tmp_path: Path, material: SecurityMaterial, max_payload: int | None = None
) -> Iterator[str]:
    # The default buckets and status subject, as a deployment that changes none of them.
    config = users_config(material, worker_namespaces=NAMESPACES)
    if max_payload is not None:
        config["max_payload"] = max_payload
    with configured_server(tmp_path, config) as server:
        yield server.url


def env_for(url: str, user: str, password: str, inbox: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WORKERSET_ADMISSION_")}
    env.update(
        {
            "WORKERSET_ADMISSION_NATS_SERVERS": url,
            "WORKERSET_ADMISSION_NATS_USER": user,
            "WORKERSET_ADMISSION_NATS_PASSWORD": password,
            "WORKERSET_ADMISSION_STATUS_SUBJECT": STATUS,
            "WORKERSET_ADMISSION_SERVE_FILE": "/nonexistent/serve.json",
        }
    )
    if inbox is not None:
        env["WORKERSET_ADMISSION_NATS_INBOX_PREFIX"] = inbox
    return env


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=90, check=False, env=env
    )


async def register(
    url: str, password: str, namespace: str, instance: int, card: dict[str, Any]
) -> None:
    """Register one worker of ``namespace`` as that namespace's worker user."""
    nc = await nats.connect(url, user=f"worker-{namespace}", password=password)
    try:
        registrar = WorkerRegistrar(nc.jetstream(timeout=5), bucket=DISCOVERY, ttl=None)
        endpoint = EndpointId(namespace, "backend", "generate")
        await registrar.register(endpoint, instance, card)
        await registrar.register_endpoint(
            endpoint, instance, transport={"tcp": f"10.0.0.{instance & 0xF}:4000/x"}
        )
    finally:
        await nc.close()


def status_until(env: dict[str, str], done: Any, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    answer: dict[str, Any] = {}
    while time.monotonic() < deadline:
        ran = run(env, "status", "--json", "--timeout", "2")
        if ran.returncode == 0:
            answer = json.loads(ran.stdout)
            if done(answer):
                return answer
        time.sleep(0.3)
    raise AssertionError(f"status never showed what was awaited: {answer}")


async def prepare(url: str, material: SecurityMaterial) -> None:
    """Create both buckets, as the operator does."""
    nc = await nats.connect(url, user="admin", password=material.admin_password)
    try:
        js = nc.jetstream()
        await js.create_key_value(KeyValueConfig(bucket=DISCOVERY, history=1))
        await js.create_key_value(KeyValueConfig(bucket=ADMISSION, history=1, ttl=60))
    finally:
        await nc.close()


@contextlib.contextmanager
def serving(url: str, material: SecurityMaterial, log: Path) -> Iterator[None]:
    """``serve`` as frontend ``frontend-1`` under its documented user, until the block ends."""
    env = env_for(url, "workerset-admission", material.plugin_password, inbox_prefix("frontend-1"))
    env["WORKERSET_ADMISSION_FRONTEND_ID"] = "frontend-1"
    with log.open("w") as out:
        served = subprocess.Popen([*CLI, "serve"], env=env, stdout=out, stderr=out)
        try:
            yield
        finally:
            served.terminate()
            served.wait(timeout=30)


def gate(url: str, password: str, namespace: str) -> subprocess.CompletedProcess[str]:
    """``rollout --wait`` for the demo model in ``namespace``, as that namespace's drain user."""
    env = env_for(url, f"drain-{namespace}", password, inbox_prefix(f"drain-{namespace}"))
    model = base_card()["display_name"]
    return run(
        env, "rollout", "--model", model, "--namespace", namespace, "--wait", "--timeout", "30"
    )


def drain_wait(url: str, password: str) -> subprocess.CompletedProcess[str]:
    """``drain 0xb1 --wait`` in ``ns-b``, as ``ns-b``'s drain user."""
    env = env_for(url, "drain-ns-b", password, inbox_prefix("drain-ns-b"))
    return run(env, "drain", "0xb1", "--wait", "--timeout", "30")


async def workers(url: str, password: str, names: list[str]) -> None:
    """``ns-a``'s workers with these model names, then one worker each in ns-v2 and ns-b."""
    for n, name in enumerate(names):
        card = base_card(display_name=name, slug=f"ns-a-model-{n}")
        await register(url, password, "ns-a", 0xA1 + n, card)
    await register(url, password, "ns-v2", 0xC1, base_card())
    await register(url, password, "ns-b", 0xB1, base_card())


def test_huge_model_names_in_one_namespace_leave_the_others_gate_and_drains_as_before(
    material: SecurityMaterial, tmp_path: Path
) -> None:
    password = material.worker_password
    with server_url(tmp_path, material) as url, serving(url, material, tmp_path / "serve.log"):
        asyncio.run(prepare(url, material))
        asyncio.run(workers(url, password, [f"{n}" + "m" * HUGE for n in range(3)]))
        reader = env_for(url, "status-reader", password, inbox_prefix("status"))
        answer = status_until(
            reader,
            lambda s: (
                sorted(g["namespace"] for g in s["groups"]) == ["ns-b", "ns-v2"]
                and all(g["status"] == "ready" for g in s["groups"])
            ),
        )
        invalid = answer["recent_invalid"]
        assert sorted(r["reason"] for r in invalid) == ["name_too_long"] * 3, invalid

        # ns-v2's rollout gate opens, and a drain in ns-b is confirmed by ns-b's record.
        opened = gate(url, password, "ns-v2")
        assert opened.returncode == 0, opened.stdout + opened.stderr
        drained = drain_wait(url, password)
        assert drained.returncode == 0, drained.stdout + drained.stderr
        assert "safe to stop" in drained.stdout + drained.stderr
    logged = (tmp_path / "serve.log").read_text()
    assert "m" * 1000 not in logged, "a refused model name is cut short wherever it is shown"
    assert "Violation" not in logged


def test_a_record_too_large_for_the_server_delays_no_other_namespaces_record(
    material: SecurityMaterial, tmp_path: Path
) -> None:
    password = material.worker_password
    names = [f"{n}" + "m" * 999 for n in range(4)]  # within the bound, 4 KiB together
    log = tmp_path / "serve.log"
    with (
        server_url(tmp_path, material, max_payload=4096) as url,
        serving(url, material, log),
    ):
        asyncio.run(prepare(url, material))
        asyncio.run(workers(url, password, names))
        for namespace in ("ns-v2", "ns-b"):
            opened = gate(url, password, namespace)
            assert opened.returncode == 0, opened.stdout + opened.stderr
        drained = drain_wait(url, password)
        assert drained.returncode == 0, drained.stdout + drained.stderr
        assert "safe to stop" in drained.stdout + drained.stderr
        deadline = time.monotonic() + 10
        while "v1.frontend-1.members.ns-a is" not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
    logged = log.read_text()
    assert "the serving record v1.frontend-1.members.ns-a is" in logged
    assert "more than the NATS server takes" in logged
