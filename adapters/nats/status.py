"""The status responder over NATS request/reply: a running service answers ``status``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

__all__ = ["DEFAULT_STATUS_SUBJECT", "NatsStatusResponder"]

_log = logging.getLogger(__name__)

DEFAULT_STATUS_SUBJECT = "workerset-admission.status"


class NatsStatusResponder:
    """A :class:`StatusResponder` over NATS request/reply on one subject."""

    def __init__(self, nc: Any, subject: str = DEFAULT_STATUS_SUBJECT) -> None:
        self._nc = nc
        self.subject = subject

    async def serve(self, render: Callable[[bool], bytes]) -> None:
        nc = self._nc

        async def on_request(msg: Any) -> None:
            if not msg.reply:
                return
            try:
                body = render(False)
                if len(body) > nc.max_payload:
                    body = render(True)
                await msg.respond(body)
            except Exception:
                _log.warning("could not answer a status request", exc_info=True)

        subscription = await nc.subscribe(self.subject, cb=on_request)
        try:
            await asyncio.Event().wait()
        finally:
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()
