"""Register workers in the discovery bucket the way Dynamo workers do, with a self-expiring TTL.

Each registration is written with a per-message TTL (server 2.11+, bucket created with
``limit_marker_ttl``) and refreshed by a heartbeat task well before it runs out. A worker that
crashes stops refreshing; the server then removes the key and leaves a marker that watchers see
as an ``expired`` removal. A clean shutdown deletes the keys at once.

A refresh is conditional on the key still holding this publisher's last revision, so a key that
someone else took over is never overwritten by a late heartbeat. What happens to a key that was
deleted while registered is the publisher's ``on_removed`` choice: ``"reregister"`` writes it
again (with a WARNING: a worker that is alive must not look gone), ``"report"`` stops refreshing
it. Either way every key lost for good (taken over, or deleted under ``"report"``) is listed in
``lost`` and sets ``lost_event``, so the process that owns the publisher never runs on
unregistered without knowing.

A bucket that is gone (a NATS server restarted on an empty store, the stream deleted) is created
again with the publisher's bucket settings at the next heartbeat, and every registration is
written again at once; a bucket created again by someone else refuses the conditional refresh,
which then finds the key gone and writes it again. :meth:`refresh_now` (on a reconnect) runs
the heartbeat at once instead of at the end of its interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import EllipsisType
from typing import Any, Literal

from nats.js.api import Header
from nats.js.client import JetStreamContext
from nats.js.errors import APIError, NoStreamResponseError, NotFoundError
from workerset_admission.adapters.nats.buckets import BucketSpec, ensure_bucket
from workerset_admission.adapters.nats.errors import REQUEST_FAILURES
from workerset_admission.adapters.nats.kv import (
    delete_headers,
    removal_kind,
    stream_name,
    subject_prefix,
)
from workerset_admission.adapters.owned_task import OwnedTask
from workerset_admission.card import encode_endpoint_record, encode_model_record
from workerset_admission.errors import UsageError, error_in_words
from workerset_admission.identity import EndpointId
from workerset_admission.keys import DISCOVERY_BUCKET, endpoint_kv_key, model_kv_key
from workerset_admission.ownership import WriterId

__all__ = ["Registration", "WorkerRegistrar", "trace_headers"]

_log = logging.getLogger(__name__)
_WRONG_LAST_SEQUENCE = (10071, 10164)
# Seconds before a heartbeat loop that failed starts again (its first refresh waits a beat more).
_RESTART_AFTER = 1.0


class _Propagation:
    """Whether a failure of the configured trace propagator was said yet (once per process)."""

    failed = False


def trace_headers() -> dict[str, str]:
    """Return W3C trace context headers for the current span (empty without a span or OTel)."""
    carrier: dict[str, str] = {}
    try:
        from opentelemetry import propagate
    except ImportError:  # pragma: no cover - the API is a dependency, but stay optional here
        return carrier
    try:
        propagate.inject(carrier)
    except Exception as exc:
        # The propagator is whatever the deployment configured (OTEL_PROPAGATORS): a broken
        # one must not stop a worker's registration, which then carries no trace context.
        if not _Propagation.failed:
            _Propagation.failed = True
            _log.warning(
                "the trace context propagator failed (%r); registrations are written without "
                "trace headers",
                exc,
            )
        return {}
    return carrier


@dataclass(frozen=True, slots=True)
class Registration:
    """One key this publisher keeps alive."""

    key: str
    value: bytes
    ttl: float | None
    revision: int
    headers: Mapping[str, str] | None = None


class WorkerRegistrar:
    """Writes model-card and endpoint-instance registrations, and keeps them alive.

    ``ttl`` (seconds, at least 1) is the default lifetime of a registration without a
    heartbeat; ``None`` writes registrations that never expire. The heartbeat refreshes every
    ``heartbeat`` seconds (default: a third of the TTL).
    """

    def __init__(
        self,
        js: JetStreamContext,
        *,
        bucket: str = DISCOVERY_BUCKET,
        ttl: float | None = 10.0,
        heartbeat: float | None = None,
        create_bucket: bool = True,
        bucket_spec: BucketSpec | None = None,
        trace_context: bool = True,
        writer: WriterId | None = None,
        on_removed: Literal["reregister", "report"] = "report",
    ) -> None:
        if ttl is not None and ttl < 1:
            raise UsageError("a registration TTL is at least 1 second")
        if heartbeat is not None and heartbeat <= 0:
            raise UsageError("the heartbeat interval must be positive")
        self._js = js
        self.bucket = bucket
        self._prefix = subject_prefix(bucket)
        self.ttl = ttl
        self.heartbeat = heartbeat
        self._create_bucket = create_bucket
        self._bucket_spec = bucket_spec or BucketSpec(name=bucket)
        self._trace_context = trace_context
        self._ready = False
        self._registrations: dict[str, Registration] = {}
        self._heartbeat = OwnedTask(
            self._beat,
            name=f"discovery heartbeat {bucket}",
            log=_log,
            keeps="the registrations stay as last written until the heartbeat runs again",
            restart_after=_RESTART_AFTER,
        )
        self._writer = writer
        self._on_removed = on_removed
        self._wake = asyncio.Event()
        self.refreshes = 0
        self.reregistrations = 0
        # Times the bucket was found gone and created again.
        self.heals = 0
        # Keys lost for good, and how: "deleted" or "taken" (overwritten by another writer).
        self.lost: dict[str, str] = {}
        self.lost_event = asyncio.Event()

    @property
    def keys(self) -> frozenset[str]:
        return frozenset(self._registrations)

    async def _ensure(self) -> None:
        if not self._ready:
            if self._create_bucket:
                await ensure_bucket(self._js, self._bucket_spec)
            self._ready = True

    async def _write(
        self,
        key: str,
        value: bytes,
        ttl: float | None,
        headers: Mapping[str, str] | None,
        expected_revision: int | None = None,
    ) -> int:
        all_headers: dict[str, str] = {}
        if self._trace_context:
            all_headers.update(trace_headers())
        if self._writer is not None:
            all_headers.update(self._writer.headers())
        if headers:
            all_headers.update(headers)
        if expected_revision is not None:
            all_headers[Header.EXPECTED_LAST_SUBJECT_SEQUENCE] = str(expected_revision)
        ack = await self._js.publish(
            self._prefix + key,
            value,
            headers=all_headers or None,
            msg_ttl=None if ttl is None else float(math.ceil(ttl)),
        )
        seq: int = ack.seq
        return seq

    async def put(
        self,
        key: str,
        value: bytes,
        *,
        ttl: float | EllipsisType | None = ...,
        headers: Mapping[str, str] | None = None,
    ) -> int:
        """Write one raw key (already escaped) and keep it alive; returns the revision."""
        await self._ensure()
        chosen = self.ttl if ttl is ... else ttl
        assert chosen is None or isinstance(chosen, float | int)
        if chosen is not None and chosen < 1:
            raise UsageError("a registration TTL is at least 1 second")
        revision = await self._write(key, value, chosen, headers)
        self._registrations[key] = Registration(key, value, chosen, revision, headers)
        self._ensure_heartbeat()
        return revision

    async def register(
        self,
        endpoint: EndpointId,
        instance_id: int,
        card: Mapping[str, Any] | str | bytes,
        suffix: str | None = None,
        *,
        ttl: float | EllipsisType | None = ...,
        headers: Mapping[str, str] | None = None,
    ) -> str:
        """Register a model card for an instance (a LoRA adapter when ``suffix`` is given)."""
        key = model_kv_key(endpoint, instance_id, suffix)
        value = encode_model_record(endpoint, instance_id, card, suffix)
        await self.put(key, value, ttl=ttl, headers=headers)
        return key

    async def register_endpoint(
        self,
        endpoint: EndpointId,
        instance_id: int,
        *,
        transport: Mapping[str, Any] | None = None,
        ttl: float | EllipsisType | None = ...,
        headers: Mapping[str, str] | None = None,
    ) -> str:
        """Register an endpoint instance (its liveness record)."""
        key = endpoint_kv_key(endpoint, instance_id)
        value = encode_endpoint_record(endpoint, instance_id, transport)
        await self.put(key, value, ttl=ttl, headers=headers)
        return key

    async def deregister(
        self,
        endpoint: EndpointId,
        instance_id: int,
        suffix: str | None = None,
        *,
        endpoint_record: bool = False,
    ) -> list[str]:
        """Delete a model registration (and the endpoint record when asked); returns the keys."""
        keys = [model_kv_key(endpoint, instance_id, suffix)]
        if endpoint_record:
            keys.append(endpoint_kv_key(endpoint, instance_id))
        for key in keys:
            await self.delete(key)
        return keys

    async def delete(self, key: str) -> None:
        """Stop refreshing ``key`` and delete it from the bucket."""
        await self._ensure()
        self._registrations.pop(key, None)
        await self._js.publish(self._prefix + key, b"", headers=delete_headers())

    # -- heartbeat ---------------------------------------------------------------------------

    def _interval(self) -> float | None:
        ttls = [r.ttl for r in self._registrations.values() if r.ttl is not None]
        if not ttls:
            return None
        return self.heartbeat if self.heartbeat is not None else max(0.2, min(ttls) / 3)

    @property
    def heartbeat_failures(self) -> int:
        """How many times the heartbeat loop failed (each said at WARNING, then started again)."""
        return self._heartbeat.failures

    def _ensure_heartbeat(self) -> None:
        if self._interval() is not None:
            self._heartbeat.start()

    async def _beat(self) -> None:
        # Stopping forgets the loop's task: a loop that outlived a lost cancellation ends here.
        while self._heartbeat.task is asyncio.current_task():
            interval = self._interval()
            if interval is None:
                return
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=interval)
            self._wake.clear()
            for key, registration in list(self._registrations.items()):
                if registration.ttl is None:
                    continue
                try:
                    revision = await self._write(
                        key,
                        registration.value,
                        registration.ttl,
                        registration.headers,
                        expected_revision=registration.revision,
                    )
                except (NoStreamResponseError, NotFoundError) as exc:
                    # No stream answers for the bucket: it is gone with everything in it.
                    await self._heal(exc)
                    break
                except APIError as exc:
                    if exc.err_code not in _WRONG_LAST_SEQUENCE:
                        _log.warning("refreshing %s failed: %s", key, error_in_words(exc))
                    else:
                        await self._recover(key, registration)
                    continue
                except REQUEST_FAILURES as exc:  # a transient outage; the next beat tries again
                    _log.warning("refreshing %s failed: %s", key, error_in_words(exc))
                    continue
                if self._registrations.get(key) is registration:
                    self._registrations[key] = replace(registration, revision=revision)
                    self.refreshes += 1

    def refresh_now(self) -> None:
        """Run the heartbeat now (after a reconnect the store may have lost everything)."""
        self._wake.set()

    async def _heal(self, exc: Exception) -> None:
        """Create the bucket again and write every registration again, unconditionally."""
        if not self._create_bucket:
            _log.warning(
                "refreshing in %s failed and the bucket is not ours to create: %s",
                self.bucket,
                error_in_words(exc),
            )
            return
        try:
            await ensure_bucket(self._js, self._bucket_spec)
        except REQUEST_FAILURES as retry:  # the server not ready yet: the next beat tries again
            _log.warning(
                "the bucket %s is gone and could not be created yet: %s",
                self.bucket,
                error_in_words(retry),
            )
            return
        self.heals += 1
        _log.warning(
            "the bucket %s was gone; created it again and registering %d key(s) again",
            self.bucket,
            len(self._registrations),
        )
        for key, registration in list(self._registrations.items()):
            try:
                revision = await self._write(
                    key, registration.value, registration.ttl, registration.headers
                )
            except REQUEST_FAILURES as failed:  # the next beat's conditional refresh finds out
                _log.warning("registering %s again failed: %s", key, error_in_words(failed))
                continue
            if self._registrations.get(key) is registration:
                self._registrations[key] = replace(registration, revision=revision)
                self.reregistrations += 1

    async def _recover(self, key: str, registration: Registration) -> None:
        """Find out why a conditional refresh was refused; write again or give the key up."""
        try:
            fate = await self._fate(key, registration)
        except REQUEST_FAILURES as exc:  # asked again when the next beat is refused again
            _log.warning(
                "refreshing %s was refused and why cannot be read now: %s; it is kept and "
                "refreshed again at the next beat",
                key,
                error_in_words(exc),
            )
            return
        if self._registrations.get(key) is not registration:
            return  # deregistered here meanwhile: the refusal was our own delete
        if fate == "expired" or (fate == "deleted" and self._on_removed == "reregister"):
            if fate == "deleted":
                _log.warning(
                    "registration %s was deleted while this worker is alive; registering it again",
                    key,
                )
            # An outage outlasted the TTL, or someone deleted a live registration.
            try:
                revision = await self._write(
                    key, registration.value, registration.ttl, registration.headers
                )
            except REQUEST_FAILURES as exc:  # the next beat is refused again and finds out
                _log.warning("registering %s again failed: %s", key, error_in_words(exc))
                return
            if self._registrations.get(key) is registration:
                self._registrations[key] = replace(registration, revision=revision)
                self.reregistrations += 1
            return
        if fate == "ours":
            return  # written by this publisher after all: the next beat refreshes it
        _log.warning(
            "registration %s was %s; it is no longer refreshed",
            key,
            "deleted" if fate == "deleted" else "overwritten by another writer",
        )
        self._registrations.pop(key, None)
        self.lost[key] = fate
        self.lost_event.set()

    async def _fate(
        self, key: str, registration: Registration
    ) -> Literal["expired", "deleted", "taken", "ours"]:
        try:
            last = await self._js.get_last_msg(stream_name(self.bucket), self._prefix + key)
        except NotFoundError:
            return "expired"  # nothing left at all: the store lost it (purged by age)
        headers = last.headers or {}
        removal = removal_kind(headers)
        if removal == "expired":
            return "expired"
        if removal is not None:
            return "deleted"
        if last.data == registration.value and (self._writer is None or self._writer.owns(headers)):
            # Our own value under a revision we did not note (a write whose ack was lost).
            if last.seq is not None and self._registrations.get(key) is registration:
                self._registrations[key] = replace(registration, revision=last.seq)
            return "ours"
        return "taken"

    async def stop_heartbeat(self) -> None:
        """Stop refreshing without deleting anything (what a crash looks like from outside)."""
        await self._heartbeat.stop()

    async def close(self, *, withdraw: bool = True) -> None:
        """Stop the heartbeat and, unless ``withdraw`` is false, delete every registration."""
        await self.stop_heartbeat()
        if withdraw:
            for key in list(self._registrations):
                try:
                    await self.delete(key)
                except REQUEST_FAILURES as exc:  # noqa: PERF203 - each key on its own
                    _log.warning(
                        "withdrawing %s failed: %s; it stays until its TTL runs out",
                        key,
                        error_in_words(exc),
                    )
        self._registrations.clear()
