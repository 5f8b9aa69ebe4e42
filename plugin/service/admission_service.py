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
  the optional *status responder* answers status requests;
* the *status round* keeps the status snapshot current (:mod:`~.status_fold`): at most every
  ``STATUS_INTERVAL`` seconds while changes come, it copies the changed groups on the loop and
  reads them out in a thread into the read store (:mod:`~.read_store`), so a status read from
  any other thread takes the latest snapshot and never waits for the loop; the status, the
  serving records, the worker listing and the worker gauges are rendered from that store.

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
from workerset_admission.service.read_store import ReadStore
from workerset_admission.service.receivers import AdmissionChannels, AdmissionReceiver
from workerset_admission.service.status_fold import (
    ROUND_SHARE,
    ROUND_WAIT_MAX,
    STATUS_INTERVAL,
    StatusFold,
)
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

# Seconds without a status read from another thread after which rounds wait the longest.
READERS_GONE = 10.0

# A status answer rendered once for one snapshot: the snapshot, and its JSON but ``process``.
_Rendered = tuple[ServiceStatus, bytes]

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
        # Seconds a status round waits after a change, so that a burst's steps coalesce.
        self.status_interval = STATUS_INTERVAL
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
        # The latest published status (read from any thread), and whether a change since it
        # (a refusal, the first listing, a step) is not in it yet; a change wakes the round.
        self._status_now: ServiceStatus = EMPTY_STATUS
        self._status_stale = True
        self._status_wake = asyncio.Event()
        self._status_wake.set()  # the first round publishes the first picture
        # When a thread other than the loop's last read the status (monotonic clock): until
        # one does, rounds wait the longest.
        self._read_at = float("-inf")
        # The latest status answer rendered, whole and brief: (the snapshot, its JSON but
        # ``process``) each.
        self._rendered: tuple[_Rendered | None, _Rendered | None] = (None, None)
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
                    tg.create_task(self._status_rounds(), name="admission status rounds"),
                ]
                if self._publication is not None:
                    helpers.append(
                        tg.create_task(self._publication.run(), name="admission publish")
                    )
                if self._status is not None:
                    retry = self.settings.publish_retry
                    status = serve_status(
                        self._status, self.render_status, self.fresh_status, retry
                    )
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
        # The rounds have stopped: the last snapshot, shutting down, is published here.
        self._publish_status(self._fold.refresh())

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
        """Return the state as an immutable picture; safe from any thread, never waits.

        From any thread but the loop's (the Dynamo frontend's HTTP handlers, a status answer
        rendered in a thread, the gauges' reader) it is the latest published snapshot: it calls
        nothing on the loop and nothing in the core. It lives until the next status round: a
        change is in a snapshot published at most ``ROUND_WAIT_MAX`` (1 s; ``status_interval``,
        0.1 s, while rounds are cheap) plus one round after it. Its ``as_of`` (Unix time) says
        when it was taken, and every step that ended before then is in it (see
        :mod:`~.status_fold`). On the loop itself, or with no loop running,
        the changed groups are rebuilt first, so the picture is exact.
        """
        loop = self._loop
        if loop is None or on_loop(loop) or not loop.is_running():
            if self._status_stale or self._fold.dirty:
                self._publish_status(self._fold.refresh())
        else:
            # The one thing a reader in another thread writes: when it read (a float, swapped
            # whole), so the rounds keep their short wait while someone is reading.
            self._read_at = time.monotonic()
        return self._status_now

    async def fresh_status(self) -> ServiceStatus:
        """Return the status with every step before the call in it, without holding the loop.

        For an answer the loop awaits (the NATS status responder): a picture behind is brought
        up to date by a round now (the changed groups copied on the loop in slices, read out
        in a thread), so the answer is exact as of the request, however long ago the last
        reader in another thread came.
        """
        if self._status_stale or self._fold.dirty:
            self._publish_status(await self._fold.refresh_off_loop())
        return self._status_now

    def settled_status(self, timeout: float = 1.0) -> ServiceStatus:
        """Return the status with every step before the call in it; for a reader in any thread.

        On the loop, or with no loop running, :meth:`status` is exact already. From another
        thread (the frontend's routes) this thread waits, up to ``timeout`` seconds, for a
        round the loop runs now (:meth:`fresh_status`: the loop is never held), and falls back
        to the latest snapshot, whose ``as_of`` says its age, when the round is late.
        """
        loop = self._loop
        if loop is None or on_loop(loop) or not loop.is_running():
            return self.status()
        future = asyncio.run_coroutine_threadsafe(self.fresh_status(), loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            return self.status()

    def render_status(self, brief: bool = False) -> bytes:
        """Render the status as JSON bytes; ``brief`` gives counts instead of member lists.

        ``process`` adds the process's open asyncio tasks, read at the moment of the answer.
        Called in a thread, it renders the latest snapshot there (see :meth:`status`); the
        rest of the answer is rendered once per snapshot and form, and kept until the next.
        """
        current = self.status()
        forms = self._rendered
        kept = forms[brief]
        if kept is None or kept[0] is not current:
            # The whole answer but ``process``, its keys in order. The pair of forms is one
            # immutable tuple swapped in whole: a reader in any thread sees one rendering or
            # another, and a lost race costs only a rendering again.
            kept = (current, json.dumps(current.to_json(brief=brief), sort_keys=True).encode())
            self._rendered = (forms[0], kept) if brief else (kept, forms[1])
        process = json.dumps(process_figures(), sort_keys=True).encode()
        return b'{"process": ' + process + b", " + kept[1][1:]

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
        self._status_stale = True
        self._status_wake.set()

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

    async def _status_rounds(self) -> None:
        """Keep the status snapshot current: one round per change, after a wait.

        A change wakes it; it waits ``status_interval``, or ``ROUND_SHARE`` times the CPU
        time of the last round's read-out if that is longer, at most ``ROUND_WAIT_MAX``: the
        burst's later steps join the same round, and the round's thread holds the
        interpreter's lock a bounded share of the time, whatever the fleet's size. Until a
        thread other than the loop's reads the status, and ``READERS_GONE`` seconds after the
        last one did, it waits the longest.
        Then it runs one round (:meth:`StatusFold.refresh_off_loop`) and publishes it.
        """
        fold = self._fold
        while True:
            await self._status_wake.wait()
            wait = max(self.status_interval, ROUND_SHARE * fold.round_seconds)
            if time.monotonic() - self._read_at > READERS_GONE:
                # Nobody in another thread has read for a while: the longest wait will do.
                wait = ROUND_WAIT_MAX
            await asyncio.sleep(min(wait, ROUND_WAIT_MAX))
            self._status_wake.clear()
            self._publish_status(await fold.refresh_off_loop())
            if fold.dirty:
                # Named again during the round: the next round takes it.
                self._status_wake.set()

    def _publish_status(self, fold: ReadStore) -> None:
        """Publish the status made of the store ``fold`` and the service's own figures."""
        self._status_stale = False
        self._status_now = ServiceStatus(
            health=self._health(),
            synced=self._synced.is_set(),
            groups=fold.groups,
            rejections=fold.rejections,
            readiness=fold.readiness,
            invalid_total=self.counters.invalid,
            recent_invalid=tuple(self._invalid),
            live_instances=len(self.liveness),
            builds_in_flight=self.core.builds_in_flight,
            listings_applied=self.counters.listings,
            frontend=self.frontend_id,
            as_of=fold.as_of,
            store=fold,
        )

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
    """The service's own subscriber: a step that changed admission state wakes the round."""

    __slots__ = ("_service",)

    def __init__(self, service: AdmissionService) -> None:
        self._service = service

    def heard(self, record: StepRecord) -> None:
        if record.changed or record.delta is not None:
            self._service._changed()

    def __repr__(self) -> str:
        return "the service's status snapshot"


async def serve_status(
    status: StatusResponder,
    render: Callable[[bool], bytes],
    settle: Callable[[], Awaitable[object]],
    retry: float,
) -> None:
    """Answer status requests until cancelled, restarting the responder after a failure."""
    while True:
        # NATS may be away: status must not take admission down.
        await _attempt("the status responder (retrying)", lambda: status.serve(render, settle))
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
