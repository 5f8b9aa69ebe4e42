"""A writer that cannot start keeps its predecessor's view until the horizon that writer set."""

from __future__ import annotations

from typing import Any

from workerset_admission.adapters.dynamo.view import LastKnownGood, ViewFile


class Files:
    """The directory as :class:`LastKnownGood` uses it: a registry, mtimes, clocks, remove."""

    def __init__(self, files: dict[ViewFile, float], clock: list[float]) -> None:
        self.files = files
        self.clock = clock
        self.touched = 0

    def registered(self) -> list[ViewFile]:
        return sorted(self.files)

    def now(self) -> float:
        return self.clock[0]

    def restamp_ahead(self, files: list[ViewFile], lease: float | None = None) -> int:
        # As the real directory does: a stamp more than the lease and 30 s beyond now is cut
        # back to the lease.
        assert lease is not None
        late = [f for f in files if self.files.get(f, 0.0) > self.clock[0] + lease + 30.0]
        for file in late:
            self.files[file] = self.clock[0] + lease
        return len(late)

    def modified(self, file: ViewFile) -> float | None:
        return self.files.get(file)

    def touch(self, file: ViewFile) -> bool:
        if file not in self.files:
            return False
        self.files[file] = self.clock[0]
        self.touched += 1
        return True

    def remove(self, file: ViewFile) -> None:
        self.files.pop(file, None)


def keeper(files: Files, clock: list[float], lease: float = 50.0) -> LastKnownGood:
    now = lambda: clock[0]  # noqa: E731
    return LastKnownGood(files, lease=lease, clock=now)  # type: ignore[arg-type]


def test_the_predecessors_files_are_kept_untouched_until_the_store_would_expire_them() -> None:
    clock = [100.0]
    # The predecessor stamped its files a lease ahead (mtime 150): the store keeps them to 160.
    files = Files({("mdc", "a"): 150.0, ("instances", "a"): 149.0}, clock)
    kept = keeper(files, clock)
    assert kept.until == 160.0
    for step in range(59):
        clock[0] = 101.0 + step
        assert kept.keep_alive() == 0
        assert kept.serving
    # Never touched: a writer that cannot read discovery has nothing newer to vouch for.
    assert files.files == {("mdc", "a"): 150.0, ("instances", "a"): 149.0}
    assert files.touched == 0
    clock[0] = 160.5
    assert kept.keep_alive() == 2
    assert files.files == {}
    assert not kept.serving
    assert kept.keep_alive() == 0


def test_a_predecessor_that_stamped_now_leaves_its_files_for_the_stores_ten_seconds() -> None:
    clock = [100.0]
    files = Files({("mdc", "a"): 97.0, ("instances", "a"): 96.0}, clock)
    kept = keeper(files, clock)
    assert kept.until == 107.0  # stamped 3 s ago: 7 s more, as the store would keep them


def test_files_past_their_horizon_are_not_revived() -> None:
    clock = [100.0]
    files = Files({("mdc", "a"): 80.0}, clock)
    kept = keeper(files, clock)
    assert not kept.serving
    assert kept.keep_alive() == 1
    assert files.files == {}
    assert files.touched == 0


def test_no_predecessor_means_nothing_to_keep() -> None:
    clock: list[Any] = [5.0]
    kept = keeper(Files({}, clock), clock)
    assert not kept.serving
    assert kept.keep_alive() == 0


def test_a_predecessor_whose_clock_ran_a_day_ahead_is_kept_for_one_lease_not_a_day() -> None:
    clock = [100.0]
    day = 86400.0
    # Stamped by a writer whose clock ran a day ahead: the store would keep them a day.
    files = Files({("mdc", "a"): 150.0 + day, ("instances", "a"): 149.0 + day}, clock)
    kept = keeper(files, clock, lease=50.0)
    assert kept.until == 160.0  # now, the lease, the store's 10 s
    assert files.files == {("mdc", "a"): 150.0, ("instances", "a"): 150.0}
    clock[0] = 160.5
    assert kept.keep_alive() == 2
