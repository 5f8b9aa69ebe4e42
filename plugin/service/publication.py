"""The serving-admission publication: this frontend's records, kept in step with its groups."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from workerset_admission.errors import WorkersetAdmissionError, wire_text
from workerset_admission.ports import AdmissionPublisher
from workerset_admission.service.status_model import ServingRecord

__all__ = ["PUBLISH_FAILURES", "ServingPublication"]

_log = logging.getLogger(__name__)

PUBLISH_FAILURES: tuple[type[Exception], ...] = (
    WorkersetAdmissionError,
    OSError,
    asyncio.TimeoutError,
)
"""What a round may fail with and be tried again: the publisher's store away or refusing
(the composition root raises a client's errors as ``Unreachable``), or the view's files not
written in step (``ViewDirectoryError``, ``OSError``). Anything else is a defect and stops the
service, loudly."""


class ServingPublication:
    """Keeps one record per worker namespace in step with the committed groups.

    Bursts are coalesced (at most one round per ``interval``) and a failed round is retried
    after ``retry`` seconds; the capability record is written once, before anything else.
    ``prepare`` runs before each round reads what to publish: a record says what this
    frontend routes to, so whatever carries routing out (the admitted view's files) must be
    in step first. A ``drain --wait`` that reads "not served" may then stop the worker.
    After the first round that follows the service's first listing (``synced``), the publisher
    settles: records a predecessor under the same frontend id left, and this process does not
    publish, are withdrawn.
    """

    def __init__(
        self,
        publisher: AdmissionPublisher,
        wanted: Callable[[], dict[str, ServingRecord]],
        interval: float,
        retry: float,
        prepare: Callable[[], None] | None = None,
        synced: Callable[[], bool] | None = None,
    ) -> None:
        self._publisher = publisher
        self._wanted = wanted
        self._prepare = prepare
        self._synced = synced
        self._settled = False
        self._interval = interval
        self._retry = retry
        self._wake = asyncio.Event()
        self._published: dict[str, ServingRecord] = {}
        self._capability_published = False
        self._republish = False
        self._resynced_at: float | None = None

    def wake(self) -> None:
        """Ask for a round soon (the committed groups changed)."""
        self._wake.set()

    async def withdraw(self, timeout: float = 5.0) -> None:
        """Withdraw this frontend's serving records at a stop; never raises.

        NATS may be away when the service stops: that is one WARNING line, not a traceback,
        and the records it could not delete expire with the bucket's max age.
        """
        try:
            await asyncio.wait_for(self._publisher.withdraw_all(), timeout=timeout)
        except PUBLISH_FAILURES as exc:
            text = str(exc)
            _log.warning(
                "could not withdraw the serving-admission records (%s); they expire after the "
                "bucket's max age",
                wire_text(f"{type(exc).__name__}: {text}" if text else type(exc).__name__),
            )

    def republish(self, resynced_at: float | None = None) -> None:
        """Write every record again soon: after a resync the store may have lost them.

        ``resynced_at`` (Unix seconds) is when the resync after a lost connection happened: the
        capability record says it, for peers that start within that outage's hold.
        """
        self._republish = True
        if resynced_at is not None:
            self._resynced_at = resynced_at
            self._capability_published = False
        self._wake.set()

    async def _publish(self, namespace: str, record: ServingRecord | None) -> None:
        members = () if record is None else record.members
        # The rollout gate reads checksum and generation per group from the record.
        await self._publisher.publish_members(
            namespace, members, groups=None if record is None else record.groups
        )

    async def run(self) -> None:
        publisher = self._publisher
        # Announce the frontend at once: one that serves nothing yet must still count as a live
        # frontend for a rollout gate, or a gate could open without it.
        self._wake.set()
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                if self._republish:
                    self._republish = False
                    await publisher.republish()
                if not self._capability_published:
                    await publisher.publish_capability(self._resynced_at)
                    self._capability_published = True
                # Known before what to publish is read: a listing that lands in between is
                # this round's to miss, and settling must wait for the round that has it.
                synced = self._synced is not None and self._synced()
                if self._prepare is not None:
                    self._prepare()
                wanted = self._wanted()
                for namespace in sorted(set(wanted) | set(self._published)):
                    record = wanted.get(namespace)
                    if self._published.get(namespace) == record:
                        continue
                    await self._publish(namespace, record)
                    if record is not None:
                        self._published[namespace] = record
                    else:
                        self._published.pop(namespace, None)
                if synced and not self._settled:
                    await publisher.settle()
                    self._settled = True
            except PUBLISH_FAILURES as exc:  # NATS may be down; try again soon
                _log.warning(
                    "could not publish serving admissions: %s; the records published before "
                    "stay, and the round is tried again in %g s",
                    wire_text(exc),
                    self._retry,
                )
                self._wake.set()
                await asyncio.sleep(self._retry)
                continue
            await asyncio.sleep(self._interval)
