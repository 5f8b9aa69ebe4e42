"""The one object the service talks to for traces, metrics and the rejected-cohort ERROR log.

Theory of operation
-------------------
The service applies discovery updates one at a time. Each goes through
:meth:`AdmissionTelemetry.apply_update`, a context manager that opens the
``apply discovery_update`` span (linked to the worker's own trace when the entry's headers carry
W3C trace context), lets the service record the decision, and on exit counts the update and the
publish-to-admission latency. The core's effects for that update go through
:meth:`AdmissionTelemetry.effects`, which turns rejections into ERROR logs, span events and a
counter, and commits, withdrawals and successions into short child spans. Builds run inside
:meth:`AdmissionTelemetry.build_attempt`. Gauges read a state summary the service supplies
through :meth:`AdmissionTelemetry.observe_state` only when a metric reader collects.

Only the OpenTelemetry API is used: without an SDK every instrument is a no-op and no
per-update span is made at all. Per-update spans can be switched off (``trace_updates=False``)
or sampled by the SDK's sampler, and update counts are kept in a dict the SDK reads only when it
collects: at tens of thousands of updates a second, even a cheap SDK call per update is a
measurable share of the work (``integration/bench/bench_telemetry_overhead.py``).

Every public method swallows its own failures: telemetry that breaks admission would be worse
than no telemetry.

Effects are the core's frozen dataclasses, dispatched on their exact type. The import goes one
way only: the core never imports telemetry.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Final

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from .. import __version__
from ..admission import effects as fx
from ..identity import GroupKey
from ..ports import DiscoveryEntry, SourceDelete, SourcePut, SourceSnapshot
from . import names as n
from .propagation import link_from_headers

__all__ = [
    "AdmissionStateSummary",
    "AdmissionTelemetry",
    "BuildScope",
    "UpdateScope",
    "decision_of",
]

_log = logging.getLogger(__name__)

# Lots of snapshot entries may carry trace context; a handful of links already shows where
# the snapshot came from, and backends cap links per span anyway.
_MAX_SNAPSHOT_LINKS: Final = 16
_LATENCY_BUCKETS: Final = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
_PLACEHOLDERS: Final = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
_SDK_RECHECK_EVERY: Final = 1024
_MAX_CACHED_GROUP_IDS: Final = 4096
# Enough latency samples for a faithful histogram at a cost that stays well under 1% of a core.
_LATENCY_RECORDS_PER_SECOND: Final = 1000
_BUILD_BUCKETS: Final = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)

MUTATION_REFUSED: Final = "mutation_refused"
"""The invalid-record reason counted for a registration key re-sent with another identity."""

DEFAULT_DECISION: Final = "unchanged"
"""The decision counted for an update whose scope never had a decision: it changed nothing.

Every update is counted once, under exactly one decision, so the decisions of an operation sum
to its updates: admitted, rejected, removed, refused, updated, unchanged, reconciled, liveness
(an endpoint-instance record), event (an event source or channel), ignored (outside the
namespace filter), invalid, error.
"""


@dataclass(frozen=True, slots=True)
class AdmissionStateSummary:
    """What the gauges report: groups per status, and the workers admitted across all groups."""

    groups_by_status: Mapping[str, int] = field(default_factory=dict)
    admitted_workers: int = 0
    # Groups whose tenure is held after an outage (their incumbent has no live member).
    held_groups: int = 0


def _group_id(group: object) -> str:
    """Return a group's id for attributes: Dynamo's compact JSON id for a GroupKey, else str."""
    group_id = getattr(group, "id", None)
    return group_id if isinstance(group_id, str) else str(group)


class UpdateScope:
    """One discovery update (or snapshot) being applied; returned by ``apply_update``.

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
        telemetry: AdmissionTelemetry,
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
            try:
                span.set_attribute(n.ATTR_DECISION, decision)
                if group is not None:
                    span.set_attribute(n.ATTR_GROUP, self._telemetry.group_id(group))
            except Exception:
                _log.debug("could not record the decision", exc_info=True)

    def effects(self, effects: Sequence[object]) -> None:
        """Report the core's effects for this update and take the decision from them.

        A decision recorded explicitly before wins over the one the effects imply.
        """
        if self._decision == DEFAULT_DECISION:
            try:
                if self._operation == "snapshot":
                    # One listing touches many groups; no single decision describes it.
                    self.record_decision("reconciled" if effects else "unchanged")
                else:
                    decision, group = decision_of(effects)
                    self.record_decision(decision, group)
            except Exception:
                _log.debug("could not derive the decision", exc_info=True)
        if effects:
            self._telemetry.effects(effects)

    def invalid_record(self, reason: str, detail: str = "", key: str | None = None) -> None:
        """Report the update's record as refused (see ``AdmissionTelemetry.invalid_record``)."""
        self._decision = "invalid"
        self._telemetry.invalid_record(
            key if key is not None else self._key, reason, detail, span=self._span
        )

    def __enter__(self) -> UpdateScope:
        if self._span is not None:
            try:
                self._token = otel_context.attach(trace.set_span_in_context(self._span))
            except Exception:
                _log.debug("could not activate the update span", exc_info=True)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if exc is not None:
                self._decision = "error"
            self._telemetry._count_update(self._operation, self._decision, self._published_at)
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
        except Exception:
            _log.debug("could not close the update span", exc_info=True)


class BuildScope:
    """One pipeline build attempt; returned by ``build_attempt`` and used as a context manager.

    The outcome is ``ok`` when the block ends normally, ``cancelled`` when it is cancelled,
    ``failed`` (with ``error.type``) when it raises; ``set_outcome`` overrides it, for a build
    that reports failure without raising.
    """

    __slots__ = ("_attrs", "_error_type", "_outcome", "_span", "_started", "_telemetry", "_token")

    def __init__(self, telemetry: AdmissionTelemetry, attrs: dict[str, Any]) -> None:
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
        try:
            self._span = self._telemetry.tracer.start_span(
                n.SPAN_BUILD, kind=SpanKind.INTERNAL, attributes=self._attrs
            )
            self._token = otel_context.attach(trace.set_span_in_context(self._span))
        except Exception:
            _log.debug("could not start the build span", exc_info=True)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            outcome, error_type = self._outcome, self._error_type
            if exc is not None and outcome is None:
                # CancelledError is a BaseException: a cancelled build is not a failed one.
                cancelled = type(exc).__name__ == "CancelledError"
                outcome = "cancelled" if cancelled else "failed"
                error_type = None if cancelled else type(exc).__qualname__
            outcome = outcome or "ok"
            self._telemetry._count_build(outcome, time.perf_counter() - self._started)
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
        except Exception:
            _log.debug("could not close the build span", exc_info=True)


class AdmissionTelemetry:
    """Traces, metrics and the rejected-cohort ERROR log for one admission service.

    ``tracer_provider`` and ``meter_provider`` default to the global ones (no-ops until an SDK
    is installed, for example by ``setup_telemetry``). ``bucket`` names the discovery bucket in
    ``messaging.destination.name``. ``rejection_logger`` receives the ERROR records.
    ``trace_updates=False`` skips the per-update span (counts and latency are still recorded);
    with it on, the SDK's sampler (``OTEL_TRACES_SAMPLER``) decides which updates are kept.
    """

    def __init__(
        self,
        *,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
        bucket: str = "dynamo-discovery",
        trace_updates: bool = True,
        rejection_logger: logging.Logger | None = None,
    ) -> None:
        self.trace_updates = trace_updates
        self.bucket = bucket
        # An explicit provider is used as given; the global one is checked for an SDK.
        self._sdk_seen = tracer_provider is not None
        self._sdk_check_countdown = 1
        self.tracer = trace.get_tracer(
            n.INSTRUMENTATION_NAME, __version__, tracer_provider=tracer_provider
        )
        meter = metrics.get_meter(
            n.INSTRUMENTATION_NAME, __version__, meter_provider=meter_provider
        )
        self._rejection_log = rejection_logger or logging.getLogger(f"{n.PREFIX}.admission")
        self._state: Callable[[], AdmissionStateSummary] | None = None
        self._group_ids: dict[object, str] = {}
        self._update_counts: dict[tuple[str, str], int] = {}
        self._update_labels: dict[tuple[str, str], dict[str, str]] = {}
        self._latency_seen = 0
        self._latency_stride = 1
        self._latency_window_start = time.time()
        self._latency_window_seen = 0

        meter.create_observable_counter(
            n.METRIC_UPDATES,
            callbacks=[self._observe_updates],
            unit="{update}",
            description="Discovery updates applied, by operation and decision.",
        )
        self._invalid = meter.create_counter(
            n.METRIC_INVALID_RECORDS,
            unit="{record}",
            description="Discovery records refused at the boundary, by reason.",
        )
        self._rejected = meter.create_counter(
            n.METRIC_REJECTED_COHORTS,
            unit="{cohort}",
            description="Cohorts newly rejected because their checksum differs from the incumbent.",
        )
        self._successions = meter.create_counter(
            n.METRIC_SUCCESSIONS,
            unit="{succession}",
            description="WorkerSets whose incumbent cohort emptied and was succeeded.",
        )
        self._builds = meter.create_counter(
            n.METRIC_BUILDS, unit="{build}", description="Pipeline build attempts, by outcome."
        )
        self._build_duration = meter.create_histogram(
            n.METRIC_BUILD_DURATION,
            unit="s",
            description="Duration of pipeline build attempts.",
            explicit_bucket_boundaries_advisory=_BUILD_BUCKETS,
        )
        self._latency = meter.create_histogram(
            n.METRIC_ADMISSION_LATENCY,
            unit="s",
            description="Time from the server storing a discovery record to its being applied.",
            explicit_bucket_boundaries_advisory=_LATENCY_BUCKETS,
        )
        meter.create_observable_gauge(
            n.METRIC_GROUPS,
            callbacks=[self._observe_groups],
            unit="{group}",
            description="WorkerSet groups, by admission status.",
        )
        meter.create_observable_gauge(
            n.METRIC_GROUPS_HELD,
            callbacks=[self._observe_held],
            unit="{group}",
            description="WorkerSet groups whose tenure is held after a discovery outage.",
        )
        meter.create_observable_gauge(
            n.METRIC_WORKERS_ADMITTED,
            callbacks=[self._observe_admitted],
            unit="{worker}",
            description="Workers currently admitted for routing, across all groups.",
        )

    # --- discovery updates -------------------------------------------------------------------

    def apply_update(
        self, event: SourcePut | SourceDelete | SourceSnapshot | DiscoveryEntry
    ) -> UpdateScope:
        """Return a context manager around applying one discovery event: an UpdateScope."""
        key = ""
        published_at: float | None = None
        span: Span | None = None
        try:
            if isinstance(event, SourceSnapshot):
                operation = "snapshot"
                if self._tracing_updates():
                    span = self._snapshot_span(event)
            else:
                if isinstance(event, SourceDelete):
                    operation = event.operation
                    key, revision, headers = event.key, event.revision, event.headers
                else:
                    entry = event.entry if isinstance(event, SourcePut) else event
                    operation = "put"
                    key, revision, headers = entry.key, entry.revision, entry.headers
                    published_at = entry.published_at
                if self._tracing_updates():
                    span = self._update_span(operation, key, revision, headers)
        except Exception:
            # Something not shaped like a discovery event: count it, trace nothing.
            _log.debug("unrecognized discovery event %r", type(event), exc_info=True)
            operation = "unknown"
        return UpdateScope(self, operation, key, published_at, span)

    def _tracing_updates(self) -> bool:
        if not self.trace_updates:
            return False
        if self._sdk_seen:
            return True
        # Without any SDK (the global provider is still the API's placeholder) a span would be
        # a no-op that still costs microseconds per update, so none is made. A host may install
        # its SDK later, and that cannot be undone: look again now and then, and once it is
        # there, stop looking (the lookup reads the environment, too slow for every update).
        self._sdk_check_countdown -= 1
        if self._sdk_check_countdown > 0:
            return False
        self._sdk_check_countdown = _SDK_RECHECK_EVERY
        self._sdk_seen = not isinstance(trace.get_tracer_provider(), _PLACEHOLDERS)
        return self._sdk_seen

    def _messaging_attributes(self, operation: str) -> dict[str, Any]:
        return {
            n.ATTR_MESSAGING_SYSTEM: "nats",
            n.ATTR_MESSAGING_DESTINATION: self.bucket,
            n.ATTR_MESSAGING_OPERATION_TYPE: "process",
            n.ATTR_DISCOVERY_OPERATION: operation,
        }

    def _update_span(
        self, operation: str, key: str, revision: int, headers: Mapping[str, str] | None
    ) -> Span:
        attrs = self._messaging_attributes(operation)
        attrs[n.ATTR_DISCOVERY_KEY] = key
        attrs[n.ATTR_DISCOVERY_REVISION] = revision
        link = link_from_headers(headers) if headers else None
        return self.tracer.start_span(
            n.SPAN_APPLY_UPDATE,
            kind=SpanKind.CONSUMER,
            attributes=attrs,
            links=(link,) if link is not None else (),
        )

    def _snapshot_span(self, snapshot: SourceSnapshot) -> Span:
        attrs = self._messaging_attributes("snapshot")
        attrs[n.ATTR_SNAPSHOT_ENTRIES] = len(snapshot.entries)
        attrs[n.ATTR_SNAPSHOT_REASON] = snapshot.reason
        links: list[trace.Link] = []
        for entry in snapshot.entries:
            link = link_from_headers(entry.headers)
            if link is not None:
                links.append(link)
                if len(links) >= _MAX_SNAPSHOT_LINKS:
                    break
        return self.tracer.start_span(
            n.SPAN_APPLY_SNAPSHOT, kind=SpanKind.CONSUMER, attributes=attrs, links=links
        )

    def group_id(self, group: object) -> str:
        """Return a group's id for attributes, remembering it: a GroupKey's id is JSON work."""
        ids = self._group_ids
        found = ids.get(group)
        if found is None:
            if len(ids) >= _MAX_CACHED_GROUP_IDS:
                ids.clear()  # groups come and go; a bounded cache beats an exact one
            found = ids[group] = _group_id(group)
        return found

    def invalid_record(
        self, key: str, reason: str, detail: str = "", *, span: Span | None = None
    ) -> None:
        """Count a refused record by reason and note it on the current (or given) span."""
        try:
            self._invalid.add(1, {n.LABEL_REASON: reason})
            target = span if span is not None else trace.get_current_span()
            if target.is_recording():
                target.add_event(
                    n.EVENT_INVALID_RECORD,
                    {n.ATTR_DISCOVERY_KEY: key, n.ATTR_REASON: reason, n.ATTR_DETAIL: detail},
                )
            _log.debug("invalid discovery record %s: %s %s", key, reason, detail)
        except Exception:
            _log.debug("could not report an invalid record", exc_info=True)

    def _count_update(self, operation: str, decision: str, published_at: float | None) -> None:
        # Plain dict arithmetic here; the SDK sees the totals only when a reader collects, which
        # keeps a per-update SDK call (several microseconds each) off the hot path.
        counts = self._update_counts
        combo = (operation, decision)
        counts[combo] = counts.get(combo, 0) + 1
        if published_at is not None:
            self._sample_latency(published_at)

    def _sample_latency(self, published_at: float) -> None:
        # Under a burst only every ``stride``-th update is timed, spread evenly through the burst,
        # so recording stays near _LATENCY_RECORDS_PER_SECOND whatever the update rate.
        self._latency_seen += 1
        if self._latency_seen % self._latency_stride:
            return
        now = time.time()
        # The server's clock and ours differ a little; a negative age means "just now".
        self._latency.record(max(0.0, now - published_at))
        elapsed = now - self._latency_window_start
        # A short window, so the stride catches up with a burst within a tenth of a second.
        if elapsed >= 0.1:
            rate = (self._latency_seen - self._latency_window_seen) / elapsed
            self._latency_stride = max(1, math.ceil(rate / _LATENCY_RECORDS_PER_SECOND))
            self._latency_window_start = now
            self._latency_window_seen = self._latency_seen

    def _observe_updates(self, _options: CallbackOptions) -> Iterable[Observation]:
        observations = []
        for (operation, decision), count in self._update_counts.copy().items():
            labels = self._update_labels.get((operation, decision))
            if labels is None:
                labels = {n.LABEL_OPERATION: operation, n.LABEL_DECISION: decision}
                self._update_labels[(operation, decision)] = labels
            observations.append(Observation(count, labels))
        return observations

    # --- builds -------------------------------------------------------------------------------

    def build_attempt(
        self, group: object, checksum: str, generation: int, attempt: int = 1
    ) -> BuildScope:
        """Return a context manager around one build attempt (a :class:`BuildScope`)."""
        attrs: dict[str, Any] = {}
        try:
            attrs = {
                n.ATTR_GROUP: self.group_id(group),
                n.ATTR_CHECKSUM: checksum,
                n.ATTR_GENERATION: int(generation),
                n.ATTR_BUILD_ATTEMPT: int(attempt),
            }
        except Exception:
            _log.debug("unusable build attributes", exc_info=True)
        return BuildScope(self, attrs)

    def _count_build(self, outcome: str, seconds: float) -> None:
        labels = {n.LABEL_OUTCOME: outcome}
        self._builds.add(1, labels)
        self._build_duration.record(seconds, labels)

    # --- the core's effects -------------------------------------------------------------------

    def effects(self, effects: Iterable[object]) -> None:
        """Report what the core decided, one effect at a time.

        Rejections, invalid records, commits, withdrawals and successions are reported; other
        kinds (build requests, publications) are the service's to carry out, not to report.
        """
        for effect in effects:
            self._effect(effect)

    def _effect(self, effect: object) -> None:
        try:
            handler = _HANDLERS.get(type(effect))
            if handler is not None:
                handler(self, effect)
        except Exception:
            _log.debug("could not report effect %r", type(effect), exc_info=True)

    def cohort_rejected(
        self,
        *,
        model: str,
        worker_set: str,
        incumbent_checksum: str,
        rejected_checksum: str,
        instance: str,
    ) -> None:
        """Log one newly rejected cohort at ERROR, note it on the current span, and count it.

        The core already suppresses unchanged repeats; every call here is logged.
        """
        try:
            fields = {
                "model": model,
                "worker_set": worker_set,
                "incumbent_checksum": incumbent_checksum,
                "rejected_checksum": rejected_checksum,
                "instance": instance,
            }
            # The host forwards only the message text, so every field is in it as well.
            self._rejection_log.error(
                "rejected cohort: model=%s worker_set=%s incumbent_checksum=%s "
                "rejected_checksum=%s instance=%s (its configuration differs from the "
                "incumbent's; it is tracked but not admitted)",
                model,
                worker_set,
                incumbent_checksum,
                rejected_checksum,
                instance,
                extra=fields,
            )
            self._rejected.add(1, {n.LABEL_MODEL: model})
            span = trace.get_current_span()
            if span.is_recording():
                span.add_event(
                    n.EVENT_COHORT_REJECTED,
                    {
                        n.ATTR_MODEL: model,
                        n.ATTR_WORKER_SET: worker_set,
                        n.ATTR_INCUMBENT_CHECKSUM: incumbent_checksum,
                        n.ATTR_REJECTED_CHECKSUM: rejected_checksum,
                        n.ATTR_INSTANCE: instance,
                    },
                )
        except Exception:
            _log.debug("could not report a rejected cohort", exc_info=True)

    def group_committed(self, group: object, checksum: str, generation: int) -> None:
        """Mark a group's build committed for routing, with a short span."""
        self._instant_span(
            n.SPAN_COMMIT,
            {
                n.ATTR_GROUP: self.group_id(group),
                n.ATTR_CHECKSUM: checksum,
                n.ATTR_GENERATION: generation,
            },
        )

    def group_withdrawn(self, group: object, checksum: str | None, generation: int | None) -> None:
        """Mark a committed group taken out of routing, with a short span."""
        attrs: dict[str, Any] = {n.ATTR_GROUP: self.group_id(group)}
        if checksum is not None:
            attrs[n.ATTR_CHECKSUM] = checksum
        if generation is not None:
            attrs[n.ATTR_GENERATION] = generation
        self._instant_span(n.SPAN_WITHDRAW, attrs)

    def succession(
        self,
        group: object,
        old_checksum: str | None,
        new_checksum: str | None,
        old_generation: int | None,
        new_generation: int | None,
    ) -> None:
        """Mark a WorkerSet whose incumbent cohort drained with a short span; count it if succeeded.

        ``new_checksum`` is None when no cohort was left to take over.
        """
        sides = {
            n.ATTR_OLD_CHECKSUM: old_checksum,
            n.ATTR_NEW_CHECKSUM: new_checksum,
            n.ATTR_OLD_GENERATION: old_generation,
            n.ATTR_NEW_GENERATION: new_generation,
        }
        attrs: dict[str, Any] = {n.ATTR_GROUP: self.group_id(group)}
        attrs.update({key: value for key, value in sides.items() if value is not None})
        model = getattr(group, "model", None)
        try:
            if new_checksum is not None:
                _log.warning(
                    "succession in %s: incumbent %s drained, %s takes over with generation %s",
                    attrs[n.ATTR_GROUP],
                    old_checksum,
                    new_checksum,
                    new_generation,
                )
        except Exception:
            _log.debug("could not log a succession", exc_info=True)
        if new_checksum is not None:
            # A group whose last worker left has no successor: that is a withdrawal, not a
            # succession, and counting it would make every scale-to-zero look like an update.
            try:
                self._successions.add(1, {n.LABEL_MODEL: str(model)} if model is not None else {})
            except Exception:
                _log.debug("could not count a succession", exc_info=True)
        self._instant_span(n.SPAN_SUCCEED, attrs)

    def tenure_held(
        self, group: object, checksum: str, generation: int | None, deadline: float
    ) -> None:
        """Log and mark a tenure held after an outage: its incumbent has no member listed."""
        group_id = self.group_id(group)
        try:
            _log.warning(
                "holding the tenure of %s (incumbent %s) after a discovery outage: none of its "
                "workers is listed; nothing is admitted until one registers again or the hold "
                "ends at clock %.1f",
                group_id,
                checksum,
                deadline,
            )
        except Exception:
            _log.debug("could not log a held tenure", exc_info=True)
        attrs: dict[str, Any] = {
            n.ATTR_GROUP: group_id,
            n.ATTR_CHECKSUM: checksum,
            n.ATTR_HOLD_DEADLINE: float(deadline),
        }
        if generation is not None:
            attrs[n.ATTR_GENERATION] = generation
        self._instant_span(n.SPAN_HOLD, attrs)

    def tenure_hold_ended(
        self, group: object, checksum: str, outcome: str, held_for: float
    ) -> None:
        """Log and mark the end of a hold: a member came back, or it ran out (succession next)."""
        group_id = self.group_id(group)
        try:
            if outcome == "expired":
                _log.warning(
                    "the hold of %s ended after %.1f s with no worker of incumbent %s back: "
                    "the succession follows",
                    group_id,
                    held_for,
                    checksum,
                )
            else:
                _log.info(
                    "a worker of incumbent %s registered again after %.1f s: %s keeps its tenure",
                    checksum,
                    held_for,
                    group_id,
                )
        except Exception:
            _log.debug("could not log the end of a hold", exc_info=True)
        self._instant_span(
            n.SPAN_HOLD,
            {
                n.ATTR_GROUP: group_id,
                n.ATTR_CHECKSUM: checksum,
                n.ATTR_HOLD_OUTCOME: outcome,
                n.ATTR_HOLD_DURATION: float(held_for),
            },
        )

    def retry_scheduled(
        self,
        group: object,
        checksum: str,
        generation: int,
        attempt: int,
        delay: float,
        error: str,
    ) -> None:
        """Note on the current span that a failed build will be retried after ``delay`` s."""
        try:
            span = trace.get_current_span()
            if span.is_recording():
                span.add_event(
                    n.EVENT_RETRY_SCHEDULED,
                    {
                        n.ATTR_GROUP: self.group_id(group),
                        n.ATTR_CHECKSUM: checksum,
                        n.ATTR_GENERATION: generation,
                        n.ATTR_BUILD_ATTEMPT: attempt,
                        n.ATTR_RETRY_DELAY: float(delay),
                        n.ATTR_DETAIL: error,
                    },
                )
        except Exception:
            _log.debug("could not report a retry", exc_info=True)

    def _instant_span(self, name: str, attrs: dict[str, Any]) -> None:
        try:
            span = self.tracer.start_span(name, kind=SpanKind.INTERNAL, attributes=attrs)
            span.end()
        except Exception:
            _log.debug("could not record span %s", name, exc_info=True)

    # --- gauges -------------------------------------------------------------------------------

    def observe_state(self, callback: Callable[[], AdmissionStateSummary]) -> None:
        """Set the function the gauges call, at collection time, for the current state."""
        self._state = callback

    def _summary(self) -> AdmissionStateSummary | None:
        if self._state is None:
            return None
        try:
            return self._state()
        except Exception:
            _log.debug("the state callback failed", exc_info=True)
            return None

    def _observe_groups(self, _options: CallbackOptions) -> Iterable[Observation]:
        summary = self._summary()
        if summary is None:
            return []
        counts = dict.fromkeys(n.GROUP_STATUSES, 0)
        counts.update(summary.groups_by_status)
        return [Observation(count, {n.LABEL_STATUS: status}) for status, count in counts.items()]

    def _observe_held(self, _options: CallbackOptions) -> Iterable[Observation]:
        summary = self._summary()
        return [] if summary is None else [Observation(summary.held_groups)]

    def _observe_admitted(self, _options: CallbackOptions) -> Iterable[Observation]:
        summary = self._summary()
        return [] if summary is None else [Observation(summary.admitted_workers)]


# --- effect dispatch ----------------------------------------------------------------------------


def _on_rejection(telemetry: AdmissionTelemetry, effect: fx.RejectionReported) -> None:
    telemetry.cohort_rejected(
        model=effect.model,
        worker_set=effect.worker_set,
        incumbent_checksum=effect.incumbent_checksum,
        rejected_checksum=effect.rejected_checksum,
        instance=effect.instance,
    )


def _on_mutation(telemetry: AdmissionTelemetry, effect: fx.MutationRefused) -> None:
    telemetry.invalid_record(
        effect.key,
        MUTATION_REFUSED,
        f"{effect.reason}: kept {effect.kept_group.id} {effect.kept_checksum}, "
        f"offered {effect.offered_group.id} {effect.offered_checksum}",
    )


def _on_commit(telemetry: AdmissionTelemetry, effect: fx.CommitGroup) -> None:
    telemetry.group_committed(effect.group, effect.mdc_checksum, effect.generation)


def _on_withdraw(telemetry: AdmissionTelemetry, effect: fx.WithdrawGroup) -> None:
    telemetry.group_withdrawn(effect.group, effect.mdc_checksum, effect.generation)


def _on_succession(telemetry: AdmissionTelemetry, effect: fx.Succession) -> None:
    telemetry.succession(
        effect.group,
        effect.old_checksum,
        effect.new_checksum,
        effect.old_generation,
        effect.new_generation,
    )


def _on_held(telemetry: AdmissionTelemetry, effect: fx.TenureHeld) -> None:
    telemetry.tenure_held(effect.group, effect.mdc_checksum, effect.generation, effect.deadline)


def _on_hold_ended(telemetry: AdmissionTelemetry, effect: fx.TenureHoldEnded) -> None:
    telemetry.tenure_hold_ended(effect.group, effect.mdc_checksum, effect.outcome, effect.held_for)


def _on_retry(telemetry: AdmissionTelemetry, effect: fx.RetryScheduled) -> None:
    telemetry.retry_scheduled(
        effect.group,
        effect.mdc_checksum,
        effect.generation,
        effect.attempt,
        effect.delay,
        effect.error,
    )


# The effects worth reporting; the others (receivers, publications, build requests) are the
# service's to carry out and show up in the spans of the work they cause.
_HANDLERS: Final[dict[type, Callable[[AdmissionTelemetry, Any], None]]] = {
    fx.RejectionReported: _on_rejection,
    fx.MutationRefused: _on_mutation,
    fx.CommitGroup: _on_commit,
    fx.WithdrawGroup: _on_withdraw,
    fx.Succession: _on_succession,
    fx.TenureHeld: _on_held,
    fx.TenureHoldEnded: _on_hold_ended,
    fx.RetryScheduled: _on_retry,
}


def decision_of(effects: Sequence[object]) -> tuple[str, GroupKey | None]:
    """Summarize what the core's effects say about the one update that caused them.

    ``admitted`` or ``rejected`` for a registration placed in the incumbent or another cohort,
    ``removed`` for a departure, ``refused`` for a refused in-place change, ``updated`` for
    any other change, ``unchanged`` for a duplicate.
    """
    for effect in effects:
        if isinstance(effect, fx.WorkerPlaced):
            return ("admitted" if effect.admitted else "rejected"), effect.group
        if isinstance(effect, fx.WorkerDeparted):
            return "removed", effect.group
        if isinstance(effect, fx.MutationRefused):
            return "refused", effect.kept_group
    return ("updated" if effects else "unchanged"), None
