"""The service's metric instruments, and the cheap per-update bookkeeping that feeds them."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation
from workerset_admission.errors import REFUSAL_REASONS
from workerset_admission.telemetry import names as n
from workerset_admission.telemetry.guard import guarded
from workerset_admission.telemetry.worker_state_page import (
    COUNTS_DESCRIPTION,
    STATES_DESCRIPTION,
    StoreLike,
    WorkerStateFold,
    served_as_text,
)
from workerset_admission.telemetry.worker_states import (
    DIFFERS_IN_UNKNOWN,
    GroupLike,
    RejectionLike,
    WorkerSetLabels,
    WorkerSetState,
    rejection_reasons,
    worker_labels,
)

if TYPE_CHECKING:
    from workerset_admission.telemetry.worker_state_page import PrometheusPage

__all__ = ["AdmissionInstruments", "AdmissionStateSummary", "HeldGroup"]

_log = logging.getLogger(__name__)

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
# Enough latency samples for a faithful histogram at a cost that stays well under 1% of a core.
_LATENCY_RECORDS_PER_SECOND: Final = 1000
_BUILD_BUCKETS: Final = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


# Every observed instrument: (kind, name, the callback that observes it, unit, description).
# Read when the instruments are made; a new gauge is one row here and one callback below.
_OBSERVED: Final = (
    (
        "counter",
        n.METRIC_UPDATES,
        "_observe_updates",
        "{update}",
        "Discovery updates applied, by operation and decision.",
    ),
    (
        "counter",
        n.METRIC_REJECTED_COHORTS,
        "_observe_rejections",
        "{cohort}",
        "Cohorts newly rejected because their checksum differs from the incumbent.",
    ),
    (
        "counter",
        n.METRIC_SUCCESSIONS,
        "_observe_successions",
        "{succession}",
        "WorkerSets whose incumbent cohort emptied and was succeeded.",
    ),
    (
        "gauge",
        n.METRIC_GROUPS,
        "_observe_groups",
        "{group}",
        "WorkerSet groups, by admission status.",
    ),
    (
        "gauge",
        n.METRIC_GROUPS_HELD,
        "_observe_held",
        "{group}",
        "WorkerSet groups whose tenure is held after a discovery outage.",
    ),
    (
        "gauge",
        n.METRIC_WORKERS_ADMITTED,
        "_observe_admitted",
        "{worker}",
        "Workers currently admitted for routing, across all groups.",
    ),
    (
        "gauge",
        n.METRIC_WORKERS,
        "_observe_workers",
        "{worker}",
        "Registered workers by model and state: admitted, rejected or held.",
    ),
    (
        "gauge",
        n.METRIC_ROUTER_WORKERS,
        "_observe_router_workers",
        "{worker}",
        COUNTS_DESCRIPTION,
    ),
    (
        "gauge",
        n.METRIC_ROUTER_WORKER_STATE,
        "_observe_worker_state",
        "{state}",
        STATES_DESCRIPTION,
    ),
    (
        "gauge",
        n.METRIC_INCUMBENT_SINCE,
        "_observe_incumbents",
        "s",
        "Each WorkerSet's incumbent checksum, valued at its tenure's start (Unix time).",
    ),
    (
        "gauge",
        n.METRIC_REJECTED_COHORT_WORKERS,
        "_observe_rejected_cohorts",
        "{worker}",
        "Workers of each rejected cohort, with the first checksum input its card differs in.",
    ),
    (
        "counter",
        n.METRIC_HOLDS,
        "_observe_holds",
        "{hold}",
        "Tenures held after a discovery outage (their incumbent not listed).",
    ),
    (
        "gauge",
        n.METRIC_VIEW_LAG,
        "_observe_lag",
        "s",
        "From the server storing the newest applied record to its being applied.",
    ),
)


@dataclass(frozen=True, slots=True)
class HeldGroup:
    """One group whose tenure is held: until when, and who is served on last known good."""

    group: str
    held_until: float | None
    last_known: tuple[int, ...] = ()
    last_known_until: float | None = None


@dataclass(frozen=True, slots=True)
class AdmissionStateSummary:
    """What the gauges report: groups per status, and the workers admitted across all groups."""

    groups_by_status: Mapping[str, int] = field(default_factory=dict)
    admitted_workers: int = 0
    # Groups whose tenure is held after an outage (their incumbent has no live member).
    held_groups: int = 0
    # Those groups one by one, when known: the gauge then reports each with its members
    # served on last known good.
    held: tuple[HeldGroup, ...] = ()
    # Registered workers per (model, state): admitted, rejected (their cohort's configuration
    # differs from a live incumbent's), held (waiting in a group whose tenure is held),
    # drained (set aside by an operator's drain, about to stop).
    workers: Mapping[tuple[str, str], int] = field(default_factory=dict)
    # The groups and standing rejections themselves, for the per-WorkerSet and per-worker
    # series in Dynamo's vocabulary (``worker_states``).
    groups: Sequence[GroupLike] = ()
    rejections: Sequence[RejectionLike] = ()
    # The read store they were rendered from (``None``: made otherwise); the worker families
    # follow the groups it says changed.
    store: StoreLike | None = None


class AdmissionInstruments:
    """Every instrument of one admission service, made on one meter, and what records into them.

    The counter ``invalid`` is added to directly by the facade; update counts, rejected
    cohorts, successions, holds, latency samples, builds and the gauges go through the methods
    here. Rejections, successions and holds are counted per model and reported for every model
    that has a group, 0 included, so a query's ``increase()`` sees the first one: Prometheus
    takes a series' first sample as its start, not as an increase from nothing.

    With a ``page`` (the Prometheus endpoint ``setup_telemetry`` serves), the per-WorkerSet
    counts and the per-worker states are served there as the fold's kept text, not rendered by
    the SDK's Prometheus reader; every other reader still collects them (``worker_state_page``).
    """

    def __init__(self, meter: metrics.Meter, page: PrometheusPage | None = None) -> None:
        self._state: Callable[[], AdmissionStateSummary] | None = None
        # When each tenure began (Unix time), by group, with the receiver that names the tenure.
        self._tenures: dict[object, tuple[int | None, float]] = {}
        self._lag: float | None = None
        self._rejections: dict[str, int] = {}
        self._successions: dict[str, int] = {}
        # What each pair of checksums (incumbent's, rejected card's) differs in, once known:
        # a held incumbent may have no card left to compare with.
        self._differs: dict[tuple[str, str], str] = {}
        self._holds: dict[str, int] = {}
        # Every WorkerSet's worker states, followed group by group as the groups change.
        self._fold = WorkerStateFold(self._differs)
        if page is not None:
            page.carry(self._fold, self._kept_text)
        self._update_counts: dict[tuple[str, str], int] = {}
        self._update_labels: dict[tuple[str, str], dict[str, str]] = {}
        self._latency_seen = 0
        self._latency_stride = 1
        self._latency_window_start = time.time()
        self._latency_window_seen = 0

        self.invalid = meter.create_counter(
            n.METRIC_INVALID_RECORDS,
            unit="{record}",
            description="Discovery records refused at the boundary, by reason.",
        )
        # Every reason from the start, at 0, as for build outcomes below: an alert on
        # increase() then sees a reason's first refusal.
        for reason in sorted(REFUSAL_REASONS):
            self.invalid.add(0, {n.LABEL_REASON: reason})
        self._builds = meter.create_counter(
            n.METRIC_BUILDS, unit="{build}", description="Pipeline build attempts, by outcome."
        )
        # Every outcome from the start, at 0: a series that first appears at 1 is one that
        # ``increase()`` never sees increase.
        for outcome in n.BUILD_OUTCOMES:
            self._builds.add(0, {n.LABEL_OUTCOME: outcome})
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

        for kind, name, callback, unit, description in _OBSERVED:
            make = (
                meter.create_observable_counter
                if kind == "counter"
                else meter.create_observable_gauge
            )
            make(name, callbacks=[getattr(self, callback)], unit=unit, description=description)

    # --- discovery updates -------------------------------------------------------------------

    def count_update(self, operation: str, decision: str, published_at: float | None) -> None:
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
        self._lag = max(0.0, now - published_at)
        self._latency.record(self._lag)
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

    def count_build(self, outcome: str, seconds: float) -> None:
        labels = {n.LABEL_OUTCOME: outcome}
        self._builds.add(1, labels)
        self._build_duration.record(seconds, labels)

    # --- gauges -------------------------------------------------------------------------------

    def observe_state(self, callback: Callable[[], AdmissionStateSummary]) -> None:
        """Set the function the gauges call, at collection time, for the current state."""
        self._state = callback

    def _summary(self) -> AdmissionStateSummary | None:
        if self._state is None:
            return None
        with guarded("the gauges' state callback", "the gauges skip this collection"):
            return self._state()
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
        if summary is None:
            return []
        if not summary.held:
            return [Observation(summary.held_groups)]
        # One point per held group (few, and only during an outage), saying whom it serves on
        # last known good and until when (Unix time; 0 when nobody is served so).
        return [
            Observation(
                1,
                {
                    n.ATTR_GROUP: held.group,
                    n.ATTR_HOLD_DEADLINE: held.held_until or 0.0,
                    n.ATTR_HOLD_LAST_KNOWN: ",".join(f"{i:x}" for i in held.last_known),
                    n.ATTR_HOLD_LAST_KNOWN_UNTIL: held.last_known_until or 0.0,
                },
            )
            for held in summary.held
        ]

    def _observe_workers(self, _options: CallbackOptions) -> Iterable[Observation]:
        summary = self._summary()
        if summary is None:
            return []
        counts = {(model, state): 0 for model, _ in summary.workers for state in n.WORKER_STATES}
        counts.update(summary.workers)
        return [
            Observation(count, {n.LABEL_MODEL: model, n.LABEL_STATE: state})
            for (model, state), count in sorted(counts.items())
        ]

    def _observe_admitted(self, _options: CallbackOptions) -> Iterable[Observation]:
        summary = self._summary()
        return [] if summary is None else [Observation(summary.admitted_workers)]

    # --- successions and holds, per model -----------------------------------------------------

    def count_rejection(self, model: str) -> None:
        self._rejections[model] = self._rejections.get(model, 0) + 1

    def count_succession(self, model: str) -> None:
        self._successions[model] = self._successions.get(model, 0) + 1

    def count_hold(self, model: str) -> None:
        self._holds[model] = self._holds.get(model, 0) + 1

    def _per_model(self, counts: Mapping[str, int]) -> Iterable[Observation]:
        summary = self._summary()
        # The model as WorkerSetLabels reads it, without parsing the rest of the group's key.
        models = (str(getattr(g.group, "model", "")) for g in summary.groups) if summary else ()
        every = dict.fromkeys(models, 0)
        every.update(counts)
        # A group object without a model (only a host's own, never the service's) has no label.
        return [
            Observation(count, {n.LABEL_MODEL: model} if model else {})
            for model, count in sorted(every.items())
        ]

    def _observe_rejections(self, _options: CallbackOptions) -> Iterable[Observation]:
        return self._per_model(self._rejections)

    def _observe_successions(self, _options: CallbackOptions) -> Iterable[Observation]:
        return self._per_model(self._successions)

    def _observe_holds(self, _options: CallbackOptions) -> Iterable[Observation]:
        return self._per_model(self._holds)

    # --- WorkerSets and workers in Dynamo's vocabulary ---------------------------------------

    def tenure_began(self, group: object, receiver: int | None) -> None:
        """Note that a tenure of ``group`` began now, under ``receiver``."""
        self._tenures[group] = (receiver, time.time())

    def tenure_ended(self, group: object, receiver: int | None) -> None:
        """Forget the tenure of ``group`` named by ``receiver``."""
        if self._tenures.get(group, (None, 0.0))[0] == receiver:
            del self._tenures[group]

    def _worker_sets(self, summary: AdmissionStateSummary) -> tuple[WorkerSetState, ...]:
        self._fold.refresh(summary.groups, summary.rejections, summary.store)
        return self._fold.sets()

    def _kept_text(self) -> Mapping[str, bytes]:
        summary = self._summary()
        if summary is None:
            return {}
        self._fold.refresh(summary.groups, summary.rejections, summary.store)
        return self._fold.text()

    def _observe_router_workers(self, _options: CallbackOptions) -> Iterable[Observation]:
        if served_as_text(self._fold):
            return []  # the page being rendered serves the fold's kept text instead
        summary = self._summary()
        if summary is None:
            return []
        self._fold.refresh(summary.groups, summary.rejections, summary.store)
        out = []
        for worker_set, counts in self._fold.counts():
            labels = worker_set.as_dict()
            for state, count in counts.items():
                out.append(Observation(count, {**labels, n.LABEL_STATE: state}))
        return out

    def _observe_worker_state(self, _options: CallbackOptions) -> Iterable[Observation]:
        if served_as_text(self._fold):
            return []  # the page being rendered serves the fold's kept text instead
        summary = self._summary()
        if summary is None:
            return []
        out = []
        for worker_set in self._worker_sets(summary):
            for worker, (state, why) in sorted(worker_set.workers.items()):
                out.append(Observation(1, worker_labels(worker_set.labels, worker, state, why)))
        return out

    def _observe_incumbents(self, _options: CallbackOptions) -> Iterable[Observation]:
        summary = self._summary()
        if summary is None:
            return []
        out = []
        now = time.time()
        for group in summary.groups:
            if group.incumbent is None:
                continue
            receiver = group.receiver
            known = self._tenures.get(group.group)
            if known is None or known[0] != receiver:
                # A tenure this telemetry did not see begin (it began before a restart, or in
                # a recording): it counts from when it was first seen.
                known = self._tenures[group.group] = (receiver, now)
            labels = WorkerSetLabels.of(group.group).as_dict()
            labels[n.LABEL_MDC_CHECKSUM] = group.incumbent
            out.append(Observation(known[1], labels))
        return out

    def _observe_rejected_cohorts(self, _options: CallbackOptions) -> Iterable[Observation]:
        summary = self._summary()
        if summary is None:
            return []
        why = rejection_reasons(summary.rejections, self._differs)
        out = []
        for group in summary.groups:
            if group.incumbent is None:
                continue
            labels = WorkerSetLabels.of(group.group).as_dict()
            for cohort in group.cohorts[1:]:
                if not cohort.members:
                    continue
                attributes = {
                    **labels,
                    n.LABEL_INCUMBENT_CHECKSUM: group.incumbent,
                    n.LABEL_MDC_CHECKSUM: cohort.mdc_checksum,
                    n.LABEL_DIFFERS_IN: why.get(
                        (group.group, cohort.mdc_checksum), DIFFERS_IN_UNKNOWN
                    ),
                }
                out.append(Observation(len(cohort.members), attributes))
        return out

    def _observe_lag(self, _options: CallbackOptions) -> Iterable[Observation]:
        return [] if self._lag is None else [Observation(self._lag)]
