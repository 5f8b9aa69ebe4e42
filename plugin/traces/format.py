"""The replay trace format: JSON Lines, one observation per line; read, checked and written here.

Version 4, which ``serve --trace-out`` and ``record`` write, loses nothing the decision depends
on, and says what each decision was. It opens with a header, and every line after it carries
``t``, the monotonic seconds since the trace began at which the frontend observed it::

    {"kind": "trace", "version": 4, "wall_time": <unix seconds at t = 0>,
     "observer": "frontend" | "bucket",
     "settings": {"core": {...}, "boundary": {...}}}                       (frontend only)
    {"kind": "state", "t": 0.0, "frontend": "<id>", "groups": [...]}        (optional; see
                                                                             state_line.py)
    {"kind": "snapshot", "t": ..., "reason": "initial" | "reconnect" | "periodic" | "resync",
     "entries": [{"key": ..., "value": "<raw text>"}, ...],
     "keep": [<keys live updates touched while the listing was read>],     (when any)
     "peers": {"<group id>": ["<checksum a peer frontend serves>", ...]},   (when any)
     "peer_members": {"<group id>": {"<checksum>": [<instance id>, ...]}}, (when any)
     "peers_resynced_ago": <seconds>, (when a peer said it resynced after an outage)
     "after_outage": true}            (an initial listing that followed an outage: the frontend
                                       started while the store was away)
    {"kind": "put", "t": ..., "key": "<KV key>", "value": "<raw text>"}
    {"kind": "delete", "t": ..., "key": "<KV key>", "operation": "delete" | "purge" | "expired"}
    {"kind": "build", "t": ..., "group": "<group id>", "outcome": "ok" | "failed",
     "generation": <int>, "checksum": "<mdc checksum>"}
    {"kind": "tick", "t": ...}        (a timer the core scheduled fell due: a retry, a hold;
                                       a bucket recording ends with one, at its last moment)
    {"kind": "commit_failed", "t": ..., "group": "<group id>", "checksum": "<mdc checksum>",
     "generation": <int>, "phase": "commit", "error": "<why>"}
                                      (an input the frontend made itself: a hop refused the
                                       commit of that build, and the refusal went to the core)

*Every input that enters the core is in the trace*, the ones the frontend makes itself
included: the source events (which ingestion turns into inputs by the same code in replay),
build results, timer ticks, and refused commits. *Each step's effects are in it too*: a
frontend writes every line that stepped the core with ``"effects": "<digest>"``, the digest
(``digest.py``) of the effects that step returned, in order. ``replay`` feeds the inputs through
the live step and compares its own effects' digest with the recorded one line by line; the
first line where they differ stops it with a :class:`NondeterminismError` naming that line
(as Temporal's replayer stops on a history its code no longer makes). A refused commit is
replayed where the recorded frontend's hop refused it: its line answers the ``CommitGroup`` of
that group, checksum and generation. Only a replay under the recorded settings is checked; one
under other settings asks what those would have decided, and differs by design.

The header's ``observer`` says who recorded it. ``frontend``: the service itself
(``serve --trace-out``), which records every build result and timer tick, so a replay builds
and ticks exactly where the frontend did. ``bucket``: a second watch on the bucket
(``record``), which sees no builds and no timers; its replay lets builds succeed at once and
fires the core's deadlines as its clock passes them.

A frontend's header also records the settings its decisions depend on (retry delays, tenure
hold, build limit; the namespace filter and other boundary settings); replay uses them unless
told otherwise.

Older versions are upgraded when read, each by one function (``_upgrade_header``,
``upgrade_version_1``), so replay knows one form only: version 4 lines, each with its ``t`` (a
version 1 trace still has no header: :func:`trace_version` and :func:`recorded_ticks` tell it).
Version 3 is version 4 without the outage reports of a first listing (``after_outage``,
``peers_resynced_ago``) and the members peers serve (``peer_members``): its lines are version 4
lines that never report them, so it replays exactly as before. Version 2 is version 3 without
digests and refused commits: its lines are version 4 lines with nothing to compare, so it
replays exactly as before, unchecked. A trace that reports an outage needs version 4: an older
reader would decide without it.

Times are written at full precision (a float's shortest exact spelling): the core compares
deadlines computed from them, and a rounded time could put a recorded tick before the deadline
it fired for. A version 2 replay ticks exactly where the recording did.

A build line with its generation and checksum answers exactly that attempt, so a result that
arrives after its attempt was cancelled (a late result after a succession) is expressible and
is fenced by the core as it was live.

Version 1 (no header, no times, no operations) has a clock of its own: it starts at 0 and moves
only at ``{"kind": "tick", "seconds": <float>}`` lines, by their seconds. Its upgrade gives every
line the reading of that clock as its ``t`` (a tick line the reading it moves the clock to), so
its replay's clock follows ``t`` like any other's and lands on the same readings. Its tick lines
stay the only moments a timer falls due (a retry is due at the first tick at or past its
deadline), as in a frontend's recording (:func:`recorded_ticks`); a delete is a plain deletion,
and a build line without generation answers the attempt in flight for its group.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, Final

from workerset_admission.admission import BuildFinished, CommitFailed, CoreSettings
from workerset_admission.admission.ordering import GroupId
from workerset_admission.card import BoundarySettings
from workerset_admission.errors import UsageError
from workerset_admission.identity import compact_json
from workerset_admission.ports import SourceDelete, SourceEvent, SourceListing, SourcePut
from workerset_admission.traces.state_line import DecisionState, DecisionStateError

__all__ = [
    "LISTING_REASONS",
    "STEPPED",
    "TRACE_VERSION",
    "NondeterminismError",
    "TraceError",
    "build_line",
    "commit_failed_line",
    "event_line",
    "header_line",
    "raw_text",
    "read_trace",
    "recorded_by_frontend",
    "recorded_settings",
    "recorded_ticks",
    "settings_of",
    "trace_version",
    "upgrade_version_1",
]

TRACE_VERSION: Final = 4
KINDS: Final = ("trace", "state", "put", "delete", "snapshot", "build", "tick", "commit_failed")
# The lines a frontend's step writes with the digest of its effects.
STEPPED: Final = ("put", "delete", "snapshot", "build", "tick", "commit_failed")
# "listing" is version 1's reason for a snapshot line that states none.
LISTING_REASONS: Final = ("listing", "initial", "reconnect", "periodic", "resync")
DELETE_OPERATIONS: Final = ("delete", "purge", "expired")
OBSERVERS: Final = ("frontend", "bucket")
# What a snapshot line says only from version 4 on.
_VERSION_4_SNAPSHOT: Final = ("after_outage", "peers_resynced_ago", "peer_members")


class TraceError(UsageError):
    """A trace line that is not valid trace syntax (the file, not a record in it, is wrong)."""


class NondeterminismError(UsageError):
    """A replayed step's effects differ from the ones its trace line recorded.

    ``line`` is the 1-based number of the first such line. Either the trace was altered or this
    release decides differently from the frontend that recorded it; nothing after that line can
    be trusted to be what the frontend did.
    """

    def __init__(self, line: int, message: str) -> None:
        super().__init__(message)
        self.line = line


def raw_text(value: bytes) -> str:
    """Return a value as trace text; invalid UTF-8 survives as surrogate escapes."""
    return value.decode("utf-8", errors="surrogateescape")


def header_line(
    wall_time: float, observer: str, settings: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    line = {"kind": "trace", "version": TRACE_VERSION, "wall_time": wall_time, "observer": observer}
    if settings:
        line["settings"] = dict(settings)
    return line


def settings_of(core: CoreSettings, boundary: BoundarySettings | None = None) -> dict[str, Any]:
    """Return the settings a decision depends on, for a trace's header."""
    found: dict[str, Any] = {"core": _fields(core)}
    if boundary is not None:
        found["boundary"] = _fields(boundary)
    return found


def _fields(value: Any) -> dict[str, Any]:
    return {
        f.name: list(v) if isinstance(v := getattr(value, f.name), tuple) else v
        for f in dataclasses.fields(value)
    }


def recorded_settings(
    events: Sequence[Mapping[str, Any]],
) -> tuple[CoreSettings | None, BoundarySettings | None]:
    """Return the core and boundary settings a trace's header records (``None`` if it does not).

    Settings this release does not know are left out, so a newer recording still replays.
    """
    header = events[0] if events and events[0]["kind"] == "trace" else None
    settings = header.get("settings") if header is not None else None
    if not isinstance(settings, Mapping):
        return None, None
    return (
        _build(CoreSettings, settings.get("core")),
        _build(BoundarySettings, settings.get("boundary")),
    )


def _build(kind: Any, values: object) -> Any:
    if not isinstance(values, Mapping):
        return None
    known = {f.name for f in dataclasses.fields(kind)}
    given = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items() if k in known}
    try:
        return kind(**given)
    except (TypeError, ValueError, UsageError) as exc:
        raise TraceError(f"the trace header's settings are not valid: {exc}") from None


def event_line(
    event: SourceEvent,
    t: float,
    keep: Collection[str] = (),
    peers: Mapping[GroupId, Sequence[str]] | None = None,
) -> dict[str, Any]:
    """Translate one source event, observed at ``t``, into a version 2 trace line."""
    if isinstance(event, SourcePut):
        entry = event.entry
        return {"kind": "put", "t": t, "key": entry.key, "value": raw_text(entry.value)}
    if isinstance(event, SourceDelete):
        return {"kind": "delete", "t": t, "key": event.key, "operation": event.operation}
    if isinstance(event, SourceListing):
        line: dict[str, Any] = {
            "kind": "snapshot",
            "t": t,
            "reason": event.reason,
            "entries": [{"key": e.key, "value": raw_text(e.value)} for e in event.entries],
        }
        if keep:
            line["keep"] = sorted(keep)
        served = event.peers if peers is None else peers
        if served:
            line["peers"] = {
                compact_json(list(group)): list(checksums)
                for group, checksums in sorted(served.items())
            }
        if event.peer_members:
            line["peer_members"] = {
                compact_json(list(group)): {c: list(ids) for c, ids in sorted(served_ids.items())}
                for group, served_ids in sorted(event.peer_members.items())
            }
        if event.peers_resynced_ago is not None:
            line["peers_resynced_ago"] = event.peers_resynced_ago
        if event.after_outage:
            line["after_outage"] = True
        return line
    raise TypeError(f"not a source event: {event!r}")


def build_line(result: BuildFinished, t: float) -> dict[str, Any]:
    """Translate a build result, fed back at ``t``, into a version 2 trace line."""
    line: dict[str, Any] = {
        "kind": "build",
        "t": t,
        "group": result.group.id,
        "outcome": "ok" if result.ok else "failed",
        "generation": result.generation,
        "checksum": result.mdc_checksum,
    }
    if result.error is not None:
        line["error"] = result.error
    return line


def commit_failed_line(event: CommitFailed, t: float) -> dict[str, Any]:
    """Translate a commit refusal the frontend made itself, fed back at ``t``, into a line."""
    return {
        "kind": "commit_failed",
        "t": t,
        "group": event.group.id,
        "checksum": event.mdc_checksum,
        "generation": event.generation,
        "phase": event.phase,
        "error": event.error,
    }


def trace_version(events: Sequence[Mapping[str, Any]]) -> int:
    """Return a read trace's version: its header's, or 1 for a trace without one."""
    if events and events[0]["kind"] == "trace":
        return int(events[0]["version"])
    return 1


def recorded_by_frontend(events: Sequence[Mapping[str, Any]]) -> bool:
    """Tell whether a read trace holds every build result and tick of the frontend."""
    return bool(events) and events[0]["kind"] == "trace" and events[0]["observer"] == "frontend"


def recorded_ticks(events: Sequence[Mapping[str, Any]]) -> bool:
    """Tell whether a read trace's tick lines are the only moments its timers fall due.

    A frontend's recording has a tick line wherever one of its timers fired, and version 1's
    tick lines are its clock. Only a bucket recording, which sees no timers, leaves replay to
    fire the core's deadlines itself as the clock passes them.
    """
    if not events or events[0]["kind"] != "trace":
        return True  # version 1: no header
    return bool(events[0]["observer"] == "frontend")


def _number(value: object) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )


def _check(number: int, event: Mapping[str, Any], version: int, last_t: float) -> float:
    """Check one line's syntax; return its time (``last_t`` for lines without one)."""
    kind = event["kind"]
    where = f"line {number}"
    if kind == "trace":
        raise TraceError(f"{where}: the trace header must be the first line")
    t = last_t
    if version >= 2:
        if not _number(event.get("t")):
            raise TraceError(f"{where}: a version {version} line needs t, non-negative seconds")
        t = float(event["t"])
        if t < last_t:
            raise TraceError(f"{where}: t goes back in time ({t} after {last_t})")
    if kind in ("put", "delete") and not isinstance(event.get("key"), str):
        raise TraceError(f"{where}: {kind} needs a string key")
    if kind == "put" and "value" not in event:
        raise TraceError(f"{where}: put needs a value")
    if kind == "delete" and event.get("operation", "delete") not in DELETE_OPERATIONS:
        raise TraceError(f"{where}: a delete operation is one of {DELETE_OPERATIONS}")
    if kind == "snapshot":
        entries = event.get("entries")
        if not (
            isinstance(entries, list)
            and all(isinstance(e, dict) and isinstance(e.get("key"), str) for e in entries)
        ):
            raise TraceError(f"{where}: snapshot needs a list of {{key, value}} entries")
        if event.get("reason", "listing") not in LISTING_REASONS:
            raise TraceError(f"{where}: a snapshot reason is one of {LISTING_REASONS}")
        keep = event.get("keep", [])
        if not (isinstance(keep, list) and all(isinstance(k, str) for k in keep)):
            raise TraceError(f"{where}: a snapshot's keep is a list of keys")
        peers = event.get("peers", {})
        if not (
            isinstance(peers, dict)
            and all(
                isinstance(v, list) and all(isinstance(c, str) for c in v) for v in peers.values()
            )
        ):
            raise TraceError(f"{where}: a snapshot's peers map group ids to checksum lists")
        peer_members = event.get("peer_members", {})
        if not (
            isinstance(peer_members, dict)
            and all(
                isinstance(by_checksum, dict)
                and all(
                    isinstance(ids, list) and all(_instance_id(i) for i in ids)
                    for ids in by_checksum.values()
                )
                for by_checksum in peer_members.values()
            )
        ):
            raise TraceError(
                f"{where}: a snapshot's peer_members map group ids to checksums to instance ids"
            )
        if event.get("after_outage", False) not in (True, False):
            raise TraceError(f"{where}: a snapshot's after_outage is true or false")
        if "peers_resynced_ago" in event and not _number(event["peers_resynced_ago"]):
            raise TraceError(f"{where}: a snapshot's peers_resynced_ago is non-negative seconds")
        if version < 4 and any(name in event for name in _VERSION_4_SNAPSHOT):
            raise TraceError(
                f"{where}: after_outage, peers_resynced_ago and peer_members need trace version 4"
            )
    if kind == "build":
        if not isinstance(event.get("group"), str) or event.get("outcome") not in ("ok", "failed"):
            raise TraceError(f"{where}: build needs a group id and outcome ok|failed")
        generation, checksum = event.get("generation"), event.get("checksum")
        if (generation is None) != (checksum is None) or not (
            generation is None
            or (
                (isinstance(generation, int) and not isinstance(generation, bool))
                and isinstance(checksum, str)
            )
        ):
            raise TraceError(f"{where}: a build names both its generation and checksum, or neither")
    if kind == "commit_failed" and not (
        isinstance(event.get("group"), str)
        and isinstance(event.get("checksum"), str)
        and isinstance(event.get("generation"), int)
        and not isinstance(event.get("generation"), bool)
        and event.get("phase") in ("commit", "replace")
        and isinstance(event.get("error", ""), str)
    ):
        raise TraceError(f"{where}: commit_failed needs group, checksum, generation and phase")
    if "effects" in event and (kind not in STEPPED or not isinstance(event["effects"], str)):
        raise TraceError(f"{where}: effects is the digest of a stepped line's effects")
    if kind == "tick" and version < 2 and not _number(event.get("seconds")):
        raise TraceError(f"{where}: tick needs non-negative seconds")
    if kind == "state":
        try:
            DecisionState.from_line(event)
        except DecisionStateError as exc:
            raise TraceError(f"{where}: {exc}") from None
    return t


def _instance_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**64


def _upgrade_header(header: Mapping[str, Any]) -> dict[str, Any]:
    """Return a version 2 or 3 header as the current one's: its lines are current lines already."""
    # Version 3 lacks only what it never reports (an outage before a first listing, the
    # members peers serve); version 2 also digests and refused commits.
    return {**header, "version": TRACE_VERSION, "upgraded_from": header["version"]}


def upgrade_version_1(events: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Return checked version 1 lines in the current form: each with ``t``, its clock reading.

    Version 1's clock starts at 0 and moves only at tick lines, by their ``seconds``; every line
    gets the reading of that clock when it is applied, a tick line the reading it moves the
    clock to (summed in line order, as replay summed them, so the readings are the same floats).
    A ``t`` a version 1 line carries is not its time and is replaced. Tick lines keep their
    ``seconds``, so upgrading an upgraded trace changes nothing.
    """
    clock = 0.0
    upgraded = []
    for event in events:
        if event["kind"] == "tick":
            clock += float(event["seconds"])
        upgraded.append({**event, "t": clock})
    return upgraded


def read_trace(lines: Iterable[str]) -> list[dict[str, Any]]:
    """Parse and check a trace's syntax and upgrade it to the current form.

    Blank lines are skipped. A version 1, 2 or 3 trace comes back as version 4 lines, each
    with its ``t`` (see the module's docstring).
    """
    events: list[dict[str, Any]] = []
    version = 1
    last_t = 0.0
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceError(f"line {number}: not JSON: {exc}") from None
        if not isinstance(event, dict) or event.get("kind") not in KINDS:
            raise TraceError(f"line {number}: expected an object with kind in {KINDS}")
        if event["kind"] == "trace" and not events:
            found = event.get("version")
            if not isinstance(found, int) or isinstance(found, bool) or found < 2:
                raise TraceError(f"line {number}: a trace header names its version (2 or more)")
            if found > TRACE_VERSION:
                raise TraceError(
                    f"line {number}: trace version {found} is newer than this release reads "
                    f"({TRACE_VERSION})"
                )
            if not _number(event.get("wall_time")):
                raise TraceError(f"line {number}: a trace header needs wall_time")
            if event.get("observer") not in OBSERVERS:
                raise TraceError(f"line {number}: a trace header's observer is one of {OBSERVERS}")
            version = found
            if found < TRACE_VERSION:
                event = _upgrade_header(event)
        else:
            last_t = _check(number, event, version, last_t)
        events.append(event)
    return upgrade_version_1(events) if version == 1 else events
