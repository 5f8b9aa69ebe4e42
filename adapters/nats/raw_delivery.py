"""A nats-py client that can hand a subscription's messages to a plain function, unwrapped.

nats-py delivers each message of a subscription as a ``Msg`` object, through the
subscription's asyncio queue and its delivery task, with one coroutine per message; for a
watch that reads tens of thousands of small records in a burst that costs about as much as
everything the service then does with them. :class:`RawDeliveryClient` lets one subscription
register a synchronous handler that gets the subject, reply subject, payload and parsed
headers straight from the protocol parser. Everything else (connecting, reconnecting, other
subscriptions, requests) is nats-py's own, unchanged.

It overrides two methods that nats-py keeps private, ``_process_msg`` and ``_process_headers``;
:data:`RAW_DELIVERY` says whether the installed nats-py has them in the shape relied on. When
it does not, :meth:`RawDeliveryClient.deliver_raw` refuses and the caller keeps nats-py's
ordinary callback path.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Final

from nats.aio.client import Client as NatsClient
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsError
from nats.protocol.parser import ERR_RE

__all__ = ["RAW_DELIVERY", "RawDeliveryClient", "RawHandler"]

# subject, reply subject (b"" when none), payload, headers (None when none) -> something to
# await before the next message is parsed, or None.
RawHandler = Callable[[bytes, bytes, bytes, "dict[str, str] | None"], "Awaitable[None] | None"]


def _shape_is_known() -> bool:
    try:
        process = NatsClient._process_msg
        headers = NatsClient._process_headers
        parameters = list(inspect.signature(process).parameters)
        header_parameters = list(inspect.signature(headers).parameters)
    except (AttributeError, TypeError, ValueError):
        return False
    return (
        inspect.iscoroutinefunction(process)
        and inspect.iscoroutinefunction(headers)
        and parameters == ["self", "sid", "subject", "reply", "data", "headers"]
        and header_parameters == ["self", "headers"]
    )


RAW_DELIVERY: Final = _shape_is_known()


class RawDeliveryClient(NatsClient):
    """nats-py's client, plus subscriptions whose messages skip ``Msg`` and the queue."""

    def __init__(self) -> None:
        super().__init__()
        self._raw_handlers: dict[int, RawHandler] = {}

    def deliver_raw(self, subscription: Subscription, handler: RawHandler) -> bool:
        """Send ``subscription``'s messages to ``handler``; False if this nats-py cannot."""
        sid = getattr(subscription, "_id", None)
        if not RAW_DELIVERY or not isinstance(sid, int):
            return False
        self._raw_handlers[sid] = handler
        return True

    def stop_raw(self, subscription: Subscription) -> None:
        """Stop sending ``subscription``'s messages to its handler (later ones are dropped)."""
        self._raw_handlers.pop(getattr(subscription, "_id", None), None)  # type: ignore[arg-type]

    async def _process_msg(
        self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes | None
    ) -> None:
        handler = self._raw_handlers.get(sid)
        if handler is None:
            # nats-py's parser passes None for a message without headers, whatever its hint says.
            await super()._process_msg(sid, subject, reply, data, headers)  # type: ignore[arg-type]
            return
        stats = self.stats
        stats["in_msgs"] += 1
        stats["in_bytes"] += len(data)
        parsed = await self._process_headers(headers) if headers else None
        follow_up = handler(subject, reply, data, parsed)
        if follow_up is not None:
            await follow_up

    async def _process_err(self, err_msg: str) -> None:
        # nats-py's parser lowers the case of every -ERR line before it gets here, so the
        # subject a permission refusal names would be told wrong ("$js.api..."): the line is
        # read again, as the server sent it, from the parser's buffer (still unconsumed here).
        if "permissions violation" not in err_msg:
            await super()._process_err(err_msg)
            return
        parser = getattr(self, "_ps", None)
        found = ERR_RE.match(bytes(getattr(parser, "buf", b"")))
        text = err_msg
        if found is not None and found.group(1):
            original = found.group(1).decode("utf-8", "replace").strip("'")
            if original.lower() == err_msg.strip("'"):
                text = original
        error = NatsError(f"nats: {text.strip(chr(39))}")
        self._err = error
        await self._error_cb(error)
