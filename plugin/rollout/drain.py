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
(a LoRA adapter is one) would be left with no routable worker on a live frontend, or, for the
namespaces no live frontend watches, in the admission core run over the bucket's listing
(``rollout/routable.py``: the core's own rule, not a second one); the drain tool refuses then,
unless told ``--allow-empty``. The check and the write are one step against other drains: a
drain first adds its workers to each model's budget record by a compare-and-set on the record's
revision (:func:`pending_drains`, :func:`budget_after`), so of two drains that read the same
revision only one goes on, and the other checks again with the first one's workers out. The
steps, their order and their lost races are one machine, ``rollout/drain_protocol.py``.

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

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from workerset_admission import identity
from workerset_admission.card import BoundarySettings, jsonio
from workerset_admission.card.drain_record import (
    BudgetRead,
    Pending,
    decode_budget_record,
    encode_budget_record,
)
from workerset_admission.card.serving_record import (
    CapabilityRecord,
    NamespaceRecord,
    Record,
    live_records,
    routing_records,
)
from workerset_admission.errors import InvalidRecordError, UsageError
from workerset_admission.identity import EndpointId, GroupKey
from workerset_admission.keys import ENDPOINT_PREFIX, MODEL_PREFIX, parse_key
from workerset_admission.rollout.frontends import (
    leased_frontends,
    live_frontends,
    silent_frontends,
    watched_namespaces,
)
from workerset_admission.rollout.routable import CoreAnswer, core_over

__all__ = [
    "NATS_PLANE",
    "PENDING_WINDOW",
    "BudgetRead",
    "DrainCheck",
    "Emptied",
    "FrontendConfirmation",
    "ListedRecord",
    "Selection",
    "Worker",
    "budget_after",
    "budget_released",
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
    """Read a listing of the discovery bucket: one entry per card and endpoint record.

    A LoRA adapter's card names the adapter as its model (a model to clients, which ``--model``
    selects). Keys that do not parse are skipped: the boundary reports them.
    """
    found: list[ListedRecord] = []
    for key, value in entries:
        if not key.startswith((MODEL_PREFIX, ENDPOINT_PREFIX)):
            continue
        try:
            parsed = parse_key(key)
        except InvalidRecordError:
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
# A drain must not take a model's last routable worker unsaid, and "routable" has one rule, the
# admission core's (see rollout/routable.py): a member its group's served tenure admits whose
# endpoint record is live; only the model's serving hop counts (a prefill or encode worker
# serves nothing by itself), and a LoRA adapter is a model of its own. Each live frontend is
# asked through its serving records: the members it lists, with their endpoint records. The
# drain is refused when, with the named workers (and the ones already drained or about to be)
# out, a frontend that routes a model through one of them would route no member of it any
# more. A handover does not empty a model: when the core, run over the bucket's listing with
# those drains in, serves the model from the same WorkerSet's place (a successor committed),
# the frontend's core does the same. For the namespaces no live frontend watches, that same
# core decides: the model must still have a routable worker there, or anywhere.


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


def _member(member: str) -> tuple[EndpointId, int] | None:
    """Return the endpoint and instance id of an instance key (``ns/component/endpoint/<hex>``)."""
    parts = member.split("/")
    if len(parts) < 4:
        return None
    try:
        return EndpointId(*parts[:3]), int(parts[3], 16)
    except ValueError:
        return None


def _routed(
    records: Sequence[Record], answer: CoreAnswer
) -> dict[str, dict[str, dict[str, tuple[Worker, str]]]]:
    """Frontend -> model -> member -> (worker, place): what each live frontend routes.

    A member counts when the frontend's record lists it and its endpoint record is live (the
    one routing rule); the adapters the core projects onto a routed member are models too.
    """
    routed: dict[str, dict[str, dict[str, tuple[Worker, str]]]] = {}
    for record in live_records(records):
        models = routed.setdefault(record.frontend, {})
        if not isinstance(record, NamespaceRecord):
            continue
        served: list[tuple[str, str | None, tuple[str, ...]]]
        if record.groups is None:
            served = [(f"namespace {record.namespace}", None, record.members)]
        else:
            served = [
                (g.model, g.worker_set, g.members)
                for g in record.groups
                if _worker_set_role(g.worker_set) not in _PEER_ROLES
            ]
        for model, worker_set, members in served:
            into = models.setdefault(model, {})
            for member in members:
                parsed = _member(member)
                if parsed is None:
                    continue
                endpoint, instance_id = parsed
                if not answer.routable(endpoint, instance_id):
                    continue
                worker = Worker(endpoint.namespace, instance_id)
                into[member] = (worker, endpoint.path())
                if worker_set is None:
                    continue
                group = GroupKey(model, worker_set).id
                for name in answer.now.adapters.get((group, worker.namespace, instance_id), ()):
                    models.setdefault(name, {})[f"{member} ({name})"] = (worker, endpoint.path())
    return routed


def _pairs(workers: Iterable[Worker]) -> list[tuple[str, int]]:
    return [(w.namespace, w.instance_id) for w in workers]


def check_last_workers(
    records: Sequence[Record],
    entries: Iterable[tuple[str, bytes]],
    workers: Sequence[Worker],
    already_drained: Iterable[Worker] = (),
    *,
    boundary: BoundarySettings | None = None,
) -> tuple[Emptied, ...]:
    """Say which models draining ``workers`` would leave unserved (empty: the drain may go).

    ``boundary``: the discovery boundary's settings the frontends run with (a namespace filter
    in them is not applied: the bucket is judged as a frontend watching every namespace).
    """
    named = set(workers)
    out = named | set(already_drained)
    answer = core_over(entries, _pairs(out - named), boundary=_every_namespace(boundary))
    before = answer.now
    routed = _routed(records, answer)
    after = answer.after(_pairs(named))
    emptied: list[Emptied] = []
    for frontend, models in sorted(routed.items()):
        for model, members in sorted(models.items()):
            holders = [worker for worker, _place in members.values()]
            if not any(w in named for w in holders) or any(w not in out for w in holders):
                continue
            places = {place for worker, place in members.values() if worker in named}
            if any(after.places.get((model, place)) for place in places):
                continue  # the core commits a successor of the same WorkerSet (a handover)
            emptied.append(Emptied(model, frontend, tuple(sorted(members))))
    watched = set().union(*watched_namespaces(records).values())
    for model in sorted(before.models()):
        serving = {Worker(*pair) for pair in before.workers(model)}
        unwatched = {w for w in serving if w.namespace not in watched}
        # A frontend starting now, watching every namespace, would route to any routable,
        # undrained worker of the model the core serves.
        if unwatched & named and not after.workers(model):
            emptied.append(Emptied(model, None, tuple(str(w) for w in sorted(unwatched))))
    return tuple(emptied)


def _every_namespace(boundary: BoundarySettings | None) -> BoundarySettings | None:
    if boundary is None:
        return None
    return dataclasses.replace(boundary, namespace=None, namespace_prefix=None)


def models_of(
    entries: Iterable[tuple[str, bytes]],
    workers: Iterable[Worker],
    *,
    boundary: BoundarySettings | None = None,
) -> list[str]:
    """Every model the core routes to one of ``workers`` by, adapters too: the budgets taken."""
    named = set(_pairs(workers))
    served = core_over(entries, boundary=_every_namespace(boundary)).now
    return sorted(model for model in served.models() if served.workers(model) & named)


# ------------------------------------------------------------------------------ the budgets
# A budget record's pending drains count as drained for every other drain's check, each from
# the moment its command swapped it in until its drain record is seen (then the record says it)
# or, if the command died between the swap and its write, for PENDING_WINDOW seconds by the
# NATS server's clock: an entry is as old as the server's time now less the server's time of
# the write that first held it (``since``, or the stored record's own time for an entry that
# write added). An entry cannot be older than the record that carries it, so one stamped ahead
# (a forged value) counts for PENDING_WINDOW after its write at most. Every swap writes the
# record with a per-key TTL of PENDING_WINDOW as well, so a budget no drain touches any more is
# removed by the server. Each swap keeps only the pending drains that still count. A drain
# reads the budgets before it lists the drains in force: a pending drain a later swap dropped
# because its record was seen is then in that listing.

PENDING_WINDOW = 60.0


def _since(p: Pending, stored_at: float | None) -> float | None:
    if p.since is None:
        return stored_at
    return p.since if stored_at is None else min(p.since, stored_at)


def _still_pending(
    model: str,
    budget: BudgetRead,
    in_force: Iterable[Worker],
    now: float | None,
    window: float,
) -> tuple[Pending, ...]:
    """Return the entries of a budget that still count, each with its server time given."""
    recorded = set(in_force)
    # Without the server's time now, the latest server time known is the record's own.
    clock = now if now is not None else budget.stored_at
    kept = []
    for p in decode_budget_record(budget.raw, model):
        since = _since(p, budget.stored_at)
        if Worker(p.namespace, p.instance_id) in recorded:
            continue
        if since is not None and clock is not None and clock - since >= window:
            continue
        kept.append(Pending(p.namespace, p.instance_id, since))
    return tuple(kept)


def pending_drains(
    budgets: Mapping[str, BudgetRead],
    in_force: Iterable[Worker],
    now: float | None,
    window: float = PENDING_WINDOW,
) -> set[Worker]:
    """Return the workers the budgets hold as about to be drained, beyond those in force.

    ``now`` is the NATS server's time (None when it did not say it).
    """
    recorded = list(in_force)
    return {
        Worker(p.namespace, p.instance_id)
        for model, budget in budgets.items()
        for p in _still_pending(model, budget, recorded, now, window)
    }


def budget_after(
    model: str,
    budget: BudgetRead,
    workers: Iterable[Worker],
    in_force: Iterable[Worker],
    now: float | None,
    window: float = PENDING_WINDOW,
) -> bytes:
    """Return a budget record once ``workers`` join its pending drains (lapsed ones left out).

    The workers added carry no time: the server's time of the write that stores them is theirs.
    """
    adding = {(w.namespace, w.instance_id) for w in workers}
    kept = [
        p
        for p in _still_pending(model, budget, in_force, now, window)
        if (p.namespace, p.instance_id) not in adding
    ]
    kept.extend(Pending(namespace, instance_id) for namespace, instance_id in sorted(adding))
    return encode_budget_record(model, tuple(kept))


def budget_released(model: str, budget: BudgetRead, workers: Iterable[Worker]) -> bytes | None:
    """Return a budget record with ``workers`` taken out (None: none of them is in it)."""
    ours = {(w.namespace, w.instance_id) for w in workers}
    pending = decode_budget_record(budget.raw, model)
    kept = tuple(
        Pending(p.namespace, p.instance_id, _since(p, budget.stored_at))
        for p in pending
        if (p.namespace, p.instance_id) not in ours
    )
    if len(kept) == len(pending):
        return None
    return encode_budget_record(model, kept)


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
        # ``members`` only, never a group's ``held`` workers: a held tenure's last-known
        # members are served (and listed under ``members``) while its window lasts; once it
        # ended the view withdrew their files before the record moved them to ``held``
        # (the record is published after the view is in step), so neither the live view nor
        # a silent frontend's frozen one routes to them. A frozen view admits nothing new.
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
