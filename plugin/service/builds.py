"""Pipeline builds: one task per attempt, results fenced by generation in the core.

The core decides when to build, cancel and commit; this runs the builder as tasks and keeps
nothing else. A build's result reaches the core as ``BuildFinished`` carrying the attempt's
checksum and generation, so a late answer from a stale attempt is fenced out there. What a
finished build made waits here until the core commits or cancels its attempt; at the commit
it goes to the hop binding with everything else the group serves. What is committed is the
core's to say (``AdmissionCore.serving``): no account of it is kept here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from workerset_admission.admission import BuildFinished, CommitFailed, CommitGroup, StartBuild
from workerset_admission.errors import WorkersetAdmissionError, wire_text
from workerset_admission.identity import AttemptId
from workerset_admission.ports import BuildRequest, PipelineBuilder
from workerset_admission.routing import FrontendRouting, RoutingSettings
from workerset_admission.service.bindings import HopBindings
from workerset_admission.service.liveness import LivenessIndex
from workerset_admission.service.receivers import AdmissionChannels

__all__ = ["Builds", "DefaultPipelineBuilder"]

_log = logging.getLogger(__name__)


class DefaultPipelineBuilder:
    """Builds nothing beyond the hop binding: checks the selected card yields routing settings.

    The hop binding itself is made by the service when the build is committed, from the
    group's receiver and selected card.
    """

    def __init__(self, frontend: FrontendRouting | None = None) -> None:
        self._frontend = frontend

    async def build(self, request: BuildRequest) -> object:
        return RoutingSettings.resolve(request.card, self._frontend or FrontendRouting())


@dataclass(slots=True)
class _Build:
    effect: StartBuild
    task: asyncio.Task[None] | None = None
    pipeline: object = None


class Builds:
    """The builds in flight of one service, and what each finished one made until its commit."""

    def __init__(
        self,
        builder: PipelineBuilder,
        channels: AdmissionChannels,
        hops: HopBindings,
        liveness: LivenessIndex,
        telemetry: Any,
        *,
        finished: Callable[[BuildFinished], None],
    ) -> None:
        self._builder = builder
        self._channels = channels
        self._hops = hops
        self._liveness = liveness
        self._telemetry = telemetry
        self._finished = finished
        self._builds: dict[AttemptId, _Build] = {}
        # The service's task group while it runs; builds asked for outside of that never start.
        self.task_group: Any = None

    def start(self, effect: StartBuild) -> None:
        """Run the builder for ``effect`` as a task of the service's task group."""
        tg = self.task_group
        if tg is None:
            return
        sender = self._channels.sender(effect.receiver)
        if sender is None:
            return  # the tenure already ended: the build would be cancelled at once anyway
        build = _Build(effect)
        self._builds[effect.attempt_id] = build
        request = BuildRequest(
            group=effect.group,
            mdc_checksum=effect.mdc_checksum,
            generation=effect.generation,
            attempt=effect.attempt,
            representative=effect.representative,
            card=effect.card,
            receiver=sender.subscribe(),
            liveness=self._liveness,
        )
        build.task = tg.create_task(
            self._run(build, request), name=f"build {effect.group.id} g{effect.generation}"
        )

    async def _run(self, build: _Build, request: BuildRequest) -> None:
        effect = build.effect
        ok, error = True, None
        scope = self._telemetry.build_attempt(
            effect.group, effect.mdc_checksum, effect.generation, effect.attempt
        )
        try:
            with scope:
                build.pipeline = await self._builder.build(request)
        except asyncio.CancelledError:
            request.receiver.close()
            raise
        except Exception as exc:  # the builder is the host's code: any failure fails the attempt
            ok, error = False, f"{type(exc).__name__}: {exc}"
            _log.warning(
                "pipeline build failed for %s (generation %d, attempt %d): %s",
                wire_text(effect.group.id),
                effect.generation,
                effect.attempt,
                wire_text(error),
            )
            request.receiver.close()
        # A result for an attempt the core already cancelled (a builder that finished anyway)
        # goes back too: the core fences it on checksum and generation, in one place, and a
        # recording of this frontend shows it arrive.
        self._finished(
            BuildFinished(effect.group, effect.mdc_checksum, effect.generation, ok, error)
        )
        # A committed build was taken over by its commit; anything else is dropped here.
        if self._builds.get(effect.attempt_id) is build:
            del self._builds[effect.attempt_id]

    def cancel(self, attempt: AttemptId) -> None:
        build = self._builds.pop(attempt, None)
        if build is not None and build.task is not None:
            build.task.cancel()

    def cancel_all(self) -> None:
        for build in self._builds.values():
            if build.task is not None:
                build.task.cancel()
        self._builds.clear()

    def commit(self, effect: CommitGroup) -> CommitFailed | None:
        """Bind the committed build to its hop; a refusal comes back for the core to retry."""
        build = self._builds.pop(effect.attempt_id, None)
        pipeline = None if build is None else build.pipeline
        try:
            self._hops.commit(effect, pipeline)
        except (WorkersetAdmissionError, TypeError, ValueError) as exc:
            # The hop refused (no open channel, a retired receiver) or the card's routing
            # config does not read as one: the old binding stays and the core retries.
            _log.warning(
                "commit of %s failed: %s; its previous binding stays and the build is retried",
                wire_text(effect.group.id),
                wire_text(exc),
            )
            return CommitFailed(
                effect.group,
                effect.mdc_checksum,
                effect.generation,
                "commit",
                f"{type(exc).__name__}: {exc}",
            )
        return None
