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
(``channels.open``, ``builds.commit``, ``hops.carry_taints``, an observer's
``worker_drained`` ...). No part looks at an effect's type again. Telemetry is the one other
reader of a step's effects, and reads them as a list: it reports them, by its own table, inside
the update's span before they are carried out.

The clock is read once when a step begins (an event, a build result, a timer tick), and that
one reading is used for everything the step does, so a replay whose clock is the recorded
reading makes the very decisions the live step made. Observers see what the step saw and did,
in order: every source event as it is handled (with the clock and the keys a reconciliation
kept), every build result, every timer tick, every ingestion verdict, every input the step made
itself (a refused commit, fed back as a core step of its own), every list of effects, and the
end of each step. The live service's trace writer is one (it records every input and the digest
of each step's effects); ``replay`` is another (it checks its own effects against those
digests, and keeps its notes for ``explain``).

The read models (the admitted view, the status and serving records) are handed one typed delta
per step, at its end (:class:`~workerset_admission.ports.StepDelta`, made by
:class:`~.delta.DeltaMaker` from what the step saw: the raw event, ingestion's verdicts, the
effects, and the two effects it reads, a refused in-place change and a drain changed). One
delta, one wake-up, per step, and nothing a read model must ask the service back.
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
from workerset_admission.ports import ReadModel, SourceDelete, SourceEvent, SourceListing, SourcePut
from workerset_admission.service.delta import DeltaMaker
from workerset_admission.service.ingest import Ingested, Ingestor
from workerset_admission.telemetry import AdmissionTelemetry, UpdateScope

__all__ = ["CARRIERS", "AdmissionStep", "BuildRunner", "StepObserver"]

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


class StepObserver:
    """Told what a step saw and did; every method does nothing unless overridden.

    An observer must not raise: a failure is logged at DEBUG and admission goes on.
    """

    def source_event(
        self,
        event: SourceEvent,
        now: float,
        keep: Collection[str],
        recorded: Mapping[GroupId, Sequence[str]] | None,
    ) -> None:
        """Hear of a source event as the step begins to handle it, at clock ``now``."""

    def build_result(self, result: BuildFinished, now: float) -> None:
        """Hear of a build result as it is fed back, at clock ``now``."""

    def tick(self, now: float) -> None:
        """Hear of a timer tick at clock ``now``."""

    def ingested(self, result: Ingested) -> None:
        """Hear what ingestion judged of a source event, before the core steps."""

    def made(self, event: Input, now: float) -> None:
        """Hear of an input the step made itself (a commit a hop refused), as it is fed back.

        Its core step follows at once; the effects heard next are that step's.
        """

    def effects(self, effects: Sequence[Effect]) -> None:
        """Hear the effects of one core step, before they are carried out."""

    def rejection_reported(self, effect: RejectionReported) -> None:
        """Hear of a rejected cohort, as the step carries the effect out."""

    def worker_drained(self, effect: WorkerDrained) -> None:
        """Hear of a registration a drain set aside, as the step carries the effect out."""

    def drain_changed(self, effect: DrainChanged) -> None:
        """Hear of a drain begun, changed or lifted, as the step carries the effect out."""

    def mutation_refused(self, effect: MutationRefused) -> None:
        """Hear of a refused in-place change, as the step carries the effect out."""

    def step_ended(self) -> None:
        """Hear that the step a source event, build result or tick began is over."""


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
        changed: Callable[[], None] | None = None,
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
        self._changed = changed
        self._log = log
        self.observers: list[StepObserver] = []
        # The read models, each handed one delta per step (made by ``deltas``) at its end.
        self._deltas = deltas
        self.read_models: list[ReadModel] = []
        self.notifications = 0
        # The clock as the current step read it, once, when it began.
        self._now = 0.0

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
        now = self._now = self.clock()
        for observer in self.observers:
            self._tell(observer.source_event, event, now, keep, recorded)
        if self._deltas is not None:
            self._deltas.source_event(event, keep)
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
        if isinstance(event, SourcePut):
            entry = event.entry
            with self._telemetry.apply_update(event) as scope:
                self._ingested(self.ingest.put(entry.key, entry.value), scope)
        elif isinstance(event, SourceDelete):
            with self._telemetry.apply_update(event) as scope:
                result = self.ingest.removal(event, now=now)
                self._ingested(result, scope)
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
                result = self.ingest.listing(event, keep, now=now, recorded=recorded)
                # Refusals in a listing are reported one by one, not as the listing's failure.
                self._ingested(result, scope, refusals_in_scope=False)
        else:
            raise UsageError(f"not a discovery event: {type(event).__name__}")

    def _ingested(
        self, result: Ingested, scope: UpdateScope, *, refusals_in_scope: bool = True
    ) -> None:
        for observer in self.observers:
            self._tell(observer.ingested, result)
        if self._deltas is not None:
            self._deltas.ingested(result)
        for verdict in result.refusals:
            assert verdict.refusal is not None
            self._refuse(verdict.key, verdict.refusal, scope if refusals_in_scope else None)
        if result.inputs:
            self.apply(result.inputs, scope, force=result.liveness_changed)
            return
        if not result.refusals:
            scope.record_decision(result.decision)
        if result.liveness_changed:
            self._note_change()

    # -- results and timers ----------------------------------------------------------------------

    def build_finished(self, result: BuildFinished) -> None:
        """Feed a build's result back in (fenced by the core on checksum and generation)."""
        now = self._now = self.clock()
        for observer in self.observers:
            self._tell(observer.build_result, result, now)
        try:
            self.apply([Tick(now), result])
        finally:
            self._ended()

    def tick(self, now: float | None = None) -> None:
        """Let the core act on the deadlines due by ``now`` (the clock when not given)."""
        now = self._now = self.clock() if now is None else now
        for observer in self.observers:
            self._tell(observer.tick, now)
        try:
            self.apply([Tick(now)])
        finally:
            self._ended()

    def _ended(self) -> None:
        for observer in self.observers:
            self._tell(observer.step_ended)
        if self._deltas is None:
            return
        delta = self._deltas.finish()
        if delta is None:
            return
        for model in self.read_models:
            self._tell(model.step, delta)

    # -- one core step -----------------------------------------------------------------------------

    def apply(
        self, inputs: Sequence[Input], scope: UpdateScope | None = None, *, force: bool = False
    ) -> None:
        """Apply ``inputs`` as one core step, then carry out every effect it returns."""
        effects = self.core.apply_many(inputs)
        for observer in self.observers:
            self._tell(observer.effects, effects)
        if self._deltas is not None:
            self._deltas.effects(effects)
        if scope is not None:
            scope.effects(effects)
        else:
            self._telemetry.effects(effects)
        self._carry_out(effects)
        if effects or force:
            self._note_change()

    def _carry_out(self, effects: Sequence[Effect]) -> None:
        carried = _Carried()
        for effect in effects:
            carry = CARRIERS.get(type(effect))
            if carry is not None:
                carry(self, effect, carried)
        if carried.publications and self._publications_changed is not None:
            self._publications_changed()
        for event in carried.refeed:
            # Each refusal is a core step of its own, heard by the observers (the trace records
            # it as an input), on the same reading of the clock as the step that led here: a
            # replay, whose clock stands still within a line, computes the very deadlines.
            for observer in self.observers:
                self._tell(observer.made, event, self._now)
            self.apply([Tick(self._now), event])

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
        for observer in self.observers:
            self._tell(observer.mutation_refused, effect)
        if self._deltas is not None:
            self._deltas.refused(effect)

    def _rejection(self, effect: RejectionReported, carried: _Carried) -> None:
        for observer in self.observers:
            self._tell(observer.rejection_reported, effect)

    def _drained(self, effect: WorkerDrained, carried: _Carried) -> None:
        for observer in self.observers:
            self._tell(observer.worker_drained, effect)

    def _drain_changed(self, effect: DrainChanged, carried: _Carried) -> None:
        if self._hops is not None:
            self._hops.drain_changed(effect)
        if self._deltas is not None:
            self._deltas.drain_changed(effect)
        for observer in self.observers:
            self._tell(observer.drain_changed, effect)

    def _reported_only(self, effect: Effect, carried: _Carried) -> None:
        """Nothing to carry out: telemetry reports it, the read models hear it in the delta."""

    def _note_change(self) -> None:
        if self._changed is not None:
            self._changed()

    def _tell(self, method: Callable[..., None], *args: object) -> None:
        try:
            method(*args)
        except Exception:  # an observer must never stop admission
            self._log.debug("a step observer failed", exc_info=True)


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
    WorkerDrained: AdmissionStep._drained,
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
    RejectionReported: AdmissionStep._rejection,
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
