"""One admission step: a source event becomes core inputs, and the core's effects are carried out.

This is the code the live service and ``replay`` share. :class:`AdmissionStep` owns the core
and the ingestion of discovery events, and carries out every effect through the parts it is
given: the receivers' channels, a :class:`BuildRunner`, the hop bindings, a timer and the
publication's wake-up. The live service gives it the real parts (builds as asyncio tasks, the
Dynamo hops, the serving publication); ``replay`` gives it builds answered from the trace and
a clock that follows the trace's times. Everything else (the batching of one event into one
core step, the clock read for every snapshot and expiry, refusals, the order in which effects
are carried out, the build results and refused commits fed back) is the same function in both.
The step decides nothing: whether an expiry is an outage's, whether a LoRA projection may be
served and which group a taint change reaches are the core's judgements, carried by its
effects.

The clock is read once when a step begins (an event, a build result, a timer tick), and that
one reading is used for everything the step does, so a replay whose clock is the recorded
reading makes the very decisions the live step made. Observers see what the step saw and did,
in order: every source event as it is handled (with the clock and the keys a reconciliation
kept), every build result, every timer tick, every ingestion verdict, every input the step made
itself (a refused commit, fed back as a core step of its own), every list of effects, and the
end of each step. The live service's trace writer is one (it records every input and the digest
of each step's effects); ``replay`` is another (it checks its own effects against those
digests, and keeps its notes for ``explain``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Protocol

from workerset_admission.admission import (
    AdmissionCore,
    BuildFinished,
    CancelBuild,
    CommitGroup,
    Effect,
    Input,
    LoraProjectionChanged,
    LoraProjectionRefused,
    MutationRefused,
    OpenReceiver,
    PublishAdmissions,
    RetireReceiver,
    RetryScheduled,
    StartBuild,
    TaintsUpdated,
    TenureHeld,
    Tick,
    WithdrawGroup,
)
from workerset_admission.admission.ordering import GroupId
from workerset_admission.aio import collector_paused
from workerset_admission.errors import RemoteDataError, UsageError
from workerset_admission.identity import GroupKey
from workerset_admission.ports import SourceDelete, SourceEvent, SourcePut, SourceSnapshot
from workerset_admission.service.ingest import Ingested, Ingestor
from workerset_admission.telemetry import AdmissionTelemetry, UpdateScope

__all__ = ["AdmissionStep", "BuildRunner", "StepObserver"]

_log = logging.getLogger("workerset_admission.service.shell")


class BuildRunner(Protocol):
    """Runs the builds the core asks for and holds what was committed."""

    def start(self, effect: StartBuild) -> None:
        """Start the build; its result comes back through :meth:`AdmissionStep.build_finished`."""
        ...

    def cancel(self, group: GroupKey, generation: int) -> None: ...

    def commit(self, effect: CommitGroup) -> Input | None:
        """Serve the built pipeline; a refusal comes back as an input for the core."""
        ...

    def withdraw(self, group: GroupKey, generation: int) -> None: ...

    def is_committed(self, group: GroupKey) -> bool: ...


class Hops(Protocol):
    """The hop bindings, as the step needs them."""

    def handle(self, effect: object) -> None: ...

    def carry_taints(self, effect: TaintsUpdated) -> bool: ...


class Channels(Protocol):
    def handle(self, effect: object) -> None: ...


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

        ``keep`` (snapshots only) names keys that live updates touched while a reconciliation
        listing was read; ``recorded`` (snapshots only) is a recorded frontend's cohort order,
        which the listing is then observed in.
        """
        now = self._now = self.clock()
        for observer in self.observers:
            self._tell(observer.source_event, event, now, keep, recorded)
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
        elif isinstance(event, SourceSnapshot):
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

    # -- one core step -----------------------------------------------------------------------------

    def apply(
        self, inputs: Sequence[Input], scope: UpdateScope | None = None, *, force: bool = False
    ) -> None:
        """Apply ``inputs`` as one core step, then carry out every effect it returns."""
        effects = self.core.apply_many(inputs)
        for observer in self.observers:
            self._tell(observer.effects, effects)
        if scope is not None:
            scope.effects(effects)
        else:
            self._telemetry.effects(effects)
        self._carry_out(effects)
        if effects or force:
            self._note_change()

    def _carry_out(self, effects: Sequence[Effect]) -> None:
        refeed: list[Input] = []
        publications = False
        builds = self._builds
        for effect in effects:
            if isinstance(effect, (OpenReceiver, PublishAdmissions, RetireReceiver)):
                self._channels.handle(effect)
                if isinstance(effect, PublishAdmissions):
                    self.notifications += 1
                    publications = publications or builds.is_committed(effect.group)
            elif isinstance(effect, StartBuild):
                builds.start(effect)
            elif isinstance(effect, CancelBuild):
                builds.cancel(effect.group, effect.generation)
            elif isinstance(effect, CommitGroup):
                failure = builds.commit(effect)
                if failure is not None:
                    refeed.append(failure)
                publications = True
            elif isinstance(effect, WithdrawGroup):
                builds.withdraw(effect.group, effect.generation)
                publications = True
            elif isinstance(effect, LoraProjectionChanged):
                self._channels.handle(effect)
            elif isinstance(effect, LoraProjectionRefused):
                self._log.warning(
                    "LoRA projection of %s refused: %s", effect.group.id, effect.reason
                )
            elif isinstance(effect, TaintsUpdated):
                if self._hops is not None:
                    self._hops.carry_taints(effect)
            elif isinstance(effect, (RetryScheduled, TenureHeld)):
                self._schedule(effect.deadline)
                if isinstance(effect, TenureHeld) and effect.last_known_until is not None:
                    # The last known members are withdrawn then, before the hold ends.
                    self._schedule(effect.last_known_until)
            elif isinstance(effect, MutationRefused):
                self._log.warning(
                    "refused an in-place change of %s: kept %s, offered %s",
                    effect.key,
                    effect.kept_checksum,
                    effect.offered_checksum,
                )
        if publications and self._publications_changed is not None:
            self._publications_changed()
        for event in refeed:
            # Each refusal is a core step of its own, heard by the observers (the trace records
            # it as an input), on the same reading of the clock as the step that led here: a
            # replay, whose clock stands still within a line, computes the very deadlines.
            for observer in self.observers:
                self._tell(observer.made, event, self._now)
            self.apply([Tick(self._now), event])

    def _note_change(self) -> None:
        if self._changed is not None:
            self._changed()

    def _tell(self, method: Callable[..., None], *args: object) -> None:
        try:
            method(*args)
        except Exception:  # an observer must never stop admission
            self._log.debug("a step observer failed", exc_info=True)
