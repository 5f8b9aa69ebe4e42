"""Publish what this frontend serves into a KV bucket, so an operator can gate rolling updates.

Layout in the admission bucket (default ``frontend-model-admission``), tokens escaped like the
discovery keys:

* ``v1.<frontend>.capability``: ``{"protocol":"v1","capability":true,"frontend":<id>}``, saying
  this frontend publishes admissions at all (an operator can tell "serves nothing" from "too old
  to say"), with ``"resynced_at"`` (Unix seconds) once it has resynced after a lost connection;
* ``v1.<frontend>.members.<worker namespace>``:
  ``{"protocol":"v1","frontend":<id>,"namespace":<ns>,"members":[<instance keys>]}``.

A namespace record may also carry ``groups`` (one object per admitted WorkerSet: model,
worker_set, checksum, generation, members) so a rollout gate can tell models and configurations
apart; ``members`` alone is the shape Dynamo's own publisher writes.

Changes are coalesced: at most one write round per ``min_interval`` (200 ms by default), and the
last state wins. A round writes only the records that changed since their last successful
write, each key on its own and all at once: one key that cannot be written (refused, or larger
than the server takes) delays no other and is said by key. A record too large is withdrawn and
not tried again until it changes; another failed key is tried again, alone, every
``retry_interval``, and a round in which every write failed is retried whole. Records live for
``record_ttl`` seconds (the bucket's max age) and are rewritten every third of that, so a
frontend that dies without withdrawing drops out of the bucket by itself. ``withdraw_all()``
deletes every record this frontend wrote.

A failed write may mean the store lost the bucket (a wiped or re-created store): the bucket is
bound again (created, with the configured replicas, when absent) and every record is written
again on the next round, not only the ones that changed. ``republish()`` asks for the same
after a discovery resync, when another frontend may already have re-created the bucket empty.
Every ``audit_interval`` seconds the records written so far are read back: one the bucket lost
(a stream deleted or re-created by someone else, a key deleted behind this frontend's back) is
written again on the next round, and a bucket that is gone is created again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from nats.errors import MaxPayloadError
from nats.js.client import JetStreamContext
from nats.js.errors import KeyNotFoundError, NotFoundError
from nats.js.kv import KeyValue
from workerset_admission.adapters.nats.buckets import BucketSpec, ensure_bucket
from workerset_admission.aio import cancel_and_wait
from workerset_admission.keys import ADMISSION_BUCKET, escape_token

__all__ = ["DEFAULT_ADMISSION_BUCKET", "NatsAdmissionPublisher", "admission_keys"]

_log = logging.getLogger(__name__)

DEFAULT_ADMISSION_BUCKET = ADMISSION_BUCKET
PROTOCOL = "v1"


def admission_keys(frontend_id: str) -> tuple[str, Callable[[str], str]]:
    """Return this frontend's capability key and a function from worker namespace to key."""
    base = f"{PROTOCOL}.{escape_token(frontend_id)}"
    return f"{base}.capability", lambda namespace: f"{base}.members.{escape_token(namespace)}"


class _KeyFailure(Exception):
    """One key of a write round could not be written; ``error`` says why."""

    def __init__(self, key: str, error: Exception) -> None:
        super().__init__(key, error)
        self.key = key
        self.error = error


def _encode(record: dict[str, object]) -> bytes:
    return json.dumps(record, separators=(",", ":"), ensure_ascii=False).encode()


class NatsAdmissionPublisher:
    """An :class:`~workerset_admission.ports.AdmissionPublisher` over a JetStream KV bucket.

    It owns one background task that performs the coalesced writes; ``withdraw_all()`` (or
    ``close()``) stops it.
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
        clock: Callable[[], float] = time.monotonic,
        replicas: int = 1,
        audit_interval: float | None = 2.0,
    ) -> None:
        self._js = js
        self.frontend_id = frontend_id
        self.bucket = bucket
        self._min_interval = min_interval
        self._retry_interval = retry_interval
        self._record_ttl = record_ttl
        self._clock = clock
        self._replicas = replicas
        self._audit_interval = audit_interval
        self._capability_key, self._member_key = admission_keys(frontend_id)
        self._kv: KeyValue | None = None
        self._desired: dict[str, bytes | None] = {}
        self._published: dict[str, bytes] = {}
        self._capability_wanted = False
        self._capability_published = False
        self._resynced_at: float | None = None
        self._dirty = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        self._last_round = float("-inf")
        self._closed = False
        self.write_rounds = 0
        self._failures = 0
        # Records too large for the server, by namespace: not tried again until they change.
        self._oversized: dict[str, bytes] = {}
        # Keys whose last write failed while others went through, and when to try them again.
        self._failing: set[str] = set()
        self._retry_at: float | None = None

    async def _bucket(self) -> KeyValue:
        if self._kv is None:
            spec = BucketSpec(
                name=self.bucket,
                limit_marker_ttl=None,
                max_age=self._record_ttl,
                replicas=self._replicas,
            )
            status = await ensure_bucket(self._js, spec)
            self._kv = status.kv
        return self._kv

    # -- the port ----------------------------------------------------------------------------

    async def publish_members(
        self,
        worker_namespace: str,
        members: Sequence[str],
        *,
        groups: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        """Replace the record for ``worker_namespace``; no members removes the record."""
        if not members:
            self._desired[worker_namespace] = None
        else:
            record: dict[str, Any] = {
                "protocol": PROTOCOL,
                "frontend": self.frontend_id,
                "namespace": worker_namespace,
                "members": sorted(set(members)),
            }
            if groups is not None:
                record["groups"] = [dict(g) for g in groups]
            self._desired[worker_namespace] = _encode(record)
        self._changed()

    async def publish_capability(self, resynced_at: float | None = None) -> None:
        self._capability_wanted = True
        if resynced_at is not None and resynced_at != self._resynced_at:
            self._resynced_at = resynced_at
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
        records then expire after the bucket's max age.
        """
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait([task])
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if not (self._published or self._capability_published):
            return
        try:
            kv = await self._bind_existing()
        except NotFoundError:
            self._published.clear()
            self._capability_published = False
            return
        for namespace in list(self._published):
            await kv.delete(self._member_key(namespace))
            del self._published[namespace]
        if self._capability_published:
            await kv.delete(self._capability_key)
            self._capability_published = False

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

    def _lost_bucket(self) -> None:
        """After a failed write: bind the bucket afresh and rewrite everything next round."""
        self._kv = None
        self._forget_published()

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
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._writer(), name=f"admission-publisher {self.frontend_id}"
            )

    async def _writer(self) -> None:
        refresh_every = self._record_ttl / 3 if self._record_ttl else None
        next_refresh = None if refresh_every is None else self._clock() + refresh_every
        next_audit = None if self._audit_interval is None else self._clock() + self._audit_interval
        while True:
            moments = (next_refresh, next_audit, self._retry_at)
            due = [moment for moment in moments if moment is not None]
            if not due:
                await self._dirty.wait()
            else:
                try:
                    timeout = max(0.0, min(due) - self._clock())
                    await asyncio.wait_for(self._dirty.wait(), timeout=timeout)
                except asyncio.TimeoutError:
                    if self._retry_at is not None and self._clock() >= self._retry_at:
                        # Keys that failed alone: a round of their own.
                        self._retry_at = None
                        self._dirty.set()
                        continue
                    refreshing = next_refresh is not None and self._clock() >= next_refresh
                    if refreshing and refresh_every is not None:
                        next_refresh = self._clock() + refresh_every
                    elif self._audit_interval is not None:
                        next_audit = self._clock() + self._audit_interval
                    try:
                        await (self._refresh() if refreshing else self._audit())
                    except Exception as exc:
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
            except Exception as exc:  # any failure is retried on the next round
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

    def _failed(self, exc: Exception) -> None:
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
            if isinstance(outcome, BaseException) and not isinstance(outcome, Exception):
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

    async def _write_capability(self, kv: KeyValue) -> None:
        try:
            await kv.put(self._capability_key, self._capability_record())
        except Exception as exc:
            raise _KeyFailure(self._capability_key, exc) from exc
        self._capability_published = True

    async def _write_namespace(self, kv: KeyValue, namespace: str, value: bytes | None) -> None:
        key = self._member_key(namespace)
        try:
            if value is not None:
                try:
                    await kv.put(key, value)
                except MaxPayloadError:
                    await self._withdraw_oversized(kv, namespace, value)
                    return
                self._published[namespace] = value
                return
            if namespace in self._published:
                await kv.delete(key)
                del self._published[namespace]
        except Exception as exc:
            raise _KeyFailure(key, exc) from exc
        # The namespace may have gained members while the delete was in flight.
        if namespace in self._desired and self._desired[namespace] is None:
            del self._desired[namespace]

    async def _withdraw_oversized(self, kv: KeyValue, namespace: str, value: bytes) -> None:
        """Set aside a record the server cannot take; withdraw the older one, no longer true."""
        key = self._member_key(namespace)
        self._oversized[namespace] = value
        _log.warning(
            "the serving record %s is %d bytes, more than the NATS server takes; it is "
            "withdrawn and not published until it changes",
            key,
            len(value),
        )
        if namespace in self._published:
            await kv.delete(key)
            del self._published[namespace]

    async def _audit(self) -> None:
        """Read back what was written; forget what the bucket lost, so the next round writes it."""
        if not (self._published or self._capability_published):
            return
        kv = await self._bucket()
        lost: list[str] = []
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

    def _capability_record(self) -> bytes:
        record: dict[str, Any] = {
            "protocol": PROTOCOL,
            "capability": True,
            "frontend": self.frontend_id,
        }
        if self._resynced_at is not None:
            record["resynced_at"] = self._resynced_at
        return _encode(record)

    @staticmethod
    async def _lost(kv: KeyValue, key: str, value: bytes) -> bool:
        try:
            entry = await kv.get(key)
        except KeyNotFoundError:
            return True
        return bool(entry.value != value)

    async def _refresh(self) -> None:
        """Rewrite every published record so it outlives the bucket's max age."""
        kv = await self._bucket()
        if self._capability_published:
            await kv.put(self._capability_key, self._capability_record())
        for namespace, value in list(self._published.items()):
            await kv.put(self._member_key(namespace), value)
