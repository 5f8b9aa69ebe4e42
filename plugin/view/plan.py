"""The admitted view's plan: the files each tenure calls for, and the phase each change goes in.

Theory of operation
-------------------

The view is a diff of contributions. A contribution is one routable member of a tenure, or the
scope channels of a serving tenure, and its files come from one function of the tenure and the
records alone (:func:`contribution_files`). :class:`ViewPlan` keeps them as a fold: per
tenure, the files of each routable member and of its scope; per file, the bytes wanted and the
tenures (group, build generation) that want it. Each update is handed what changed
(:class:`ViewChanges`, from the steps' deltas): the groups with their tenures now, the workers
and endpoints whose records moved; it plans those contributions again and diffs them against
what they contributed before. A relisting, the first pass and every pass while a tenure is held
make every contribution dirty (``everything``), through the same path, as a fresh start does;
:func:`plan_view` (every file of every tenure, planned from scratch) says the same.

The plan never touches a file. It is told what the directory holds (``written``: file to
bytes, ``None`` for a previous writer's file of unknown content) and answers with the changes
that make the directory what it wants, each in its :class:`Phase`:

1. ``WITHDRAW``: the files of tenures that ended, so the view never holds two configurations
   of one WorkerSet at once (a frontend starting then could take either), and nothing routes
   to a departed cohort while its successor's files are written;
2. ``WRITE``: new and changed files, event and instance records before the model card that
   makes the frontend build the model (:data:`BUCKETS`);
3. ``REMOVE``: the departed members of tenures that go on, after the new ones joined, so the
   model never empties in between; a model card before its instance records. A drained tenure
   its successor took over from (``handover_from``) still serves: its files go here, tied to
   the successor's group (:attr:`FileChange.groups`), and stay while a write of the successor
   failed in the same pass (a full disk), so the drained tenure serves until it is replaced.

A drained worker leaves routing when its cards go; the endpoint records the view holds for it
stay until its own records leave the bucket (the frontend cancels the requests in flight on an
instance the moment its endpoint record goes), unless a successor tenure of its WorkerSet
serves: the frontend admits the successor's configuration only once the old one's last
instance is gone.

The differ (``adapters/dynamo/view.py``) applies the changes in order and tells the plan what
the directory then holds (:meth:`ViewPlan.settled`); a file whose change failed stays pending,
and the next pass plans it again. Nothing here does I/O, logs or reads a clock.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from enum import IntEnum

from workerset_admission.identity import EndpointId, GroupKey
from workerset_admission.ports import TenureFacts
from workerset_admission.view.records import PublishableRecord, RecordTable, Tie, ViewFile

__all__ = [
    "BUCKETS",
    "SCOPE_TOPICS",
    "FileChange",
    "Phase",
    "ViewChanges",
    "ViewPlan",
    "contribution_files",
    "note_ties",
    "plan_view",
    "untied_topics",
]

# The view's buckets in publication order: the model card last, so the frontend finds the
# instance and event records already there when the card makes it build the model; removal
# goes the other way.
BUCKETS: tuple[str, ...] = ("event_sources", "event_channels", "instances", "mdc")
# The event channels the 1.6.1 frontend subscribes to besides KV events (load metrics,
# forward-pass metrics, active sequences), carried for a serving tenure's endpoint.
SCOPE_TOPICS = frozenset({"kv_metrics", "forward-pass-metrics", "active_sequences_events"})
_ADD_ORDER = {bucket: index for index, bucket in enumerate(BUCKETS)}

_Owner = tuple[GroupKey, int]
_Files = dict[ViewFile, bytes]


class Phase(IntEnum):
    """When a change goes within one pass (see the module's theory)."""

    WITHDRAW = 0
    WRITE = 1
    REMOVE = 2


@dataclass(frozen=True, slots=True)
class FileChange:
    """One change the directory needs: a file written with ``value``, or removed (``None``).

    ``groups`` tie changes of one pass: a removal that names groups goes only once every write
    of the pass for those groups succeeded; a write names the groups that want it.
    """

    file: ViewFile
    phase: Phase
    value: bytes | None = None
    groups: frozenset[GroupKey] = frozenset()


def _records_of(
    endpoint: EndpointId,
    instance_id: int,
    table: RecordTable,
    last_known: bool = False,
    adapters: Collection[tuple[int, str]] = (),
) -> list[PublishableRecord]:
    own, events = table.worker_records(
        endpoint.namespace, endpoint.component, instance_id, last_known
    )
    # Every endpoint record of the instance in the component (the KV query endpoint too), and
    # its cards at the binding's own endpoint.
    mine = [r for r in own if r.file[0] == "instances" or r.endpoint == endpoint.endpoint]
    if any(r.suffix is not None for r in mine):
        # An adapter card is served only while the core's projection names it: a projection
        # the core refused keeps the last one it served.
        mine = [r for r in mine if r.suffix is None or (instance_id, r.suffix) in adapters]
    return mine + events


def _scope_channels(
    endpoint: EndpointId, table: RecordTable, last_known: bool = False
) -> list[PublishableRecord]:
    """Return the endpoint's event channels no record ties to a worker (all but KV events).

    With ``last_known`` (a held tenure serves members on their last known records), those
    that left the bucket and are still kept come along.
    """
    lookup = table.lookup_last_known if last_known else table.lookup
    return lookup("scope", endpoint.namespace, endpoint.component, endpoint.endpoint)


def contribution_files(tenure: TenureFacts, member: int | None, table: RecordTable) -> _Files:
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
    tenures: Iterable[TenureFacts], table: RecordTable
) -> dict[ViewFile, tuple[bytes, frozenset[_Owner]]]:
    """Every file the view must hold: its bytes, and the tenures that want it.

    A tenure serving anyone also carries its endpoint's channels of :data:`SCOPE_TOPICS`.
    Their records name only a random publisher and an address, so the ones of a rejected
    worker at the same endpoint come along: the frontend on the workers' own store
    subscribes to exactly these too, and their events are keyed by worker id, which the
    router only looks up for the workers its WorkerSet (the view's cards and instance
    records) admits.
    """
    wanted: dict[ViewFile, tuple[bytes, set[_Owner]]] = {}
    for tenure in tenures:
        files: _Files = {}
        for instance_id in sorted(tenure.routable):
            files.update(contribution_files(tenure, instance_id, table))
        files.update(contribution_files(tenure, None, table))
        for file, value in files.items():
            entry = wanted.setdefault(file, (value, set()))
            entry[1].add((tenure.group, tenure.generation))
    return {file: (value, frozenset(owners)) for file, (value, owners) in wanted.items()}


def untied_topics(tenures: Iterable[TenureFacts], table: RecordTable) -> set[str]:
    """Channel topics at a serving tenure's endpoint that the view leaves out."""
    return {
        str(channel.topic)
        for tenure in tenures
        if tenure.routable
        for channel in _scope_channels(tenure.group.endpoint, table)
        if channel.topic not in SCOPE_TOPICS
    }


@dataclass(slots=True)
class ViewChanges:
    """What changed since the plan's last update, for :meth:`ViewPlan.update`.

    ``tenures``: each group whose binding may have changed, with its tenure now (``None``:
    it has none). ``workers``: (namespace, instance id) of workers whose records changed.
    ``scopes``: endpoints whose unattributed event channels changed. ``everything``: every
    contribution is dirty (a relisting, the first pass, a hold); ``tenures`` then holds every
    tenure in force, and a group of the view it does not name has none.
    """

    tenures: dict[GroupKey, TenureFacts | None] = field(default_factory=dict)
    workers: set[tuple[str, int]] = field(default_factory=set)
    scopes: set[EndpointId] = field(default_factory=set)
    everything: bool = False

    def merge(self, other: ViewChanges) -> None:
        """Take in ``other``, a later change: its tenures win."""
        self.tenures.update(other.tenures)
        self.workers |= other.workers
        self.scopes |= other.scopes
        self.everything = self.everything or other.everything


def note_ties(table: RecordTable, ties: Iterable[Tie], changes: ViewChanges) -> None:
    """Add to ``changes`` the workers and endpoints the records of ``ties`` belong to."""
    for kind, namespace, component, number in ties:
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


def _owner(tenure: TenureFacts) -> _Owner:
    """Return the owner of a tenure's contributions: its group and build generation."""
    return (tenure.group, tenure.generation)


def _removal_order(files: Iterable[ViewFile]) -> list[ViewFile]:
    return sorted(files, key=lambda f: (-_ADD_ORDER.get(f[0], 0), f[1]))


def _add_order(files: Iterable[ViewFile]) -> list[ViewFile]:
    return sorted(files, key=lambda f: (_ADD_ORDER.get(f[0], 0), f[1]))


class ViewPlan:
    """What the view must hold, kept as a fold, and the changes that make a directory hold it.

    ``pending`` holds every file whose directory state may differ from what is wanted (a
    change not yet applied, a write or removal that failed, a drained worker's lingering
    endpoint record); :meth:`publication` plans those alone.
    """

    def __init__(self) -> None:
        # The fold: tenures by group, their members' and scopes' files, and per wanted file its
        # value and owners (a count per tenure); a file that stopped being wanted keeps its
        # last owners while the directory still holds it.
        self._tenures: dict[GroupKey, TenureFacts] = {}
        self._by_namespace: dict[str, set[GroupKey]] = {}
        # (Members by group, then by id: a key per worker is its id alone.)
        self._members: dict[GroupKey, dict[int, tuple[ViewFile, ...]]] = {}
        self._scopes: dict[GroupKey, tuple[ViewFile, ...]] = {}
        self._wanted: dict[ViewFile, bytes] = {}
        # Owners, one entry per contribution: nearly always a single one, so a tuple made again
        # on a change; a file with one owner holds that tenure's one tuple of it (``_alone``),
        # so the files of a tenure share it.
        self._owners: dict[ViewFile, tuple[_Owner, ...]] = {}
        self._alone: dict[_Owner, tuple[_Owner]] = {}
        self._last_owners: dict[ViewFile, frozenset[_Owner]] = {}
        # The owners each file lost since the last publication.
        self._dropped: dict[ViewFile, set[_Owner]] = {}
        self._pending: set[ViewFile] = set()
        self._holding = 0
        self._untied: set[str] = set()

    @property
    def holding(self) -> bool:
        """Whether a tenure serves members on their last known records (planned in full)."""
        return self._holding > 0

    @property
    def unsettled(self) -> int:
        """Files whose directory state may still differ from the plan."""
        return len(self._pending)

    @property
    def untied(self) -> frozenset[str]:
        """Every channel topic a serving tenure's endpoint carried that the view leaves out."""
        return frozenset(self._untied)

    def groups_in(self, namespace: str) -> frozenset[GroupKey]:
        """Return the groups of the namespace that have a tenure in the plan."""
        return frozenset(self._by_namespace.get(namespace, ()))

    def wanted(self) -> dict[ViewFile, tuple[bytes, frozenset[_Owner]]]:
        """Return what the fold says the view must hold, shaped as :func:`plan_view` does."""
        return {
            file: (value, frozenset(self._owners[file])) for file, value in self._wanted.items()
        }

    # -- what the directory reports --------------------------------------------------------------

    def adopt(self, files: Iterable[ViewFile]) -> None:
        """Take over files a previous writer left: each is settled at the next publication."""
        for file in files:
            self._last_owners.setdefault(file, frozenset())
            self._pending.add(file)

    def dirty(self, file: ViewFile) -> None:
        """Note that the directory's copy of ``file`` may differ from the plan (altered, lost)."""
        self._pending.add(file)

    def clean(self, file: ViewFile) -> None:
        """Note that the directory's copy of ``file`` was put back as it was."""
        self._pending.discard(file)

    def settled(self, written: Mapping[ViewFile, bytes | None]) -> None:
        """Take in what the directory holds after a publication: what still differs stays."""
        pending, wanted = self._pending, self._wanted
        self._pending = {
            f
            for f in pending
            if (f in wanted and written.get(f) != wanted[f]) or (f in written and f not in wanted)
        }
        for file in pending - self._pending:
            if file not in written:
                self._last_owners.pop(file, None)

    # -- the fold --------------------------------------------------------------------------------

    def update(
        self,
        changes: ViewChanges,
        table: RecordTable,
        written: Mapping[ViewFile, bytes | None],
        drained: Collection[tuple[str, int]] = (),
    ) -> tuple[FileChange, ...]:
        """Plan again the contributions ``changes`` names; return the changes to publish.

        With ``changes.everything`` every contribution is dirty: the caller asks for it at the
        first pass, at a relisting and while the plan is :attr:`holding` (a held tenure's last
        known records are kept in the table for as long as a pass over every member asks for
        them, and only such a pass can say that). Records that left the bucket are kept in
        ``table`` only while a held tenure's last known members still call for them: the rest
        are forgotten here.
        """
        tenures = changes.tenures
        if changes.everything:
            ended: dict[GroupKey, TenureFacts | None] = dict.fromkeys(self._tenures)
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
        return self.publication(written, table, drained)

    def _begin(self, tenure: TenureFacts, table: RecordTable) -> None:
        group = tenure.group
        self._tenures[group] = tenure
        self._by_namespace.setdefault(group.endpoint.namespace, set()).add(group)
        self._holding += bool(tenure.last_known)
        owner = _owner(tenure)
        for instance_id in tenure.routable:
            self._plan_member(tenure, instance_id, table, owner)
        self._plan_scope(tenure, table, owner)

    def _end(self, tenure: TenureFacts) -> None:
        group = tenure.group
        owner = _owner(tenure)
        members = self._members.pop(group, {})
        for instance_id in tenure.routable:
            self._set_files(owner, members.pop(instance_id, ()), {})
        self._set_files(owner, self._scopes.pop(group, ()), {})
        del self._tenures[group]
        self._alone.pop(owner, None)
        namespace = self._by_namespace[group.endpoint.namespace]
        namespace.discard(group)
        if not namespace:
            del self._by_namespace[group.endpoint.namespace]
        self._holding -= bool(tenure.last_known)

    def _change(self, old: TenureFacts, new: TenureFacts, table: RecordTable) -> None:
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
        self, tenure: TenureFacts, instance_id: int, table: RecordTable, owner: _Owner
    ) -> None:
        new = contribution_files(tenure, instance_id, table)
        members = self._members.setdefault(tenure.group, {})
        old = members.get(instance_id, ())
        members[instance_id] = tuple(new)
        self._set_files(owner, old, new)

    def _plan_scope(self, tenure: TenureFacts, table: RecordTable, owner: _Owner) -> None:
        new = contribution_files(tenure, None, table)
        old = self._scopes.get(tenure.group, ())
        self._scopes[tenure.group] = tuple(new)
        self._set_files(owner, old, new)
        if tenure.routable:
            self._untied |= untied_topics((tenure,), table)

    def _set_files(self, owner: _Owner, old: Collection[ViewFile], new: _Files) -> None:
        """Move one member's (or scope's) contribution from ``old`` files to ``new`` ones."""
        for file in old:
            if file in new:
                continue
            owners = self._owners[file]
            at = owners.index(owner)
            owners = self._shared(owners[:at] + owners[at + 1 :])
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
                self._owners[file] = self._with(self._owners.get(file, ()), owner)
            if self._wanted.get(file) != value:
                self._wanted[file] = value
                self._pending.add(file)
            self._last_owners.pop(file, None)

    def _with(self, owners: tuple[_Owner, ...], owner: _Owner) -> tuple[_Owner, ...]:
        return self._shared((*owners, owner))

    def _shared(self, owners: tuple[_Owner, ...]) -> tuple[_Owner, ...]:
        """Return ``owners``, as its tenure's one tuple when it names one tenure alone."""
        if len(owners) != 1:
            return owners
        return self._alone.setdefault(owners[0], owners)

    # -- the publication rules -------------------------------------------------------------------

    def _owners_of(self, file: ViewFile) -> frozenset[_Owner]:
        owners = self._owners.get(file)
        return frozenset(owners) if owners else self._last_owners.get(file, frozenset())

    def publication(
        self,
        written: Mapping[ViewFile, bytes | None],
        table: RecordTable,
        drained: Collection[tuple[str, int]] = (),
    ) -> tuple[FileChange, ...]:
        """Return the changes that make ``written`` what the plan wants, in publication order.

        ``drained``: the drained workers (namespace, instance id), whose endpoint records the
        directory holds stay while their own are in the bucket (see the module's theory).
        """
        pending = self._pending
        self._dropped.clear()
        if not pending:
            return ()
        serving = {group: t.generation for group, t in self._tenures.items()}
        handed_over = {
            (t.group, t.handover_from)
            for t in self._tenures.values()
            if t.handover_from is not None
        }
        lingering = self._lingering(pending, written, table, drained, serving)
        wanted = self._wanted
        stale = [f for f in pending if f in written and f not in wanted and f not in lingering]
        ended: list[ViewFile] = []
        going: list[FileChange] = []
        for file in stale:
            owners = self._owners_of(file)
            live = any(serving.get(group) == generation for group, generation in owners)
            if owners and owners <= handed_over:
                # A drained tenure handing over: it goes once its successor's files are in.
                groups = frozenset(group for group, _ in owners)
                going.append(FileChange(file, Phase.REMOVE, groups=groups))
            elif live:
                going.append(FileChange(file, Phase.REMOVE))
            else:
                ended.append(file)
        changes = [FileChange(file, Phase.WITHDRAW) for file in _removal_order(ended)]
        for file in _add_order(f for f in pending if f in wanted):
            value = wanted[file]
            if written.get(file) != value:
                groups = frozenset(group for group, _ in self._owners.get(file, ()))
                changes.append(FileChange(file, Phase.WRITE, value, groups))
        by_file = {change.file: change for change in going}
        changes += [by_file[file] for file in _removal_order(by_file)]
        return tuple(changes)

    def _lingering(
        self,
        pending: Collection[ViewFile],
        written: Mapping[ViewFile, bytes | None],
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
                    and file in written
                    and not any(
                        serving.get(group, generation) != generation
                        for group, generation in self._owners_of(file)
                    )
                ):
                    out.add(file)
        return out
