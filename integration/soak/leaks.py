"""Leak figures of each long-lived process, sampled through the run, and their slopes.

For each sampled process: resident memory and open file descriptors (``psutil``), the open
asyncio tasks its ``status`` reports (``process.asyncio_tasks``), and the connections and
subscriptions nats-server counts for it (``/connz``). The verdict is the slope
over the second half of the run (Theil-Sen, robust to one-sample spikes), as growth over that
half relative to the half's mean: flat means under 5 %.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = ["FIGURES", "Sample", "growth", "plot", "summary"]

FIGURES = ("rss_mb", "fds", "tasks", "subscriptions")


@dataclass(frozen=True, slots=True)
class Sample:
    process: str
    seconds: float
    rss_mb: float
    fds: int
    tasks: int | None
    connections: int | None
    subscriptions: int | None


def growth(points: Sequence[tuple[float, float]]) -> float | None:
    """Growth over the second half: the fitted slope times the half's span over its mean."""
    half = sorted(points)[len(points) // 2 :]
    if len(half) < 3:
        return None
    xs = [x for x, _ in half]
    ys = [y for _, y in half]
    mean_y = statistics.fmean(ys)
    if mean_y == 0:
        return 0.0
    # Theil-Sen: the median of the pairwise slopes. A count that steps up for one sample (a
    # request in flight holds a subscription, a file descriptor) moves it not at all, where a
    # least-squares fit reads a spike near the end as growth; a leak moves every pair.
    slopes = [
        (ys[j] - ys[i]) / (xs[j] - xs[i])
        for i in range(len(xs))
        for j in range(i + 1, len(xs))
        if xs[j] > xs[i]
    ]
    return statistics.median(slopes) * (xs[-1] - xs[0]) / mean_y


def summary(samples: Sequence[Sample]) -> dict[str, dict[str, Any]]:
    """Per process and figure: first, last, and the second half's growth (a fraction)."""
    out: dict[str, dict[str, Any]] = {}
    for name in sorted({s.process for s in samples}):
        mine = [s for s in samples if s.process == name]
        figures: dict[str, Any] = {"samples": len(mine)}
        for figure in FIGURES:
            points = [(s.seconds, float(v)) for s in mine if (v := getattr(s, figure)) is not None]
            if not points:
                continue
            figures[figure] = {
                "first": points[0][1],
                "last": points[-1][1],
                "second_half_growth": growth(points),
            }
        out[name] = figures
    return out


def plot(samples: Sequence[Sample], path: Path, title: str) -> None:
    """One panel per figure, one line per process, against time (a PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(FIGURES), 1, figsize=(9, 10), sharex=True)
    names = sorted({s.process for s in samples})
    # One colour per process in every panel, whether or not the panel has its line.
    colours = {name: f"C{index}" for index, name in enumerate(names)}
    for axis, figure in zip(axes, FIGURES, strict=True):
        for name in names:
            points = [
                (s.seconds / 60, v)
                for s in samples
                if s.process == name and (v := getattr(s, figure)) is not None
            ]
            if points:
                axis.plot(*zip(*points, strict=True), label=name, linewidth=1, color=colours[name])
        axis.set_ylabel(figure.replace("_", " "))
        axis.grid(alpha=0.3)
    for axis in axes:
        axis.legend(loc="lower right", fontsize=7)
    axes[-1].set_xlabel("minutes")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def as_rows(samples: Sequence[Sample]) -> list[dict[str, Any]]:
    return [asdict(s) for s in samples]
