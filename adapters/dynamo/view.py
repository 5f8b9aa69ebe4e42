"""The admitted discovery view: a Dynamo file store holding only the workers admission admits.

Theory of operation
-------------------

Dynamo 1.6.1's frontend takes every hop's workers (decode or aggregated, prefill, encoder) from
its discovery backend. Run with ``--discovery-backend file`` and ``DYN_FILE_KV=<view dir>``, its
discovery is whatever files that directory holds, so the plugin makes itself the frontend's
discovery source: workers keep registering in their own store (mirrored into the NATS bucket),
and this module writes into the view directory the Dynamo records of admitted workers only.

It is an effect consumer, never a second admission. The service's committed hop bindings say,
through their admission receivers, which instances each WorkerSet's tenure admits; the bucket
says which are live and holds their raw records. The view is, per binding:

* every ``v1/instances`` record of an admitted, live instance in the binding's namespace and
  component (its generate endpoint and its auxiliary endpoints, such as the KV query one);
* its ``v1/mdc`` records at the binding's endpoint (with any LoRA adapter cards);
* its ``v1/event_sources`` records (``metadata.worker.worker_id`` names the worker) and the
  ``v1/event_channels`` records published under the same publisher id, so KV-aware routing
  hears the admitted workers' KV events;
* the binding endpoint's other event channels the frontend subscribes to (load metrics,
  forward-pass metrics, active sequences). Their records name only a random publisher id and
  an address, nothing that ties them to a worker, so the channels of a rejected worker at the
  same endpoint come along. That is harmless and no more than Dynamo alone does: the frontend
  on the workers' own store subscribes to the same channels, their events are keyed by worker
  id, and the router looks them up only for the workers its WorkerSet holds, which come from
  the view's model cards and instance records. A channel topic of any other name is left out,
  with a WARNING once.

Publishing follows the file store's rules and the frontend's own behaviour. A file is written
as a ``.tmp_`` file (which the file store ignores) and renamed into place; event and instance
records go in before the model card that makes the frontend build the model, and a card goes
out before its instance records. Within a tenure new records are added before departed ones
are removed, so a replacement joins before its predecessor leaves and the model never empties.
A tenure that ended is withdrawn before anything else in the pass: at a succession the
incumbent's records go, then the successor's appear, so the view never holds two
configurations of one WorkerSet at once (a frontend started in that moment could take either)
and nothing routes to the departed cohort while the successor's files are written. A drained
tenure is the exception the core decides (its successor's commit names it, ``handover_from``):
its workers still serve, so the successor's records go in first and the drained ones go
after, in the same pass. The frontend then holds the successor's records when the drained
workers go, as it does on the workers' own store, and its own first-wins admission keeps the
successor out until that moment; it then drops the model and builds it on the successor. The
successor's records appear only once admission committed it, after the incumbent's last
member left, so no frontend, running or started late, sees them while the incumbent serves.
Nothing of a departed worker is kept for the successor: a SIGTERMed worker stops serving at
once, and a request routed to it fails (measured: keeping its card and instance record until
the successor's commit cost more requests than dropping them).

A drained worker leaves routing when its cards go; its endpoint (``v1/instances``) records
stay in the view until the worker's own leave the bucket. The 1.6.1 frontend cancels the
requests in flight on an instance the moment its endpoint record goes (its discovery-driven
cleanup), so removing them while the drained worker still serves would fail the requests a
drain exists to keep; without its cards no new request reaches it (measured). The exception is
a handover: the frontend admits the successor's configuration only once the old one's last
instance is gone, so when a successor tenure of the same WorkerSet serves, the drained
workers' endpoint records go with their cards.

The view fails static. The frontend's file store deletes a file 10 s after its mtime, so a
view whose files are stamped "now" empties the frontend 10 s after its writer dies or stalls: a
single point of failure Dynamo alone does not have. Every file is stamped a lease ahead
instead (:class:`Horizon`, the operator's ``view_horizon``, 600 s by default), and touched
once per ``Horizon.refresh``: a writer that is killed, paused or stopped leaves a view that the
frontend keeps serving for at least the horizon, and a writer that comes back adopts it
without a gap. A writer that stops cleanly leaves its view in place too (an upgrade, or a
supervisor's restart, costs nothing). A frozen view admits nothing new, so it can only be
stale about departures: a worker that left while no writer ran stays routable until a writer
returns or the horizon passes, and then the store expires the whole view and the frontend
fails closed: a view older than that is not worth routing by, and a supervisor had that long
to restart the writer. While NATS is unreachable nothing changes the admitted state, and the
last view is kept alive.

After an outage a tenure may be *held* with its members served on their last known records
(the core's theory of operation): their records may have left the bucket (a wiped store, or
TTLs that ran out while nobody could refresh them). The record table sets aside every record
that leaves the bucket, a tenure's ``last_known`` members are published from those when the
bucket no longer has them, and each pass forgets the set-aside records no last-known member
called for: the core's window (its ``last_known`` ids, until ``last_known_until``) alone decides
how long they are served. Nothing else is ever published from a dropped record.

The view never judges a record. The service's ingestion judges every discovery record once,
and the composition root hands its verdicts to the record table (an ``AcceptedRecords`` sink):
the raw bytes of each accepted record, filed by key; a refused value never arrives, so the
key's last accepted record stays; a listing replaces the table.

The writer owns its directory: a lock file held for the process's life refuses a second live
writer, and a manifest of the files it wrote lets the next writer remove what a crashed one left
behind. It never deletes a file it did not write.

A writer that starts while NATS is unreachable has nothing to sync from, and the files a
predecessor left are the frontend's only view. They are last known good (:class:`LastKnownGood`):
kept while the writer retries, never touched (their horizon runs from the predecessor's last
touch, not from a restart that knows nothing newer), and withdrawn when that horizon ends.

The parts live beside this module: ``view_directory`` (file naming, the lock, the manifest, the
real directory), ``view_records`` (the record table fed with the boundary's verdicts),
``view_publish`` (the plan and the publication order). This module holds the writer that runs
them from the service, and every public name of the view is importable from here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Protocol

from workerset_admission.adapters.dynamo.filestore import DEFAULT_FILE_TTL
from workerset_admission.adapters.dynamo.view_directory import (
    BUCKETS,
    LOCK_NAME,
    MANIFEST_NAME,
    DirectoryFiles,
    Horizon,
    ViewFile,
    ViewFiles,
    check_frontend_store,
    file_name_for,
)
from workerset_admission.adapters.dynamo.view_publish import (
    REFRESH_SLICE_EVERY,
    SCOPE_TOPICS,
    AdmittedView,
    SyncReport,
    Tenure,
    ViewChanges,
    plan_view,
)
from workerset_admission.adapters.dynamo.view_records import PublishableRecord, RecordTable
from workerset_admission.admission.effects import Effect, groups_named
from workerset_admission.errors import ReceiverRetired, wire_text
from workerset_admission.identity import EndpointId, GroupKey

__all__ = [
    "BUCKETS",
    "LOCK_NAME",
    "MANIFEST_NAME",
    "SCOPE_TOPICS",
    "AdmittedView",
    "DirectoryFiles",
    "Horizon",
    "LastKnownGood",
    "PublishableRecord",
    "RecordTable",
    "SyncReport",
    "Tenure",
    "ViewChanges",
    "ViewFile",
    "ViewFiles",
    "ViewHook",
    "ViewService",
    "ViewWriter",
    "check_frontend_store",
    "file_name_for",
    "note_record_changes",
    "plan_view",
    "tenure_of",
    "tenures_of",
]

_log = logging.getLogger(__name__)
# How many tenures a pass's log line names; the rest are counted.
_LOGGED_TENURES = 5


class ViewService(Protocol):
    """The admission service as the writer reads it."""

    @property
    def synced(self) -> bool: ...

    def bindings(self) -> Sequence[Any]: ...

    def binding(self, group: GroupKey) -> Any: ...

    def drained_workers(self) -> frozenset[tuple[str, int]]: ...

    def on_state_change(self, listener: Callable[[], None]) -> None: ...

    def on_effects(self, listener: Callable[[Sequence[Effect]], None]) -> None: ...

    def before_publication(self, hook: Callable[[], object]) -> None: ...

    def also_serving(self, provider: Callable[[], Mapping[str, Collection[str]]]) -> None: ...


def tenure_of(binding: Any) -> Tenure | None:
    """Return a committed binding's tenure, its routable ids read through its receiver."""
    if binding is None:
        return None
    try:
        routable = binding.routable()
        last_known = binding.last_known()
    except ReceiverRetired:
        return None  # the tenure ended in this very step; its withdrawal is on the way
    return Tenure(
        binding.id.group,
        binding.id.generation,
        frozenset(routable),
        frozenset(last_known),
        getattr(binding, "handover_from", None),
    )


def note_record_changes(table: RecordTable, changes: ViewChanges) -> None:
    """Add to ``changes`` the workers and endpoints whose records changed in ``table``."""
    for kind, namespace, component, number in table.take_changes():
        if kind == "scope":
            assert component is not None
            assert isinstance(number, str)
            changes.scopes.add(EndpointId(namespace, component, number))
        elif kind == "channel":
            # A channel is its publisher's, and a publisher is the worker its source names.
            for source in table.lookup("publisher", namespace, None, number):
                if source.worker_id is not None:
                    changes.workers.add((namespace, source.worker_id))
        elif isinstance(number, int):
            changes.workers.add((namespace, number))


def tenures_of(service: ViewService) -> list[Tenure]:
    """Each committed binding's tenure (see :func:`tenure_of`)."""
    return [t for t in map(tenure_of, service.bindings()) if t is not None]


class ViewWriter:
    """Drive an :class:`AdmittedView` from a running admission service.

    Every admission state change (and every change of a held record) wakes one coalesced pass;
    between changes the files are kept alive. Nothing is written before the service applied
    its first discovery listing: an empty view then would withdraw a restarted frontend's
    workers for no reason.

    A pass costs the change, not the fleet. The writer hears which groups each core step
    named (its effects) and which workers' records changed (the record table's ties), reads
    those groups' bindings alone, and hands the view that much (:class:`ViewChanges`). The
    first pass plans the whole view, and so does every pass while a tenure is held; every
    ``check_interval`` seconds a full plan is compared with the fold, and a difference is
    logged at WARNING and mended by publishing the full plan.
    """

    def __init__(
        self, view: AdmittedView, table: RecordTable, *, check_interval: float = 300.0
    ) -> None:
        self.view = view
        self.table = table
        self.check_interval = check_interval
        self._service: ViewService | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._groups: set[GroupKey] = set()
        self._drains: frozenset[tuple[str, int]] = frozenset()
        self._planned = False
        self._checked_at = time.monotonic()
        self.syncs = 0
        self.last_sync_at: float | None = None

    def attach(self, service: ViewService) -> None:
        """Follow ``service`` (call on its loop); the writer starts at once."""
        self._service = service
        service.on_effects(self._heard)
        service.on_state_change(self.wake)
        # The serving records say what this frontend routes to: the files first.
        service.before_publication(self.sync_now)
        # A card the view could not remove still routes: the serving record keeps naming it.
        service.also_serving(self.view.unremoved_cards)
        self.table.set_listener(self.wake)
        self._task = asyncio.ensure_future(self._run())

    def wake(self) -> None:
        self._wake.set()

    def _heard(self, effects: Sequence[Effect]) -> None:
        """Note the groups one core step named (any effect naming a group may change it)."""
        self._groups |= groups_named(effects)

    def _changes(self, service: ViewService, drained: frozenset[tuple[str, int]]) -> ViewChanges:
        """Return what changed since the last pass, each named group's tenure read anew."""
        # A drain set or lifted changes what the view keeps of that worker.
        changes = ViewChanges(workers=set(drained ^ self._drains))
        self._drains = drained
        note_record_changes(self.table, changes)
        groups, self._groups = self._groups, set()
        for namespace in {namespace for namespace, _ in changes.workers}:
            # A record may change whom a binding routes to (its endpoint record: liveness).
            groups.update(self.view.groups_in(namespace))
        changes.tenures = {group: tenure_of(service.binding(group)) for group in groups}
        return changes

    def sync_now(self) -> SyncReport:
        service = self._service
        if service is None or not service.synced:
            return SyncReport()
        drained = service.drained_workers()
        changes = self._changes(service, drained)
        full = not self._planned or self.view.holding
        full = full or any(t is not None and t.last_known for t in changes.tenures.values())
        if full:
            report = self.view.sync(tenures_of(service), self.table, drained)
            self._planned = True
        else:
            report = self.view.update(changes, self.table, drained)
        self.syncs += 1
        self.last_sync_at = time.monotonic()
        if report.changed:
            self._log_pass(report, changes, full)
        return report

    def _log_pass(self, report: SyncReport, changes: ViewChanges, full: bool) -> None:
        """Say what the pass changed: counts, and the tenures it touched (a few, by name)."""
        touched = sorted(
            (t for t in changes.tenures.values() if t is not None),
            key=lambda t: t.group,
        )[:_LOGGED_TENURES]
        serving = "; ".join(
            f"{wire_text(t.group.model, 200)} {wire_text(t.group.worker_set, 200)} "
            f"generation {t.generation}: "
            f"{len(t.routable)} routable"
            for t in touched
        )
        more = len(changes.tenures) - len(touched)
        _log.info(
            "admitted view: %d written, %d withdrawn, %d removed (%s pass); %d file(s) "
            "published%s%s",
            len(report.written),
            len(report.withdrawn),
            len(report.removed),
            "full" if full else "incremental",
            len(self.view),
            f"; {serving}" if serving else "",
            f" and {more} more group(s)" if more > 0 else "",
        )

    def check(self) -> int:
        """Compare the fold with a full plan; publish the plan when they differ.

        Returns how many files differed (0: the fold was right).
        """
        service = self._service
        if service is None or not service.synced or not self._planned:
            return 0
        self.sync_now()  # what is pending first, so the fold is complete
        planned = plan_view(tenures_of(service), self.table)
        folded = self.view.wanted()
        differing = sorted(
            file for file in planned.keys() | folded.keys() if planned.get(file) != folded.get(file)
        )
        if differing:
            _log.warning(
                "admitted view: the incremental view differed from a full plan in %d file(s) "
                "(first: %s/%s); the full plan is published",
                len(differing),
                *differing[0],
            )
            self._planned = False
            self.sync_now()
        return len(differing)

    async def _run(self) -> None:
        view = self.view
        while True:
            # A refresh under way comes back soon for its next slice; else within a second, so
            # a failed write is tried again soon however long the refresh interval is.
            idle = min(1.0, view.refresh_interval / 2)
            timeout = REFRESH_SLICE_EVERY if view.refreshing else idle
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=timeout)
            try:
                if self._wake.is_set():
                    self._wake.clear()
                    self.sync_now()
                elif view.unsettled and self._planned:
                    # A write or removal that failed: tried again while nothing else changes.
                    self.view.retry(self.table, self._service_drained())
                if time.monotonic() - self._checked_at >= self.check_interval:
                    self._checked_at = time.monotonic()
                    self.check()
            except Exception:  # a bad pass must not end the view; the next one retries
                _log.warning("admitted view: a pass failed", exc_info=True)
                self._planned = False
                self._wake.set()
            view.keep_alive()

    def _service_drained(self) -> frozenset[tuple[str, int]]:
        service = self._service
        return frozenset() if service is None else service.drained_workers()

    async def close(self) -> None:
        """Stop following the service; the view stays for its horizon (it fails static)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.table.set_listener(None)
        if not self.syncs:
            # Nothing here is this writer's: a predecessor's files expire as its would have.
            _log.info("admitted view left as found: this writer never synced")
            return
        _log.info(
            "admitted view left in place (%d file(s)): the frontend keeps it until the next "
            "writer adopts it or its horizon passes",
            len(self.view),
        )


class LastKnownGood:
    """Keep a predecessor's view files while this writer cannot start (NATS is down).

    The files in the manifest are left as they are, never touched: their mtimes carry the
    horizon their writer promised from its last touch (:class:`Horizon`), and a writer that
    cannot read discovery has nothing newer to vouch for. When the newest of them is due to
    expire they are removed, once, and the frontend routes nowhere until a writer syncs.
    """

    def __init__(
        self,
        files: DirectoryFiles,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._files = files
        self._clock = clock
        self.kept = files.load_manifest()
        stamps = [when for when in map(files.modified, self.kept) if when is not None]
        left = max(stamps) + DEFAULT_FILE_TTL - wall() if stamps else 0.0
        self.until = clock() + max(0.0, left)
        self.withdrawn = False

    @property
    def serving(self) -> bool:
        """Whether the predecessor's files are still kept."""
        return not self.withdrawn and bool(self.kept) and self._clock() < self.until

    def keep_alive(self) -> int:
        """Withdraw the kept files once their horizon is up; return how many were removed."""
        if self.withdrawn or not self.kept or self._clock() < self.until:
            return 0
        self.withdrawn = True
        for file in reversed(self.kept):
            with contextlib.suppress(OSError):
                self._files.remove(file)
        _log.warning(
            "admitted view: %d file(s) of a previous writer withdrawn: NATS stayed out of "
            "reach until the horizon their writer set had passed",
            len(self.kept),
        )
        return len(self.kept)


class ViewHook:
    """What a service factory needs to run the view: the record table, the writer, its closer.

    The factory feeds ``table`` with the service's verdicts on discovery records.

    ``files`` is the locked directory; with ``owns_files`` the hook releases it on close (the
    sidecar), otherwise its opener keeps it for the process's life (the route extension,
    whose service may be restarted). Every file it writes or touches carries ``horizon``'s
    lease.
    """

    def __init__(
        self,
        files: DirectoryFiles,
        *,
        owns_files: bool = True,
        horizon: Horizon | None = None,
    ) -> None:
        horizon = horizon or Horizon()
        self.files = files
        self._owns_files = owns_files
        self.table = RecordTable()
        files.lease = horizon.lease
        self.view = AdmittedView(files, refresh_interval=horizon.refresh)
        adopted = self.view.adopt_leftovers()
        if adopted:
            _log.info(
                "admitted view %s: %d file(s) from a previous writer, settled at the first sync",
                files.root,
                adopted,
            )
        foreign = files.foreign_files(self.view.files)
        if foreign:
            _log.warning(
                "admitted view %s holds %d record file(s) it did not write (e.g. %s/%s); they "
                "are left alone: is a worker registering into the view directory?",
                files.root,
                len(foreign),
                *foreign[0],
            )
        self.writer = ViewWriter(self.view, self.table)

    def attach(self, service: ViewService) -> None:
        self.writer.attach(service)

    async def close(self) -> None:
        try:
            await self.writer.close()
        finally:
            if self._owns_files:
                self.files.release()
