"""The status responder over NATS request/reply: a running service answers ``status``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from nats.errors import Error as NatsError
from workerset_admission.aio import off_loop
from workerset_admission.keys import STATUS_SUBJECT

__all__ = ["DEFAULT_STATUS_SUBJECT", "NatsStatusResponder", "fitted", "frontend_subject"]

_log = logging.getLogger(__name__)

DEFAULT_STATUS_SUBJECT = STATUS_SUBJECT


def frontend_subject(subject: str, frontend_id: str) -> str:
    """Name the subject only one frontend answers on: the shared one plus its escaped id."""
    from workerset_admission.keys import escape_token

    return f"{subject}.{escape_token(frontend_id)}"


# The most characters a summary keeps of any one text field (a frontend id, a health word).
_SUMMARY_TEXT = 200


def fitted(render: Callable[[bool], bytes], max_payload: int) -> bytes:
    """Return the fullest status reply that fits in one NATS message of ``max_payload`` bytes.

    The whole status first, then the brief one (counts for member lists), and when even that
    is too large (a fleet of very many groups), a summary: every plain field of the brief
    reply, each list as its length (``<name>_count``, the list itself left empty) and a
    ``truncated`` note. The summary's size depends on no input: a request is always answered.
    """
    body = render(False)
    if len(body) <= max_payload:
        return body
    brief = render(True)
    if len(brief) <= max_payload:
        return brief
    summary: dict[str, Any] = {}
    for name, value in json.loads(brief).items():
        if isinstance(value, list):
            summary[name] = []
            summary[f"{name}_count"] = len(value)
        elif isinstance(value, str):
            summary[name] = value[:_SUMMARY_TEXT]
        elif value is None or isinstance(value, (bool, int, float)):
            summary[name] = value
    summary["truncated"] = (
        f"the status is {len(body)} bytes ({len(brief)} brief), over this server's "
        f"max_payload of {max_payload}: lists are given as counts; read them from "
        "/workerset-admission/v1/workersets"
    )
    return json.dumps(summary, sort_keys=True).encode()


class NatsStatusResponder:
    """A :class:`StatusResponder` over NATS request/reply.

    It answers on the shared subject (any one frontend replies) and, given its frontend id, on
    that frontend's own subject too, so a tool can ask one frontend by name (``record``). The
    answer is rendered in a thread (``render`` must be safe to call from one), so the loop
    keeps turning while a large status is put together.
    """

    def __init__(
        self, nc: Any, subject: str = DEFAULT_STATUS_SUBJECT, frontend_id: str | None = None
    ) -> None:
        self._nc = nc
        self.subject = subject
        self.frontend_id = frontend_id

    async def serve(
        self, render: Callable[[bool], bytes], settle: Callable[[], Awaitable[object]]
    ) -> None:
        nc = self._nc

        async def on_request(msg: Any) -> None:
            if not msg.reply:
                return
            try:
                # Up to the request, then rendered in a thread: the loop turns meanwhile.
                await settle()
                body = await off_loop(lambda: fitted(render, nc.max_payload))
                await msg.respond(body)
            except Exception:
                # The status is the service's to render, whatever it holds; one request that
                # cannot be answered must not end the subscription that answers the next.
                _log.warning(
                    "could not answer a status request; the next one is answered afresh",
                    exc_info=True,
                )

        subjects = [self.subject]
        if self.frontend_id is not None:
            subjects.append(frontend_subject(self.subject, self.frontend_id))
        subscriptions = [await nc.subscribe(subject, cb=on_request) for subject in subjects]
        try:
            await asyncio.Event().wait()
        finally:
            for subscription in subscriptions:
                # Gone with a lost or closed connection, or unsubscribed already.
                with contextlib.suppress(NatsError, OSError):
                    await subscription.unsubscribe()
