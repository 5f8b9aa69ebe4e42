"""What live peer frontends serve, attached to the listings a frontend starts or resyncs from.

A frontend that starts, or resyncs after losing its connection, observes a listing with no order
of its own. The core's observation order (:mod:`workerset_admission.admission.ordering`) then
puts first, per WorkerSet, the checksum the other live frontends already serve. This adapter
only reads: the service hands it each initial or reconnect listing before its step takes it
(:class:`PeerListings`, a :class:`~workerset_admission.ports.ListingPeers`), and it reads the
serving-admission bucket once (bounded in time) and attaches each other frontend's served
checksum per group,
and the instance ids each checksum is served with (what a frontend that starts after an outage
may hold for them, see the core), and how long ago the latest peer resynced after losing its
connection (its capability record says when): a frontend that starts within that outage's hold
takes its first listing as one of that outage. Periodic listings and live events never
reach it.

"How long ago" is read on the NATS server's clock alone: the server's time when the bucket was
read, less the server's time when it stored the peer's resync record. No two hosts' clocks are
compared, so a peer whose clock is minutes off is read as right as one whose clock is not. Only a
record from an older writer (which says its resync by its own clock, and whose records are
rewritten every few seconds) is still read against this host's clock. Only live frontends count
(:func:`workerset_admission.card.serving_record.live_records`): a stopped peer's records, which
stay behind until their own TTL, say nothing.
When the bucket cannot be read in time the listing goes on without peers, and is observed in
key order.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Iterator
from typing import Protocol

from workerset_admission.card.serving_record import (
    BucketRead,
    CapabilityRecord,
    NamespaceRecord,
    Record,
    ServedGroup,
    live_records,
    parse_record,
)
from workerset_admission.errors import InvalidRecordError
from workerset_admission.identity import GroupKey
from workerset_admission.ports import SourceListing

__all__ = ["PeerListings", "members_served_by_peers", "peers_resynced_ago", "served_by_peers"]

_log = logging.getLogger(__name__)


class _Reader(Protocol):
    async def read(self) -> BucketRead: ...


def _peer_records(read: BucketRead, own_frontend: str) -> Iterator[Record]:
    """Yield every valid record of another live frontend (bad ones are the gate's to report)."""
    records = []
    for entry in read.entries:
        try:
            records.append(parse_record(entry.key, entry.value, entry.published_at))
        except InvalidRecordError:  # noqa: PERF203 - one bad record skips only itself
            continue
    for record in live_records(records):
        if record.frontend != own_frontend:
            yield record


def _peer_groups(read: BucketRead, own_frontend: str) -> Iterator[tuple[str, ServedGroup]]:
    """Yield (frontend, group) for every group another frontend serves with members or holds."""
    for record in _peer_records(read, own_frontend):
        if isinstance(record, NamespaceRecord):
            for group in record.groups or ():
                if group.checksum is not None and (group.members or group.held):
                    yield record.frontend, group


def peers_resynced_ago(read: BucketRead, own_frontend: str, wall: float) -> float | None:
    """Return how long ago (seconds) the latest other frontend resynced after an outage.

    On the server's clock when the read says the server's time and the record its resync by
    the server's clock; otherwise (an older server or writer) ``wall`` (this host's Unix
    seconds) against the writer's own. A time ahead of now is "just now".
    """
    agos = []
    for record in _peer_records(read, own_frontend):
        if not isinstance(record, CapabilityRecord) or record.resynced_at is None:
            continue
        by_server = record.resync_by_server()
        if by_server is not None and read.server_time is not None:
            agos.append(read.server_time - by_server)
        else:
            agos.append(wall - record.resynced_at)
    return max(0.0, min(agos)) if agos else None


def served_by_peers(read: BucketRead, own_frontend: str) -> dict[tuple[str, str], tuple[str, ...]]:
    """Per group (model, worker_set), the checksum each other frontend serves (sorted)."""
    served: dict[tuple[str, str], set[tuple[str, str]]] = {}
    for frontend, group in _peer_groups(read, own_frontend):
        assert group.checksum is not None
        served.setdefault((group.model, group.worker_set), set()).add((frontend, group.checksum))
    return {
        group: tuple(checksum for _frontend, checksum in sorted(pairs))
        for group, pairs in served.items()
    }


def members_served_by_peers(
    read: BucketRead, own_frontend: str
) -> dict[tuple[str, str], dict[str, tuple[int, ...]]]:
    """Per group and checksum the other frontends serve, the instance ids they serve (sorted).

    A member is an instance key (``<ns>/<component>/<endpoint>/<id hex>``); one that is not
    of the group's endpoint is not this group's and is left out.
    """
    found: dict[tuple[str, str], dict[str, set[int]]] = {}
    for _frontend, group in _peer_groups(read, own_frontend):
        assert group.checksum is not None
        try:
            prefix = GroupKey(group.model, group.worker_set).endpoint.path() + "/"
        except (ValueError, TypeError):
            continue
        ids = found.setdefault((group.model, group.worker_set), {}).setdefault(
            group.checksum, set()
        )
        # A tenure held with nobody served names whom it waits for: those are its members here.
        for member in (*group.members, *group.held):
            spelled = member[len(prefix) :] if member.startswith(prefix) else ""
            with contextlib.suppress(ValueError):
                ids.add(int(spelled, 16))
    return {
        group: {checksum: tuple(sorted(ids)) for checksum, ids in served.items()}
        for group, served in found.items()
    }


class PeerListings:
    """Attaches the peers' served checksums to the initial and reconnect listings handed to it."""

    def __init__(
        self,
        reader: _Reader,
        own_frontend: str,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._reader = reader
        self._own = own_frontend
        self._wall = wall
        # The NATS server's clock less this host's, as the last read that said it measured.
        self._server_offset: float | None = None

    async def _read(self) -> BucketRead | None:
        try:
            read = await self._reader.read()
        except Exception as exc:
            # A listing must never wait on, or fail for, its peers: whatever the reading of
            # their records ends with (a refusal, an outage, a defect), the listing goes on.
            _log.warning(
                "could not read the peers' serving records (%r); the listing goes on without "
                "what they serve",
                exc,
            )
            return None
        if read.problem is not None:
            _log.warning(
                "could not read the peers' serving records (%s); the listing goes on without "
                "what they serve",
                read.problem,
            )
            return None
        if read.server_time is not None:
            self._server_offset = read.server_time - self._wall()
        return read

    def server_now(self) -> float | None:
        """Return the NATS server's time now, as the last read of its bucket measured it.

        ``None`` until a read said it.

        Read at every start and resync; between them, this host's clock carries it on.
        """
        offset = self._server_offset
        return None if offset is None else self._wall() + offset

    async def attach(self, listing: SourceListing) -> SourceListing:
        """Return ``listing`` with what the other live frontends serve (nothing: unreadable)."""
        read = await self._read()
        if read is None:
            return dataclasses.replace(
                listing, peers=None, peer_members=None, peers_resynced_ago=None
            )
        return dataclasses.replace(
            listing,
            peers=served_by_peers(read, self._own),
            peer_members=members_served_by_peers(read, self._own),
            peers_resynced_ago=peers_resynced_ago(read, self._own, self._wall()),
        )
