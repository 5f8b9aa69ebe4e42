"""Trace format versions 2 to 4: their checks, replay semantics, and a service recording itself."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support.aio import time_limit
from support.cards import base_card, group_of, model_delete, model_entry, model_put
from support.fakes import FakeBuilder, FakeClock, FakeSource, settle
from workerset_admission.admission import CoreSettings
from workerset_admission.cli import main
from workerset_admission.ports import SourceDelete, SourceListing
from workerset_admission.service.admission_service import AdmissionService
from workerset_admission.settings import Settings
from workerset_admission.traces.format import raw_text
from workerset_admission.traces.replay import TraceError, replay
from workerset_admission.wiring.compose import attach_trace_writer

A = base_card(16)
B = base_card(32)
GROUP = group_of(A)
GID = GROUP.id


def header(observer: str = "frontend", **settings: Any) -> str:
    line: dict[str, Any] = {"kind": "trace", "version": 2, "wall_time": 1.0, "observer": observer}
    if settings:
        line["settings"] = {"core": settings}
    return json.dumps(line)


def put(t: float, instance_id: int, card: dict[str, Any] = A) -> str:
    entry = model_entry(instance_id, card)
    return json.dumps({"kind": "put", "t": t, "key": entry.key, "value": raw_text(entry.value)})


def snapshot(t: float, reason: str, *members: tuple[int, dict[str, Any]]) -> str:
    entries = [model_entry(i, card) for i, card in members]
    listed = [{"key": e.key, "value": raw_text(e.value)} for e in entries]
    return json.dumps({"kind": "snapshot", "t": t, "reason": reason, "entries": listed})


def delete(t: float, instance_id: int, operation: str = "delete") -> str:
    key = model_entry(instance_id).key
    return json.dumps({"kind": "delete", "t": t, "key": key, "operation": operation})


def build(t: float, generation: int, card: dict[str, Any], outcome: str = "ok") -> str:
    checksum = checksum_of(card)
    return json.dumps(
        {
            "kind": "build",
            "t": t,
            "group": GID,
            "outcome": outcome,
            "generation": generation,
            "checksum": checksum,
        }
    )


def checksum_of(card: dict[str, Any]) -> str:
    [group] = replay([put(0, 1, card)]).to_json()["groups"]
    checksum: str = group["incumbent"]
    return checksum


def group_after(*lines: str, **settings: Any) -> dict[str, Any]:
    core = CoreSettings(**settings) if settings else None
    [group] = replay(lines, core_settings=core).to_json()["groups"]
    return group


@pytest.mark.parametrize(
    ("lines", "why"),
    [
        ([header(), json.dumps({"kind": "tick"})], "needs t"),
        ([header(), put(2.0, 1), put(1.0, 2)], "back in time"),
        ([put(0, 1), header()], "first line"),
        (
            [json.dumps({"kind": "trace", "version": 5, "wall_time": 1, "observer": "bucket"})],
            "newer",
        ),
        (
            [json.dumps({"kind": "trace", "version": 2, "wall_time": 1, "observer": "me"})],
            "observer",
        ),
        ([header(), delete(1.0, 1, "vanished")], "operation"),
        (
            [
                header(),
                json.dumps(
                    {"kind": "build", "t": 1, "group": GID, "outcome": "ok", "generation": 1}
                ),
            ],
            "both its generation and checksum",
        ),
        ([header(), json.dumps({"kind": "snapshot", "t": 1, "entries": [], "keep": "k"})], "keep"),
        ([header(max_concurrent_builds=0)], "settings are not valid"),
    ],
)
def test_a_version_2_line_that_breaks_the_format_is_a_trace_error(
    lines: list[str], why: str
) -> None:
    with pytest.raises(TraceError, match=why):
        replay(lines)


def test_an_expiry_soon_after_a_reconnect_holds_but_a_deletion_does_not() -> None:
    lines = [
        header("bucket"),
        put(0.0, 1),
        put(0.1, 2, B),
        snapshot(5.0, "reconnect", (1, A), (2, B)),
    ]
    held = group_after(*lines, delete(6.0, 1, "expired"), tenure_hold=10.0)
    assert held["incumbent"] == checksum_of(A)
    # Counted from the reconnect, not the expiry: one outage holds for the hold at most.
    assert held["held_until"] == pytest.approx(15.0)
    # Its member stays served on its last known record meanwhile (at most one TTL).
    assert (held["admitted"], held["last_known"]) == ([1], [1])
    gone = group_after(*lines, delete(6.0, 1, "delete"), tenure_hold=10.0)
    assert gone["incumbent"] == checksum_of(B)
    assert "held_until" not in gone


def test_a_bucket_recording_fires_deadlines_as_its_clock_passes_them() -> None:
    lines = [header("bucket"), put(0.0, 1), put(0.1, 2, B), snapshot(5.0, "reconnect", (2, B))]
    assert group_after(*lines, put(14.9, 2, B), tenure_hold=10.0)["incumbent"] == checksum_of(A)
    after = group_after(*lines, put(15.0, 2, B), tenure_hold=10.0)
    assert (after["incumbent"], after["admitted"]) == (checksum_of(B), [2])


def test_a_frontend_recording_builds_only_where_its_results_are() -> None:
    started = group_after(header(), put(0.0, 1))
    assert (started["status"], started["generation"]) == ("building", 1)
    done = group_after(header(), put(0.0, 1), build(0.2, 1, A))
    assert (done["status"], done["admitted"]) == ("ready", [1])


def test_a_frontend_recording_retries_exactly_where_it_ticked() -> None:
    lines = [header(retry_delays=[1.0]), put(0.0, 1), build(0.5, 1, A, "failed")]
    assert group_after(*lines)["status"] == "retrying"
    # A tick before the deadline does nothing; the one after it starts generation 2.
    early = json.dumps({"kind": "tick", "t": 1.4})
    late = json.dumps({"kind": "tick", "t": 1.5})
    assert group_after(*lines, early)["generation"] == 1
    assert (
        group_after(*lines, early, late)["status"],
        group_after(*lines, late)["generation"],
    ) == (
        "building",
        2,
    )


def test_a_late_result_for_an_ended_tenure_is_fenced() -> None:
    lines = [
        header(),
        put(0.0, 1),
        put(0.1, 2, B),
        delete(0.2, 1),  # the incumbent goes while its build is in flight
        build(0.3, 2, B),  # the successor's build
        build(0.4, 1, A),  # the first tenure's build, answering after it ended
    ]
    group = group_after(*lines)
    assert (group["incumbent"], group["generation"], group["status"]) == (
        checksum_of(B),
        2,
        "ready",
    )
    assert group["admitted"] == [2]


def test_replay_takes_the_settings_the_header_records_unless_told_otherwise() -> None:
    lines = [header("bucket"), put(0.0, 1), put(0.1, 2, B), snapshot(5.0, "reconnect", (2, B))]
    recorded = [
        json.dumps(
            {
                "kind": "trace",
                "version": 2,
                "wall_time": 1.0,
                "observer": "bucket",
                "settings": {"core": {"tenure_hold": 0.0, "a_future_setting": 1}},
            }
        ),
        *lines[1:],
    ]
    assert group_after(*recorded)["incumbent"] == checksum_of(B)  # no hold, as recorded
    assert group_after(*recorded, tenure_hold=30.0)["incumbent"] == checksum_of(A)


def test_replay_of_a_version_1_trace_says_it_carries_no_times(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "v1.jsonl"
    entry = model_entry(1, A)
    path.write_text(
        json.dumps({"kind": "put", "key": entry.key, "value": raw_text(entry.value)}) + "\n"
    )
    assert main(["replay", str(path)]) == 0
    assert "version 1 trace carries no times" in capsys.readouterr().err
    path.write_text(header("bucket") + "\n" + put(0.0, 1) + "\n")
    assert main(["replay", str(path)]) == 0
    assert "version 1" not in capsys.readouterr().err


async def test_a_service_recording_itself_replays_to_its_own_state(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    source, clock, builder = FakeSource(), FakeClock(), FakeBuilder()
    builder.fail_next = 1
    settings = Settings(retry_delays=(0.5,), tenure_hold=3.0, trace_out=trace)
    service = AdmissionService(source, builder=builder, clock=clock, settings=settings)
    writer = attach_trace_writer(service)
    assert writer is not None
    async with time_limit(10):
        await service.start()
        source.queue.put_nowait(SourceListing((model_entry(1, A),)))
        source.queue.put_nowait(model_put(2, B))
        await settle(lambda: builder.fail_next == 0 and service.core.builds_in_flight == 0)
        clock.now += 1.0
        service.wake_timers()
        await settle(lambda: service.status().groups[0].status == "ready")
        clock.now += 1.0
        source.queue.put_nowait(SourceListing((model_entry(2, B),), reason="reconnect"))
        await settle(lambda: service.status().groups[0].held_until is not None)
        source.queue.put_nowait(SourceDelete(model_delete(2).key, 3, "expired"))
        source.queue.put_nowait(model_put(3, B))
        await settle(lambda: service.status().groups[0].cohorts[-1].members == (3,))
        await service.stop()
    live = service.status().groups[0].to_json()
    [view] = service.core.groups()
    lines = trace.read_text(encoding="utf-8").splitlines()
    kinds = [json.loads(line)["kind"] for line in lines]
    assert kinds[0] == "trace"
    assert {"snapshot", "put", "delete", "build", "tick"} <= set(kinds)
    [replayed] = replay(lines).to_json()["groups"]
    start = writer._start
    assert start is not None
    for name in ("incumbent", "status", "generation", "receiver", "admitted", "cohorts"):
        assert replayed[name] == live[name], name
    assert view.held_until is not None
    assert replayed["held_until"] == pytest.approx(view.held_until - start)


async def test_a_frontend_started_during_an_outage_replays_to_the_tenure_it_held(
    tmp_path: Path,
) -> None:
    trace = tmp_path / "trace.jsonl"
    source, clock, builder = FakeSource(), FakeClock(), FakeBuilder()
    settings = Settings(tenure_hold=30.0, trace_out=trace)
    service = AdmissionService(source, builder=builder, clock=clock, settings=settings)
    assert attach_trace_writer(service) is not None
    group = (GROUP.model, GROUP.worker_set)
    async with time_limit(10):
        await service.start()
        # The peers serve A with workers 1 and 2; the listing after the outage lacks them.
        source.queue.put_nowait(
            SourceListing(
                (model_entry(3, B),),
                peers={group: (checksum_of(A),)},
                peer_members={group: {checksum_of(A): (1, 2)}},
                after_outage=True,
            )
        )
        await settle(lambda: bool(service.status().groups))
        assert service.status().groups[0].held_until is not None
        clock.now += 2.0
        source.queue.put_nowait(model_put(2, A))
        await settle(lambda: service.status().groups[0].status == "ready")
        await service.stop()
    live = service.status().groups[0].to_json()
    assert (live["incumbent"], live["admitted"]) == (checksum_of(A), [2])
    lines = trace.read_text(encoding="utf-8").splitlines()
    first = json.loads(lines[1])
    assert (first["kind"], first["after_outage"]) == ("snapshot", True)
    assert first["peer_members"] == {GID: {checksum_of(A): [1, 2]}}
    result = replay(lines)
    assert result.checked >= 3
    [replayed] = result.to_json()["groups"]
    for name in ("incumbent", "status", "generation", "receiver", "admitted", "cohorts"):
        assert replayed[name] == live[name], name
    # A version 3 reader would decide without the report: such a trace must say version 4.
    older = [json.dumps({**json.loads(lines[0]), "version": 3}), *lines[1:]]
    with pytest.raises(TraceError, match="need trace version 4"):
        replay(older)
