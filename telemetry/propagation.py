"""W3C trace context carried in NATS message headers, both ways.

Publishers call :func:`inject_headers` and put the result on the KV put; the frontend turns the
headers of the entry it applies into a span link, so one trace shows a worker registering and
the frontend deciding about it. Both go through the globally configured propagator
(``OTEL_PROPAGATORS``, W3C trace context and baggage by default).
"""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from workerset_admission.telemetry.guard import guarded

__all__ = ["inject_headers", "link_from_headers"]


def inject_headers(context: Context | None = None) -> dict[str, str]:
    """Return the headers that carry ``context`` (the current one by default) to a consumer.

    Empty when there is no active, valid span; never raises.
    """
    carrier: dict[str, str] = {}
    # Telemetry must never break a publisher: the propagators are the environment's choice.
    with guarded("trace context injection", "the message goes without trace context"):
        propagate.inject(carrier, context=context)
        return carrier
    return {}


def link_from_headers(
    headers: Mapping[str, str] | None,
) -> trace.Link | None:
    """Return a span link to the producer's span named by ``headers``, or None if none.

    Malformed headers give None: a worker's bad trace context is not the frontend's problem.
    """
    if not headers:
        return None
    producer = None
    with guarded("trace context extraction", "the entry is applied without a span link"):
        producer = trace.get_current_span(propagate.extract(headers)).get_span_context()
    if producer is None or not producer.is_valid:
        return None
    return trace.Link(producer)
