"""A writer that cannot start keeps its predecessor's view for at most one registration TTL."""

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
    return LastKnownGood(files, 10.0, clock=now, wall=now)  # type: ignore[arg-type]


def test_the_predecessors_files_are_kept_alive_until_one_ttl_after_their_last_refresh() -> None:
    clock = [100.0]
    files = Files({("mdc", "a"): 97.0, ("instances", "a"): 96.0}, clock)
    kept = keeper(files, clock)
    assert kept.until == 107.0  # refreshed 3 s ago: 7 s more
    for step in range(6):
        clock[0] = 101.0 + step
        assert kept.keep_alive() == 2
        assert kept.serving
    assert set(files.files.values()) == {106.0}
    clock[0] = 107.5
    assert kept.keep_alive() == 2
    assert files.files == {}
    assert not kept.serving
    assert kept.keep_alive() == 0


def test_files_older_than_a_ttl_are_not_revived() -> None:
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
