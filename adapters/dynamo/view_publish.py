"""The admitted view's plan (which files, for which tenures) and its publication in order."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass

from workerset_admission.adapters.dynamo.view_directory import BUCKETS, ViewFile, ViewFiles
from workerset_admission.adapters.dynamo.view_records import PublishableRecord, RecordTable
from workerset_admission.identity import EndpointId, GroupKey

__all__ = [
    "SCOPE_TOPICS",
    "AdmittedView",
    "SyncReport",
    "Tenure",
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


@dataclass(frozen=True, slots=True)
class Tenure:
    """One committed binding as the view sees it: group, build generation, routable ids."""

    group: GroupKey
    generation: int
    routable: frozenset[int]
    # Routable ids a held tenure serves on their last known records: published from the
    # records the table dropped when the bucket no longer has them.
    last_known: frozenset[int] = frozenset()
    # The generation of a drained tenure of the same group this one takes over from: that
    # tenure's files are removed after this one's are written.
    handover_from: int | None = None


def _records_of(
    endpoint: EndpointId, instance_id: int, table: RecordTable, last_known: bool = False
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
        endpoint = tenure.group.endpoint
        records = [
            record
            for instance_id in sorted(tenure.routable)
            for record in _records_of(
                endpoint, instance_id, table, instance_id in tenure.last_known
            )
        ]
        if tenure.routable:
            channels = _scope_channels(endpoint, table, bool(tenure.last_known))
            records += [c for c in channels if c.topic in SCOPE_TOPICS]
        for record in records:
            file = (record.bucket, record.file_name)
            entry = wanted.setdefault(file, (record.value, set()))
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


def _removal_order(files: Iterable[ViewFile]) -> list[ViewFile]:
    return sorted(files, key=lambda f: (-_ADD_ORDER.get(f[0], 0), f[1]))


def _add_order(files: Iterable[ViewFile]) -> list[ViewFile]:
    return sorted(files, key=lambda f: (_ADD_ORDER.get(f[0], 0), f[1]))


class AdmittedView:
    """The view's state and its publication rules, over any :class:`ViewFiles`.

    Synchronous and clock-injected, so every rule is reachable from a unit test; the
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
        self._written: dict[ViewFile, bytes | None] = {}
        self._owners: dict[ViewFile, frozenset[tuple[GroupKey, int]]] = {}
        self._warned_topics: set[str] = set()
        # Failed writes by record file name: how many tries failed since the last success.
        self._failing: dict[str, int] = {}
        # Failed removals by file: how many tries failed since the first.
        self._failing_removals: dict[ViewFile, int] = {}
        self._manifest_failures = 0
        # The last pass left something undone that the next must try again.
        self.retry_due = False
        self._last_touch = clock()
        self.publish_errors = 0

    @property
    def files(self) -> dict[ViewFile, bytes | None]:
        """What the view holds now (``None``: a previous writer's file, content unknown)."""
        return dict(self._written)

    def adopt_leftovers(self) -> int:
        """Take over a previous writer's files from its manifest; the first sync settles them.

        They are not touched meanwhile: if no sync comes, they expire as the dead writer's
        would have.
        """
        for file in self._files.load_manifest():
            self._written.setdefault(file, None)
            self._owners.setdefault(file, frozenset())
        return len(self._written)

    def sync(
        self,
        tenures: Sequence[Tenure],
        table: RecordTable,
        drained: Collection[tuple[str, int]] = (),
    ) -> SyncReport:
        """Make the directory equal to the view the tenures and records call for.

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
        errors_before = self.publish_errors
        wanted = plan_view(tenures, table)
        table.forget_unused_removals()
        for topic in sorted(untied_topics(tenures, table) - self._warned_topics):
            self._warned_topics.add(topic)
            _log.warning(
                "admitted view: event channel topic %r is left out: no record ties its "
                "publishers to a worker, so the frontend on the view does not hear it (it "
                "would on the workers' own store)",
                topic,
            )
        live = {(t.group, t.generation) for t in tenures}
        handed_over = {(t.group, t.handover_from) for t in tenures if t.handover_from is not None}
        serving = {t.group: t.generation for t in tenures}
        lingering = {
            file
            for namespace, instance_id in sorted(drained)
            for record in table.lookup("instance", namespace, None, instance_id)
            if (file := (record.bucket, record.file_name)) in self._written
            and not any(
                serving.get(group, generation) != generation
                for group, generation in self._owners.get(file, frozenset())
            )
        }
        stale = [f for f in self._written if f not in wanted and f not in lingering]
        ended = []
        for file in stale:
            owners = self._owners.get(file, frozenset())
            if not owners & live and not (owners and owners <= handed_over):
                ended.append(file)
        withdrawn = self._remove_all(ended)
        written: list[ViewFile] = []
        for file in _add_order(wanted):
            value, owners = wanted[file]
            self._owners[file] = owners
            if self._written.get(file) == value:
                continue
            if self._publish(file, value):
                written.append(file)
        ending = set(ended)
        removed = self._remove_all([f for f in stale if f not in ending])
        report = SyncReport(tuple(written), tuple(withdrawn), tuple(removed))
        if report.changed or self._manifest_failures:
            self._save_manifest()
        # A file that could not be written or removed (a full or read-only disk) is tried
        # again by the next pass even when nothing else changes: a departed or drained
        # worker's card must not stay served, and kept alive, until some other change.
        self.retry_due = self.publish_errors > errors_before or bool(self._manifest_failures)
        return report

    def _publish(self, file: ViewFile, value: bytes) -> bool:
        try:
            self._files.publish(file, value)
        except OSError as exc:
            # Kept out of the written set, so the next pass tries again.
            self.publish_errors += 1
            self._write_failed(file, exc)
            return False
        self._written[file] = value
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
                self._remove_failed(file, exc)
                continue
            self._written.pop(file, None)
            self._owners.pop(file, None)
            failed = self._failing_removals.pop(file, 0)
            if failed:
                _log.info(
                    "admitted view: removed %s/%s after %d failed attempt(s)",
                    file[0],
                    file[1],
                    failed,
                )
            done.append(file)
        return done

    def _remove_failed(self, file: ViewFile, exc: OSError) -> None:
        """Warn once per file, counting: every pass tries the removal again (a read-only disk).

        A warning per try flooded the log with one line per file per pass.
        """
        failing = self._failing_removals
        count = failing.get(file, 0)
        if not count and len(failing) >= _MAX_FAILING:
            failing.clear()  # files that are no longer wanted: forget them, bounded
        failing[file] = count + 1
        if not count:
            _log.warning(
                "admitted view: could not remove %s/%s: %s (retried at every pass; "
                "reported again only once it is removed)",
                file[0],
                file[1],
                exc.strerror or exc,
            )

    def _save_manifest(self) -> None:
        """Save the manifest; a failure is warned about once, until a save works.

        A full disk fails every pass, and a warning per pass flooded the log.
        """
        try:
            self._files.save_manifest(self._written)
        except OSError as exc:
            self._manifest_failures += 1
            if self._manifest_failures == 1:
                _log.warning(
                    "admitted view: could not save its manifest: %s (retried at every change; "
                    "reported again only once it is saved)",
                    exc.strerror or exc,
                )
            return
        if self._manifest_failures:
            _log.info(
                "admitted view: saved its manifest after %d failed attempt(s)",
                self._manifest_failures,
            )
            self._manifest_failures = 0

    def keep_alive(self, *, force: bool = False) -> int:
        """Touch every published file when a refresh is due; return how many were touched.

        A file someone else deleted (an expiry sweep after a stall) is written again.
        """
        now = self._clock()
        if not force and now - self._last_touch < self.refresh_interval:
            return 0
        self._last_touch = now
        touched = 0
        for file, value in list(self._written.items()):
            if value is None:
                continue  # a previous writer's file: left to expire unless a sync wants it
            try:
                alive = self._files.touch(file)
            except OSError as exc:
                _log.debug("admitted view: could not touch %s/%s: %s", file[0], file[1], exc)
                continue
            if not alive:
                del self._written[file]
                self._publish(file, value)
            touched += 1
        return touched

    def clear(self) -> int:
        """Withdraw the whole view (the writer stops): the frontend routes nowhere."""
        removed = self._remove_all(list(self._written))
        self._save_manifest()
        return len(removed)
