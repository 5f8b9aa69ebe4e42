"""Read Dynamo's etcd store through aetcd: one prefix listed at one revision, then watched.

aetcd (asyncio, gRPC) speaks etcd's v3 API and handles user/password authentication itself; it
opens only plaintext channels, so for ``https://`` endpoints this module gives it a TLS channel
(CA bundle, and a client certificate and key for mutual TLS) built with gRPC's own credentials.
Several endpoints are tried in turn: after a failure the next connection goes to the next one.
Every aetcd or gRPC failure leaves here as :class:`StoreUnavailable` or :class:`StoreCompacted`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aetcd  # type: ignore[import-untyped,unused-ignore]
import aetcd.exceptions  # type: ignore[import-untyped,unused-ignore]
import grpc  # type: ignore[import-untyped,unused-ignore]
from aetcd import rpc  # type: ignore[import-untyped,unused-ignore]
from workerset_admission.adapters.etcd.bridge import StoreChange, StoreEntry, StoreListing
from workerset_admission.discovery_paths import EtcdEndpoint, parse_endpoints
from workerset_admission.errors import (
    ConfigError,
    StoreCompacted,
    StoreUnavailable,
    error_in_words,
)
from workerset_admission.settings import Settings

__all__ = ["AetcdStoreReader", "EtcdOptions", "etcd_options"]

# A listing of many thousand cards is one Range response; gRPC's default 4 MiB cap is too small.
_MAX_MESSAGE_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class EtcdOptions:
    """How to reach etcd: endpoints, and optionally TLS files and a user with a password."""

    endpoints: tuple[EtcdEndpoint, ...]
    user: str | None = None
    password: str | None = None
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    # Seconds for one request (a listing, a watch creation); a watch itself has no deadline.
    timeout: float = 10.0

    def credentials(self) -> grpc.ChannelCredentials:
        """TLS credentials from the configured files (the system's CAs when none is given)."""

        def read(path: Path | None) -> bytes | None:
            if path is None:
                return None
            try:
                return path.read_bytes()
            except OSError as exc:
                raise ConfigError(f"etcd TLS file {path}: cannot be read ({exc.strerror})") from exc

        return grpc.ssl_channel_credentials(
            root_certificates=read(self.ca_file),
            private_key=read(self.key_file),
            certificate_chain=read(self.cert_file),
        )


def etcd_options(settings: Settings) -> EtcdOptions:
    """Build the options to reach the etcd the settings name."""
    return EtcdOptions(
        endpoints=parse_endpoints(settings.etcd_endpoints),
        user=settings.etcd_user,
        password=settings.etcd_password.get_secret_value() if settings.etcd_password else None,
        ca_file=settings.etcd_tls_ca_file,
        cert_file=settings.etcd_tls_cert_file,
        key_file=settings.etcd_tls_key_file,
    )


class _Client(aetcd.Client):  # type: ignore[misc]
    """aetcd's client, over a TLS channel when credentials are given."""

    def __init__(
        self, host: str, port: int, credentials: grpc.ChannelCredentials | None, **kwargs: Any
    ) -> None:
        super().__init__(host, port, **kwargs)
        self._channel_credentials = credentials

    async def connect(self) -> None:
        if self._channel_credentials is None:
            await super().connect()
            return
        # aetcd builds its stubs on ``rpc.insecure_channel``; hand it a secure one instead and
        # let its own connect() do the rest (authentication, stubs, the watcher).
        original = rpc.insecure_channel
        credentials = self._channel_credentials

        def secure(target: str, options: Any = None) -> grpc.aio.Channel:
            # Put the original back at once: connect() makes its channel before its first await,
            # so no other client ever sees the replacement.
            rpc.insecure_channel = original
            return grpc.aio.secure_channel(target, credentials, options=options)

        rpc.insecure_channel = secure
        try:
            await super().connect()
        finally:
            rpc.insecure_channel = original


def _unavailable(exc: BaseException) -> StoreUnavailable:
    if isinstance(exc, aetcd.exceptions.UnauthenticatedError):
        return StoreUnavailable(f"etcd refused the credentials: {exc}")
    text = str(exc).strip() or error_in_words(exc)
    return StoreUnavailable(f"etcd: {text.splitlines()[0]}")


# What a lost or refused connection looks like from aetcd and gRPC.
_FAILURES = (aetcd.exceptions.ClientError, grpc.aio.AioRpcError, OSError, asyncio.TimeoutError)


class AetcdStoreReader:
    """:class:`~workerset_admission.adapters.etcd.bridge.StoreReader` over aetcd."""

    def __init__(self, options: EtcdOptions) -> None:
        self._options = options
        self._credentials = (
            options.credentials() if any(e.secure for e in options.endpoints) else None
        )
        self._next = 0
        self._client: _Client | None = None
        self.endpoint: EtcdEndpoint = options.endpoints[0]

    async def _connected(self) -> _Client:
        if self._client is None:
            endpoint = self._options.endpoints[self._next % len(self._options.endpoints)]
            self._next += 1
            client = _Client(
                endpoint.host,
                endpoint.port,
                self._credentials if endpoint.secure else None,
                username=self._options.user,
                password=self._options.password,
                timeout=self._options.timeout,
                options={
                    "grpc.max_receive_message_length": _MAX_MESSAGE_BYTES,
                    "grpc.enable_retries": 0,
                },
            )
            self.endpoint = endpoint
            try:
                await asyncio.wait_for(client.connect(), timeout=self._options.timeout)
            except _FAILURES as exc:
                await self._close(client)
                raise _unavailable(exc) from exc
            self._client = client
        return self._client

    async def list_prefix(self, prefix: str) -> StoreListing:
        client = await self._connected()
        try:
            result = await client.get_prefix(prefix.encode())
        except _FAILURES as exc:
            raise _unavailable(exc) from exc
        entries = tuple(
            StoreEntry(kv.key.decode("utf-8", "replace"), kv.value, kv.create_revision)
            for kv in result.kvs
        )
        return StoreListing(revision=result.header.revision, entries=entries)

    async def watch_prefix(self, prefix: str, start_revision: int) -> AsyncIterator[StoreChange]:
        client = await self._connected()
        try:
            watch = await client.watch_prefix(prefix.encode(), start_revision=start_revision)
        except aetcd.exceptions.RevisionCompactedError as exc:
            raise StoreCompacted(exc.compacted_revision) from exc
        except _FAILURES as exc:
            raise _unavailable(exc) from exc
        try:
            async for event in watch:
                kv = event.kv
                yield StoreChange(
                    key=kv.key.decode("utf-8", "replace"),
                    value=kv.value if event.kind == "PUT" else None,
                    revision=kv.mod_revision,
                )
        except aetcd.exceptions.RevisionCompactedError as exc:
            raise StoreCompacted(exc.compacted_revision) from exc
        except _FAILURES as exc:
            raise _unavailable(exc) from exc
        finally:
            await _quietly(watch.cancel())

    async def probe(self) -> None:
        client = await self._connected()
        try:
            # Status is answered by the member itself; the client's timeout is its deadline.
            await asyncio.wait_for(client.status(), timeout=self._options.timeout)
        except _FAILURES as exc:
            raise _unavailable(exc) from exc

    async def reset(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await self._close(client)

    async def close(self) -> None:
        await self.reset()

    async def _close(self, client: _Client) -> None:
        await _quietly(client.close())


# What closing a channel or a watch that already failed ends with: the store's failures, and
# gRPC's word for a call or channel already finished or broken.
_CLOSE_FAILURES = (*_FAILURES, grpc.aio.UsageError, grpc.aio.InternalError)


async def _quietly(closing: Any) -> None:
    # Closing a connection that already failed may fail again; it is gone either way.
    try:
        await asyncio.wait_for(closing, timeout=2.0)
    except _CLOSE_FAILURES:
        return
