"""What every bridge shares: the bucket writer port, and the decisions that heal a lost bucket.

A bridge keeps the part of the discovery bucket it owns equal to a Dynamo store. Its memory of
what it wrote (``mirrored``) is only a guess about the bucket: the NATS server may restart with
an empty store, someone may delete and re-create the stream, or delete a key behind its back.
Two checks turn the guess back into the truth:

- the *mark*, read often and cheaply: the stream's creation time and last sequence, and how
  many times the connection came back. A mark that differs from the last one in any of the
  ways :func:`heal_reason` names means the bucket may have lost everything: the bridge reads
  the bucket at once and re-writes every record it owns that is not there.
- the *contents*, read periodically whatever the mark says: every live key under the four
  discovery prefixes, its value and whether this writer stamped it.
  :func:`reconciled_mirror` turns that reading into the bridge's new memory, and the bridge's
  ordinary diff then writes what is missing or different and deletes what it owns and no longer
  wants. :func:`healed_mirror` does the same and also names the keys the bucket lost, which
  a bridge counts and reports.

These are pure functions; the bridges in ``adapters/dynamo`` and ``adapters/etcd`` and the
writer in ``adapters/nats`` supply the I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "BucketMark",
    "BucketValue",
    "BucketWriter",
    "Change",
    "HealedMirror",
    "heal_reason",
    "healed_mirror",
    "reconciled_mirror",
    "removal_order",
    "write_in_turn",
]


@dataclass(frozen=True, slots=True)
class BucketValue:
    """One live key as the bucket holds it now: its value, and whether this writer stamped it."""

    value: bytes
    owned: bool


@dataclass(frozen=True, slots=True)
class BucketMark:
    """What identifies the bucket's stream at one moment, as the writer saw it.

    ``existed`` is false when the stream was gone and the writer had to create it again;
    ``created`` is the stream's creation time as the server reports it; ``last_seq`` its last
    sequence; ``written_seq`` the highest sequence the server acknowledged to this writer since
    the previous mark; ``connections`` counts the writer's connections (one more after each
    reconnect).
    """

    existed: bool
    created: str
    last_seq: int
    written_seq: int = 0
    connections: int = 1


@dataclass(frozen=True, slots=True)
class HealedMirror:
    """A reading of the bucket turned into the writer's new memory, and the keys it lost.

    ``lost`` holds, sorted, every key the writer remembered and still wants that the reading
    did not show: the new ``memory`` leaves it out, so the writer's ordinary diff puts it again.
    """

    memory: dict[str, bytes | None]
    lost: tuple[str, ...]


# One write of a bridge's pass: a key and its new value, or ``None`` to delete the key.
Change = tuple[str, bytes | None]


class BucketWriter(Protocol):
    """The write side of the discovery bucket, as a bridge needs it."""

    async def put(self, key: str, value: bytes) -> None: ...

    async def delete(self, key: str) -> None: ...

    async def write(self, changes: Sequence[Change]) -> list[Exception | None]:
        """Apply ``changes`` in their order; one outcome each (``None``: written).

        The writes of one call may be in flight together, but they reach the bucket in the
        order given. A failed one does not stop the others: the caller retries it.
        """
        ...

    async def keys(self) -> list[str]:
        """Every live key under the four discovery prefixes that this writer wrote."""
        ...

    async def contents(self) -> Mapping[str, BucketValue]:
        """Every live key under the four discovery prefixes, as the bucket holds it now."""
        ...

    async def mark(self) -> BucketMark:
        """Read the bucket's identity now; create the bucket again (as configured) if gone."""
        ...


async def write_in_turn(writer: BucketWriter, changes: Sequence[Change]) -> list[Exception | None]:
    """Apply ``changes`` one after the other through ``put`` and ``delete``; one outcome each.

    For a writer that cannot send its writes together: the same contract as
    :meth:`BucketWriter.write`, one round trip per change.
    """
    return [await _write_one(writer, key, value) for key, value in changes]


async def _write_one(writer: BucketWriter, key: str, value: bytes | None) -> Exception | None:
    try:
        if value is None:
            await writer.delete(key)
        else:
            await writer.put(key, value)
    except Exception as exc:  # reported to the caller, which retries it
        return exc
    return None


_REMOVAL_RANK = {"instances": 0, "mdc": 1, "event_sources": 2, "event_channels": 3}


def removal_order(key: str) -> tuple[int, str]:
    """Sort key for a bridge's deletes: the order that stops routing to a departed worker soonest.

    Its instance records first (what a frontend routes by), then its model cards (its
    membership; the last one gone lets a successor in), then its event records; by key within
    each. ``key`` is a bucket key (``v1.<kind>.…``); anything else sorts last.
    """
    parts = key.split(".", 2)
    kind = parts[1] if len(parts) == 3 else ""
    return _REMOVAL_RANK.get(kind, len(_REMOVAL_RANK)), key


def heal_reason(before: BucketMark | None, now: BucketMark) -> str | None:
    """Say why the bucket may have lost this writer's records since ``before``, or ``None``.

    The first mark compares with nothing: a bridge's start already writes everything it owns.
    A stream's sequence never goes back while the stream lives, so a last sequence below what
    was seen or acknowledged before means the store was replaced, even under the same
    creation time (a server restored from an older copy).
    """
    if not now.existed:
        return "the bucket was gone and has been created again"
    if before is None:
        return None
    if now.created != before.created:
        return "the bucket's stream was re-created"
    if now.last_seq < max(before.last_seq, now.written_seq):
        return "the bucket's sequence went back (its store was replaced)"
    if now.connections != before.connections:
        return "the connection to NATS was re-established"
    return None


def reconciled_mirror(
    desired: Mapping[str, bytes],
    mirrored: Mapping[str, bytes | None],
    held: Mapping[str, BucketValue],
    *,
    prune: bool,
) -> dict[str, bytes | None]:
    """Return the writer's memory corrected to what the bucket ``held`` when it was read.

    The result keeps a key, with the value the bucket holds, when the writer has a claim on it:
    it wrote it earlier (``mirrored``), the bucket says it stamped it (``owned``, only when
    pruning: without pruning a bridge deletes only what it wrote in this run), or the bucket
    already holds exactly the value the writer wants. A key the writer remembers and wants but
    the bucket lost is dropped, so the writer's ordinary diff against ``desired`` puts it again.
    A key it owns and no longer wants stays, so that diff deletes it; so does one it remembers
    and no longer wants that the reading did not show (a delete still owed: one more removal
    marker costs nothing, and a reading that missed a key must not cancel it). A key another
    writer put, with a value this writer does not want, is left out: it is never deleted, and
    is overwritten only when this writer's store holds a record under the same key.
    """
    memory: dict[str, bytes | None] = {}
    for key, record in held.items():
        if key in mirrored or (prune and record.owned) or desired.get(key) == record.value:
            memory[key] = record.value
    for key, value in mirrored.items():
        if key not in desired and key not in memory:
            memory[key] = value
    return memory


def healed_mirror(
    desired: Mapping[str, bytes],
    mirrored: Mapping[str, bytes | None],
    held: Mapping[str, BucketValue],
    *,
    prune: bool,
) -> HealedMirror:
    """Return :func:`reconciled_mirror`'s memory with the keys it dropped that are still wanted."""
    memory = reconciled_mirror(desired, mirrored, held, prune=prune)
    lost = tuple(sorted(key for key in mirrored if key in desired and key not in memory))
    return HealedMirror(memory, lost)
