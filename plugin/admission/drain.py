"""Drains and the handover: workers an operator takes out of routing, and the tenure they leave.

Theory of operation
-------------------

*Drains.* A drain (``DrainSet``) is an operator's word that a worker is about to stop: for
admission its registrations have left (an operator-declared departure). They are set aside,
not forgotten (``WorkerDrained``): the cohort loses them as it would lose departed workers,
a rejected cohort simply shrinks, and a registration of a drained worker that arrives later
is set aside at once, never admitted. The worker's real removal forgets them. Lifting the
drain (``DrainLifted``) places them again exactly as a returning member is placed: into the
cohort of their checksum if it still has members, else as a new cohort at the end of the order.
A drain never holds a tenure; only an outage does (``hold.py``), and a drained member of a held
tenure is no longer served on its last known record. :class:`Drains` keeps the drains in force
and the registrations they set aside; the core decides what each change does to a group.

*Handover.* A drained worker still serves; a departed one does not. So when a drain takes the
last member of a committed incumbent and another cohort waits, the successor's tenure starts
as for any succession (fresh receiver, fresh generation, its build queued), but the old
tenure's committed build and receiver stay in place, still serving the drained members, until
the successor is committed: its ``CommitGroup`` names the generation it takes over from
(``handover_from``), and the old tenure's ``WithdrawGroup``, ``RetireReceiver`` and
``HandoverEnded`` follow in the same step. The frontend therefore knows the successor before
the drained workers go, as it does on the workers' own store, and never routes to nothing in
between. The handover also ends when the drained workers really leave, when one of them is
given back (it rejoins behind the successor), or when the successor's own tenure ends. With
no cohort waiting, or with an incumbent not yet committed, a drain ends the tenure at once,
as a departure does.

A :class:`Handover` moves only through :data:`HANDOVER_TRANSITIONS`::

    serving   the drained tenure's build and receiver serve its drained members
    ended     withdrawn and retired; the group drops it

    MEMBER_LEFT   one drained member really left and others still serve (it stays serving)
    COMMITTED     the successor is committed: it serves now
    DEPARTED      the last drained member really left
    UNDRAINED     a drained member was given back: it rejoins behind the successor
    SUPERSEDED    the successor's own tenure ended

An ending event's value is the reason ``HandoverEnded`` carries. An event the table does not
list is refused (:class:`~workerset_admission.errors.TransitionRefused`) and the handover stays
exactly as it was: a handover ends once.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from typing import Any, Literal

from workerset_admission.errors import TransitionRefused
from workerset_admission.identity import Drain, GroupKey, Registration

__all__ = [
    "HANDOVER_TRANSITIONS",
    "Drains",
    "Handover",
    "HandoverEvent",
    "HandoverPhase",
]

Worker = tuple[str, int]
"""A drained worker: (namespace, instance id)."""


class Drains:
    """The drains in force, by worker, and the base registrations they set aside, by key."""

    __slots__ = ("drained", "in_force")

    def __init__(self) -> None:
        self.in_force: dict[Worker, Drain] = {}
        # Set aside: tracked, in no cohort.
        self.drained: dict[str, Registration] = {}

    def drain_of(self, reg: Registration) -> Drain:
        """Return the drain that set ``reg`` aside."""
        return self.in_force[(reg.endpoint.namespace, reg.instance_id)]

    def put(self, drain: Drain) -> Literal["same", "changed", "new"]:
        """Record a drain: the same one again, another word on a drained worker, or a new one."""
        worker = drain.worker
        old = self.in_force.get(worker)
        if old == drain:
            return "same"  # a re-listing or a duplicate changes nothing
        self.in_force[worker] = drain
        return "new" if old is None else "changed"

    def lift(self, worker: Worker) -> list[Registration] | None:
        """End a drain; return the registrations it set aside, by key (``None``: not drained)."""
        if self.in_force.pop(worker, None) is None:
            return None
        namespace, iid = worker
        returning = [
            r
            for r in self.drained.values()
            if r.instance_id == iid and r.endpoint.namespace == namespace
        ]
        return sorted(returning, key=_by_key)

    def in_group(self, group: GroupKey) -> list[tuple[Registration, Drain]]:
        """Return the registrations of ``group`` set aside, each with its drain."""
        if not self.drained:
            return []
        return [(reg, self.drain_of(reg)) for reg in self.drained.values() if reg.group == group]

    def workers(self) -> Iterator[Drain]:
        """Every drain in force, by namespace then instance id."""
        return (self.in_force[w] for w in sorted(self.in_force))


def _by_key(reg: Registration) -> str:
    return reg.key


class HandoverPhase(str, enum.Enum):
    """Whether a drained tenure still serves its drained members."""

    SERVING = "serving"
    ENDED = "ended"


class HandoverEvent(str, enum.Enum):
    """Something that happened to a handover; an ending event's value is the reason reported."""

    MEMBER_LEFT = "member_left"
    COMMITTED = "committed"
    DEPARTED = "departed"
    UNDRAINED = "undrained"
    SUPERSEDED = "superseded"


_S = HandoverPhase
_E = HandoverEvent

# (phase, event) -> next phase. Anything absent is refused.
HANDOVER_TRANSITIONS: Mapping[tuple[HandoverPhase, HandoverEvent], HandoverPhase] = {
    (_S.SERVING, _E.MEMBER_LEFT): _S.SERVING,
    (_S.SERVING, _E.COMMITTED): _S.ENDED,
    (_S.SERVING, _E.DEPARTED): _S.ENDED,
    (_S.SERVING, _E.UNDRAINED): _S.ENDED,
    (_S.SERVING, _E.SUPERSEDED): _S.ENDED,
}

EndReason = Literal["committed", "departed", "undrained", "superseded"]


class Handover:
    """A drained tenure still serving its drained members until its successor is committed."""

    __slots__ = ("card", "checksum", "generation", "members", "phase", "receiver")

    def __init__(
        self, checksum: str, receiver: int, generation: int, members: dict[int, str], card: Any
    ) -> None:
        self.checksum = checksum
        self.receiver = receiver
        # The committed build it keeps serving, the drained members it serves (id to key), and
        # the card it was committed with.
        self.generation = generation
        self.members = members
        self.card = card
        self.phase = HandoverPhase.SERVING

    def process(self, event: HandoverEvent) -> HandoverPhase:
        """Apply ``event`` and return the new phase, or raise and leave the handover untouched."""
        try:
            phase = HANDOVER_TRANSITIONS[(self.phase, event)]
        except KeyError:
            raise TransitionRefused(
                f"can't handle handover event {event.value!r} in phase {self.phase.value!r}"
            ) from None
        self.phase = phase
        return phase

    def serves(self, iid: int, key: str) -> bool:
        """Whether the handover serves drained member ``iid`` under ``key``."""
        return self.members.get(iid) == key

    def member_left(self, iid: int) -> bool:
        """Take off a drained member that really left; return whether others still serve."""
        del self.members[iid]
        if not self.members:
            return False  # the last one: the caller ends the handover (``DEPARTED``)
        self.process(HandoverEvent.MEMBER_LEFT)
        return True

    def end(self, event: HandoverEvent) -> EndReason:
        """End the handover; return the reason ``HandoverEnded`` reports."""
        reason = _REASONS.get(event)
        if reason is None:
            raise TransitionRefused(f"handover event {event.value!r} ends nothing")
        self.process(event)
        return reason


_REASONS: Mapping[HandoverEvent, EndReason] = {
    _E.COMMITTED: "committed",
    _E.DEPARTED: "departed",
    _E.UNDRAINED: "undrained",
    _E.SUPERSEDED: "superseded",
}
