"""The rollout gate: whether a new deployment generation is served by every live frontend.

Theory of operation
-------------------
Every frontend publishes its serving admissions to the ``frontend-model-admission`` bucket: one
record per worker namespace it serves, plus a capability record that says "this frontend is
here and speaks protocol v1". A record looks like::

    {"protocol": "v1", "frontend": "fe-a", "namespace": "prod-v2",
     "members": ["prod-v2/backend/generate/1a", ...],
     "groups": [{"model": "llama", "worker_set": "[...]", "checksum": "<mdc_checksum>",
                 "generation": 7, "members": ["prod-v2/backend/generate/1a", ...]}]}

``members`` is the part Dynamo's own publisher writes; ``groups`` (one entry per admitted
WorkerSet) is what a gate needs to tell models and configurations apart. A record without
``groups`` still counts, by namespace, with the model marked unverified.

A record counts only under its own frontend's key: ``v1.<frontend>.capability`` and
``v1.<frontend>.members.<namespace>`` (tokens escaped as discovery keys are), naming the same
frontend and namespace as its value. Each frontend's NATS user may write only under its own
``v1.<frontend>.`` (``docs/security.md``), so together no frontend can make the gate, or a peer
aligning its start, count a record for another frontend or for one that does not exist.

A deployment generation is a worker namespace. For a model M and a namespace N the gate answers:

- *live*: frontends with at least one record in the bucket. Records of a frontend that stopped
  publishing expire (the bucket's max age), so it drops out; a caller that knows each record's
  publication time may also pass ``stale_after`` to drop frontends whose newest record is older.
- *serving*: live frontends with a WorkerSet of M in N that has admitted members (and, when an
  expected checksum is given, whose incumbent has that checksum).
- *missing*: live frontends not serving; the gate stays closed while there is one.
- *previous*: live frontends still serving M from another namespace (an older generation); this
  is information for the operator, not a reason to keep the gate closed.
- *disagreements*: WorkerSets of M in N for which frontends admitted different checksums.
  Selection is frontend-local by contract, so this is reported; it closes the gate only when the
  caller asks for agreement.

The gate is open when at least one frontend is live, every live frontend is serving, and (when
asked) no WorkerSet is in disagreement. Everything here is pure: records in, a report out.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from workerset_admission.errors import InvalidRecordError, bounded_text
from workerset_admission.keys import escape_token

__all__ = [
    "PROTOCOL",
    "BucketRead",
    "CapabilityRecord",
    "Disagreement",
    "FrontendView",
    "GateReport",
    "NamespaceRecord",
    "RawEntry",
    "Record",
    "ServedGroup",
    "evaluate_gate",
    "parse_record",
    "render_table",
]

PROTOCOL = "v1"

# A record is tiny; anything much larger is not ours and is refused before json.loads.
_MAX_RECORD_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class RawEntry:
    """One bucket entry: key, value bytes, and the wall-clock time the server stored it."""

    key: str
    value: bytes
    published_at: float | None = None


@dataclass(frozen=True, slots=True)
class BucketRead:
    """The bucket's current entries, or why they could not be read (``problem``)."""

    entries: tuple[RawEntry, ...] = ()
    problem: str | None = None


@dataclass(frozen=True, slots=True)
class ServedGroup:
    """One WorkerSet a frontend serves: its model, incumbent checksum and admitted members."""

    model: str
    worker_set: str
    checksum: str | None
    generation: int | None
    members: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class NamespaceRecord:
    """What one frontend serves from one worker namespace.

    ``groups`` is None for a record that names only members (Dynamo's own shape); the gate then
    cannot tell which model those members serve.
    """

    key: str
    frontend: str
    namespace: str | None
    members: tuple[str, ...]
    groups: tuple[ServedGroup, ...] | None
    published_at: float | None = None


@dataclass(frozen=True, slots=True)
class CapabilityRecord:
    """A frontend's presence: it publishes serving admissions with this protocol."""

    key: str
    frontend: str
    published_at: float | None = None


Record = NamespaceRecord | CapabilityRecord


def _refuse(key: str, reason: str, detail: str) -> InvalidRecordError:
    return InvalidRecordError(reason, detail, key=key)


def _string_list(key: str, value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise _refuse(key, "bad_members", f"{where} must be a list of strings")
    return tuple(value)


def _optional_str(key: str, value: Any, where: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise _refuse(key, "bad_field", f"{where} must be a string")


def _parse_group(key: str, raw: Any, index: int) -> ServedGroup:
    where = f"groups[{index}]"
    if not isinstance(raw, dict):
        raise _refuse(key, "bad_group", f"{where} must be an object")
    model = raw.get("model")
    worker_set = raw.get("worker_set")
    if not isinstance(model, str) or not model:
        raise _refuse(key, "bad_group", f"{where}.model must be a non-empty string")
    if not isinstance(worker_set, str):
        raise _refuse(key, "bad_group", f"{where}.worker_set must be a string")
    generation = raw.get("generation")
    # bool is an int subclass; a JSON true is not a build generation.
    if generation is not None and (isinstance(generation, bool) or not isinstance(generation, int)):
        raise _refuse(key, "bad_group", f"{where}.generation must be an integer")
    return ServedGroup(
        model=model,
        worker_set=worker_set,
        checksum=_optional_str(key, raw.get("checksum"), f"{where}.checksum"),
        generation=generation,
        members=_string_list(key, raw.get("members", []), f"{where}.members"),
    )


def _namespace_of(members: Sequence[str]) -> str | None:
    # An instance key is "<ns>/<component>/<endpoint>/<id hex>": the namespace is its first part.
    namespaces = {member.split("/", 1)[0] for member in members}
    return namespaces.pop() if len(namespaces) == 1 else None


def _check_key(key: str, frontend: str, capability: bool) -> str | None:
    """Refuse a record whose key is not its own frontend's; return the key's namespace token.

    A frontend's NATS user may write only under ``v1.<its id>.``, so a record counts only when
    the frontend its value names is the one its key names: no frontend can speak for another,
    or for one that does not exist.
    """
    parts = key.split(".")
    own = parts[:2] == [PROTOCOL, escape_token(frontend)]
    if capability and own and parts[2:] == ["capability"]:
        return None
    if not capability and own and len(parts) == 4 and parts[2] == "members":
        return parts[3]
    raise _refuse(
        key, "identity_mismatch", f"the key is not frontend {bounded_text(frontend, 64)!r}'s"
    )


def parse_record(key: str, value: bytes, published_at: float | None = None) -> Record:
    """Decode one bucket entry; bad data raises ``InvalidRecordError`` naming the key."""
    if len(value) > _MAX_RECORD_BYTES:
        raise _refuse(key, "too_large", f"{len(value)} bytes")
    try:
        data = json.loads(value)
    except (UnicodeDecodeError, ValueError) as error:
        raise _refuse(key, "not_json", str(error)) from None
    if not isinstance(data, dict):
        raise _refuse(key, "not_object", "a record must be a JSON object")
    if data.get("protocol") != PROTOCOL:
        raise _refuse(key, "protocol", f"unsupported protocol {data.get('protocol')!r}")
    frontend = data.get("frontend")
    if not isinstance(frontend, str) or not frontend:
        raise _refuse(key, "no_frontend", "the record does not name its frontend")
    key_namespace = _check_key(key, frontend, data.get("capability") is True)
    if data.get("capability") is True:
        return CapabilityRecord(key=key, frontend=frontend, published_at=published_at)
    members = _string_list(key, data.get("members"), "members")
    raw_groups = data.get("groups")
    groups: tuple[ServedGroup, ...] | None = None
    if raw_groups is not None:
        if not isinstance(raw_groups, list):
            raise _refuse(key, "bad_group", "groups must be a list")
        groups = tuple(_parse_group(key, raw, index) for index, raw in enumerate(raw_groups))
    namespace = _optional_str(key, data.get("namespace"), "namespace")
    if namespace is None:
        namespace = _namespace_of(members)
    if namespace is not None and (not namespace or escape_token(namespace) != key_namespace):
        raise _refuse(key, "identity_mismatch", "the value's namespace is not its key's")
    return NamespaceRecord(
        key=key,
        frontend=frontend,
        namespace=namespace,
        members=members,
        groups=groups,
        published_at=published_at,
    )


@dataclass(frozen=True, slots=True)
class FrontendView:
    """One live frontend as the gate sees it for the model and namespace asked about."""

    frontend: str
    serving: bool
    model_verified: bool
    checksums: tuple[str, ...]
    generations: tuple[int, ...]
    members: int
    previous_namespaces: tuple[str, ...]

    def as_json(self) -> dict[str, Any]:
        return {
            "frontend": self.frontend,
            "serving": self.serving,
            "model_verified": self.model_verified,
            "checksums": list(self.checksums),
            "generations": list(self.generations),
            "members": self.members,
            "previous_namespaces": list(self.previous_namespaces),
        }


@dataclass(frozen=True, slots=True)
class Disagreement:
    """A WorkerSet whose frontends admitted different incumbents (checksum -> frontends)."""

    worker_set: str
    incumbents: tuple[tuple[str, tuple[str, ...]], ...]

    def as_json(self) -> dict[str, Any]:
        return {
            "worker_set": self.worker_set,
            "incumbents": {checksum: list(fronts) for checksum, fronts in self.incumbents},
        }


@dataclass(frozen=True, slots=True)
class GateReport:
    """The gate's answer, with everything an operator needs to see why."""

    model: str
    namespace: str
    expected_checksum: str | None
    open: bool
    reasons: tuple[str, ...]
    frontends: tuple[FrontendView, ...]
    stale: tuple[str, ...]
    disagreements: tuple[Disagreement, ...]
    invalid: tuple[tuple[str, str], ...] = field(default=())

    @property
    def live(self) -> tuple[str, ...]:
        return tuple(view.frontend for view in self.frontends)

    @property
    def serving(self) -> tuple[str, ...]:
        return tuple(view.frontend for view in self.frontends if view.serving)

    @property
    def missing(self) -> tuple[str, ...]:
        return tuple(view.frontend for view in self.frontends if not view.serving)

    @property
    def previous(self) -> tuple[str, ...]:
        return tuple(view.frontend for view in self.frontends if view.previous_namespaces)

    def as_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "namespace": self.namespace,
            "expected_checksum": self.expected_checksum,
            "open": self.open,
            "reasons": list(self.reasons),
            "live": list(self.live),
            "serving": list(self.serving),
            "missing": list(self.missing),
            "previous": list(self.previous),
            "stale": list(self.stale),
            "disagreements": [item.as_json() for item in self.disagreements],
            "frontends": [view.as_json() for view in self.frontends],
            "invalid": [{"key": key, "reason": reason} for key, reason in self.invalid],
        }


def _live_frontends(
    records: Sequence[Record], now: float | None, stale_after: float | None
) -> tuple[set[str], set[str]]:
    newest: dict[str, float | None] = {}
    for record in records:
        seen = newest.get(record.frontend)
        stamp = record.published_at
        if record.frontend not in newest or (stamp is not None and (seen is None or stamp > seen)):
            newest[record.frontend] = stamp
    if now is None or stale_after is None:
        return set(newest), set()
    # A record without a timestamp cannot be judged stale; only bucket expiry removes it.
    stale = {
        frontend
        for frontend, stamp in newest.items()
        if stamp is not None and now - stamp > stale_after
    }
    return set(newest) - stale, stale


def _model_groups(record: NamespaceRecord, model: str) -> list[ServedGroup]:
    return [g for g in record.groups or () if g.model == model and g.members]


def _serves_model(record: NamespaceRecord, model: str) -> bool:
    if record.groups is None:
        return bool(record.members)
    return bool(_model_groups(record, model))


def evaluate_gate(
    records: Iterable[Record],
    *,
    model: str,
    namespace: str,
    expected_checksum: str | None = None,
    previous_namespaces: Sequence[str] | None = None,
    require_agreement: bool = False,
    now: float | None = None,
    stale_after: float | None = None,
    invalid: Sequence[tuple[str, str]] = (),
) -> GateReport:
    """Decide whether ``namespace`` serves ``model`` on every live frontend.

    ``previous_namespaces`` limits what counts as an older generation (default: any other
    namespace serving the model). ``invalid`` carries (key, reason) of records the caller could
    not parse, so the report shows them.
    """
    all_records = list(records)
    live, stale = _live_frontends(all_records, now, stale_after)
    by_frontend: dict[str, list[NamespaceRecord]] = {frontend: [] for frontend in live}
    for record in all_records:
        if isinstance(record, NamespaceRecord) and record.frontend in live:
            by_frontend[record.frontend].append(record)

    # worker_set -> checksum -> frontends that admitted it; filled while building the views.
    incumbents: dict[str, dict[str, set[str]]] = {}
    views = [
        _view(
            frontend,
            by_frontend[frontend],
            model=model,
            namespace=namespace,
            expected_checksum=expected_checksum,
            previous_namespaces=previous_namespaces,
            incumbents=incumbents,
        )
        for frontend in sorted(live)
    ]

    disagreements = tuple(
        Disagreement(
            worker_set=worker_set,
            incumbents=tuple(
                (checksum, tuple(sorted(fronts))) for checksum, fronts in sorted(seen.items())
            ),
        )
        for worker_set, seen in sorted(incumbents.items())
        if len(seen) > 1
    )

    reasons: list[str] = []
    if not views:
        reasons.append("no live frontend publishes serving admissions")
    missing = [view.frontend for view in views if not view.serving]
    if missing:
        what = f"{model} from {namespace}"
        if expected_checksum is not None:
            what += f" with checksum {expected_checksum}"
        reasons.append(f"not serving {what}: {', '.join(missing)}")
    if require_agreement and disagreements:
        names = ", ".join(item.worker_set for item in disagreements)
        reasons.append(f"frontends disagree on the incumbent of {names}")

    return GateReport(
        model=model,
        namespace=namespace,
        expected_checksum=expected_checksum,
        open=not reasons,
        reasons=tuple(reasons),
        frontends=tuple(views),
        stale=tuple(sorted(stale)),
        disagreements=disagreements,
        invalid=tuple(invalid),
    )


def _view(
    frontend: str,
    records: Sequence[NamespaceRecord],
    *,
    model: str,
    namespace: str,
    expected_checksum: str | None,
    previous_namespaces: Sequence[str] | None,
    incumbents: dict[str, dict[str, set[str]]],
) -> FrontendView:
    current = [record for record in records if record.namespace == namespace]
    groups = [group for record in current for group in _model_groups(record, model)]
    verified = all(record.groups is not None for record in current)
    checksums = sorted({group.checksum for group in groups if group.checksum is not None})
    for group in groups:
        if group.checksum is not None:
            incumbents.setdefault(group.worker_set, {}).setdefault(group.checksum, set()).add(
                frontend
            )
    serving = any(_serves_model(record, model) for record in current)
    if expected_checksum is not None:
        # Only a verified incumbent with the expected configuration counts.
        serving = any(group.checksum == expected_checksum for group in groups)
    members = {
        member
        for record in current
        for member in (
            record.members
            if record.groups is None
            else [m for g in _model_groups(record, model) for m in g.members]
        )
    }
    older = sorted(
        {
            record.namespace
            for record in records
            if record.namespace is not None
            and record.namespace != namespace
            and (previous_namespaces is None or record.namespace in previous_namespaces)
            and _serves_model(record, model)
        }
    )
    return FrontendView(
        frontend=frontend,
        serving=serving,
        model_verified=verified,
        checksums=tuple(checksums),
        generations=tuple(sorted({g.generation for g in groups if g.generation is not None})),
        members=len(members),
        previous_namespaces=tuple(older),
    )


def render_table(report: GateReport) -> str:
    """Render the report as a plain-text table for people."""
    lines = [
        f"model {report.model}  namespace {report.namespace}"
        + (f"  checksum {report.expected_checksum}" if report.expected_checksum else ""),
        f"gate: {'OPEN' if report.open else 'CLOSED'}",
    ]
    lines.extend(f"  - {reason}" for reason in report.reasons)
    header = ("FRONTEND", "SERVING", "MEMBERS", "CHECKSUM", "GENERATION", "PREVIOUS")
    rows = [
        (
            view.frontend,
            ("yes" if view.serving else "no") + ("" if view.model_verified else " (model?)"),
            str(view.members),
            ",".join(checksum[:12] for checksum in view.checksums) or "-",
            ",".join(str(g) for g in view.generations) or "-",
            ",".join(view.previous_namespaces) or "-",
        )
        for view in report.frontends
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines.append("")
    lines.extend(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    )
    for item in report.disagreements:
        lines.append("")
        lines.append(f"disagreement on {item.worker_set}:")
        lines.extend(f"  {checksum}: {', '.join(fronts)}" for checksum, fronts in item.incumbents)
    if report.stale:
        lines.append("")
        lines.append(f"not live (stopped publishing): {', '.join(report.stale)}")
    if report.invalid:
        lines.append("")
        lines.extend(f"refused record {key}: {reason}" for key, reason in report.invalid)
    return "\n".join(lines) + "\n"
