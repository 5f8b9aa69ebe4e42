"""The admitted view's plan (which files, for which tenures) and its publication in order.

The view is a diff of contributions. A contribution is one routable member of a tenure, or the
scope channels of a serving tenure, and its files come from one function of the tenure and
the records alone (:func:`contribution_files`). Each pass is handed what changed
(:class:`ViewChanges`, from the steps' deltas): the groups with their tenures now, the workers
and endpoints whose records moved; it plans those contributions again and diffs them against
what they contributed before. A relisting, the first pass and every pass while a tenure is
held make every contribution dirty (``everything``), through the same path: as a fresh start
does, and :func:`plan_view` (every file of every tenure, planned from scratch) says the same.
All end in the same publication rules (:meth:`AdmittedView._settle`); a differential test
(``tests/dynamo/test_dynamo_view_fold.py``) holds the live view to the plan and to a fresh
start after every step.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import unquote

from workerset_admission.adapters.dynamo.view_directory import BUCKETS, ViewFile, ViewFiles
from workerset_admission.adapters.dynamo.view_records import PublishableRecord, RecordTable
from workerset_admission.identity import EndpointId, GroupKey
from workerset_admission.ports import TenureFacts

_Owner = tuple[GroupKey, int]
_Files = dict[ViewFile, bytes]

__all__ = [
    "REFRESH_SLICE_EVERY",
    "SCOPE_TOPICS",
    "AdmittedView",
    "SyncReport",
    "Tenure",
    "ViewChanges",
    "contribution_files",
    "plan_view",
    "untied_topics",
]

# One logger name for the whole view, so an operator follows or silences it in one place.
_log = logging.getLogger("workerset_admission.adapters.dynamo.view")
_ADD_ORDER = {bucket: index for index, bucket in enumerate(BUCKETS)}
# The event channels the 1.6.1 frontend subscribes to besides KV events (load metrics,
# forward-pass metrics, active sequences), carried for a serving tenure's endpoint.
SCOPE_TOPICS = frozenset({"kv_metrics", "forward-pass-metrics", "active_sequences_events"})
# Names whose writes keep failing that the view remembers, to warn once for each.
_MAX_FAILING = 4096


# One committed tenure as the view sees it (the delta's facts): group, build generation,
# routable ids, those served on last known records, the drained generation it takes over from,
# and the LoRA adapters its projection serves.
Tenure = TenureFacts


def _records_of(
    endpoint: EndpointId,
    instance_id: int,
    table: RecordTable,
    last_known: bool = False,
    adapters: Collection[tuple[int, str]] = (),
) -> list[PublishableRecord]:
    ns, comp = endpoint.namespace, endpoint.component
    lookup = table.lookup_last_known if last_known else table.lookup
    mine = [
        record
        for record in lookup("worker", ns, comp, instance_id)
        # Every endpoint record of the instance in the component (the KV query endpoint
        # too), and its cards at the binding's own endpoint.
        if record.bucket == "instances" or record.endpoint == endpoint.endpoint
    ]
    if any(r.suffix is not None for r in mine):
        # An adapter card is served only while the core's projection names it: a projection
        # the core refused keeps the last one it served.
        mine = [r for r in mine if r.suffix is None or (instance_id, r.suffix) in adapters]
    sources = [s for s in lookup("source", ns, None, instance_id) if s.component in (None, comp)]
    mine += sources
    for source in sources:
        # A channel is the worker's when it shares scope and publisher id with its source.
        mine += [
            channel
            for channel in lookup("channel", ns, None, source.instance_id)
            if (channel.component, channel.endpoint) == (source.component, source.endpoint)
        ]
    return mine


def _scope_channels(
    endpoint: EndpointId, table: RecordTable, last_known: bool = False
) -> list[PublishableRecord]:
    """Return the endpoint's event channels no record ties to a worker (all but KV events).

    With ``last_known`` (a held tenure serves members on their last known records), those
    that left the bucket and are still kept come along.
    """
    lookup = table.lookup_last_known if last_known else table.lookup
    return lookup("scope", endpoint.namespace, endpoint.component, endpoint.endpoint)


def contribution_files(tenure: Tenure, member: int | None, table: RecordTable) -> _Files:
    """Return the files one contribution of a tenure calls for: the view's one planning rule.

    ``member`` is a routable instance id (its endpoint records, its cards with the adapters
    the tenure's projection serves, its event records), or ``None`` for the tenure's scope:
    the channels of :data:`SCOPE_TOPICS` a serving tenure carries (none when it serves no one).
    """
    if member is None:
        if not tenure.routable:
            return {}
        channels = _scope_channels(tenure.group.endpoint, table, bool(tenure.last_known))
        return {c.file: c.value for c in channels if c.topic in SCOPE_TOPICS}
    records = _records_of(
        tenure.group.endpoint, member, table, member in tenure.last_known, tenure.adapters
    )
    return {r.file: r.value for r in records}


def plan_view(
    tenures: Iterable[Tenure], table: RecordTable
) -> dict[ViewFile, tuple[bytes, frozenset[tuple[GroupKey, int]]]]:
    """Every file the view must hold: its bytes, and the tenures that want it.

    A tenure serving anyone also carries its endpoint's channels of :data:`SCOPE_TOPICS`.
    Their records name only a random publisher and an address, so the ones of a rejected
    worker at the same endpoint come along: the frontend on the workers' own store
    subscribes to exactly these too, and their events are keyed by worker id, which the
    router only looks up for the workers its WorkerSet (the view's cards and instance
    records) admits.
    """
    wanted: dict[ViewFile, tuple[bytes, set[tuple[GroupKey, int]]]] = {}
    for tenure in tenures:
        files: _Files = {}
        for instance_id in sorted(tenure.routable):
            files.update(contribution_files(tenure, instance_id, table))
        files.update(contribution_files(tenure, None, table))
        for file, value in files.items():
            entry = wanted.setdefault(file, (value, set()))
            entry[1].add((tenure.group, tenure.generation))
    return {file: (value, frozenset(owners)) for file, (value, owners) in wanted.items()}


def untied_topics(tenures: Iterable[Tenure], table: RecordTable) -> set[str]:
    """Channel topics at a serving tenure's endpoint that the view leaves out."""
    return {
        str(channel.topic)
        for tenure in tenures
        if tenure.routable
        for channel in _scope_channels(tenure.group.endpoint, table)
        if channel.topic not in SCOPE_TOPICS
    }


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


@dataclass(slots=True)
class ViewChanges:
    """What changed since the view's last pass, for :meth:`AdmittedView.update`.

    ``tenures``: each group whose binding may have changed, with its tenure now (``None``:
    it has none). ``workers``: (namespace, instance id) of workers whose records changed.
    ``scopes``: endpoints whose unattributed event channels changed. ``everything``: every
    contribution is dirty (a relisting, the first pass, a hold); ``tenures`` then holds every
    tenure in force, and a group of the view it does not name has none.
    """

    tenures: dict[GroupKey, Tenure | None] = field(default_factory=dict)
    workers: set[tuple[str, int]] = field(default_factory=set)
    scopes: set[EndpointId] = field(default_factory=set)
    everything: bool = False

    def merge(self, other: ViewChanges) -> None:
        """Take in ``other``, a later change: its tenures win."""
        self.tenures.update(other.tenures)
        self.workers |= other.workers
        self.scopes |= other.scopes
        self.everything = self.everything or other.everything


def _owner(tenure: Tenure) -> _Owner:
    """Return the owner of a tenure's contributions: its group and build generation."""
    return (tenure.group, tenure.generation)


def _removal_order(files: Iterable[ViewFile]) -> list[ViewFile]:
    return sorted(files, key=lambda f: (-_ADD_ORDER.get(f[0], 0), f[1]))


def _add_order(files: Iterable[ViewFile]) -> list[ViewFile]:
    return sorted(files, key=lambda f: (_ADD_ORDER.get(f[0], 0), f[1]))


# Files touched per call of :meth:`AdmittedView.keep_alive`: a refresh of a large view is spread
# over many calls, so no single one holds the service's loop for long. The writer calls again
# every ``REFRESH_SLICE_EVERY`` seconds while a refresh is under way; a view too large to refresh
# in half its interval at this pace takes larger slices, because a file the store expires drops
# its worker from the frontend.
_TOUCH_SLICE = 500
REFRESH_SLICE_EVERY = 0.02
# Files stat'ed per :meth:`AdmittedView.verify`: a few milliseconds, every second.
_VERIFY_SLICE = 1000


class AdmittedView:
    """The view's state and its publication rules, over any :class:`ViewFiles`.

    Synchronous and clock-injected, so every rule is reachable from a unit test; the
    :class:`ViewWriter` drives it from the service's loop.

    What the view must hold is kept as a fold: per tenure, the files of each routable member
    and of its endpoint's channels; per file, the value and the tenures that want it.
    ``_pending`` holds every file whose directory state may differ from what is wanted (a
    change not yet published, a write or removal that failed, a drained worker's lingering
    endpoint record); a pass settles those alone.
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
        # What the directory holds (``None``: a previous writer's file, content unknown).
        self._written: dict[ViewFile, bytes | None] = {}
        # The fold: tenures by group, their members' and scopes' files, and per wanted file its
        # value and owners (a count per tenure); a file that stopped being wanted keeps its
        # last owners while the directory still holds it.
        self._tenures: dict[GroupKey, Tenure] = {}
        self._by_namespace: dict[str, set[GroupKey]] = {}
        # (Members by group, then by id: a key per worker is its id alone.)
        self._members: dict[GroupKey, dict[int, tuple[ViewFile, ...]]] = {}
        self._scopes: dict[GroupKey, tuple[ViewFile, ...]] = {}
        self._wanted: dict[ViewFile, bytes] = {}
        # Owners, one entry per contribution: nearly always a single one, so a tuple made again
        # on a change; the members of a tenure planned together share one owner tuple.
        self._owners: dict[ViewFile, tuple[_Owner, ...]] = {}
        self._last_owners: dict[ViewFile, frozenset[_Owner]] = {}
        # The owners each file lost since the last pass.
        self._dropped: dict[ViewFile, set[_Owner]] = {}
        self._pending: set[ViewFile] = set()
        self._holding = 0
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
        return self._holding > 0

    @property
    def unsettled(self) -> int:
        """Files whose directory state still differs from the plan (failed writes, removals)."""
        return len(self._pending)

    def groups_in(self, namespace: str) -> frozenset[GroupKey]:
        """Return the groups of the namespace that have a tenure in the view."""
        return frozenset(self._by_namespace.get(namespace, ()))

    def wanted(self) -> dict[ViewFile, tuple[bytes, frozenset[_Owner]]]:
        """Return what the fold says the view must hold, shaped as :func:`plan_view` does."""
        return {
            file: (value, frozenset(self._owners[file])) for file, value in self._wanted.items()
        }

    def adopt_leftovers(self) -> int:
        """Take over the files a previous writer registered; the first sync settles them.

        Every file the directory's registry names, whatever instant that writer died at: the
        first sync writes again those the plan holds (their content is not known) and removes
        the rest. They are not touched meanwhile: if no sync comes, they expire as the dead
        writer's would have.
        """
        for file in self._files.registered():
            self._written.setdefault(file, None)
            self._last_owners.setdefault(file, frozenset())
            self._pending.add(file)
        return len(self._written)

    # -- the two paths ---------------------------------------------------------------------------

    def sync(
        self,
        tenures: Sequence[Tenure],
        table: RecordTable,
        drained: Collection[tuple[str, int]] = (),
    ) -> SyncReport:
        """Make the directory equal to the view the tenures and records call for, planned anew.

        A tenure that ended is withdrawn first, so the view never holds two configurations of
        one WorkerSet at once (a frontend starting then could take either), and nothing routes
        to the departed cohort while the successor's files are written. Then the new files go
        in, and only then the departed members of tenures that go on: a replacement joins
        before its predecessor leaves, and the model never empties in between. A drained tenure
        a live one took over from (``Tenure.handover_from``) still serves, so its files go
        last, after the successor's are written.

        A drained worker (``drained``: namespace and instance id) leaves routing when its cards
        go; the endpoint records the view already holds for it stay until the worker's own
        records leave the bucket. The frontend cancels the requests in flight on an instance
        the moment its endpoint record goes, so removing them while the worker still serves
        would fail the very requests a drain exists to keep; with its cards gone no new
        request reaches it. They are never written anew, and they go at once when a successor
        tenure of their WorkerSet serves: the frontend admits the successor's configuration
        only once the old one's last instance is gone (measured: it answered 404 until then).

        Records that left the bucket are kept in ``table`` only while a held tenure's last
        known members (the core's window) still call for them: the rest are forgotten here.
        """
        everything = ViewChanges(tenures={t.group: t for t in tenures}, everything=True)
        return self.update(everything, table, drained)

    def update(
        self,
        changes: ViewChanges,
        table: RecordTable,
        drained: Collection[tuple[str, int]] = (),
    ) -> SyncReport:
        """Plan again the contributions ``changes`` names, diff, publish by :meth:`sync`'s rules.

        With ``changes.everything`` every contribution is dirty: the caller asks for it at the
        first pass, at a relisting and while the view is :attr:`holding` (a held tenure's last
        known records are kept in the table for as long as a pass over every member asks for
        them, and only such a pass can say that).
        """
        tenures = changes.tenures
        if changes.everything:
            ended: dict[GroupKey, Tenure | None] = dict.fromkeys(self._tenures)
            tenures = ended | tenures
        begun = set()
        for group, tenure in tenures.items():
            old = self._tenures.get(group)
            if tenure is None:
                if old is not None:
                    self._end(old)
            elif old is None or old.generation != tenure.generation:
                if old is not None:
                    self._end(old)
                self._begin(tenure, table)
                begun.add(group)
            else:
                self._change(old, tenure, table)
        if changes.everything:
            for tenure in self._tenures.values():
                if tenure.group in begun:
                    continue  # planned whole as it began
                owner = _owner(tenure)
                for instance_id in tenure.routable:
                    self._plan_member(tenure, instance_id, table, owner)
                self._plan_scope(tenure, table, owner)
        else:
            for namespace, instance_id in changes.workers:
                for group in self._by_namespace.get(namespace, ()):
                    tenure = self._tenures[group]
                    if instance_id in tenure.routable:
                        self._plan_member(tenure, instance_id, table, _owner(tenure))
            for endpoint in changes.scopes:
                for group in self._by_namespace.get(endpoint.namespace, ()):
                    tenure = self._tenures[group]
                    if tenure.group.endpoint == endpoint:
                        self._plan_scope(tenure, table, _owner(tenure))
        table.forget_unused_removals()
        return self._settle(table, drained)

    def retry(self, table: RecordTable, drained: Collection[tuple[str, int]] = ()) -> SyncReport:
        """Try again what the last passes could not write or remove (nothing else changed)."""
        return self._settle(table, drained)

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
            self._pending.add(file)
        if altered:
            _log.warning(
                "admitted view: %d file(s) altered or removed from outside (first: %s/%s); "
                "written again",
                len(altered),
                *altered[0],
            )
        return len(altered)

    # -- the fold --------------------------------------------------------------------------------

    def _begin(self, tenure: Tenure, table: RecordTable) -> None:
        group = tenure.group
        self._tenures[group] = tenure
        self._by_namespace.setdefault(group.endpoint.namespace, set()).add(group)
        self._holding += bool(tenure.last_known)
        owner = _owner(tenure)
        for instance_id in tenure.routable:
            self._plan_member(tenure, instance_id, table, owner)
        self._plan_scope(tenure, table, owner)

    def _end(self, tenure: Tenure) -> None:
        group = tenure.group
        owner = _owner(tenure)
        members = self._members.pop(group, {})
        for instance_id in tenure.routable:
            self._set_files(owner, members.pop(instance_id, ()), {})
        self._set_files(owner, self._scopes.pop(group, ()), {})
        del self._tenures[group]
        namespace = self._by_namespace[group.endpoint.namespace]
        namespace.discard(group)
        if not namespace:
            del self._by_namespace[group.endpoint.namespace]
        self._holding -= bool(tenure.last_known)

    def _change(self, old: Tenure, new: Tenure, table: RecordTable) -> None:
        self._tenures[new.group] = new
        self._holding += bool(new.last_known) - bool(old.last_known)
        owner = _owner(old)
        members = self._members.get(old.group, {})
        for instance_id in old.routable - new.routable:
            self._set_files(owner, members.pop(instance_id, ()), {})
        for instance_id in new.routable - old.routable:
            self._plan_member(new, instance_id, table, owner)
        moved = set(old.last_known ^ new.last_known)
        moved.update(instance_id for instance_id, _ in old.adapters ^ new.adapters)
        for instance_id in moved:
            if instance_id in new.routable:
                self._plan_member(new, instance_id, table, owner)
        if bool(old.routable) != bool(new.routable) or bool(old.last_known) != bool(new.last_known):
            self._plan_scope(new, table, owner)

    def _plan_member(
        self, tenure: Tenure, instance_id: int, table: RecordTable, owner: _Owner
    ) -> None:
        new = contribution_files(tenure, instance_id, table)
        members = self._members.setdefault(tenure.group, {})
        old = members.get(instance_id, ())
        members[instance_id] = tuple(new)
        self._set_files(owner, old, new)

    def _plan_scope(self, tenure: Tenure, table: RecordTable, owner: _Owner) -> None:
        new = contribution_files(tenure, None, table)
        old = self._scopes.get(tenure.group, ())
        self._scopes[tenure.group] = tuple(new)
        self._set_files(owner, old, new)
        if tenure.routable:
            self._warn_untied(untied_topics((tenure,), table))

    def _set_files(self, owner: _Owner, old: Collection[ViewFile], new: _Files) -> None:
        """Move one member's (or scope's) contribution from ``old`` files to ``new`` ones."""
        for file in old:
            if file in new:
                continue
            owners = self._owners[file]
            at = owners.index(owner)
            owners = owners[:at] + owners[at + 1 :]
            if owner not in owners:
                # Who wanted it at the last pass: what an unwanted file is judged by.
                self._dropped.setdefault(file, set()).add(owner)
            if owners:
                self._owners[file] = owners
            else:
                self._last_owners[file] = frozenset(self._dropped[file])
                del self._owners[file], self._wanted[file]
            self._pending.add(file)
        for file, value in new.items():
            if file not in old:
                self._owners[file] = (*self._owners.get(file, ()), owner)
            if self._wanted.get(file) != value:
                self._wanted[file] = value
                self._pending.add(file)
            self._last_owners.pop(file, None)

    def _warn_untied(self, topics: Iterable[str]) -> None:
        for topic in sorted(set(topics) - self._warned_topics):
            self._warned_topics.add(topic)
            _log.warning(
                "admitted view: event channel topic %r is left out: no record ties its "
                "publishers to a worker, so the frontend on the view does not hear it (it "
                "would on the workers' own store)",
                topic,
            )

    # -- the publication rules -------------------------------------------------------------------

    def _owners_of(self, file: ViewFile) -> frozenset[_Owner]:
        owners = self._owners.get(file)
        return frozenset(owners) if owners else self._last_owners.get(file, frozenset())

    def _settle(self, table: RecordTable, drained: Collection[tuple[str, int]]) -> SyncReport:
        """Publish the pending files by the rules :meth:`sync` states."""
        pending = self._pending
        self._dropped.clear()
        if not pending:
            return SyncReport()
        serving = {group: t.generation for group, t in self._tenures.items()}
        handed_over = {
            (t.group, t.handover_from)
            for t in self._tenures.values()
            if t.handover_from is not None
        }
        lingering = self._lingering(pending, table, drained, serving)
        held, wanted = self._written, self._wanted
        stale = [f for f in pending if f in held and f not in wanted and f not in lingering]
        ended = []
        for file in stale:
            owners = self._owners_of(file)
            live = any(serving.get(group) == generation for group, generation in owners)
            if not live and not (owners and owners <= handed_over):
                ended.append(file)
        withdrawn = self._remove_all(ended)
        to_write = [
            f
            for f in _add_order(f for f in pending if f in self._wanted)
            if self._written.get(f) != self._wanted[f]
        ]
        if to_write:
            # Written aside and registered together (one sync), then each made to appear.
            self._files.stage([(file, self._wanted[file]) for file in to_write])
        written = [file for file in to_write if self._publish(file, self._wanted[file])]
        ending = set(ended)
        # A drained tenure handing over goes only once its successor's files are all written:
        # with a write failed (a full disk), it keeps serving from the view meanwhile.
        unwritten = {
            group
            for f in pending
            if f in wanted and held.get(f) != wanted[f]
            for group, _ in self._owners.get(f, ())
        }

        def handing_over(file: ViewFile) -> bool:
            owners = self._owners_of(file)
            return (
                bool(owners) and owners <= handed_over and bool(unwritten & {g for g, _ in owners})
            )

        removed = self._remove_all([f for f in stale if f not in ending and not handing_over(f)])
        self._pending = {
            f
            for f in pending
            if (f in self._wanted and self._written.get(f) != self._wanted[f])
            or (f in self._written and f not in self._wanted)
        }
        for file in pending - self._pending:
            if file not in self._written:
                self._last_owners.pop(file, None)
        return SyncReport(tuple(written), tuple(withdrawn), tuple(removed))

    def _lingering(
        self,
        pending: Collection[ViewFile],
        table: RecordTable,
        drained: Collection[tuple[str, int]],
        serving: Mapping[GroupKey, int],
    ) -> set[ViewFile]:
        """Return the drained workers' endpoint records the view holds while in the bucket."""
        if not drained:
            return set()
        out = set()
        for namespace, instance_id in drained:
            for record in table.lookup("instance", namespace, None, instance_id):
                file = record.file
                if (
                    file in pending
                    and file in self._written
                    and not any(
                        serving.get(group, generation) != generation
                        for group, generation in self._owners_of(file)
                    )
                ):
                    out.add(file)
        return out

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
        for file in _removal_order(files):
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
                self._pending.add(file)
                self._publish(file, value)
                if self._written.get(file) == value:
                    self._pending.discard(file)
            touched += 1
        return touched

    @property
    def refreshing(self) -> bool:
        """Whether a refresh is under way (more :meth:`keep_alive` calls are due soon)."""
        return bool(self._touch_round)
