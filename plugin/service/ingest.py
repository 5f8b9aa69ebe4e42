"""Ingestion: what a discovery put, removal or listing means for the core and the liveness index.

This is the one translation from the discovery bucket's raw entries into admission inputs. The
live service calls it for every source event and ``replay`` calls it for every trace line, so
an offline replay judges records by the very code that judged them live:

* a model record becomes ``WorkerAdded`` (a put) or a member of a ``Listing``;
* an endpoint-instance record updates the :class:`~.liveness.LivenessIndex`;
* a drain record becomes ``DrainSet`` (its removal ``DrainLifted``, a listing's drains go in
  the ``Listing``);
* a record outside the namespace filter is ignored;
* a record the card boundary refuses is reported as a refusal and changes nothing: a listed key
  whose value is refused keeps its last valid value (the ``retain`` list of a ``Listing``).

Everything here is synchronous and free of I/O; the caller reports refusals and steps the core.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from workerset_admission.admission import (
    DrainLifted,
    DrainSet,
    Input,
    Listing,
    PeerTenure,
    Tick,
    WorkerAdded,
    WorkerRemoved,
)
from workerset_admission.admission.ordering import (
    GroupId,
    PeerServed,
    observation_order,
    peer_choice,
)
from workerset_admission.card.entry import (
    DecodedEntry,
    EntryDecoder,
    EntryKind,
    EventEntry,
    LiveInstance,
    Removal,
)
from workerset_admission.errors import RemoteDataError
from workerset_admission.identity import Drain, EndpointId, Registration
from workerset_admission.keys import parse_drain_key
from workerset_admission.ports import SourceDelete, SourceListing
from workerset_admission.service.liveness import LivenessIndex

__all__ = [
    "CardRecordDecoder",
    "DecodedEntry",
    "EventEntry",
    "Ingested",
    "Ingestor",
    "LiveInstance",
    "RecordDecoder",
    "Verdict",
    "default_decoder",
    "peer_tenures",
]


class RecordDecoder(Protocol):
    """The card boundary as ingestion uses it (the card package's :class:`EntryDecoder`).

    ``decode`` turns a put into a :class:`Registration` (a model card), a
    :class:`LiveInstance` (an endpoint-instance record), an :class:`EventEntry` (a valid event
    source or channel), a :class:`Drain`, or ``None`` (a record this frontend ignores, such as
    a namespace outside its filter). ``removal`` says what a deleted key was (a
    :class:`Removal`: its kind and name) or ``None``. Both raise
    :class:`~workerset_admission.errors.RemoteDataError` for records they refuse.
    """

    def decode(self, key: str, value: bytes) -> DecodedEntry: ...

    def removal(self, key: str) -> Removal | None: ...


# The boundary's decoder under the name the service and its callers have always used.
CardRecordDecoder = EntryDecoder


def peer_tenures(
    peers: PeerServed | None, members: Mapping[GroupId, Mapping[str, Sequence[int]]] | None
) -> dict[GroupId, PeerTenure]:
    """Per group, the checksum the peers serve (the alignment rule's choice) and its members."""
    if not peers or not members:
        return {}
    tenures = {}
    for group, served in peers.items():
        by_checksum = members.get(group, {})
        choice = peer_choice(served, by_checksum)
        if choice is not None:
            tenures[group] = PeerTenure(choice, tuple(sorted(set(by_checksum[choice]))))
    return tenures


def default_decoder() -> RecordDecoder:
    """Return the card boundary with its default settings."""
    return EntryDecoder()


class Verdict(NamedTuple):
    """How one record (by KV key) was judged.

    Either a ``refusal``, or what the boundary accepted the record as (``kind``: a card, with
    its ``registration``; an endpoint instance; an event source or channel; a drain), or
    neither (ignored by the namespace filter). A named tuple: a listing makes one per record,
    and a tuple is built in one step.
    """

    key: str
    registration: Registration | None = None
    refusal: RemoteDataError | None = None
    kind: EntryKind | None = None
    # The worker an event source record names (an event verdict only).
    worker_id: int | None = None
    # A refusal of the very value refused last time under this key (a re-listing, a heartbeat
    # re-sending it): the same bad record, already reported and counted.
    repeated: bool = False

    @property
    def live(self) -> bool:
        """Whether it is an endpoint-instance record (the instance is live)."""
        return self.kind is EntryKind.ENDPOINT

    @property
    def event(self) -> bool:
        return self.kind is EntryKind.EVENT

    @property
    def drain(self) -> bool:
        return self.kind is EntryKind.DRAIN

    @property
    def ignored(self) -> bool:
        return self.kind is None and self.refusal is None


@dataclass(frozen=True, slots=True)
class Ingested:
    """What one discovery event means: core inputs, per-record verdicts, a liveness change."""

    inputs: tuple[Input, ...] = ()
    verdicts: tuple[Verdict, ...] = ()
    liveness_changed: bool = False

    @property
    def refusals(self) -> tuple[Verdict, ...]:
        """The records newly refused: each bad value is reported once per key."""
        return tuple(v for v in self.verdicts if v.refusal is not None and not v.repeated)

    @property
    def refused(self) -> bool:
        """Whether anything was refused, a repeat included."""
        return any(v.refusal is not None for v in self.verdicts)

    @property
    def decision(self) -> str:
        """Name an event that gives the core nothing: liveness, ignored, or unchanged."""
        if self.liveness_changed or any(v.live for v in self.verdicts):
            return "liveness"
        if any(v.ignored for v in self.verdicts):
            return "ignored"
        return "unchanged"


class Ingestor:
    """Turns discovery events into core inputs; keeps the liveness index and a decode cache.

    The cache holds the last value decoded per KV key (its hash and what it decoded to):
    listings repeat what is already held (every reconnect, every periodic reconciliation), and
    a value seen before under the same key is not decoded again. Refused values are
    remembered the same way (by hash, per key) so that a bad record is reported once per key
    and value, not once per listing; a key that goes away is forgotten, and reported again if
    it comes back bad.

    The cache is two maps over one set of keys, what each key decoded to and its value's hash,
    rather than one map of pairs: it holds an entry per record of the fleet, and a pair per
    entry cost more than a second map's slot (about 230 against 170 B per worker of two
    records). What a key decoded to is the very object the core or the liveness index keeps.
    """

    __slots__ = ("_decoded", "_decoder", "_hashes", "_refused", "liveness")

    def __init__(
        self, decoder: RecordDecoder | None = None, liveness: LivenessIndex | None = None
    ) -> None:
        self._decoder: RecordDecoder = decoder or default_decoder()
        self.liveness = liveness if liveness is not None else LivenessIndex()
        self._decoded: dict[str, DecodedEntry] = {}
        self._hashes: dict[str, int] = {}
        self._refused: dict[str, int] = {}

    def put(self, key: str, value: bytes) -> Ingested:
        """Judge a put: the key was created or overwritten."""
        try:
            record = self._decode(key, value, self._decoded, self._hashes)
        except RemoteDataError as exc:
            # The key's last valid value stays in force; the refused one is not remembered.
            self._forget(key)
            return Ingested(verdicts=(self._refusal(key, value, exc, self._refused),))
        self._refused.pop(key, None)
        if isinstance(record, Registration):
            return Ingested((WorkerAdded(record),), (Verdict(key, record, kind=EntryKind.CARD),))
        if record is None:
            return Ingested(verdicts=(Verdict(key),))
        if isinstance(record, EventEntry):
            return Ingested(
                verdicts=(Verdict(key, kind=EntryKind.EVENT, worker_id=record.worker_id),)
            )
        if isinstance(record, Drain):
            return Ingested((DrainSet(record),), (Verdict(key, kind=EntryKind.DRAIN),))
        endpoint, instance_id = record
        changed = self.liveness.put(key, endpoint, instance_id)
        return Ingested(verdicts=(Verdict(key, kind=EntryKind.ENDPOINT),), liveness_changed=changed)

    def listing(
        self,
        event: SourceListing,
        keep: Collection[str] = (),
        *,
        now: float | None = None,
        recorded: Mapping[GroupId, Sequence[str]] | None = None,
    ) -> Ingested:
        """Judge a source's listing event, with its reason and the peers it carries.

        ``recorded`` is a recorded frontend's cohort order (a trace's ``state`` line).
        """
        return self.listed(
            ((entry.key, entry.value) for entry in event.entries),
            keep,
            reconnect=event.reason == "reconnect",
            outage_start=event.reason == "initial" and event.after_outage,
            peers_resynced_ago=event.peers_resynced_ago if event.reason == "initial" else None,
            now=now,
            peers=event.peers,
            peer_members=event.peer_members,
            recorded=recorded,
            forget_refused=event.reason != "periodic",
        )

    def removal(self, event: SourceDelete, *, now: float) -> Ingested:
        """Judge a source's removal event; an expiry carries the time it was seen, ``now``."""
        expired_at = now if event.operation == "expired" else None
        return self.delete(event.key, expired_at=expired_at)

    def delete(self, key: str, *, expired_at: float | None = None) -> Ingested:
        """Judge a removal: the key was deleted, purged or expired.

        ``expired_at`` is the clock reading of a TTL expiry. It goes to the core as it is: the
        core alone judges whether an expiry is an outage's doing (it compares it with the last
        listing that followed a lost connection).
        """
        self._forget(key)
        self._refused.pop(key, None)
        try:
            removal = self._decoder.removal(key)
        except RemoteDataError as exc:
            return Ingested(verdicts=(Verdict(key, refusal=exc),))
        if removal is None:
            return Ingested()
        kind, name = removal
        if kind is EntryKind.DRAIN:
            return Ingested((DrainLifted(*parse_drain_key(name)),))
        if kind is EntryKind.CARD:
            return Ingested((WorkerRemoved(name, expired_at=expired_at),))
        return Ingested(liveness_changed=self.liveness.remove(name))

    def listed(
        self,
        entries: Iterable[tuple[str, bytes]],
        keep: Collection[str] = (),
        *,
        reconnect: bool = False,
        outage_start: bool = False,
        peers_resynced_ago: float | None = None,
        now: float | None = None,
        peers: PeerServed | None = None,
        peer_members: Mapping[GroupId, Mapping[str, Sequence[int]]] | None = None,
        recorded: Mapping[GroupId, Sequence[str]] | None = None,
        forget_refused: bool = True,
    ) -> Ingested:
        """Judge a full listing: every key not listed (and not in ``keep``) is gone.

        ``keep`` names keys whose current state is newer than the listing (a live update
        touched them while it was read): they keep what they have, whatever the listing says.
        ``reconnect`` says the listing follows a lost connection: the core may hold a tenure
        it empties, for a time counted from ``now`` (the clock goes in first when given);
        ``outage_start``, that it is the first listing of a frontend started while the store
        was away, and ``peers_resynced_ago`` how long ago a peer resynced after an outage (the
        core hears when, on its clock, and judges whether this listing is within that
        outage's hold). The registrations are observed in the order :func:`observation_order` gives:
        the cohort ``peers`` serve first, or the ``recorded`` cohort order, otherwise key
        order. ``peer_members`` (the ids the peers serve each checksum with) goes to the core
        as the peers' tenures: what it may hold for them after an outage.
        """
        registrations: list[Registration] = []
        drains: list[Drain] = []
        retain: list[str] = []
        retain_drains: list[str] = []
        live: dict[str, tuple[EndpointId, int]] = {}
        verdicts: list[Verdict] = []
        decoded: dict[str, DecodedEntry] = {}
        hashes: dict[str, int] = {}
        # Only keys still listed (or kept) stay known as refused.
        refused: dict[str, int] = {}
        for key in keep:
            self._retain(key, retain, retain_drains, live)
            if key in self._hashes:
                decoded[key] = self._decoded[key]
                hashes[key] = self._hashes[key]
            if key in self._refused:
                refused[key] = self._refused[key]
        decode = self._decode
        for key, value in entries:
            if key in keep:
                continue
            try:
                record = decode(key, value, decoded, hashes)
            except RemoteDataError as exc:
                verdicts.append(self._refusal(key, value, exc, refused))
                # A listed key with a refused value is not gone: keep its last valid value.
                self._retain(key, retain, retain_drains, live)
                continue
            if isinstance(record, Registration):
                registrations.append(record)
                verdicts.append(Verdict(key, record, kind=EntryKind.CARD))
            elif isinstance(record, LiveInstance):
                live[key] = record
                verdicts.append(Verdict(key, kind=EntryKind.ENDPOINT))
            elif isinstance(record, Drain):
                drains.append(record)
                verdicts.append(Verdict(key, kind=EntryKind.DRAIN))
            elif record is not None:
                verdicts.append(Verdict(key, kind=EntryKind.EVENT, worker_id=record.worker_id))
            else:
                verdicts.append(Verdict(key))
        self._decoded, self._hashes = decoded, hashes
        # A periodic listing read while keys are rewritten may miss some of them; a refused
        # key is forgotten only when it is removed, or absent from a resync's listing.
        self._refused = refused if forget_refused else {**self._refused, **refused}
        changed = self.liveness.replace(live)
        ordered = observation_order(registrations, peers, recorded=recorded)
        listing = Listing(
            ordered,
            retain,
            reconnect=reconnect,
            drains=drains,
            retain_drains=[parse_drain_key(k) for k in retain_drains],
            outage_start=outage_start,
            peer_tenures=peer_tenures(peers, peer_members),
            peer_outage_at=None
            if peers_resynced_ago is None or now is None
            else now - peers_resynced_ago,
        )
        inputs: tuple[Input, ...] = (listing,) if now is None else (Tick(now), listing)
        return Ingested(inputs, tuple(verdicts), changed)

    def _refusal(
        self, key: str, value: bytes, exc: RemoteDataError, into: dict[str, int]
    ) -> Verdict:
        fingerprint = hash(value)
        repeated = self._refused.get(key) == fingerprint
        into[key] = fingerprint
        return Verdict(key, refusal=exc, repeated=repeated)

    def _decode(
        self, key: str, value: bytes, into: dict[str, DecodedEntry], hashes: dict[str, int]
    ) -> DecodedEntry:
        """Decode a record, or take what its key decoded to when its value is the one held.

        What it decoded to goes in ``into`` and its hash in ``hashes``, both under ``key``; a
        value the boundary refuses leaves both as they were.
        """
        fingerprint = hash(value)
        if self._hashes.get(key) == fingerprint:
            record = self._decoded[key]
        else:
            record = self._decoder.decode(key, value)
        into[key] = record
        hashes[key] = fingerprint
        return record

    def _forget(self, key: str) -> None:
        self._decoded.pop(key, None)
        self._hashes.pop(key, None)

    def _retain(
        self,
        key: str,
        retain: list[str],
        retain_drains: list[str],
        live: dict[str, tuple[EndpointId, int]],
    ) -> None:
        try:
            removal = self._decoder.removal(key)
        except RemoteDataError:
            return  # a key that does not parse never named a registration
        if removal is None:
            return
        kind, name = removal
        if kind is EntryKind.CARD:
            retain.append(name)
        elif kind is EntryKind.DRAIN:
            retain_drains.append(name)
        else:
            held = self.liveness.entry(name)
            if held is not None:
                live[name] = held
