"""Drain answers: which worker an operator names, and whether every frontend has let it go.

Theory of operation
-------------------
``workerset-admission drain`` writes a drain record into the discovery bucket (the admission
core treats the worker as departed, see ``admission/core.py``) and, with ``--wait``, answers
"safe to stop" from the serving-admission bucket every frontend publishes to. Everything here
is pure: listings and records in, answers out.

*Naming a worker.* An operator names it by instance id, as ``status`` prints it (decimal, or
hex with ``0x``), optionally with its namespace; a Kubernetes ``preStop`` hook, which knows its
pod but not Dynamo's ids, names it by host: the address its endpoint instance records carry
(``transport.tcp`` is ``host:port/...``). :func:`find_workers` looks both up in one listing of
the discovery bucket; a drain covers every model and endpoint the worker registered, since
they share its namespace and instance id.

*Safe to stop.* A frontend routes to a worker while its serving record lists one of the
worker's instance keys. A drain takes the worker out of every hop at once, except when it was
the last member of a committed incumbent with a successor waiting: then the old tenure goes on
serving it until the successor is committed (the handover), and only then drops it. So one
condition answers both questions the operator has ("does any frontend still route to it?" and
"does every frontend that did now serve the successor?"): no live frontend lists the worker.
A frontend that never admitted the worker lists nothing of it and is confirmed at once; one
that stopped is no longer live once its records expire (the bucket's max age).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from workerset_admission import identity
from workerset_admission.card import jsonio
from workerset_admission.card.serving_record import CapabilityRecord, NamespaceRecord, Record
from workerset_admission.errors import UsageError
from workerset_admission.keys import ENDPOINT_PREFIX, MODEL_PREFIX, parse_key

__all__ = [
    "DrainCheck",
    "FrontendConfirmation",
    "Worker",
    "check_drained",
    "find_workers",
    "parse_instance_id",
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


def _host_of(value: bytes) -> str | None:
    """Return the host of an endpoint record's TCP transport, if it has one."""
    try:
        record = jsonio.loads(value)
    except jsonio.JsonError:
        return None
    transport: Any = record.get("transport") if isinstance(record, dict) else None
    if not isinstance(transport, dict):
        return None
    address = transport.get("tcp")
    if not isinstance(address, str):
        return None
    host = address.split("/", 1)[0].rsplit(":", 1)[0]
    return host.strip("[]") or None


def find_workers(
    entries: Iterable[tuple[str, bytes]],
    *,
    instance_id: int | None = None,
    namespace: str | None = None,
    host: str | None = None,
) -> list[Worker]:
    """Find the workers a listing of the discovery bucket holds that match what was given.

    ``instance_id`` matches model and endpoint records by id; ``host`` matches endpoint records
    whose TCP transport names that host; ``namespace`` narrows either. Keys that do not parse
    are skipped: the boundary reports them, this only looks.
    """
    if instance_id is None and host is None:
        raise UsageError("name the worker: an instance id, or --host")
    found: set[Worker] = set()
    for key, value in entries:
        if not key.startswith((MODEL_PREFIX, ENDPOINT_PREFIX)):
            continue
        try:
            parsed = parse_key(key)
        except Exception:
            continue
        worker = Worker(parsed.endpoint.namespace, parsed.instance_id)
        if namespace is not None and worker.namespace != namespace:
            continue
        if instance_id is not None and worker.instance_id != instance_id:
            continue
        if host is not None and (parsed.kind != "endpoint" or _host_of(value) != host):
            continue
        found.add(worker)
    return sorted(found)


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
        }


def check_drained(records: Sequence[Record], workers: Sequence[Worker]) -> DrainCheck:
    """Ask every live frontend's records whether it still lists one of ``workers``."""
    listed: dict[str, set[str]] = {}
    for record in records:
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
