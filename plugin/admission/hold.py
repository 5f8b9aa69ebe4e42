"""The hold and outage window: when a removal is an outage's doing, and a held tenure's phases.

Theory of operation
-------------------

*Holding a tenure across an outage.* A listing that follows a lost connection
(``Listing(reconnect=True)``), and an expiry reported soon after it, may miss the incumbent's
workers only because their heartbeats could not reach the store while it was away. Ingestion
reports an expiry with its time (``WorkerRemoved.expired_at``) and nothing more; the core
alone judges it the outage's when it comes within ``tenure_hold`` of the last reconnect
listing (:func:`expiry_outage`), and then counts from that listing. When such a removal empties
the incumbent cohort, the tenure is held, never changed: the empty cohort stays in front with
its receiver, generation and committed build until the reconnect plus ``tenure_hold``. The hold
delays the decision and nothing else. Only a member the cohort had when the hold began (the
same instance key) ends it (``TenureHoldEnded("rejoined")``), and the tenure goes on; a new
instance of the incumbent's checksum is tracked aside (:meth:`Hold.arrive`), not admitted, and
joins the cohort with a returning member. When a ``Tick`` reaches the deadline with no pre-hold
member back, the hold ends (``"expired"``) and the core does what it would have done with no
hold: the cohort is gone, the new instances make a cohort in the place the first of them would
have taken (cohorts carry their creation number, ``seq``), and the oldest remaining cohort
succeeds. Meanwhile the hold serves: the members the outage's removals took stay admitted on
their last known records for one ``registration_ttl`` (``PublishAdmissions.last_known`` names
them, so a hop routes to them without their instance records), with the LoRA adapters they
carried before the outage's removals took any (their adapter records leave with the rest, in
either order: the projection keeps each one's last known adapters beside its base card), then
those not back are withdrawn while the reservation lasts. A hold builds nothing: a queued
build or a due retry waits, and the rejoin rebuilds at once. Live removals and other listings
never hold: only an outage can make a present worker look gone.

*Starting during an outage.* A frontend that starts (or restarts) while the store is away
has lived through the outage as much as its peers have, only without state. Ingestion reports
its first listing as such (``Listing(outage_start=True)``), and the core treats it as a
reconnect listing: expiries within ``tenure_hold`` of it are the outage's, so an incumbent the
listing still holds is held when they empty it, as its peers hold theirs. One that starts
just after the store came back saw no outage itself, but a peer that resynced after losing its
connection says when (``Listing.peer_outage_at``): a first listing within ``tenure_hold`` of
that resync is one of that outage, and its holds count from the peer's resync, so they end
with the peer's (:func:`listing_outage`). A cohort the listing already lacks (its records ran
out while the store was away) cannot be observed at all; so after any outage, a group this
frontend holds nothing of, whose live peers serve a checksum the listing lacks
(``Listing.peer_tenures``), is reserved for that checksum at once, held until the outage's
reconnect plus ``tenure_hold``, and only the members the peers serve end the hold. One that
starts, or first reaches the store, after the store came back but before any peer has resynced
(the peers reconnect a moment later) learns of the outage from nobody, and the incumbent's
records the outage left to run out expire in front of it as if their workers had died, while
the peers hold them. So within ``tenure_hold`` of a first listing that no outage explains, an
expiry of a record of the configuration the live peers served at that listing
(``Listing.peer_tenures``) is judged an outage's too, counted from the first listing
(:func:`start_outage`): when it empties the incumbent, the tenure is held as the peers hold
theirs, and ends as theirs does (a returning member, or the deadline). With no live peer there
is nobody to agree with, and nothing is held. These rules only delay a succession the outage
may have faked, as the hold always does (a worker that really died is succeeded at most
``tenure_hold`` later than without them, and only by a frontend that had just started); with
them a frontend restarted during an outage ends on the incumbent its peers keep.

*Recorded tenures.* A replay of a recording that began mid-rollout starts from what the
recorded frontend decided: ``TenureRecorded``, before anything else of its group. A tenure
that was not held lends its receiver and generation to the tenure the listing starts for that
checksum; a held one is put in place at once, exactly as a live hold leaves a group (the
empty cohort in front, its members served on last known good, the deadline scheduled), so
everything after it runs through the same code as live.

*Phases.* A :class:`Hold` is two things over one tenure: the reservation (``held``: from the
emptying removal until a pre-hold member rejoins or the deadline passes) and the last known
good window (members served on their last known records until one registration TTL is over,
they come back, or they are drained). The second may outlast the first, so a hold has four
phases, and only :data:`HOLD_TRANSITIONS` moves it between them::

    held          reserved; members of the outage still served on their last known records
    held_bare     reserved; nobody served on a last known record (their TTL is over, they are
                  drained, or the outage took none)
    last_known    the reservation is over (a member rejoined) but members not back are still
                  served on their last known records
    over          nothing left: the group drops the hold

    LAST_KNOWN_OVER  the last member served on a last known record is back, drained, or timed out
    REJOIN           a member the incumbent had when the hold began is back
    EXPIRE           the deadline passed with no such member back: the tenure ends

An event the table does not list for the phase is refused
(:class:`~workerset_admission.errors.TransitionRefused`) and the hold stays exactly as it was.
A hold is beside the group status, never in it (``status.py``): a ready group stays ready while
held, so no transition of the status table changes.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from workerset_admission.admission.effects import LoraWorker
from workerset_admission.errors import TransitionRefused
from workerset_admission.identity import Registration

__all__ = [
    "HOLD_TRANSITIONS",
    "Hold",
    "HoldEvent",
    "HoldPhase",
    "expiry_outage",
    "listing_outage",
    "start_outage",
]


class HoldPhase(str, enum.Enum):
    """Where a hold is: reserved or not, and serving last known records or not."""

    HELD = "held"
    HELD_BARE = "held_bare"
    LAST_KNOWN = "last_known"
    OVER = "over"

    @property
    def held(self) -> bool:
        """Whether the tenure is reserved in this phase (the incumbent cohort is empty)."""
        return self is HoldPhase.HELD or self is HoldPhase.HELD_BARE


class HoldEvent(str, enum.Enum):
    """Something that happened to a hold and may move its phase."""

    LAST_KNOWN_OVER = "last_known_over"
    REJOIN = "rejoin"
    EXPIRE = "expire"


_P = HoldPhase
_E = HoldEvent

# (phase, event) -> next phase. Anything absent is refused.
HOLD_TRANSITIONS: Mapping[tuple[HoldPhase, HoldEvent], HoldPhase] = {
    (_P.HELD, _E.LAST_KNOWN_OVER): _P.HELD_BARE,
    (_P.HELD, _E.REJOIN): _P.LAST_KNOWN,
    (_P.HELD, _E.EXPIRE): _P.OVER,
    (_P.HELD_BARE, _E.REJOIN): _P.OVER,
    (_P.HELD_BARE, _E.EXPIRE): _P.OVER,
    (_P.LAST_KNOWN, _E.LAST_KNOWN_OVER): _P.OVER,
}


class Hold:
    """A tenure held after an outage, and the members it serves on last known good.

    Its phase changes only through :data:`HOLD_TRANSITIONS` (:meth:`process`); the record stays
    on the group's tenure until the phase is ``over``.
    """

    __slots__ = (
        "arrival_seq",
        "arrivals",
        "last_known",
        "last_known_lora",
        "last_known_until",
        "members",
        "phase",
        "since",
        "until",
    )

    def __init__(
        self,
        since: float,
        until: float,
        members: dict[int, str],
        last_known: dict[int, str],
        last_known_until: float,
        last_known_lora: Mapping[int, LoraWorker] | None = None,
    ) -> None:
        # The clock value of the reconnect the hold counts from, and its deadline.
        self.since = since
        self.until = until
        # The members the incumbent had when the hold began (instance id to key): only one of
        # these ends it.
        self.members = members
        # Those of them not back yet, still admitted on their last known records.
        self.last_known = last_known
        self.last_known_until = last_known_until
        # Their LoRA adapters as last projected before the outage took any: served with them.
        self.last_known_lora = {
            iid: worker for iid, worker in (last_known_lora or {}).items() if iid in last_known
        }
        self.phase = HoldPhase.HELD if last_known else HoldPhase.HELD_BARE
        # New instances of the incumbent's checksum registered during the hold: tracked, not
        # admitted; they join the incumbent on a rejoin, or the end of the order on expiry.
        self.arrivals: dict[int, Registration] = {}
        self.arrival_seq: int | None = None

    @property
    def held(self) -> bool:
        """Whether the tenure is still reserved (no pre-hold member back, deadline not passed)."""
        return self.phase.held

    @property
    def over(self) -> bool:
        """Whether nothing is left of the hold: the group drops it."""
        return self.phase is HoldPhase.OVER

    def process(self, event: HoldEvent) -> HoldPhase:
        """Apply ``event`` and return the new phase, or raise and leave the hold untouched."""
        try:
            phase = HOLD_TRANSITIONS[(self.phase, event)]
        except KeyError:
            raise TransitionRefused(
                f"can't handle hold event {event.value!r} in phase {self.phase.value!r}"
            ) from None
        self.phase = phase
        return phase

    def arrive(self, reg: Registration, seq: int) -> None:
        """Track a new instance of the held checksum; ``seq`` numbers the cohort it would make."""
        if not self.arrivals:
            self.arrival_seq = seq
        self.arrivals[reg.instance_id] = reg

    def drop_arrival(self, reg: Registration) -> None:
        """Take an instance that arrived during the hold off its list (it left, or drained)."""
        del self.arrivals[reg.instance_id]
        if not self.arrivals:
            self.arrival_seq = None  # it would have emptied and left: a return is new again

    def take_arrivals(self) -> dict[int, Registration]:
        """Hand over the instances that arrived (they join the incumbent on a rejoin)."""
        arrivals = self.arrivals
        self.arrivals = {}
        self.arrival_seq = None
        return arrivals

    def back(self, iid: int) -> None:
        """Take a member served on its last known record off that list: it has a record again."""
        self.last_known_lora.pop(iid, None)
        if self.last_known.pop(iid, None) is not None and not self.last_known:
            self.process(HoldEvent.LAST_KNOWN_OVER)

    def forget(self, iid: int) -> bool:
        """Drop a drained member; return whether it was served on its last known record."""
        self.members.pop(iid, None)
        self.last_known_lora.pop(iid, None)
        if self.last_known.pop(iid, None) is None:
            return False
        if not self.last_known:
            self.process(HoldEvent.LAST_KNOWN_OVER)
        return True

    def last_known_over(self) -> dict[int, str]:
        """One registration TTL is over: stop serving last known records; return whose."""
        ended = self.last_known
        self.last_known = {}
        self.last_known_lora = {}
        self.process(HoldEvent.LAST_KNOWN_OVER)
        return ended


def expiry_outage(at: float, reconnect: float | None, tenure_hold: float) -> float | None:
    """Return the reconnect an expiry at ``at`` is judged to follow, or ``None`` (a live one).

    An expiry within the tenure hold of the last listing that followed a lost connection is
    most likely the outage's doing (the worker could not refresh its record while the store was
    away), so it counts from that reconnect, as the listing's own removals do.
    """
    if reconnect is not None and at - reconnect < tenure_hold:
        return reconnect
    return None


def start_outage(
    at: float, listed_at: float, tenure_hold: float, peers_serve: str | None, checksum: str
) -> float | None:
    """Return the first listing an expiry at ``at`` is judged to follow, or ``None`` (a live one).

    Within ``tenure_hold`` of a frontend's first listing, an expiry of a record of the
    configuration its live peers served then (``peers_serve``) may be an outage's doing that
    the peers have not resynced from yet: it counts from the first listing, as if that listing
    had followed the outage (see "Starting during an outage").
    """
    if peers_serve is not None and peers_serve == checksum and at - listed_at < tenure_hold:
        return listed_at
    return None


def listing_outage(
    now: float,
    tenure_hold: float,
    *,
    reconnect: bool,
    outage_start: bool,
    peer_outage_at: float | None,
) -> float | None:
    """Return the reconnect a listing follows (the clock value holds count from), if any.

    A reconnect listing follows this frontend's own. A first listing follows a peer's resync
    after an outage when that came within ``tenure_hold`` (the workers' records could not be
    refreshed either), and counts from it, so its holds end with the peers'; else its own start
    during an outage, now.
    """
    if reconnect:
        return now
    if peer_outage_at is not None and min(peer_outage_at, now) > now - tenure_hold:
        return min(peer_outage_at, now)
    return now if outage_start else None
