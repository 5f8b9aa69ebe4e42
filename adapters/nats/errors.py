"""The NATS client's error base, for commands that report a transport failure."""

from __future__ import annotations

import asyncio

from nats.errors import Error as NatsError
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import NoStreamResponseError, ServiceUnavailableError

__all__ = [
    "REQUEST_FAILURES",
    "NatsError",
    "NatsTimeoutError",
    "NoRespondersError",
    "is_unavailable_for_now",
]

# What a request to the server (a publish, a KV or JetStream API call) ends with when it fails:
# the client's own errors (every JetStream error among them: a refusal, no stream, a timeout, a
# closed connection), the socket's, a timeout of an ``asyncio.wait_for`` around it, and a reply
# that is not the JSON the client decodes (``ValueError``).
REQUEST_FAILURES: tuple[type[Exception], ...] = (
    NatsError,
    OSError,
    asyncio.TimeoutError,
    ValueError,
)


def is_unavailable_for_now(error: BaseException) -> bool:
    """Whether a JetStream request failed the way it does while a stream has no leader.

    During a cluster's leader election (a node died, a majority came back) a publish or an
    API request times out, finds no responder, or is answered 503 (JetStream temporarily
    unavailable) for a few seconds; the same request a little later succeeds.
    """
    return isinstance(
        error,
        (NatsTimeoutError, NoRespondersError, NoStreamResponseError, ServiceUnavailableError),
    )
