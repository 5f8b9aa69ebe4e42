"""What both bridges keep of the bucket: what they wrote, its mark, its healing, their counters.

The file-store bridge (``adapters/dynamo/bridge.py``) and the etcd bridge
(``adapters/etcd/bridge.py``) differ in how they read their store (a scan on every change, a
list then a watch) and agree on everything after: a memory of what they wrote to the bucket
(``mirrored``, a value or ``None`` when only the key is known), the bucket's mark read to find
out whether the bucket was lost or replaced, a reading of its contents that turns the memory
back into the truth, and the accounting of every write. :class:`BucketMirror` is that part,
once; the decisions it applies (when a mark means a lost bucket, what the memory becomes) are
:mod:`workerset_admission.mirror`'s. Each bridge decides when to check and what to write.

It is shared by the adapters that bridge a store into the bucket and imports none of them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass

from workerset_admission.errors import Unreachable, wire_text
from workerset_admission.mirror import BucketMark, BucketWriter, heal_reason, healed_mirror

__all__ = ["READ_FAILURES", "BucketMirror", "MirrorStats"]

# What a writer's reading of the bucket (its mark, its contents) ends with when the bucket cannot
# be read now: the writer's own word for it, the socket's error, or a timeout.
READ_FAILURES: tuple[type[Exception], ...] = (Unreachable, OSError, asyncio.TimeoutError)


@dataclass(slots=True)
class MirrorStats:
    """The counters every bridge keeps of its bucket; each bridge's stats add their own."""

    puts: int = 0
    pruned: int = 0
    write_errors: int = 0
    # Times the bucket was found lost or replaced, and readings of its whole contents.
    heals: int = 0
    reconciles: int = 0
    # Records the bucket had lost that this bridge had written, found by a reconciliation.
    restored: int = 0
    check_errors: int = 0


class BucketMirror:
    """A bridge's memory of the bucket it writes, and the readings that keep it true.

    ``log`` is the bridge's own logger: an operator reads one bridge's lines under one name.
    """

    def __init__(
        self, writer: BucketWriter, stats: MirrorStats, *, prune: bool, log: logging.Logger
    ) -> None:
        self.writer = writer
        self.stats = stats
        self.prune = prune
        self._log = log
        # Key to the value written, or None when only the key is known (owned at start).
        self.mirrored: dict[str, bytes | None] = {}
        self.mark: BucketMark | None = None
        # Set when the mark said the bucket was lost, until a reading of its contents succeeds:
        # a mark taken later compares equal.
        self.heal_pending = False
        self._check_failing = False
        self._contents_failing = False
        self._failing: set[str] = set()

    async def start(self) -> None:
        """Read the bucket's mark and, when pruning, the keys this writer owns (values unknown).

        Every owned key is then either written again or deleted by the bridge's first pass.
        """
        self.mark = await self.writer.mark()
        if self.prune:
            self.mirrored = dict.fromkeys(await self.writer.keys())

    async def read_mark(self) -> tuple[bool, str | None]:
        """Read the bucket's mark: whether it could be read, and why it must heal, if it must.

        An unreadable bucket is counted and logged (a warning, then quietly while it lasts);
        writes fail too then, and are retried.
        """
        try:
            mark = await self.writer.mark()
        except READ_FAILURES as exc:
            self.stats.check_errors += 1
            level = logging.DEBUG if self._check_failing else logging.WARNING
            self._log.log(level, "discovery bridge cannot read the bucket's state: %s", exc)
            self._check_failing = True
            return False, None
        self._check_failing = False
        reason = heal_reason(self.mark, mark)
        self.mark = mark
        if reason is not None:
            self.stats.heals += 1
            self._log.warning(
                "discovery bridge re-writes every record it owns that is missing: %s", reason
            )
            self.heal_pending = True
        return True, reason

    async def reconcile(self, live: Mapping[str, bytes]) -> bool:
        """Read the bucket's contents and make them the memory; ``False`` when unreadable.

        ``live`` is what the bridge wants the bucket to hold; the keys the bucket lost are
        counted and reported, and the bridge's next write puts them back.
        """
        try:
            held = await self.writer.contents()
        except READ_FAILURES as exc:  # tried again later: the bridge says when
            self.stats.check_errors += 1
            level = logging.DEBUG if self._contents_failing else logging.WARNING
            self._log.log(
                level,
                "discovery bridge cannot read the bucket's contents (%s); what it wrote is kept "
                "as it remembers it, and read again at the next check",
                exc,
            )
            self._contents_failing = True
            return False
        self._contents_failing = False
        self.stats.reconciles += 1
        self.heal_pending = False
        healed = healed_mirror(live, self.mirrored, held, prune=self.prune)
        if healed.lost:
            self.stats.restored += len(healed.lost)
            self._log.warning(
                "discovery bridge writes again %d record(s) the bucket lost, e.g. %s",
                len(healed.lost),
                wire_text(healed.lost[0]),
            )
        self.mirrored = healed.memory
        return True

    def settle(self, key: str, failure: Exception | None) -> bool:
        """Account for one write; a failed one leaves the memory as it was, so it is retried.

        The bucket being unreachable must not stop a bridge: the failure is counted and logged
        (a warning once per failing key, then quietly until it succeeds).
        """
        if failure is not None:
            self.stats.write_errors += 1
            level = logging.DEBUG if key in self._failing else logging.WARNING
            self._log.log(level, "discovery bridge could not write %s: %s", key, failure)
            self._failing.add(key)
            return False
        self._failing.discard(key)
        return True

    def wrote(self, key: str, value: bytes | None) -> bool | None:
        """Remember a write that succeeded; for a delete, whether the value was known.

        A put counts as a put and answers ``None``. A delete of a key whose value was never
        known (owned at start, wanted no more) counts as pruned and answers ``False``; a delete
        of a key this bridge wrote answers ``True`` and is the bridge's to count.
        """
        if value is not None:
            self.mirrored[key] = value
            self.stats.puts += 1
            return None
        if self.mirrored.pop(key, None) is None:
            self.stats.pruned += 1
            return False
        return True
