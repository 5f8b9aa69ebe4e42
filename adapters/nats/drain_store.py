"""The drain tools' NATS side: list the discovery bucket, write or withdraw a drain, read serving.

Besides the drain records it reads and swaps each model's drain budget record by revision (a
JetStream "expected last subject sequence": the server stores the write only if the key is
still at the revision read), and tries a user's right to write a key without storing anything
(the same header with a revision no key can be at: the server either refuses the publish for
the user's permissions or answers "wrong last sequence").

One connection for the whole command. A drain given while NATS is away waits for it (up to the
caller's deadline) instead of failing at once: a ``preStop`` hook runs while the cluster may be
restarting its nats-server, and a drain that gave up would let the worker stop while frontends
still route to it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from datetime import datetime

from nats.aio.client import Client as NatsClient
from nats.errors import Error as NatsError
from nats.js.api import RawStreamMsg
from nats.js.errors import APIError, BadRequestError, NotFoundError
from workerset_admission.adapters.nats.admission_reader import (
    parse_server_time,
    read_keys,
    read_server_time,
)
from workerset_admission.adapters.nats.connect import (
    ConnectionCallbacks,
    NatsConnectOptions,
    connect,
    servers_for_display,
)
from workerset_admission.adapters.nats.kv import stream_name
from workerset_admission.adapters.nats.source import JetStreamDiscoverySource
from workerset_admission.aio import cancel_and_wait
from workerset_admission.card.drain_record import BudgetRead
from workerset_admission.card.serving_record import BucketRead, RawEntry
from workerset_admission.errors import CredentialsRefused, Unreachable, UsageError, error_in_words
from workerset_admission.keys import DRAIN_PREFIX, ENDPOINT_PREFIX, MODEL_PREFIX, key_matches

__all__ = ["NatsDrainStore"]

# How long one request (a listing, a write) may take before the store reports NATS as away.
_REQUEST_TIMEOUT = 5.0
# A subject sequence no key of a stream can be at: a write expecting it is never stored.
_NO_REVISION = str(2**62)
# JetStream's error code for a write whose expected last subject sequence did not match.
_WRONG_LAST_SEQUENCE = 10071
# JetStream's error code for a per-key TTL on a stream that does not allow one.
_TTL_DISABLED = 10166


class NatsDrainStore:
    """Reads and writes what a drain needs, over one NATS connection."""

    def __init__(
        self,
        options: NatsConnectOptions,
        discovery_bucket: str,
        admission_bucket: str,
        *,
        progress: Callable[[str], None] = lambda line: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._options = options
        self._discovery = discovery_bucket
        self._admission = admission_bucket
        self._progress = progress
        self._clock = clock
        self._client: NatsClient | None = None
        # What the server refused, as nats-py reports it (a refused publish is not answered).
        self._violations: list[str] = []
        # The stream refused a per-key TTL once: budgets are written without from then on.
        self._no_ttl = False

    async def open(self, deadline: float) -> None:
        """Connect, trying again until the clock passes ``deadline``; raise ``Unreachable``."""
        servers = servers_for_display(self._options.servers)
        told = False
        while True:
            try:
                self._client = await asyncio.wait_for(
                    connect(
                        self._options,
                        ConnectionCallbacks(error=self._on_error),
                        allow_reconnect=True,
                    ),
                    timeout=_REQUEST_TIMEOUT,
                )
            except (OSError, NatsError, asyncio.TimeoutError) as error:
                if self._clock() >= deadline:
                    raise Unreachable(
                        f"cannot reach NATS at {servers}: "
                        f"{error_in_words(error, timeout=_REQUEST_TIMEOUT)}"
                    ) from None
                if not told:
                    self._progress(
                        f"waiting for NATS at {servers} "
                        f"({error_in_words(error, timeout=_REQUEST_TIMEOUT)})"
                    )
                    told = True
                await asyncio.sleep(0.5)
                continue
            if told:
                self._progress(f"NATS at {servers} answers again")
            return

    async def _on_error(self, error: Exception) -> None:
        if "permissions violation" in str(error).lower():
            self._violations.append(str(error))

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    def _nc(self) -> NatsClient:
        if self._client is None:
            raise UsageError("the drain store is not open")
        return self._client

    async def _list(self, bucket: str, prefixes: tuple[str, ...] | None) -> list[RawEntry]:
        self._nc()  # only an open store reads

        async def fresh(_callbacks: ConnectionCallbacks) -> NatsClient:
            # A listing closes the connection it is given when it is done: its own, then.
            return await connect(self._options, allow_reconnect=False)

        source = JetStreamDiscoverySource(bucket=bucket, key_prefixes=prefixes, connector=fresh)
        listing = await asyncio.wait_for(source.list_all(), timeout=_REQUEST_TIMEOUT)
        return [RawEntry(e.key, e.value, e.published_at) for e in listing.entries]

    async def workers_listing(self) -> list[tuple[str, bytes]]:
        """Every model and endpoint record of the discovery bucket, by key."""
        try:
            entries = await self._list(
                self._discovery, (MODEL_PREFIX.rstrip("."), ENDPOINT_PREFIX.rstrip("."))
            )
        except NotFoundError:
            raise UsageError(f"there is no discovery bucket {self._discovery!r}") from None
        return [(e.key, e.value) for e in entries]

    async def drains(self) -> list[tuple[str, bytes]]:
        """Every drain record of the discovery bucket, by key."""
        entries = await self._list(self._discovery, (DRAIN_PREFIX.rstrip("."),))
        return [(e.key, e.value) for e in entries]

    async def serving(self, filters: Sequence[str] | None = None) -> BucketRead:
        """Read the serving-admission bucket (the keys ``filters`` name, when given).

        ``problem`` says why it could not be read.
        """
        if filters is not None:
            try:
                found = await read_keys(self._nc(), self._admission, filters, _REQUEST_TIMEOUT)
                return BucketRead(entries=tuple(found))
            except NotFoundError:
                return BucketRead()
            except BadRequestError:
                pass  # one filter per consumer only (before 2.10): read it whole, below
            except (OSError, NatsError, asyncio.TimeoutError) as error:
                problem = error_in_words(error)
                return BucketRead(problem=f"cannot read bucket {self._admission}: {problem}")
        try:
            entries = await self._list(self._admission, None)
        except NotFoundError:
            return BucketRead()  # no frontend has published: none routes to anything
        except (OSError, NatsError, asyncio.TimeoutError) as error:
            problem = error_in_words(error)
            return BucketRead(problem=f"cannot read bucket {self._admission}: {problem}")
        if filters is not None:
            entries = [e for e in entries if key_matches(e.key, filters)]
        return BucketRead(entries=tuple(entries))

    async def put(self, key: str, value: bytes, ttl: float | None) -> None:
        """Write a drain record; ``ttl`` (seconds) makes the server remove it then.

        A server or bucket that cannot keep a per-key TTL (before nats-server 2.11, or a
        bucket made without it) refuses the header: the record is then written without one,
        and it stays until it is withdrawn.
        """
        js = self._nc().jetstream()
        subject = f"$KV.{self._discovery}.{key}"
        try:
            if ttl is None:
                await js.publish(subject, value, timeout=_REQUEST_TIMEOUT)
                return
            try:
                await js.publish(subject, value, msg_ttl=ttl, timeout=_REQUEST_TIMEOUT)
            except APIError as error:
                # The server answered: it keeps no per-key TTL here (before 2.11, or a stream
                # made without it). A refused or lost publish is never answered.
                self._progress(f"the bucket keeps no per-key TTL ({error}); drain written without")
                await js.publish(subject, value, timeout=_REQUEST_TIMEOUT)
        except (NatsError, asyncio.TimeoutError):
            self._refused(key)
            raise

    def _refused(self, key: str) -> None:
        """Raise ``CredentialsRefused`` when the server refused the write (it never answers)."""
        if self._violations:
            raise CredentialsRefused(
                f"NATS refused to store {key} ({self._violations[-1]}); this user may drain the "
                "namespaces its permissions name only (docs/security.md)"
            ) from None

    async def may_write(self, key: str) -> None:
        """Raise ``CredentialsRefused`` unless this user may write ``key``; store nothing.

        The write expects a revision no key is at: a user allowed to write the key is answered
        "wrong last sequence"; a user who is not is refused by the server, which says so on the
        connection's error callback (the publish itself is never answered).
        """
        js = self._nc().jetstream()
        subject = f"$KV.{self._discovery}.{key}"
        headers = {"Nats-Expected-Last-Subject-Sequence": _NO_REVISION}
        known = len(self._violations)
        publish = asyncio.ensure_future(
            js.publish(subject, b"", timeout=_REQUEST_TIMEOUT, headers=headers)
        )
        answered = False
        try:
            while not publish.done():
                if any(subject in v for v in self._violations[known:]):
                    break
                await asyncio.wait({publish}, timeout=0.02)
            answered = publish.done()
        finally:
            # Refused (never answered) or stopped: the publish ends here, not after this call.
            await cancel_and_wait([publish])
        # Read however it ended, so nothing of it is left unread; only an answer counts.
        error = None if publish.cancelled() else publish.exception()
        if answered and not publish.cancelled():
            if isinstance(error, APIError) and error.err_code == _WRONG_LAST_SEQUENCE:
                return
            if error is None:
                # Stored: a server that ignores the header. Nothing can be tried without writing.
                raise UsageError(
                    f"the server stored a write that expected revision {_NO_REVISION} of {key}: "
                    "it cannot check a revision, and drains cannot be made atomic on it"
                )
        if len(self._violations) > known:
            raise CredentialsRefused(
                f"NATS refused this user the write of {key} ({self._violations[-1]}); nothing "
                "was drained: this user may drain the namespaces its permissions name only "
                "(docs/security.md)"
            )
        raise Unreachable(f"NATS did not answer a write of {key} in time; nothing was drained")

    async def budget(self, key: str) -> BudgetRead:
        """Read a drain budget record: its revision, value, and the server's time of it.

        A record withdrawn or expired leaves a marker whose revision a swap must expect.
        """
        js = self._nc().jetstream(timeout=_REQUEST_TIMEOUT)
        try:
            msg = await js.get_msg(stream_name(self._discovery), subject=self._subject(key))
        except NotFoundError:
            return BudgetRead()
        headers = msg.headers or {}
        if headers.get("KV-Operation") in ("DEL", "PURGE") or headers.get("Nats-Marker-Reason"):
            return BudgetRead(revision=msg.seq)
        return BudgetRead(revision=msg.seq, raw=msg.data, stored_at=_stored_at(msg))

    async def server_time(self) -> float | None:
        """Return the NATS server's time now (Unix seconds), from a stream info answer."""
        return await read_server_time(self._nc(), self._discovery, _REQUEST_TIMEOUT)

    def _subject(self, key: str) -> str:
        return f"$KV.{self._discovery}.{key}"

    async def swap_budget(
        self, key: str, value: bytes, revision: int | None, ttl: float | None
    ) -> bool:
        """Write a budget record only if it is still at ``revision`` (None: there never was one).

        ``ttl``: the server removes it that long after this write (a bucket or server that keeps
        no per-key TTL refuses the header: written without, its entries still lapse by the
        server's time). Returns False when another write moved it first.
        """
        js = self._nc().jetstream()
        subject = self._subject(key)

        def expecting() -> dict[str, str]:
            # A fresh dict each time: nats-py adds its TTL header to the one it is given.
            return {"Nats-Expected-Last-Subject-Sequence": str(revision or 0)}

        try:
            if ttl is not None and not self._no_ttl:
                try:
                    await js.publish(
                        subject, value, timeout=_REQUEST_TIMEOUT, headers=expecting(), msg_ttl=ttl
                    )
                except APIError as error:
                    if error.err_code != _TTL_DISABLED:
                        raise
                    # The server answered: this stream keeps no per-key TTL.
                    self._no_ttl = True
                    self._progress(
                        f"the bucket keeps no per-key TTL ({error}); budgets written without"
                    )
                else:
                    return True
            await js.publish(subject, value, timeout=_REQUEST_TIMEOUT, headers=expecting())
        except APIError as error:
            if error.err_code == _WRONG_LAST_SEQUENCE:
                return False
            raise
        except (NatsError, asyncio.TimeoutError):
            self._refused(key)
            raise
        return True

    async def delete(self, key: str) -> bool:
        """Withdraw a drain record; return whether there was one."""
        kv = await self._nc().jetstream(timeout=_REQUEST_TIMEOUT).key_value(self._discovery)
        try:
            await kv.get(key)
        except NotFoundError:
            return False
        try:
            await kv.delete(key)
        except (NatsError, asyncio.TimeoutError):
            self._refused(key)
            raise
        return True


def _stored_at(msg: RawStreamMsg) -> float | None:
    """When the server stored a message, by its clock (nats-py parses the answer's ``time``)."""
    stamp: object = msg.time
    if stamp is None:
        stamp = (msg.headers or {}).get("Nats-Time-Stamp")  # a direct get's answer
    if isinstance(stamp, datetime):
        return stamp.timestamp()
    if isinstance(stamp, str):
        return parse_server_time(stamp)
    return None
