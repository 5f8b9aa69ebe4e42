"""Publish what this frontend serves into a KV bucket, so an operator can gate rolling updates.

Layout in the admission bucket (default ``frontend-model-admission``), tokens escaped like the
discovery keys:

* ``v1.<frontend>.heartbeat``: ``{"protocol":"v1","frontend":<id>,"heartbeat":true}``, this
  frontend's liveness, rewritten every third of ``record_ttl`` with a per-key TTL of
  ``record_ttl``: the server removes it ``record_ttl`` seconds after its frontend stopped;
* ``v1.<frontend>.capability``: ``{"protocol":"v1","capability":true,"frontend":<id>}``, saying
  this frontend publishes admissions at all (an operator can tell "serves nothing" from "too old
  to say"), with ``"resynced_at"`` (Unix seconds) once it has resynced after a lost connection;
* ``v1.<frontend>.members.<worker namespace>``:
  ``{"protocol":"v1","frontend":<id>,"namespace":<ns>,"members":[<instance keys>]}``.

A namespace record may also carry ``groups`` (one object per admitted WorkerSet: model,
worker_set, checksum, generation, members) so a rollout gate can tell models and configurations
apart; ``members`` alone is the shape Dynamo's own publisher writes. A namespace with no members
has no record, unless one of its groups holds its tenure after an outage with nobody served:
then the record stays with no members and the group names the workers it waits for under
``held`` (no reader of ``members`` counts them); it is withdrawn once nothing is held. The
capability and namespace records say ``"liveness":"heartbeat"``: a reader takes their frontend
for live while its heartbeat is in the bucket
(:func:`workerset_admission.card.serving_record.live_records`).

Liveness is apart from content. On a bucket with per-key TTLs and no max age (what this
publisher creates on a 2.11+ server) the content records are written when they change, with a
per-key TTL of ``content_ttl`` (an hour) that only bounds how long a crashed frontend's records
stay behind; they are written again every third of it, so they never expire under a live
frontend. At rest a frontend writes one small heartbeat every ``record_ttl / 3`` seconds,
whatever it serves. On a bucket with a max age (made by an older version, or on a server
without per-key TTLs) every record is rewritten every third of that age, as before.

Changes are coalesced: at most one write round per ``min_interval`` (200 ms by default), and the
last state wins. A round writes only the records that changed since their last successful
write, each key on its own and all at once: one key that cannot be written (refused, or larger
than the server takes) delays no other and is said by key. A record too large stands as a
marker (below) and is not tried again until it changes; another failed key is tried again,
alone, every ``retry_interval``, and a round in which every write failed is retried whole.
``withdraw_all()`` deletes every record this frontend wrote, unless its view outlives it (below).

*A view that outlives its writer.* ``view_outlives`` is how long the frontend may keep routing
by the admitted view after this process last touched it (the view's horizon and one refresh).
On a bucket with per-key TTLs the heartbeat says it (``"view_outlives"``), and the capability
record carries the lease it implies: ``"routes_for"``, the seconds after its publication the
frontend may still route by its last view if this process writes nothing more, with a per-key
TTL just as long. It is rewritten every ``lease_every`` (a minute at most, a tenth of the
horizon), so the lease is never more than that behind the truth, and the server removes the
record, on its own clock, once the last view has expired. The namespace records outlive it
(their TTL is at least twice the lease). A reader that finds the heartbeat gone and the lease in
the bucket takes the frontend for *silent*: still routing by the view its namespace records
describe. A stop withdraws nothing the view still routes by: it writes the lease afresh,
deletes the heartbeat and leaves the namespace records; the next process under the same id
takes them over, and withdraws the ones it does not publish itself once it has settled
(:meth:`settle`).

*A record too large to publish.* A namespace record larger than the server takes is replaced by
a small marker under the same key (``"unpublished": <bytes>``, no members): a reader cannot
tell which of the namespace's workers the frontend routes to, and counts it as routing to any.

A failed write may mean the store lost the bucket (a wiped or re-created store): the bucket is
bound again (created, with the configured replicas, when absent) and every record is written
again on the next round, not only the ones that changed. ``republish()`` asks for the same
after a discovery resync, when another frontend may already have re-created the bucket empty.
Every ``audit_interval`` seconds the publisher checks that the bucket still holds what it
wrote: with a heartbeat, by reading the heartbeat alone (its revision is the one written, or
the bucket was deleted, re-created or the key removed), while a watch of this frontend's own
keys (headers only) hears at once of a record deleted, purged or aged out behind its back;
on an older bucket, by reading every record back. What was lost is written again on the next
round, and a bucket that is gone is created again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from nats.aio.client import Client as NatsClient
from nats.errors import Error as NatsError
from nats.errors import MaxPayloadError
from nats.js.client import JetStreamContext
from nats.js.errors import (
    APIError,
    BadRequestError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
    NotFoundError,
)
from nats.js.kv import KeyValue
from workerset_admission.adapters.nats.admission_reader import read_keys
from workerset_admission.adapters.nats.buckets import BucketSpec, ensure_bucket
from workerset_admission.adapters.nats.errors import REQUEST_FAILURES
from workerset_admission.adapters.nats.kv import stream_name
from workerset_admission.adapters.owned_task import OwnedTask
from workerset_admission.card.serving_record import LIVENESS_HEARTBEAT
from workerset_admission.keys import ADMISSION_BUCKET, escape_token

__all__ = ["DEFAULT_ADMISSION_BUCKET", "NatsAdmissionPublisher", "admission_keys", "heartbeat_key"]

_log = logging.getLogger(__name__)

DEFAULT_ADMISSION_BUCKET = ADMISSION_BUCKET
PROTOCOL = "v1"

# A put only over a given revision of its key, and the server's codes for "not that revision".
_EXPECTED_LAST = "Nats-Expected-Last-Subject-Sequence"
_WRONG_LAST = (10071, 10164)


def admission_keys(frontend_id: str) -> tuple[str, Callable[[str], str]]:
    """Return this frontend's capability key and a function from worker namespace to key."""
    base = f"{PROTOCOL}.{escape_token(frontend_id)}"
    return f"{base}.capability", lambda namespace: f"{base}.members.{escape_token(namespace)}"


def heartbeat_key(frontend_id: str) -> str:
    """Return the key of this frontend's heartbeat."""
    return f"{PROTOCOL}.{escape_token(frontend_id)}.heartbeat"


class _KeyFailure(Exception):
    """One key of a write round could not be written; ``error`` says why."""

    def __init__(self, key: str, error: Exception) -> None:
        super().__init__(key, error)
        self.key = key
        self.error = error


def _holds(groups: Sequence[Mapping[str, Any]] | None) -> bool:
    """Whether a group holds a tenure for workers it does not serve (its ``held`` workers)."""
    return any(group.get("held") for group in groups or ())


def _encode(record: dict[str, object]) -> bytes:
    return json.dumps(record, separators=(",", ":"), ensure_ascii=False).encode()


class NatsAdmissionPublisher:
    """An :class:`~workerset_admission.ports.AdmissionPublisher` over a JetStream KV bucket.

    It owns one background task that performs the coalesced writes, and on a bucket with
    per-key TTLs one that watches its own keys; ``withdraw_all()`` (or ``close()``) stops them.
    A writer that fails on something other than the store's refusals and outages is said at
    WARNING and started again after ``retry_interval``; a watch of its own keys that fails is
    said at WARNING and started again with the next binding of the bucket (the heartbeat's
    audit covers a lost bucket meanwhile).
    """

    def __init__(
        self,
        js: JetStreamContext,
        frontend_id: str,
        *,
        bucket: str = DEFAULT_ADMISSION_BUCKET,
        min_interval: float = 0.2,
        retry_interval: float = 1.0,
        record_ttl: float | None = 60.0,
        content_ttl: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
        replicas: int = 1,
        audit_interval: float | None = 2.0,
        watch_own_keys: bool = True,
        view_outlives: float | None = None,
        client: NatsClient | None = None,
    ) -> None:
        self._js = js
        self.frontend_id = frontend_id
        self.bucket = bucket
        self._min_interval = min_interval
        self._retry_interval = retry_interval
        self._record_ttl = record_ttl
        self._content_ttl = content_ttl
        self._clock = clock
        self._replicas = replicas
        self._audit_interval = audit_interval
        self._watch_own_keys = watch_own_keys
        if view_outlives is not None and not view_outlives > 0:
            raise ValueError("view_outlives must be a positive number of seconds")
        self._view_outlives = view_outlives
        # The connection behind ``js``: settling lists this frontend's records with a consumer
        # the server names, which a frontend's NATS user may create (docs/security.md).
        self._client = client
        # When the capability record's lease on the view is due to be written again, and when
        # it was last written (both on ``clock``).
        self._lease_due: float | None = None
        self._lease_written: float | None = None
        self._capability_key, self._member_key = admission_keys(frontend_id)
        self._heartbeat_key = heartbeat_key(frontend_id)
        self._kv: KeyValue | None = None
        # Whether the bound bucket keeps liveness apart from content (per-key TTLs, no max age).
        self._leased = False
        self._max_age: float | None = None
        self._desired: dict[str, bytes | None] = {}
        self._published: dict[str, bytes] = {}
        self._capability_wanted = False
        self._capability_published = False
        # The revision of the heartbeat this frontend last wrote; None until one is written.
        self._beat_revision: int | None = None
        self._resynced_at: float | None = None
        self._resynced_server_at: float | None = None
        self._dirty = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task = OwnedTask(
            self._writer,
            name=f"admission-publisher {frontend_id}",
            log=_log,
            keeps="the records written so far stay, and what changed is written once it runs",
            restart_after=retry_interval,
        )
        self._own_watch = OwnedTask(
            self._watch_own,
            name=f"admission-publisher {frontend_id} keys",
            log=_log,
            keeps="the heartbeat's audit still finds a lost bucket, and the watch starts again "
            "when the bucket is bound again",
        )
        self._last_round = float("-inf")
        self._closed = False
        self.write_rounds = 0
        self.heartbeats = 0
        self._failures = 0
        # Records too large for the server, by namespace: not tried again until they change.
        self._oversized: dict[str, bytes] = {}
        # Keys whose last write failed while others went through, and when to try them again.
        self._failing: set[str] = set()
        self._retry_at: float | None = None

    @property
    def leased(self) -> bool:
        """Whether liveness is the heartbeat alone and content is written when it changes."""
        return self._leased

    @property
    def lease_every(self) -> float | None:
        """How often the capability record's lease on the view is written (None: no lease)."""
        if self._view_outlives is None or not self._record_ttl:
            return None
        return max(self._record_ttl / 3, min(60.0, self._view_outlives / 10))

    @property
    def routes_for(self) -> float | None:
        """The lease a capability record states: how long its frontend may route unheard."""
        every = self.lease_every
        if every is None or self._view_outlives is None or not self._leased:
            return None
        # The process may live one rewrite past the last one, and a write may lag one more.
        return self._view_outlives + 2 * every

    def _content_ttl_now(self) -> float:
        lease = self.routes_for
        return self._content_ttl if lease is None else max(self._content_ttl, 2 * lease)

    def _capability_ttl(self) -> float:
        lease = self.routes_for
        return self._content_ttl_now() if lease is None else lease

    async def _bucket(self) -> KeyValue:
        if self._kv is None:
            spec = BucketSpec(
                name=self.bucket,
                # Per-key TTLs, and a marker when a key ages out so a watcher hears of it.
                limit_marker_ttl=self._record_ttl,
                max_age=None,
                fallback_max_age=self._record_ttl,
                replicas=self._replicas,
            )
            status = await ensure_bucket(self._js, spec)
            self._leased = bool(self._record_ttl and status.per_key_ttl and status.max_age is None)
            self._max_age = status.max_age
            self._kv = status.kv
            if self._leased and self._watch_own_keys and not self._closed:
                self._own_watch.start()
        return self._kv

    # -- the port ----------------------------------------------------------------------------

    async def publish_members(
        self,
        worker_namespace: str,
        members: Sequence[str],
        *,
        groups: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        """Replace the record for ``worker_namespace``; no members removes the record.

        Unless a group holds its tenure with nobody served (``"held"``): the record stays, with
        no members, so a frontend that starts during the hold reserves the same tenure.
        """
        if not members and not _holds(groups):
            self._desired[worker_namespace] = None
        else:
            record: dict[str, Any] = {
                "protocol": PROTOCOL,
                "frontend": self.frontend_id,
                "namespace": worker_namespace,
                "members": sorted(set(members)),
                "liveness": LIVENESS_HEARTBEAT,
            }
            if groups is not None:
                record["groups"] = [dict(g) for g in groups]
            self._desired[worker_namespace] = _encode(record)
        self._changed()

    async def publish_capability(self, resynced_at: float | None = None) -> None:
        self._capability_wanted = True
        if resynced_at is not None and resynced_at != self._resynced_at:
            self._resynced_at = resynced_at
            self._resynced_server_at = None  # learned from the record that first says it
            self._capability_published = False  # the record says something new
        self._changed()

    async def republish(self) -> None:
        """Write every record again on the next round (the store may have lost them)."""
        self._forget_published()
        if self._capability_wanted or self._desired:
            self._changed()

    async def withdraw_all(self) -> None:
        """Stop publishing and delete every record this frontend wrote.

        A bucket that is gone holds nothing to withdraw; any other failure is raised, and the
        records then expire by their TTL or the bucket's max age.
        """
        self._closed = True
        await self._task.stop()
        await self._own_watch.stop()
        beating = self._beat_revision is not None
        if not (self._published or self._capability_published or beating):
            return
        try:
            kv = await self._bind_existing()
        except NotFoundError:
            self._published.clear()
            self._capability_published = False
            self._beat_revision = None
            return
        if self.routes_for is not None and self._capability_published:
            await self._leave_view_lease(kv)
            return
        for namespace in list(self._published):
            await kv.delete(self._member_key(namespace))
            del self._published[namespace]
        if self._capability_published:
            await kv.delete(self._capability_key)
            self._capability_published = False
        # The heartbeat last: a reader never sees this frontend live with half its records.
        if beating:
            await kv.delete(self._heartbeat_key)
            self._beat_revision = None

    async def _leave_view_lease(self, kv: KeyValue) -> None:
        """Stop, leaving what the frontend still routes by: the view outlives this process.

        The lease is written afresh (the view was touched until now), the heartbeat deleted (a
        reader sees the frontend silent at once), and the namespace records left: they say
        what the view holds until the lease runs out or the next process settles.
        """
        await self._put(kv, self._capability_key, self._capability_record(), self._capability_ttl())
        if self._beat_revision is not None:
            await kv.delete(self._heartbeat_key)
            self._beat_revision = None
        _log.info(
            "serving records left in place: the frontend routes by its last view for up to "
            "%g s (%d namespace record(s))",
            self.routes_for,
            len(self._published),
        )
        self._published.clear()
        self._capability_published = False

    async def settle(self) -> int:
        """Withdraw any namespace record under this frontend's id that it does not publish.

        Called once this process has published what it serves after its first listing: a
        predecessor under the same id (one that crashed, or stopped leaving its records for
        its view) may have published a namespace this one no longer serves. Returns how many
        records it withdrew.
        """
        kv = await self._bucket()
        subject = f"{PROTOCOL}.{escape_token(self.frontend_id)}.members.>"
        found: list[str] | None = None
        if self._client is not None:
            with contextlib.suppress(BadRequestError):  # a server before 2.10: the watch, below
                entries = await read_keys(self._client, self.bucket, [subject], 10.0)
                found = [entry.key for entry in entries]
        if found is None:
            found = await self._own_member_keys(kv, subject)
        ours = {self._member_key(n) for n, v in self._desired.items() if v is not None}
        ours |= {self._member_key(n) for n in self._published}
        stale = sorted(key for key in found if key not in ours)
        for key in stale:
            await kv.delete(key)
        if stale:
            _log.info(
                "withdrew %d serving record(s) a predecessor under this frontend id left and "
                "this one does not publish (%s first)",
                len(stale),
                stale[0],
            )
        return len(stale)

    async def _own_member_keys(self, kv: KeyValue, subject: str) -> list[str]:
        """Return the keys this frontend's namespace records have in the bucket (headers only)."""
        watcher = await kv.watch(subject, meta_only=True, ignore_deletes=True)
        keys: list[str] = []
        try:
            while True:
                entry = await watcher.updates(timeout=5.0)  # type: ignore[no-untyped-call]
                if entry is None:
                    return keys
                if entry.operation is None or entry.operation == "PUT":
                    keys.append(entry.key)
        finally:
            with contextlib.suppress(NatsError):  # a closed connection ends the watch anyway
                await watcher.stop()  # type: ignore[no-untyped-call]

    async def _bind_existing(self) -> KeyValue:
        # Withdrawing must never create the bucket it deletes from.
        if self._kv is None:
            self._kv = await self._js.key_value(self.bucket)
        return self._kv

    def _forget_published(self) -> None:
        for namespace, value in self._published.items():
            self._desired.setdefault(namespace, value)
        self._published.clear()
        self._capability_published = False
        self._beat_revision = None

    def _lost_bucket(self) -> None:
        """After a failed write: bind the bucket afresh and rewrite everything next round."""
        self._kv = None
        self._forget_published()
        self._stop_own_watch()

    def _stop_own_watch(self) -> None:
        # Bound again with the bucket: a watch of a deleted or re-created stream hears nothing.
        self._own_watch.detach()

    async def close(self) -> None:
        await self.withdraw_all()

    async def flushed(self) -> None:
        """Wait until every change so far has been written."""
        await self._idle.wait()

    # -- coalesced writer --------------------------------------------------------------------

    def _changed(self) -> None:
        if self._closed:
            return
        self._idle.clear()
        self._dirty.set()
        self._task.start()

    def _refresh_every(self) -> float | None:
        """Seconds between rewrites of every record so none outlives its TTL or max age."""
        if self._leased:
            return self._content_ttl_now() / 3
        # An older bucket's own max age, whoever made it with whatever age.
        age = self._max_age or self._record_ttl
        return age / 3 if age else None

    def _beat_every(self) -> float | None:
        return self._record_ttl / 3 if self._leased and self._record_ttl else None

    async def _writer(self) -> None:
        if not self._idle.is_set():
            # Started again after a failure: what was owed then is owed still.
            self._dirty.set()
        now = self._clock()
        next_refresh: float | None = None
        next_beat: float | None = None
        next_audit = None if self._audit_interval is None else now + self._audit_interval
        schedule: tuple[float | None, float | None] | None = None
        while True:
            # The schedule follows the bucket's kind, known once it is bound.
            refresh_every, beat_every = self._refresh_every(), self._beat_every()
            if schedule != (refresh_every, beat_every):
                schedule, now = (refresh_every, beat_every), self._clock()
                next_refresh = None if refresh_every is None else now + refresh_every
                next_beat = None if beat_every is None else now + beat_every
            moments = (next_refresh, next_beat, next_audit, self._retry_at)
            due = [moment for moment in moments if moment is not None]
            if not due:
                await self._dirty.wait()
            else:
                try:
                    timeout = max(0.0, min(due) - self._clock())
                    await asyncio.wait_for(self._dirty.wait(), timeout=timeout)
                except asyncio.TimeoutError:
                    now = self._clock()
                    if self._retry_at is not None and now >= self._retry_at:
                        # Keys that failed alone: a round of their own.
                        self._retry_at = None
                        self._dirty.set()
                        continue
                    job: Callable[[], Awaitable[None]]
                    if next_refresh is not None and now >= next_refresh:
                        next_refresh, job = now + (refresh_every or 0.0), self._refresh
                    elif next_beat is not None and now >= next_beat:
                        next_beat, job = now + (beat_every or 0.0), self._heartbeat
                    elif next_audit is not None and self._audit_interval is not None:
                        next_audit, job = now + self._audit_interval, self._audit
                    else:
                        continue
                    try:
                        await job()
                    except REQUEST_FAILURES as exc:
                        self._lost_bucket()
                        self._dirty.set()
                        self._failed(exc)
                    continue
            wait = self._last_round + self._min_interval - self._clock()
            if wait > 0:
                await asyncio.sleep(wait)
            self._dirty.clear()
            self._last_round = self._clock()
            try:
                await self._write_round()
            except REQUEST_FAILURES as exc:  # a refusal or an outage: retried next round
                self._lost_bucket()
                self._failed(exc)
                self._dirty.set()
                await asyncio.sleep(self._retry_interval)
                continue
            if self._failures:
                _log.info("publishing admissions works again after %d failures", self._failures)
                self._failures = 0
            self.write_rounds += 1
            if not self._dirty.is_set():
                self._idle.set()

    def _failed(self, exc: BaseException) -> None:
        # One WARNING per outage, not one per retry: a store that is away for minutes would
        # otherwise fill the log.
        self._failures += 1
        level = logging.WARNING if self._failures == 1 else logging.DEBUG
        _log.log(level, "publishing admissions failed, retrying until it works: %r", exc)

    async def _write_round(self) -> None:
        """Write what changed since the last successful write, every key on its own.

        The writes go out together, so a key whose write hangs (a refused publish is never
        answered) delays no other. A record larger than the server takes is withdrawn and said
        by key, and not tried again until it changes; any other failure of some keys is said by
        key and those keys alone are tried again after ``retry_interval``. Only a round in which
        every write failed raises: the bucket itself may be gone.
        """
        kv = await self._bucket()
        writes = []
        if self._capability_wanted and self._beat_revision is None:
            # The heartbeat first: a reader never sees records that say "live while my
            # heartbeat is" without it, which would take a starting frontend for a stopped one.
            await self._beat(kv)
        if self._capability_wanted and not self._capability_published:
            writes.append(self._write_capability(kv))
        for namespace, value in list(self._desired.items()):
            if self._published.get(namespace) == value:
                continue
            if value is not None and self._oversized.get(namespace) == value:
                continue
            writes.append(self._write_namespace(kv, namespace, value))
        if not writes:
            return
        outcomes = await asyncio.gather(*writes, return_exceptions=True)
        failed = [o for o in outcomes if isinstance(o, _KeyFailure)]
        for outcome in outcomes:
            # Anything but a key's own refusal or outage (a cancellation, a defect) ends the
            # round: the writer's owner says it and starts the writer again.
            if isinstance(outcome, BaseException) and not isinstance(outcome, _KeyFailure):
                raise outcome
        if failed and len(failed) == len(outcomes):
            raise failed[0].error
        self._retry_at = None
        for failure in failed:
            self._retry_at = self._clock() + self._retry_interval
            level = logging.WARNING if failure.key not in self._failing else logging.DEBUG
            _log.log(
                level,
                "publishing the serving record %s failed, retrying it alone: %r",
                failure.key,
                failure.error,
            )
        now_failing = {f.key for f in failed}
        for key in self._failing - now_failing:
            _log.info("publishing the serving record %s works again", key)
        self._failing = now_failing

    async def _put(
        self, kv: KeyValue, key: str, value: bytes, ttl: float | None, last: int | None = None
    ) -> int:
        """Put one record, with a per-key TTL on a leased bucket; return its revision.

        With ``last`` (on a leased bucket), only over that revision of the key
        (``KeyWrongLastSequenceError`` if the key's latest is another, or there is none).
        """
        if not self._leased:
            return int(await kv.put(key, value))
        headers = None if last is None else {_EXPECTED_LAST: str(last)}
        try:
            ack = await self._js.publish(
                f"$KV.{self.bucket}.{key}", value, headers=headers, msg_ttl=ttl
            )
        except APIError as error:
            if error.err_code in _WRONG_LAST:
                raise KeyWrongLastSequenceError(description=error.description) from None
            raise
        return int(ack.seq)

    async def _beat(self, kv: KeyValue) -> None:
        """Write the heartbeat; one that is not the last one written means the bucket lost it.

        The write names the revision of the last heartbeat, so a bucket deleted or re-created
        since, or a heartbeat removed behind this frontend's back, fails it: then every record
        is written again.
        """
        value = self._heartbeat_record()
        if self._beat_revision is not None and self._leased:
            try:
                revision = await self._put(
                    kv, self._heartbeat_key, value, self._record_ttl, last=self._beat_revision
                )
            except KeyWrongLastSequenceError:
                self._lost_records("its heartbeat")
            else:
                self._beat_revision = revision
                self.heartbeats += 1
                return
        self._beat_revision = await self._put(kv, self._heartbeat_key, value, self._record_ttl)
        self.heartbeats += 1

    async def _heartbeat(self) -> None:
        kv = await self._bucket()
        if self._capability_wanted and self._beat_revision is not None:
            await self._beat(kv)
            due = self._lease_due
            if self._capability_published and due is not None and self._clock() >= due:
                await self._write_lease(kv)

    async def _write_lease(self, kv: KeyValue) -> None:
        """Write the capability record again, so its lease on the view starts now."""
        await self._put(kv, self._capability_key, self._capability_record(), self._capability_ttl())
        self._next_lease()

    def _next_lease(self) -> None:
        every = self.lease_every if self.routes_for is not None else None
        self._lease_written = None if every is None else self._clock()
        self._lease_due = None if every is None else self._clock() + every

    def lease_overdue(self) -> float | None:
        """How many seconds the view's lease is overdue: past its last write and one rewrite.

        ``None`` while no lease is written (no view, or a bucket without per-key TTLs). The view
        writer stamps its files that much less far ahead, so that a frontend cut off from the
        bucket stops routing by its view before the server removes the lease that says it may
        (``routes_for`` is the view's life and two rewrites; a touch at the last write stamps
        the view's life, and this lets it lag one rewrite and one heartbeat more).
        """
        every = self.lease_every
        written = self._lease_written
        if every is None or written is None or self.routes_for is None:
            return None
        # A rewrite goes out at the first heartbeat after it is due: one beat late at most,
        # which a healthy writer must not pay for (a beat is never longer than a rewrite, so
        # the view still ends before the lease: ``lease_every`` is at least a beat).
        late = self._beat_every() or 0.0
        return max(0.0, self._clock() - written - every - late)

    def _lost_records(self, what: str) -> None:
        _log.warning(
            "the admission bucket lost %s of this frontend (%s); writing every record again",
            what,
            self._heartbeat_key,
        )
        self._forget_published()
        self._idle.clear()
        self._dirty.set()

    async def _write_capability(self, kv: KeyValue) -> None:
        record = self._capability_record()
        try:
            revision = await self._put(kv, self._capability_key, record, self._capability_ttl())
        except REQUEST_FAILURES as exc:
            raise _KeyFailure(self._capability_key, exc) from exc
        self._capability_published = True
        self._next_lease()
        if self._resynced_at is not None and self._resynced_server_at is None:
            await self._learn_resync_time(revision)

    async def _learn_resync_time(self, revision: int) -> None:
        """Keep the server's time of the record that first said the resync, for its rewrites.

        Peers read that moment on the server's clock; a rewrite (a refresh, or after the bucket
        lost it) must not make the resync look newer than it was.
        """
        try:
            stored = await self._js.get_msg(stream_name(self.bucket), seq=revision)
        except REQUEST_FAILURES as exc:
            _log.warning(
                "cannot read the server's time of the resync record (%r); the record says the "
                "resync by this host's clock, and the next one that says it is read again",
                exc,
            )
            return
        if stored.time is not None:
            self._resynced_server_at = stored.time.timestamp()

    async def _write_namespace(self, kv: KeyValue, namespace: str, value: bytes | None) -> None:
        key = self._member_key(namespace)
        try:
            if value is not None:
                try:
                    await self._put(kv, key, value, self._content_ttl_now())
                except MaxPayloadError:
                    await self._mark_oversized(kv, namespace, value)
                    return
                self._published[namespace] = value
                self._oversized.pop(namespace, None)
                return
            if namespace in self._published:
                await kv.delete(key)
                del self._published[namespace]
        except REQUEST_FAILURES as exc:
            raise _KeyFailure(key, exc) from exc
        # The namespace may have gained members while the delete was in flight.
        if namespace in self._desired and self._desired[namespace] is None:
            del self._desired[namespace]

    async def _mark_oversized(self, kv: KeyValue, namespace: str, value: bytes) -> None:
        """Set aside a record the server cannot take; publish a marker saying so instead.

        The older record is no longer true, and no record would read as "routes to none of the
        namespace's workers": the marker reads as "may route to any of them".
        """
        key = self._member_key(namespace)
        self._oversized[namespace] = value
        if not json.loads(value)["members"]:
            # Only held workers: the frontend routes to none of them, and a marker would say
            # it may route to any. Nothing stands instead (a starting peer then sees no hold).
            _log.warning(
                "the serving record %s is %d bytes, more than the NATS server takes; it names "
                "no worker served, so it is withdrawn until it changes",
                key,
                len(value),
            )
            if namespace in self._published:
                await kv.delete(key)
                del self._published[namespace]
            return
        _log.warning(
            "the serving record %s is %d bytes, more than the NATS server takes; a marker "
            "saying so stands in its place (a drain waits for this frontend) until it changes",
            key,
            len(value),
        )
        marker = _encode(
            {
                "protocol": PROTOCOL,
                "frontend": self.frontend_id,
                "namespace": namespace,
                "members": [],
                "unpublished": len(value),
                "liveness": LIVENESS_HEARTBEAT,
            }
        )
        await self._put(kv, key, marker, self._content_ttl_now())
        self._published[namespace] = marker

    async def _audit(self) -> None:
        """Check that the bucket holds what was written; what it lost is written next round.

        With a heartbeat one small read says it: the heartbeat's revision is the one written
        unless the bucket was deleted, re-created or the key removed (a record removed alone is
        heard by the watch of this frontend's keys). On an older bucket every record is read.
        """
        if self._leased:
            if self._beat_revision is None:
                return
            kv = await self._bucket()
            try:
                entry = await kv.get(self._heartbeat_key)
            except KeyNotFoundError:
                self._lost_records("its heartbeat")
                return
            if entry.revision != self._beat_revision:
                self._lost_records("its heartbeat")
            return
        if not (self._published or self._capability_published):
            return
        kv = await self._bucket()
        lost: list[str] = []
        if self._beat_revision is not None and await self._lost(
            kv, self._heartbeat_key, self._heartbeat_record()
        ):
            self._beat_revision = None
            lost.append(self._heartbeat_key)
        if self._capability_published and await self._lost(
            kv, self._capability_key, self._capability_record()
        ):
            self._capability_published = False
            lost.append(self._capability_key)
        for namespace, value in list(self._published.items()):
            if await self._lost(kv, self._member_key(namespace), value):
                self._desired.setdefault(namespace, value)
                del self._published[namespace]
                lost.append(self._member_key(namespace))
        if lost:
            _log.warning(
                "the admission bucket lost %d record(s) of this frontend (%s first); writing again",
                len(lost),
                lost[0],
            )
            self._idle.clear()
            self._dirty.set()

    async def _watch_own(self) -> None:
        """Hear of this frontend's records deleted, purged or aged out, and write them again.

        Headers only: a put costs the watch its key and revision, whatever the record's size.
        """
        kv = self._kv
        if kv is None:
            return  # started with the bucket's binding; lost with it meanwhile
        own = f"{PROTOCOL}.{escape_token(self.frontend_id)}.>"
        try:
            watcher = await kv.watch(own, meta_only=True)
        except REQUEST_FAILURES as exc:
            _log.warning(
                "cannot watch this frontend's own serving records (%r); the heartbeat's audit "
                "still finds a lost bucket, and the watch is tried again with the next binding",
                exc,
            )
            return
        try:
            async for entry in watcher:
                if entry is None or entry.operation not in ("DEL", "PURGE"):
                    continue
                self._removed(entry.key)
        finally:
            with contextlib.suppress(NatsError):  # a closed connection ends the watch anyway
                await watcher.stop()  # type: ignore[no-untyped-call]

    def _removed(self, key: str) -> None:
        """Write again a record of this frontend that left the bucket, unless it was withdrawn."""
        if key == self._heartbeat_key:
            if self._beat_revision is not None:
                self._beat_revision = None
            else:
                return
        elif key == self._capability_key:
            if not self._capability_published:
                return
            self._capability_published = False
        else:
            found = [n for n in self._published if self._member_key(n) == key]
            if not found or self._desired.get(found[0], b"") is None:
                return  # a withdrawal of this frontend's own
            self._desired.setdefault(found[0], self._published.pop(found[0]))
            self._oversized.pop(found[0], None)  # a marker removed: tried, and marked, again
        _log.warning("the serving record %s was removed behind this frontend; writing again", key)
        self._idle.clear()
        self._dirty.set()

    def _heartbeat_record(self) -> bytes:
        record: dict[str, Any] = {
            "protocol": PROTOCOL,
            "frontend": self.frontend_id,
            "heartbeat": True,
        }
        if self.routes_for is not None:
            record["view_outlives"] = self._view_outlives
        return _encode(record)

    def _capability_record(self) -> bytes:
        record: dict[str, Any] = {
            "protocol": PROTOCOL,
            "capability": True,
            "frontend": self.frontend_id,
            "liveness": LIVENESS_HEARTBEAT,
        }
        if self._resynced_at is not None:
            record["resynced_at"] = self._resynced_at
        if self._resynced_server_at is not None:
            record["resynced_server_at"] = self._resynced_server_at
        if self.routes_for is not None:
            record["routes_for"] = self.routes_for
        return _encode(record)

    @staticmethod
    async def _lost(kv: KeyValue, key: str, value: bytes) -> bool:
        try:
            entry = await kv.get(key)
        except KeyNotFoundError:
            return True
        return bool(entry.value != value)

    async def _refresh(self) -> None:
        """Rewrite every published record so it outlives its TTL or the bucket's max age."""
        kv = await self._bucket()
        if self._beat_revision is not None:
            await self._beat(kv)
        if self._capability_published:
            await self._write_lease(kv)
        for namespace, value in list(self._published.items()):
            await self._put(kv, self._member_key(namespace), value, self._content_ttl_now())
