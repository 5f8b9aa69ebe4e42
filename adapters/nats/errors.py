"""The NATS client's error base, for commands that report a transport failure."""

from __future__ import annotations

from nats.errors import Error as NatsError
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

__all__ = ["NatsError", "NatsTimeoutError", "NoRespondersError"]
