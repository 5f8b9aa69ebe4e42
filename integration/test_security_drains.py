"""Drains and the documented users on a server configured with ``docs/security.md``'s lists.

Every documented user does its documented job (the frontend serves, workers register, the
bridge mirrors, ``status``, ``rollout``, ``drain``, ``drain --wait`` and ``undrain`` run) and
the nats-server's own log shows no permission violation for any of them. A drain its user may
not finish (a host drain reaching another namespace) is refused before it writes anything: the
admitted view, sampled all the while it runs, never changes.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import time
from pathlib import Path

import nats
import pytest
from secfixture import SecurityMaterial, configured_server, inbox_prefix, users_config
from support.buckets import live_keys
from support.cards import base_card
from test_security_namespaces import (
    ADMISSION,
    CLI,
    DISCOVERY,
    STATUS,
    env_for,
    prepare,
    register,
    run,
    status_until,
)
from workerset_admission.card.drain_record import budget_kv_key
from workerset_admission.keys import DRAIN_PREFIX

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

NAMESPACES = ("ns-a", "ns-b")
USERS = ("workerset-admission", "status-reader", "rollout", "bridge", "drain-ns-a", "worker-ns-a")


@pytest.fixture
def material(tmp_path: Path) -> SecurityMaterial:
    return SecurityMaterial.generate(
        tmp_path / "material",
        discovery_bucket=DISCOVERY,
        admission_bucket=ADMISSION,
        status_subject=STATUS,
    )


def serve_with_view(url: str, material: SecurityMaterial, root: Path) -> subprocess.Popen[bytes]:
    env = env_for(url, "workerset-admission", material.plugin_password, inbox_prefix("frontend-1"))
    env["WORKERSET_ADMISSION_FRONTEND_ID"] = "frontend-1"
    (root / "view").mkdir()
    with (root / "serve.log").open("w") as out:
        return subprocess.Popen(
            [*CLI, "serve", "--view-dir", str(root / "view")], env=env, stdout=out, stderr=out
        )


def view_cards(view: Path) -> frozenset[str]:
    folder = view / "v1" / "mdc"
    return (
        frozenset(p.name for p in folder.rglob("*") if p.is_file())
        if folder.exists()
        else frozenset()
    )


async def drain_related_keys(url: str, password: str) -> list[str]:
    nc = await nats.connect(url, user="admin", password=password)
    try:
        kv = await nc.jetstream().key_value(DISCOVERY)
        keys = await live_keys(kv)
        return sorted(k for k in keys if k.startswith((DRAIN_PREFIX, "v1.budget.")))
    finally:
        await nc.close()


def violations(log: str, user: str) -> list[str]:
    return [line for line in log.splitlines() if "Violation" in line and f'"{user}"' in line]


def test_every_documented_user_does_its_job_with_no_permission_violation(
    material: SecurityMaterial, tmp_path: Path
) -> None:
    config = users_config(material, worker_namespaces=NAMESPACES)
    with configured_server(tmp_path, config) as server:
        url, password = server.url, material.worker_password
        asyncio.run(prepare(url, material))
        served = serve_with_view(url, material, tmp_path)
        try:
            asyncio.run(register(url, password, "ns-a", 0xA1, base_card()))
            asyncio.run(register(url, password, "ns-a", 0xA2, base_card()))
            status_env = env_for(url, "status-reader", password, inbox_prefix("status"))
            status_until(status_env, lambda s: bool(s["groups"]) and s["groups"][0]["admitted"])
            time.sleep(1.0)  # the serving record lists both
            # status's disagreement report reads the serving records: under its own list.
            assert run(status_env, "status").returncode == 0
            gate_env = env_for(url, "rollout", password, inbox_prefix("rollout"))
            model = base_card()["display_name"]
            gate = run(gate_env, "rollout", "--model", model, "--namespace", "ns-a")
            assert gate.returncode == 0, gate.stderr
            drain_env = env_for(url, "drain-ns-a", password, inbox_prefix("drain-ns-a"))
            drained = run(drain_env, "drain", "0xa1", "--wait", "--timeout", "30")
            assert drained.returncode == 0, drained.stderr
            again = run(drain_env, "drain", "0xa1", "--wait", "--timeout", "30", "--grace", "30")
            assert again.returncode == 0, again.stderr
            undone = run(drain_env, "undrain", "0xa1")
            assert undone.returncode == 0, undone.stderr
            store = tmp_path / "file-kv"
            (store / "v1").mkdir(parents=True)
            bridge_env = env_for(url, "bridge", password, inbox_prefix("bridge"))
            bridged = run(bridge_env, "bridge", "--file-kv", str(store), "--once", "--no-prune")
            assert bridged.returncode == 0, bridged.stderr
        finally:
            served.terminate()
            served.wait(timeout=30)
        log = server.log_text()
    for user in USERS:
        assert violations(log, user) == [], user


def test_a_drain_refused_for_another_namespace_changes_no_view_while_it_runs(
    material: SecurityMaterial, tmp_path: Path
) -> None:
    config = users_config(material, worker_namespaces=NAMESPACES)
    with configured_server(tmp_path, config) as server:
        url, password = server.url, material.worker_password
        asyncio.run(prepare(url, material))
        served = serve_with_view(url, material, tmp_path)
        view = tmp_path / "view"
        try:
            # Two workers on one host (10.0.0.1): one in ns-a, one in ns-b; each model stays
            # served by another worker, so only the permission can refuse the drain.
            asyncio.run(register(url, password, "ns-a", 0x11, base_card()))
            asyncio.run(register(url, password, "ns-a", 0x12, base_card()))
            asyncio.run(register(url, password, "ns-b", 0x21, base_card()))
            asyncio.run(register(url, password, "ns-b", 0x22, base_card()))
            deadline = time.monotonic() + 30
            while len(view_cards(view)) < 4:
                assert time.monotonic() < deadline, view_cards(view)
                time.sleep(0.1)
            time.sleep(1.0)
            before = view_cards(view)
            seen: set[frozenset[str]] = set()
            samples = 0
            done = threading.Event()

            def sample() -> None:
                nonlocal samples
                while not done.is_set():
                    seen.add(view_cards(view))
                    samples += 1
                    time.sleep(0.005)

            sampler = threading.Thread(target=sample)
            sampler.start()
            drain_env = env_for(url, "drain-ns-a", password, inbox_prefix("drain-ns-a"))
            try:
                refused = run(drain_env, "drain", "--host", "10.0.0.1", "--timeout", "20")
                time.sleep(1.0)  # a frontend would have applied a drain by now
            finally:
                done.set()
                sampler.join()
            assert refused.returncode == 5, refused.stderr
            assert "v1.drain.ns-b" in refused.stderr
            assert seen == {before}, seen
            assert samples > 50
            assert asyncio.run(drain_related_keys(url, material.admin_password)) == []
        finally:
            served.terminate()
            served.wait(timeout=30)
    print(f"\n[drain] a refused cross-namespace drain: {samples} samples, the view never changed")


@pytest.mark.rollout  # a minute of the server's clock: the slower tier
def test_one_namespaces_drain_user_blocks_anothers_drains_for_a_minute_at_most(
    material: SecurityMaterial, tmp_path: Path
) -> None:
    config = users_config(material, worker_namespaces=NAMESPACES)
    with configured_server(tmp_path, config) as server:
        url, password = server.url, material.worker_password
        asyncio.run(prepare(url, material))
        model = "served-from-ns-b"
        card = base_card(display_name=model, slug=model)
        asyncio.run(register(url, password, "ns-b", 0x21, card))
        asyncio.run(register(url, password, "ns-b", 0x22, card))

        async def forge() -> None:
            # ns-a's drain user, with its documented rights only, holds ns-b's 0x21 as about
            # to be drained, stamped a year ahead.
            nc = await nats.connect(
                url, user="drain-ns-a", password=password, inbox_prefix=inbox_prefix("drain-ns-a")
            )
            try:
                kv = await nc.jetstream(timeout=5).key_value(DISCOVERY)
                ahead = time.time() + 365 * 86400
                pending = [{"namespace": "ns-b", "instance_id": 0x21, "at": ahead, "since": ahead}]
                value = {"type": "DrainBudget", "model": model, "pending": pending}
                await kv.put(budget_kv_key(model), json.dumps(value).encode())
            finally:
                await nc.close()

        asyncio.run(forge())
        forged = time.monotonic()
        drain_env = env_for(url, "drain-ns-b", password, inbox_prefix("drain-ns-b"))
        blocked = run(drain_env, "drain", "0x22", "--timeout", "20")
        assert blocked.returncode == 6, blocked.stderr
        time.sleep(max(0.0, forged + 61.0 - time.monotonic()))
        drained = run(drain_env, "drain", "0x22", "--timeout", "20")
        assert drained.returncode == 0, drained.stderr
        keys = asyncio.run(drain_related_keys(url, material.admin_password))
        assert [k for k in keys if k.startswith(DRAIN_PREFIX)] == ["v1.drain.ns-b.22"]
        log = server.log_text()
    assert violations(log, "drain-ns-a") == []
