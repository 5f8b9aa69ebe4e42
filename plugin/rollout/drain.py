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
would be left with no routable worker on a live frontend (see the comment above it); the drain
tool refuses then, unless told ``--allow-empty``.

*Safe to stop.* A frontend routes to a worker while its serving record lists one of the
worker's instance keys. A drain takes the worker out of every hop at once, except when it was
the last member of a committed incumbent with a successor waiting: then the old tenure goes on
serving it until the successor is committed (the handover), and only then drops it. So one
condition answers both questions the operator has ("does any frontend still route to it?" and
"does every frontend that did now serve the successor?"): no live frontend lists the worker.
A frontend that never admitted the worker lists nothing of it and is confirmed at once; one
that stopped is no longer live once its heartbeat expires (``serving_record.live_records``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from workerset_admission import identity
from workerset_admission.card import jsonio
from workerset_admission.card.serving_record import (
    CapabilityRecord,
    NamespaceRecord,
    Record,
    live_records,
)
from workerset_admission.errors import UsageError
from workerset_admission.keys import ENDPOINT_PREFIX, MODEL_PREFIX, parse_key

__all__ = [
    "NATS_PLANE",
    "DrainCheck",
    "Emptied",
    "FrontendConfirmation",
    "ListedRecord",
    "Selection",
    "Worker",
    "check_drained",
    "check_last_workers",
    "find_workers",
    "listed_records",
    "lost_models",
    "nats_subjects",
    "parse_instance_id",
    "transport_host",
    "transport_subject",
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
    # Where an endpoint record says the worker listens: a host, or a NATS subject.
    host: str | None = None
    subject: str | None = None

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
            found.append(ListedRecord(worker, component, endpoint, model=name if name else None))
        else:
            transport = record.get("transport")
            found.append(
                ListedRecord(
                    worker,
                    component,
                    endpoint,
                    host=transport_host(transport),
                    subject=transport_subject(transport),
                )
            )
    return found


@dataclass(frozen=True, slots=True)
class Selection:
    """Which workers an operator names: one id, a host, or every worker of a place (``every``).

    ``namespaces`` narrows any of them (for a host drain: only the namespaces named); a
    ``component``, ``endpoint`` or ``model`` narrows ``every`` to a WorkerSet or a model.
    """

    instance_id: int | None = None
    host: str | None = None
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
        if self.every and not self.namespaces:
            raise UsageError("--all drains a whole namespace: name it with --namespace")

    def describe(self) -> str:
        where = f" in namespace {', '.join(self.namespaces)}" if self.namespaces else ""
        if self.instance_id is not None:
            return f"no worker {self.instance_id:#x}{where} is registered"
        if self.host is not None:
            return f"no worker on host {self.host}{where} is registered"
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
# A drain must not take a model's last routable worker on a live frontend unsaid. Each live
# frontend's serving records say which members it routes to for each model; the drain is
# refused when, with the named workers (and the ones already drained) out, a frontend that
# serves a model through one of them would list no member of that model any more. A
# handover does not empty a model: when another configuration of the same WorkerSet is
# registered, the frontend keeps serving the drained incumbent until that successor is
# committed (see admission/core.py), so a registered, undrained member of the same model and
# WorkerSet counts as what is left. With no live frontend there is nothing to ask: the drain
# is judged against the discovery bucket as a frontend starting now would see it (another
# registered, undrained worker of the model must remain).


@dataclass(frozen=True, slots=True)
class Emptied:
    """A model a drain would leave without a routable worker on one frontend (or anywhere)."""

    model: str
    # The frontend that would lose it; None when no frontend is live (judged on the bucket).
    frontend: str | None
    # The model's members on that frontend now, every one of them drained.
    members: tuple[str, ...]

    def __str__(self) -> str:
        where = f"on frontend {self.frontend}" if self.frontend else "in the discovery bucket"
        last = ", ".join(self.members) or "none"
        return (
            f"model {self.model} would be left with no routable worker {where} (its last: {last})"
        )

    def as_json(self) -> dict[str, Any]:
        return {"model": self.model, "frontend": self.frontend, "members": list(self.members)}


def _served(records: Sequence[Record]) -> dict[str, dict[str, list[str]]]:
    """Map frontend -> model -> its members there (``namespace NS`` when records name no model)."""
    served: dict[str, dict[str, list[str]]] = {}
    for record in live_records(records):
        models = served.setdefault(record.frontend, {})
        if isinstance(record, CapabilityRecord):
            continue
        assert isinstance(record, NamespaceRecord)
        if record.groups is None:
            # Dynamo's own shape names no model: its namespace stands for one.
            models.setdefault(f"namespace {record.namespace}", []).extend(record.members)
            continue
        for group in record.groups:
            models.setdefault(group.model, []).extend(group.members)
    return served


def _owned(member: str, workers: Iterable[Worker]) -> bool:
    return any(worker.owns(member) for worker in workers)


def _successors(listed: Sequence[ListedRecord], out: set[Worker]) -> set[tuple[str, str]]:
    """(model, namespace/component/endpoint) of every registered card not drained."""
    return {
        (r.model, "/".join(r.worker_set))
        for r in listed
        if r.model is not None and r.worker not in out
    }


def check_last_workers(
    records: Sequence[Record],
    entries: Iterable[tuple[str, bytes]],
    workers: Sequence[Worker],
    already_drained: Iterable[Worker] = (),
) -> tuple[Emptied, ...]:
    """Say which models draining ``workers`` would leave unserved (empty: the drain may go)."""
    out = set(workers) | set(already_drained)
    listed = listed_records(entries)
    cards = _successors(listed, out)
    emptied: list[Emptied] = []
    served = _served(records)
    for frontend, models in sorted(served.items()):
        for model, members in sorted(models.items()):
            touched = [m for m in members if _owned(m, workers)]
            if not touched or any(not _owned(m, out) for m in members):
                continue
            places = {"/".join(m.split("/")[:3]) for m in touched}
            if any((model, place) in cards for place in places):
                continue  # a successor of the same WorkerSet takes over (a handover)
            emptied.append(Emptied(model, frontend, tuple(sorted(set(members)))))
    if served:
        return tuple(emptied)
    by_model: dict[str, set[Worker]] = {}
    for reg in listed:
        if reg.model is not None:
            by_model.setdefault(reg.model, set()).add(reg.worker)
    for model, holders in sorted(by_model.items()):
        if holders & set(workers) and holders <= out:
            last = tuple(str(w) for w in sorted(holders))
            emptied.append(Emptied(model, None, last))
    return tuple(emptied)


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
    """What one live frontend's serving records say of the drained workers."""

    frontend: str
    # The drained workers' instance keys it still lists (it may still route to them).
    still_serving: tuple[str, ...]

    @property
    def confirmed(self) -> bool:
        return not self.still_serving

    def as_json(self) -> dict[str, Any]:
        return {
            "frontend": self.frontend,
            "confirmed": self.confirmed,
            "still_serving": list(self.still_serving),
        }


@dataclass(frozen=True, slots=True)
class DrainCheck:
    """One look at the serving-admission bucket for a drain."""

    workers: tuple[Worker, ...]
    frontends: tuple[FrontendConfirmation, ...]
    # (frontend, model): a model a live frontend stopped serving while the drain waited.
    lost: tuple[tuple[str, str], ...] = ()

    @property
    def safe(self) -> bool:
        """No live frontend lists any drained worker: stopping them loses no request."""
        return all(f.confirmed for f in self.frontends)

    @property
    def waiting_for(self) -> tuple[str, ...]:
        return tuple(f.frontend for f in self.frontends if not f.confirmed)

    def as_json(self) -> dict[str, Any]:
        return {
            "safe": self.safe,
            "workers": [
                {"namespace": w.namespace, "instance_id": w.instance_id} for w in self.workers
            ],
            "frontends": [f.as_json() for f in self.frontends],
            "lost_models": [{"frontend": f, "model": m} for f, m in self.lost],
        }


def check_drained(records: Sequence[Record], workers: Sequence[Worker]) -> DrainCheck:
    """Ask every live frontend's records whether it still lists one of ``workers``."""
    listed: dict[str, set[str]] = {}
    for record in live_records(records):
        listed.setdefault(record.frontend, set())
        if isinstance(record, CapabilityRecord):
            continue
        assert isinstance(record, NamespaceRecord)
        members: list[str] = list(record.members)
        for group in record.groups or ():
            members.extend(group.members)
        for member in members:
            if any(worker.owns(member) for worker in workers):
                listed[record.frontend].add(member)
    frontends = tuple(
        FrontendConfirmation(frontend, tuple(sorted(keys)))
        for frontend, keys in sorted(listed.items())
    )
    return DrainCheck(tuple(workers), frontends)
