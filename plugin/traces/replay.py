"""Offline replay of a discovery trace through the live service's own step code.

A trace is JSON Lines (:mod:`workerset_admission.traces.format` gives the format; older versions
are upgraded to the current form when read, so replay has one mode). Replay builds the same
:class:`~workerset_admission.service.step.AdmissionStep` the live service runs, with the same
ingestion, core, receivers' channels and effect handling, and feeds it the trace's lines as the
source events they were: a put, a delete with its operation, a listing with its reason (and the
keys and peers it carried), a build result. What differs from a live frontend is only what the
step is plugged into:

* the clock follows every line's ``t`` (the reading the live step made; a version 1 trace's
  readings of its tick clock);
* a frontend's own recording (``observer: frontend``) holds every build result, with its
  generation and checksum, and every tick its timers made: replay builds and ticks exactly
  there, and a build without a result line stays in flight, as it was when the recording
  ended. In any other trace a build stays in flight when a later ``build`` line names its
  group (the first such line decides it) and any other build succeeds at once, before the
  next line;
* timers fire at the trace's ``tick`` lines and, where those are not every moment a timer fell
  due (a bucket recording, :func:`~workerset_admission.traces.format.recorded_ticks`), also as
  the clock passes the core's deadlines;
* nothing is served: no hops are bound, and the rejection reports are collected, not logged;
  a commit is refused exactly where the recorded frontend's hop refused it (a
  ``commit_failed`` line), and nowhere else.

A frontend's recording is checked as it is replayed under the settings it recorded: every
line that stepped the core carries the digest of that step's effects, and replay computes the
digest of its own step's effects for the same line. The first line where they differ stops
the replay with a :class:`~workerset_admission.traces.format.NondeterminismError` naming it:
the trace was altered, or this code decides otherwise than the frontend that recorded it, and
nothing after that line would be what that frontend did. Lines without a digest (version 2, a
bucket recording) replay unchecked.

A ``state`` line (``record`` writes one from a live frontend's status) makes the next listing
be observed in that frontend's cohort order, so a recording started mid-rollout reaches the
decision that frontend made. A record the boundary refuses is listed under ``invalid`` and
changes nothing (a refused value for a known key keeps the last valid one, in a listing too).

The result is deterministic: the same trace always renders to the same bytes.
"""

from __future__ import annotations

import heapq
import json
import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from workerset_admission.admission import (
    AdmissionCore,
    BuildFinished,
    CommitFailed,
    CommitGroup,
    CoreSettings,
    DrainChanged,
    Effect,
    GroupView,
    Input,
    MutationRefused,
    RejectionReported,
    StartBuild,
    Tick,
    WorkerDrained,
    WorkerRemoved,
)
from workerset_admission.admission.ordering import GroupId
from workerset_admission.card import BoundarySettings, jsonio
from workerset_admission.card.differences import describe
from workerset_admission.card.entry import EntryDecoder
from workerset_admission.errors import RemoteDataError, UsageError
from workerset_admission.identity import AttemptId, GroupKey
from workerset_admission.keys import parse_key as parse_kv_key
from workerset_admission.ports import (
    DiscoveryEntry,
    SourceDelete,
    SourceEvent,
    SourceListing,
    SourcePut,
)
from workerset_admission.service.group_json import drained_json, group_json, handover_json
from workerset_admission.service.ingest import Ingested, Ingestor
from workerset_admission.service.receivers import AdmissionChannels
from workerset_admission.service.rejections import StandingRejection, standing_rejections
from workerset_admission.service.step import AdmissionStep, StepRecord
from workerset_admission.telemetry import AdmissionTelemetry, UpdateScope
from workerset_admission.traces.digest import effects_digest
from workerset_admission.traces.format import (
    STEPPED,
    NondeterminismError,
    TraceError,
    read_trace,
    recorded_by_frontend,
    recorded_settings,
    recorded_ticks,
    trace_version,
)
from workerset_admission.traces.state_line import DecisionState

__all__ = [
    "MUTATION_REFUSED",
    "KeyHistory",
    "NondeterminismError",
    "ReplayResult",
    "TraceError",
    "explain",
    "is_admitted",
    "read_trace",
    "render",
    "replay",
    "resolve_instance",
]

# The reason a refused in-place change is listed under: the same word as the metric label.
MUTATION_REFUSED = "mutation_refused"

# Rejections are collected into the result; a replay on a laptop logs nothing about them.
_QUIET = logging.getLogger("workerset_admission.traces.replay.quiet")
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False


@dataclass(slots=True)
class KeyHistory:
    """What happened to one registration key during a replay, for ``explain``."""

    kv_key: str
    events: list[str] = field(default_factory=list)
    refused: str | None = None
    valid_seen: bool = False


@dataclass(slots=True)
class ReplayResult:
    """The final core state plus what the replay saw along the way."""

    core: AdmissionCore
    rejections: list[RejectionReported]
    invalid: list[tuple[str, str]]
    history: dict[str, KeyHistory]
    effects: int
    version: int = 1
    # How many lines' recorded effects the replay's own matched (lines with a digest).
    checked: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "groups": [_group_json(v) for v in self.core.groups()],
            "rejections": [StandingRejection.of_report(r).to_json() for r in self.rejections],
            "invalid": [{"key": key, "reason": reason} for key, reason in self.invalid],
        }


def _group_json(view: GroupView) -> dict[str, Any]:
    group = group_json(
        view.key,
        incumbent=view.incumbent,
        status=view.status.value,
        generation=view.generation,
        receiver=view.receiver,
        admitted=view.admitted,
        cohorts=((c.mdc_checksum, sorted(c.instance_ids)) for c in view.cohorts),
    )
    # What replay alone shows, each only when there is one, so the output of every trace
    # without a hold or a drain is unchanged; a hold's times are on the trace's clock.
    if view.held_until is not None:
        group["held_until"] = view.held_until
    if view.last_known_until is not None:
        group["last_known"] = list(view.last_known)
        group["last_known_until"] = view.last_known_until
    if view.arrivals:
        group["held_arrivals"] = list(view.arrivals)
    if view.drained:
        group["drained"] = drained_json(
            (d.instance_id, d.drain.by, d.drain.at) for d in view.drained
        )
    if view.handover is not None:
        group["handover"] = handover_json(
            view.handover.mdc_checksum, view.handover.generation, view.handover.members
        )
    return group


def render(result: ReplayResult) -> str:
    """Render the ``replay`` output: indented JSON, fixed key order, a trailing newline."""
    return json.dumps(result.to_json(), indent=2, ensure_ascii=False) + "\n"


class _TraceBuilds:
    """The step's builds during a replay: started as asked, answered from the trace."""

    def __init__(
        self,
        immediate: bool,
        waits: Mapping[str, Sequence[int]],
        refusals: Mapping[tuple[str, str, int], tuple[int, CommitFailed]],
    ) -> None:
        # Unless the builds' results are recorded: one no later line answers succeeds at once.
        self._immediate = immediate
        self._waits = waits
        # The commits the recorded frontend's hops refused, by (group id, checksum, generation),
        # with their line; the line of the last one handed back.
        self._refusals = dict(refusals)
        self.refused_line: int | None = None
        self.line = 0
        self.in_flight: dict[GroupKey, AttemptId] = {}
        self.ready: list[BuildFinished] = []

    def start(self, effect: StartBuild) -> None:
        self.in_flight[effect.group] = effect.attempt_id
        later = any(i > self.line for i in self._waits.get(effect.group.id, ()))
        if self._immediate and not later:
            self.ready.append(
                BuildFinished(effect.group, effect.mdc_checksum, effect.generation, True)
            )

    def cancel(self, attempt: AttemptId) -> None:
        if self.in_flight.get(attempt.group) == attempt:
            del self.in_flight[attempt.group]

    def answered(self, result: BuildFinished) -> None:
        if self.in_flight.get(result.group) == result.attempt_id:
            del self.in_flight[result.group]

    def commit(self, effect: CommitGroup) -> Input | None:
        found = self._refusals.pop((effect.group.id, effect.mdc_checksum, effect.generation), None)
        if found is None:
            return None
        self.refused_line, refusal = found
        return refusal

    def unanswered(self) -> list[int]:
        """Return the lines of recorded refusals no commit of the replay asked for."""
        return sorted(index for index, _ in self._refusals.values())


class _NotingIngestor(Ingestor):
    """The service's ingestion, noting which removals name a registration the core holds.

    Ingestion judges a source event before its core step, so this is the moment the core still
    holds what a removal takes away: ``explain`` says "deleted" of those keys alone.
    """

    def __init__(self, core: AdmissionCore, decoder: EntryDecoder) -> None:
        super().__init__(decoder)
        self._core = core
        self.registered_removed: set[str] = set()

    def _noted(self, result: Ingested) -> Ingested:
        for event in result.inputs:
            if isinstance(event, WorkerRemoved) and self._core.registration(event.key) is not None:
                self.registered_removed.add(event.key)
        return result

    def put(self, key: str, value: bytes) -> Ingested:
        return self._noted(super().put(key, value))

    def removal(self, event: SourceDelete, *, now: float) -> Ingested:
        return self._noted(super().removal(event, now=now))

    def listing(
        self,
        event: SourceListing,
        keep: Collection[str] = (),
        *,
        now: float | None = None,
        recorded: Mapping[GroupId, Sequence[str]] | None = None,
    ) -> Ingested:
        return self._noted(super().listing(event, keep, now=now, recorded=recorded))


class _Replayer:
    """Drives an :class:`AdmissionStep` with a trace's lines; notes what ``explain`` tells."""

    def __init__(
        self,
        boundary: BoundarySettings,
        core_settings: CoreSettings,
        events: Sequence[Mapping[str, Any]],
        *,
        check: bool = True,
    ) -> None:
        # Only to tell the reader (1: a trace without a header); replay runs every version alike.
        self.version = trace_version(events)
        # Whether recorded digests are compared (only under the recorded settings).
        self.check = check
        # A frontend's own recording holds its every build result and tick; any other trace
        # lets builds succeed at once, and a bucket recording's deadlines fire as they pass.
        self.by_frontend = recorded_by_frontend(events)
        self.fires_deadlines = not recorded_ticks(events)
        waits: dict[str, list[int]] = {}
        refusals: dict[tuple[str, str, int], tuple[int, CommitFailed]] = {}
        for index, event in enumerate(events):
            if event["kind"] == "build":
                waits.setdefault(event["group"], []).append(index)
            elif event["kind"] == "commit_failed":
                refusals[(event["group"], event["checksum"], event["generation"])] = (
                    index,
                    _refusal(event),
                )
        self.builds = _TraceBuilds(not self.by_frontend, waits, refusals)
        self.events = events
        # The line whose step is being replayed, and the effects that step returned so far.
        self.checking: int | None = None
        self.gathered: list[Effect] = []
        self.checked = 0
        self.diverged: NondeterminismError | None = None
        self.now = 0.0
        self._deadlines: list[float] = []
        self.core = AdmissionCore(core_settings)
        telemetry = AdmissionTelemetry(trace_updates=False, rejection_logger=_QUIET)
        self.ingestor = _NotingIngestor(self.core, EntryDecoder(boundary))
        # The service's own ingestion and step: records are judged, and effects carried out,
        # by the very code that did it live.
        self.step = AdmissionStep(
            self.core,
            self.ingestor,
            channels=AdmissionChannels(),
            builds=self.builds,
            clock=lambda: self.now,
            telemetry=telemetry,
            refuse=self._refused,
            schedule=self._schedule,
            log=_QUIET,
        )
        self.step.subscribe(self)
        self.rejections: list[RejectionReported] = []
        self.invalid: list[tuple[str, str]] = []
        self.history: dict[str, KeyHistory] = {}
        # The registrations each drained worker's drain set aside, by (namespace, instance id).
        self._drained: dict[tuple[str, int], set[str]] = {}
        self.effect_count = 0
        self.line = 0
        self.kv_key_of: dict[str, str] = {}
        # A recorded frontend's cohort order, for the listing that follows its state line.
        self.recorded: Mapping[GroupId, Sequence[str]] | None = None

    def run(self, events: Sequence[Mapping[str, Any]]) -> None:
        for index, event in enumerate(events):
            self.line = self.builds.line = index
            kind = event["kind"]
            if kind == "trace":
                continue
            self._advance(float(event["t"]))
            if kind == "commit_failed":
                # Fed back where the replay's own commit was refused (``_TraceBuilds.commit``).
                if index in self.builds.unanswered():
                    raise NondeterminismError(
                        index + 1,
                        f"line {index + 1}: nondeterminism: the recorded frontend's hop refused "
                        f"a commit of {event['group']} generation {event['generation']}, and "
                        "the replay made no such commit",
                    )
                continue
            if kind in STEPPED:
                self.checking, self.gathered = index, []
            if kind == "state":
                state = DecisionState.from_line(event)
                self.recorded = state.cohorts
                # The recorded tenures, on the trace's clock.
                self.step.apply([Tick(self.now), *state.inputs()])
            elif kind == "tick":
                self.step.tick()
            elif kind == "build":
                self._build(event)
            else:
                self._source(_source_event(event), event)
            # A line the replay did not step (a build it had no attempt for) made no effects.
            self._verify()
            if self.diverged is not None:
                raise self.diverged
            self._finish_builds()

    def _schedule(self, deadline: float) -> None:
        if self.fires_deadlines:
            heapq.heappush(self._deadlines, deadline)

    def _advance(self, t: float) -> None:
        """Move the clock to ``t``, firing the deadlines due by then at their own times."""
        deadlines = self._deadlines
        while deadlines and deadlines[0] <= t:
            due = heapq.heappop(deadlines)
            while deadlines and deadlines[0] <= due:
                heapq.heappop(deadlines)
            self.now = max(self.now, due)
            self.step.tick()
            self._finish_builds()
        self.now = max(self.now, t)

    def _source(self, event: SourceEvent, line: Mapping[str, Any]) -> None:
        keep: Collection[str] = ()
        recorded = None
        if isinstance(event, SourceListing):
            keep = tuple(line.get("keep", ()))
            recorded, self.recorded = self.recorded, None
        self.step.handle_event(event, keep, recorded=recorded)

    def _build(self, line: Mapping[str, Any]) -> None:
        try:
            key = GroupKey.from_id(line["group"])
        except (ValueError, TypeError):
            return  # a group that cannot exist has no build to answer
        ok = line["outcome"] == "ok"
        error = None if ok else str(line.get("error", "failed (trace)"))
        if line.get("generation") is not None:
            result = BuildFinished(key, line["checksum"], int(line["generation"]), ok, error)
        else:
            flight = self.builds.in_flight.get(key)
            if flight is None:
                return
            result = BuildFinished(key, flight.mdc_checksum, flight.generation, ok, error)
        self.builds.answered(result)
        self.step.build_finished(result)

    def _finish_builds(self) -> None:
        ready = self.builds.ready
        while ready:
            result = ready.pop(0)
            self.builds.answered(result)
            self.step.build_finished(result)

    # -- what the step's record tells -------------------------------------------------------------

    def heard(self, record: StepRecord) -> None:
        """Check a step's effects against the recorded digests, and note what ``explain`` tells."""
        if record.ingested is not None:
            self._ingested(record.ingested)
        for step in record.steps:
            if step.made is not None:
                # The line that led here is over; the recorded refusal's line answers for this.
                self._verify()
                self.checking, self.gathered = self.builds.refused_line, []
            if self.checking is not None:
                self.gathered.extend(step.effects)
            self.effect_count += len(step.effects)
            for effect in step.effects:
                note = _NOTES.get(type(effect))
                if note is not None:
                    note(self, effect)
        self._verify()

    def _verify(self) -> None:
        """Compare the effects of the step just replayed with the digest its line recorded."""
        index, gathered = self.checking, self.gathered
        self.checking, self.gathered = None, []
        if index is None or self.diverged is not None or not self.check:
            return
        recorded = self.events[index].get("effects")
        if recorded is None:
            return
        replayed = effects_digest(gathered)
        if replayed == recorded:
            self.checked += 1
            return
        kinds = ", ".join(type(e).__name__ for e in gathered) or "none"
        line = self.events[index]
        self.diverged = NondeterminismError(
            index + 1,
            f"line {index + 1}: nondeterminism: the replayed effects of this {line['kind']} "
            f"line differ from the recorded ones (recorded digest {recorded}, replayed "
            f"{replayed}: {kinds}); the trace was altered, or this release decides otherwise "
            "than the frontend that recorded it",
        )

    def _ingested(self, result: Ingested) -> None:
        for verdict in result.verdicts:
            kv_key = verdict.key
            if verdict.refusal is not None:
                reason = verdict.refusal.reason
                self._note(_instance_key_of(kv_key), kv_key, f"refused ({reason})").refused = reason
            elif verdict.registration is not None:
                key = verdict.registration.key
                self.kv_key_of[key] = kv_key
                checksum = verdict.registration.mdc_checksum
                self._note(key, kv_key, f"valid record ({checksum[:12]}…)").valid_seen = True
            elif verdict.drain:
                continue  # a drain is noted on the registrations it sets aside
            elif verdict.ignored:
                self._note(_instance_key_of(kv_key), kv_key, "ignored by the namespace filter")
        removed = self.ingestor.registered_removed
        for event in result.inputs:
            if isinstance(event, WorkerRemoved) and event.key in removed:
                self._note(event.key, self.kv_key_of.get(event.key, event.key), "deleted")
        removed.clear()

    def _rejection_reported(self, effect: RejectionReported) -> None:
        self.rejections.append(effect)

    def _worker_drained(self, effect: WorkerDrained) -> None:
        by = f" by {effect.drain.by}" if effect.drain.by else ""
        self._note(effect.key, self.kv_key_of.get(effect.key, effect.key), f"drained{by}")
        self._drained.setdefault(effect.drain.worker, set()).add(effect.key)

    def _drain_changed(self, effect: DrainChanged) -> None:
        if effect.drain is not None:
            return  # a drain begun is noted on each registration it sets aside
        # Lifted: every registration it had set aside rejoins, as a returning member would.
        for key in sorted(self._drained.pop((effect.namespace, effect.instance_id), ())):
            if self.core.registration(key) is None:
                continue  # it left while drained: nothing rejoins
            kv_key = self.kv_key_of.get(key, key)
            self._note(key, kv_key, "undrained: rejoins its cohort as a returning member")

    def _mutation_refused(self, effect: MutationRefused) -> None:
        kv_key = self.kv_key_of.get(effect.key, effect.key)
        self.invalid.append((kv_key, MUTATION_REFUSED))
        note = self._note(effect.key, kv_key, "in-place change refused")
        note.refused = MUTATION_REFUSED

    def _refused(self, key: str, exc: RemoteDataError, _scope: UpdateScope | None) -> None:
        # Called once per key and value, as the live service reports it.
        self.invalid.append((key, exc.reason))

    def _note(self, instance_key: str, kv_key: str, text: str) -> KeyHistory:
        entry = self.history.get(instance_key)
        if entry is None:
            entry = self.history[instance_key] = KeyHistory(kv_key)
        entry.events.append(f"line {self.line + 1}: {text}")
        return entry


_NOTES: Final[Mapping[type, Callable[[_Replayer, Any], None]]] = {
    RejectionReported: _Replayer._rejection_reported,
    WorkerDrained: _Replayer._worker_drained,
    DrainChanged: _Replayer._drain_changed,
    MutationRefused: _Replayer._mutation_refused,
}
"""The effects ``explain`` notes, each with the replayer's method that notes it."""


def _refusal(line: Mapping[str, Any]) -> CommitFailed:
    try:
        group = GroupKey.from_id(line["group"])
    except (ValueError, TypeError):
        raise TraceError(f"not a group id: {line['group']!r}") from None
    return CommitFailed(
        group, line["checksum"], int(line["generation"]), line["phase"], line.get("error", "")
    )


def _source_event(line: Mapping[str, Any]) -> SourceEvent:
    """Rebuild the source event a trace line records."""
    kind = line["kind"]
    if kind == "put":
        return SourcePut(DiscoveryEntry(line["key"], _value_bytes(line["value"]), 0))
    if kind == "delete":
        return SourceDelete(line["key"], 0, line.get("operation", "delete"))
    entries = tuple(
        DiscoveryEntry(e["key"], _value_bytes(e.get("value")), 0) for e in line["entries"]
    )
    reason = line.get("reason", "listing")
    peers = {
        _group_id(group): tuple(checksums) for group, checksums in line.get("peers", {}).items()
    }
    members = {
        _group_id(group): {checksum: tuple(ids) for checksum, ids in served.items()}
        for group, served in line.get("peer_members", {}).items()
    }
    # Version 1's "listing" is an ordinary listing; "resync" is a new watch on a live link.
    source_reason = {"listing": "initial", "resync": "initial"}.get(reason, reason)
    return SourceListing(
        entries,
        source_reason,
        peers or None,
        after_outage=bool(line.get("after_outage", False)),
        peer_members=members or None,
        peers_resynced_ago=line.get("peers_resynced_ago"),
    )


def _group_id(text: str) -> GroupId:
    try:
        model, worker_set = json.loads(text)
    except (ValueError, TypeError):
        raise TraceError(f"not a group id: {text!r}") from None
    return (str(model), str(worker_set))


def _value_bytes(value: Any) -> bytes:
    """Turn a trace value back into the bytes the bucket held.

    ``record`` writes values as text (invalid UTF-8 as surrogate escapes, so the exact bytes
    come back); hand-written traces may give the record as a JSON object instead.
    """
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape")
    # The compact form is what Dynamo's serde writes, and what the boundary's fast path expects.
    try:
        return jsonio.dumps_compact(value).encode("utf-8", "surrogatepass")
    except (TypeError, ValueError):
        return json.dumps(value).encode()


def _instance_key_of(kv_key: str) -> str:
    try:
        return parse_kv_key(kv_key).instance_key
    except RemoteDataError:
        return kv_key


def replay(
    lines: Iterable[str],
    boundary: BoundarySettings | None = None,
    core_settings: CoreSettings | None = None,
) -> ReplayResult:
    """Replay a trace and return the final state, rejections and refused records.

    Settings not given are the ones the trace's header records, else the defaults. The
    recorded effects are checked only when the settings are the recorded ones: a replay under
    other settings asks what those would have decided, and differs by design.
    """
    events = read_trace(lines)
    recorded_core, recorded_boundary = recorded_settings(events)
    recorded_core = recorded_core or CoreSettings()
    recorded_boundary = recorded_boundary or BoundarySettings()
    core_settings = core_settings or recorded_core
    boundary = boundary or recorded_boundary
    check = core_settings == recorded_core and boundary == recorded_boundary
    replayer = _Replayer(boundary, core_settings, events, check=check)
    replayer.run(events)
    return ReplayResult(
        core=replayer.core,
        rejections=replayer.rejections,
        invalid=replayer.invalid,
        history=replayer.history,
        effects=replayer.effect_count,
        version=replayer.version,
        checked=replayer.checked,
    )


def resolve_instance(result: ReplayResult, instance: str) -> str:
    """Return the instance key ``instance`` names: an instance key, a KV key, or a bare id.

    Keys and log lines spell the id in hex without a prefix (``ns/c/e/3c``); tables and JSON
    print it in decimal (``60``). Both are accepted, in a key or alone, and ``0x3c`` too. A
    spelling that reads as two different registered ids (``60`` is decimal 60 and hex 0x60) is
    refused with both keys to choose from; one that names several keys of one id is refused
    with the keys.
    """
    if instance.startswith("v1."):
        instance = _instance_key_of(instance)
    if "/" in instance:
        if instance in result.history:
            return instance
        parts = instance.split("/")
        if len(parts) < 4:
            return instance
        wanted = _spelled_ids(parts[3])
        found = {f"{'/'.join(parts[:3])}/{'/'.join([f'{i:x}', *parts[4:]])}" for i in wanted} & set(
            result.history
        )
        if len(found) == 1:
            return found.pop()
        if len(found) > 1:
            raise UsageError(
                f"{instance!r} is ambiguous: {' or '.join(sorted(found))} (write the id as "
                "0x<hex> or as the decimal the tables print)"
            )
        return instance
    wanted = _spelled_ids(instance)
    if not wanted:
        raise UsageError(
            f"{instance!r} is neither an instance key, a KV key nor an instance id"
        ) from None
    by_id = {i: sorted(key for key in result.history if _instance_id_of(key) == i) for i in wanted}
    by_id = {i: keys for i, keys in by_id.items() if keys}
    if not by_id:
        shown = " nor ".join(f"{i} (0x{i:x})" for i in sorted(wanted))
        raise UsageError(f"the trace never registers instance id {shown}")
    if len(by_id) > 1:
        raise UsageError(
            f"{instance!r} is ambiguous: decimal {int(instance, 10)} or hex 0x{instance} (write "
            "the id as 0x<hex> or as the decimal the tables print)"
        )
    ((wanted_id, matches),) = by_id.items()
    bases = [key for key in matches if key.count("/") == 3]
    if len(bases) == 1:
        return bases[0]
    if len(matches) == 1:
        return matches[0]
    raise UsageError(f"instance id {wanted_id} names several keys: {', '.join(matches)}")


def _spelled_ids(text: str) -> set[int]:
    """Every id ``text`` may spell: ``0x`` hex, decimal, or the bare hex of keys and logs."""
    lowered = text.strip().lower()
    if lowered.startswith("0x"):
        try:
            return {int(lowered, 16)}
        except ValueError:
            return set()
    found = set()
    if lowered.isdecimal():
        found.add(int(lowered, 10))
    if lowered and all(c in "0123456789abcdef" for c in lowered):
        found.add(int(lowered, 16))
    return {i for i in found if 0 <= i < 2**64}


def _instance_id_of(key: str) -> int | None:
    parts = key.split("/")
    try:
        return int(parts[3], 16) if len(parts) >= 4 else None
    except ValueError:
        return None


def is_admitted(result: ReplayResult, instance: str) -> bool:
    """Tell whether ``instance`` is served at the end of the replay (an adapter: attached)."""
    placement = result.core.placement(resolve_instance(result, instance))
    if placement is None:
        return False
    return placement.attached_to is not None if placement.is_lora else placement.admitted


def _differences_in_words(result: ReplayResult, view: GroupView, checksum: str) -> list[str]:
    for rejection in standing_rejections(result.core, [view]):
        if rejection.rejected_checksum != checksum:
            continue
        if rejection.differences is None:
            return ["What differs cannot be told: the incumbent's card is not at hand."]
        return [
            f"It differs from the incumbent in {len(rejection.differences)} input(s) of the "
            "checksum:",
            *(f"  - {describe(d)}" for d in rejection.differences),
        ]
    return []


def explain(result: ReplayResult, instance: str) -> str:
    """Say in words why ``instance`` (see :func:`resolve_instance`) is or is not admitted."""
    key = resolve_instance(result, instance)
    core = result.core
    history = result.history.get(key)
    lines: list[str] = []
    placement = core.placement(key)
    if placement is None:
        if history is None:
            lines.append(f"{key} is not admitted: the trace never registers it.")
        elif history.refused and not history.valid_seen:
            lines.append(
                f"{key} is not admitted: its record was refused ({history.refused}) "
                "and no valid record for it was ever seen."
            )
        else:
            lines.append(f"{key} is not admitted: its registration is no longer present.")
    elif placement.is_lora:
        if placement.attached_to is not None:
            lines.append(
                f"{key} is a LoRA adapter attached to the admitted worker of group "
                f"{placement.attached_to.id}; it is served through that group's binding."
            )
        else:
            lines.append(
                f"{key} is a LoRA adapter that is not attached: its base worker is not in the "
                "incumbent cohort of any group. Adapters never create or keep a group."
            )
    else:
        view = core.group(placement.group)
        assert view is not None
        where = (
            f"model {view.key.model!r}, WorkerSet {view.key.worker_set}; status "
            f"{view.status.value}, generation {view.generation}, receiver {view.receiver}"
        )
        if placement.drained_by is not None:
            drain = placement.drained_by
            by = f" by {drain.by}" if drain.by else ""
            at = (
                time.strftime(" at %Y-%m-%dT%H:%M:%SZ", time.gmtime(drain.at))
                if drain.at is not None
                else ""
            )
            lines.append(
                f"{key} is not admitted: its worker was drained{by}{at}. For admission a "
                "drained worker has left (an operator-declared departure); it rejoins as a "
                "returning cohort member if the drain is withdrawn."
            )
            if view.handover is not None and placement.key.endswith(
                tuple(f"/{i:x}" for i in view.handover.members)
            ):
                lines.append(
                    f"Its tenure ({view.handover.mdc_checksum}) still serves it until the "
                    f"successor {view.incumbent} is committed, so no request is lost between."
                )
        elif placement.position is None:
            lines.append(
                f"{key} is not admitted: it registered with the checksum of {view.incumbent} "
                "while that tenure was held after an outage. It joins the incumbent if a worker "
                "the tenure had before the outage comes back, and otherwise the end of the "
                "order when the hold expires."
            )
        elif placement.admitted:
            lines.append(
                f"{key} is admitted: its checksum {placement.mdc_checksum} is the incumbent "
                f"cohort, the first configuration this frontend observed that still has workers "
                f"({where})."
            )
        else:
            assert placement.position is not None
            lines.append(
                f"{key} is not admitted: its checksum {placement.mdc_checksum} differs from "
                f"the incumbent {view.incumbent}, which was observed first ({where}). Its cohort "
                f"is number {placement.position + 1} of {len(view.cohorts)} in line; it can "
                "only be served after every worker of the cohorts ahead of it is gone."
            )
            lines.extend(_differences_in_words(result, view, placement.mdc_checksum))
        if view.held_until is not None:
            served = (
                f"workers {', '.join(map(str, view.last_known))} stay admitted on their last "
                f"known records until clock {view.last_known_until:g} s"
                if view.last_known_until is not None
                else "none of its workers is admitted any longer"
            )
            lines.append(
                f"The tenure of {view.incumbent} is held after an outage until clock "
                f"{view.held_until:g} s: none of its workers is listed, {served}, and the "
                "succession happens only if none of them registers again by then."
            )
    if history is not None:
        if history.refused == MUTATION_REFUSED:
            lines.append(
                "A later record for this key changed its WorkerSet or checksum in place; it was "
                "refused and the first incarnation was kept."
            )
        lines.append("History:")
        lines.extend(f"  {event}" for event in history.events)
    return "\n".join(lines) + "\n"
