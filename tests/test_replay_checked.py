"""A frontend's trace holds every input its core took and each step's effects; replay proves it.

A service records itself (a failed build and its retry, a conflicting LoRA projection, an
outage's hold and expiry, a commit a hop refused), and the replay of its trace reaches its exact
state with every line checked. A trace with one line altered stops at that line, named.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from support.aio import time_limit
from support.cards import base_card, lora_card, model_delete, model_entry, model_put
from support.fakes import FakeBuilder, FakeClock, FakeSource, settle
from workerset_admission.admission import CommitGroup
from workerset_admission.cli import main
from workerset_admission.errors import UsageError
from workerset_admission.ports import SourceDelete, SourceListing
from workerset_admission.service.admission_service import AdmissionService
from workerset_admission.service.bindings import HopBindings
from workerset_admission.settings import Settings
from workerset_admission.traces.digest import effects_digest
from workerset_admission.traces.format import (
    STEPPED,
    TRACE_VERSION,
    read_trace,
    recorded_settings,
)
from workerset_admission.traces.replay import NondeterminismError, replay
from workerset_admission.traces.writer import TraceWriter
from workerset_admission.wiring.compose import attach_trace_writer

A = base_card(16)
B = base_card(32)
ADAPTER = "my-lora"


def _status(service: AdmissionService) -> str:
    return str(service.status().groups[0].status)


def _adapters(service: AdmissionService) -> int:
    return sum(len(w.adapters) for view in service.core.groups() for w in view.lora)


async def _record(trace: Path, *, refuse_first_commit: bool = False) -> AdmissionService:
    source, clock, builder = FakeSource(), FakeClock(), FakeBuilder()
    builder.fail_next = 1
    settings = Settings(retry_delays=(0.5,), tenure_hold=3.0, trace_out=trace)
    service = AdmissionService(source, builder=builder, clock=clock, settings=settings)
    attach_trace_writer(service)
    async with time_limit(10):
        await service.start()
        source.queue.put_nowait(SourceListing((model_entry(1, A), model_entry(2, A))))
        source.queue.put_nowait(model_put(3, B))
        await settle(lambda: builder.fail_next == 0 and service.core.builds_in_flight == 0)
        clock.now += 1.0
        service.wake_timers()
        if refuse_first_commit:
            await settle(lambda: _status(service) == "blocked")
            clock.now += 1.0
            service.wake_timers()
        await settle(lambda: _status(service) == "ready")
        # One adapter name with two fingerprints: the core refuses the projection.
        source.queue.put_nowait(model_put(1, lora_card(ADAPTER, capacity=4), suffix=ADAPTER))
        source.queue.put_nowait(model_put(2, lora_card(ADAPTER, capacity=8), suffix=ADAPTER))
        await settle(lambda: _status(service) == "blocked_ready")
        clock.now += 1.0
        service.wake_timers()
        source.queue.put_nowait(model_delete(2, suffix=ADAPTER))
        await settle(lambda: _adapters(service) == 1)
        clock.now += 1.0
        service.wake_timers()
        await settle(lambda: _status(service) == "ready")
        # An outage: the reconnect listing misses worker 1, an expiry takes worker 2.
        clock.now += 1.0
        listing = (model_entry(2, A), model_entry(3, B))
        source.queue.put_nowait(SourceListing(listing, reason="reconnect"))
        source.queue.put_nowait(SourceDelete(model_delete(2).key, 3, "expired"))
        await settle(lambda: service.status().groups[0].held_until is not None)
        await service.stop()
    return service


@pytest.fixture
def refusing_first_commit(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Make the hops refuse the first commit they are given, as a hop with no channel would."""
    commit = HopBindings.commit
    refused: list[CommitGroup] = []

    def first_refused(self: HopBindings, effect: CommitGroup, pipeline: object = None) -> None:
        if not refused:
            refused.append(effect)
            raise UsageError("no open admission channel")  # as HopBindings.commit refuses
        commit(self, effect, pipeline)

    monkeypatch.setattr(HopBindings, "commit", first_refused)
    yield
    assert refused, "no commit was refused"


def _lines(trace: Path) -> list[str]:
    return trace.read_text(encoding="utf-8").splitlines()


def _same_state(service: AdmissionService, lines: list[str]) -> None:
    result = replay(lines)
    live = list(service.core.groups())
    replayed = list(result.core.groups())
    assert [(v.key, v.incumbent, v.status, v.generation, v.receiver) for v in replayed] == [
        (v.key, v.incumbent, v.status, v.generation, v.receiver) for v in live
    ]
    assert [(v.admitted, v.cohorts, v.lora, v.last_known) for v in replayed] == [
        (v.admitted, v.cohorts, v.lora, v.last_known) for v in live
    ]
    stepped = [e for e in read_trace(lines) if e["kind"] in STEPPED]
    assert stepped
    assert all("effects" in e for e in stepped)
    assert result.checked == len(stepped)


async def test_a_live_trace_replays_to_its_exact_state_with_every_line_checked(
    tmp_path: Path,
) -> None:
    trace = tmp_path / "trace.jsonl"
    service = await _record(trace)
    lines = _lines(trace)
    assert json.loads(lines[0])["version"] == TRACE_VERSION == 4
    _same_state(service, lines)


async def test_a_commit_a_hop_refused_is_recorded_and_refused_again_in_replay(
    tmp_path: Path, refusing_first_commit: None
) -> None:
    trace = tmp_path / "trace.jsonl"
    service = await _record(trace, refuse_first_commit=True)
    lines = _lines(trace)
    [refusal] = [json.loads(line) for line in lines if '"commit_failed"' in line]
    assert (refusal["phase"], refusal["error"]) == (
        "commit",
        "UsageError: no open admission channel",
    )
    _same_state(service, lines)


async def test_a_trace_without_its_refused_commit_stops_at_the_first_line_after_it(
    tmp_path: Path, refusing_first_commit: None
) -> None:
    trace = tmp_path / "trace.jsonl"
    await _record(trace, refuse_first_commit=True)
    lines = _lines(trace)
    at = next(i for i, line in enumerate(lines) if '"commit_failed"' in line)
    # Without the refusal the replay's commit stands, and the next step differs from the record.
    with pytest.raises(NondeterminismError) as stopped:
        replay(lines[:at] + lines[at + 1 :])
    assert stopped.value.line == at + 1
    assert f"line {at + 1}: nondeterminism" in str(stopped.value)


def _altered(lines: list[str], index: int, change: Any) -> list[str]:
    line = json.loads(lines[index])
    change(line)
    return [*lines[:index], json.dumps(line), *lines[index + 1 :]]


async def test_a_trace_with_one_line_altered_stops_at_that_line_named(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    await _record(trace)
    lines = _lines(trace)
    kinds = [json.loads(line)["kind"] for line in lines]
    # A build that failed, recorded as a success.
    failed = next(i for i, line in enumerate(lines) if '"outcome":"failed"' in line)
    with pytest.raises(NondeterminismError, match=f"line {failed + 1}: nondeterminism") as stop:
        replay(_altered(lines, failed, lambda line: line.update(outcome="ok")))
    assert stop.value.line == failed + 1
    # An expiry recorded as a plain deletion: no hold.
    expiry = next(i for i, line in enumerate(lines) if '"expired"' in line)
    with pytest.raises(NondeterminismError) as stop:
        replay(_altered(lines, expiry, lambda line: line.update(operation="delete")))
    assert stop.value.line == expiry + 1
    # A digest altered, and nothing else.
    tick = kinds.index("tick")
    altered = _altered(lines, tick, lambda line: line.update(effects=effects_digest([])))
    with pytest.raises(NondeterminismError) as stop:
        replay(altered)
    assert stop.value.line == tick + 1


def test_the_replay_command_checks_a_trace_and_names_the_line_that_differs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "trace.jsonl"
    asyncio.run(_record(trace))
    assert main(["replay", str(trace)]) == 0
    lines = _lines(trace)
    at = next(i for i, line in enumerate(lines) if '"outcome":"failed"' in line)
    altered = _altered(lines, at, lambda line: line.update(outcome="ok"))
    trace.write_text("\n".join(altered) + "\n", encoding="utf-8")
    capsys.readouterr()
    assert main(["replay", str(trace)]) != 0
    assert f"line {at + 1}: nondeterminism" in capsys.readouterr().err


def test_a_version_2_trace_is_upgraded_when_read_and_replays_unchecked() -> None:
    entry = model_entry(1, A)
    lines = [
        json.dumps({"kind": "trace", "version": 2, "wall_time": 1.0, "observer": "frontend"}),
        json.dumps(
            {"kind": "put", "t": 0.0, "key": entry.key, "value": entry.value.decode("utf-8")}
        ),
    ]
    header = read_trace(lines)[0]
    assert (header["version"], header["upgraded_from"]) == (4, 2)
    result = replay(lines)
    assert result.checked == 0
    assert [v.status.value for v in result.core.groups()] == ["building"]


def test_a_second_watch_on_the_bucket_records_no_digests(tmp_path: Path) -> None:
    path = tmp_path / "bucket.jsonl"
    writer = TraceWriter(path.open("w", encoding="utf-8"), observer="bucket", owned=True)
    writer.begin(10.0)
    writer.write_event(model_put(1, A), 10.5)
    writer.tick(11.0)
    writer.close()
    lines = [json.loads(line) for line in _lines(path)]
    assert [line["kind"] for line in lines] == ["trace", "put", "tick"]
    assert not any("effects" in line for line in lines)


async def test_a_replay_under_other_settings_asks_what_if_and_is_not_checked(
    tmp_path: Path,
) -> None:
    trace = tmp_path / "trace.jsonl"
    await _record(trace)
    lines = _lines(trace)
    recorded, _ = recorded_settings(read_trace(lines))
    assert recorded is not None
    assert replay(lines, core_settings=recorded).checked > 0
    unheld = replay(lines, core_settings=replace(recorded, tenure_hold=0.0))
    assert unheld.checked == 0
    assert [v.held_until for v in unheld.core.groups()] == [None]
