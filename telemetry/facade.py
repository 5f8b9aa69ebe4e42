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

The pieces live beside this module: the update and build context managers in ``scopes``, the
instruments and their recording in ``instruments``, and the table of reported effects in
``effect_reports``. Every name they define for callers is importable from here as well.

Only the OpenTelemetry API is used: without an SDK every instrument is a no-op and no
per-update span is made at all. Per-update spans can be switched off (``trace_updates=False``)
or sampled by the SDK's sampler, and update counts are kept in a dict the SDK reads only when it
collects: at tens of thousands of updates a second, even a cheap SDK call per update is a
measurable share of the work (``integration/bench/bench_telemetry_overhead.py``).

Telemetry that breaks admission would be worse than no telemetry. The OpenTelemetry API never
raises; what this package adds is reported through one guarded place, the dispatch over effect
kinds in :meth:`AdmissionTelemetry.effects`, which logs a failing report at WARNING (once a
minute per kind of effect) and goes on. The service hands it every step's record
(:meth:`AdmissionTelemetry.heard`): it is one of the step's subscribers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Protocol

from opentelemetry import metrics, trace
from opentelemetry.trace import Span, SpanKind
from workerset_admission import __version__
from workerset_admission.card.differences import Difference, differences_json, summarize
from workerset_admission.errors import DETAIL_LIMIT, wire_text
from workerset_admission.keys import DISCOVERY_BUCKET
from workerset_admission.ports import DiscoveryEntry, SourceDelete, SourceListing, SourcePut
from workerset_admission.telemetry import names as n
from workerset_admission.telemetry.effect_reports import (
    EFFECT_HANDLERS,
    MUTATION_REFUSED,
    decision_of,
)
from workerset_admission.telemetry.guard import FailureGuard
from workerset_admission.telemetry.instruments import AdmissionInstruments, AdmissionStateSummary
from workerset_admission.telemetry.logs import named_for_hosts
from workerset_admission.telemetry.propagation import link_from_headers
from workerset_admission.telemetry.scopes import DEFAULT_DECISION, BuildScope, UpdateScope

if TYPE_CHECKING:
    from workerset_admission.telemetry.worker_state_page import PrometheusPage


class HeardCoreStep(Protocol):
    """One core step of a step's record, as telemetry reads it."""

    @property
    def made(self) -> object | None: ...

    @property
    def effects(self) -> Sequence[object]: ...


class HeardStep(Protocol):
    """A step's record as telemetry reads it (the service's ``StepRecord`` is one)."""

    @property
    def steps(self) -> Sequence[HeardCoreStep]: ...


__all__ = [
    "DEFAULT_DECISION",
    "MUTATION_REFUSED",
    "AdmissionStateSummary",
    "AdmissionTelemetry",
    "BuildScope",
    "UpdateScope",
    "decision_of",
]

_log = logging.getLogger(__name__)

# Lots of listing entries may carry trace context; a handful of links already shows where
# the listing came from, and backends cap links per span anyway.
_MAX_LISTING_LINKS: Final = 16
_PLACEHOLDERS: Final = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
_SDK_RECHECK_EVERY: Final = 1024
_MAX_CACHED_GROUP_IDS: Final = 4096


def _group_id(group: object) -> str:
    """Return a group's id for attributes: Dynamo's compact JSON id for a GroupKey, else str."""
    group_id = getattr(group, "id", None)
    return group_id if isinstance(group_id, str) else str(group)


class AdmissionTelemetry:
    """Traces, metrics and the rejected-cohort ERROR log for one admission service.

    ``tracer_provider`` and ``meter_provider`` default to the global ones (no-ops until an SDK
    is installed, for example by ``setup_telemetry``). ``bucket`` names the discovery bucket in
    ``messaging.destination.name``. ``rejection_logger`` receives the ERROR records.
    ``trace_updates=False`` skips the per-update span (counts and latency are still recorded);
    with it on, the SDK's sampler (``OTEL_TRACES_SAMPLER``) decides which updates are kept.
    ``prometheus_page`` is the endpoint ``setup_telemetry`` serves (``TelemetryHandle``): the
    per-worker state family is served there as kept text (``worker_state_page``).
    """

    def __init__(
        self,
        *,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
        bucket: str = DISCOVERY_BUCKET,
        trace_updates: bool = True,
        rejection_logger: logging.Logger | None = None,
        prometheus_page: PrometheusPage | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        self.trace_updates = trace_updates
        # Where successions, drains and holds are told (a tool running the core for an
        # answer of its own, such as a drain's check, hands one that tells nobody).
        self._log = logger or _log
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
        self._rejection_log = rejection_logger or named_for_hosts(
            logging.getLogger(f"{n.PREFIX}.admission")
        )
        self._group_ids: dict[object, str] = {}
        # When a report of each kind of effect last failed and was logged.
        self._guard = FailureGuard()
        # The update scope open now: the step ending inside it reports its effects there.
        self.current_update: UpdateScope | None = None
        self._instruments = AdmissionInstruments(meter, prometheus_page)

    # --- discovery updates -------------------------------------------------------------------

    def apply_update(
        self, event: SourcePut | SourceDelete | SourceListing | DiscoveryEntry
    ) -> UpdateScope:
        """Return a context manager around applying one discovery event: an UpdateScope."""
        key = ""
        published_at: float | None = None
        span: Span | None = None
        try:
            if isinstance(event, SourceListing):
                operation = "snapshot"
                if self._tracing_updates():
                    span = self._listing_span(event)
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
        except AttributeError:
            # Something not shaped like a discovery event: count it, trace nothing.
            self._log.warning("not a discovery event: %r; counted as unknown", type(event))
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

    def _listing_span(self, listing: SourceListing) -> Span:
        attrs = self._messaging_attributes("snapshot")
        attrs[n.ATTR_SNAPSHOT_ENTRIES] = len(listing.entries)
        attrs[n.ATTR_SNAPSHOT_REASON] = listing.reason
        links: list[trace.Link] = []
        for entry in listing.entries:
            link = link_from_headers(entry.headers)
            if link is not None:
                links.append(link)
                if len(links) >= _MAX_LISTING_LINKS:
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
        self._instruments.invalid.add(1, {n.LABEL_REASON: reason})
        target = span if span is not None else trace.get_current_span()
        if target.is_recording():
            target.add_event(
                n.EVENT_INVALID_RECORD,
                {n.ATTR_DISCOVERY_KEY: key, n.ATTR_REASON: reason, n.ATTR_DETAIL: detail},
            )
        self._log.debug(
            "invalid discovery record %s: %s %s", wire_text(key), reason, wire_text(detail)
        )

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
        except (TypeError, ValueError) as exc:
            self._log.warning("build span of %r without attributes: %s", group, exc)
        return BuildScope(self, attrs)

    # --- the core's effects -------------------------------------------------------------------

    def heard(self, record: HeardStep) -> None:
        """Report a step's effects, as a subscriber of the service's steps.

        A source event's step ends inside its update's scope: its first core step's effects
        are reported there (in the update's span, deciding what the update is counted as),
        the core steps the step made itself (a refused commit fed back) outside it.
        """
        scope = self.current_update
        for step in record.steps:
            if scope is not None and step.made is None:
                scope.effects(step.effects)
            elif step.effects:
                self.effects(step.effects)

    def effects(self, effects: Iterable[object]) -> None:
        """Report what the core decided, one effect at a time, through :data:`EFFECT_HANDLERS`.

        Rejections, invalid records, commits, withdrawals and successions are reported; other
        kinds (build requests, publications) are the service's to carry out, not to report.
        This is the one guarded place of reporting: an effect whose report fails (a broken
        exporter, a malformed value) is logged at WARNING, once a minute per kind of effect,
        and the others are still reported.
        """
        for effect in effects:
            handler = EFFECT_HANDLERS.get(type(effect))
            if handler is None:
                continue
            try:
                handler(self, effect)
            except Exception:  # one report failing must not stop the others
                self._guard.warning(
                    f"reporting a {type(effect).__name__} effect",
                    "the step's other effects are still reported",
                )

    def cohort_rejected(
        self,
        *,
        model: str,
        worker_set: str,
        incumbent_checksum: str,
        rejected_checksum: str,
        instance: str,
        differences: Sequence[Difference] | None = None,
    ) -> None:
        """Log one newly rejected cohort at ERROR, note it on the current span, and count it.

        ``differences`` are the checksum inputs the rejected card differs in (``None`` when
        the cards were not at hand); the line shows the first five. The core already
        suppresses unchanged repeats; every call here is logged.
        """
        fields: dict[str, Any] = {
            "model": model,
            "worker_set": worker_set,
            "incumbent_checksum": incumbent_checksum,
            "rejected_checksum": rejected_checksum,
            "instance": instance,
            "differences": differences_json(differences),
        }
        said = "" if differences is None else f" differs in: {summarize(differences)}"
        said = wire_text(said, 4 * DETAIL_LIMIT)
        # The host forwards only the message text, so every field is in it as well.
        self._rejection_log.error(
            "rejected cohort: model=%s worker_set=%s incumbent_checksum=%s "
            "rejected_checksum=%s instance=%s%s (its configuration differs from the "
            "incumbent's; it is tracked but not admitted)",
            wire_text(model),
            wire_text(worker_set),
            wire_text(incumbent_checksum),
            wire_text(rejected_checksum),
            wire_text(instance),
            said,
            extra=fields,
        )
        self._instruments.count_rejection(model)
        span = trace.get_current_span()
        if span.is_recording():
            attrs: dict[str, Any] = {
                n.ATTR_MODEL: model,
                n.ATTR_WORKER_SET: worker_set,
                n.ATTR_INCUMBENT_CHECKSUM: incumbent_checksum,
                n.ATTR_REJECTED_CHECKSUM: rejected_checksum,
                n.ATTR_INSTANCE: instance,
            }
            if differences is not None:
                # One "field incumbent -> rejected" string per difference, all of them.
                attrs[n.ATTR_DIFFERENCES] = [str(d) for d in differences]
            span.add_event(n.EVENT_COHORT_REJECTED, attrs)

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
        *,
        drained: bool = False,
    ) -> None:
        """Mark a WorkerSet whose incumbent cohort emptied with a short span; count it if succeeded.

        ``new_checksum`` is None when no cohort was left to take over; ``drained``: the last
        incumbent workers were drained and hand over to the successor.
        """
        sides = {
            n.ATTR_OLD_CHECKSUM: old_checksum,
            n.ATTR_NEW_CHECKSUM: new_checksum,
            n.ATTR_OLD_GENERATION: old_generation,
            n.ATTR_NEW_GENERATION: new_generation,
        }
        attrs: dict[str, Any] = {n.ATTR_GROUP: self.group_id(group)}
        attrs.update({key: value for key, value in sides.items() if value is not None})
        attrs[n.ATTR_DRAINED] = drained
        model = getattr(group, "model", None)
        if new_checksum is not None:
            self._log.warning(
                "succession in %s: incumbent %s %s, %s takes over with generation %s",
                wire_text(attrs[n.ATTR_GROUP]),
                old_checksum,
                "drained by an operator (it serves until the successor is committed)"
                if drained
                else "has no worker left",
                new_checksum,
                new_generation,
            )
        if new_checksum is not None:
            # A group whose last worker left has no successor: that is a withdrawal, not a
            # succession, and counting it would make every scale-to-zero look like an update.
            self._instruments.count_succession("" if model is None else str(model))
        self._instant_span(n.SPAN_SUCCEED, attrs)

    def worker_drained(
        self, group: object, key: str, checksum: str, was_admitted: bool, by: str
    ) -> None:
        """Log and mark a registration a drain took out of its cohort."""
        group_id = self.group_id(group)
        self._log.info(
            "drained %s in %s (%s, checksum %s)%s",
            wire_text(key),
            wire_text(group_id),
            "was admitted" if was_admitted else "was not admitted",
            checksum,
            f" by {wire_text(by)}" if by else "",
        )
        self._instant_span(
            n.SPAN_DRAIN,
            {
                n.ATTR_GROUP: group_id,
                n.ATTR_INSTANCE: key,
                n.ATTR_CHECKSUM: checksum,
                n.ATTR_DRAIN_BY: by,
            },
        )

    def handover_ended(self, group: object, checksum: str, generation: int, reason: str) -> None:
        """Log and mark the end of a drained tenure's handover to its successor."""
        group_id = self.group_id(group)
        self._log.info(
            "handover of %s done (%s): drained incumbent %s generation %s withdrawn",
            wire_text(group_id),
            reason,
            checksum,
            generation,
        )
        self._instant_span(
            n.SPAN_HANDOVER,
            {
                n.ATTR_GROUP: group_id,
                n.ATTR_CHECKSUM: checksum,
                n.ATTR_GENERATION: generation,
                n.ATTR_HANDOVER_REASON: reason,
            },
        )

    def tenure_held(
        self,
        group: object,
        checksum: str,
        generation: int | None,
        deadline: float,
        last_known: Sequence[str] = (),
        last_known_until: float | None = None,
    ) -> None:
        """Log and mark a tenure held after an outage: its incumbent has no member listed."""
        group_id = self.group_id(group)
        if last_known_until is not None:
            self._log.warning(
                "holding the tenure of %s (incumbent %s) after a discovery outage: none of "
                "its workers is listed; %d of them (%s) stay admitted on their last known "
                "records until clock %.1f, and the hold ends at clock %.1f unless one of "
                "them registers again",
                wire_text(group_id),
                checksum,
                len(last_known),
                wire_text(", ".join(last_known), 4 * DETAIL_LIMIT),
                last_known_until,
                deadline,
            )
        else:
            self._log.warning(
                "holding the tenure of %s (incumbent %s) after a discovery outage: none of "
                "its workers is listed or admitted; the hold ends at clock %.1f unless one "
                "of them registers again",
                wire_text(group_id),
                checksum,
                deadline,
            )
        attrs: dict[str, Any] = {
            n.ATTR_GROUP: group_id,
            n.ATTR_CHECKSUM: checksum,
            n.ATTR_HOLD_DEADLINE: float(deadline),
            n.ATTR_HOLD_LAST_KNOWN: list(last_known),
        }
        if last_known_until is not None:
            attrs[n.ATTR_HOLD_LAST_KNOWN_UNTIL] = float(last_known_until)
        model = getattr(group, "model", None)
        self._instruments.count_hold("" if model is None else str(model))
        if generation is not None:
            attrs[n.ATTR_GENERATION] = generation
        self._instant_span(n.SPAN_HOLD, attrs)

    def tenure_began(self, group: object, receiver: int | None) -> None:
        """Note the start of a tenure (a receiver opened for the group's incumbent)."""
        self._instruments.tenure_began(group, receiver)

    def tenure_ended(self, group: object, receiver: int | None) -> None:
        """Note the end of a tenure (its receiver retired)."""
        self._instruments.tenure_ended(group, receiver)

    def tenure_hold_ended(
        self, group: object, checksum: str, outcome: str, held_for: float
    ) -> None:
        """Log and mark the end of a hold: a member came back, or it ran out (succession next)."""
        group_id = self.group_id(group)
        if outcome == "expired":
            self._log.warning(
                "the hold of %s ended after %.1f s with no worker of incumbent %s back: "
                "the succession follows",
                wire_text(group_id),
                held_for,
                checksum,
            )
        else:
            self._log.info(
                "a worker of incumbent %s registered again after %.1f s: %s keeps its tenure",
                checksum,
                held_for,
                wire_text(group_id),
            )
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

    def _instant_span(self, name: str, attrs: dict[str, Any]) -> None:
        span = self.tracer.start_span(name, kind=SpanKind.INTERNAL, attributes=attrs)
        span.end()

    # --- gauges -------------------------------------------------------------------------------

    def observe_state(self, callback: Callable[[], AdmissionStateSummary]) -> None:
        """Set the function the gauges call, at collection time, for the current state."""
        self._instruments.observe_state(callback)
