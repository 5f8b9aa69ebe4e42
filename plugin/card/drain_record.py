"""Drain records (``v1.drain.<ns>.<id hex>``): an operator's "take this worker out of routing".

The drain tools write one record per drained worker into the discovery bucket, so every
frontend, and one that starts later, reads the same drain. The value is a small JSON object::

    {"type": "Drain", "namespace": "dgd", "instance_id": 5102475244781244677,
     "by": "preStop:pod/worker-0", "at": 1764626400.25}

``by`` (who drained it, at most 256 characters) and ``at`` (Unix seconds) are optional and
only reported. The value must agree with its key on namespace and instance id, like every
record at the boundary; any other field, a wrong type, or a value over 4 KiB is refused with
the boundary's reasons (``invalid_json``, ``invalid_record``, ``wrong_record_type``,
``identity_mismatch``, ``value_too_large``, ``duplicate_field``, ...), and changes nothing.

Beside them, one drain budget record per model (``v1.budget.<digest>``, the SHA-256 of the model
name in hex: a key of one length whatever the name, since a model name may be far longer than a
key or a NATS control line can carry) makes a drain's last-worker check and its write one step:
a drain adds the workers it is about to drain to the budget of every model they serve, by a
compare-and-set on the record's revision, before it writes a drain record; a drain that read an
older revision fails its swap and checks again::

    {"type": "DrainBudget", "model": "llama",
     "pending": [{"namespace": "dgd", "instance_id": 161, "since": 1764626400.25}]}

The value names the model in full: a record whose ``model`` is another name (two names of one
digest, or a forged record) holds nothing for this one. ``since`` is the NATS server's time of
the write that first held the entry; an entry without it was added by the record's own write,
whose server time its reader takes from the stored message. No host's clock is ever written or
compared (see ``rollout/drain.py``, the budgets). Only the drain tools read it (no frontend
watches ``v1.budget.``).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any

from workerset_admission.card import jsonio
from workerset_admission.card.envelope import text_within
from workerset_admission.errors import InvalidRecordError
from workerset_admission.identity import Drain
from workerset_admission.keys import DRAIN_PREFIX, check_instance_id, parse_drain_key

__all__ = [
    "BUDGET_PREFIX",
    "MAX_BY_LENGTH",
    "MAX_DRAIN_VALUE",
    "BudgetRead",
    "Pending",
    "budget_kv_key",
    "decode_budget_record",
    "decode_drain_record",
    "encode_budget_record",
    "encode_drain_record",
    "is_drain_key",
]

# A drain record is a handful of fields; anything larger is not one of ours.
MAX_DRAIN_VALUE = 4096
MAX_BY_LENGTH = 256
_FIELDS = frozenset({"type", "namespace", "instance_id", "by", "at"})


def _u64(value: Any) -> bool:
    return type(value) is int and 0 <= value < 1 << 64


def decode_drain_record(key: str, raw: bytes | str) -> Drain:
    """Validate one drain record against its key; raise :class:`InvalidRecordError` if refused."""
    namespace, instance_id = parse_drain_key(key)
    try:
        value = jsonio.loads(text_within(raw, MAX_DRAIN_VALUE, key))
    except jsonio.JsonError as exc:
        raise InvalidRecordError(exc.reason, exc.detail, key=key) from None
    if not isinstance(value, dict):
        raise InvalidRecordError("invalid_record", "a drain record must be a JSON object", key=key)
    if isinstance(value, jsonio.DupDict) and value.dups:
        name = sorted(value.dups)[0]
        raise InvalidRecordError("duplicate_field", f"duplicate field `{name}`", key=key)
    if value.get("type") != "Drain":
        raise InvalidRecordError(
            "wrong_record_type", f"expected a Drain record, got type {value.get('type')!r}", key=key
        )
    unknown = sorted(set(value) - _FIELDS)
    if unknown:
        raise InvalidRecordError("invalid_record", f"unknown field `{unknown[0]}`", key=key)
    if not isinstance(value.get("namespace"), str):
        raise InvalidRecordError("invalid_record", "field `namespace` must be a string", key=key)
    if not _u64(value.get("instance_id")):
        raise InvalidRecordError("invalid_record", "field `instance_id` must be a u64", key=key)
    if (value["namespace"], value["instance_id"]) != (namespace, instance_id):
        raise InvalidRecordError(
            "identity_mismatch",
            "the value's namespace or instance id disagrees with its key",
            key=key,
        )
    by = value.get("by", "")
    if not isinstance(by, str) or len(by) > MAX_BY_LENGTH:
        raise InvalidRecordError(
            "invalid_record", f"field `by` must be a string of at most {MAX_BY_LENGTH}", key=key
        )
    at = value.get("at")
    if at is not None and (
        isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at)
    ):
        raise InvalidRecordError("invalid_record", "field `at` must be a finite number", key=key)
    return Drain(namespace, instance_id, by, None if at is None else float(at))


def encode_drain_record(drain: Drain) -> bytes:
    """Return the record the drain tools write for ``drain`` (compact JSON)."""
    check_instance_id(drain.instance_id)
    record: dict[str, Any] = {
        "type": "Drain",
        "namespace": drain.namespace,
        "instance_id": drain.instance_id,
    }
    if drain.by:
        record["by"] = drain.by[:MAX_BY_LENGTH]
    if drain.at is not None:
        record["at"] = drain.at
    return jsonio.dumps_compact(record).encode()


def is_drain_key(key: str) -> bool:
    return key.startswith(DRAIN_PREFIX)


BUDGET_PREFIX = "v1.budget."


def budget_kv_key(model: str) -> str:
    """KV key of a model's drain budget record: one length whatever the model's name."""
    return f"{BUDGET_PREFIX}{hashlib.sha256(model.encode()).hexdigest()}"


@dataclass(frozen=True, slots=True)
class Pending:
    """A drain a command committed to in a budget record: its worker, and since when.

    ``since`` is the NATS server's time (Unix seconds) of the write that first held it, or
    None for one the record's own write added (its time is the stored message's).
    """

    namespace: str
    instance_id: int
    since: float | None = None


@dataclass(frozen=True, slots=True)
class BudgetRead:
    """One model's budget record as read: its revision, value, and the server's time of it."""

    revision: int | None = None
    raw: bytes | None = None
    # When the server stored the record (its clock); None when there is none.
    stored_at: float | None = None


def _seconds(value: object) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def decode_budget_record(raw: bytes | None, model: str | None = None) -> tuple[Pending, ...]:
    """Read the pending drains of a budget record; a value that is not one holds none.

    With ``model``, a record naming another model (the same digest, or a forged value) holds
    none either. A budget record only makes drains wait for one another: one that cannot be
    read is replaced by the next swap, and the drain records themselves still say what is
    drained.
    """
    if not raw:
        return ()
    try:
        value = jsonio.loads(raw)
    except jsonio.JsonError:
        return ()
    if not isinstance(value, dict) or (model is not None and value.get("model") != model):
        return ()
    items = value.get("pending")
    found: list[Pending] = []
    for item in items if isinstance(items, list) else ():
        if not isinstance(item, dict):
            continue
        namespace, instance_id = item.get("namespace"), item.get("instance_id")
        if isinstance(namespace, str) and isinstance(instance_id, int) and _u64(instance_id):
            found.append(Pending(namespace, instance_id, _seconds(item.get("since"))))
    return tuple(found)


def encode_budget_record(model: str, pending: tuple[Pending, ...]) -> bytes:
    """Return a model's budget record holding ``pending`` (compact JSON, by worker)."""
    entries: list[dict[str, Any]] = []
    for p in sorted(pending, key=lambda p: (p.namespace, p.instance_id)):
        entry: dict[str, Any] = {"namespace": p.namespace, "instance_id": p.instance_id}
        if p.since is not None:
            entry["since"] = p.since
        entries.append(entry)
    record = {"type": "DrainBudget", "model": model, "pending": entries}
    return jsonio.dumps_compact(record).encode()
