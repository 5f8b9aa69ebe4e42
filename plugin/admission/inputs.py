"""Inputs to the admission core: what happened, as frozen values.

Discovery inputs carry :class:`~workerset_admission.identity.Registration` values that the card
boundary has already decoded, validated and normalized; invalid records never get this far.
Build and commit results carry the attempt they answer (``group``, ``mdc_checksum``,
``generation``; ``attempt_id`` gives them as one value), so the core can fence out late results
from an earlier attempt or tenure.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from workerset_admission.identity import CarriesAttempt, Drain, GroupKey, Registration

__all__ = [
    "BuildFinished",
    "CommitFailed",
    "Drain",
    "DrainLifted",
    "DrainSet",
    "Input",
    "Listing",
    "PeerTenure",
    "TenureRecorded",
    "Tick",
    "WorkerAdded",
    "WorkerRemoved",
]


@dataclass(frozen=True, slots=True)
class WorkerAdded:
    """A model registration was put (created, re-sent, or changed in place)."""

    registration: Registration


@dataclass(frozen=True, slots=True)
class WorkerRemoved:
    """A model registration key was deleted, purged or expired; only the key is known.

    ``expired_at`` is set for a TTL expiry: the clock reading at which the store reported it.
    It says what happened and nothing more; the core alone judges whether the expiry is an
    outage's doing (it came within the tenure hold of the last listing that followed a lost
    connection), and then may hold a tenure it empties, as for that listing, counted from the
    reconnect, not from the expiry.
    """

    key: str
    expired_at: float | None = None


@dataclass(frozen=True, slots=True)
class DrainSet:
    """A drain record was written: for admission its worker has left (see ``drain.py``)."""

    drain: Drain


@dataclass(frozen=True, slots=True)
class DrainLifted:
    """A drain record was withdrawn (or expired): its worker rejoins as a returning member."""

    namespace: str
    instance_id: int


class PeerTenure(NamedTuple):
    """What the live peer frontends serve of one group: its checksum and those members' ids."""

    mdc_checksum: str
    members: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Listing:
    """A full listing of every valid registration: keys not listed are gone.

    Applied as one point in time: listed registrations are added first (in listing order, so
    new cohorts join in that order), then absent keys are removed. An incumbent that is still
    listed under a different worker therefore survives a reconnect.

    ``retain`` names keys that the listing holds but whose values the boundary refused: like
    Dynamo, the core keeps their last valid registration instead of reading them as gone.

    ``reconnect`` says the listing follows a lost connection: registrations may have expired
    only because their heartbeats could not reach the store, so an incumbent cohort that the
    listing empties is held for a while instead of succeeded at once.

    ``outage_start`` says the listing is the first of a frontend that started (or restarted)
    while the store could not be reached: its workers could not refresh their registrations
    either, so the core treats it as a reconnect listing. ``peer_outage_at`` is the clock value
    at which a live peer frontend last resynced after losing its connection, when one said so:
    a first listing within ``tenure_hold`` of it is one of that outage, counted from then.
    ``peer_tenures`` (per group, as ``(model, worker_set)``) is what the live peer frontends
    serve; after an outage, a group this frontend holds nothing of whose peers' checksum the
    listing lacks is reserved for it, held, as the peers hold it (see ``hold.py``). All three
    are reports; the core decides.

    ``drains`` are every drain the listing holds (drains not listed are lifted), and
    ``retain_drains`` the workers whose drain record is listed with a value the boundary
    refused: their last valid drain stays. New drains are applied before the registrations,
    so a drained worker is never admitted, not even for the length of a listing.
    """

    registrations: Sequence[Registration]
    retain: Collection[str] = ()
    reconnect: bool = False
    drains: Sequence[Drain] = ()
    retain_drains: Collection[tuple[str, int]] = ()
    outage_start: bool = False
    peer_tenures: Mapping[tuple[str, str], PeerTenure] = field(default_factory=dict)
    peer_outage_at: float | None = None


@dataclass(frozen=True, slots=True)
class BuildFinished(CarriesAttempt):
    """The outcome of one build attempt; ``error`` explains a failure."""

    group: GroupKey
    mdc_checksum: str
    generation: int
    ok: bool
    error: str | None = None


@dataclass(frozen=True, slots=True)
class CommitFailed(CarriesAttempt):
    """The service could not carry out a commit or a membership replacement.

    ``phase="commit"`` answers a ``CommitGroup`` a hop refused (the service makes this input
    itself, and its trace records it). ``phase="replace"`` reports that a later update of the
    committed group with this build generation could not be carried out; the core judges LoRA
    projections itself, so the service no longer makes this one, but the core still takes it.
    """

    group: GroupKey
    mdc_checksum: str
    generation: int
    phase: Literal["commit", "replace"]
    error: str = ""


@dataclass(frozen=True, slots=True)
class TenureRecorded(CarriesAttempt):
    """A tenure a live frontend held when a recording of it began; only a replay sends it.

    It comes before anything else of its group, ahead of the recording's first listing, and
    carries what that frontend's status said: the incumbent checksum with its receiver and
    build generation, the generation of its committed build if there was one, and, when the
    recording began during a hold, the hold's deadline, the instance ids of the members the
    hold began with (only one of them ends it), and those served on last known good and until
    when. Times are on the core's clock.

    A tenure that was not held is taken up when the recorded checksum's first registration
    starts the group's tenure, with the recorded receiver and generation instead of new ones.
    A held one is in place at once: the empty incumbent cohort in front, held as the live
    frontend held it, so the listing that follows, which lacks its members, changes nothing.
    """

    group: GroupKey
    mdc_checksum: str
    receiver: int
    generation: int
    committed_generation: int | None = None
    held_until: float | None = None
    hold_members: tuple[int, ...] = ()
    last_known: tuple[int, ...] = ()
    last_known_until: float | None = None


@dataclass(frozen=True, slots=True)
class Tick:
    """The injected clock moved to ``now`` (seconds, any monotonic origin)."""

    now: float


Input = (
    WorkerAdded
    | WorkerRemoved
    | Listing
    | BuildFinished
    | CommitFailed
    | Tick
    | TenureRecorded
    | DrainSet
    | DrainLifted
)
