"""A writer that cannot start keeps its predecessor's view until the horizon that writer set."""

from __future__ import annotations

from typing import Any

from workerset_admission.adapters.dynamo.view import LastKnownGood, ViewFile


class Files:
    """The directory as :class:`LastKnownGood` uses it: a manifest, mtimes, touch, remove."""

    def __init__(self, files: dict[ViewFile, float], clock: list[float]) -> None:
        self.files = files
        self.clock = clock
        self.touched = 0

    def load_manifest(self) -> list[ViewFile]:
        return sorted(self.files)

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


def keeper(files: Files, clock: list[float]) -> LastKnownGood:
    now = lambda: clock[0]  # noqa: E731
    return LastKnownGood(files, clock=now, wall=now)  # type: ignore[arg-type]


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
