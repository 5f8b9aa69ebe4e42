"""Drain answers: which worker an operator names, and whether every frontend has let it go.

Theory of operation
-------------------
``workerset-admission drain`` writes a drain record into the discovery bucket (the admission
core treats the worker as departed, see ``admission/core.py``) and, with ``--wait``, answers
"safe to stop" from the serving-admission bucket every frontend publishes to. Everything here
is pure: listings and records in, answers out.

*Naming workers.* An operator names one by instance id, as ``status`` prints it (decimal, or
hex with ``0x``), optionally with its namespace; a whole namespace (narrowed to a WorkerSet or a
model) with ``--all``; or, as a Kubernetes ``preStop`` hook does, which knows its pod but not
Dynamo's ids, by host: the address its endpoint records carry on every request plane 1.6.1
records (``transport.tcp`` is ``host:port/<endpoint>``, ``transport.http`` a URL; the NATS
plane's ``transport.nats_tcp`` is a subject, whose subscriber's host the NATS server's
monitoring tells, see ``adapters/nats/monitor.py``). A :class:`Selection` is one of these;
:func:`find_workers` looks it up in one listing of the discovery bucket; a drain covers every
model and endpoint the worker registered, since they share its namespace and instance id.

*The last worker.* Before anything is written, :func:`check_last_workers` asks whether a model
would be left with no routable worker on a live frontend, or in the discovery bucket for the
namespaces no live frontend watches (see the comment above it); the drain tool refuses then,
unless told ``--allow-empty``. The check and the write are one step against other drains: a
drain first adds its workers to each model's budget record by a compare-and-set on the record's
revision (:func:`pending_drains`, :func:`budget_after`), so of two drains that read the same
revision only one goes on, and the other checks again with the first one's workers out.

*Safe to stop.* A frontend routes to a worker while its serving record lists one of the
worker's instance keys. A drain takes the worker out of every hop at once, except when it was
the last member of a committed incumbent with a successor waiting: then the old tenure goes on
serving it until the successor is committed (the handover), and only then drops it. So one
condition answers both questions the operator has ("does any frontend still route to it?" and
"does every frontend that did now serve the successor?"): no live frontend lists the worker.
A frontend that never admitted the worker lists nothing of it and is confirmed at once.

A frontend whose writer went silent still routes by its last view, for as long as its records
say (:mod:`workerset_admission.rollout.frontends`, ``silent_frontends``): its heartbeat is gone,
its capability record's lease is not. Its last namespace records are what that view holds, so it
is asked like a live one: if they list none of the workers it is confirmed, else the drain
waits for it, until it comes back and lets go, or its lease ends (the server removes the record:
the frontend's store has expired the view, it routes nowhere), or the timeout passes, and then
the answer is "could not confirm", never "safe". A namespace record too large to publish stands
as a marker, and counts as listing every worker of its namespace. One that was live (or silent)
when the drain began and left the bucket with no lease of its own (an earlier release, a
frontend whose view does not outlive it; it stopped, or lost NATS) never confirmed: it is
*unconfirmed*, and the answer is not "safe" unless the operator says a frontend that went away
counts as one that let go.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from workerset_admission import identity
from workerset_admission.card import jsonio
from workerset_admission.card.drain_record import Pending
from workerset_admission.card.serving_record import (
    CapabilityRecord,
    NamespaceRecord,
    Record,
    live_records,
    routing_records,
)
from workerset_admission.errors import UsageError
from workerset_admission.keys import ENDPOINT_PREFIX, MODEL_PREFIX, parse_key
from workerset_admission.rollout.frontends import (
    leased_frontends,
    live_frontends,
    silent_frontends,
    watched_namespaces,
)

__all__ = [
    "NATS_PLANE",
    "PENDING_WINDOW",
    "DrainCheck",
    "Emptied",
    "FrontendConfirmation",
    "ListedRecord",
    "Selection",
    "Worker",
    "budget_after",
    "check_drained",
    "check_last_workers",
    "find_workers",
    "gone_unconfirmed",
    "listed_records",
    "lost_models",
    "models_of",
    "nats_subjects",
    "parse_instance_id",
    "pending_drains",
    "transport_host",
    "transport_port",
    "transport_subject",
    "wait_namespaces",
]


@dataclass(frozen=True, slots=True, order=True)
class Worker:
    """One worker as a drain names it: its namespace and instance id."""

    namespace: str
    instance_id: int

    def owns(self, member: str) -> bool:
        """Whether an instance key (``ns/component/endpoint/<hex>[/suffix]``) is this worker's."""
        prefix = f"{self.namespace}/"
        if not member.startswith(prefix):
            return False
        parts = member[len(prefix) :].split("/")
        return len(parts) >= 3 and parts[2] == f"{self.instance_id:x}"

    def __str__(self) -> str:
        return f"{self.namespace}/{self.instance_id:x} ({self.instance_id})"


def parse_instance_id(text: str) -> int:
    """Read an instance id as an operator types it: decimal, or hex with ``0x``."""
    try:
        return identity.parse_instance_id(text)
    except ValueError as error:
        raise UsageError(str(error)) from None


# Every request plane Dynamo 1.6.1's ``TransportType`` can record in an endpoint's
# ``transport``: ``tcp`` is ``host:port/<endpoint>``, ``http`` a URL (the type has it, though a
# 1.6.1 worker refuses DYN_REQUEST_PLANE=http), ``nats_tcp`` a NATS subject (no host).
NATS_PLANE = "nats_tcp"


def transport_host(transport: Any) -> str | None:
    """Return the host an endpoint record's transport names, if its request plane has one."""
    if not isinstance(transport, dict):
        return None
    address = transport.get("tcp")
    if isinstance(address, str):
        host = address.split("/", 1)[0].rsplit(":", 1)[0]
        return host.strip("[]") or None
    url = transport.get("http")
    if isinstance(url, str):
        try:
            return urlsplit(url).hostname or None
        except ValueError:
            return None
    return None


def transport_port(transport: Any) -> int | None:
    """Return the port an endpoint record's transport names (TCP and HTTP request planes)."""
    if not isinstance(transport, dict):
        return None
    address = transport.get("tcp")
    if isinstance(address, str):
        port = address.split("/", 1)[0].rsplit(":", 1)
        return int(port[1]) if len(port) == 2 and port[1].isdigit() else None
    url = transport.get("http")
    if isinstance(url, str):
        try:
            return urlsplit(url).port
        except ValueError:
            return None
    return None


def transport_subject(transport: Any) -> str | None:
    """Return the NATS subject of an endpoint on the NATS request plane (``nats_tcp``)."""
    subject = transport.get(NATS_PLANE) if isinstance(transport, dict) else None
    return subject if isinstance(subject, str) and subject else None


@dataclass(frozen=True, slots=True)
class ListedRecord:
    """One model or endpoint record of a worker, as a drain reads it from the listing."""

    worker: Worker
    component: str
    endpoint: str
    # The model a card serves (its ``display_name``); None for an endpoint record.
    model: str | None = None
    # Where an endpoint record says the worker listens: a host and port, or a NATS subject.
    host: str | None = None
    subject: str | None = None
    port: int | None = None
    # A card on its model's serving hop (not a prefill or encode worker, which serve only
    # through a decode or aggregated worker of the same model).
    serving: bool = True

    @property
    def worker_set(self) -> tuple[str, str, str]:
        return (self.worker.namespace, self.component, self.endpoint)


def _value(value: bytes) -> dict[str, Any]:
    try:
        record = jsonio.loads(value)
    except jsonio.JsonError:
        return {}
    return record if isinstance(record, dict) else {}


def listed_records(entries: Iterable[tuple[str, bytes]]) -> list[ListedRecord]:
    """Read a listing of the discovery bucket: one entry per base card and endpoint record.

    Keys that do not parse and LoRA adapter cards are skipped: the boundary reports the first,
    and an adapter is served by its base worker's card.
    """
    found: list[ListedRecord] = []
    for key, value in entries:
        if not key.startswith((MODEL_PREFIX, ENDPOINT_PREFIX)):
            continue
        try:
            parsed = parse_key(key)
        except Exception:
            continue
        if parsed.model_suffix is not None:
            continue
        worker = Worker(parsed.endpoint.namespace, parsed.instance_id)
        component, endpoint = parsed.endpoint.component, parsed.endpoint.endpoint
        record = _value(value)
        if parsed.kind == "model":
            card = record.get("card_json")
            name = card.get("display_name") if isinstance(card, dict) else None
            found.append(
                ListedRecord(
                    worker,
                    component,
                    endpoint,
                    model=name if name else None,
                    serving=_on_serving_hop(card),
                )
            )
        else:
            transport = record.get("transport")
            found.append(
                ListedRecord(
                    worker,
                    component,
                    endpoint,
                    host=transport_host(transport),
                    subject=transport_subject(transport),
                    port=transport_port(transport),
                )
            )
    return found


# The worker types whose hop is not the model's own: a frontend routes to them only from a
# decode or aggregated worker of the model (Dynamo 1.6.1's prefill and encoder hops).
_PEER_ROLES = frozenset({"prefill", "encode"})


def _on_serving_hop(card: Any) -> bool:
    """Whether a card's worker serves its model itself, as its worker type says.

    A card naming no worker type is a prefill worker when its model type has the Prefill
    flag (how older workers said so), else an aggregated one.
    """
    if not isinstance(card, dict):
        return False
    worker_type = card.get("worker_type")
    if isinstance(worker_type, str):
        return worker_type not in _PEER_ROLES
    model_type = card.get("model_type")
    flags = model_type.split("|") if isinstance(model_type, str) else ()
    return "Prefill" not in (flag.strip() for flag in flags)


def _worker_set_role(worker_set: str) -> str | None:
    """Return the effective worker type a serving record's WorkerSet id names, if any."""
    try:
        parts = jsonio.loads(worker_set)
    except jsonio.JsonError:
        return None
    if isinstance(parts, list) and len(parts) == 5 and isinstance(parts[4], str):
        return parts[4]
    return None


@dataclass(frozen=True, slots=True)
class Selection:
    """Which workers an operator names: one id, a host, or every worker of a place (``every``).

    ``namespaces`` narrows any of them (for a host drain: only the namespaces named); a
    ``component``, ``endpoint`` or ``model`` narrows ``every`` to a WorkerSet or a model.
    """

    instance_id: int | None = None
    host: str | None = None
    # With ``host``: the request plane's port too, so pods sharing one IP name one worker each.
    port: int | None = None
    every: bool = False
    namespaces: tuple[str, ...] = ()
    component: str | None = None
    endpoint: str | None = None
    model: str | None = None

    def check(self) -> None:
        """Refuse a selection that names nothing, or names it twice (one line each)."""
        named = [
            what
            for what, given in (
                ("an instance id", self.instance_id is not None),
                ("--host", self.host is not None),
                ("--all", self.every),
            )
            if given
        ]
        if not named:
            raise UsageError("name the workers: an instance id, --host, or --namespace NS --all")
        if len(named) > 1:
            raise UsageError(f"name the workers one way: {' and '.join(named)} conflict")
        narrows = [
            flag
            for flag, value in (
                ("--component", self.component),
                ("--endpoint", self.endpoint),
                ("--model", self.model),
            )
            if value is not None
        ]
        if narrows and not self.every:
            raise UsageError(f"{', '.join(narrows)} narrow --all: add --namespace NS --all")
        if self.port is not None and self.host is None:
            raise UsageError("--port narrows --host: name the host too")
        if self.every and not self.namespaces:
            raise UsageError("--all drains a whole namespace: name it with --namespace")

    def describe(self) -> str:
        where = f" in namespace {', '.join(self.namespaces)}" if self.namespaces else ""
        if self.instance_id is not None:
            return f"no worker {self.instance_id:#x}{where} is registered"
        if self.host is not None:
            at = self.host if self.port is None else f"{self.host}:{self.port}"
            return f"no worker on host {at}{where} is registered"
        parts = [
            f"{flag} {value}"
            for flag, value in (
                ("component", self.component),
                ("endpoint", self.endpoint),
                ("model", self.model),
            )
            if value is not None
        ]
        return f"no worker{where}{' with ' + ', '.join(parts) if parts else ''} is registered"


def find_workers(
    entries: Iterable[tuple[str, bytes]],
    selection: Selection,
    *,
    subject_hosts: Mapping[str, str] | None = None,
) -> list[Worker]:
    """Find the workers a listing of the discovery bucket holds that ``selection`` names.

    A host matches an endpoint record whose transport names it (TCP and HTTP request planes),
    or, on the NATS request plane, whose subject ``subject_hosts`` maps to it (the hosts of
    the subject's subscribers, as the NATS server's monitoring reports them). Keys that do not
    parse are skipped: the boundary reports them, this only looks.
    """
    selection.check()
    hosts = subject_hosts or {}
    listed = listed_records(entries)
    in_model: set[Worker] = {
        r.worker for r in listed if selection.model is None or r.model == selection.model
    }
    found: set[Worker] = set()
    for reg in listed:
        worker = reg.worker
        if selection.namespaces and worker.namespace not in selection.namespaces:
            continue
        if selection.instance_id is not None and worker.instance_id != selection.instance_id:
            continue
        if selection.host is not None:
            host = reg.host if reg.host is not None else hosts.get(reg.subject or "")
            if host != selection.host:
                continue
            # A NATS-plane record has no port of its own: a port never names one.
            if selection.port is not None and reg.port != selection.port:
                continue
        if selection.component is not None and reg.component != selection.component:
            continue
        if selection.endpoint is not None and reg.endpoint != selection.endpoint:
            continue
        if worker not in in_model:
            continue
        found.add(worker)
    return sorted(found)


def nats_subjects(entries: Iterable[tuple[str, bytes]]) -> list[str]:
    """Return the NATS request-plane subjects of every endpoint record in a listing."""
    return sorted({r.subject for r in listed_records(entries) if r.subject is not None})


# --------------------------------------------------------------------------- the last worker
# A drain must not take a model's last routable worker unsaid. What counts is what a frontend
# can route: a worker on the model's serving hop (a prefill or encode worker serves nothing by
# itself) that it admitted, or, in the bucket, one with both a card and an endpoint record (a
# card alone is no worker). Each live frontend is asked for the namespaces it watches: the
# drain is refused when, with the named workers (and the ones already drained or about to be)
# out, a frontend that serves a model through one of them would list no member of that model
# on its serving hop any more. A handover does not empty a model: when another configuration
# of the same WorkerSet is registered and routable, the frontend keeps serving the drained
# incumbent until that successor is committed (see admission/core.py). A drained worker of a
# namespace no live frontend watches is judged on the discovery bucket, as a frontend starting
# now would see it: another routable, undrained worker of the model must remain registered.


@dataclass(frozen=True, slots=True)
class Emptied:
    """A model a drain would leave without a routable worker on one frontend (or anywhere)."""

    model: str
    # The frontend that would lose it; None for the namespaces no live frontend watches.
    frontend: str | None
    # The model's members on that frontend now, every one of them drained.
    members: tuple[str, ...]

    def __str__(self) -> str:
        where = (
            f"on frontend {self.frontend}"
            if self.frontend
            else "in the discovery bucket (the namespaces no live frontend watches)"
        )
        last = ", ".join(self.members) or "none"
        return (
            f"model {self.model} would be left with no routable worker {where} (its last: {last})"
        )

    def as_json(self) -> dict[str, Any]:
        return {"model": self.model, "frontend": self.frontend, "members": list(self.members)}


def _served(records: Sequence[Record]) -> dict[str, dict[str, list[str]]]:
    """Map frontend -> model -> its members there on the model's serving hop.

    A record that names no model (Dynamo's own shape) stands for one: ``namespace NS``.
    """
    served: dict[str, dict[str, list[str]]] = {}
    for record in live_records(records):
        models = served.setdefault(record.frontend, {})
        if isinstance(record, CapabilityRecord):
            continue
        assert isinstance(record, NamespaceRecord)
        if record.groups is None:
            models.setdefault(f"namespace {record.namespace}", []).extend(record.members)
            continue
        for group in record.groups:
            members = models.setdefault(group.model, [])
            if _worker_set_role(group.worker_set) not in _PEER_ROLES:
                members.extend(group.members)
    return served


def _owned(member: str, workers: Iterable[Worker]) -> bool:
    return any(worker.owns(member) for worker in workers)


def _routable(listed: Sequence[ListedRecord]) -> set[tuple[Worker, str, str]]:
    """(worker, model, namespace/component/endpoint) of every card a frontend could route to.

    A card counts when it is on its model's serving hop and the same worker has an endpoint
    record at the same place (the liveness a frontend intersects admission with).
    """
    live = {(r.worker, r.worker_set) for r in listed if r.model is None}
    return {
        (r.worker, r.model, "/".join(r.worker_set))
        for r in listed
        if r.model is not None and r.serving and (r.worker, r.worker_set) in live
    }


def check_last_workers(
    records: Sequence[Record],
    entries: Iterable[tuple[str, bytes]],
    workers: Sequence[Worker],
    already_drained: Iterable[Worker] = (),
) -> tuple[Emptied, ...]:
    """Say which models draining ``workers`` would leave unserved (empty: the drain may go)."""
    out = set(workers) | set(already_drained)
    named = set(workers)
    routable = _routable(listed_records(entries))
    successors = {(model, place) for worker, model, place in routable if worker not in out}
    emptied: list[Emptied] = []
    served = _served(records)
    for frontend, models in sorted(served.items()):
        for model, members in sorted(models.items()):
            touched = [m for m in members if _owned(m, named)]
            if not touched or any(not _owned(m, out) for m in members):
                continue
            places = {"/".join(m.split("/")[:3]) for m in touched}
            if any((model, place) in successors for place in places):
                continue  # a routable successor of the same WorkerSet takes over (a handover)
            emptied.append(Emptied(model, frontend, tuple(sorted(set(members)))))
    watched = set().union(*watched_namespaces(records).values())
    unwatched: dict[str, set[Worker]] = {}
    anywhere: dict[str, set[Worker]] = {}
    for worker, model, _place in routable:
        anywhere.setdefault(model, set()).add(worker)
        if worker.namespace not in watched:
            unwatched.setdefault(model, set()).add(worker)
    for model, holders in sorted(unwatched.items()):
        # A frontend starting now, watching every namespace, would route to any routable,
        # undrained worker of the model the bucket holds.
        if holders & named and anywhere[model] <= out:
            last = tuple(str(w) for w in sorted(holders))
            emptied.append(Emptied(model, None, last))
    return tuple(emptied)


def models_of(entries: Iterable[tuple[str, bytes]], workers: Iterable[Worker]) -> list[str]:
    """Every model a card of one of ``workers`` names, sorted: the budgets a drain takes."""
    named = set(workers)
    return sorted(
        {r.model for r in listed_records(entries) if r.model is not None and r.worker in named}
    )


# ------------------------------------------------------------------------------ the budgets
# A budget record's pending drains count as drained for every other drain's check, each from
# the moment its command swapped it in until its drain record is seen (then the record says it)
# or, if the command died between the swap and its write, for PENDING_WINDOW seconds. Each
# swap keeps only the pending drains that still count, so a budget holds the drains of about
# the last minute. A drain reads the budgets before it lists the drains in force: a pending
# drain a later swap dropped because its record was seen is then in that listing.

PENDING_WINDOW = 60.0


def _still_pending(
    pending: Iterable[Pending], in_force: Iterable[Worker], now: float, window: float
) -> tuple[Pending, ...]:
    recorded = set(in_force)
    return tuple(
        p
        for p in pending
        if Worker(p.namespace, p.instance_id) not in recorded and now - p.at < window
    )


def pending_drains(
    budgets: Iterable[Sequence[Pending]],
    in_force: Iterable[Worker],
    now: float,
    window: float = PENDING_WINDOW,
) -> set[Worker]:
    """Return the workers the budgets hold as about to be drained, beyond those in force."""
    recorded = list(in_force)
    return {
        Worker(p.namespace, p.instance_id)
        for pending in budgets
        for p in _still_pending(pending, recorded, now, window)
    }


def budget_after(
    pending: Sequence[Pending],
    workers: Iterable[Worker],
    in_force: Iterable[Worker],
    now: float,
    window: float = PENDING_WINDOW,
) -> tuple[Pending, ...]:
    """Return a budget's pending drains once ``workers`` join them (lapsed ones left out)."""
    adding = {(w.namespace, w.instance_id) for w in workers}
    kept = [
        p
        for p in _still_pending(pending, in_force, now, window)
        if (p.namespace, p.instance_id) not in adding
    ]
    kept.extend(Pending(namespace, instance_id, now) for namespace, instance_id in sorted(adding))
    return tuple(sorted(kept))


def wait_namespaces(before: Sequence[Record], workers: Sequence[Worker]) -> set[str]:
    """Return the namespaces a wait for ``workers`` asks about.

    Theirs, and every namespace a frontend served one of their models from when the drain
    began (so a model lost meanwhile is told).
    """
    namespaces = {worker.namespace for worker in workers}
    served = _served(before)
    models = {
        model
        for by_model in served.values()
        for model, members in by_model.items()
        if any(_owned(m, workers) for m in members)
    }
    for record in before:
        if isinstance(record, NamespaceRecord) and record.namespace is not None:
            if record.groups is None:
                if any(_owned(m, workers) for m in record.members):
                    namespaces.add(record.namespace)
            elif any(group.model in models and group.members for group in record.groups):
                namespaces.add(record.namespace)
    return namespaces


def gone_unconfirmed(
    before: Sequence[Record],
    now: Sequence[Record],
    confirmed: Iterable[str],
    leased: Iterable[str] = (),
) -> tuple[str, ...]:
    """Frontends that may have routed in ``before``, cannot now, and never confirmed the drain.

    A frontend whose records stated a lease on its last view (in ``before``, or as ``leased``
    says) and left the bucket is not one of them: the server removed its lease when the view
    expired, and it routes nowhere.
    """
    let_go = set(confirmed) | set(leased) | leased_frontends(before)
    present = _present(now)
    return tuple(sorted(f for f in _present(before) if f not in present and f not in let_go))


def _present(records: Sequence[Record]) -> set[str]:
    """Return the frontends that may still route: live ones and silent ones."""
    return set(live_frontends(records)) | set(silent_frontends(records))


def lost_models(before: Sequence[Record], now: Sequence[Record]) -> tuple[tuple[str, str], ...]:
    """(frontend, model) pairs a live frontend served before and serves no member of now."""
    then, current = _served(before), _served(now)
    lost = []
    for frontend, models in sorted(current.items()):
        for model, members in sorted(then.get(frontend, {}).items()):
            if members and not models.get(model):
                lost.append((frontend, model))
    return tuple(lost)


@dataclass(frozen=True, slots=True)
class FrontendConfirmation:
    """What one frontend's serving records say of the drained workers.

    ``silent`` marks a frontend whose heartbeat is gone and which still routes by its last view
    (until ``routes_until``, the server time its lease ends, when known): it cannot be asked,
    and it confirms only by coming back.
    """

    frontend: str
    # The drained workers' instance keys it still lists (it may still route to them).
    still_serving: tuple[str, ...]
    silent: bool = False
    routes_until: float | None = None

    @property
    def confirmed(self) -> bool:
        return not self.still_serving

    def as_json(self) -> dict[str, Any]:
        shown: dict[str, Any] = {
            "frontend": self.frontend,
            "confirmed": self.confirmed,
            "still_serving": list(self.still_serving),
        }
        if self.silent:
            # Only a silent frontend says so: a live one's object is as it always was.
            shown.update(silent=True, routes_until=self.routes_until)
        return shown


@dataclass(frozen=True, slots=True)
class DrainCheck:
    """One look at the serving-admission bucket for a drain."""

    workers: tuple[Worker, ...]
    frontends: tuple[FrontendConfirmation, ...]
    # (frontend, model): a model a live frontend stopped serving while the drain waited.
    lost: tuple[tuple[str, str], ...] = ()
    # Frontends live when the drain began that went away (their records expired) without
    # ever listing none of the workers, and stated no lease on a view: they may still route.
    unconfirmed: tuple[str, ...] = ()

    @property
    def settled(self) -> bool:
        """Every live frontend let the workers go (silent ones cannot be asked)."""
        return all(f.confirmed for f in self.frontends if not f.silent)

    @property
    def silent_routing(self) -> tuple[str, ...]:
        """Silent frontends whose last view may still route to a drained worker."""
        return tuple(f.frontend for f in self.frontends if f.silent and not f.confirmed)

    @property
    def safe(self) -> bool:
        """No frontend that may route lists any drained worker and none went away unconfirmed."""
        return self.settled and not self.silent_routing and not self.unconfirmed

    @property
    def waiting_for(self) -> tuple[str, ...]:
        return tuple(f.frontend for f in self.frontends if not f.confirmed and not f.silent)

    def as_json(self) -> dict[str, Any]:
        return {
            "safe": self.safe,
            "workers": [
                {"namespace": w.namespace, "instance_id": w.instance_id} for w in self.workers
            ],
            "frontends": [f.as_json() for f in self.frontends],
            "lost_models": [{"frontend": f, "model": m} for f, m in self.lost],
            "unconfirmed": list(self.unconfirmed),
            "silent_routing": list(self.silent_routing),
        }


def _unpublished_member(record: NamespaceRecord) -> str:
    return f"{record.namespace}/* (its record, {record.unpublished} bytes, is too large to publish)"


def check_drained(records: Sequence[Record], workers: Sequence[Worker]) -> DrainCheck:
    """Ask every live or silent frontend's records whether they still list one of ``workers``.

    A marker for a record too large to publish lists every worker of its namespace.
    """
    silent = silent_frontends(records)
    present = set(live_frontends(records)) | set(silent)
    listed: dict[str, set[str]] = {frontend: set() for frontend in present}
    for record in routing_records(records):
        if isinstance(record, CapabilityRecord) or record.frontend not in present:
            continue
        assert isinstance(record, NamespaceRecord)
        if record.unpublished is not None:
            if any(worker.namespace == record.namespace for worker in workers):
                listed[record.frontend].add(_unpublished_member(record))
            continue
        members: list[str] = list(record.members)
        for group in record.groups or ():
            members.extend(group.members)
        for member in members:
            if any(worker.owns(member) for worker in workers):
                listed[record.frontend].add(member)
    frontends = tuple(
        FrontendConfirmation(
            frontend,
            tuple(sorted(keys)),
            silent=frontend in silent,
            routes_until=silent.get(frontend),
        )
        for frontend, keys in sorted(listed.items())
    )
    return DrainCheck(tuple(workers), frontends)
