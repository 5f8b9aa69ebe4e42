"""The register, deregister and record subcommands against a real nats-server."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import nats
import pytest
from natsfixture import NatsServer
from support.buckets import live_keys
from support.cards import base_card
from workerset_admission import cli
from workerset_admission.cli.traces import record_trace
from workerset_admission.settings import load_settings
from workerset_admission.traces.format import TRACE_VERSION

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

CARD = base_card()
WORKER = ["--namespace", "dgd-v1", "--component", "backend", "--endpoint", "generate"]


def main(argv: list[str]) -> int:
    """Run one subcommand through the command line's own runner."""
    return cli.main(argv)


_RUN_REGISTER = (
    "import sys\n"
    "from workerset_admission import cli\n"
    "sys.exit(cli.main(['register', *sys.argv[1:]]))\n"
)


class LineSink:
    """A text sink that counts complete lines and wakes a waiter at a target count."""

    def __init__(self) -> None:
        self.text = ""
        self.target = 1
        self.reached = asyncio.Event()

    def write(self, chunk: str) -> int:
        self.text += chunk
        if self.text.count("\n") >= self.target:
            self.reached.set()
        return len(chunk)

    def flush(self) -> None:
        return None

    async def wait_for_lines(self, count: int) -> None:
        self.target = count
        if self.text.count("\n") < count:
            self.reached.clear()
            await asyncio.wait_for(self.reached.wait(), 10)


async def bucket_keys(url: str, bucket: str) -> list[str]:
    nc = await nats.connect(url)
    try:
        return await live_keys(await nc.jetstream().key_value(bucket))
    finally:
        await nc.close()


async def stored_types(url: str, bucket: str, keys: list[str]) -> list[str]:
    """Return the record type stored under each key."""
    nc = await nats.connect(url)
    try:
        kv = await nc.jetstream().key_value(bucket)
        return [json.loads((await kv.get(key)).value)["type"] for key in keys]
    finally:
        await nc.close()


def test_register_once_then_deregister_leaves_the_bucket_empty(
    nats_server: NatsServer, bucket_name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    card = tmp_path / "card.json"
    card.write_text(json.dumps(CARD))
    common = ["--nats-server", nats_server.url, "--discovery-bucket", bucket_name, *WORKER]
    assert main(["register", *common, "--card", str(card), "--instance-id", "0x1f", "--once"]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["registered"] == [
        "v1.mdc.dgd-v1.backend.generate.1f",
        "v1.instances.dgd-v1.backend.generate.1f",
    ]
    assert asyncio.run(bucket_keys(nats_server.url, bucket_name)) == sorted(printed["registered"])

    assert main(["deregister", *common, "--instance-id", "31", "--endpoint-record"]) == 0
    assert asyncio.run(bucket_keys(nats_server.url, bucket_name)) == []


def test_register_runs_until_interrupted_and_then_withdraws(
    nats_server: NatsServer, bucket_name: str, tmp_path: Path
) -> None:
    card = tmp_path / "record.json"
    card.write_text(json.dumps({"type": "Model", "card_json": CARD}))
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _RUN_REGISTER,
            "--nats-server",
            nats_server.url,
            "--discovery-bucket",
            bucket_name,
            *WORKER,
            "--card",
            str(card),
            "--ttl",
            "2",
            "--no-endpoint-record",
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONWARNINGS": "error"},
    )
    with process:
        try:
            assert process.stdout is not None
            registered = json.loads(process.stdout.readline())["registered"]
            assert len(registered) == 1
            assert registered[0].startswith("v1.mdc.dgd-v1.backend.generate.")
            # Read by key: a keys() scan is not consistent while the heartbeat rewrites the key.
            # Any key beyond these would still be there after the withdrawal checked below.
            assert asyncio.run(stored_types(nats_server.url, bucket_name, registered)) == ["Model"]
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=20) == 0
        finally:
            if process.poll() is None:
                process.kill()
    assert asyncio.run(bucket_keys(nats_server.url, bucket_name)) == []


def test_a_missing_card_file_is_a_clear_error(
    nats_server: NatsServer, bucket_name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        ["register", "--nats-server", nats_server.url, *WORKER, "--card", str(tmp_path / "no")]
    )
    assert code == 2
    assert "card file" in capsys.readouterr().err


async def test_record_writes_a_header_a_snapshot_with_raw_text_then_live_lines_with_times(
    nats_server: NatsServer, bucket_name: str, tmp_path: Path
) -> None:
    nc = await nats.connect(nats_server.url)
    try:
        kv = await nc.jetstream().create_key_value(bucket=bucket_name)
        await kv.put("v1.mdc.a.b.c.1", b'{"type": "Model" }')
        await kv.put("v1.mdc.a.b.c.2", b"\xff not utf-8")
        settings = load_settings(
            env={}, flags={"nats_servers": nats_server.url, "discovery_bucket": bucket_name}
        )
        sink = LineSink()
        stop = asyncio.Event()
        recorder = asyncio.create_task(record_trace(settings, sink, duration=20, stop=stop))  # type: ignore[arg-type]
        await sink.wait_for_lines(2)
        await kv.put("v1.instances.a.b.c.1", b"{}")
        await kv.delete("v1.mdc.a.b.c.1")
        await kv.purge("v1.mdc.a.b.c.2")
        await sink.wait_for_lines(5)
        stop.set()
        # The header, the listing, three changes and the tick that ends the recording.
        assert await asyncio.wait_for(recorder, 10) == 6
    finally:
        await nc.close()
    lines = [json.loads(line) for line in sink.text.splitlines()]
    header, snapshot, *live = lines
    assert header["kind"] == "trace"
    # The current format; a second watch on the bucket records no effect digests in it.
    assert header["version"] == TRACE_VERSION
    assert header["observer"] == "bucket"
    assert abs(header["wall_time"] - time.time()) < 60
    assert snapshot["kind"] == "snapshot"
    assert snapshot["reason"] == "initial"
    values = {e["key"]: e["value"] for e in snapshot["entries"]}
    assert values["v1.mdc.a.b.c.1"] == '{"type": "Model" }'
    assert values["v1.mdc.a.b.c.2"].encode("utf-8", "surrogateescape") == b"\xff not utf-8"
    times = [line["t"] for line in (snapshot, *live)]
    assert times == sorted(times)
    assert all(0 <= t < 20 for t in times)
    assert [{k: v for k, v in line.items() if k != "t"} for line in live] == [
        {"kind": "put", "key": "v1.instances.a.b.c.1", "value": "{}"},
        {"kind": "delete", "key": "v1.mdc.a.b.c.1", "operation": "delete"},
        {"kind": "delete", "key": "v1.mdc.a.b.c.2", "operation": "purge"},
        {"kind": "tick"},
    ]


async def test_a_recording_shorter_than_the_listing_still_holds_the_listing(
    nats_server: NatsServer, bucket_name: str
) -> None:
    """The duration counts from the listing on: a short recording on a slow connection (a
    loaded machine, a far server) used to end before the listing arrived, with no records."""
    nc = await nats.connect(nats_server.url)
    try:
        kv = await nc.jetstream().create_key_value(bucket=bucket_name)
        await kv.put("v1.mdc.a.b.c.1", b'{"type": "Model"}')
    finally:
        await nc.close()
    settings = load_settings(
        env={}, flags={"nats_servers": nats_server.url, "discovery_bucket": bucket_name}
    )
    sink = LineSink()
    # Far shorter than connecting and listing take.
    assert await asyncio.wait_for(record_trace(settings, sink, duration=0.001), 30) == 3  # type: ignore[arg-type]
    header, listing, end = [json.loads(text) for text in sink.text.splitlines()]
    assert (header["kind"], listing["kind"], end["kind"]) == ("trace", "snapshot", "tick")
    assert [e["key"] for e in listing["entries"]] == ["v1.mdc.a.b.c.1"]
