"""Hostile or huge input through a real bucket: it hides no worker, blinds no operator.

A service runs with an admitted view on a real nats-server and a writer puts what a worker's
permissions let it put: names the view cannot hold, names that would make two keys one worker,
values that quote hundreds of kilobytes back in their refusal. Every case checks what an
operator and the frontend see: ``status`` answers, every routable worker is in the view, and
nothing is admitted that the view cannot name.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from natsfixture import NatsServer
from support.fleet import (
    DISCOVERY,
    OLD,
    Builder,
    admin,
    fresh_buckets,
    group_of,
    settings_for,
    until,
)
from workerset_admission.adapters.dynamo.view import DirectoryFiles, file_name_for
from workerset_admission.card import encode_endpoint_record, encode_model_record
from workerset_admission.errors import DETAIL_LIMIT
from workerset_admission.identity import EndpointId, instance_key
from workerset_admission.keys import STATUS_SUBJECT
from workerset_admission.service.factory import create_service
from workerset_admission.service.shell import AdmissionService

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


@contextlib.asynccontextmanager
async def serving_view(
    url: str, view_dir: Path, **overrides: Any
) -> AsyncIterator[AdmissionService]:
    """A service writing its admitted view into ``view_dir``; stopped on exit."""
    files = DirectoryFiles.open(view_dir)
    service = await create_service(
        settings_for(url, **overrides), builder=Builder(), view_files=files
    )
    try:
        await service.wait_synced(30)
        yield service
    finally:
        await service.stop()
        files.release()


def view_names(view_dir: Path) -> set[tuple[str, str]]:
    return {
        (path.parent.name, path.name)
        for path in (view_dir / "v1").glob("*/*")
        if not path.name.startswith(".")
    }


def routable_in_view(service: AdmissionService, view_dir: Path) -> list[str]:
    """Every routable worker's instance key the view holds no card or instance file for."""
    names = view_names(view_dir)
    missing = []
    for binding in service.bindings():
        endpoint = binding.id.group.endpoint
        for instance_id in binding.routable():
            name = file_name_for(instance_key(endpoint, instance_id))
            if not {("mdc", name), ("instances", name)} <= names:
                missing.append(instance_key(endpoint, instance_id))
    return missing


async def register(kv: Any, ep: EndpointId, instance_id: int) -> None:
    from workerset_admission.keys import endpoint_kv_key, model_kv_key

    await kv.put(endpoint_kv_key(ep, instance_id), encode_endpoint_record(ep, instance_id))
    await kv.put(model_kv_key(ep, instance_id), encode_model_record(ep, instance_id, OLD))


async def status_reply(nc: Any) -> dict[str, Any]:
    reply = await nc.request(STATUS_SUBJECT, b"", timeout=5)
    return json.loads(reply.data)


async def test_a_worker_the_view_cannot_name_is_refused_with_a_reason_and_never_routable(
    nats_server_fn: NatsServer, tmp_path: Path
) -> None:
    plain = EndpointId("ns-plain", "backend", "generate")
    # 250 bytes of namespace: the file name would be 265 bytes (ENAMETOOLONG).
    long_ns = EndpointId("n" * 250, "backend", "generate")
    async with admin(nats_server_fn.url) as nc:
        fleet = await fresh_buckets(nc)
        async with serving_view(nats_server_fn.url, tmp_path) as service:
            await register(fleet.kv, plain, 1)
            await register(fleet.kv, long_ns, 2)
            await until(
                lambda: len(service.snapshot().recent_invalid) >= 2, 20, "both long keys refused"
            )
            await until(lambda: not routable_in_view(service, tmp_path), 20, "the view")
            snapshot = service.snapshot()
            assert {g.group for g in snapshot.groups} == {group_of(plain)}
            assert {r.reason for r in snapshot.recent_invalid} == {"bad_key"}
            assert all("over the 255" in r.detail for r in snapshot.recent_invalid)
            routable = {i for b in service.bindings() for i in b.routable()}
            assert routable == {1}
            assert (await status_reply(nc))["invalid_total"] == 2


async def test_two_keys_that_would_be_one_worker_are_both_refused_and_nothing_is_withdrawn(
    nats_server_fn: NatsServer, tmp_path: Path
) -> None:
    # Namespace "dgd/backend" and namespace "dgd" with component "backend/generate" are both
    # the path dgd/backend/generate/x/1: one registration, one view file for two keys. A writer
    # of `v1.mdc.dgd.>` used to withdraw the other's worker by putting and deleting its own.
    neighbour = EndpointId("dgd", "backend", "generate")
    keys = ("v1.mdc.dgd=2Fbackend.generate.x.1", "v1.mdc.dgd.backend=2Fgenerate.x.1")
    async with admin(nats_server_fn.url) as nc:
        fleet = await fresh_buckets(nc)
        async with serving_view(nats_server_fn.url, tmp_path) as service:
            await register(fleet.kv, neighbour, 1)
            await until(
                lambda: {i for b in service.bindings() for i in b.routable()} == {1}, 20, "served"
            )
            await until(lambda: not routable_in_view(service, tmp_path), 20, "in the view")
            before = view_names(tmp_path)
            victim = EndpointId("dgd/backend", "generate", "x")
            await fleet.kv.put(keys[0], encode_model_record(victim, 1, OLD))
            forger = EndpointId("dgd", "backend/generate", "x")
            await fleet.kv.put(keys[1], encode_model_record(forger, 1, OLD))
            await fleet.kv.delete(keys[1])

            def refused() -> dict[str, str]:
                return {r.key: r.detail for r in service.snapshot().recent_invalid}

            await until(lambda: set(keys) <= set(refused()), 20, "both keys refused")
            assert all("separator" in refused()[key] for key in keys)
            assert [g.group for g in service.snapshot().groups] == [group_of(neighbour)]
            assert {i for b in service.bindings() for i in b.routable()} == {1}
            assert view_names(tmp_path) == before
            assert not routable_in_view(service, tmp_path)


async def test_one_huge_refused_value_leaves_status_answering_with_a_bounded_detail(
    nats_server_fn: NatsServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ep = EndpointId("ns-a", "backend", "generate")
    caplog.set_level(logging.DEBUG)
    async with admin(nats_server_fn.url) as nc:
        fleet = await fresh_buckets(nc)
        async with serving_view(nats_server_fn.url, tmp_path) as service:
            await register(fleet.kv, ep, 1)
            # The value claims an 800 KB namespace under the writer's own key: refused for
            # disagreeing with it, and the refusal used to quote the whole value.
            record = json.loads(encode_model_record(ep, 1, OLD))
            record["namespace"] = "x" * 800_000
            js = nc.jetstream()
            for n in range(3):
                key = f"v1.mdc.ns-a.backend.generate.{n + 10:x}"
                record["instance_id"] = n + 10
                await js.publish(f"$KV.{DISCOVERY}.{key}", json.dumps(record).encode())
            await until(lambda: service.snapshot().invalid_total >= 3, 20, "refused")
            status = await status_reply(nc)
            assert status["invalid_total"] == 3
            assert status["groups"]
            for refused in status["recent_invalid"]:
                assert refused["reason"] == "identity_mismatch"
                assert len(refused["detail"]) < DETAIL_LIMIT + 40
            # A restarted service reads the same values back and still answers.
        async with serving_view(nats_server_fn.url, tmp_path) as service:
            await until(lambda: service.snapshot().invalid_total >= 3, 20, "refused again")
            assert (await status_reply(nc))["invalid_total"] >= 3
    longest = max(len(r.getMessage()) for r in caplog.records)
    assert longest < 4 * DETAIL_LIMIT, f"a log line of {longest} characters"
