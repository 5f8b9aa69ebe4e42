"""One admission step: a source event becomes core inputs, and the core's effects are carried out.

This is the code the live service and ``replay`` share. :class:`AdmissionStep` owns the core
and the ingestion of discovery events, and carries out every effect through the parts it is
given: the receivers' channels, a :class:`BuildRunner`, the hop bindings, a timer and the
publication's wake-up. The live service gives it the real parts (builds as asyncio tasks, the
Dynamo hops, the serving publication); ``replay`` gives it builds answered from the trace and
a clock that follows the trace's times. Everything else (the batching of one event into one
core step, the clock read for every listing and expiry, refusals, the order in which effects
are carried out, the build results and refused commits fed back) is the same function in both.
The step decides nothing: whether an expiry is an outage's, whether a LoRA projection may be
served and which group a taint change reaches are the core's judgements, carried by its
effects.

Effects are dispatched here and nowhere else: :data:`CARRIERS` maps each effect type to the
step's one method for it, and that method calls one typed method of one part
(``channels.open``, ``builds.commit``, ``hops.carry_taints`` ...). No part looks at an
effect's type again. Telemetry is the one other reader of a step's effects, and reads them as a
list: it reports them, by its own table, inside the update's span before they are carried out.

The clock is read once when a step begins (an event, a build result, a timer tick), and that
one reading is used for everything the step does, so a replay whose clock is the recorded
reading makes the very decisions the live step made.

A step is heard one way: at its end, every subscriber (:meth:`AdmissionStep.subscribe`) is
handed one immutable :class:`StepRecord` through its one method, ``heard``. The record holds
what came in (a source event, a build result or a clock tick), the clock reading, the keys a
reconciliation kept, ingestion's verdicts, every core step made (the input, or ``None`` for the
arrival's own, and its effects; a refused commit fed back is a core step of its own) and the
step's :class:`~workerset_admission.ports.StepDelta` (made by :class:`~.delta.DeltaMaker` from
the raw event, the verdicts and the effects). The trace writer records the input and the digest
of the effects; ``replay`` checks its own effects against those digests and keeps its notes for
``explain``; the read models (the admitted view, the status and serving records) read the delta
(:class:`DeltaReader`), and a listener of effects reads them (:class:`EffectReader`). One record,
one wake-up, per step, and nothing a subscriber must ask the service back. A subscriber that
raises is logged at WARNING and the others still hear the step.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from workerset_admission.admission import (
    AdmissionCore,
    BuildDiscarded,
    BuildFinished,
    CancelBuild,
    CommitGroup,
    DrainChanged,
    DrainLifted,
    Effect,
    HandoverEnded,
    Input,
    LoraProjectionChanged,
    LoraProjectionRefused,
    MutationRefused,
    OpenReceiver,
    PublishAdmissions,
    RejectionReported,
    RetireReceiver,
    RetryScheduled,
    StartBuild,
    StatusChanged,
    Succession,
    TaintsUpdated,
    TenureHeld,
    TenureHoldEnded,
    Tick,
    WithdrawGroup,
    WorkerDeparted,
    WorkerDrained,
    WorkerPlaced,
)
from workerset_admission.admission.ordering import GroupId
from workerset_admission.aio import collector_paused
from workerset_admission.errors import RemoteDataError, UsageError, wire_text
from workerset_admission.identity import AttemptId
from workerset_admission.ports import (
    ReadModel,
    SourceDelete,
    SourceEvent,
    SourceListing,
    SourcePut,
    StepDelta,
)
from workerset_admission.service.delta import DeltaMaker
from workerset_admission.service.ingest import Ingested, Ingestor
from workerset_admission.telemetry import AdmissionTelemetry, UpdateScope

__all__ = [
    "CARRIERS",
    "AdmissionStep",
    "BuildRunner",
    "CoreStep",
    "DeltaReader",
    "EffectReader",
    "StepRecord",
    "StepSubscriber",
]

_log = logging.getLogger("workerset_admission.service.admission_service")


class BuildRunner(Protocol):
    """Runs the builds the core asks for and hands a committed one to its hop."""

    def start(self, effect: StartBuild) -> None:
        """Start the build; its result comes back through :meth:`AdmissionStep.build_finished`."""
        ...

    def cancel(self, attempt: AttemptId) -> None: ...

    def commit(self, effect: CommitGroup) -> Input | None:
        """Serve the built pipeline; a refusal comes back as an input for the core."""
        ...


class Hops(Protocol):
    """The hop bindings, as the step needs them (commits reach them through the builds)."""

    def withdraw(self, effect: WithdrawGroup) -> None: ...

    def carry_taints(self, effect: TaintsUpdated) -> bool: ...

    def drain_changed(self, effect: DrainChanged) -> None: ...


class Channels(Protocol):
    """The admission channels: one method per receiver effect."""

    def open(self, effect: OpenReceiver) -> None: ...

    def publish(self, effect: PublishAdmissions) -> None: ...

    def project(self, effect: LoraProjectionChanged) -> None: ...

    def retire(self, effect: RetireReceiver) -> None: ...


@dataclass(frozen=True, slots=True)
class CoreStep:
    """One core step: the input the step made itself (``None``: the first) and its effects."""

    made: Input | None
    effects: tuple[Effect, ...]


Arrival = SourceEvent | BuildFinished | Tick | tuple[Input, ...]
"""What began a step: a source event, a build result, a timer tick, or inputs applied as such."""


@dataclass(frozen=True, slots=True)
class StepRecord:
    """Everything one step saw and did, made once at its end and handed to every subscriber.

    ``came_in`` began it, at clock ``now`` (the one reading the whole step used); ``keep`` and
    ``recorded`` are a listing's kept keys and recorded cohort order, ``ingested`` what
    ingestion judged of a source event. ``steps`` are its core steps in order: the first, then
    each input the step made itself (a commit a hop refused), fed back as a core step of its
    own. ``delta`` is what the read models keep (``None``: nothing changed for them), and
    ``changed`` tells whether admission state changed.
    """

    came_in: Arrival
    now: float
    steps: tuple[CoreStep, ...] = ()
    keep: tuple[str, ...] = ()
    recorded: Mapping[GroupId, Sequence[str]] | None = None
    ingested: Ingested | None = None
    delta: StepDelta | None = None
    changed: bool = False

    @property
    def effects(self) -> tuple[Effect, ...]:
        """Every effect of the step, core step after core step."""
        if len(self.steps) == 1:
            return self.steps[0].effects
        return tuple(effect for step in self.steps for effect in step.effects)


class StepSubscriber(Protocol):
    """Hears every step, once, at its end, on the loop; see :meth:`AdmissionStep.subscribe`."""

    def heard(self, record: StepRecord) -> None:
        """Take one step's record; what raises is logged at WARNING, the others still hear."""
        ...


class DeltaReader:
    """Hands a read model the delta of every step that changed something it keeps."""

    __slots__ = ("model",)

    def __init__(self, model: ReadModel) -> None:
        self.model = model

    def heard(self, record: StepRecord) -> None:
        if record.delta is not None:
            self.model.step(record.delta)

    def __repr__(self) -> str:
        return f"DeltaReader({type(self.model).__name__})"


class EffectReader:
    """Hands a callable the effects of every step (nothing for a step without any)."""

    __slots__ = ("listener",)

    def __init__(self, listener: Callable[[Sequence[Effect]], object]) -> None:
        self.listener = listener

    def heard(self, record: StepRecord) -> None:
        effects = record.effects
        if effects:
            self.listener(effects)

    def __repr__(self) -> str:
        return f"EffectReader({self.listener!r})"


@dataclass(slots=True)
class _Hearing:
    """What the step in progress has seen so far; made into its record at its end."""

    came_in: Arrival
    now: float
    keep: tuple[str, ...] = ()
    recorded: Mapping[GroupId, Sequence[str]] | None = None
    ingested: Ingested | None = None
    steps: list[CoreStep] = field(default_factory=list)
    changed: bool = False


class AdmissionStep:
    """Turns source events into core steps and carries out their effects; see the module doc."""

    def __init__(
        self,
        core: AdmissionCore,
        ingest: Ingestor,
        *,
        channels: Channels,
        builds: BuildRunner,
        clock: Callable[[], float],
        telemetry: AdmissionTelemetry,
        refuse: Callable[[str, RemoteDataError, UpdateScope | None], None],
        schedule: Callable[[float], None],
        hops: Hops | None = None,
        publications_changed: Callable[[], None] | None = None,
        deltas: DeltaMaker | None = None,
        log: logging.Logger = _log,
    ) -> None:
        self.core = core
        self.ingest = ingest
        self.clock = clock
        self._channels = channels
        self._builds = builds
        self._telemetry = telemetry
        self._refuse = refuse
        self._schedule = schedule
        self._hops = hops
        self._publications_changed = publications_changed
        self._log = log
        # The subscribers, each handed every step's record at its end, in this order.
        self.subscribers: list[StepSubscriber] = []
        # Makes the read models' delta from what the step saw, at its end.
        self._deltas = deltas
        self.notifications = 0
        # The step in progress (``None`` between steps); its clock was read once, as it began.
        self._hearing: _Hearing | None = None
        self._now = 0.0

    def subscribe(self, subscriber: StepSubscriber) -> None:
        """Hand ``subscriber`` the record of every step from now on (on the loop, at its end)."""
        self.subscribers.append(subscriber)

    # -- source events -------------------------------------------------------------------------

    def handle_event(
        self,
        event: SourceEvent,
        keep: Collection[str] = (),
        *,
        recorded: Mapping[GroupId, Sequence[str]] | None = None,
    ) -> None:
        """Apply one source event as one core step.

        ``keep`` (listings only) names keys that live updates touched while a reconciliation
        listing was read; ``recorded`` (listings only) is a recorded frontend's cohort order,
        which the listing is then observed in.
        """
        now = self._begin(event, keep=tuple(keep), recorded=recorded)
        try:
            self._handle(event, now, keep, recorded)
        finally:
            self._ended()

    def _handle(
        self,
        event: SourceEvent,
        now: float,
        keep: Collection[str],
        recorded: Mapping[GroupId, Sequence[str]] | None,
    ) -> None:
        # The step ends inside its update's scope: telemetry, a subscriber, reports the effects
        # in the update's span, before the update is counted.
        if isinstance(event, SourcePut):
            entry = event.entry
            with self._telemetry.apply_update(event) as scope:
                try:
                    self._ingested(self.ingest.put(entry.key, entry.value), scope)
                finally:
                    self._ended()
        elif isinstance(event, SourceDelete):
            with self._telemetry.apply_update(event) as scope:
                try:
                    result = self.ingest.removal(event, now=now)
                    self._ingested(result, scope)
                finally:
                    self._ended()
            for lifted in result.inputs:
                if type(lifted) is DrainLifted:
                    # An operator's undrain, a drain's TTL, or a drain withdrawn: say so, since
                    # the worker may now be routed to again.
                    self._log.info(
                        "drain of %s/%x withdrawn (%s): the worker may be routed to again",
                        wire_text(lifted.namespace),
                        lifted.instance_id,
                        event.operation,
                    )
        elif isinstance(event, SourceListing):
            with collector_paused(), self._telemetry.apply_update(event) as scope:
                try:
                    result = self.ingest.listing(event, keep, now=now, recorded=recorded)
                    # Refusals in a listing are reported one by one, not as the listing's failure.
                    self._ingested(result, scope, refusals_in_scope=False)
                finally:
                    self._ended()
        else:
            raise UsageError(f"not a discovery event: {type(event).__name__}")

    def _ingested(
        self, result: Ingested, scope: UpdateScope, *, refusals_in_scope: bool = True
    ) -> None:
        hearing = self._hearing
        if hearing is not None:
            hearing.ingested = result
        for verdict in result.refusals:
            assert verdict.refusal is not None
            self._refuse(verdict.key, verdict.refusal, scope if refusals_in_scope else None)
        if result.refusals and hearing is not None:
            hearing.changed = True
        if result.inputs:
            self._apply(result.inputs, force=result.liveness_changed)
            return
        if not result.refusals:
            scope.record_decision(result.decision)
        if result.liveness_changed and hearing is not None:
            hearing.changed = True

    # -- results and timers ----------------------------------------------------------------------

    def build_finished(self, result: BuildFinished) -> None:
        """Feed a build's result back in (fenced by the core on checksum and generation)."""
        now = self._begin(result)
        try:
            self._apply([Tick(now), result])
        finally:
            self._ended()

    def tick(self, now: float | None = None) -> None:
        """Let the core act on the deadlines due by ``now`` (the clock when not given)."""
        now = self._begin(None, now=now)
        try:
            self._apply([Tick(now)])
        finally:
            self._ended()

    def apply(self, inputs: Sequence[Input]) -> None:
        """Apply ``inputs`` as one core step, then carry out every effect it returns.

        Outside a step (``replay`` restoring a recorded state) this is a step of its own, heard
        with the inputs as what came in; the clock is not read again.
        """
        if self._hearing is not None:
            self._apply(inputs)
            return
        self._hearing = _Hearing(tuple(inputs), self._now)
        try:
            self._apply(inputs)
        finally:
            self._ended()

    def _begin(
        self,
        came_in: SourceEvent | BuildFinished | None,
        *,
        now: float | None = None,
        keep: tuple[str, ...] = (),
        recorded: Mapping[GroupId, Sequence[str]] | None = None,
    ) -> float:
        now = self._now = self.clock() if now is None else now
        arrival: Arrival = Tick(now) if came_in is None else came_in
        self._hearing = _Hearing(arrival, now, keep, recorded)
        return now

    def _ended(self) -> None:
        hearing, self._hearing = self._hearing, None
        if hearing is None:
            return  # already ended (inside its update's scope)
        delta = None
        if self._deltas is not None:
            # The delta is made once, here, from what the step saw.
            delta = self._deltas.finish(
                hearing.came_in,
                hearing.keep,
                hearing.ingested,
                [step.effects for step in hearing.steps],
            )
        if not self.subscribers:
            return
        record = StepRecord(
            came_in=hearing.came_in,
            now=hearing.now,
            steps=tuple(hearing.steps),
            keep=hearing.keep,
            recorded=hearing.recorded,
            ingested=hearing.ingested,
            delta=delta,
            changed=hearing.changed,
        )
        for subscriber in self.subscribers:
            try:
                subscriber.heard(record)
            except Exception:  # noqa: PERF203 - a subscriber must never stop admission
                self._log.warning(
                    "step subscriber %r failed on the step of %s at %.3f; "
                    "the other subscribers still heard it",
                    subscriber,
                    _arrival_text(record.came_in),
                    record.now,
                    exc_info=True,
                )

    # -- one core step -----------------------------------------------------------------------------

    def _apply(
        self, inputs: Sequence[Input], *, force: bool = False, made: Input | None = None
    ) -> None:
        effects = self.core.apply_many(inputs)
        hearing = self._hearing
        if hearing is not None:
            hearing.steps.append(CoreStep(made, tuple(effects)))
            if effects or force:
                hearing.changed = True
        self._carry_out(effects)

    def _carry_out(self, effects: Sequence[Effect]) -> None:
        carried = _Carried()
        for effect in effects:
            carry = CARRIERS.get(type(effect))
            if carry is not None:
                carry(self, effect, carried)
        if carried.publications and self._publications_changed is not None:
            self._publications_changed()
        for event in carried.refeed:
            # Each refusal is a core step of its own, in the record (the trace writes it as an
            # input), on the same reading of the clock as the step that led here: a replay,
            # whose clock stands still within a line, computes the very deadlines.
            self._apply([Tick(self._now), event], made=event)

    # -- one method per effect type (see CARRIERS) -----------------------------------------------

    def _open(self, effect: OpenReceiver, carried: _Carried) -> None:
        self._channels.open(effect)

    def _publish(self, effect: PublishAdmissions, carried: _Carried) -> None:
        self._channels.publish(effect)
        self.notifications += 1
        carried.publications = carried.publications or self.core.serves(effect.group)

    def _retire(self, effect: RetireReceiver, carried: _Carried) -> None:
        self._channels.retire(effect)

    def _project(self, effect: LoraProjectionChanged, carried: _Carried) -> None:
        self._channels.project(effect)

    def _start(self, effect: StartBuild, carried: _Carried) -> None:
        self._builds.start(effect)

    def _cancel(self, effect: CancelBuild, carried: _Carried) -> None:
        self._builds.cancel(effect.attempt_id)

    def _commit(self, effect: CommitGroup, carried: _Carried) -> None:
        failure = self._builds.commit(effect)
        if failure is not None:
            carried.refeed.append(failure)
        carried.publications = True

    def _withdraw(self, effect: WithdrawGroup, carried: _Carried) -> None:
        if self._hops is not None:
            self._hops.withdraw(effect)
        carried.publications = True

    def _carry_taints(self, effect: TaintsUpdated, carried: _Carried) -> None:
        if self._hops is not None:
            self._hops.carry_taints(effect)

    def _retry(self, effect: RetryScheduled, carried: _Carried) -> None:
        self._schedule(effect.deadline)

    def _hold(self, effect: TenureHeld, carried: _Carried) -> None:
        self._schedule(effect.deadline)
        if effect.last_known_until is not None:
            # The last known members are withdrawn then, before the hold ends.
            self._schedule(effect.last_known_until)

    def _projection_refused(self, effect: LoraProjectionRefused, carried: _Carried) -> None:
        self._log.warning(
            "LoRA projection of %s refused: %s",
            wire_text(effect.group.id),
            wire_text(effect.reason),
        )

    def _mutation_refused(self, effect: MutationRefused, carried: _Carried) -> None:
        self._log.warning(
            "refused an in-place change of %s: kept %s, offered %s",
            wire_text(effect.key),
            effect.kept_checksum,
            effect.offered_checksum,
        )
        if self._deltas is not None:
            self._deltas.refused(effect)

    def _drain_changed(self, effect: DrainChanged, carried: _Carried) -> None:
        if self._hops is not None:
            self._hops.drain_changed(effect)
        if self._deltas is not None:
            self._deltas.drain_changed(effect)

    def _reported_only(self, effect: Effect, carried: _Carried) -> None:
        """Nothing to carry out: the subscribers hear it in the step's record."""


def _arrival_text(came_in: Arrival) -> str:
    if isinstance(came_in, tuple):
        return f"{len(came_in)} applied inputs"
    if isinstance(came_in, Tick):
        return "a tick"
    if isinstance(came_in, BuildFinished):
        return f"the build result of {wire_text(came_in.group.id)}"
    return type(came_in).__name__


@dataclass(slots=True)
class _Carried:
    """What carrying out one step's effects leaves for its end."""

    # Inputs the parts made (a commit a hop refused), fed back after every effect is carried.
    refeed: list[Input] = field(default_factory=list)
    # Whether what is served changed, so the serving publication must be woken.
    publications: bool = False


_Carry = Callable[[AdmissionStep, Any, _Carried], None]

CARRIERS: Final[Mapping[type, _Carry]] = {
    WorkerPlaced: AdmissionStep._reported_only,
    WorkerDeparted: AdmissionStep._reported_only,
    WorkerDrained: AdmissionStep._reported_only,
    DrainChanged: AdmissionStep._drain_changed,
    HandoverEnded: AdmissionStep._reported_only,
    OpenReceiver: AdmissionStep._open,
    PublishAdmissions: AdmissionStep._publish,
    RetireReceiver: AdmissionStep._retire,
    StartBuild: AdmissionStep._start,
    CancelBuild: AdmissionStep._cancel,
    CommitGroup: AdmissionStep._commit,
    WithdrawGroup: AdmissionStep._withdraw,
    Succession: AdmissionStep._reported_only,
    TenureHeld: AdmissionStep._hold,
    TenureHoldEnded: AdmissionStep._reported_only,
    RejectionReported: AdmissionStep._reported_only,
    MutationRefused: AdmissionStep._mutation_refused,
    TaintsUpdated: AdmissionStep._carry_taints,
    RetryScheduled: AdmissionStep._retry,
    BuildDiscarded: AdmissionStep._reported_only,
    StatusChanged: AdmissionStep._reported_only,
    LoraProjectionChanged: AdmissionStep._project,
    LoraProjectionRefused: AdmissionStep._projection_refused,
}
"""The one dispatch over effects: each effect type and the step's method that carries it out.

Every type of :data:`~workerset_admission.admission.Effect` is here, in the order the core's
effects module declares them; a type with nothing to carry out says so.
"""
