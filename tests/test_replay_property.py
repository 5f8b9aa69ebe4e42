"""For any run of a frontend, its trace replays to its exact state, and no alteration goes unseen.

A frontend is driven here by the live step itself (``AdmissionStep``, with the core, ingestion,
channels and the trace writer the service uses) through random discovery events: workers of two
checksums, LoRA adapters whose fingerprints may conflict, deletions and expiries, reconnect and
periodic listings, drains, build results, commits a hop refuses, and clock ticks past retries,
holds and last-known windows. Its trace then replays to the very same state with every line
checked; a trace with one digest altered stops at that line; and a trace with one input altered
either stops at a line no earlier than the altered one or, if nothing it decided changed, ends
in the same state: never a different state in silence.
"""

from __future__ import annotations

import io
import json
import logging
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.cards import EP, base_card, lora_card, model_entry
from workerset_admission.admission import (
    AdmissionCore,
    BuildFinished,
    CommitFailed,
    CommitGroup,
    CoreSettings,
    StartBuild,
)
from workerset_admission.card import encode_drain_record
from workerset_admission.identity import AttemptId, Drain
from workerset_admission.keys import drain_kv_key
from workerset_admission.ports import DiscoveryEntry, SourceDelete, SourceListing, SourcePut
from workerset_admission.service.ingest import Ingestor
from workerset_admission.service.receivers import AdmissionChannels
from workerset_admission.service.step import AdmissionStep
from workerset_admission.telemetry import AdmissionTelemetry
from workerset_admission.traces.format import STEPPED, settings_of
from workerset_admission.traces.replay import NondeterminismError, replay
from workerset_admission.traces.writer import TraceWriter

CARDS = {"A": base_card(16), "B": base_card(32)}
ADAPTER = "my-lora"
CORE = CoreSettings(retry_delays=(0.5, 2.0), tenure_hold=3.0, registration_ttl=1.0)
_QUIET = logging.getLogger("tests.replay_property.quiet")
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False

iids = st.integers(1, 4)
ops = st.one_of(
    st.tuples(st.just("put"), iids, st.sampled_from(sorted(CARDS))),
    st.tuples(st.just("adapter"), iids, st.sampled_from([4, 8])),
    st.tuples(st.just("unadapter"), iids),
    st.tuples(st.just("delete"), iids, st.sampled_from(["delete", "expired"])),
    st.tuples(st.just("listing"), st.frozensets(iids), st.sampled_from(["reconnect", "periodic"])),
    st.tuples(st.just("drain"), iids),
    st.tuples(st.just("undrain"), iids),
    st.tuples(st.just("build"), st.booleans()),
    st.tuples(st.just("build"), st.just(True)),
    st.just(("refuse_next_commit",)),
    st.just(("refused_commit",)),
    # Composites that reach the rarer paths often: a conflicting projection (one adapter name,
    # two fingerprints, on two workers), a build whose commit a hop refuses, and the departure
    # of every worker of one checksum.
    st.just(("conflict",)),
    st.tuples(st.just("leave"), st.sampled_from(sorted(CARDS))),
    st.tuples(st.just("tick"), st.sampled_from([0.25, 0.5, 1.0, 2.5, 4.0])),
)


class _Builds:
    """The live builds as the step sees them, answered by the test; a hop may refuse a commit."""

    def __init__(self) -> None:
        self.in_flight: dict[AttemptId, StartBuild] = {}
        self.refuse = False

    def start(self, effect: StartBuild) -> None:
        self.in_flight[effect.attempt_id] = effect

    def cancel(self, attempt: AttemptId) -> None:
        self.in_flight.pop(attempt, None)

    def commit(self, effect: CommitGroup) -> CommitFailed | None:
        if self.refuse:
            self.refuse = False
            return CommitFailed(
                effect.group, effect.mdc_checksum, effect.generation, "commit", "refused"
            )
        return None


class _Frontend:
    """A frontend's step, fed by the test, writing its own trace."""

    def __init__(self) -> None:
        self.now = 0.0
        self.out = io.StringIO()
        self.builds = _Builds()
        self.core = AdmissionCore(CORE)
        self.step = AdmissionStep(
            self.core,
            Ingestor(),
            channels=AdmissionChannels(),
            builds=self.builds,
            clock=lambda: self.now,
            telemetry=AdmissionTelemetry(trace_updates=False, rejection_logger=_QUIET),
            refuse=lambda *_: None,
            schedule=lambda _deadline: None,
            log=_QUIET,
        )
        self.writer = TraceWriter(self.out, settings=settings_of(CORE), wall=lambda: 0.0)
        self.writer.begin(0.0)
        self.step.subscribe(self.writer)
        self.cards: dict[int, str] = {}
        self.adapters: dict[int, int] = {}
        self.drains: set[int] = set()

    def _entries(self, listed: frozenset[int]) -> tuple[DiscoveryEntry, ...]:
        entries = [model_entry(i, CARDS[self.cards.get(i, "A")]) for i in sorted(listed)]
        entries += [
            model_entry(i, lora_card(ADAPTER, capacity), suffix=ADAPTER)
            for i, capacity in sorted(self.adapters.items())
            if i in listed
        ]
        entries += [_drain_entry(i) for i in sorted(self.drains)]
        return tuple(entries)

    def do(self, op: tuple[Any, ...]) -> None:
        step = self.step
        match op:
            case ("put", int() as iid, str() as card):
                self.cards.setdefault(iid, card)
                step.handle_event(SourcePut(model_entry(iid, CARDS[card])))
            case ("adapter", int() as iid, int() as capacity):
                self.adapters[iid] = capacity
                entry = model_entry(iid, lora_card(ADAPTER, capacity), suffix=ADAPTER)
                step.handle_event(SourcePut(entry))
            case ("unadapter", int() as iid):
                self.adapters.pop(iid, None)
                key = model_entry(iid, lora_card(ADAPTER), suffix=ADAPTER).key
                step.handle_event(SourceDelete(key, 3, "delete"))
            case ("delete", int() as iid, str() as operation):
                self.cards.pop(iid, None)
                step.handle_event(SourceDelete(model_entry(iid).key, 3, operation))  # type: ignore[arg-type]
            case ("listing", frozenset() as listed, str() as reason):
                for iid in [i for i in self.cards if i not in listed]:
                    del self.cards[iid]
                step.handle_event(SourceListing(self._entries(listed), reason))  # type: ignore[arg-type]
            case ("drain", int() as iid):
                self.drains.add(iid)
                step.handle_event(SourcePut(_drain_entry(iid)))
            case ("undrain", int() as iid):
                self.drains.discard(iid)
                step.handle_event(SourceDelete(drain_kv_key(EP.namespace, iid), 3, "delete"))
            case ("build", bool() as ok):
                if self.builds.in_flight:
                    key = next(iter(self.builds.in_flight))
                    start = self.builds.in_flight.pop(key)
                    error = None if ok else "failed"
                    result = BuildFinished(
                        start.group, start.mdc_checksum, start.generation, ok, error
                    )
                    step.build_finished(result)
            case ("conflict",):
                self.do(("adapter", 1, 4))
                self.do(("adapter", 2, 8))
            case ("leave", str() as card):
                for iid in [i for i, c in sorted(self.cards.items()) if c == card]:
                    self.do(("delete", iid, "delete"))
            case ("refused_commit",):
                self.builds.refuse = True
                self.do(("build", True))
            case ("refuse_next_commit",):
                self.builds.refuse = True
            case ("tick", float() as seconds):
                self.now += seconds
                step.tick()

    def lines(self) -> list[str]:
        self.writer.flush()
        return self.out.getvalue().splitlines()


def _drain_entry(iid: int) -> DiscoveryEntry:
    drain = Drain(EP.namespace, iid, "test", None)
    return DiscoveryEntry(drain_kv_key(EP.namespace, iid), encode_drain_record(drain), 1)


# Every run starts from a committed group with a waiting cohort, so holds, successions,
# projections and refusals are reached from the first random operation on.
_READY: list[tuple[Any, ...]] = [
    ("put", 1, "A"),
    ("put", 2, "A"),
    ("put", 3, "B"),
    ("build", True),
]


def _run(operations: list[tuple[Any, ...]]) -> tuple[_Frontend, list[str]]:
    frontend = _Frontend()
    for op in [*_READY, *operations]:
        frontend.do(op)
    return frontend, frontend.lines()


def _stepped(lines: list[str]) -> list[int]:
    return [i for i, line in enumerate(lines) if json.loads(line)["kind"] in STEPPED]


_SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_SETTINGS
@given(st.lists(ops, max_size=40))
def test_a_frontend_s_trace_replays_to_its_exact_state_with_every_line_checked(
    operations: list[tuple[Any, ...]],
) -> None:
    frontend, lines = _run(operations)
    result = replay(lines)
    assert result.core.groups() == frontend.core.groups()
    assert result.core.drains() == frontend.core.drains()
    assert result.checked == len(_stepped(lines))


@_SETTINGS
@given(st.lists(ops, min_size=1, max_size=40), st.data())
def test_a_trace_with_one_digest_altered_stops_at_that_line(
    operations: list[tuple[Any, ...]], data: st.DataObject
) -> None:
    _, lines = _run(operations)
    stepped = _stepped(lines)
    if not stepped:
        return
    at = data.draw(st.sampled_from(stepped))
    line = json.loads(lines[at])
    line["effects"] = "0" * 24
    altered = [*lines[:at], json.dumps(line), *lines[at + 1 :]]
    with pytest.raises(NondeterminismError) as stop:
        replay(altered)
    assert stop.value.line == at + 1


@_SETTINGS
@given(st.lists(ops, min_size=1, max_size=40), st.data())
def test_a_trace_with_one_input_altered_never_ends_in_another_state_in_silence(
    operations: list[tuple[Any, ...]], data: st.DataObject
) -> None:
    frontend, lines = _run(operations)
    changeable = [
        i
        for i, line in enumerate(lines)
        if json.loads(line)["kind"] in ("build", "delete", "commit_failed")
    ]
    if not changeable:
        return
    at = data.draw(st.sampled_from(changeable))
    line = json.loads(lines[at])
    if line["kind"] == "build":
        line["outcome"] = "failed" if line["outcome"] == "ok" else "ok"
    elif line["kind"] == "delete":
        line["operation"] = "delete" if line["operation"] == "expired" else "expired"
    else:
        line["generation"] += 1000  # a refusal of a commit that never happened
    altered = [*lines[:at], json.dumps(line), *lines[at + 1 :]]
    stopped_at: int | None = None
    try:
        result = replay(altered)
    except NondeterminismError as stop:
        stopped_at = stop.line
    if stopped_at is None:
        assert result.core.groups() == frontend.core.groups()
    else:
        assert stopped_at >= at + 1
