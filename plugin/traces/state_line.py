"""A live frontend's decision state, as the first line of a replay trace.

A trace that starts in the middle of a rollout cannot be replayed to the live decision from
its listing alone: the listing is one point in time with no order, while the frontend chose
its incumbents from what it observed earlier. ``record`` therefore asks one live frontend for
its status and writes, before the listing, a ``state`` line holding each group's cohorts in
that frontend's order::

    {"kind": "state", "frontend": "<id>", "groups": [
        {"group": "<group id>", "cohorts": ["<incumbent checksum>", "<next>", ...]}, ...]}

``replay`` observes the listing that follows in that order (see
:mod:`workerset_admission.admission.ordering`), so the same incumbents are chosen and
``explain`` says what the live frontend decided. The line is optional: a trace without it
replays as before.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from workerset_admission.admission.ordering import GroupId
from workerset_admission.errors import UsageError
from workerset_admission.identity import compact_json

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


@dataclass(frozen=True, slots=True)
class DecisionState:
    """Which frontend, and per group its cohorts' checksums in that frontend's order."""

    frontend: str
    cohorts: Mapping[GroupId, tuple[str, ...]]

    @classmethod
    def from_status(cls, frontend: str, status: Mapping[str, Any]) -> DecisionState:
        """Read a frontend's ``status`` answer (the full or the brief form)."""
        groups = status.get("groups")
        if not isinstance(groups, list):
            raise DecisionStateError("the status answer lists no groups")
        cohorts: dict[GroupId, tuple[str, ...]] = {}
        for group in groups:
            # ``group_id``; frontends of earlier releases answer with ``group``.
            group_id = (
                group.get("group_id", group.get("group")) if isinstance(group, Mapping) else None
            )
            if not isinstance(group_id, str):
                raise DecisionStateError("a status group without its id")
            order = [c.get("checksum") for c in group.get("cohorts") or () if isinstance(c, dict)]
            checksums = tuple(c for c in order if isinstance(c, str))
            if checksums and len(checksums) == len(order):
                cohorts[_group_id(group_id)] = checksums
        return cls(frontend, cohorts)

    @classmethod
    def from_line(cls, line: Mapping[str, Any]) -> DecisionState:
        """Read a trace's ``state`` line."""
        frontend = line.get("frontend")
        groups = line.get("groups")
        if not isinstance(frontend, str) or not isinstance(groups, list):
            raise DecisionStateError("a state line needs a frontend and a list of groups")
        cohorts: dict[GroupId, tuple[str, ...]] = {}
        for group in groups:
            order = group.get("cohorts") if isinstance(group, Mapping) else None
            if (
                not isinstance(group, Mapping)
                or not isinstance(group.get("group"), str)
                or not isinstance(order, list)
                or not all(isinstance(c, str) for c in order)
            ):
                raise DecisionStateError("each state group needs a group id and cohort checksums")
            cohorts[_group_id(group["group"])] = tuple(order)
        return cls(frontend, cohorts)

    def to_line(self) -> dict[str, Any]:
        """Write the ``state`` line; groups sorted, so equal states give equal bytes."""
        groups: Sequence[dict[str, Any]] = [
            {
                "group": compact_json(list(group)),
                "cohorts": list(order),
            }
            for group, order in sorted(self.cohorts.items())
        ]
        return {"kind": "state", "frontend": self.frontend, "groups": groups}
