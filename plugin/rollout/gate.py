"""The rollout gate: whether a new deployment generation is served by every live frontend.

Theory of operation
-------------------
Every frontend publishes its serving admissions to the ``frontend-model-admission`` bucket: one
record per worker namespace it serves, plus a capability record (the records, their keys and
who may write them: :mod:`workerset_admission.card.serving_record`).

A deployment generation is a worker namespace. For a model M and a namespace N the gate answers:

- *live*: frontends with a heartbeat in the bucket (:mod:`workerset_admission.rollout.frontends`;
  the server removes a stopped frontend's heartbeat by its TTL, so it drops out); a caller that
  knows each record's publication time may also pass ``stale_after`` to drop frontends whose
  newest record is older. A *silent* frontend (its heartbeat gone, its lease on its last view
  not) counts beside them, judged on its last records: it still routes by that view.
- *serving*: live frontends with a WorkerSet of M in N that has admitted members (at least
  ``min_members`` of them, when the caller asks for the new generation's capacity; and, when an
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

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from workerset_admission.card.serving_record import (
    NamespaceRecord,
    Record,
    ServedGroup,
    live_records,
    routing_records,
)
from workerset_admission.errors import TABLE_LINE_LIMIT, UsageError, wire_text
from workerset_admission.rollout.frontends import live_frontends, silent_frontends

# The shortest checksum prefix taken for a whole one (git's own minimum for a short hash).
_MIN_PREFIX = 4
_HEX = frozenset("0123456789abcdef")

__all__ = [
    "Disagreement",
    "FrontendServing",
    "GateReport",
    "disagreements_with",
    "evaluate_gate",
    "expand_checksum",
    "render_table",
]


@dataclass(frozen=True, slots=True)
class FrontendServing:
    """What one live frontend serves of the model and namespace the gate was asked about."""

    frontend: str
    serving: bool
    model_verified: bool
    checksums: tuple[str, ...]
    generations: tuple[int, ...]
    members: int
    previous_namespaces: tuple[str, ...]
    # Its heartbeat is gone; it routes by its last view, which its last records describe.
    silent: bool = False

    def as_json(self) -> dict[str, Any]:
        shown: dict[str, Any] = {
            "frontend": self.frontend,
            "serving": self.serving,
            "model_verified": self.model_verified,
            "checksums": list(self.checksums),
            "generations": list(self.generations),
            "members": self.members,
            "previous_namespaces": list(self.previous_namespaces),
        }
        if self.silent:
            # Only a silent frontend says so: a live one's object is as it always was.
            shown["silent"] = True
        return shown


@dataclass(frozen=True, slots=True)
class Disagreement:
    """A WorkerSet whose frontends admitted different incumbents (checksum -> frontends)."""

    worker_set: str
    incumbents: tuple[tuple[str, tuple[str, ...]], ...]

    def in_words(self) -> str:
        """Say which frontends serve which checksum: ``fe-a, fe-b serve abc…; fe-c serves def…``."""
        return "; ".join(
            f"{', '.join(fronts)} {'serves' if len(fronts) == 1 else 'serve'} {checksum[:12]}"
            for checksum, fronts in self.incumbents
        )

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
    frontends: tuple[FrontendServing, ...]
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
    newest = live_frontends(records)
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


def expand_checksum(records: Iterable[Record], model: str, given: str) -> str:
    """Return the whole checksum ``given`` abbreviates among the incumbents served of ``model``.

    Like a git short hash: a prefix (the tables print 12 characters) stands for the one
    checksum it begins; a prefix that two checksums share is refused with both in full. A
    prefix no frontend serves yet stays as given (the gate stays closed until one does).
    """
    if len(given) < _MIN_PREFIX or not set(given) <= _HEX:
        raise UsageError(
            f"--checksum takes an mdc_checksum in lowercase hex, or a prefix of at least "
            f"{_MIN_PREFIX} characters of it, not {given!r}"
        )
    served = {
        group.checksum
        for record in records
        if isinstance(record, NamespaceRecord)
        for group in record.groups or ()
        # A tenure held with nobody served serves no configuration yet.
        if group.model == model and group.checksum is not None and group.members
    }
    if given in served:
        return given
    matches = sorted(checksum for checksum in served if checksum.startswith(given))
    if len(matches) > 1:
        raise UsageError(
            f"--checksum {given} is ambiguous: it begins {' and '.join(matches)}; give more of it"
        )
    return matches[0] if matches else given


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
    min_members: int = 1,
) -> GateReport:
    """Decide whether ``namespace`` serves ``model`` on every live frontend.

    ``previous_namespaces`` limits what counts as an older generation (default: any other
    namespace serving the model). ``invalid`` carries (key, reason) of records the caller could
    not parse, so the report shows them. ``min_members`` is the capacity asked for: a frontend
    counts as serving once it admitted at least that many members of the new generation.
    """
    all_records = routing_records(records)
    live, stale = _live_frontends(live_records(all_records), now, stale_after)
    silent = set(silent_frontends(all_records))
    live |= silent
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
    views = [dataclasses.replace(v, silent=v.frontend in silent) for v in views]

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
    if min_members > 1:
        views = [
            dataclasses.replace(view, serving=view.serving and view.members >= min_members)
            for view in views
        ]
    missing = [view.frontend for view in views if not view.serving]
    if missing:
        what = f"{model} from {namespace}"
        if expected_checksum is not None:
            what += f" with checksum {expected_checksum}"
        if min_members > 1:
            what += f" with at least {min_members} members"
        named = [f"{f} (silent: routing by its last view)" if f in silent else f for f in missing]
        reasons.append(f"not serving {what}: {', '.join(named)}")
    if require_agreement and disagreements:
        # Which frontends serve which configuration: what an operator acts on.
        reasons.extend(
            f"frontends disagree on the incumbent of {item.worker_set}: {item.in_words()}"
            for item in disagreements
        )

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


def disagreements_with(
    records: Iterable[Record], frontend: str, incumbents: Mapping[tuple[str, str], str]
) -> tuple[Disagreement, ...]:
    """Say where other frontends serve another configuration than ``frontend`` does.

    ``incumbents`` is what ``frontend`` serves, per group (model, worker_set); the records are
    every frontend's (this one's own, which may be older, are not read). One
    :class:`Disagreement` per group that another frontend serves with another checksum, naming
    this frontend beside the others.
    """
    seen: dict[tuple[str, str], dict[str, set[str]]] = {}
    for record in live_records(records):
        if not isinstance(record, NamespaceRecord) or record.frontend == frontend:
            continue
        for group in record.groups or ():
            key = (group.model, group.worker_set)
            if key in incumbents and group.checksum is not None and group.members:
                seen.setdefault(key, {}).setdefault(group.checksum, set()).add(record.frontend)
    found = []
    for key, served in sorted(seen.items()):
        own = incumbents[key]
        if set(served) == {own}:
            continue
        served.setdefault(own, set()).add(frontend)
        found.append(
            Disagreement(
                worker_set=key[1],
                incumbents=tuple(
                    (checksum, tuple(sorted(fronts))) for checksum, fronts in sorted(served.items())
                ),
            )
        )
    return tuple(found)


def _view(
    frontend: str,
    records: Sequence[NamespaceRecord],
    *,
    model: str,
    namespace: str,
    expected_checksum: str | None,
    previous_namespaces: Sequence[str] | None,
    incumbents: dict[str, dict[str, set[str]]],
) -> FrontendServing:
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
    return FrontendServing(
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
            view.frontend + (" (silent)" if view.silent else ""),
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
    # One line per entry, whatever a record names (a frontend id, a namespace).
    return "\n".join(wire_text(line, TABLE_LINE_LIMIT) for line in lines) + "\n"
