"""The live admission service: discovery source in, admission core, effects carried out.

Theory of operation
-------------------

One :class:`AdmissionService` owns every task it runs in a single ``asyncio.TaskGroup``:

* the *source loop* hands each source event to the :class:`~.step.AdmissionStep` (the step
  ``replay`` runs too): ingestion, one core step, the effects carried out; a listing is one
  step, so receivers hear about it once; an initial or reconnect listing first has what the
  other live frontends serve attached (``peers``: a ``ListingPeers``);
* the *timer loop* feeds the core a ``Tick`` whenever a deadline it scheduled (a retry, a hold)
  falls due, and the *reconciliation loop* applies a full listing every
  ``reconcile_interval`` seconds, unless the source shows its watch missed nothing;
* :mod:`~.builds` runs one task per ``StartBuild`` and feeds the result back as
  ``BuildFinished`` (fenced by checksum and generation);
* :mod:`~.publication` keeps the serving-admission records in step with the committed groups;
  the optional *status responder* answers status requests.

Every core step runs synchronously on the event loop, and its effects are carried out before
the next one starts, so the core, the receivers and the bindings never disagree for longer than
one step. Stopping withdraws the publications, retires every receiver and cancels every build.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import inspect
import json
import logging
import sys
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from types import TracebackType

from workerset_admission.admission import AdmissionCore, BuildFinished
from workerset_admission.aio import cancel_and_wait, on_loop, unwrap_group
from workerset_admission.errors import RemoteDataError, UsageError, bounded_text, wire_text
from workerset_admission.identity import GroupKey
from workerset_admission.ports import (
    AdmissionPublisher,
    BuildRequest,
    DiscoverySource,
    ListingPeers,
    PipelineBuilder,
    SourceDelete,
    SourceEvent,
    SourceListing,
    SourcePut,
    StatusResponder,
)
from workerset_admission.service.bindings import AdmittedHopBinding, FrontendRouting, HopBindings
from workerset_admission.service.builds import Builds, DefaultPipelineBuilder
from workerset_admission.service.delta import DeltaMaker
from workerset_admission.service.ingest import CardRecordDecoder, Ingestor, RecordDecoder
from workerset_admission.service.process_figures import process_figures
from workerset_admission.service.publication import ServingPublication
from workerset_admission.service.receivers import AdmissionChannels, AdmissionReceiver
from workerset_admission.service.status_fold import StatusFold
from workerset_admission.service.status_model import (
    EMPTY_STATUS,
    GroupStatusReport,
    InvalidRecord,
    ServiceCounters,
    ServiceStatus,
    ServingRecord,
    state_summary,
)
from workerset_admission.service.step import (
    AdmissionStep,
    DeltaReader,
    StepRecord,
    StepSubscriber,
)
from workerset_admission.service.timers import RetryTimers
from workerset_admission.settings import Settings
from workerset_admission.telemetry import (
    AdmissionStateSummary,
    AdmissionTelemetry,
    RefusalWarnings,
    UpdateScope,
)

if sys.version_info >= (3, 11):
    from asyncio import TaskGroup
else:  # pragma: no cover - exercised on Python 3.10 only
    from taskgroup import TaskGroup  # type: ignore[import-not-found,unused-ignore]

__all__ = [
    "AdmissionService",
    "BuildRequest",
    "CardRecordDecoder",
    "GroupStatusReport",
    "PipelineBuilder",
    "ServiceStatus",
]

_log = logging.getLogger(__name__)

# --------------------------------------------------------------------------- the service


class AdmissionService:
    """Run WorkerSet admission over a discovery source; see the module docstring."""

    def __init__(
        self,
        source: DiscoverySource,
        *,
        decoder: RecordDecoder | None = None,
        builder: PipelineBuilder | None = None,
        frontend: FrontendRouting | None = None,
        publisher: AdmissionPublisher | None = None,
        status: StatusResponder | None = None,
        telemetry: AdmissionTelemetry | None = None,
        settings: Settings | None = None,
        clock: Callable[[], float] = time.monotonic,
        closers: Sequence[Callable[[], Awaitable[None]]] = (),
        peers: ListingPeers | None = None,
    ) -> None:
        self.settings = settings or Settings()
        self._source = source
        # Attaches what the other live frontends serve to each initial and reconnect listing.
        self._peers = peers
        self._publisher = publisher
        # The identity this frontend publishes under; its status shows it too.
        self.frontend_id: str | None = getattr(publisher, "frontend_id", None)
        self._status = status
        self._telemetry = telemetry or AdmissionTelemetry()
        self._telemetry.observe_state(self._state_summary)
        self._clock = clock
        self._closers = tuple(closers)

        self.core = AdmissionCore(self.settings.core_settings())
        self.channels = AdmissionChannels()
        self.ingest = Ingestor(decoder)
        self.liveness = self.ingest.liveness
        self.hops = HopBindings(self.channels, self.liveness, frontend)
        # The status and the serving records, kept per group as the core's effects name them.
        self._fold = StatusFold(self.core, self.liveness, clock)
        self._summary: tuple[ServiceStatus, AdmissionStateSummary] | None = None
        self.builds = Builds(
            builder or DefaultPipelineBuilder(frontend),
            self.channels,
            self.hops,
            self.liveness,
            self._telemetry,
            finished=self._build_finished,
        )
        self._timers = RetryTimers(clock, lambda now: self.step.tick(now))
        self._publication = (
            None
            if publisher is None
            else ServingPublication(
                publisher,
                self.serving_records,
                self.settings.publish_interval,
                self.settings.publish_retry,
                prepare=self._before_publication,
                synced=lambda: self._synced.is_set(),
            )
        )
        self._publication_hooks: list[Callable[[], object]] = []
        self._also_serving: list[Callable[[], Mapping[str, Collection[str]]]] = []
        self._invalid: collections.deque[InvalidRecord] = collections.deque(
            maxlen=self.settings.invalid_history
        )
        self.counters = ServiceCounters()
        self._refusal_warnings = RefusalWarnings(_log, clock=clock)
        self._synced = asyncio.Event()
        self._stopping = asyncio.Event()
        self._stopped = asyncio.Event()
        self._runner: asyncio.Task[None] | None = None
        self._tg: TaskGroup | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._status_cache: ServiceStatus | None = None
        self._failure: BaseException | None = None
        self._shut_down = False
        # Keys live updates touched while a reconciliation listing is being read.
        self._touched: set[str] | None = None
        self._resyncs = 0
        self.step = AdmissionStep(
            self.core,
            self.ingest,
            channels=self.channels,
            builds=self.builds,
            hops=self.hops,
            clock=clock,
            telemetry=self._telemetry,
            refuse=self._refuse,
            schedule=self._timers.add,
            # What is served changed: the publication is woken directly, its round runs after.
            publications_changed=None if self._publication is None else self._publication.wake,
            deltas=DeltaMaker(self.hops, self.liveness),
            log=_log,
        )
        # Telemetry first (it reports the effects in the update's span), then the status fold
        # and the service's own state change: every other subscriber hears a step after the
        # status reflects it.
        self.step.subscribe(self._telemetry)
        self.step.subscribe(DeltaReader(self._fold))
        self.step.subscribe(_StateChanged(self))
        self._on_stopped: list[Callable[[], None]] = []

    # -- lifecycle ---------------------------------------------------------------------------

    async def __aenter__(self) -> AdmissionService:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def start(self) -> None:
        """Start every task in the background and return at once."""
        if self._runner is not None:
            raise UsageError("the admission service was already started")
        self._loop = asyncio.get_running_loop()
        started = asyncio.Event()
        self._runner = asyncio.create_task(self._run(started), name="workerset-admission")
        await started.wait()

    async def stop(self) -> None:
        """Withdraw publications, retire receivers, cancel builds, and wait for every task."""
        if self._runner is None:
            return
        self._stopping.set()
        runner = self._runner
        if not runner.done():
            # The runner ends itself once stopping is set: shutdown, then its last lines.
            await asyncio.wait({runner})
        if not runner.cancelled() and runner.exception() is not None:
            # ``_run`` keeps what failed (``run`` raises it); only what escaped it is here.
            _log.warning("the admission service's runner ended on an error: %r", runner.exception())

    async def run(self) -> None:
        """Start (unless started), then run until stopped (signals are the caller's)."""
        if self._runner is None:
            await self.start()
        try:
            await self._stopped.wait()
        finally:
            await self.stop()
        if self._failure is not None:
            raise self._failure

    async def wait_synced(self, timeout: float | None = None) -> None:
        """Wait until the first listing has been applied.

        Raises ``TimeoutError`` after ``timeout`` seconds, and the service's failure (or
        ``UsageError``) when it stops before it ever synced.
        """
        waits = {
            asyncio.ensure_future(self._synced.wait()),
            asyncio.ensure_future(self._stopped.wait()),
        }
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in waits:
                waiting.cancel()
        if self._synced.is_set():
            return
        if self._stopped.is_set():
            if self._failure is not None:
                raise self._failure
            raise UsageError("the admission service stopped before its first snapshot")
        raise asyncio.TimeoutError("no discovery snapshot yet")

    @property
    def synced(self) -> bool:
        return self._synced.is_set()

    @property
    def running(self) -> bool:
        return self._runner is not None and not self._stopped.is_set()

    async def _run(self, started: asyncio.Event) -> None:
        try:
            async with TaskGroup() as tg:
                self._tg = tg
                self.builds.task_group = tg
                source = tg.create_task(self._source_loop(), name="admission source")
                helpers = [
                    tg.create_task(self._timers.run(), name="admission timers"),
                    tg.create_task(self._reconcile_loop(), name="admission reconcile"),
                ]
                if self._publication is not None:
                    helpers.append(
                        tg.create_task(self._publication.run(), name="admission publish")
                    )
                if self._status is not None:
                    retry = self.settings.publish_retry
                    status = serve_status(self._status, self.render_status, retry)
                    helpers.append(tg.create_task(status, name="admission status"))
                started.set()
                await self._stopping.wait()
                # Quiet the helpers first, so no publication races the withdrawal below.
                await cancel_and_wait(helpers)
                await self._shutdown()
                source.cancel()
        except Exception as exc:
            self._failure = unwrap_group(exc)
            _log.error("the admission service stopped on an error", exc_info=exc)
            # A crashed task group skipped the orderly shutdown: do what can be done offline.
            await self._shutdown()
        finally:
            self._tg = None
            self.builds.task_group = None
            for hook in self._on_stopped:
                await _attempt("a stop hook", hook)
            started.set()
            self._stopping.set()
            self._stopped.set()

    async def _shutdown(self) -> None:
        if self._shut_down:
            return
        self._shut_down = True
        self.builds.task_group = None
        # Serving records first: an operator must never see this frontend claim a worker it no
        # longer routes to.
        if self._publication is not None:
            await self._publication.withdraw()
        self.hops.withdraw_all()
        self.builds.cancel_all()
        for view in self.core.groups():
            if view.receiver is not None:
                sender = self.channels.sender(view.receiver)
                if sender is not None:
                    sender.retire()
        await _attempt("closing the discovery source", self._source.close)
        for close in self._closers:
            # Every resource gets its chance to close.
            await _attempt("closing a service resource", close)
        self._changed()

    # -- host API ----------------------------------------------------------------------------

    def receiver_for(self, group: GroupKey) -> AdmissionReceiver | None:
        """Open a receiver on the group's current tenure; ``None`` when it has none."""
        return self.channels.subscribe(group)

    def bindings(self) -> list[AdmittedHopBinding]:
        """Return the hop binding of every committed group, sorted by group."""
        return self.hops.bindings()

    def drained_workers(self) -> frozenset[tuple[str, int]]:
        """Return the workers a drain in force names: (namespace, instance id)."""
        return self.hops.drained()

    def binding(self, group: GroupKey) -> AdmittedHopBinding | None:
        return self.hops.binding(group)

    def pipeline(self, group: GroupKey) -> object:
        """Return what the builder made for the group's committed build (``None`` if none)."""
        binding = self.hops.binding(group)
        return None if binding is None else binding.pipeline

    @property
    def recent_invalid(self) -> tuple[InvalidRecord, ...]:
        return tuple(self._invalid)

    def status(self) -> ServiceStatus:
        """Return the current state, rebuilt only after a change; safe from any thread.

        On the service's own loop the picture is rebuilt directly; from another thread (the
        Dynamo frontend's HTTP handler pool) the rebuild runs on the loop and this waits for
        it briefly, falling back to the last picture.
        """
        cached = self._status_cache
        if cached is not None:
            return cached
        loop = self._loop
        if loop is None or on_loop(loop) or not loop.is_running():
            return self._build_status()
        future = asyncio.run_coroutine_threadsafe(self._status_async(), loop)
        try:
            return future.result(timeout=1.0)
        except (concurrent.futures.TimeoutError, concurrent.futures.CancelledError):
            future.cancel()
            return self._status_cache or EMPTY_STATUS

    async def _status_async(self) -> ServiceStatus:
        return self.status()

    def render_status(self, brief: bool = False) -> bytes:
        """Render the status as JSON bytes; ``brief`` gives counts instead of member lists.

        ``process`` adds the process's open asyncio tasks, read at the moment of the answer.
        """
        body = self.status().to_json(brief=brief)
        body["process"] = process_figures()
        return json.dumps(body, sort_keys=True).encode()

    def wake_timers(self) -> None:
        """Re-read the clock now (for hosts and tests that inject a clock that jumps)."""
        self._timers.wake()

    def subscribe(self, subscriber: StepSubscriber) -> None:
        """Hand ``subscriber`` the record of every step from now on (on the loop, at its end).

        This is the one way a step is heard: the trace writer, the read models
        (:class:`~.step.DeltaReader`), the view and any listener of effects subscribe so.
        A subscriber that raises is logged at WARNING and the others still hear the step.
        """
        self.step.subscribe(subscriber)

    def on_stopped(self, hook: Callable[[], None]) -> None:
        """Call ``hook`` once every task has ended (a trace writer closes its file there)."""
        self._on_stopped.append(hook)

    def before_publication(self, hook: Callable[[], object]) -> None:
        """Call ``hook`` before each serving publication reads what this frontend serves."""
        self._publication_hooks.append(hook)

    def also_serving(self, provider: Callable[[], Mapping[str, Collection[str]]]) -> None:
        """Name, per namespace, workers this frontend may still route to though unadmitted.

        The view calls it with the workers whose cards it could not remove: its serving record
        keeps naming them, so a ``drain --wait`` never hears that it is safe while they are.
        """
        self._also_serving.append(provider)

    def _before_publication(self) -> None:
        for hook in self._publication_hooks:
            hook()

    # -- the source loop ---------------------------------------------------------------------

    async def _source_loop(self) -> None:
        peers = self._peers
        async for event in self._source.events():
            if self._stopping.is_set():
                break
            if peers is not None and isinstance(event, SourceListing):
                # A start or a resync observes first what the other live frontends serve.
                event = await peers.attach(event)
                if self._stopping.is_set():
                    break
            self.handle_event(event)
            # A listing carries every raw value of the bucket: let it go before waiting.
            del event
        if not self._stopping.is_set():
            _log.warning("the discovery source ended; stopping the admission service")
            self._stopping.set()

    def handle_event(self, event: SourceEvent, keep: Collection[str] = ()) -> None:
        """Apply one source event as one core step (the step ``replay`` runs too)."""
        touched = self._touched
        if isinstance(event, SourcePut):
            self.counters.puts += 1
            if touched is not None:
                touched.add(event.entry.key)
        elif isinstance(event, SourceDelete):
            self.counters.deletes += 1
            if touched is not None:
                touched.add(event.key)
        elif isinstance(event, SourceListing):
            self.counters.listings += 1
            if event.reason != "periodic":
                self._resyncs += 1
            if event.reason == "reconnect" and self._publication is not None:
                # The store may have lost them; and peers starting soon learn of the outage.
                self._publication.republish(resynced_at=time.time())
        else:
            raise UsageError(f"not a discovery event: {type(event).__name__}")
        self.step.handle_event(event, keep)
        self.counters.notifications = self.step.notifications
        if isinstance(event, SourceListing) and not self._synced.is_set():
            self._synced.set()
            self._changed()
            # A round after the first listing, whatever it changed: the publisher settles then.
            self._publications_changed()

    def _refuse(self, key: str, exc: RemoteDataError, scope: UpdateScope | None) -> None:
        key = bounded_text(key)  # what is reported of a refused key, not what it is counted by
        self.counters.invalid += 1
        self._invalid.append(InvalidRecord(key, exc.reason, exc.detail, self._clock()))
        self._refusal_warnings.refused(key, exc.reason, exc.detail)
        if scope is not None:
            scope.invalid_record(exc.reason, exc.detail, key)
        else:
            self._telemetry.invalid_record(key, exc.reason, exc.detail)
        self._changed()

    def _publications_changed(self) -> None:
        if self._publication is not None:
            self._publication.wake()

    def _build_finished(self, result: BuildFinished) -> None:
        self.step.build_finished(result)
        self.counters.notifications = self.step.notifications

    def _changed(self) -> None:
        self._status_cache = None

    # -- timers and reconciliation ----------------------------------------------------------

    async def _reconcile_loop(self) -> None:
        interval = self.settings.reconcile_interval
        await self._synced.wait()
        # A source that can tell its watch missed nothing spares the relist (adapters/nats).
        missed_nothing = getattr(self._source, "missed_nothing", None)

        async def relist() -> None:
            if missed_nothing is not None and await missed_nothing():
                return
            await self.reconcile()

        while True:
            await asyncio.sleep(interval)
            # The live watch keeps going meanwhile.
            await _attempt("periodic reconciliation (listing the bucket)", relist)

    async def reconcile(self) -> bool:
        """List the whole bucket and apply it as a listing; tell whether it was applied.

        Live updates keep flowing while the listing is read, so the listing may be older than
        what they said: keys they touched meanwhile keep their live state, and a listing that
        a resync (a new watch) overtook is discarded, as Dynamo does.
        """
        resyncs = self._resyncs
        touched: set[str] = set()
        self._touched = touched
        try:
            listing = await self._source.list_all()
        finally:
            if self._touched is touched:
                self._touched = None
        if self._resyncs != resyncs:
            _log.debug("discarded a reconciliation listing that predates a resync")
            return False
        self.handle_event(listing, keep=touched)
        return True

    # -- serving-admission publications -----------------------------------------------------

    def serving_records(self) -> dict[str, ServingRecord]:
        """Return what this frontend serves, per worker namespace (committed groups only)."""
        records = self._fold.serving_records()
        for provider in self._also_serving:
            for namespace, members in provider().items():
                record = records.get(namespace, ServingRecord((), ()))
                records[namespace] = ServingRecord(
                    tuple(sorted({*record.members, *members})), record.groups
                )
        return records

    def serving_members(self) -> dict[str, tuple[str, ...]]:
        """Return the instance keys this frontend serves, per worker namespace."""
        return {ns: record.members for ns, record in self.serving_records().items()}

    # -- status ------------------------------------------------------------------------------

    def _build_status(self) -> ServiceStatus:
        fold = self._fold
        current = ServiceStatus(
            health=self._health(),
            synced=self._synced.is_set(),
            groups=fold.groups(),
            rejections=fold.rejections(),
            readiness=fold.readiness(),
            invalid_total=self.counters.invalid,
            recent_invalid=tuple(self._invalid),
            live_instances=len(self.liveness),
            builds_in_flight=self.core.builds_in_flight,
            listings_applied=self.counters.listings,
            frontend=self.frontend_id,
        )
        self._status_cache = current
        return current

    def _state_summary(self) -> AdmissionStateSummary:
        """Return what the gauges report, worked out once per status (each gauge asks)."""
        current = self.status()
        kept = self._summary
        if kept is None or kept[0] is not current:
            kept = self._summary = (current, state_summary(current))
        return kept[1]

    def _health(self) -> str:
        if self._stopping.is_set():
            return "shutting_down"
        if not self._synced.is_set():
            return "starting"
        return "healthy"


class _StateChanged:
    """The service's own subscriber: a step that changed admission state drops the status."""

    __slots__ = ("_service",)

    def __init__(self, service: AdmissionService) -> None:
        self._service = service

    def heard(self, record: StepRecord) -> None:
        if record.changed:
            self._service._changed()

    def __repr__(self) -> str:
        return "the service's status cache"


async def serve_status(
    status: StatusResponder, render: Callable[[bool], bytes], retry: float
) -> None:
    """Answer status requests until cancelled, restarting the responder after a failure."""
    while True:
        # NATS may be away: status must not take admission down.
        await _attempt("the status responder (retrying)", lambda: status.serve(render))
        await asyncio.sleep(retry)


async def _attempt(what: str, call: Callable[[], object]) -> None:
    """Make one call into a part the service does not own: an adapter, a resource, a hook.

    The one place the service goes on whatever such a part raises: the failure is logged at
    WARNING, with what was being done, and the service carries on (a retrying loop retries).
    """
    try:
        result = call()
        if inspect.isawaitable(result):
            await result
    except Exception as exc:
        _log.warning("%s failed: %s", what, wire_text(exc))
