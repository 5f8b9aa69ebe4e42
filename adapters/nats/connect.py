"""One way to open a nats-py connection from settings: credentials, TLS, reconnect forever."""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import ssl
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from nats.aio.client import Client as NatsClient
from nats.aio.client import ReconnectToServerHandler, Server
from nats.errors import AuthorizationError
from nats.errors import Error as NatsError
from workerset_admission.adapters.nats.raw_delivery import RawDeliveryClient
from workerset_admission.errors import (
    ConfigError,
    CredentialsRefused,
    PermissionRefused,
    Unreachable,
    error_in_words,
    wire_text,
)
from workerset_admission.settings import Settings, mask_url

__all__ = [
    "DEFAULT_SERVERS",
    "ConnectionCallbacks",
    "NatsConnectOptions",
    "connect",
    "connect_options",
    "mask_url",
    "permission_refusal",
    "probe_bucket",
    "refusal_mark",
    "servers_for_display",
    "servers_from_text",
    "unless_refused",
]

DEFAULT_SERVERS: tuple[str, ...] = ("nats://127.0.0.1:4222",)
_CLOSE_TIMEOUT = 1.0
# How long a stopped connection attempt may take to notice the stop before it is told again.
_RECANCEL_INTERVAL = 0.05

ErrorCallback = Callable[[Exception], Awaitable[None]]
_T = TypeVar("_T")


def connect_options(
    settings: Settings, servers: Sequence[str] | None = None, *, client_name: str | None = None
) -> NatsConnectOptions:
    """Build the connect options the settings describe (``servers`` overrides theirs).

    The connection is named ``client_name``, or else after the frontend's identity (what a
    frontend's connections are told apart by in the server's monitoring).
    """
    chosen = tuple(servers) if servers is not None else settings.nats_servers
    return NatsConnectOptions(
        servers=chosen,
        name=client_name or f"workerset-admission {settings.frontend_id}",
        user=settings.nats_user,
        password=settings.nats_password.get_secret_value() if settings.nats_password else None,
        token=settings.nats_token.get_secret_value() if settings.nats_token else None,
        nkey_seed_file=settings.nats_nkey_seed_file,
        creds_file=settings.nats_creds_file,
        tls_ca_file=settings.nats_tls_ca_file,
        tls_cert_file=settings.nats_tls_cert_file,
        tls_key_file=settings.nats_tls_key_file,
        tls_hostname=settings.nats_tls_hostname,
        inbox_prefix=settings.nats_inbox_prefix,
    )


def servers_for_display(servers: Sequence[str]) -> str:
    """Join server URLs for a message, each masked by :func:`mask_url`."""
    return ", ".join(mask_url(url) for url in servers)


EventCallback = Callable[[], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class NatsConnectOptions:
    """How to reach and authenticate to NATS. Secrets are excluded from ``repr``."""

    servers: tuple[str, ...] = DEFAULT_SERVERS
    name: str | None = None
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    nkey_seed_file: Path | None = None
    nkey_seed: str | None = field(default=None, repr=False)
    creds_file: Path | None = None
    tls_ca_file: Path | None = None
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    tls_hostname: str | None = None
    inbox_prefix: str = "_INBOX"
    connect_timeout: float = 2.0
    reconnect_wait: float = 0.5
    max_reconnect_wait: float = 5.0
    ping_interval: float = 20.0

    def __post_init__(self) -> None:
        if not self.servers:
            raise ConfigError("nats servers: at least one URL is required")
        if (self.user is None) != (self.password is None):
            raise ConfigError("nats user and password must be given together")
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ConfigError("nats TLS client certificate and key must be given together")
        if self.nkey_seed is not None and self.nkey_seed_file is not None:
            raise ConfigError("give the nkey seed either inline or as a file, not both")

    @property
    def uses_tls(self) -> bool:
        return (
            self.tls_ca_file is not None
            or self.tls_cert_file is not None
            or any(s.startswith("tls://") for s in self.servers)
        )

    def tls_context(self) -> ssl.SSLContext | None:
        """Build the client TLS context, or ``None`` when TLS is not configured."""
        if not self.uses_tls:
            return None
        try:
            context = ssl.create_default_context(
                cafile=str(self.tls_ca_file) if self.tls_ca_file else None
            )
            if self.tls_cert_file is not None and self.tls_key_file is not None:
                context.load_cert_chain(str(self.tls_cert_file), str(self.tls_key_file))
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"nats TLS files could not be loaded: {exc}") from exc
        return context


@dataclass(frozen=True, slots=True)
class ConnectionCallbacks:
    """Connection lifecycle hooks; nats-py requires coroutine functions."""

    error: ErrorCallback | None = None
    disconnected: EventCallback | None = None
    reconnected: EventCallback | None = None
    closed: EventCallback | None = None


async def _quiet_error(_exc: Exception) -> None:
    # nats-py's default error callback logs at ERROR for every refused reconnect attempt; the
    # owner decides what is worth reporting.
    return None


def _backoff_handler(options: NatsConnectOptions) -> ReconnectToServerHandler:
    """Pick the least-tried server and wait exponentially longer after each refused attempt."""

    def choose(servers: list[Server], _info: dict[str, Any]) -> tuple[Server | None, float]:
        if not servers:
            return None, options.reconnect_wait
        server = min(servers, key=lambda s: s.reconnects)
        exponent = min(server.reconnects, 16)
        delay = min(options.max_reconnect_wait, options.reconnect_wait * (2**exponent))
        # Jitter spreads a fleet of frontends reconnecting to a restarted server.
        return server, delay * (0.5 + random.random() / 2)

    return choose


async def connect(
    options: NatsConnectOptions,
    callbacks: ConnectionCallbacks | None = None,
    *,
    allow_reconnect: bool = True,
    first_attempts: int = 2,
) -> NatsClient:
    """Connect with the configured credentials; once connected, reconnect forever.

    The first connection tries each server ``first_attempts`` times and then raises, so a
    caller with a wrong URL or a server that is down hears about it instead of hanging (with
    an unlimited count nats-py would retry the first connection forever).
    """
    if first_attempts < 1:
        raise ConfigError("first_attempts must be at least 1")
    callbacks = callbacks or ConnectionCallbacks()
    # nats-py reports a refused login to the error callback and then retries; what the first
    # connection finally raises is "no servers available", which would hide the cause.
    refusals: list[Exception] = []
    kwargs: dict[str, Any] = {
        "servers": list(options.servers),
        "connect_timeout": options.connect_timeout,
        "allow_reconnect": allow_reconnect,
        # nats-py discards a server after more than this many failures; 0 would mean "never".
        "max_reconnect_attempts": max(1, first_attempts - 1),
        "reconnect_time_wait": options.reconnect_wait,
        "ping_interval": options.ping_interval,
        "error_cb": _noting_refusals(callbacks.error or _quiet_error, refusals),
        "reconnect_to_server_handler": _backoff_handler(options),
    }
    if options.name:
        kwargs["name"] = options.name
    if options.inbox_prefix != "_INBOX":
        kwargs["inbox_prefix"] = options.inbox_prefix
    if callbacks.disconnected is not None:
        kwargs["disconnected_cb"] = callbacks.disconnected
    if callbacks.reconnected is not None:
        kwargs["reconnected_cb"] = callbacks.reconnected
    if callbacks.closed is not None:
        kwargs["closed_cb"] = callbacks.closed
    if options.user is not None:
        kwargs["user"] = options.user
        kwargs["password"] = options.password
    if options.token is not None:
        kwargs["token"] = options.token
    if options.nkey_seed_file is not None:
        kwargs["nkeys_seed"] = str(options.nkey_seed_file)
    if options.nkey_seed is not None:
        kwargs["nkeys_seed_str"] = options.nkey_seed
    if options.creds_file is not None:
        kwargs["user_credentials"] = str(options.creds_file)
    tls = options.tls_context()
    if tls is not None:
        kwargs["tls"] = tls
        if options.tls_hostname:
            kwargs["tls_hostname"] = options.tls_hostname
    client = RawDeliveryClient()
    # The handshake runs as a task of its own so that a stop always reaches this frame: before
    # Python 3.12 each of nats-py's handshake steps is an ``asyncio.wait_for``, which drops a
    # cancel that lands as the step completes; nats-py then finishes connecting and hands a
    # live connection to a caller that has gone (inside another ``wait_for``, that connection
    # is dropped with its sockets open).
    attempt = asyncio.ensure_future(client.connect(**kwargs))
    connected = False
    try:
        await asyncio.wait({attempt})
        attempt.result()
        # Connected: from now on a lost connection is retried forever (nats-py reads this
        # option at every reconnect).
        client.options["max_reconnect_attempts"] = -1
        connected = True
    except (NatsError, OSError, asyncio.TimeoutError) as error:
        if _refused(error) or refusals:
            raise CredentialsRefused(
                f"NATS at {servers_for_display(options.servers)} refused the credentials "
                f"({refusals[-1] if refusals else error}): check the NATS user and password, "
                "token, nkey seed or credentials file"
            ) from None
        raise
    finally:
        if not connected:  # failed, refused or stopped: no socket of it stays open
            await _abandon(client, attempt)
    return client


# What the server says when it refuses a login (nats-py raises its plain ``Error`` for some).
_REFUSALS = ("authorization violation", "authentication")


def _refused(error: BaseException) -> bool:
    """Tell whether the server refused the credentials (not whether it could be reached)."""
    if isinstance(error, AuthorizationError):
        return True
    text = str(error).lower()
    return isinstance(error, NatsError) and any(refusal in text for refusal in _REFUSALS)


def _noting_refusals(owner: ErrorCallback, refusals: list[Exception]) -> ErrorCallback:
    """Wrap the owner's error callback so a refused login or permission is remembered.

    A refused publish or subscription is never answered: what the command then sees is a
    timeout. Remembered here, :func:`permission_refusal` can say what really happened.
    """

    async def on_error(error: Exception) -> None:
        if _refused(error):
            refusals.append(error)
        found = _PERMISSION_VIOLATION.search(str(error))
        if found is not None and not found.group(2).startswith(_OPTIONAL_SUBSCRIPTIONS):
            _REFUSED_HERE.count += 1
            _REFUSED_HERE.last = (found.group(1).lower(), found.group(2))
            for waiter in _REFUSAL_WAITERS:
                if not waiter.done():
                    waiter.set_result(None)
        await owner(error)

    return on_error


# What nats-server says, as nats-py passes it on: ``permissions violation for publish to
# "<subject>"`` (or ``for subscription to``).
_PERMISSION_VIOLATION = re.compile(
    r'permissions violation for (publish|subscription) to "([^"]*)"', re.IGNORECASE
)
# Subscriptions a user may lack without harm: the source then notices a deleted consumer later.
_OPTIONAL_SUBSCRIPTIONS = ("$JS.EVENT.ADVISORY.",)


class _Refused:
    """How many permissions the server refused this process, and the last (kind, subject)."""

    count = 0
    last: tuple[str, str] | None = None


# One command per process: what its connections were refused is the command's.
_REFUSED_HERE = _Refused()
# The calls of :func:`unless_refused` waiting now, each woken by the next refusal.
_REFUSAL_WAITERS: set[asyncio.Future[None]] = set()


def refusal_mark() -> int:
    """How many permission refusals this process has heard of so far (for ``since``)."""
    return _REFUSED_HERE.count


def permission_refusal(since: int = 0) -> PermissionRefused | None:
    """Return the last permission the server refused this process's connections, as an error.

    Only refusals heard of after ``since`` (a :func:`refusal_mark`) count.
    """
    if _REFUSED_HERE.count <= since or _REFUSED_HERE.last is None:
        return None
    kind, subject = _REFUSED_HERE.last
    subject = wire_text(subject)
    hint = (
        "set nats_inbox_prefix to the prefix this user may subscribe to"
        if kind == "subscription"
        else "this user's permissions do not name it"
    )
    return PermissionRefused(
        f'NATS refused this user the {kind} to "{subject}": {hint} (docs/security.md lists '
        "the rights each command needs)",
        subject,
    )


async def unless_refused(work: Awaitable[_T], since: int) -> _T:
    """Await ``work``, unless the server refuses this process a permission meanwhile.

    A refused request is never answered (the refusal comes on the connection, not as the
    reply), so ``work`` would wait out its whole timeout; a refusal heard after ``since`` (a
    :func:`refusal_mark`) cancels it at once and is raised instead. Only for work that cannot
    succeed once refused: a read on a connection of its own.
    """
    task = asyncio.ensure_future(work)
    heard: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    _REFUSAL_WAITERS.add(heard)
    try:
        if permission_refusal(since) is None:
            await asyncio.wait((task, heard), return_when=asyncio.FIRST_COMPLETED)
        refusal = None if task.done() else permission_refusal(since)
        if refusal is not None:
            raise refusal
        return await task
    finally:
        _REFUSAL_WAITERS.discard(heard)
        heard.cancel()
        # Not awaited: a caller cancelled meanwhile must see its own cancellation, not this
        # one's end; whatever the abandoned work ends with is read, so nothing is logged of it.
        task.cancel()
        task.add_done_callback(lambda ended: ended.cancelled() or ended.exception())


async def _abandon(client: NatsClient, attempt: asyncio.Future[None]) -> None:
    """End a stopped or refused connection attempt and close every socket it opened.

    Bounded, and carried to the end even when the caller is cancelled again meanwhile; the
    caller raises its own exception right after.
    """
    ending = asyncio.ensure_future(_end_attempt(client, attempt))
    while not ending.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(ending)


async def _end_attempt(client: NatsClient, attempt: asyncio.Future[None]) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _CLOSE_TIMEOUT
    while not attempt.done() and loop.time() < deadline:
        attempt.cancel()
        # A cancel lost in one of nats-py's handshake steps (see connect) leaves the attempt
        # waiting at its next step, where the next cancel reaches it.
        await asyncio.wait({attempt}, timeout=_RECANCEL_INTERVAL)
    if attempt.done() and not attempt.cancelled():
        # Read, so it is not reported as never retrieved: the caller raises its own error.
        attempt.exception()
    # Scheduled before the sockets go, so the client is marked closed before its reader could
    # see the connection end and start a reconnect.
    closing = asyncio.ensure_future(client.close())
    _abort_sockets(client)
    await asyncio.wait({closing}, timeout=_CLOSE_TIMEOUT)
    if not closing.done():
        closing.cancel()
    elif not closing.cancelled():
        closing.exception()


def _abort_sockets(client: NatsClient) -> None:
    """Close the client's sockets at once, with no TLS goodbye, and take them from the client.

    nats-py's ``close`` alone falls short for an abandoned attempt: one stopped inside its
    retry loop's own cleanup is already marked closed, so ``close`` does nothing; and one
    stopped in the TLS handshake waits forever for the plain stream, whose protocol the
    handshake had replaced, to report itself closed.
    """
    transport = getattr(client, "_transport", None)
    if transport is None:
        return
    # nats-py's TCP transport keeps the plain stream and, once upgraded, the TLS stream over it.
    streams = [getattr(transport, name, None) for name in ("_io_writer", "_bare_io_writer")]
    aborted = False
    for stream in streams:
        if isinstance(stream, asyncio.StreamWriter):
            stream.transport.abort()
            aborted = True
    if aborted:
        client._transport = None
    else:
        # Another transport (websocket): its own close is all there is.
        with contextlib.suppress(OSError):
            transport.close()


async def probe_bucket(options: NatsConnectOptions, bucket: str, timeout: float = 10.0) -> None:
    """Check, once and bounded, that a server answers and holds ``bucket``.

    A command that then watches the bucket with a source that retries forever (``record``)
    says at once that nothing is there, instead of waiting in silence. Raises
    :class:`~workerset_admission.errors.Unreachable` for a server that does not answer and
    :class:`ConfigError` for a missing bucket.
    """
    from nats.errors import Error as NatsError
    from nats.js.errors import NotFoundError
    from workerset_admission.adapters.nats.kv import stream_name

    where = servers_for_display(options.servers)
    try:
        client = await asyncio.wait_for(connect(options, allow_reconnect=False), timeout)
    except asyncio.TimeoutError:
        raise Unreachable(f"no NATS server answered within {timeout:g} s: {where}") from None
    except (OSError, NatsError) as error:
        raise Unreachable(
            f"cannot connect to {where}: {error_in_words(error, timeout=timeout)}"
        ) from None
    try:
        await client.jetstream(timeout=timeout).stream_info(stream_name(bucket))
    except NotFoundError:
        raise ConfigError(f"there is no bucket {bucket!r} on {where}") from None
    finally:
        await client.close()


def servers_from_text(text: str | Sequence[str]) -> tuple[str, ...]:
    """Split a comma-separated server list (or pass a sequence through), dropping blanks."""
    parts = text.split(",") if isinstance(text, str) else list(text)
    return tuple(p.strip() for p in parts if p.strip())
