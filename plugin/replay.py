"""Offline replay of a discovery trace through the card boundary and the admission core.

A trace is JSON Lines, one event per line (the format ``record`` writes)::

    {"kind": "state", "frontend": "<id>", "groups": [{"group": ..., "cohorts": [...]}]}
    {"kind": "put", "key": "<KV key>", "value": <record object> | "<raw value text>"}
    {"kind": "delete", "key": "<KV key>"}
    {"kind": "snapshot", "entries": [{"key": ..., "value": ...}, ...], "reason": "reconnect"}
    {"kind": "build", "group": "<group id>", "outcome": "ok" | "failed"}
    {"kind": "tick", "seconds": <float>}

Records are decoded exactly as the live service decodes them; a record the boundary refuses
is listed under ``invalid`` and changes nothing (a refused value for a known key keeps the last
valid one, in a snapshot too). Builds are simulated: a build that starts stays in flight when a
later ``build`` line names its group (the first such line decides it); any other build succeeds
at once, before the next line. ``tick`` advances the replay clock by ``seconds``; a retry runs
when the clock reaches its deadline. A snapshot's optional ``reason`` (``"reconnect"``: the
listing follows a lost connection) lets the core hold a tenure the listing empties, as live;
without it a snapshot is an ordinary listing. A listing is observed in the order the live
service observes it (``admission.ordering``: key order); an optional ``state`` line, which
``record`` writes first from a live frontend's status, makes the next listing reproduce that
frontend's cohort order instead, so the replay reaches the decision it made. Both additions are
optional: older traces replay as before. Endpoint (liveness) records are validated but do not
change admission, as in the live service.

The result is deterministic: the same trace always renders to the same bytes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from workerset_admission.admission import (
    AdmissionCore,
    BuildFinished,
    CancelBuild,
    CoreSettings,
    Effect,
    GroupView,
    Input,
    MutationRefused,
    RejectionReported,
    StartBuild,
    Tick,
    WorkerRemoved,
)
from workerset_admission.card import BoundarySettings, jsonio
from workerset_admission.card.differences import describe
from workerset_admission.decision_state import DecisionState, DecisionStateError
from workerset_admission.errors import RemoteDataError, UsageError
from workerset_admission.identity import GroupKey, group_fields
from workerset_admission.ingest import CardRecordDecoder, Ingested, Ingestor
from workerset_admission.keys import parse_key as parse_kv_key
from workerset_admission.rejections import RejectionSnapshot, standing_rejections

__all__ = [
    "MUTATION_REFUSED",
    "KeyHistory",
    "ReplayResult",
    "TraceError",
    "explain",
    "is_admitted",
    "read_trace",
    "render",
    "replay",
    "resolve_instance",
]

_KINDS = ("state", "put", "delete", "snapshot", "build", "tick")
_SNAPSHOT_REASONS = ("listing", "initial", "reconnect", "periodic")

# The reason a refused in-place change is listed under: the same word as the metric label.
MUTATION_REFUSED = "mutation_refused"


class TraceError(UsageError):
    """A trace line that is not valid trace syntax (the file, not a record in it, is wrong)."""


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

    def to_json(self) -> dict[str, Any]:
        return {
            "groups": [_group_json(v) for v in self.core.groups()],
            "rejections": [RejectionSnapshot.of_report(r).to_json() for r in self.rejections],
            "invalid": [{"key": key, "reason": reason} for key, reason in self.invalid],
        }


def _group_json(view: GroupView) -> dict[str, Any]:
    group = group_fields(view.key)
    group.update(
        incumbent=view.incumbent,
        status=view.status.value,
        generation=view.generation,
        receiver=view.receiver,
        admitted=list(view.admitted),
        cohorts=[
            {"checksum": c.mdc_checksum, "members": sorted(c.instance_ids)} for c in view.cohorts
        ],
    )
    if view.held_until is not None:
        # Only while held, so the output of every trace without a hold is unchanged.
        group["held_until"] = view.held_until
    return group


def render(result: ReplayResult) -> str:
    """Render the ``replay`` output: indented JSON, fixed key order, a trailing newline."""
    return json.dumps(result.to_json(), indent=2, ensure_ascii=False) + "\n"


def read_trace(lines: Iterable[str]) -> list[dict[str, Any]]:
    """Parse and check trace syntax; blank lines are skipped."""
    events: list[dict[str, Any]] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceError(f"line {number}: not JSON: {exc}") from None
        if not isinstance(event, dict) or event.get("kind") not in _KINDS:
            raise TraceError(f"line {number}: expected an object with kind in {_KINDS}")
        kind = event["kind"]
        if kind in ("put", "delete") and not isinstance(event.get("key"), str):
            raise TraceError(f"line {number}: {kind} needs a string key")
        if kind == "put" and "value" not in event:
            raise TraceError(f"line {number}: put needs a value")
        if kind == "snapshot" and not (
            isinstance(event.get("entries"), list)
            and all(isinstance(e, dict) and isinstance(e.get("key"), str) for e in event["entries"])
        ):
            raise TraceError(f"line {number}: snapshot needs a list of {{key, value}} entries")
        if kind == "snapshot" and event.get("reason", "listing") not in _SNAPSHOT_REASONS:
            raise TraceError(f"line {number}: a snapshot reason is one of {_SNAPSHOT_REASONS}")
        if kind == "build" and (
            not isinstance(event.get("group"), str) or event.get("outcome") not in ("ok", "failed")
        ):
            raise TraceError(f"line {number}: build needs a group id and outcome ok|failed")
        if kind == "tick" and not (
            isinstance(event.get("seconds"), (int, float))
            and not isinstance(event.get("seconds"), bool)
            and event["seconds"] >= 0
        ):
            raise TraceError(f"line {number}: tick needs non-negative seconds")
        if kind == "state":
            try:
                DecisionState.from_line(event)
            except DecisionStateError as exc:
                raise TraceError(f"line {number}: {exc}") from None
        events.append(event)
    return events


class _Replayer:
    def __init__(self, boundary: BoundarySettings, core_settings: CoreSettings) -> None:
        self.core = AdmissionCore(core_settings)
        # The service's own ingestion: records are judged here exactly as they are live.
        self.ingest = Ingestor(CardRecordDecoder(boundary))
        self.rejections: list[RejectionReported] = []
        self.invalid: list[tuple[str, str]] = []
        self.history: dict[str, KeyHistory] = {}
        self.in_flight: dict[GroupKey, tuple[str, int]] = {}
        self.clock = 0.0
        self.effects = 0
        # group id -> line indexes of its build lines, to know if a build must wait
        self.build_lines: dict[str, list[int]] = {}
        self.line = 0
        self.kv_key_of: dict[str, str] = {}
        # A recorded frontend's cohort order, for the listing that follows its state line.
        self.recorded: Mapping[tuple[str, str], Sequence[str]] | None = None

    def _note(self, instance_key: str, kv_key: str, text: str) -> KeyHistory:
        entry = self.history.get(instance_key)
        if entry is None:
            entry = self.history[instance_key] = KeyHistory(kv_key)
        entry.events.append(f"line {self.line + 1}: {text}")
        return entry

    def run(self, events: Sequence[Mapping[str, Any]]) -> None:
        for index, event in enumerate(events):
            if event["kind"] == "build":
                self.build_lines.setdefault(event["group"], []).append(index)
        ingest = self.ingest
        for index, event in enumerate(events):
            self.line = index
            kind = event["kind"]
            if kind == "state":
                self.recorded = DecisionState.from_line(event).cohorts
            elif kind == "put":
                self._ingested(ingest.put(event["key"], _value_bytes(event["value"])))
            elif kind == "delete":
                self._ingested(ingest.delete(event["key"]))
            elif kind == "snapshot":
                listing = [(e["key"], _value_bytes(e.get("value"))) for e in event["entries"]]
                reconnect = event.get("reason") == "reconnect"
                recorded, self.recorded = self.recorded, None
                self._ingested(ingest.snapshot(listing, reconnect=reconnect, recorded=recorded))
            elif kind == "build":
                self._build(event["group"], event["outcome"] == "ok")
            else:
                self.clock += float(event["seconds"])
                self._apply(Tick(self.clock))

    def _ingested(self, result: Ingested) -> None:
        """Note what ingestion judged, then apply its inputs as the service would."""
        for verdict in result.verdicts:
            kv_key = verdict.key
            if verdict.refusal is not None:
                reason = verdict.refusal.reason
                if not verdict.repeated:  # listed once per key and value, as live
                    self.invalid.append((kv_key, reason))
                self._note(_instance_key_of(kv_key), kv_key, f"refused ({reason})").refused = reason
            elif verdict.registration is not None:
                key = verdict.registration.key
                self.kv_key_of[key] = kv_key
                checksum = verdict.registration.mdc_checksum
                self._note(key, kv_key, f"valid record ({checksum[:12]}…)").valid_seen = True
            elif verdict.ignored:
                self._note(_instance_key_of(kv_key), kv_key, "ignored by the namespace filter")
        for event in result.inputs:
            if isinstance(event, WorkerRemoved) and self.core.registration(event.key) is not None:
                self._note(event.key, self.kv_key_of.get(event.key, event.key), "deleted")
            self._apply(event)

    def _build(self, group_id: str, ok: bool) -> None:
        try:
            key = GroupKey.from_id(group_id)
        except (ValueError, TypeError):
            return  # a group that cannot exist has no build in flight
        flight = self.in_flight.get(key)
        if flight is None:
            return
        checksum, generation = flight
        self._apply(BuildFinished(key, checksum, generation, ok, None if ok else "failed (trace)"))

    def _waits(self, group: GroupKey) -> bool:
        return any(i > self.line for i in self.build_lines.get(group.id, ()))

    def _apply(self, event: Input) -> None:
        pending: list[Input] = [event]
        while pending:
            current = pending.pop(0)
            # A result ends the simulated build it answers.
            if isinstance(current, BuildFinished) and self.in_flight.get(current.group) == (
                current.mdc_checksum,
                current.generation,
            ):
                del self.in_flight[current.group]
            effects = self.core.apply(current)
            self.effects += len(effects)
            pending.extend(self._observe(effects))

    def _observe(self, effects: list[Effect]) -> list[Input]:
        follow: list[Input] = []
        for effect in effects:
            if isinstance(effect, StartBuild):
                self.in_flight[effect.group] = (effect.mdc_checksum, effect.generation)
                if not self._waits(effect.group):
                    follow.append(
                        BuildFinished(effect.group, effect.mdc_checksum, effect.generation, True)
                    )
            elif isinstance(effect, CancelBuild):
                if self.in_flight.get(effect.group) == (effect.mdc_checksum, effect.generation):
                    del self.in_flight[effect.group]
            elif isinstance(effect, RejectionReported):
                self.rejections.append(effect)
            elif isinstance(effect, MutationRefused):
                kv_key = self.kv_key_of.get(effect.key, effect.key)
                self.invalid.append((kv_key, MUTATION_REFUSED))
                note = self._note(effect.key, kv_key, "in-place change refused")
                note.refused = MUTATION_REFUSED
        return follow


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
    """Replay a trace and return the final state, rejections and refused records."""
    replayer = _Replayer(boundary or BoundarySettings(), core_settings or CoreSettings())
    replayer.run(read_trace(lines))
    return ReplayResult(
        core=replayer.core,
        rejections=replayer.rejections,
        invalid=replayer.invalid,
        history=replayer.history,
        effects=replayer.effects,
    )


def resolve_instance(result: ReplayResult, instance: str) -> str:
    """Return the instance key ``instance`` names: an instance key, a KV key, or a bare id.

    Instance ids are printed as integers (``status --json``, ``replay``) and spelled in hex in
    keys; a bare id may be given either way (``26`` or ``0x1a``). A bare id must name one
    registration of the trace; several are refused with the keys to choose from.
    """
    if instance.startswith("v1."):
        return _instance_key_of(instance)
    if "/" in instance:
        return instance
    try:
        wanted = int(instance, 16) if instance.lower().startswith("0x") else int(instance, 10)
    except ValueError:
        raise UsageError(
            f"{instance!r} is neither an instance key, a KV key nor an instance id"
        ) from None
    matches = sorted(key for key in result.history if _instance_id_of(key) == wanted)
    if not matches:
        raise UsageError(f"the trace never registers instance id {wanted} (0x{wanted:x})")
    bases = [key for key in matches if key.count("/") == 3]
    if len(bases) == 1:
        return bases[0]
    if len(matches) == 1:
        return matches[0]
    raise UsageError(f"instance id {wanted} names several keys: {', '.join(matches)}")


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
        if placement.admitted:
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
            lines.append(
                f"The tenure of {view.incumbent} is held after an outage until clock "
                f"{view.held_until:g} s: none of its workers is listed, nothing is admitted, and "
                "the succession happens only if none registers again by then."
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
