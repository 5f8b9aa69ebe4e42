"""Publish what this frontend serves into a KV bucket, so an operator can gate rolling updates.

Layout in the admission bucket (default ``frontend-model-admission``), tokens escaped like the
discovery keys:

* ``v1.<frontend>.capability``: ``{"protocol":"v1","capability":true,"frontend":<id>}``, saying
  this frontend publishes admissions at all (an operator can tell "serves nothing" from "too old
  to say");
* ``v1.<frontend>.members.<worker namespace>``:
  ``{"protocol":"v1","frontend":<id>,"namespace":<ns>,"members":[<instance keys>]}``.

A namespace record may also carry ``groups`` (one object per admitted WorkerSet: model,
worker_set, checksum, generation, members) so a rollout gate can tell models and configurations
apart; ``members`` alone is the shape Dynamo's own publisher writes.

Changes are coalesced: at most one write round per ``min_interval`` (200 ms by default), and the
last state wins. A failed write round is retried every ``retry_interval``. Records live for
``record_ttl`` seconds (the bucket's max age) and are rewritten every third of that, so a
frontend that dies without withdrawing drops out of the bucket by itself. ``withdraw_all()``
deletes every record this frontend wrote.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from nats.js.client import JetStreamContext
from nats.js.kv import KeyValue
from workerset_admission.aio import cancel_and_wait
from workerset_admission.keys import escape_token

from .buckets import BucketSpec, ensure_bucket

__all__ = ["DEFAULT_ADMISSION_BUCKET", "NatsAdmissionPublisher", "admission_keys"]

_log = logging.getLogger(__name__)

DEFAULT_ADMISSION_BUCKET = "frontend-model-admission"
PROTOCOL = "v1"


def admission_keys(frontend_id: str) -> tuple[str, Callable[[str], str]]:
    """Return this frontend's capability key and a function from worker namespace to key."""
    base = f"{PROTOCOL}.{escape_token(frontend_id)}"
    return f"{base}.capability", lambda namespace: f"{base}.members.{escape_token(namespace)}"


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
    ) -> None:
        self._js = js
        self.frontend_id = frontend_id
        self.bucket = bucket
        self._min_interval = min_interval
        self._retry_interval = retry_interval
        self._record_ttl = record_ttl
        self._clock = clock
        self._replicas = replicas
        self._capability_key, self._member_key = admission_keys(frontend_id)
        self._kv: KeyValue | None = None
        self._desired: dict[str, bytes | None] = {}
        self._published: dict[str, bytes] = {}
        self._capability_wanted = False
        self._capability_published = False
        self._dirty = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        self._last_round = float("-inf")
        self._closed = False
        self.write_rounds = 0

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

    async def publish_capability(self) -> None:
        self._capability_wanted = True
        self._changed()

    async def withdraw_all(self) -> None:
        """Stop publishing and delete every record this frontend wrote."""
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait([task])
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if not (self._published or self._capability_published):
            return
        kv = await self._bucket()
        for namespace in list(self._published):
            await kv.delete(self._member_key(namespace))
            del self._published[namespace]
        if self._capability_published:
            await kv.delete(self._capability_key)
            self._capability_published = False

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
        while True:
            if refresh_every is None:
                await self._dirty.wait()
            else:
                try:
                    await asyncio.wait_for(self._dirty.wait(), timeout=refresh_every)
                except asyncio.TimeoutError:
                    with contextlib.suppress(Exception):
                        await self._refresh()
                    continue
            wait = self._last_round + self._min_interval - self._clock()
            if wait > 0:
                await asyncio.sleep(wait)
            self._dirty.clear()
            self._last_round = self._clock()
            try:
                await self._write_round()
            except Exception as exc:  # any failure is retried on the next round
                _log.warning("publishing admissions failed, retrying: %r", exc)
                self._dirty.set()
                await asyncio.sleep(self._retry_interval)
                continue
            self.write_rounds += 1
            if not self._dirty.is_set():
                self._idle.set()

    async def _write_round(self) -> None:
        kv = await self._bucket()
        if self._capability_wanted and not self._capability_published:
            record = {"protocol": PROTOCOL, "capability": True, "frontend": self.frontend_id}
            await kv.put(self._capability_key, _encode(record))
            self._capability_published = True
        for namespace, value in list(self._desired.items()):
            if self._published.get(namespace) == value:
                continue
            key = self._member_key(namespace)
            if value is not None:
                await kv.put(key, value)
                self._published[namespace] = value
            else:
                if namespace in self._published:
                    await kv.delete(key)
                    del self._published[namespace]
                # The namespace may have gained members while the delete was in flight.
                if namespace in self._desired and self._desired[namespace] is None:
                    del self._desired[namespace]

    async def _refresh(self) -> None:
        """Rewrite every published record so it outlives the bucket's max age."""
        kv = await self._bucket()
        if self._capability_published:
            record = {"protocol": PROTOCOL, "capability": True, "frontend": self.frontend_id}
            await kv.put(self._capability_key, _encode(record))
        for namespace, value in list(self._published.items()):
            await kv.put(self._member_key(namespace), value)
