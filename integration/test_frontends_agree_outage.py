"""Frontends agree through an outage, even when one (or both) restarts during it; real NATS.

Two ``serve --view-dir`` processes (registration TTL 3 s) serve incumbent A (two workers) with
cohort B (one worker) waiting. A's workers stop refreshing their registrations (a stalled
heartbeat), nats-server is killed, a frontend is SIGKILLed and started again while it is down,
and the server comes back before A's records run out (or after); a restarted frontend may also
start only once the server is back (a supervisor slower than NATS), or be started cold at the
SIGKILL and so reach NATS first only after it is back, perhaps before any peer has resynced. A's
workers then register again. Whatever restarted, both frontends must end on the same incumbent:
A.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client as NatsClient
from natsfixture import NatsServer
from support.cards import base_card
from support.cards import group_of as card_group
from support.fleet import admin
from support.fleet import settings_for as fleet_settings
from support.serve_process import CLI, ServeProcess
from workerset_admission.adapters.nats.admission_reader import NatsRecordSource
from workerset_admission.adapters.nats.connect import NatsConnectOptions
from workerset_admission.adapters.nats.registrar import WorkerRegistrar
from workerset_admission.card.serving_record import CapabilityRecord, parse_record
from workerset_admission.cli.rollout import GateQuery, check_gate
from workerset_admission.errors import InvalidRecordError
from workerset_admission.identity import EndpointId
from workerset_admission.traces.replay import replay
from workerset_admission.wiring.compose import create_service

# The rollout tier (docs/testing.md): long faults and concurrency trials, its own CI step.
pytestmark = [pytest.mark.integration, pytest.mark.rollout, pytest.mark.timeout(180)]

DISCOVERY = "dynamo-discovery"
ADMISSION = "frontend-model-admission"
EP = EndpointId("agree-outage", "backend", "generate")
A, B = base_card(16), base_card(32)
A_IDS, B_IDS = (0x10, 0x11), (0x1,)
TTL = 3.0
FRONTENDS = ("fe-1", "fe-2")


async def until(condition: Callable[[], Any], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout:g} s")
        await asyncio.sleep(0.1)


async def _done(value: bool) -> bool:
    return value


def workers(nc: NatsClient) -> WorkerRegistrar:
    return WorkerRegistrar(
        nc.jetstream(timeout=2), bucket=DISCOVERY, ttl=TTL, on_removed="reregister"
    )


def serve(
    url: str, root: Path, name: str, *, armed: bool = False, clock_skew: float = 0.0
) -> ServeProcess:
    view = root / name / "view"
    view.mkdir(parents=True, exist_ok=True)
    return ServeProcess(
        [
            *("--nats-server", url, "--view-dir", str(view)),
            *("--discovery-bucket", DISCOVERY, "--admission-bucket", ADMISSION),
            *("--frontend-id", name, "--status-subject", f"status.{name}"),
            *("--registration-ttl", str(TTL), "--trace-out", str(root / name / "trace.jsonl")),
        ],
        view_dir=view,
        armed=armed,
        clock_skew=clock_skew,
    )


async def status_of(nc: NatsClient, name: str) -> dict[str, Any] | None:
    try:
        reply = await nc.request(f"status.{name}", b"", timeout=2)
    except Exception:
        return None
    status: dict[str, Any] = json.loads(reply.data)
    return status


async def group_seen_by(nc: NatsClient, name: str) -> dict[str, Any] | None:
    status = await status_of(nc, name)
    groups = [] if status is None else status["groups"]
    return groups[0] if groups else None


async def settled(nc: NatsClient, name: str) -> dict[str, Any] | None:
    """The frontend's group once it serves, holds nothing and has seen both cohorts."""
    group = await group_seen_by(nc, name)
    if (
        group is None
        or group.get("held")
        or group["status"] != "ready"
        or len(group["cohorts"]) != 2
        or not group["admitted"]
    ):
        return None
    return group


async def disagreements(url: str) -> list[dict[str, Any]]:
    check = await check_gate(
        NatsRecordSource(NatsConnectOptions(servers=(url,)), ADMISSION, timeout=3.0),
        GateQuery(model=str(A["display_name"]), namespace=EP.namespace, require_agreement=True),
    )
    assert check.report is not None
    return [item.as_json() for item in check.report.disagreements]


async def resynced(url: str, name: str) -> bool:
    """Whether a frontend's capability record says it resynced after an outage."""
    read = await NatsRecordSource(NatsConnectOptions(servers=(url,)), ADMISSION).read()
    for entry in read.entries:
        with contextlib.suppress(InvalidRecordError):
            record = parse_record(entry.key, entry.value)
            capability = isinstance(record, CapabilityRecord) and not record.heartbeat
            if capability and record.frontend == name:
                return record.resynced_at is not None
    return False


async def one_trial(
    server: NatsServer,
    root: Path,
    restarted: tuple[str, ...],
    back_after_ttl: bool,
    starts_after_return: bool = False,
    clock_skews: dict[str, float] | None = None,
    cold: bool = False,
) -> None:
    handle = server.handle
    assert handle is not None
    url = server.url
    skews = clock_skews or {}
    running = {name: serve(url, root, name, clock_skew=skews.get(name, 0.0)) for name in FRONTENDS}
    spares: dict[str, ServeProcess] = {}
    try:
        # Connections that ride out every outage by reconnecting (the workers', the test's).
        async with admin(url) as nc, admin(url) as nc_a, admin(url) as nc_b:
            a, b = workers(nc_a), workers(nc_b)
            for instance in A_IDS:
                await a.register(EP, instance, A)
            for name in FRONTENDS:
                await until(lambda n=name: group_seen_by(nc, n), 60, f"{name} reserving A")
            for instance in B_IDS:
                await b.register(EP, instance, B)
            for name in FRONTENDS:
                await until(lambda n=name: settled(nc, n), 60, f"{name} serving A, B waiting")
            first = await settled(nc, FRONTENDS[0])
            assert first is not None
            a_checksum = first["incumbent"]
            # The restarted frontends' processes, loaded and waiting (their trace files are
            # their predecessors' until they start).
            spares = {
                name: serve(url, root, name, armed=True, clock_skew=skews.get(name, 0.0))
                for name in ([] if cold else restarted)
            }
            for name in spares:
                await asyncio.to_thread(spares[name].wait_for_line, "armed", 60)
            await asyncio.sleep(1.0)  # the serving records reach the bucket

            # A's records are fresh now and run out TTL seconds from here: nobody refreshes them.
            beat = a.refreshes
            a.refresh_now()
            await until(lambda: _done(a.refreshes >= beat + len(A_IDS)), 10, "A's refresh")
            await a.stop_heartbeat()
            stalled_at = time.monotonic()
            await asyncio.to_thread(handle.stop, kill=True)
            for name in restarted:
                running[name].kill()
                if cold:
                    # A supervisor starts a new process at once; loading it takes what it takes.
                    running[name] = serve(url, root, name, clock_skew=skews.get(name, 0.0))
                    continue
                running[name] = spares.pop(name)
                if not starts_after_return:
                    running[name].fire()
            for name in restarted:
                if not starts_after_return and not cold:
                    await asyncio.to_thread(
                        running[name].wait_for_line, "cannot reach NATS yet", 30
                    )
            if back_after_ttl:
                await asyncio.sleep(max(0.0, stalled_at + TTL + 1.0 - time.monotonic()))
            else:
                await asyncio.sleep(1.0)
            await asyncio.to_thread(handle.start)
            back_at = time.monotonic()
            if starts_after_return:
                # Its supervisor was slower than NATS: it starts once a peer has resynced.
                others = [name for name in FRONTENDS if name not in restarted]
                for name in others:
                    await until(lambda n=name: resynced(url, n), 30, f"{name}'s resync")
                for name in restarted:
                    running[name].fire()
            if not back_after_ttl:
                # The point of the case: the server is back before A's records run out.
                assert back_at < stalled_at + TTL, "the server came back too late for this case"

            # A's records run out (or are gone already); then its workers come back.
            await asyncio.sleep(max(0.0, stalled_at + TTL + 2.0 - time.monotonic()))
            for instance in A_IDS:
                await a.register(EP, instance, A)

            for name in FRONTENDS:
                await until(lambda n=name: settled(nc, n), 90, f"{name} settling")
            await asyncio.sleep(2.0)  # anything still to happen after settling would show now
            served = {}
            for name in FRONTENDS:
                group = await settled(nc, name)
                assert group is not None, name
                served[name] = (group["incumbent"], tuple(group["admitted"]))
            assert served == dict.fromkeys(FRONTENDS, (a_checksum, A_IDS)), served
            assert await disagreements(url) == []

            # The restarted frontend's own trace replays to what it decided live.
            for name in restarted:
                code, output = running[name].stop()
                assert code == 0, output
                trace = (root / name / "trace.jsonl").read_text().splitlines()
                result = replay(trace)
                (group,) = result.core.groups()
                assert (group.incumbent, tuple(sorted(group.admitted))) == served[name]
            await a.close()
            await b.close()
    finally:
        for process in [*running.values(), *spares.values()]:
            process.stop()


@pytest.mark.parametrize(
    ("restarted", "back_after_ttl", "starts_after_return"),
    [
        (("fe-1",), False, False),
        (("fe-2",), False, False),
        (("fe-1", "fe-2"), False, False),
        (("fe-1",), True, False),
        (("fe-1", "fe-2"), True, False),
        (("fe-1",), False, True),
        (("fe-1",), True, True),
    ],
    ids=[
        "first-restarted",
        "other-restarted",
        "both-restarted",
        "first-late",
        "both-late",
        "first-starts-after-return",
        "first-late-starts-after-return",
    ],
)
async def test_frontends_end_on_the_same_incumbent_when_one_restarts_during_an_outage(
    nats_server_fn: NatsServer,
    tmp_path: Path,
    restarted: tuple[str, ...],
    back_after_ttl: bool,
    starts_after_return: bool,
) -> None:
    await one_trial(nats_server_fn, tmp_path, restarted, back_after_ttl, starts_after_return)


async def test_status_names_the_frontends_that_serve_another_configuration(
    nats_server: NatsServer, bucket_name: str
) -> None:
    admission = f"{bucket_name}-adm"
    settings = fleet_settings(
        nats_server.url,
        discovery_bucket=bucket_name,
        admission_bucket=admission,
        status_subject=f"status.{bucket_name}",
        frontend_id="fe-a",
    )
    service = await create_service(settings)
    try:
        async with admin(nats_server.url) as nc:
            workers = WorkerRegistrar(nc.jetstream(), bucket=bucket_name, ttl=None)
            await workers.register(EP, A_IDS[0], A)
            group = card_group(A, EP)
            await until(lambda: _done(bool(service.serving_records())), 30, "A served")
            served = service.status().groups[0].incumbent
            assert served is not None
            # Another frontend serves B of the same WorkerSet (its record, as it writes it).
            other = "b" * 64
            kv = await nc.jetstream().key_value(admission)
            member = f"{EP.namespace}/{EP.component}/{EP.endpoint}/1"
            record = {
                "protocol": "v1",
                "frontend": "fe-b",
                "namespace": EP.namespace,
                "members": [member],
                "groups": [
                    {
                        "model": group.model,
                        "worker_set": group.worker_set,
                        "checksum": other,
                        "generation": 1,
                        "members": [member],
                    }
                ],
            }
            await kv.put(f"v1.fe-b.members.{EP.namespace}", json.dumps(record).encode())
            flags = [
                *("--nats-server", nats_server.url, "--status-subject", settings.status_subject),
                *("--admission-bucket", admission),
            ]
            code, table = await _cli("status", *flags)
            assert code == 0, table
            assert (
                f"disagreement on {group.worker_set}: fe-a serves {served[:12]}; "
                f"fe-b serves {other[:12]}"
            ) in table
            code, text = await _cli("status", "--json", *flags)
            assert code == 0, text
            assert json.loads(text)["disagreements"] == [
                {"worker_set": group.worker_set, "incumbents": {served: ["fe-a"], other: ["fe-b"]}}
            ]
            await workers.close()
    finally:
        await service.stop()


async def _cli(*args: str) -> tuple[int, str]:
    """Run the CLI without blocking this loop (the service under test answers on it)."""
    process = await asyncio.create_subprocess_exec(
        *CLI,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={k: v for k, v in os.environ.items() if not k.startswith("WORKERSET_ADMISSION_")},
    )
    out, _ = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, out.decode()


@pytest.mark.parametrize(
    "clock_skews",
    [{"fe-2": -120.0}, {"fe-2": 120.0}, {"fe-1": 120.0}, {"fe-1": -120.0}],
    ids=["peer-2-min-behind", "peer-2-min-ahead", "starter-2-min-ahead", "starter-2-min-behind"],
)
async def test_frontends_agree_when_a_hosts_clock_is_minutes_off(
    nats_server_fn: NatsServer, tmp_path: Path, clock_skews: dict[str, float]
) -> None:
    # fe-1 starts once NATS is back and learns of the outage from fe-2's resync record: how
    # long ago that was is read on the server's clock, so neither host's clock can move it.
    await one_trial(
        nats_server_fn,
        tmp_path,
        ("fe-1",),
        back_after_ttl=False,
        starts_after_return=True,
        clock_skews=clock_skews,
    )


@pytest.mark.parametrize("restarted", ["fe-1", "fe-2"])
async def test_frontends_agree_when_one_restarts_cold_during_a_one_second_outage(
    nats_server_fn: NatsServer, tmp_path: Path, restarted: str
) -> None:
    # The restarted process is started when its predecessor dies, with nothing loaded: on a
    # busy host it reaches NATS only once the server is back, maybe before its peer resynced.
    await one_trial(nats_server_fn, tmp_path, (restarted,), back_after_ttl=False, cold=True)
