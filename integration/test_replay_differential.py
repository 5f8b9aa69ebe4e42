"""A live service's own recording replays to its own final decision, on a real nats-server.

Each test runs the service with ``trace_out`` (what ``serve --trace-out`` sets), plays one
scenario against a real server, stops the service, then replays the trace it wrote and
compares the replay with the live state: every group's incumbent, status, generation,
receiver, admitted ids, cohorts in order and hold; every rejection report, in order; every
refused record. The scenarios are the ones an operator records for: a rolling update with a
conflicting cohort, an outage longer than the registration TTL with the tenure hold, a wiped
store, churn with refused records, a build that fails and retries on its deadline, and a
build result that arrives after a succession.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from natsfixture import NatsServer
from support.fleet import (
    DISCOVERY,
    NEW,
    OLD,
    Builder,
    admin,
    endpoint,
    fresh_buckets,
    group_of,
    rebuilt_buckets,
    running,
    settings_for,
    until,
)
from workerset_admission.adapters.nats.registrar import WorkerRegistrar
from workerset_admission.admission import CommitGroup, CoreSettings, Effect, RejectionReported
from workerset_admission.card import encode_model_record
from workerset_admission.cli.connection import client_options
from workerset_admission.cli.traces import decision_state_of, record_trace
from workerset_admission.errors import Unreachable, UsageError
from workerset_admission.keys import model_kv_key
from workerset_admission.service.admission_service import AdmissionService
from workerset_admission.service.bindings import HopBindings
from workerset_admission.service.status_model import GroupStatusReport
from workerset_admission.service.step import EffectReader
from workerset_admission.settings import Settings
from workerset_admission.traces.format import STEPPED, read_trace, recorded_settings
from workerset_admission.traces.replay import replay
from workerset_admission.traces.state_line import DecisionState
from workerset_admission.traces.writer import TraceWriter

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

EP = endpoint(7)
GROUP = group_of(EP)
RETRIES = (0.05, 0.1, 0.2, 0.4)


@contextlib.asynccontextmanager
async def recorded(
    url: str, trace: Path, builder: Builder | None = None, **overrides: Any
) -> AsyncIterator[tuple[AdmissionService, list[RejectionReported]]]:
    """A running service that records its own trace; yields it and its live rejections."""
    reports: list[RejectionReported] = []

    def collect(effects: Sequence[Effect]) -> None:
        reports.extend(e for e in effects if isinstance(e, RejectionReported))

    async with running(url, builder, trace_out=trace, **overrides) as (service, _watchdog):
        service.subscribe(EffectReader(collect))
        yield service, reports


def assert_replay_matches(
    service: AdmissionService,
    reports: Sequence[RejectionReported],
    trace: Path,
    *,
    tenure_hold: float,
) -> dict[str, Any]:
    """Replay the service's trace and compare with its state after it stopped."""
    lines = trace.read_text(encoding="utf-8").splitlines()
    header = json.loads(lines[0])
    assert header["kind"] == "trace"
    assert header["observer"] == "frontend"
    recorded_core, _ = recorded_settings(read_trace(lines))
    assert recorded_core is not None
    assert (recorded_core.retry_delays, recorded_core.tenure_hold) == (RETRIES, tenure_hold)
    # Under the recorded settings every line's effects are checked against the recorded ones.
    result = replay(lines)
    stepped = [line for line in read_trace(lines) if line["kind"] in STEPPED]
    assert result.checked == len(stepped)
    replayed = result.to_json()
    live = service.status()
    start = _trace_start(service)
    fields = ("group_id", "incumbent", "status", "generation", "receiver")
    live_groups = [g.to_json() for g in live.groups]
    assert [{f: g[f] for f in fields} for g in replayed["groups"]] == [
        {f: g[f] for f in fields} for g in live_groups
    ]
    for mine, view, theirs in zip(
        live_groups, service.core.groups(), replayed["groups"], strict=True
    ):
        assert theirs["admitted"] == mine["admitted"]
        assert theirs["cohorts"] == mine["cohorts"]
        assert ("held_until" in theirs) == mine["held"]
        if view.held_until is not None:
            # The core's clock is the monotonic one; the trace counts from its first line.
            assert theirs["held_until"] == pytest.approx(view.held_until - start, abs=1e-6)
    assert [
        (r["group_id"], r["incumbent_checksum"], r["rejected_checksum"], r["instance"])
        for r in replayed["rejections"]
    ] == [(r.group.id, r.incumbent_checksum, r.rejected_checksum, r.instance) for r in reports]
    assert replayed["invalid"] == [
        {"key": record.key, "reason": record.reason} for record in live.recent_invalid
    ]
    return replayed


def _trace_start(service: AdmissionService) -> float:
    """The live clock reading the trace counts its times from."""
    [writer] = [o for o in service.step.subscribers if isinstance(o, TraceWriter)]
    start = writer._start
    assert start is not None
    return start


def kinds(trace: Path) -> list[str]:
    return [json.loads(line)["kind"] for line in trace.read_text(encoding="utf-8").splitlines()]


def admitted(service: AdmissionService) -> tuple[int, ...]:
    group = service.status().group(GROUP)
    return () if group is None else group.admitted


async def test_a_rolling_update_with_a_conflicting_cohort_replays_to_the_live_succession(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    trace = tmp_path / "trace.jsonl"
    async with admin(nats_server.url) as nc:
        fleet = await fresh_buckets(nc)
        async with recorded(nats_server.url, trace) as (service, reports):
            await fleet.register(EP, [1, 2], OLD)
            await until(lambda: admitted(service) == (1, 2), what="the old cohort admitted")
            await fleet.register(EP, [3, 4], NEW)
            await until(lambda: len(reports) == 1, what="the new cohort rejected")
            await fleet.remove(EP, [1])
            await fleet.remove(EP, [2])
            await until(lambda: admitted(service) == (3, 4), what="the succession")
            await fleet.register(EP, [5], OLD)  # the old configuration returns at the end
            await until(lambda: len(reports) == 2, what="the returning cohort rejected")
    replayed = assert_replay_matches(service, reports, trace, tenure_hold=1.0)
    assert replayed["groups"][0]["generation"] >= 2


async def test_an_outage_longer_than_the_ttl_replays_with_its_hold_and_succession(
    nats_server_fn: NatsServer, tmp_path: Path
) -> None:
    handle = nats_server_fn.handle
    assert handle is not None
    trace = tmp_path / "trace.jsonl"
    ttl, hold = 1.0, 2.0
    # The service creates the buckets as it does in production (TTL expiry markers on), so
    # A's records, expired during the outage, arrive as expiries after the reconnect.
    async with admin(nats_server_fn.url) as nc_a, admin(nats_server_fn.url) as nc_b:

        def publisher(nc: Any) -> WorkerRegistrar:
            return WorkerRegistrar(
                nc.jetstream(timeout=2),
                bucket=DISCOVERY,
                ttl=ttl,
                on_removed="reregister",
            )

        a, b = publisher(nc_a), publisher(nc_b)
        async with recorded(nats_server_fn.url, trace, registration_ttl=ttl, tenure_hold=hold) as (
            service,
            reports,
        ):
            await a.register(EP, 1, OLD)
            await until(lambda: admitted(service) == (1,), what="A admitted")
            await b.register(EP, 2, NEW)
            await until(lambda: len(reports) == 1, what="B rejected")
            await a.stop_heartbeat()  # A dies with the outage
            await asyncio.to_thread(handle.restart, kill=True, downtime=2.5 * ttl)
            await until(lambda: admitted(service) == (2,), 60, what="the succession to B")
            await b.close()
            await a.close(withdraw=False)
    assert_replay_matches(service, reports, trace, tenure_hold=hold)
    # Replayed line by line, the recording is held from the line where the live hold began
    # (a reconnect listing without A, or A's expiry soon after one) until the succession.
    text = trace.read_text(encoding="utf-8").splitlines()
    lines = [json.loads(line) for line in text]
    settings = CoreSettings(retry_delays=RETRIES, tenure_hold=hold)
    prefixes = [replay(text[: n + 1], core_settings=settings).to_json() for n in range(len(text))]
    held = [
        n for n, out in enumerate(prefixes) if out["groups"] and "held_until" in out["groups"][0]
    ]
    assert held, "the replay never held the tenure"
    began = lines[held[0]]
    assert (began["kind"], began.get("reason", began.get("operation"))) in (
        ("snapshot", "reconnect"),
        ("delete", "expired"),
    )
    group = prefixes[held[0]]["groups"][0]
    # The hold counts from the reconnect listing it follows, whatever line emptied the cohort:
    # one outage holds a WorkerSet for the hold at most.
    reconnect_t = max(
        line["t"]
        for line in lines[: held[0] + 1]
        if line["kind"] == "snapshot" and line["reason"] == "reconnect"
    )
    assert group["held_until"] == pytest.approx(reconnect_t + hold)
    assert group["incumbent"] == reports[0].incumbent_checksum
    # A, gone with the outage, is served on its last known record meanwhile.
    assert (group["admitted"], group["last_known"]) == ([1], [1])


async def test_a_wiped_store_replays_to_what_the_workers_registered_again(
    nats_server_fn: NatsServer, tmp_path: Path
) -> None:
    handle = nats_server_fn.handle
    assert handle is not None
    trace = tmp_path / "trace.jsonl"
    async with admin(nats_server_fn.url) as nc:
        fleet = await fresh_buckets(nc)
        async with recorded(nats_server_fn.url, trace, tenure_hold=1.0) as (service, reports):
            await fleet.register(EP, [1, 2], OLD)
            await fleet.register(EP, [3], NEW)
            await until(lambda: len(reports) == 1, what="the conflict")
            await asyncio.to_thread(handle.restart, wipe=True, downtime=0.3)
            fleet = await rebuilt_buckets(nc)
            await fleet.register(EP, [3], NEW)
            await fleet.register(EP, [1, 2], OLD)
            await until(
                lambda: bool(admitted(service)) and service.status().groups[0].held_until is None,
                60,
                what="the group to settle after the wipe",
            )
    assert_replay_matches(service, reports, trace, tenure_hold=1.0)


async def test_churn_with_refused_records_replays_to_the_same_state_and_refusals(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    trace = tmp_path / "trace.jsonl"
    async with admin(nats_server.url) as nc:
        fleet = await fresh_buckets(nc)
        kv = fleet.kv
        async with recorded(nats_server.url, trace) as (service, reports):
            for round_ in range(6):
                base = 100 + 10 * round_
                await fleet.register(EP, range(base, base + 5), OLD if round_ % 2 else NEW)
                await kv.put(f"v1.mdc.{EP.namespace}.backend.generate.{base + 9:x}", b"{not json")
                await kv.put(f"v1.mdc.{EP.namespace}.backend.generate.{base + 8:x}", b"[]")
                await fleet.remove(EP, range(base, base + 3))
            await until(lambda: service.counters.invalid >= 12, what="every refusal reported")
            await until(lambda: service.status().groups[0].status == "ready", what="a ready group")
    assert_replay_matches(service, reports, trace, tenure_hold=1.0)


async def test_a_build_that_fails_and_retries_on_its_deadline_replays_with_the_same_generations(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    trace = tmp_path / "trace.jsonl"
    builder = Builder(fail={GROUP: 3})
    async with admin(nats_server.url) as nc:
        fleet = await fresh_buckets(nc)
        async with recorded(nats_server.url, trace, builder) as (service, reports):
            await fleet.register(EP, [1, 2], OLD)
            await until(
                lambda: (
                    service.status().groups[0].status == "ready"
                    if service.status().groups
                    else False
                ),
                what="ready after the retries",
            )
    replayed = assert_replay_matches(service, reports, trace, tenure_hold=1.0)
    assert builder.failed == 3
    assert replayed["groups"][0]["generation"] == 4
    lines = [json.loads(line) for line in trace.read_text(encoding="utf-8").splitlines()]
    outcomes = [line["outcome"] for line in lines if line["kind"] == "build"]
    assert outcomes == ["failed", "failed", "failed", "ok"]
    assert kinds(trace).count("tick") >= 3


async def test_a_build_result_that_arrives_after_a_succession_is_fenced_in_the_replay_too(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    trace = tmp_path / "trace.jsonl"
    builder = Builder(late={GROUP})
    async with admin(nats_server.url) as nc:
        fleet = await fresh_buckets(nc)
        async with recorded(nats_server.url, trace, builder) as (service, reports):
            await fleet.register(EP, [1], OLD)
            await fleet.register(EP, [2], NEW)
            await until(lambda: len(reports) == 1, what="the conflict")
            # The old incumbent goes while its build hangs; the builder returns anyway, late.
            builder.late.clear()
            await fleet.remove(EP, [1])
            await until(lambda: builder.late_returned.is_set(), what="the late result")
            await until(lambda: admitted(service) == (2,), what="the successor served")
    lines = [json.loads(line) for line in trace.read_text(encoding="utf-8").splitlines()]
    builds = [line for line in lines if line["kind"] == "build"]
    deleted_at = next(line["t"] for line in lines if line["kind"] == "delete")
    # The late result is in the trace, for the first tenure's generation, after the old
    # incumbent went; the core fenced it live, and does again in the replay.
    late = [line for line in builds if line["generation"] == 1]
    assert len(late) == 1
    assert late[0]["t"] >= deleted_at
    assert any(line["generation"] == 2 and line["outcome"] == "ok" for line in builds)
    replayed = assert_replay_matches(service, reports, trace, tenure_hold=1.0)
    assert replayed["groups"][0]["incumbent"] != late[0]["checksum"]
    assert replayed["groups"][0]["generation"] == 2
    assert replayed["groups"][0]["status"] == "ready"


async def a_serves_and_b_waits(
    service: AdmissionService, nc_a: Any, nc_b: Any, ttl: float
) -> tuple[WorkerRegistrar, WorkerRegistrar]:
    """A/1 admitted and B/2 rejected, each on its own connection; B re-registers if removed."""
    a = WorkerRegistrar(nc_a.jetstream(timeout=2), bucket=DISCOVERY, ttl=ttl)
    b = WorkerRegistrar(
        nc_b.jetstream(timeout=2), bucket=DISCOVERY, ttl=ttl, on_removed="reregister"
    )
    await a.register(EP, 1, OLD)
    await until(lambda: admitted(service) == (1,), what="A admitted")
    await b.register(EP, 2, NEW)
    await until(lambda: len(service.status().groups[0].cohorts) == 2, what="B seen")
    return a, b


async def stop_recording_and_workers(
    stop: asyncio.Event,
    recorder: asyncio.Task[int],
    service: AdmissionService,
    a: WorkerRegistrar,
    b: WorkerRegistrar,
) -> GroupStatusReport:
    """End the recording, take the live group as it stands, and let the workers go quietly."""
    stop.set()
    await asyncio.wait_for(recorder, 15)
    live = service.status().groups[0]
    await b.close()
    await a.close(withdraw=False)
    return live


@pytest.mark.rollout  # an outage longer than a TTL, recorded live: the slower tier
async def test_record_from_the_bucket_through_an_outage_holds_and_lands_on_the_live_incumbent(
    nats_server_fn: NatsServer, tmp_path: Path
) -> None:
    handle = nats_server_fn.handle
    assert handle is not None
    # A dies with an outage shorter than its TTL: its records are still listed when the
    # watches reconnect, and expire just after, within the hold's window. A container's
    # restart takes from one to about four seconds; A's records expire five to six seconds
    # after it stops, so after the reconnect on any restart within that, and before the
    # reconnect's hold is over.
    ttl, hold = 6.0, 6.0
    recording = io.StringIO()
    stop = asyncio.Event()
    async with (
        admin(nats_server_fn.url) as nc_a,
        admin(nats_server_fn.url) as nc_b,
        running(nats_server_fn.url, registration_ttl=ttl, tenure_hold=hold) as (service, _dog),
    ):
        settings = settings_for(nats_server_fn.url, registration_ttl=ttl, tenure_hold=hold)
        recorder = asyncio.create_task(record_trace(settings, recording, stop=stop))
        await until(lambda: recording.getvalue().count("\n") >= 2, what="the recorder's listing")
        a, b = await a_serves_and_b_waits(service, nc_a, nc_b, ttl)
        await a.stop_heartbeat()
        await asyncio.to_thread(handle.restart, kill=True, downtime=1.0)
        await until(lambda: admitted(service) == (2,), 60, what="the succession to B")
        # The recorder is a second watch: its reconnect, and so its hold, may come a little
        # later than the service's. It runs on until that hold has ended as well.
        await asyncio.sleep(hold + 0.5)
        live = await stop_recording_and_workers(stop, recorder, service, a, b)
    text = recording.getvalue().splitlines()
    lines = [json.loads(line) for line in text]
    assert lines[0]["kind"] == "trace"
    assert lines[0]["observer"] == "bucket"
    assert all(isinstance(line["t"], float) for line in lines[1:])
    reconnect = next(
        i
        for i, line in enumerate(lines)
        if line["kind"] == "snapshot" and line["reason"] == "reconnect"
    )
    expired = [
        i
        for i, line in enumerate(lines)
        if line["kind"] == "delete" and line["operation"] == "expired"
    ]
    assert expired, "the expiry of A's records is recorded as an expiry"
    assert expired[0] > reconnect
    core = CoreSettings(tenure_hold=hold)
    prefixes = [replay(text[: n + 1], core_settings=core).to_json() for n in range(len(text))]
    held = [
        n for n, out in enumerate(prefixes) if out["groups"] and "held_until" in out["groups"][0]
    ]
    assert held, "the replay of the recording never held the tenure"
    # As live: the hold serves A on its last known record, for one registration TTL at most.
    began = prefixes[held[0]]["groups"][0]
    assert (began["admitted"], began["last_known"]) == ([1], [1])
    assert began["last_known_until"] <= began["held_until"]
    [group] = prefixes[-1]["groups"]
    assert (group["incumbent"], group["admitted"]) == (live.incumbent, list(live.admitted))


async def _state_of(settings: Settings, timeout: float = 10.0) -> DecisionState:
    """The frontend's decision state, once its status responder is back after the outage."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        options = client_options(settings, "record")
        try:
            return await decision_state_of(options, settings.status_subject, settings.frontend_id)
        except Unreachable:
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.1)


async def test_a_bucket_recording_begun_during_a_hold_replays_as_held_and_lands_as_live(
    nats_server_fn: NatsServer,
) -> None:
    handle = nats_server_fn.handle
    assert handle is not None
    ttl, hold = 1.0, 4.0
    recording = io.StringIO()
    stop = asyncio.Event()
    settings = settings_for(nats_server_fn.url, registration_ttl=ttl, tenure_hold=hold)
    async with (
        admin(nats_server_fn.url) as nc_a,
        admin(nats_server_fn.url) as nc_b,
        running(nats_server_fn.url, registration_ttl=ttl, tenure_hold=hold) as (service, _dog),
    ):
        a, b = await a_serves_and_b_waits(service, nc_a, nc_b, ttl)
        await a.stop_heartbeat()  # A dies with an outage longer than its TTL
        await asyncio.to_thread(handle.restart, kill=True, downtime=2.5 * ttl)
        await until(lambda: service.status().groups[0].held_until is not None, 30, what="the hold")
        held = service.status().groups[0]
        # The recording begins now, mid-hold: the bucket lists B alone, and only the live
        # frontend's state says A holds the WorkerSet.
        state = await _state_of(settings)
        recorder = asyncio.create_task(record_trace(settings, recording, stop=stop, state=state))
        await until(lambda: admitted(service) == (2,), 30, what="the succession to B")
        await asyncio.sleep(0.5)
        live = await stop_recording_and_workers(stop, recorder, service, a, b)
    text = recording.getvalue().splitlines()
    lines = [json.loads(line) for line in text]
    assert [line["kind"] for line in lines[:3]] == ["trace", "state", "snapshot"]
    assert all(entry["key"].endswith(".2") for entry in lines[2]["entries"]), "B alone listed"
    core = CoreSettings(tenure_hold=hold, registration_ttl=ttl)
    listed = replay(text[:3], core_settings=core).to_json()["groups"][0]
    # As live when the recording began: A holds the WorkerSet, on its receiver and generation.
    assert (listed["incumbent"], listed["receiver"], listed["generation"]) == (
        held.incumbent,
        held.receiver,
        held.generation,
    )
    assert held.held_until is not None
    assert listed["held_until"] == pytest.approx(held.held_until - lines[0]["wall_time"], abs=0.2)
    assert [c["checksum"] for c in listed["cohorts"]] == [c.mdc_checksum for c in held.cohorts]
    # ... and as live at the end: the succession to B when the hold ran out.
    [group] = replay(text, core_settings=core).to_json()["groups"]
    assert (group["incumbent"], group["receiver"], group["generation"], group["admitted"]) == (
        live.incumbent,
        live.receiver,
        live.generation,
        list(live.admitted),
    )
    assert "held_until" not in group
    # Without the state line, the listing alone gives B the WorkerSet at once.
    [alone] = replay([text[0], *text[2:3]], core_settings=core).to_json()["groups"]
    assert alone["incumbent"] == live.incumbent
    assert "held_until" not in alone


def _adapter_card(capacity: int) -> dict[str, Any]:
    name = "my-lora"
    return {
        **OLD,
        "display_name": name,
        "slug": name,
        "lora": {"name": name, "max_gpu_lora_count": capacity},
    }


async def test_a_refused_projection_and_a_refused_commit_replay_where_they_happened(
    nats_server: NatsServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A hop refuses the group's first commit (its channel, say, is gone): the frontend feeds
    # the refusal back, and its trace records it as an input it made itself.
    commit = HopBindings.commit
    refused: list[CommitGroup] = []

    def first_refused(self: HopBindings, effect: CommitGroup, pipeline: object = None) -> None:
        if not refused:
            refused.append(effect)
            raise UsageError("no open admission channel")  # as HopBindings.commit refuses
        commit(self, effect, pipeline)

    monkeypatch.setattr(HopBindings, "commit", first_refused)
    trace = tmp_path / "trace.jsonl"
    async with admin(nats_server.url) as nc:
        fleet = await fresh_buckets(nc)
        async with recorded(nats_server.url, trace) as (service, reports):

            def status() -> str | None:
                groups = service.status().groups
                return groups[0].status if groups else None

            await fleet.register(EP, [1, 2], OLD)
            await until(lambda: status() == "ready", what="ready after the refused commit")
            # One adapter name with two fingerprints: the core refuses the projection.
            for instance_id, capacity in ((1, 4), (2, 8)):
                await fleet.kv.put(
                    model_kv_key(EP, instance_id, "my-lora"),
                    encode_model_record(EP, instance_id, _adapter_card(capacity), "my-lora"),
                )
            await until(lambda: status() == "blocked_ready", what="the refused projection")
            await fleet.kv.delete(model_kv_key(EP, 2, "my-lora"))
            await until(lambda: status() == "ready", what="ready once the projection is whole")
    assert refused
    lines = [json.loads(line) for line in trace.read_text(encoding="utf-8").splitlines()]
    assert [line["phase"] for line in lines if line["kind"] == "commit_failed"] == ["commit"]
    replayed = assert_replay_matches(service, reports, trace, tenure_hold=1.0)
    assert replayed["groups"][0]["status"] == "ready"
