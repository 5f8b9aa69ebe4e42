"""The admitted discovery view: a Dynamo file store holding only the workers admission admits.

Theory of operation
-------------------

Dynamo 1.6.1's frontend takes every hop's workers (decode or aggregated, prefill, encoder) from
its discovery backend. Run with ``--discovery-backend file`` and ``DYN_FILE_KV=<view dir>``, its
discovery is whatever files that directory holds, so the plugin makes itself the frontend's
discovery source: workers keep registering in their own store (mirrored into the NATS bucket),
and this module writes into the view directory the Dynamo records of admitted workers only.

It is a read model, never a second admission. Each service step hands it one delta
(:class:`~workerset_admission.ports.StepDelta`): the tenures the step named (which instances
each WorkerSet's tenure admits and which of them are live, the LoRA adapters it projects) and
the records the core accepted, with exactly the bytes it accepted. The view is, per tenure:

* every ``v1/instances`` record of an admitted, live instance in the binding's namespace and
  component (its generate endpoint and its auxiliary endpoints, such as the KV query one);
* its ``v1/mdc`` records at the binding's endpoint, with the LoRA adapter cards the tenure's
  projection serves (the cards of a projection the core refused stay out);
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

The view never judges a record. The service's ingestion judges every discovery record once and
the core decides on every card; the deltas carry the raw bytes of each record they accepted,
and the writer files them by key: a refused value never arrives (nor a card re-put under its
key with another checksum, model or worker type, which the core refuses), so the key's last
accepted record stays; a relisting replaces the table.

A file the writer owns is checked, a slice at a time, against what it wrote (its size and its
inode: a write from outside changes one or the other) and written again when altered.

The writer owns its directory: a lock file held for the process's life refuses a second live
writer, and a registry names every file it may hold before the file appears
(``view_directory``'s theory of operation), so the next writer, whatever instant this one died
at, adopts exactly what it left and ends its first sync with what a fresh writer writes. It
never deletes a file it did not write.

A writer that starts while NATS is unreachable has nothing to sync from, and the files a
predecessor left are the frontend's only view. They are last known good (:class:`LastKnownGood`):
kept while the writer retries, never touched (their horizon runs from the predecessor's last
touch, not from a restart that knows nothing newer), and withdrawn when that horizon ends. A
horizon beyond one lease from now (a predecessor whose clock ran ahead) is cut back to it.

What the view holds and in what order each change goes is decided by the pure plan
(``workerset_admission.view``: ``records``, the record table the deltas fill; ``plan``, the
files each tenure calls for and the phase of each change). This module and ``view_directory``
(file naming, the lock, the registry, the lease's clock, the real directory) carry it out:
:class:`AdmittedView` keeps what the directory holds, asks the plan for the changes and applies
them in the plan's order, and :class:`ViewWriter` runs it from the service. Every public name of
the view is importable from here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import unquote

from workerset_admission.adapters.dynamo.filestore import DEFAULT_FILE_TTL
from workerset_admission.adapters.dynamo.view_directory import (
    BUCKETS,
    LOCK_NAME,
    MANIFEST_NAME,
    REGISTRY_NAME,
    DirectoryFiles,
    Horizon,
    ViewFile,
    ViewFiles,
    check_frontend_store,
    file_name_for,
)
from workerset_admission.errors import wire_text
from workerset_admission.identity import GroupKey
from workerset_admission.ports import DeltaSubscriber, StepDelta, SteppedRecord, TenureFacts
from workerset_admission.view.plan import (
    SCOPE_TOPICS,
    FileChange,
    Phase,
    ViewChanges,
    ViewPlan,
    note_ties,
    plan_view,
)
from workerset_admission.view.records import PublishableRecord, RecordTable

__all__ = [
    "BUCKETS",
    "LOCK_NAME",
    "MANIFEST_NAME",
    "REFRESH_SLICE_EVERY",
    "REGISTRY_NAME",
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
    "note_ties",
    "plan_view",
]

_log = logging.getLogger(__name__)
# How many tenures a pass's log line names; the rest are counted.
_LOGGED_TENURES = 5

# One committed tenure as the view sees it (the delta's facts): group, build generation,
# routable ids, those served on last known records, the drained generation it takes over from,
# and the LoRA adapters its projection serves.
Tenure = TenureFacts


@dataclass(frozen=True, slots=True)
class SyncReport:
    """What one pass did, in the order it did it: write, withdraw, remove.

    ``withdrawn`` are the files of tenures that ended, ``removed`` those of members that left
    a live tenure.
    """

    written: tuple[ViewFile, ...] = ()
    withdrawn: tuple[ViewFile, ...] = ()
    removed: tuple[ViewFile, ...] = ()

    @property
    def changed(self) -> bool:
        return bool(self.withdrawn or self.written or self.removed)


# Files touched per call of :meth:`AdmittedView.keep_alive`: a refresh of a large view is spread
# over many calls, so no single one holds the service's loop for long. The writer calls again
# every ``REFRESH_SLICE_EVERY`` seconds while a refresh is under way; a view too large to refresh
# in half its interval at this pace takes larger slices, because a file the store expires drops
# its worker from the frontend.
_TOUCH_SLICE = 500
REFRESH_SLICE_EVERY = 0.02
# Files stat'ed per :meth:`AdmittedView.verify`: a few milliseconds, every second.
_VERIFY_SLICE = 1000
# Names whose writes keep failing that the view remembers, to warn once for each.
_MAX_FAILING = 4096


class AdmittedView:
    """The view's directory and its differ, over any :class:`ViewFiles`.

    What the view must hold, and in what order each change goes, is the pure plan's
    (:class:`~workerset_admission.view.plan.ViewPlan`); this keeps what the directory holds,
    asks the plan for the changes, applies them in order, and tells the plan what came of
    them. Synchronous and clock-injected, so every rule is reachable from a unit test; the
    :class:`ViewWriter` drives it from the service's loop.
    """

    def __init__(
        self,
        files: ViewFiles,
        *,
        refresh_interval: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._files = files
        self.refresh_interval = refresh_interval
        self._clock = clock
        self._plan = ViewPlan()
        # What the directory holds (``None``: a previous writer's file, content unknown).
        self._written: dict[ViewFile, bytes | None] = {}
        self._warned_topics: set[str] = set()
        # Failed writes by record file name: how many tries failed since the last success;
        # and the files whose removal failed, with how many tries.
        self._failing: dict[str, int] = {}
        self._unremovable: dict[ViewFile, int] = {}
        self._last_touch = clock()
        self._touch_round: list[ViewFile] = []
        self._touch_slice = _TOUCH_SLICE
        # The inode each written file got, and the files the current verification round has
        # still to check (see :meth:`verify`).
        self._inodes: dict[ViewFile, int] = {}
        self._verify_round: list[ViewFile] = []
        self.publish_errors = 0

    @property
    def files(self) -> dict[ViewFile, bytes | None]:
        """What the view holds now (``None``: a previous writer's file, content unknown)."""
        return dict(self._written)

    def __len__(self) -> int:
        """How many files the view holds."""
        return len(self._written)

    @property
    def holding(self) -> bool:
        """Whether a tenure serves members on their last known records (planned in full)."""
        return self._plan.holding

    @property
    def unsettled(self) -> int:
        """Files whose directory state still differs from the plan (failed writes, removals)."""
        return self._plan.unsettled

    def groups_in(self, namespace: str) -> frozenset[GroupKey]:
        """Return the groups of the namespace that have a tenure in the view."""
        return self._plan.groups_in(namespace)

    def wanted(self) -> dict[ViewFile, tuple[bytes, frozenset[tuple[GroupKey, int]]]]:
        """Return what the plan says the view must hold, shaped as :func:`plan_view` does."""
        return self._plan.wanted()

    def adopt_leftovers(self) -> int:
        """Take over the files a previous writer registered; the first sync settles them.

        Every file the directory's registry names, whatever instant that writer died at: the
        first sync writes again those the plan holds (their content is not known) and removes
        the rest. They are not touched meanwhile: if no sync comes, they expire as the dead
        writer's would have.
        """
        registered = self._files.registered()
        for file in registered:
            self._written.setdefault(file, None)
        self._plan.adopt(registered)
        return len(self._written)

    # -- the two paths ---------------------------------------------------------------------------

    def sync(
        self,
        tenures: Sequence[Tenure],
        table: RecordTable,
        drained: Collection[tuple[str, int]] = (),
    ) -> SyncReport:
        """Make the directory equal to the view the tenures and records call for, planned anew.

        The changes go in the plan's phases (:mod:`workerset_admission.view.plan`): the files
        of tenures that ended first, then the new files, then the departed members of tenures
        that go on, a drained tenure handing over last and only once its successor's files
        are written; a drained worker's endpoint records stay while its own are in the bucket.
        """
        everything = ViewChanges(tenures={t.group: t for t in tenures}, everything=True)
        return self.update(everything, table, drained)

    def update(
        self,
        changes: ViewChanges,
        table: RecordTable,
        drained: Collection[tuple[str, int]] = (),
    ) -> SyncReport:
        """Have the plan take ``changes`` in, then apply what it says, in its order."""
        planned = self._plan.update(changes, table, self._written, drained)
        self._warn_untied(self._plan.untied)
        return self._apply(planned)

    def retry(self, table: RecordTable, drained: Collection[tuple[str, int]] = ()) -> SyncReport:
        """Try again what the last passes could not write or remove (nothing else changed)."""
        return self._apply(self._plan.publication(self._written, table, drained))

    def _apply(self, changes: Sequence[FileChange]) -> SyncReport:
        """Apply the plan's changes in order; a removal waits for the writes it is tied to."""
        withdrawn = self._remove_all(c.file for c in changes if c.phase is Phase.WITHDRAW)
        writes = [(c.file, c.value, c.groups) for c in changes if c.value is not None]
        if writes:
            # Written aside and registered together (one sync), then each made to appear.
            self._files.stage([(file, value) for file, value, _ in writes])
        written: list[ViewFile] = []
        # The groups a write failed for: a removal tied to one waits for the next pass.
        unwritten: set[GroupKey] = set()
        for file, value, groups in writes:
            if self._publish(file, value):
                written.append(file)
            else:
                unwritten |= groups
        removed = self._remove_all(
            c.file for c in changes if c.phase is Phase.REMOVE and not c.groups & unwritten
        )
        self._plan.settled(self._written)
        return SyncReport(tuple(written), tuple(withdrawn), tuple(removed))

    # -- files altered from outside --------------------------------------------------------------

    def _note_identity(self, file: ViewFile) -> None:
        try:
            identity = self._files.identity(file)
        except OSError:
            identity = None
        if identity is None:
            self._inodes.pop(file, None)
        else:
            self._inodes[file] = identity[1]

    def verify(self) -> int:
        """Check the next slice of the written files; mark pending any altered from outside.

        A file is checked by a stat: its size against the bytes written, its inode against the
        one the write made (a write from outside that keeps both, an in-place rewrite of the
        same length, is not seen). Returns how many of the slice were altered or gone; the
        caller settles them (:meth:`retry`).
        """
        if not self._verify_round:
            self._verify_round = [f for f, value in self._written.items() if value is not None]
        batch = self._verify_round[-_VERIFY_SLICE:]
        del self._verify_round[-_VERIFY_SLICE:]
        altered = []
        for file in batch:
            value = self._written.get(file)
            if value is None:
                continue  # gone since the round began, or a previous writer's file
            try:
                identity = self._files.identity(file)
            except OSError:
                continue
            if (
                identity is not None
                and identity[0] == len(value)
                and self._inodes.get(file, identity[1]) == identity[1]
            ):
                continue
            altered.append(file)
            self._written[file] = None  # its content is no longer known: written again
            self._plan.dirty(file)
        if altered:
            _log.warning(
                "admitted view: %d file(s) altered or removed from outside (first: %s/%s); "
                "written again",
                len(altered),
                *altered[0],
            )
        return len(altered)

    # -- carrying the changes out ----------------------------------------------------------------

    def _warn_untied(self, topics: Iterable[str]) -> None:
        for topic in sorted(set(topics) - self._warned_topics):
            self._warned_topics.add(topic)
            _log.warning(
                "admitted view: event channel topic %r is left out: no record ties its "
                "publishers to a worker, so the frontend on the view does not hear it (it "
                "would on the workers' own store)",
                topic,
            )

    def _publish(self, file: ViewFile, value: bytes) -> bool:
        try:
            self._files.publish(file, value)
        except OSError as exc:
            # Kept pending, so the next pass (or the next refresh) tries again.
            self.publish_errors += 1
            self._write_failed(file, exc)
            return False
        self._written[file] = value
        self._note_identity(file)
        self._unremovable.pop(file, None)
        failed = self._failing.pop(file[1], 0)
        if failed:
            _log.info("admitted view: wrote %s after %d failed attempt(s)", file[1], failed)
        return True

    def _write_failed(self, file: ViewFile, exc: OSError) -> None:
        """Warn once per record name (a worker's instance and card files share it), counting.

        Every pass tries a failed file again; a warning per try would flood the log with one
        line per file per pass, so later failures of a name only count, and a write that
        succeeds at last says how many tries failed.
        """
        failing = self._failing
        count = failing.get(file[1], 0)
        if not count and len(failing) >= _MAX_FAILING:
            failing.clear()  # names that are no longer wanted: forget them, bounded
        failing[file[1]] = count + 1
        if not count:
            _log.warning(
                "admitted view: could not write %s/%s: %s (retried at every pass; "
                "reported again only once it is written)",
                file[0],
                file[1],
                exc.strerror or exc,
            )

    def _remove_all(self, files: Iterable[ViewFile]) -> list[ViewFile]:
        done = []
        for file in files:
            try:
                self._files.remove(file)
            except OSError as exc:
                self.publish_errors += 1
                # Tried again at every refresh; said once, and again when it goes at last.
                if not self._unremovable.get(file):
                    _log.warning(
                        "admitted view: could not remove %s/%s: %s (tried again at every "
                        "refresh; this frontend's serving record keeps naming the worker "
                        "meanwhile)",
                        file[0],
                        file[1],
                        exc.strerror or exc,
                    )
                self._unremovable[file] = self._unremovable.get(file, 0) + 1
                continue
            self._written.pop(file, None)
            self._inodes.pop(file, None)
            failed = self._unremovable.pop(file, 0)
            if failed:
                _log.info("admitted view: removed %s after %d failed attempt(s)", file[1], failed)
            done.append(file)
        return done

    def unremoved_cards(self) -> dict[str, set[str]]:
        """Return the workers whose cards the view could not remove, per namespace.

        Their instance keys (``ns/component/endpoint/id``): the frontend may still route to
        them, so this frontend's serving record must keep naming them.
        """
        out: dict[str, set[str]] = {}
        for bucket, name in self._unremovable:
            if bucket != "mdc":
                continue
            parts = unquote(name).split("/")
            if len(parts) >= 4:
                out.setdefault(parts[0], set()).add("/".join(parts[:4]))
        return out

    def keep_alive(self, *, force: bool = False) -> int:
        """Touch the published files when a refresh is due; return how many were touched.

        A refresh is spread over calls of ``_TOUCH_SLICE`` files each (see :attr:`refreshing`),
        so a large view never holds the loop for long, and always done within half the refresh
        interval. A file someone else deleted (an expiry sweep after a stall) is written again.
        """
        now = self._clock()
        if not self._touch_round:
            if not force and now - self._last_touch < self.refresh_interval:
                return 0
            self._last_touch = now
            self._touch_round = [f for f, value in self._written.items() if value is not None]
            calls = max(1, int(self.refresh_interval / 2 / REFRESH_SLICE_EVERY))
            self._touch_slice = max(_TOUCH_SLICE, -(-len(self._touch_round) // calls))
        size = self._touch_slice
        batch = self._touch_round[-size:]
        del self._touch_round[-size:]
        touched = 0
        for file in batch:
            value = self._written.get(file)
            if value is None:
                continue  # gone since the round began, or a previous writer's file
            try:
                alive = self._files.touch(file)
            except OSError as exc:
                _log.debug("admitted view: could not touch %s/%s: %s", file[0], file[1], exc)
                continue
            if not alive:
                del self._written[file]
                self._plan.dirty(file)
                self._publish(file, value)
                if self._written.get(file) == value:
                    self._plan.clean(file)
            touched += 1
        return touched

    @property
    def refreshing(self) -> bool:
        """Whether a refresh is under way (more :meth:`keep_alive` calls are due soon)."""
        return bool(self._touch_round)


class ViewService(Protocol):
    """The admission service as the writer uses it: it hands the writer every step's record."""

    def subscribe(self, subscriber: DeltaSubscriber) -> None: ...

    def before_publication(self, hook: Callable[[], object]) -> None: ...

    def also_serving(self, provider: Callable[[], Mapping[str, Collection[str]]]) -> None: ...


class ViewWriter:
    """Drive an :class:`AdmittedView` from the deltas of a running admission service.

    The writer is a read model: each step's :class:`~workerset_admission.ports.StepDelta`
    is taken in as it comes (its records filed in the table, its tenures kept, its dirty
    contributions noted) and wakes one coalesced pass; between changes the files are kept
    alive. Nothing is written before the service's first listing reached it: an empty view
    then would withdraw a restarted frontend's workers for no reason.

    A pass costs the change, not the fleet: the contributions the deltas named since the last
    pass are planned again. The first pass, a relisting and every pass while a tenure is held
    make every contribution dirty through the same path. Every ``verify_every`` seconds a
    slice of the files is checked against what was written (:meth:`AdmittedView.verify`),
    and one altered from outside is written again.
    """

    def __init__(
        self, view: AdmittedView, table: RecordTable, *, verify_every: float = 1.0
    ) -> None:
        self.view = view
        self.table = table
        self.verify_every = verify_every
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._tenures: dict[GroupKey, Tenure] = {}
        self._drained: frozenset[tuple[str, int]] = frozenset()
        self._changes = ViewChanges()
        self._listed = False
        self._planned = False
        self._verified_at = time.monotonic()
        self.syncs = 0
        self.last_sync_at: float | None = None

    def attach(self, service: ViewService) -> None:
        """Follow ``service`` (call on its loop); the writer starts at once."""
        service.subscribe(self)
        # The serving records say what this frontend routes to: the files first.
        service.before_publication(self.sync_now)
        # A card the view could not remove still routes: the serving record keeps naming it.
        service.also_serving(self.view.unremoved_cards)
        task = self._task = asyncio.ensure_future(self._run())
        task.add_done_callback(_report_end)

    def heard(self, record: SteppedRecord) -> None:
        """Hear one step: its delta, when it changed anything the view keeps, is taken in."""
        if record.delta is not None:
            self.step(record.delta)

    def step(self, delta: StepDelta) -> None:
        """Take one step's delta in: file its records, keep its tenures, note what is dirty.

        A delta that cannot be taken in raises (the service's delivery logs it at WARNING)
        and makes the next pass a full one: the next relisting files every record again.
        """
        taken = False
        try:
            self._take(delta)
            taken = True
        finally:
            if not taken:
                self._planned = False
            self._wake.set()

    def _take(self, delta: StepDelta) -> None:
        changes = self._changes
        if delta.relisted:
            records = [r for r in delta.records.values() if r is not None]
            ties = self.table.listing(records, delta.kept)
            self._listed = changes.everything = True
        else:
            ties = set()
            for key, record in delta.records.items():
                ties |= self.table.put(key, record)
        note_ties(self.table, ties, changes)
        for group, tenure in delta.groups.items():
            if tenure is None:
                self._tenures.pop(group, None)
            else:
                self._tenures[group] = tenure
            changes.tenures[group] = tenure
        if delta.drained is not None:
            # A drain set or lifted changes what the view keeps of that worker.
            changes.workers |= delta.drained ^ self._drained
            self._drained = delta.drained

    def sync_now(self) -> SyncReport:
        if not self._listed:
            return SyncReport()
        changes, self._changes = self._changes, ViewChanges()
        full = not self._planned or self.view.holding
        full = full or changes.everything or any(t.last_known for t in self._tenures.values())
        if full:
            changes.everything = True
            changes.tenures = dict(self._tenures)
        report = self.view.update(changes, self.table, self._drained)
        self._planned = True
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

    def verify(self) -> int:
        """Check a slice of the files; write again any altered from outside. Return how many."""
        if not self._planned:
            return 0
        altered = self.view.verify()
        if altered:
            self.view.retry(self.table, self._drained)
        return altered

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
                    self.view.retry(self.table, self._drained)
                if time.monotonic() - self._verified_at >= self.verify_every:
                    self._verified_at = time.monotonic()
                    self.verify()
            except Exception:  # a bad pass must not end the view; the next one retries
                _log.warning("admitted view: a pass failed", exc_info=True)
                self._planned = False
                self._wake.set()
            view.keep_alive()

    async def close(self) -> None:
        """Stop following the service; the view stays for its horizon (it fails static)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            # Awaited to its end; a failure that ended it was reported at WARNING as it did.
            await asyncio.wait({task})
        if not self.syncs:
            # Nothing here is this writer's: a predecessor's files expire as its would have.
            _log.info("admitted view left as found: this writer never synced")
            return
        _log.info(
            "admitted view left in place (%d file(s)): the frontend keeps it until the next "
            "writer adopts it or its horizon passes",
            len(self.view),
        )


def _report_end(task: asyncio.Task[None]) -> None:
    """Say at WARNING that the writer's pass loop ended otherwise than by its ``close``."""
    if task.cancelled():
        return
    failure = task.exception()
    if failure is not None:
        _log.warning(
            "admitted view: the writer's pass loop ended on an error; the files are kept "
            "as last written until the frontend's horizon passes",
            exc_info=failure,
        )


class LastKnownGood:
    """Keep a predecessor's view files while this writer cannot start (NATS is down).

    The files in the registry are left as they are, never touched: their mtimes carry the
    horizon their writer promised from its last touch (:class:`Horizon`), and a writer that
    cannot read discovery has nothing newer to vouch for. Only a promise beyond what this
    writer's ``lease`` could have made (a predecessor whose clock ran ahead) is cut back to
    ``lease`` from now, on the clocks :meth:`DirectoryFiles.now` reads. When the newest of
    them is due to expire they are removed, once, and the frontend routes nowhere until a
    writer syncs.
    """

    def __init__(
        self,
        files: DirectoryFiles,
        *,
        lease: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._files = files
        self._clock = clock
        self.kept = files.registered()
        files.restamp_ahead(self.kept, lease)
        stamps = [when for when in map(files.modified, self.kept) if when is not None]
        left = max(stamps) + DEFAULT_FILE_TTL - files.now() if stamps else 0.0
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
        # A predecessor whose clock ran ahead: its stamps cut back before anything else.
        files.restamp_ahead(self.view.files)
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
                "are left alone: the frontend's own records, or a worker registering into the "
                "view directory by mistake?",
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
