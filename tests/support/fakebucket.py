"""A hand-written discovery bucket behind the bridges' ``BucketWriter`` port, and its losses."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from workerset_admission.mirror import BucketMark, BucketValue, Change, write_in_turn

__all__ = ["FakeBucket"]


class FakeBucket:
    """Keys and values in a dict, with the stamps, failures and losses a real bucket has.

    ``owned`` holds the keys this writer stamped (by default every key given at creation:
    written by an earlier run). Writes fail while ``broken`` is set or for keys in ``failing``;
    reading the contents fails while ``unreadable`` is set. :meth:`wipe` is a server restarted
    on an empty store (``recreate=False``: the stream is gone until the next :meth:`mark`
    creates it again); :meth:`lose` deletes a key behind the writer's back; :meth:`reconnect`
    is a connection that came back.
    """

    def __init__(
        self,
        data: Mapping[str, bytes] | None = None,
        *,
        owned: Iterable[str] | None = None,
        failing: Iterable[str] = (),
    ) -> None:
        self.data: dict[str, bytes] = dict(data or {})
        self.owned: set[str] = set(self.data if owned is None else owned)
        self.failing: set[str] = set(failing)
        self.broken = False
        # Its contents cannot be read (the stream answers, its consumer does not).
        self.unreadable = False
        self.writes: list[tuple[str, bytes | None]] = []
        self.exists = True
        self.generation = 0
        self.last_seq = len(self.data)
        self.connections = 1
        self.marks = 0
        self.readings = 0
        # How many changes each ``write`` call carried, in call order.
        self.batches: list[int] = []

    @property
    def log(self) -> list[tuple[str, str]]:
        """Every write so far as (``put`` or ``delete``, key)."""
        return [("put" if value is not None else "delete", key) for key, value in self.writes]

    def _check(self, key: str) -> None:
        if self.broken or key in self.failing:
            raise ConnectionError("bucket unreachable")
        if not self.exists:
            raise ConnectionError("no stream answers for the bucket")

    async def put(self, key: str, value: bytes) -> None:
        self._check(key)
        self.data[key] = value
        self.owned.add(key)
        self.last_seq += 1
        self.writes.append((key, value))

    async def delete(self, key: str) -> None:
        self._check(key)
        self.data.pop(key, None)
        self.owned.discard(key)
        self.last_seq += 1
        self.writes.append((key, None))

    async def write(self, changes: Sequence[Change]) -> list[Exception | None]:
        self.batches.append(len(changes))
        return await write_in_turn(self, changes)

    async def keys(self) -> list[str]:
        return sorted(self.owned & set(self.data))

    async def contents(self) -> dict[str, BucketValue]:
        if self.broken or self.unreadable or not self.exists:
            raise ConnectionError("bucket unreachable")
        self.readings += 1
        return {key: BucketValue(value, key in self.owned) for key, value in self.data.items()}

    async def mark(self) -> BucketMark:
        if self.broken:
            raise ConnectionError("bucket unreachable")
        self.marks += 1
        existed = self.exists
        if not existed:
            self.exists = True
            self.generation += 1
        return BucketMark(
            existed=existed,
            created=f"generation {self.generation}",
            last_seq=self.last_seq,
            connections=self.connections,
        )

    def wipe(self, *, recreate: bool = True) -> None:
        """Lose everything, as a server restarted with an empty store does."""
        self.data.clear()
        self.owned.clear()
        self.last_seq = 0
        self.exists = recreate
        if recreate:
            self.generation += 1

    def lose(self, key: str) -> None:
        """Delete ``key`` as another writer would."""
        del self.data[key]
        self.owned.discard(key)
        self.last_seq += 1

    def reconnect(self) -> None:
        self.connections += 1
