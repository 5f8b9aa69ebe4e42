"""A group's records: its cohorts in first-observation order, its tenure, its status, any handover.

Only the core (``core.py``) changes these records. A group's tenure is one record
(:class:`Tenure`) which a succession replaces whole, so nothing of an ended tenure can leak
into the next; the hold (``hold.py``) hangs on the tenure and goes with it, while a handover
(``drain.py``) hangs on the group, because it outlives the tenure that handed over. The status
(``status.py``) is the group's and changes only through its table.
"""

from __future__ import annotations

from collections.abc import Iterable
from operator import attrgetter
from typing import Any

from workerset_admission.admission.admitted import AdmittedLog
from workerset_admission.admission.drain import Handover
from workerset_admission.admission.effects import LoraWorker
from workerset_admission.admission.hold import Hold
from workerset_admission.admission.status import StatusMachine
from workerset_admission.identity import AttemptId, GroupKey, Registration

__all__ = ["Cohort", "Group", "Tenure", "representative_of"]

_by_key = attrgetter("key")


class Cohort(AdmittedLog):
    """The registrations sharing one checksum in a group; as the incumbent, its admitted ids.

    While the cohort is the incumbent, every change of membership is appended to its log (see
    ``AdmittedLog``); changes before that are not, so a tenure start rebases it.
    """

    __slots__ = ("checksum", "members", "seq")

    def __init__(self, checksum: str, seq: int) -> None:
        super().__init__()
        self.checksum = checksum
        # The group's count of cohorts made when this one was: its place in the order.
        self.seq = seq
        # Keyed by instance id: a group has one endpoint and a base card per instance, so within
        # a group an instance id names exactly one registration key. Insertion-ordered;
        # membership, not order, matters inside a cohort. The keys are the cohort's ids, so a
        # rebase is one C-level copy of them.
        self.members: dict[int, Registration] = {}


def representative_of(cohort: Cohort) -> Registration:
    """Return the member whose card a tenure serves."""
    # Dynamo keeps members in a BTreeSet and takes the first: the smallest key.
    return min(cohort.members.values(), key=_by_key)


class Tenure:
    """One tenure's state: what a succession ends, all at once, by putting a fresh one in place.

    A group with no incumbent has an idle tenure (``checksum`` None, everything empty).
    """

    __slots__ = (
        "attempt",
        "card",
        "checksum",
        "committed_generation",
        "deadline",
        "hold",
        "in_flight",
        "lora",
        "outage_gone",
        "outage_lora",
        "parked",
        "receiver",
        "reported",
        "representative",
    )

    def __init__(self) -> None:
        # The incumbent's checksum and receiver; the generation of its committed build and of
        # the build in flight; consecutive failed attempts and the retry's deadline.
        self.checksum: str | None = None
        self.receiver: int | None = None
        self.committed_generation: int | None = None
        self.in_flight: int | None = None
        self.attempt = 0
        self.deadline: float | None = None
        # The member whose card the tenure serves (the smallest key), and that card.
        self.representative: str | None = None
        self.card: Any = None
        # The checksums reported as rejected against this incumbent.
        self.reported: set[str] = set()
        # The last projection announced; None forces the next flush to announce it again.
        self.lora: tuple[LoraWorker, ...] | None = ()
        # Set while the tenure is held after an outage, or its members are still served on
        # last known good (``hold.py``).
        self.hold: Hold | None = None
        # The clock value of the last reconnect whose removals took incumbent members away,
        # and those members: a hold that reconnect causes serves them on last known good.
        self.outage_gone: tuple[float, dict[int, str]] | None = None
        # The same reconnect's view of those members' LoRA adapters, as projected before its
        # removals took any of them (an adapter's record may go before its base card's).
        self.outage_lora: tuple[float, dict[int, LoraWorker]] | None = None
        # Incumbent members drained since the last publication (id to key): the receiver
        # still lists them, so a handover that begins now keeps serving exactly these.
        self.parked: dict[int, str] = {}


class Group:
    """One group's state; only ``AdmissionCore`` changes it."""

    __slots__ = (
        "cohorts",
        "dirty",
        "generation",
        "handover",
        "key",
        "lora_dirty",
        "seq",
        "status",
        "tenure",
    )

    def __init__(self, key: GroupKey) -> None:
        self.key = key
        self.cohorts: dict[str, Cohort] = {}
        self.status = StatusMachine()
        self.tenure = Tenure()
        # The latest build generation: it outlives its tenure (status shows it).
        self.generation: int | None = None
        # Admissions or the projection to publish at the end of the call.
        self.dirty = False
        self.lora_dirty = False
        # How many cohorts the group has made: each new one is numbered with it.
        self.seq = 0
        # Set while a drained tenure hands over to its successor (``drain.py``); it outlives
        # the tenure that handed over.
        self.handover: Handover | None = None

    def attempt_in_flight(self) -> AttemptId | None:
        """Return the build attempt in flight (whose result alone is applied), or None."""
        if self.tenure.checksum is None or self.tenure.in_flight is None:
            return None
        return AttemptId(self.key, self.tenure.checksum, self.tenure.in_flight)

    def committed_attempt(self) -> AttemptId | None:
        """Return the committed build's attempt (a commit failure must name it), or None."""
        if self.tenure.checksum is None or self.tenure.committed_generation is None:
            return None
        return AttemptId(self.key, self.tenure.checksum, self.tenure.committed_generation)

    def served_attempt(self) -> AttemptId | None:
        """Return the attempt whose hop binding serves now, or None.

        That is the committed incumbent's, or a drained tenure's that hands over to a
        successor not committed yet.
        """
        if self.status.state.committed:
            return self.committed_attempt()
        handover = self.handover
        if handover is not None:
            return AttemptId(self.key, handover.checksum, handover.generation)
        return None

    def serves(self) -> bool:
        """Return whether :meth:`served_attempt` names an attempt, without making one."""
        return self.status.state.committed or self.handover is not None

    def served_ids(self, cohort: Cohort) -> Iterable[int]:
        """Return the incumbent's admitted ids: its members, and any on last known good."""
        hold = self.tenure.hold
        if hold is None or not hold.last_known:
            return cohort.members
        return cohort.members.keys() | hold.last_known.keys()
