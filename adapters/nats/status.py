"""The status responder over NATS request/reply: a running service answers ``status``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from workerset_admission.keys import STATUS_SUBJECT

__all__ = ["DEFAULT_STATUS_SUBJECT", "NatsStatusResponder", "frontend_subject"]

_log = logging.getLogger(__name__)

DEFAULT_STATUS_SUBJECT = STATUS_SUBJECT


def frontend_subject(subject: str, frontend_id: str) -> str:
    """Name the subject only one frontend answers on: the shared one plus its escaped id."""
    from workerset_admission.keys import escape_token

    return f"{subject}.{escape_token(frontend_id)}"


class NatsStatusResponder:
    """A :class:`StatusResponder` over NATS request/reply.

    It answers on the shared subject (any one frontend replies) and, given its frontend id, on
    that frontend's own subject too, so a tool can ask one frontend by name (``record``).
    """

    def __init__(
        self, nc: Any, subject: str = DEFAULT_STATUS_SUBJECT, frontend_id: str | None = None
    ) -> None:
        self._nc = nc
        self.subject = subject
        self.frontend_id = frontend_id

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

        subjects = [self.subject]
        if self.frontend_id is not None:
            subjects.append(frontend_subject(self.subject, self.frontend_id))
        subscriptions = [await nc.subscribe(subject, cb=on_request) for subject in subjects]
        try:
            await asyncio.Event().wait()
        finally:
            for subscription in subscriptions:
                with contextlib.suppress(Exception):
                    await subscription.unsubscribe()
