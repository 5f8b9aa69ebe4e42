"""The worker families in Dynamo's vocabulary, kept per WorkerSet as groups change, served as bytes.

Theory of operation
-------------------
``workerset_admission_router_worker_state`` has one series per worker, and
``workerset_admission_router_workers`` four per WorkerSet, so on a large fleet they are nearly
all of the Prometheus page; rendered by the OpenTelemetry SDK, every scrape costs Python work
per series (an observation, an aggregation, a label row, a formatted line) while the service's
loop waits for the GIL. This module keeps both families instead:

* :class:`WorkerStateFold` renders the service's read store (``service/read_store.py``): the
  store says which groups changed since the version the fold last followed, so a read works
  out again only the WorkerSets those groups belong to, from the workers' records (each names
  its gauge state), and formats the line of only the workers whose state or ``differs_in``
  moved. Each WorkerSet's lines are
  kept joined as one block, beside its per-state counts and their four lines; each family's
  text is the blocks in label order, joined again only after a change.
* :class:`PrometheusPage` serves the page: the SDK renders every other family as before
  (content negotiation, ``name[]``, gzip, as ``prometheus_client`` serves them), and these two
  families are added as the kept bytes. While the SDK collects for the page, their callbacks
  yield nothing for a fold the page carries: :func:`served_as_text` reads a thread-local that
  names the folds of the page being rendered, and the SDK runs the callbacks on the rendering
  thread. So the Prometheus reader never holds those points, and every other reader (the OTLP
  export) still collects the same gauges through the SDK, read from the same fold.

The plain path is ``worker_states.worker_sets`` and :func:`exposition`; a differential test
(``tests/test_read_store.py``) holds the fold to them after random histories, and
``tests/telemetry/test_worker_state_page.py`` the text to what the SDK's Prometheus exporter
renders for the same states.
"""

from __future__ import annotations

import gzip
import logging
import threading
import wsgiref.simple_server
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol
from urllib.parse import parse_qs

from workerset_admission import __version__
from workerset_admission.telemetry import names as n
from workerset_admission.telemetry.worker_states import (
    COUNT_STATES,
    DIFFERS_IN_NONE,
    DIFFERS_IN_UNKNOWN,
    STATE_TABLE,
    GroupLike,
    RejectionLike,
    WorkerSetLabels,
    WorkerSetState,
    merge_resolved,
    rejection_reasons,
    resolved,
    router_states,
    worker_labels,
)

__all__ = [
    "COUNTS",
    "COUNTS_DESCRIPTION",
    "STATES",
    "STATES_DESCRIPTION",
    "PrometheusPage",
    "StoreLike",
    "WorkerStateFold",
    "exposition",
    "served_as_text",
    "stop",
]

_log = logging.getLogger(__name__)

# The two families as the SDK's Prometheus exporter names them, and their descriptions.
COUNTS: Final = n.METRIC_ROUTER_WORKERS.replace(".", "_")
COUNTS_DESCRIPTION: Final = (
    "Workers per WorkerSet by router state: discovered, available, pending, excluded."
)
STATES: Final = n.METRIC_ROUTER_WORKER_STATE.replace(".", "_")
STATES_DESCRIPTION: Final = "Each worker's current router state and its reason (1 = current)."
# The exporter's scope labels on every point of the plugin's meter (``AdmissionTelemetry``).
_SCOPE: Final = {
    "otel_scope_name": n.INSTRUMENTATION_NAME,
    "otel_scope_schema_url": "",
    "otel_scope_version": __version__,
}
_EOF: Final = b"# EOF\n"

_rendering = threading.local()


def served_as_text(fold: WorkerStateFold) -> bool:
    """Tell whether this thread is rendering a page that serves ``fold`` as kept text."""
    folds: frozenset[WorkerStateFold] = getattr(_rendering, "folds", frozenset())
    return fold in folds


def _escape(value: str) -> str:
    # prometheus_client's escaping of a label value, in both text formats.
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _header(family: str, description: str) -> bytes:
    help_text = description.replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {family} {help_text}\n# TYPE {family} gauge\n".encode()


_HEADERS: Final = {
    COUNTS: _header(COUNTS, COUNTS_DESCRIPTION),
    STATES: _header(STATES, STATES_DESCRIPTION),
}


def _sample(family: str, labels: Mapping[str, str], value: int) -> bytes:
    from prometheus_client.utils import floatToGoString

    number: Callable[[float], str] = floatToGoString  # the exporter's way of writing a value
    every = {**labels, **_SCOPE}
    pairs = ",".join(f'{key}="{_escape(every[key])}"' for key in sorted(every))
    return f"{family}{{{pairs}}} {number(value)}\n".encode()


def _line(labels: WorkerSetLabels, worker: int, state: str, why: str) -> bytes:
    return _sample(STATES, worker_labels(labels, worker, state, why), 1)


def _count_lines(labels: WorkerSetLabels, counts: Mapping[str, int]) -> bytes:
    every = labels.as_dict()
    return b"".join(
        _sample(COUNTS, {**every, n.LABEL_STATE: state}, count) for state, count in counts.items()
    )


def _families(counts: Sequence[bytes], states: Sequence[bytes]) -> dict[str, bytes]:
    # As the SDK: a family without a point is left out, HELP and TYPE lines included. A join,
    # not ``+``: bytes.join lets go of the GIL while it copies a large page.
    return {
        COUNTS: b"".join((_HEADERS[COUNTS], *counts)) if any(counts) else b"",
        STATES: b"".join((_HEADERS[STATES], *states)) if any(states) else b"",
    }


def exposition(sets: Iterable[WorkerSetState]) -> dict[str, bytes]:
    """Render both families' text for ``sets`` whole, in label order: the plain path."""
    ordered = sorted(sets, key=lambda s: s.labels)
    counts = [_count_lines(worker_set.labels, worker_set.counts()) for worker_set in ordered]
    states = [
        _line(worker_set.labels, worker, state, why)
        for worker_set in ordered
        for worker, (state, why) in sorted(worker_set.workers.items())
    ]
    return _families(counts, states)


@dataclass(slots=True)
class _Kept:
    """One WorkerSet: its workers' states, their lines, the lines joined, the counts' lines."""

    workers: dict[int, tuple[str, str]]
    lines: dict[int, bytes]
    block: bytes
    counts: dict[str, int]
    count_lines: bytes


class StoreLike(Protocol):
    """The service's read store, as far as the fold reads it (``service/read_store.py``)."""

    @property
    def version(self) -> int: ...
    @property
    def entries(self) -> Mapping[Any, Any]: ...  # group key -> entry with ``workers``
    def changed_since(self, version: int) -> frozenset[Any] | None: ...


def _store_workers(
    key: object, entry: Any, reasons: Mapping[tuple[object, str], str]
) -> dict[int, tuple[str, str]]:
    """One group's gauge workers, resolved, from its entry's worker table.

    The table names each worker's record by its index among the group's few distinct records,
    so each record's state and ``differs_in`` are worked out once, not once per worker. A record
    whose state has no ``router`` word is no gauge worker.
    """
    table = entry.workers
    resolved_kinds: list[tuple[str, str] | None] = []
    for record in table.kinds:
        router = record.state.router
        waits_in = record.waits_in
        if router is None:
            resolved_kinds.append(None)
        elif waits_in is None:
            resolved_kinds.append((router, DIFFERS_IN_NONE))
        else:
            resolved_kinds.append((router, reasons.get((key, waits_in), DIFFERS_IN_UNKNOWN)))
    return {
        worker: found
        for worker, code in zip(table.ids, table.codes, strict=True)
        if (found := resolved_kinds[code]) is not None
    }


class WorkerStateFold:
    """Every WorkerSet's worker states and their exposition lines; see the module doc.

    ``remembered`` is :func:`rejection_reasons`' memory of what checksum pairs differ in,
    shared with the other gauges that read it. Safe from any thread.
    """

    def __init__(self, remembered: dict[tuple[str, str], str] | None = None) -> None:
        self._remembered = remembered if remembered is not None else {}
        self._lock = threading.Lock()
        self._of: tuple[object, object, object] | None = None
        # The store version last followed (None: follow everything at the next refresh).
        self._seen: int | None = None
        self._labels_of: dict[object, WorkerSetLabels] = {}
        self._members: dict[WorkerSetLabels, set[object]] = {}
        self._reasons: dict[tuple[object, str], str] = {}
        self._kept: dict[WorkerSetLabels, _Kept] = {}
        self._order: list[WorkerSetLabels] | None = []
        self._text: dict[str, bytes] | None = _families((), ())
        self.lines_written = 0

    def refresh(
        self,
        groups: Sequence[GroupLike],
        rejections: Sequence[RejectionLike],
        store: StoreLike | None = None,
    ) -> None:
        """Follow the groups and standing rejections the service shows now.

        With the ``store`` they were rendered from, only the groups it says changed since the
        last refresh are read again, from its worker records; without one (a picture made
        otherwise) every group is.
        """
        with self._lock:
            of = self._of
            if of is not None and groups is of[0] and rejections is of[1] and store is of[2]:
                return
            self._of = (groups, rejections, store)
            reasons = rejection_reasons(rejections, self._remembered)
            workers_of: Callable[[object], Mapping[int, tuple[str, str]]]
            if store is None:
                self._seen = None
                current = {group.group: group for group in groups}
                position = {key: index for index, key in enumerate(current)}
                changed: frozenset[object] | None = None
                present: Mapping[Any, object] = current

                def workers_of(key: object) -> Mapping[int, tuple[str, str]]:
                    return resolved(key, router_states(current[key]), self._reasons)

                def ordered(keys: Iterable[object]) -> list[object]:
                    return sorted(keys, key=position.__getitem__)

            else:
                changed = None if self._seen is None else store.changed_since(self._seen)
                self._seen = store.version
                entries = store.entries
                present = entries

                def workers_of(key: object) -> Mapping[int, tuple[str, str]]:
                    return _store_workers(key, entries[key], self._reasons)

                def ordered(keys: Iterable[object]) -> list[object]:
                    return sorted(keys)  # type: ignore[type-var]  # group keys sort

            dirty: set[WorkerSetLabels] = set()
            if changed is None:
                dirty.update(self._kept)
                self._labels_of.clear()
                self._members.clear()
                changed = frozenset(present)
            for key in changed:
                if key in present:
                    dirty.add(self._index(key))
                elif key in self._labels_of:
                    labels = self._labels_of.pop(key)
                    self._members[labels].discard(key)
                    dirty.add(labels)
            for pair in reasons.keys() | self._reasons.keys():
                if reasons.get(pair) != self._reasons.get(pair) and pair[0] in self._labels_of:
                    dirty.add(self._labels_of[pair[0]])
            self._reasons = reasons
            for labels in dirty:
                self._rebuild(labels, workers_of, ordered)

    def sets(self) -> tuple[WorkerSetState, ...]:
        """Every WorkerSet's workers with their states, sorted by labels (as ``worker_sets``)."""
        with self._lock:
            return tuple(
                WorkerSetState(labels, self._kept[labels].workers) for labels in self._sorted()
            )

    def counts(self) -> tuple[tuple[WorkerSetLabels, Mapping[str, int]], ...]:
        """Every WorkerSet's workers per upstream state, as ``WorkerSetState.counts``."""
        with self._lock:
            return tuple((labels, self._kept[labels].counts) for labels in self._sorted())

    def text(self) -> Mapping[str, bytes]:
        """Return each family's exposition by name (HELP, TYPE, its lines; empty without any)."""
        with self._lock:
            if self._text is None:
                kept = [self._kept[labels] for labels in self._sorted()]
                self._text = _families([k.count_lines for k in kept], [k.block for k in kept])
            return self._text

    # -- the fold ----------------------------------------------------------------------------

    def _index(self, key: object) -> WorkerSetLabels:
        labels = self._labels_of.get(key)
        if labels is None:
            labels = self._labels_of[key] = WorkerSetLabels.of(key)
            self._members.setdefault(labels, set()).add(key)
        return labels

    def _sorted(self) -> list[WorkerSetLabels]:
        if self._order is None:
            self._order = sorted(self._kept)
        return self._order

    def _rebuild(
        self,
        labels: WorkerSetLabels,
        workers_of: Callable[[object], Mapping[int, tuple[str, str]]],
        ordered: Callable[[Iterable[object]], list[object]],
    ) -> None:
        self._text = None
        keys = self._members.get(labels)
        if not keys:
            self._members.pop(labels, None)
            if self._kept.pop(labels, None) is not None:
                self._order = None
            return
        per_group = [workers_of(key) for key in ordered(keys)]
        # One group alone: its workers as they are (a new dict; merging would copy it).
        workers = dict(per_group[0]) if len(per_group) == 1 else merge_resolved(per_group)
        kept = self._kept.get(labels)
        if kept is None:
            kept = self._kept[labels] = _Kept({}, {}, b"", {}, b"")
            self._order = None
        lines = kept.lines
        for worker in kept.workers.keys() - workers.keys():
            del lines[worker]
        for worker, found in workers.items():
            if kept.workers.get(worker) != found:
                lines[worker] = _line(labels, worker, *found)
                self.lines_written += 1
        # A new dict, never changed after: a reader on another thread may still iterate the last.
        kept.workers = workers
        kept.block = b"".join(lines[worker] for worker in sorted(lines))
        counts = dict.fromkeys(COUNT_STATES, 0)
        counts["discovered"] = len(workers)
        for state, _ in workers.values():
            counts[STATE_TABLE[state].state] += 1
        if counts != kept.counts:
            kept.counts = counts
            kept.count_lines = _count_lines(labels, counts)


class PrometheusPage:
    """The Prometheus endpoint: the SDK's rendering of ``registry``, and the kept families.

    ``carry`` adds a fold whose families are served from its kept text; ``text`` is called at
    each scrape, after the SDK's collection, for that text (by family) as it is then.
    """

    def __init__(self, registry: Any) -> None:
        self._registry = registry
        self._carried: dict[WorkerStateFold, Callable[[], Mapping[str, bytes]]] = {}
        self._folds: frozenset[WorkerStateFold] = frozenset()
        self._lock = threading.Lock()

    def carry(self, fold: WorkerStateFold, text: Callable[[], Mapping[str, bytes]]) -> None:
        with self._lock:
            self._carried[fold] = text
            self._folds = frozenset(self._carried)

    def render(
        self, accept: str | None = None, params: Mapping[str, Sequence[str]] | None = None
    ) -> tuple[bytes, str]:
        """Render the page for a request's ``Accept`` and query; return it and its content type."""
        from prometheus_client.exposition import choose_encoder

        encoder, content_type = choose_encoder(accept or "")
        registry = self._registry
        wanted = (params or {}).get("name[]")
        if wanted:
            registry = registry.restricted_registry(wanted)
        with self._lock:
            carried = list(self._carried.values())
            folds = self._folds
        _rendering.folds = folds
        try:
            output: bytes = encoder(registry)
        finally:
            _rendering.folds = frozenset()
        kept = b"".join(
            body
            for text in carried
            for family, body in text().items()
            if not wanted or family in wanted
        )
        if not kept:
            return output, content_type
        if output.endswith(_EOF):  # OpenMetrics: the page ends with its EOF marker
            return b"".join((output[: -len(_EOF)], kept, _EOF)), content_type
        return b"".join((output, kept)), content_type

    def app(self, environ: Mapping[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        """Answer a request as ``prometheus_client.make_wsgi_app`` would, with the kept text."""
        from prometheus_client.exposition import gzip_accepted

        method = environ["REQUEST_METHOD"]
        headers: list[tuple[str, str]] = []
        if method == "OPTIONS":
            status, output = "200 OK", b""
            headers.append(("Allow", "OPTIONS,GET"))
        elif method != "GET":
            status = "405 Method Not Allowed"
            output = f"# HTTP {status}: {method}; use OPTIONS or GET\n".encode()
            headers.append(("Allow", "OPTIONS,GET"))
        elif environ.get("PATH_INFO") == "/favicon.ico":  # an empty answer for browsers
            status, output = "200 OK", b""
        else:
            status = "200 OK"
            params = parse_qs(environ.get("QUERY_STRING", ""))
            output, content_type = self.render(environ.get("HTTP_ACCEPT"), params)
            headers.append(("Content-Type", content_type))
            if gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING", "")):
                output = gzip.compress(output)
                headers.append(("Content-Encoding", "gzip"))
        start_response(status, headers)
        return [output]

    def start(self, host: str, port: int) -> tuple[Any, threading.Thread]:
        """Serve the page on ``host:port`` from a daemon thread; raises ``OSError``.

        The caller owns the thread: it stops the server and joins the thread (``stop``). A
        server that stops serving on its own (its socket failed) says so at WARNING.
        """
        from prometheus_client.exposition import ThreadingWSGIServer

        class Server(ThreadingWSGIServer):
            pass

        Server.address_family, address = _family(host, port)
        server = wsgiref.simple_server.make_server(
            address, port, self.app, Server, handler_class=_Quiet
        )
        thread = threading.Thread(
            target=_serve_until_stopped, args=(server,), name="prometheus", daemon=True
        )
        thread.start()
        return server, thread


def stop(server: Any, thread: threading.Thread, timeout: float = 5.0) -> None:
    """Stop a server ``PrometheusPage.start`` started, and join its thread."""
    if thread.is_alive():
        server.shutdown()
    server.server_close()
    thread.join(timeout=timeout)
    if thread.is_alive():
        _log.warning(
            "the Prometheus endpoint's thread did not end within %g s; it is left to end "
            "with the process",
            timeout,
        )


def _serve_until_stopped(server: Any) -> None:
    try:
        server.serve_forever()
    except OSError as exc:
        _log.warning(
            "the Prometheus endpoint on port %s stopped serving (%s); metrics are no longer "
            "scraped from it, admission is unaffected",
            server.server_port,
            exc,
        )


class _Quiet(wsgiref.simple_server.WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Log nothing: a scrape every few seconds is not news."""


def _family(host: str, port: int) -> tuple[int, str]:
    """Return the address family and address to bind ``host`` with, as prometheus_client does."""
    import socket

    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, address = next(iter(infos))
    return int(family), str(address[0])
