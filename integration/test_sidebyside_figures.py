"""The side-by-side harness reads a fault's cost from the request log the way its tables say."""

from __future__ import annotations

import pytest
from sidebyside import Request, figures, flip

A, B = 0xA, 0xB


def _log(*rows: tuple[float, int, int | None]) -> list[Request]:
    return [Request(sent, sent + 0.02, status, worker) for sent, status, worker in rows]


def test_failures_the_longest_no_success_window_and_early_rejected_requests_are_counted() -> None:
    log = _log(
        (0.0, 200, A),
        (0.1, 503, None),
        (0.2, 404, None),
        (0.3, 200, B),  # served by the new cohort before the cut-off
        (0.4, 200, A),
        (0.9, 200, B),
    )

    counted = figures(log, rejected={B}, rejected_until=0.35)

    assert counted.sent == 6
    assert counted.failed == 2
    assert counted.longest_gap == pytest.approx(0.5)  # 0.4 to 0.9, longer than 0.0 to 0.3
    assert counted.to_rejected == 1
    assert len(counted.errors) == 2


def test_a_log_with_no_success_is_one_window_from_first_to_last() -> None:
    counted = figures(_log((1.0, 404, None), (1.5, 503, None), (3.0, 0, None)))

    assert counted.failed == 3
    assert counted.longest_gap == pytest.approx(2.0)


def test_a_200_without_a_worker_id_is_not_a_success() -> None:
    assert figures(_log((0.0, 200, None))).failed == 1


def test_the_flip_counts_failures_from_the_sigterm_to_the_successors_first_success() -> None:
    log = _log(
        (0.9, 503, None),  # before the SIGTERM: not the flip's
        (1.0, 200, A),
        (1.05, 503, None),
        (1.1, 404, None),
        (1.15, 200, B),
        (1.2, 404, None),
    )

    moved = flip(log, {B}, at=1.0)

    assert moved is not None
    assert moved.failed == 2
    assert moved.first_success == pytest.approx(0.15)
    assert flip(log, {0xC}, at=1.0) is None
