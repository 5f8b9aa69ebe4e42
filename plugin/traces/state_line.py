"""A live frontend's decision state, as the line a replay trace starts from.

A trace that starts in the middle of a rollout cannot be replayed to the live decision from
its listing alone: the listing is one point in time with no order, while the frontend chose
its incumbents from what it observed earlier, and a tenure it holds through an outage has no
members in the listing at all. ``record`` therefore asks one live frontend for its status and
writes, before the listing, a ``state`` line with what that frontend decided, per group::

    {"kind": "state", "t": 0.0, "frontend": "<id>", "groups": [
        {"group": "<group id>", "cohorts": ["<incumbent checksum>", "<next>", ...],
         "incumbent": "<checksum>", "receiver": 3, "generation": 7, "committed_generation": 7,
         "held_until": 12.5, "hold_members": [1, 3], "last_known": [3],
         "last_known_until": 4.0}, ...]}

Only ``group`` and ``cohorts`` are required (the first form of the line had nothing else).
Times are seconds from the trace's start, on the clock of its ``t`` values; the hold fields
are there only for a group held when the recording began.

``replay`` observes the listing that follows in the recorded cohort order (see
:mod:`workerset_admission.admission.ordering`) and gives the core each recorded tenure
(:class:`~workerset_admission.admission.inputs.TenureRecorded`): the incumbent keeps its
receiver and generation, and a held one stays held until its deadline, so ``explain`` says what
the live frontend decided. The line is optional: a trace without it replays from its listing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from workerset_admission.admission.inputs import TenureRecorded
from workerset_admission.admission.ordering import GroupId
from workerset_admission.errors import UsageError
from workerset_admission.identity import GroupKey, compact_json

__all__ = ["DecisionState", "DecisionStateError"]


class DecisionStateError(UsageError):
    """A status answer or a ``state`` line that does not describe a decision state."""


def _group_id(raw: str) -> GroupId:
    try:
        model, worker_set = json.loads(raw)
    except (ValueError, TypeError):
        raise DecisionStateError(f"not a group id: {raw!r}") from None
    if not isinstance(model, str) or not isinstance(worker_set, str):
        raise DecisionStateError(f"not a group id: {raw!r}")
    return (model, worker_set)


def _shifted(tenure: TenureRecorded, by: float) -> TenureRecorded:
    """Return ``tenure`` with its times ``by`` seconds earlier."""
    held, served = tenure.held_until, tenure.last_known_until
    return replace(
        tenure,
        held_until=None if held is None else held - by,
        last_known_until=None if served is None else served - by,
    )


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _time(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _ids(value: object) -> tuple[int, ...] | None:
    if not isinstance(value, list) or any(_int(v) is None for v in value):
        return None
    return tuple(sorted(value))


def _tenure(
    key: GroupId, group: Mapping[str, Any], order: tuple[str, ...], where: str
) -> TenureRecorded | None:
    """Read a group's tenure fields; ``None`` when it names no incumbent (the first form)."""
    incumbent = group.get("incumbent")
    if incumbent is None:
        return None
    receiver, generation = _int(group.get("receiver")), _int(group.get("generation"))
    if not isinstance(incumbent, str) or receiver is None or generation is None:
        raise DecisionStateError(f"{where}: an incumbent needs its receiver and generation")
    if not order or order[0] != incumbent:
        raise DecisionStateError(f"{where}: the incumbent is not the first cohort")
    committed = group.get("committed_generation")
    if committed is not None and _int(committed) is None:
        raise DecisionStateError(f"{where}: a committed generation is a whole number")
    held_until = group.get("held_until")
    if held_until is None:
        return TenureRecorded(GroupKey(*key), incumbent, receiver, generation, _int(committed))
    members, last_known = _ids(group.get("hold_members", [])), _ids(group.get("last_known", []))
    last_known_until = group.get("last_known_until")
    if (
        _time(held_until) is None
        or members is None
        or last_known is None
        or (last_known_until is not None and _time(last_known_until) is None)
    ):
        raise DecisionStateError(f"{where}: a hold needs its deadline and instance id lists")
    return TenureRecorded(
        GroupKey(*key),
        incumbent,
        receiver,
        generation,
        _int(committed),
        _time(held_until),
        members,
        last_known,
        _time(last_known_until),
    )


@dataclass(frozen=True, slots=True)
class DecisionState:
    """Which frontend, per group its cohorts' checksums in its order, and its tenures."""

    frontend: str
    cohorts: Mapping[GroupId, tuple[str, ...]]
    tenures: Mapping[GroupId, TenureRecorded]

    @classmethod
    def from_status(cls, frontend: str, status: Mapping[str, Any]) -> DecisionState:
        """Read a frontend's ``status`` answer (the full or the brief form; Unix times).

        The brief form gives counts where the full one lists instance ids: a held tenure read
        from it keeps its deadline but names no members, so only the deadline ends it.
        """
        groups = status.get("groups")
        if not isinstance(groups, list):
            raise DecisionStateError("the status answer lists no groups")
        cohorts: dict[GroupId, tuple[str, ...]] = {}
        tenures: dict[GroupId, TenureRecorded] = {}
        for group in groups:
            # ``group_id``; frontends of earlier releases answer with ``group``.
            group_id = (
                group.get("group_id", group.get("group")) if isinstance(group, Mapping) else None
            )
            if not isinstance(group_id, str):
                raise DecisionStateError("a status group without its id")
            order = [c.get("checksum") for c in group.get("cohorts") or () if isinstance(c, dict)]
            checksums = tuple(c for c in order if isinstance(c, str))
            if not checksums or len(checksums) != len(order):
                continue
            key = _group_id(group_id)
            cohorts[key] = checksums
            fields = dict(group)
            for name in ("hold_members", "last_known"):
                if not isinstance(fields.get(name), list):
                    fields[name] = []
            tenure = _tenure(key, fields, checksums, f"the status of {group_id}")
            if tenure is not None:
                tenures[key] = tenure
        return cls(frontend, cohorts, tenures)

    @classmethod
    def from_line(cls, line: Mapping[str, Any]) -> DecisionState:
        """Read a trace's ``state`` line (times: seconds from the trace's start)."""
        frontend = line.get("frontend")
        groups = line.get("groups")
        if not isinstance(frontend, str) or not isinstance(groups, list):
            raise DecisionStateError("a state line needs a frontend and a list of groups")
        cohorts: dict[GroupId, tuple[str, ...]] = {}
        tenures: dict[GroupId, TenureRecorded] = {}
        for group in groups:
            order = group.get("cohorts") if isinstance(group, Mapping) else None
            if (
                not isinstance(group, Mapping)
                or not isinstance(group.get("group"), str)
                or not isinstance(order, list)
                or not all(isinstance(c, str) for c in order)
            ):
                raise DecisionStateError("each state group needs a group id and cohort checksums")
            key = _group_id(group["group"])
            cohorts[key] = tuple(order)
            tenure = _tenure(key, group, tuple(order), f"state group {group['group']}")
            if tenure is not None:
                tenures[key] = tenure
        return cls(frontend, cohorts, tenures)

    def to_line(self, origin: float = 0.0) -> dict[str, Any]:
        """Write the ``state`` line, times counted from ``origin``; groups sorted.

        ``origin`` is the trace's start on the clock the state's times are on: the header's
        wall time for a state read from a status, 0 for one read from a line.
        """
        groups: list[dict[str, Any]] = []
        for group, order in sorted(self.cohorts.items()):
            line: dict[str, Any] = {"group": compact_json(list(group)), "cohorts": list(order)}
            tenure = self.tenures.get(group)
            if tenure is not None:
                tenure = _shifted(tenure, origin)
                line.update(
                    incumbent=tenure.mdc_checksum,
                    receiver=tenure.receiver,
                    generation=tenure.generation,
                    committed_generation=tenure.committed_generation,
                )
                if tenure.held_until is not None:
                    line.update(
                        held_until=round(tenure.held_until, 6),
                        hold_members=list(tenure.hold_members),
                        last_known=list(tenure.last_known),
                        last_known_until=None
                        if tenure.last_known_until is None
                        else round(tenure.last_known_until, 6),
                    )
            groups.append(line)
        return {"kind": "state", "frontend": self.frontend, "groups": groups}

    def inputs(self) -> list[TenureRecorded]:
        """Return the core inputs that take this state's tenures up (times as in the state)."""
        return [tenure for _group, tenure in sorted(self.tenures.items())]
