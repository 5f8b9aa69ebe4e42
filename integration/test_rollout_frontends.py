"""Three frontends on one cluster, a rolling update, and the rollout gate deciding from the bucket.

The story: the old generation ``prod-v1`` is served. The new generation ``prod-v2`` gets a
stray worker with a different configuration before the real ones; frontend ``fe-c`` is already
running and admits the stray one first, ``fe-a`` and ``fe-b`` start later and admit the real
ones. ``fe-b`` is slow to build its pipeline. The gate must report the disagreement, stay
closed while ``fe-b`` lacks the new generation, open once every live frontend serves it, and
stop counting ``fe-c`` once it is gone: at once after a clean stop (it withdraws its records),
or when its records expire after a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import io
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from clusterfixture import NatsCluster, nats_cluster
from nats.aio.client import Client as NatsClient
from support.cards import base_card as demo_card
from workerset_admission.adapters.nats.admission_publisher import NatsAdmissionPublisher
from workerset_admission.adapters.nats.admission_reader import NatsRecordSource
from workerset_admission.adapters.nats.buckets import BucketSpec, ensure_bucket
from workerset_admission.adapters.nats.connect import NatsConnectOptions, connect
from workerset_admission.adapters.nats.registrar import WorkerRegistrar
from workerset_admission.adapters.nats.source import JetStreamDiscoverySource
from workerset_admission.cli.exits import EXIT_NO, EXIT_OK
from workerset_admission.cli.rollout import (
    GateCheck,
    GateQuery,
    check_gate,
    run_async,
    wait_for_gate,
)
from workerset_admission.identity import EndpointId
from workerset_admission.service.admission_service import AdmissionService, BuildRequest
from workerset_admission.service.builds import DefaultPipelineBuilder
from workerset_admission.settings import Settings

__all__ = ["nats_cluster"]

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

DISCOVERY = "dynamo-discovery"
ADMISSION = "frontend-model-admission"
MODEL = "Qwen/Qwen3-0.6B"
OLD, NEW = "prod-v1", "prod-v2"
# Short-lived serving records, so a crashed frontend drops out within seconds, not a minute.
RECORD_TTL = 3.0
STEP_TIMEOUT = 30.0

CARD: dict[str, Any] = demo_card()
# The stray worker: same model and WorkerSet, another configuration, so another mdc_checksum.
STRAY_CARD = {**copy.deepcopy(CARD), "context_length": 8192}


def endpoint(namespace: str) -> EndpointId:
    return EndpointId(namespace, "backend", "generate")


class GatedBuilder:
    """Builds at once, except the new generation while ``hold`` is clear."""

    def __init__(self, *, hold_new: bool = False) -> None:
        self._inner = DefaultPipelineBuilder()
        self.release = asyncio.Event()
        if not hold_new:
            self.release.set()
        self.held = 0

    async def build(self, request: BuildRequest) -> object:
        if request.group.endpoint.namespace == NEW and not self.release.is_set():
            self.held += 1
            await self.release.wait()
        return await self._inner.build(request)


@dataclass
class Frontend:
    name: str
    service: AdmissionService
    publisher_client: NatsClient
    builder: GatedBuilder

    async def stop(self) -> None:
        await self.service.stop()
        await self.publisher_client.close()

    async def crash(self) -> None:
        """Die without withdrawing: the serving records stay until they expire."""
        await self.publisher_client.close()
        await self.service.stop()


@dataclass
class Fleet:
    cluster: NatsCluster
    frontends: dict[str, Frontend] = field(default_factory=dict)

    def options(self, name: str) -> NatsConnectOptions:
        # Each frontend lists the nodes in another order, as a deployment would spread them.
        shift = len(self.frontends) % len(self.cluster.urls)
        urls = self.cluster.urls[shift:] + self.cluster.urls[:shift]
        return NatsConnectOptions(servers=tuple(urls), name=name)

    async def start(self, name: str, builder: GatedBuilder | None = None) -> Frontend:
        options = self.options(name)
        source = JetStreamDiscoverySource(options, bucket=DISCOVERY)
        client = await connect(options)
        publisher = NatsAdmissionPublisher(
            client.jetstream(), name, bucket=ADMISSION, min_interval=0.05, record_ttl=RECORD_TTL
        )
        builder = builder or GatedBuilder()
        service = AdmissionService(
            source,
            publisher=publisher,
            builder=builder,
            settings=Settings(publish_interval=0.05, publish_retry=0.2),
        )
        await service.start()
        await service.wait_synced(STEP_TIMEOUT)
        frontend = Frontend(name, service, client, builder)
        self.frontends[name] = frontend
        return frontend

    async def close(self) -> None:
        for frontend in self.frontends.values():
            with contextlib.suppress(Exception):
                await frontend.stop()


@contextlib.asynccontextmanager
async def fleet(cluster: NatsCluster) -> AsyncIterator[Fleet]:
    crew = Fleet(cluster)
    try:
        yield crew
    finally:
        await crew.close()


def gate_source(cluster: NatsCluster) -> NatsRecordSource:
    return NatsRecordSource(NatsConnectOptions(servers=tuple(cluster.urls)), ADMISSION)


async def gate_until(
    cluster: NatsCluster,
    query: GateQuery,
    condition: Callable[[GateCheck], bool],
    what: str,
) -> GateCheck:
    """Look at the gate until ``condition`` holds; the bucket is eventually consistent."""
    source = gate_source(cluster)
    deadline = time.monotonic() + STEP_TIMEOUT
    while True:
        check = await check_gate(source, query)
        if condition(check):
            return check
        assert time.monotonic() < deadline, f"{what}: last answer {_answer(check)}"
        await asyncio.sleep(0.1)


def _answer(check: GateCheck) -> Any:
    return check.problem if check.report is None else check.report.as_json()


def checksum_of(frontend: Frontend, namespace: str) -> str:
    for group in frontend.service.status().groups:
        if group.group.endpoint.namespace == namespace and group.incumbent is not None:
            return group.incumbent
    raise AssertionError(f"{frontend.name} has no incumbent in {namespace}")


async def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + STEP_TIMEOUT
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


def committed_in(frontend: Frontend, namespace: str) -> bool:
    return any(
        group.group.endpoint.namespace == namespace and group.committed_generation is not None
        for group in frontend.service.status().groups
    )


async def test_the_gate_follows_three_frontends_through_a_rolling_update(
    nats_cluster: NatsCluster,
) -> None:
    workers_client = await connect(NatsConnectOptions(servers=tuple(nats_cluster.urls)))
    async with fleet(nats_cluster) as crew:
        js = workers_client.jetstream(timeout=5)
        await ensure_bucket(js, BucketSpec(name=DISCOVERY, replicas=3))
        await ensure_bucket(
            js,
            BucketSpec(name=ADMISSION, replicas=3, limit_marker_ttl=None, max_age=RECORD_TTL),
        )
        workers = WorkerRegistrar(js, bucket=DISCOVERY, ttl=None, create_bucket=False)
        for instance in (0x10, 0x11):
            await workers.register(endpoint(OLD), instance, CARD)

        new = GateQuery(model=MODEL, namespace=NEW)

        # fe-c runs alone and is the first to see the new generation: the stray worker.
        fe_c = await crew.start("fe-c")
        await workers.register(endpoint(NEW), 0x99, STRAY_CARD)
        await wait_until(lambda: committed_in(fe_c, NEW), "fe-c never served the stray worker")
        for instance in (0x20, 0x21):
            await workers.register(endpoint(NEW), instance, CARD)
        # The stray worker's heartbeat rewrites its record: in a snapshot it now comes last.
        await workers.register(endpoint(NEW), 0x99, STRAY_CARD)

        fe_a = await crew.start("fe-a")
        fe_b = await crew.start("fe-b", GatedBuilder(hold_new=True))
        await wait_until(lambda: committed_in(fe_a, NEW), "fe-a never served the new workers")
        await wait_until(lambda: fe_b.builder.held > 0, "fe-b never started its build")
        good, stray = checksum_of(fe_a, NEW), checksum_of(fe_c, NEW)
        assert good != stray

        # fe-b lacks the new generation: closed, with the disagreement reported. Records arrive
        # one by one; wait for the whole picture, then look at its details.
        check = await gate_until(
            nats_cluster,
            new,
            lambda c: (
                c.report is not None
                and c.report.serving == ("fe-a", "fe-c")
                and c.report.missing == ("fe-b",)
                and c.report.previous == ("fe-a", "fe-b", "fe-c")
                and len(c.report.disagreements) == 1
            ),
            "fe-a and fe-c serving, fe-b missing, all three on the previous generation",
        )
        assert check.report is not None
        report = check.report
        assert not report.open
        assert dict(report.disagreements[0].incumbents) == {good: ("fe-a",), stray: ("fe-c",)}

        # The command line says the same, and --wait gives up at its timeout.
        out, err = io.StringIO(), io.StringIO()
        args = _rollout_args("--json", "--wait", "--timeout", "0.5", "--interval", "0.2")
        code = await run_async(args, gate_source(nats_cluster), out=out, err=err)
        assert code == EXIT_NO
        assert json.loads(out.getvalue())["missing"] == ["fe-b"]
        assert "waiting for fe-b" in err.getvalue()

        # fe-b finishes its build: every live frontend serves the new generation.
        fe_b.builder.release.set()
        opened = await wait_for_gate(
            gate_source(nats_cluster),
            new,
            timeout=STEP_TIMEOUT,
            interval=0.1,
            progress=lambda _line: None,
        )
        assert opened.report is not None
        assert opened.open
        assert opened.report.serving == ("fe-a", "fe-b", "fe-c")
        assert dict(opened.report.disagreements[0].incumbents) == {
            good: ("fe-a", "fe-b"),
            stray: ("fe-c",),
        }
        strict = GateQuery(model=MODEL, namespace=NEW, require_agreement=True)
        strict_check = await check_gate(gate_source(nats_cluster), strict)
        assert not strict_check.open

        # Expecting the real configuration, fe-c does not count until it is gone. It crashes:
        # its records stay (it is still live) until the bucket's max age removes them.
        expected = GateQuery(model=MODEL, namespace=NEW, expected_checksum=good)
        still = await check_gate(gate_source(nats_cluster), expected)
        assert still.report is not None
        assert still.report.missing == ("fe-c",)
        await crew.frontends.pop("fe-c").crash()
        right_after = await check_gate(gate_source(nats_cluster), expected)
        assert right_after.report is not None
        assert "fe-c" in right_after.report.live
        gone = await gate_until(
            nats_cluster, expected, lambda c: c.open, "fe-c's records never expired"
        )
        assert gone.report is not None
        assert gone.report.live == ("fe-a", "fe-b")
        assert gone.report.disagreements == ()

        # A clean stop withdraws at once: fe-a leaves, fe-b alone keeps the gate open. Each
        # replica expires fe-c's records on its own clock and a listing may be served by any of
        # them, so a read right after the first one that saw them gone may still see them.
        await crew.frontends.pop("fe-a").stop()
        alone = await gate_until(
            nats_cluster,
            expected,
            lambda c: c.report is not None and c.report.live == ("fe-b",),
            "fe-a's withdrawal and fe-c's expiry never showed on every replica",
        )
        assert alone.report is not None
        assert alone.report.live == ("fe-b",), _answer(alone)
        assert alone.open

        out, err = io.StringIO(), io.StringIO()
        code = await run_async(_rollout_args(), gate_source(nats_cluster), out=out, err=err)
        assert code == EXIT_OK, out.getvalue() + err.getvalue()
        assert "gate: OPEN" in out.getvalue()
    await workers_client.close()


def _rollout_args(*extra: str) -> Any:
    from workerset_admission.cli import build_parser

    return build_parser().parse_args(["rollout", "--model", MODEL, "--namespace", NEW, *extra])
