"""Each command reads exactly the settings it shows flags for, checked by running it for real.

Every connecting command runs in-process against the test's nats-server (and ``bridge --etcd``
against a real etcd) with settings that note every field read; what they note must be the
NATS connection plus the settings the command's ``CommandSpec`` lists (which are the flags its
``--help`` shows: ``tests/test_cli.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, ClassVar

import nats
import pytest
from etcdfixture import EtcdServer
from natsfixture import NatsServer
from support.cards import base_card
from support.fleet import all_ready, running
from workerset_admission import cli
from workerset_admission.adapters.nats.registrar import WorkerRegistrar
from workerset_admission.cli import bridge, rollout, serve, traces, workers
from workerset_admission.identity import EndpointId
from workerset_admission.settings import CONNECTION_SETTINGS, FLAGGED_SETTINGS, Settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


class RecordingSettings(Settings):
    """Settings that note the name of every flagged field read, through methods too."""

    reads: ClassVar[set[str]] = set()

    def __getattribute__(self, name: str) -> Any:
        if name in FLAGGED_SETTINGS:
            RecordingSettings.reads.add(name)
        return super().__getattribute__(name)


def settings_for(url: str, bucket: str, **extra: Any) -> RecordingSettings:
    made = RecordingSettings(
        nats_servers=(url,),
        discovery_bucket=bucket,
        admission_bucket=f"{bucket}-adm",
        status_subject=f"{bucket}.status",
        frontend_id="settings-check",
        **extra,
    )
    RecordingSettings.reads.clear()  # what validation looked at is not the command's reading
    return made


# A namespace filter whose value is read: under the default (global) mode it is not.
PREFIX: dict[str, Any] = {"namespace_filter_mode": "prefix", "namespace_filter": "dgd"}


def parse(argv: list[str]) -> argparse.Namespace:
    return cli.build_parser().parse_args(argv)


async def reads_of(
    run: Callable[[argparse.Namespace, asyncio.Event], Awaitable[int]],
    args: argparse.Namespace,
    settings: RecordingSettings,
    *,
    stopped: bool = False,
) -> set[str]:
    """Run one command to its end (or its first error) and return the settings it read."""
    args.settings = settings
    stop = asyncio.Event()
    if stopped:
        stop.set()
    # A command that ends on an error (no service to answer status) has read what it needs.
    with contextlib.suppress(Exception):
        await asyncio.wait_for(run(args, stop), 60)
    return set(RecordingSettings.reads)


def expected(name: str) -> set[str]:
    return set(CONNECTION_SETTINGS) | set(cli.COMMANDS[name].settings)


def main_of(module: Any, name: str) -> Callable[[argparse.Namespace, asyncio.Event], Any]:
    return lambda args, stop: module.main(name, args, stop)


async def test_serve_reads_the_settings_it_shows(
    nats_server: NatsServer, bucket_name: str, tmp_path: Path
) -> None:
    (tmp_path / "view").mkdir()
    settings = settings_for(nats_server.url, bucket_name, view_dir=tmp_path / "view", **PREFIX)
    args = parse(["serve"])

    async def run_serve(args: argparse.Namespace, stop: asyncio.Event) -> int:
        # serve's own process setup (logging, global providers) is left out; the rest is its.
        handle = serve.start_serve_telemetry(args.settings, otlp=False)
        assert handle is None
        return await serve._serve_service(args.settings, args, handle, stop)

    reads = await reads_of(run_serve, args, settings, stopped=True)
    # The Prometheus address and the health endpoints' host are read only once a port is given;
    # serve then opens them, which a test process shares with every other test, so the reads
    # are made here alone.
    with_port = settings_for(nats_server.url, bucket_name, prometheus_port=0, health_port=0)
    assert with_port.prometheus_address is not None
    assert with_port.health_host == "127.0.0.1"
    assert reads | RecordingSettings.reads == expected("serve")


@contextlib.asynccontextmanager
async def ready_frontend(url: str, buckets: Settings) -> AsyncIterator[None]:
    """A live frontend on these settings' buckets, every group ready."""
    async with running(
        url,
        discovery_bucket=buckets.discovery_bucket,
        admission_bucket=buckets.admission_bucket,
        status_subject=buckets.status_subject,
    ) as (service, _watchdog):
        await all_ready(service)
        yield


async def test_status_reads_the_settings_it_shows(
    nats_server: NatsServer, bucket_name: str
) -> None:
    # With a live frontend serving a worker, status also reads the serving records (whether
    # another frontend serves it another configuration).
    buckets = settings_for(nats_server.url, bucket_name)
    nc = await nats.connect(nats_server.url)
    try:
        registrar = WorkerRegistrar(nc.jetstream(), bucket=buckets.discovery_bucket, ttl=None)
        endpoint = EndpointId("dgd", "backend", "generate")
        await registrar.register(endpoint, 7, base_card(16))
        await registrar.register_endpoint(endpoint, 7)
    finally:
        await nc.close()
    async with ready_frontend(nats_server.url, buckets):
        args = parse(["status", "--timeout", "5"])
        reads = await reads_of(
            main_of(serve, "status"), args, settings_for(nats_server.url, bucket_name)
        )
    assert reads == expected("status")


async def test_register_deregister_and_record_read_the_settings_they_show(
    nats_server: NatsServer, bucket_name: str, tmp_path: Path
) -> None:
    card = tmp_path / "card.json"
    card.write_text(json.dumps(base_card()), encoding="utf-8")
    worker = ["--namespace", "dgd", "--component", "backend", "--endpoint", "generate"]
    register = parse(["register", "--card", str(card), *worker, "--instance-id", "7", "--once"])
    reads = await reads_of(
        main_of(workers, "register"),
        register,
        settings_for(nats_server.url, bucket_name, **PREFIX),
    )
    assert reads == expected("register")

    # With a live frontend, record also asks it for its decision state.
    buckets = settings_for(nats_server.url, bucket_name)
    async with ready_frontend(nats_server.url, buckets):
        record = parse(["record", "--duration", "0.5", "-o", str(tmp_path / "trace.jsonl")])
        reads = await reads_of(
            main_of(traces, "record"), record, settings_for(nats_server.url, bucket_name)
        )
    assert reads == expected("record")
    trace = (tmp_path / "trace.jsonl").read_text(encoding="utf-8")
    kinds = [json.loads(line)["kind"] for line in trace.splitlines()]
    assert kinds[:3] == ["trace", "state", "snapshot"]

    deregister = parse(["deregister", *worker, "--instance-id", "7"])
    reads = await reads_of(
        main_of(workers, "deregister"), deregister, settings_for(nats_server.url, bucket_name)
    )
    assert reads == expected("deregister")


async def test_rollout_reads_the_settings_it_shows(
    nats_server: NatsServer, bucket_name: str
) -> None:
    args = parse(["rollout", "--model", "Qwen/Qwen3-0.6B", "--namespace", "dgd-v2"])
    reads = await reads_of(
        main_of(rollout, "rollout"), args, settings_for(nats_server.url, bucket_name)
    )
    assert reads == expected("rollout")


async def test_bridge_reads_the_settings_it_shows_over_a_file_store_and_etcd(
    nats_server: NatsServer, bucket_name: str, tmp_path: Path, etcd_server: EtcdServer
) -> None:
    store = tmp_path / "file-kv"
    store.mkdir()
    on_files = await reads_of(
        main_of(bridge, "bridge"),
        parse(["bridge", "--once", "--file-kv", str(store)]),
        # Port 0: its health and metrics endpoints on free ports, so their hosts are read too.
        settings_for(nats_server.url, bucket_name, health_port=0, prometheus_port=0),
    )
    on_etcd = await reads_of(
        main_of(bridge, "bridge"),
        parse(["bridge", "--once"]),
        settings_for(nats_server.url, bucket_name, etcd_endpoints=(etcd_server.url,)),
    )
    assert on_files | on_etcd == expected("bridge")
