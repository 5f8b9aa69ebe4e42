"""The context managers around one discovery update and one build attempt, and their spans."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import Any, Final, Protocol

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from workerset_admission.telemetry import names as n
from workerset_admission.telemetry.effect_reports import decision_of
from workerset_admission.telemetry.instruments import AdmissionInstruments

__all__ = ["DEFAULT_DECISION", "BuildScope", "UpdateScope"]


class _Telemetry(Protocol):
    """What a scope reports to: the telemetry facade, named as a shape (it imports this module)."""

    tracer: trace.Tracer
    _instruments: AdmissionInstruments
    # The update scope open now (entered, not yet exited): a step's effects are reported in it.
    current_update: UpdateScope | None

    def group_id(self, group: object) -> str: ...

    def effects(self, effects: Iterable[object]) -> None: ...

    def invalid_record(
        self, key: str, reason: str, detail: str = "", *, span: Span | None = None
    ) -> None: ...


DEFAULT_DECISION: Final = "unchanged"
"""The decision counted for an update whose scope never had a decision: it changed nothing.

Every update is counted once, under exactly one decision, so the decisions of an operation sum
to its updates: admitted, rejected, removed, refused, updated, unchanged, reconciled, liveness
(an endpoint-instance record), event (an event source or channel), ignored (outside the
namespace filter), invalid, error.
"""


class UpdateScope:
    """One discovery update (or listing) being applied; returned by ``apply_update``.

    Used as a context manager. ``record_decision`` may be called any number of times; the last
    call wins, since the service may learn the final decision only after the core's effects.
    """

    __slots__ = (
        "_decision",
        "_key",
        "_operation",
        "_published_at",
        "_span",
        "_telemetry",
        "_token",
    )

    def __init__(
        self,
        telemetry: _Telemetry,
        operation: str,
        key: str,
        published_at: float | None,
        span: Span | None,
    ) -> None:
        self._telemetry = telemetry
        self._operation = operation
        self._key = key
        self._decision = DEFAULT_DECISION
        self._published_at = published_at
        self._span = span
        self._token: object = None

    @property
    def span(self) -> Span:
        """The update's span (a non-recording one when update tracing is off)."""
        return self._span if self._span is not None else trace.INVALID_SPAN

    @property
    def operation(self) -> str:
        return self._operation

    @property
    def decision(self) -> str:
        return self._decision

    def record_decision(self, decision: str, group: object | None = None) -> None:
        """Say what the core decided about this update, and for which group."""
        self._decision = decision
        span = self._span
        # Attributes are built only for a span that keeps them: this runs for every update.
        if span is not None and span.is_recording():
            span.set_attribute(n.ATTR_DECISION, decision)
            if group is not None:
                span.set_attribute(n.ATTR_GROUP, self._telemetry.group_id(group))

    def effects(self, effects: Sequence[object]) -> None:
        """Report the core's effects for this update and take the decision from them.

        A decision recorded explicitly before wins over the one the effects imply.
        """
        if self._decision == DEFAULT_DECISION:
            if self._operation == "snapshot":
                # One listing touches many groups; no single decision describes it.
                self.record_decision("reconciled" if effects else "unchanged")
            else:
                decision, group = decision_of(effects)
                self.record_decision(decision, group)
        if effects:
            self._telemetry.effects(effects)

    def invalid_record(self, reason: str, detail: str = "", key: str | None = None) -> None:
        """Report the update's record as refused (see ``AdmissionTelemetry.invalid_record``)."""
        self._decision = "invalid"
        self._telemetry.invalid_record(
            key if key is not None else self._key, reason, detail, span=self._span
        )

    def __enter__(self) -> UpdateScope:
        self._telemetry.current_update = self
        if self._span is not None:
            self._token = otel_context.attach(trace.set_span_in_context(self._span))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._telemetry.current_update is self:
            self._telemetry.current_update = None
        if exc is not None:
            self._decision = "error"
        self._telemetry._instruments.count_update(
            self._operation, self._decision, self._published_at
        )
        span = self._span
        if span is not None:
            if exc is not None and span.is_recording():
                span.set_attribute(n.ATTR_DECISION, "error")
                span.set_attribute(n.ATTR_ERROR_TYPE, type(exc).__qualname__)
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, type(exc).__qualname__))
            if self._token is not None:
                otel_context.detach(self._token)  # type: ignore[arg-type]
                self._token = None
            span.end()


class BuildScope:
    """One pipeline build attempt; returned by ``build_attempt`` and used as a context manager.

    The outcome is ``ok`` when the block ends normally, ``cancelled`` when it is cancelled,
    ``failed`` (with ``error.type``) when it raises; ``set_outcome`` overrides it, for a build
    that reports failure without raising.
    """

    __slots__ = ("_attrs", "_error_type", "_outcome", "_span", "_started", "_telemetry", "_token")

    def __init__(self, telemetry: _Telemetry, attrs: dict[str, Any]) -> None:
        self._telemetry = telemetry
        self._attrs = attrs
        self._outcome: str | None = None
        self._error_type: str | None = None
        self._span: Span | None = None
        self._token: object = None
        self._started = 0.0

    @property
    def span(self) -> Span:
        return self._span if self._span is not None else trace.INVALID_SPAN

    def set_outcome(self, outcome: str, error_type: str | None = None) -> None:
        self._outcome = outcome
        self._error_type = error_type

    def __enter__(self) -> BuildScope:
        self._started = time.perf_counter()
        self._span = self._telemetry.tracer.start_span(
            n.SPAN_BUILD, kind=SpanKind.INTERNAL, attributes=self._attrs
        )
        self._token = otel_context.attach(trace.set_span_in_context(self._span))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        outcome, error_type = self._outcome, self._error_type
        if exc is not None and outcome is None:
            # CancelledError is a BaseException: a cancelled build is not a failed one.
            cancelled = type(exc).__name__ == "CancelledError"
            outcome = "cancelled" if cancelled else "failed"
            error_type = None if cancelled else type(exc).__qualname__
        outcome = outcome or "ok"
        self._telemetry._instruments.count_build(outcome, time.perf_counter() - self._started)
        span = self._span
        if span is not None:
            if span.is_recording():
                span.set_attribute(n.ATTR_BUILD_OUTCOME, outcome)
                if error_type is not None:
                    span.set_attribute(n.ATTR_ERROR_TYPE, error_type)
                    span.set_status(Status(StatusCode.ERROR, error_type))
                if isinstance(exc, Exception):
                    span.record_exception(exc)
            if self._token is not None:
                otel_context.detach(self._token)  # type: ignore[arg-type]
                self._token = None
            span.end()
