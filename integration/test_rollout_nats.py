"""The rollout gate reads a real serving-admission bucket, tolerating garbage and absence."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys

import nats
import pytest
from natsfixture import NatsServer
from workerset_admission.adapters.nats.admission_reader import NatsRecordSource
from workerset_admission.adapters.nats.connect import NatsConnectOptions
from workerset_admission.cli.rollout import BucketRead, GateQuery, check_gate

pytestmark = pytest.mark.integration

MODEL = "llama"
NEW = "prod-v2"


def members_record(frontend: str, namespace: str) -> bytes:
    members = [f"{namespace}/backend/generate/1"]
    return json.dumps(
        {
            "protocol": "v1",
            "frontend": frontend,
            "namespace": namespace,
            "members": members,
            "groups": [
                {
                    "model": MODEL,
                    "worker_set": "ws",
                    "checksum": "c" * 64,
                    "generation": 1,
                    "members": members,
                }
            ],
        }
    ).encode()


async def test_the_gate_reads_every_record_and_reports_the_garbage(
    nats_server: NatsServer, bucket_name: str
) -> None:
    client = await nats.connect(nats_server.url)
    try:
        kv = await client.jetstream().create_key_value(bucket=bucket_name)
        await kv.put("v1.fe-a.capability", b'{"protocol":"v1","capability":true,"frontend":"fe-a"}')
        await kv.put(f"v1.fe-a.members.{NEW}", members_record("fe-a", NEW))
        await kv.put("v1.fe-b.members.prod-v1", members_record("fe-b", "prod-v1"))
        await kv.put("v1.fe-c.members.prod-v2", b"\xff not a record")
        await kv.put("v1.fe-d.members.prod-v2", members_record("fe-d", NEW))
        await kv.delete("v1.fe-d.members.prod-v2")
    finally:
        await client.close()

    source = NatsRecordSource(NatsConnectOptions(servers=(nats_server.url,)), bucket_name)
    check = await check_gate(source, GateQuery(model=MODEL, namespace=NEW))

    assert check.report is not None
    assert check.report.live == ("fe-a", "fe-b")
    assert check.report.missing == ("fe-b",)
    assert not check.open
    assert [(error.key, error.reason) for error in check.refused] == [
        ("v1.fe-c.members.prod-v2", "not_json")
    ]
    published = {e.published_at for e in (await source.read()).entries}
    assert None not in published


async def test_a_bucket_nobody_created_yet_is_an_empty_closed_gate(
    nats_server: NatsServer, bucket_name: str
) -> None:
    source = NatsRecordSource(NatsConnectOptions(servers=(nats_server.url,)), bucket_name)
    assert await source.read() == BucketRead()
    check = await check_gate(source, GateQuery(model=MODEL, namespace=NEW))
    assert check.report is not None
    assert not check.open
    assert check.report.live == ()


async def test_an_unreachable_server_is_reported_within_the_timeout() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # Nothing listens on the port any more: every connection attempt is refused.
    options = NatsConnectOptions(servers=(f"nats://127.0.0.1:{port}",), connect_timeout=0.5)
    read = await NatsRecordSource(options, timeout=1.0).read()
    assert read.entries == ()
    assert read.problem is not None
    assert f"127.0.0.1:{port}" in read.problem


def rollout_command(
    server: NatsServer, bucket: str, *extra: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "workerset_admission.cli",
            "rollout",
            "--model",
            MODEL,
            "--namespace",
            NEW,
            "--nats-server",
            server.url,
            "--admission-bucket",
            bucket,
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "WORKERSET_ADMISSION_CONFIG_FILE": ""},
    )


async def test_the_command_exits_with_the_gate_for_a_script_to_branch_on(
    nats_server: NatsServer, bucket_name: str
) -> None:
    client = await nats.connect(nats_server.url)
    try:
        kv = await client.jetstream().create_key_value(bucket=bucket_name)
        await kv.put(f"v1.fe-a.members.{NEW}", members_record("fe-a", NEW))
        opened = await asyncio.to_thread(rollout_command, nats_server, bucket_name, "--json")
        assert opened.returncode == 0, opened.stderr
        assert json.loads(opened.stdout)["serving"] == ["fe-a"]
        # The 12-character form every table prints stands for the whole checksum.
        short = await asyncio.to_thread(
            rollout_command, nats_server, bucket_name, "--checksum", "c" * 12, "--json"
        )
        assert short.returncode == 0, short.stderr
        assert json.loads(short.stdout)["expected_checksum"] == "c" * 64
        for extra in (["--timeout", "-1"], ["--checksum", "not-hex!"]):
            refused = await asyncio.to_thread(rollout_command, nats_server, bucket_name, *extra)
            assert refused.returncode == 2, (extra, refused.stderr)
            assert len(refused.stderr.splitlines()) == 1, refused.stderr

        await kv.put("v1.fe-b.capability", b'{"protocol":"v1","capability":true,"frontend":"fe-b"}')
        closed = await asyncio.to_thread(
            rollout_command, nats_server, bucket_name, "--wait", "--timeout", "1"
        )
        assert closed.returncode == 1
        assert "gate: CLOSED" in closed.stdout
        assert "waiting for fe-b" in closed.stderr
    finally:
        await client.close()
