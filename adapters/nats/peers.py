"""What live peer frontends serve, attached to the listings a frontend starts or resyncs from.

A frontend that starts, or resyncs after losing its connection, observes a listing with no order
of its own. The core's observation order (:mod:`workerset_admission.admission.ordering`) then
puts first, per WorkerSet, the checksum the other live frontends already serve. This adapter
only reads: before passing an initial or reconnect listing on, it reads the serving-admission
bucket once (bounded in time) and attaches each other frontend's served checksum per group,
and the instance ids each checksum is served with (what a frontend that starts after an outage
may hold for them, see the core), and how long ago the latest peer resynced after losing its
connection (its capability record says when): a frontend that starts within that outage's hold
takes its first listing as one of that outage. Periodic listings and live events pass through
untouched.
When the bucket cannot be read in time the listing goes on without peers, and is observed in
key order.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Protocol

from workerset_admission.card.serving_record import (
    BucketRead,
    CapabilityRecord,
    NamespaceRecord,
    Record,
    ServedGroup,
    parse_record,
)
from workerset_admission.identity import GroupKey
from workerset_admission.ports import DiscoverySource, SourceEvent, SourceListing

__all__ = ["PeerAwareSource", "members_served_by_peers", "peers_resynced_at", "served_by_peers"]

_log = logging.getLogger(__name__)


class _Reader(Protocol):
    async def read(self) -> BucketRead: ...


def _peer_records(read: BucketRead, own_frontend: str) -> Iterator[Record]:
    """Yield every valid record of another frontend (bad ones are the gate's to report)."""
    for entry in read.entries:
        try:
            record = parse_record(entry.key, entry.value, entry.published_at)
        except Exception:
            continue
        if record.frontend != own_frontend:
            yield record


def _peer_groups(read: BucketRead, own_frontend: str) -> Iterator[tuple[str, ServedGroup]]:
    """Yield (frontend, group) for every group another frontend serves with members."""
    for record in _peer_records(read, own_frontend):
        if isinstance(record, NamespaceRecord):
            for group in record.groups or ():
                if group.checksum is not None and group.members:
                    yield record.frontend, group


def peers_resynced_at(read: BucketRead, own_frontend: str) -> float | None:
    """Return the latest time (Unix seconds) another frontend resynced after an outage."""
    times = [
        record.resynced_at
        for record in _peer_records(read, own_frontend)
        if isinstance(record, CapabilityRecord) and record.resynced_at is not None
    ]
    return max(times, default=None)


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
        for member in group.members:
            spelled = member[len(prefix) :] if member.startswith(prefix) else ""
            with contextlib.suppress(ValueError):
                ids.add(int(spelled, 16))
    return {
        group: {checksum: tuple(sorted(ids)) for checksum, ids in served.items()}
        for group, served in found.items()
    }


class PeerAwareSource:
    """A discovery source whose initial and reconnect listings carry the peers' served checksums."""

    def __init__(
        self,
        source: DiscoverySource,
        reader: _Reader,
        own_frontend: str,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._source = source
        self._reader = reader
        self._own = own_frontend
        self._wall = wall

    async def _read(self) -> BucketRead | None:
        try:
            read = await self._reader.read()
        except Exception as exc:  # a listing must never wait on, or fail for, its peers
            _log.debug("could not read the peers' serving records: %r", exc)
            return None
        if read.problem is not None:
            _log.debug("could not read the peers' serving records: %s", read.problem)
            return None
        return read

    async def events(self) -> AsyncIterator[SourceEvent]:
        async for event in self._source.events():
            if isinstance(event, SourceListing) and event.reason != "periodic":
                read = await self._read()
                if read is None:
                    event = dataclasses.replace(
                        event, peers=None, peer_members=None, peers_resynced_ago=None
                    )
                else:
                    resynced_at = peers_resynced_at(read, self._own)
                    event = dataclasses.replace(
                        event,
                        peers=served_by_peers(read, self._own),
                        peer_members=members_served_by_peers(read, self._own),
                        # Host clocks differ a little: a time ahead of ours is "just now".
                        peers_resynced_ago=None
                        if resynced_at is None
                        else max(0.0, self._wall() - resynced_at),
                    )
            yield event

    async def list_all(self) -> SourceListing:
        return await self._source.list_all()

    async def close(self) -> None:
        await self._source.close()
