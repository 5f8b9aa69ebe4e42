"""Dynamo alone beside Dynamo on the admitted view: one deployment, two frontends, steady load.

The same ``python -m dynamo.mocker`` workers register in their own file store. Frontend
"direct" reads that store (Dynamo 1.6.1 alone, with its own first-wins admission); frontend
"view" reads the admitted view that ``workerset-admission serve --view-dir`` writes from the
bucket the ``bridge`` fills. Each gets the same steady load, and every request is kept with
its send time, status and serving worker, so a fault's cost reads the same way on both.

The plugin's nats-server (``plugin_nats``, restartable, wipeable) is not Dynamo's event plane:
the Dynamo processes use a second nats-server, or zmq, so a fault injected on one does not hit
the other. Everything listens on loopback (zmq publishers bind every interface, so a zmq run
belongs in a network namespace with only loopback).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dynamoview import MODEL_NAME, Deployment, Frontend, wait_for
from workerset_admission.adapters.nats.embedded import EmbeddedNatsServer

__all__ = [
    "Figures",
    "Flip",
    "Load",
    "Outcome",
    "Request",
    "SideBySide",
    "figures",
    "side_by_side",
]

# One line per request at INFO would bury a failing test's output.
logging.getLogger("httpx2").setLevel(logging.WARNING)

RATE = 15.0  # requests per second to each frontend
TIMEOUT = 10.0  # per request, as a client of a real deployment would wait


@dataclass(frozen=True, slots=True)
class Request:
    """One request: when it was sent and answered, its HTTP status (0: no answer), its worker."""

    sent: float
    done: float
    status: int
    worker: int | None
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.worker is not None


class Load:
    """Chat requests at a steady rate on one frontend, each on its own, all kept in order.

    A slow request does not hold back the next one: each is sent on schedule and runs
    concurrently, up to ``timeout`` seconds. Runs on its own thread and event loop.
    """

    def __init__(self, port: int, *, rate: float = RATE, timeout: float = TIMEOUT) -> None:
        self.url = f"http://127.0.0.1:{port}/v1/chat/completions"
        self.rate = rate
        self.timeout = timeout
        self.requests: list[Request] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _one(self, client: Any, turn: int) -> None:
        sent = time.monotonic()
        body = {
            "model": MODEL_NAME,
            "messages": [{"role": "user", "content": f"a b a {turn % 7}"}],
            "max_tokens": 2,
            "nvext": {"extra_fields": ["worker_id"]},
        }
        status, worker, error = 0, None, ""
        try:
            reply = await client.post(self.url, json=body)
            status = reply.status_code
            if status == 200:
                ids = (reply.json().get("nvext") or {}).get("worker_id") or {}
                worker = ids.get("decode_worker_id")
            else:
                error = reply.text[:200]
        except Exception as exc:  # a timeout or a refused connection: no answer
            error = f"{type(exc).__name__}: {exc}"[:200]
        self.requests.append(Request(sent, time.monotonic(), status, worker, error))

    async def _run(self) -> None:
        import httpx2 as httpx  # the openai client's own HTTP library

        limits = httpx.Limits(max_connections=int(self.rate * self.timeout) + 8)
        async with httpx.AsyncClient(timeout=self.timeout, limits=limits) as client:
            pending: set[asyncio.Task[None]] = set()
            start = time.monotonic()
            turn = 0
            while not self._stop.is_set():
                task = asyncio.ensure_future(self._one(client, turn))
                pending.add(task)
                task.add_done_callback(pending.discard)
                turn += 1
                await asyncio.sleep(max(0.0, start + turn / self.rate - time.monotonic()))
            if pending:
                await asyncio.wait(pending, timeout=self.timeout + 2)

    def start(self) -> Load:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(self.timeout + 10)

    def between(self, start: float, end: float) -> list[Request]:
        """The requests sent in ``[start, end)``, in send order."""
        return sorted((r for r in self.requests if start <= r.sent < end), key=lambda r: r.sent)


@dataclass(frozen=True, slots=True)
class Figures:
    """What a fault cost one frontend."""

    sent: int
    failed: int
    longest_gap: float  # seconds between the send times of two successive successes
    to_rejected: int  # successes served by a worker that must not serve yet
    errors: tuple[str, ...] = ()
    # Failed requests by HTTP status (0: no answer): 503 is a request routed to a worker that
    # no longer serves, 404 one that found the model gone (a frontend's own rebuild).
    statuses: tuple[tuple[int, int], ...] = ()

    def row(self) -> str:
        return f"{self.failed} of {self.sent} failed, longest no-success {self.longest_gap:.2f} s"


def figures(
    requests: Iterable[Request], *, rejected: Iterable[int] = (), rejected_until: float = 0.0
) -> Figures:
    """Count failures, the longest no-success window and early requests to ``rejected``.

    The window runs from the send time of one successful request to that of the next, so at a
    steady rate with no failure it is one request's spacing. A success of a ``rejected`` worker
    counts against it when the request was sent before ``rejected_until``.
    """
    ordered = sorted(requests, key=lambda r: r.sent)
    banned = set(rejected)
    successes = [r.sent for r in ordered if r.ok]
    if not ordered:
        gap = 0.0
    elif not successes:
        gap = ordered[-1].sent - ordered[0].sent
    else:
        edges = [ordered[0].sent, *successes, ordered[-1].sent]
        gap = max(b - a for a, b in itertools.pairwise(edges))
    failed = [r for r in ordered if not r.ok]
    early = [r for r in ordered if r.ok and r.worker in banned and r.sent < rejected_until]
    errors = tuple(f"{r.sent:.3f} {r.status} {r.error}" for r in failed[:20])
    statuses: dict[int, int] = {}
    for request in failed:
        statuses[request.status] = statuses.get(request.status, 0) + 1
    return Figures(
        len(ordered), len(failed), gap, len(early), errors, tuple(sorted(statuses.items()))
    )


def measured(
    outcome: Outcome, record: Callable[[str, object], None], tag: str
) -> tuple[Figures, Figures]:
    """Report what a fault cost each frontend (``record``: pytest's ``record_property``), print
    it under ``[tag]``, check that each carried the load, and return the view's and direct's."""
    from natsfixture import show

    for name, result in outcome.figures.items():
        record(f"{name}_failed", result.failed)
        record(f"{name}_sent", result.sent)
        record(f"{name}_longest_no_success_seconds", round(result.longest_gap, 3))
        record(f"{name}_to_rejected", result.to_rejected)
        show(f"[{tag}] {outcome.name}: {name} {result.row()} {dict(result.statuses)}")
        for error in result.errors:
            show(f"[{tag}]   {name} {error}")
        # Both frontends carried the load the whole window (the load was not the fault).
        assert result.sent >= 10, f"{name}: only {result.sent} requests were sent"
    return outcome.figures["view"], outcome.figures["direct"]


@dataclass(frozen=True, slots=True)
class Flip:
    """A succession as one frontend saw it, from the last incumbent's SIGTERM."""

    failed: int  # requests sent from the SIGTERM to the successor's first success
    first_success: float  # seconds from the SIGTERM to the send of that success
    errors: tuple[str, ...] = ()


def flip(requests: Iterable[Request], successor: Iterable[int], at: float) -> Flip | None:
    """How a frontend moved to ``successor`` after the SIGTERM at ``at`` (None: it never did)."""
    ordered = sorted((r for r in requests if r.sent >= at), key=lambda r: r.sent)
    cohort = set(successor)
    first = next((r for r in ordered if r.ok and r.worker in cohort), None)
    if first is None:
        return None
    failed = [r for r in ordered if r.sent < first.sent and not r.ok]
    errors = tuple(f"+{r.sent - at:.3f} {r.status} {r.error[:60]}" for r in failed)
    return Flip(len(failed), first.sent - at, errors)


@dataclass(frozen=True, slots=True)
class Outcome:
    """One fault under load: what it cost each frontend, and when the load ran."""

    name: str
    figures: dict[str, Figures]
    started: float
    ended: float
    flips: dict[str, Flip | None] = field(default_factory=dict)
    # Failed requests sent within a second after a worker's SIGTERM, per frontend: those
    # routed to a worker that had stopped serving (or was stopping). A frontend's own rebuild
    # at a flip fails requests too, with 404 or 503 ("not ready"), but not only after a SIGTERM.
    after_stop: dict[str, int] = field(default_factory=dict)
    # With drains: per frontend, how long after its ``drain --wait`` returned a drained worker
    # was last sent a request it then answered (negative: none after the return). A frontend
    # reads the view's change through its own file watcher, and a request it had already
    # routed is still on its way: this is the margin ``--grace`` covers.
    routed_after_drain: dict[str, float] = field(default_factory=dict)


@dataclass
class SideBySide:
    """One deployment, its frontends (and a control, if asked); :meth:`load` loads each alike.

    The fault methods run one row of the availability table each under steady load and
    leave the deployment serving again (a replaced worker, a restarted server), so one
    deployment serves every row in turn. ``incumbent`` is the serving cohort.
    """

    deployment: Deployment
    plugin_nats: Any  # EmbeddedNatsServer or a container: stop/start/restart(wipe=...)
    view: Frontend | None = None
    direct: Frontend | None = None
    # A second frontend on the workers' own store ("control"), with ``start(control=True)``:
    # how far two frontends of Dynamo alone differ on the same fault, run to run.
    control: Frontend | None = None
    # A second frontend on a view of its own, the plugin inside it (the route extension),
    # with ``start(second_view=True)``: a drain waits for every frontend that admits.
    view2: Frontend | None = None
    loads: dict[str, Load] = field(default_factory=dict)
    incumbent: list[int] = field(default_factory=list)
    block_size: int = 16
    # The incumbent's worker namespace; a versioned rolling update moves to a new one.
    namespace: str = "viewns"
    rate: float = RATE
    _started: int = 0
    _last_stop: float = 0.0
    _generations: int = 1
    # How long each ``drain --wait`` of the last rolling update took, in order, and when each
    # step of it happened (monotonic clock, as request send times): drain, drained, SIGTERM.
    drain_waits: list[float] = field(default_factory=list)
    marks: list[tuple[str, int, float]] = field(default_factory=list)

    def start(
        self,
        *frontend_args: str,
        frontend_env: dict[str, str] | None = None,
        control: bool = False,
        second_view: bool = False,
    ) -> None:
        """The bridge, the plugin and the frontends; returns once every one answers."""
        self.deployment.start_bridge()
        self.deployment.start_sidecar()
        running = self.deployment
        self.view = running.start_frontend("frontend-view", *frontend_args, env=frontend_env)
        self.direct = running.start_frontend(
            "frontend-direct", *frontend_args, view=running.store, env=frontend_env
        )
        if control:
            self.control = running.start_frontend(
                "frontend-control", *frontend_args, view=running.store, env=frontend_env
            )
        if second_view:
            own = running.root / "view-2-kv"
            own.mkdir(exist_ok=True)
            self.view2 = running.start_frontend(
                "frontend-view-2",
                *frontend_args,
                "--frontend-route-extension",
                "workerset-admission",
                view=own,
                env=(frontend_env or {})
                | running.extension_env(own, "workerset-admission.status.view-2"),
            )

    @property
    def frontends(self) -> dict[str, Frontend]:
        view, direct = self.view, self.direct
        assert view is not None, "call start() first"
        assert direct is not None, "call start() first"
        out = {"direct": direct, "view": view}
        if self.view2 is not None:
            out["view-2"] = self.view2
        if self.control is not None:
            out["control"] = self.control
        return out

    def wait_serving(self, workers: Iterable[int], seconds: float = 60.0) -> None:
        """Until every frontend lists the model and the view holds exactly ``workers``."""
        expected = set(workers)
        wait_for(
            lambda: self.deployment.view_instance_ids(self.namespace) == expected,
            seconds,
            f"the view holds {sorted(expected)}",
        )
        for name, frontend in self.frontends.items():
            wait_for(lambda f=frontend: MODEL_NAME in f.models(), seconds, f"{name} lists model")
            wait_for(lambda f=frontend: f.ask().decode in expected, seconds, f"{name} serves")

    @contextlib.contextmanager
    def load(self) -> Iterator[dict[str, Load]]:
        """Steady load on every frontend while the block runs."""
        self.loads = {name: Load(f.port, rate=self.rate) for name, f in self.frontends.items()}
        for load in self.loads.values():
            load.start()
        try:
            yield self.loads
        finally:
            for load in self.loads.values():
                load._stop.set()
            for load in self.loads.values():
                load.stop()

    def figures(
        self, start: float, end: float, *, rejected: Iterable[int] = (), until: float = 0.0
    ) -> dict[str, Figures]:
        banned = set(rejected)
        return {
            name: figures(load.between(start, end), rejected=banned, rejected_until=until)
            for name, load in self.loads.items()
        }

    # -- workers ------------------------------------------------------------------------------

    def add_worker(self, block_size: int | None = None, namespace: str | None = None) -> int:
        """Start one mocker (the incumbent's block size and namespace unless told); its id."""
        self._started += 1
        size = self.block_size if block_size is None else block_size
        return self.deployment.start_worker(
            f"worker-{self._started}-bs{size}",
            block_size=size,
            namespace=namespace or self.namespace,
        )

    def drain_command(self, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        """Run ``workerset-admission drain ARGS`` against this deployment's buckets."""
        running = self.deployment
        return subprocess.run(
            running._cli(
                "drain",
                *args,
                "--timeout",
                str(timeout),
                "--nats-server",
                running.nats_url,
                "--discovery-bucket",
                running.bucket,
                "--admission-bucket",
                f"{running.bucket}-adm",
            ),
            capture_output=True,
            text=True,
            timeout=timeout + 30,
            check=False,
        )

    def drain_worker(self, worker: int, namespace: str, timeout: float = 60.0) -> float:
        """``workerset-admission drain --wait`` for one worker; return how long it took."""
        started = time.monotonic()
        result = self.drain_command(
            str(worker), "--namespace", namespace, "--wait", "--by", "side-by-side",
            timeout=timeout,
        )  # fmt: skip
        assert result.returncode == 0, f"drain {worker:x}: {result.stderr}"
        return time.monotonic() - started

    def serve(self, count: int = 3) -> None:
        """Bring the incumbent up to ``count`` workers, served by every frontend."""
        while len(self.incumbent) < count:
            self.incumbent.append(self.add_worker())
        self.wait_serving(self.incumbent)

    # -- the faults ---------------------------------------------------------------------------

    def _under_load(
        self,
        name: str,
        fault: Callable[[], tuple[list[int], float] | None],
        *,
        lead: float = 1.0,
        settle: float = 3.0,
    ) -> Outcome:
        """Run ``fault`` under load; it may return a cohort that must not serve before a time."""
        with self.load():
            time.sleep(lead)  # the steady state before the fault, in every window
            started = time.monotonic() - lead
            early = fault()
            time.sleep(settle)
            ended = time.monotonic()
        rejected, until = early if early is not None else ([], 0.0)
        figures = self.figures(started, ended, rejected=rejected, until=until)
        return Outcome(name, figures, started, ended)

    def outage(self, seconds: float = 15.0, settle: float = 5.0) -> Outcome:
        """The plugin's nats-server down ``seconds`` (SIGKILL), its store kept."""

        def fault() -> None:
            self.plugin_nats.restart(kill=True, downtime=seconds)

        return self._under_load(f"nats-server down {seconds:g} s, store kept", fault, settle=settle)

    def wipe(self, downtime: float = 2.0, settle: float = 15.0) -> Outcome:
        """The plugin's nats-server killed and restarted after ``downtime`` with an empty store."""

        def fault() -> None:
            self.plugin_nats.restart(kill=True, wipe=True, downtime=downtime)

        name = f"nats-server killed, back after {downtime:g} s with a wiped store"
        return self._under_load(name, fault, settle=settle)

    def drain(self, settle: float = 3.0) -> Outcome:
        """SIGTERM one incumbent worker (it deregisters and exits); a new one replaces it."""
        leaving = self.incumbent.pop(0)
        outcome = self._under_load(
            "SIGTERM (drain) of one worker",
            lambda: self.deployment.stop_worker(leaving),
            settle=settle,
        )
        self.serve(len(self.incumbent) + 1)
        return outcome

    def kill(self, settle: float = 12.0) -> Outcome:
        """SIGKILL one incumbent worker; its records stay until the store's 10 s expiry."""
        dying = self.incumbent.pop(0)
        outcome = self._under_load(
            "SIGKILL of one worker", lambda: self.deployment.kill_worker(dying), settle=settle
        )
        self.serve(len(self.incumbent) + 1)
        return outcome

    def rolling_update(
        self,
        rivals: int = 2,
        spacing: float = 5.0,
        settle: float = 3.0,
        before: Callable[[list[int]], None] | None = None,
        *,
        drained: bool = False,
        versioned: bool = False,
        grace: float = 0.0,
    ) -> Outcome:
        """Workers of another block size join, then the incumbent's are SIGTERMed in turn.

        In the incumbent's namespace the newcomers are a conflicting cohort: a request one of
        them serves before the last incumbent's SIGTERM (with ``drained``, before its drain
        began) counts against the frontend, and ``before`` is called with them once the
        plugin rejects them. ``versioned`` puts them in a namespace of their own instead (the
        contract's deployment generations): they serve beside the incumbent at once. With
        ``drained`` each incumbent worker is drained (``drain --wait``), then SIGTERMed
        ``grace`` seconds later, as ``drain --wait --grace`` would (docs/drains.md: the grace lets
        requests already routed to it finish); a frontend of Dynamo alone knows nothing of
        drains and sees the SIGTERMs only. Afterwards the newcomers are the incumbent.
        """
        size = 32 if self.block_size == 16 else 16
        old_namespace = namespace = self.namespace
        if versioned:
            self._generations += 1
            namespace = f"viewns-v{self._generations}"
        cohort = [self.add_worker(size, namespace) for _ in range(rivals)]
        if versioned:
            wait_for(
                lambda: set(cohort) <= self.deployment.view_instance_ids(namespace),
                30,
                "the view serves the new generation",
            )
        else:
            wait_for(
                lambda: set(cohort) <= self.deployment.rejected(), 30, "the plugin rejects them"
            )
        if before is not None:
            before(cohort)
        leaving = list(self.incumbent)
        self.drain_waits = []
        self.marks = []
        drain_began = 0.0

        def fault() -> tuple[list[int], float]:
            nonlocal drain_began
            last = 0.0
            for number, worker in enumerate(leaving):
                if number:
                    time.sleep(spacing)
                if drained:
                    drain_began = time.monotonic()
                    self.marks.append(("drain", worker, drain_began))
                    self.drain_waits.append(self.drain_worker(worker, old_namespace))
                    self.marks.append(("drained", worker, time.monotonic()))
                    # drain --grace is this sleep; kept here so the marks say when the
                    # drain itself answered.
                    time.sleep(grace)
                last = time.monotonic()
                self.marks.append(("sigterm", worker, last))
                self.deployment.stop_worker(worker)
            self._last_stop = last
            # The newcomers may serve from the moment the last incumbent begins to leave.
            return ([] if versioned else cohort), (drain_began if drained else last)

        name = "rolling update" + (" to a new namespace" if versioned else "")
        outcome = self._under_load(name + (", drained" if drained else ""), fault, settle=settle)
        stops = [at for kind, _worker, at in self.marks if kind == "sigterm"]
        answered = {worker: at for kind, worker, at in self.marks if kind == "drained"}
        for frontend, load in self.loads.items():
            # A drain reaches only the frontends on a view; the others see the SIGTERM.
            on_view = frontend.startswith("view")
            at = drain_began if drained and on_view else self._last_stop
            outcome.flips[frontend] = flip(load.requests, cohort, at)
            outcome.after_stop[frontend] = sum(
                1
                for r in load.requests
                if not r.ok and any(stop <= r.sent < stop + 1.0 for stop in stops)
            )
            if answered:
                outcome.routed_after_drain[frontend] = max(
                    (r.sent - answered[r.worker] for r in load.requests
                     if r.ok and r.worker in answered),
                    default=float("-inf"),
                )  # fmt: skip
        self.incumbent, self.block_size, self.namespace = cohort, size, namespace
        self.wait_serving(cohort)
        return outcome


@contextlib.contextmanager
def side_by_side(
    root: Path,
    plugin_nats: Any,
    *,
    event_plane: str = "nats",
    deployment: Callable[..., Deployment] = Deployment,
) -> Iterator[SideBySide]:
    """A side-by-side deployment under ``root``; the Dynamo event plane is its own.

    ``plugin_nats`` is the plugin's server: a handle with ``url`` and ``restart`` (an
    :class:`EmbeddedNatsServer` or a container). With ``event_plane="nats"`` a second
    nats-server carries Dynamo's events; with ``"zmq"`` Dynamo's default transport does.
    ``deployment`` makes the :class:`Deployment` (a subclass that starts a piece elsewhere,
    such as the soak's ``serve`` in a network namespace of its own).
    """
    events: EmbeddedNatsServer | None = None
    if event_plane == "nats":
        events = EmbeddedNatsServer(root / "event-plane")
        events.start()
    running = deployment(
        root,
        plugin_nats.url,
        f"side-{uuid.uuid4().hex[:10]}",
        event_plane=event_plane,
        event_plane_url=events.url if events is not None else None,
    )
    try:
        yield SideBySide(running, plugin_nats)
    finally:
        running.close()
        if events is not None:
            events.close()
