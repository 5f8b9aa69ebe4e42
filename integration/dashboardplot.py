"""Draw the dashboard's panels from Prometheus range-query results, as Grafana would lay them out.

Grafana cannot be run here, so the picture in ``docs/`` is drawn with matplotlib from the very
results a real Prometheus returned for each panel's query in
``integration/test_prometheus_dashboard.py``. Table panels are drawn as the rows' values over
time, so the picture also shows when each row was there. The annotation queries mark the
panels with a vertical line where their series first turn positive.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

__all__ = ["draw"]

_ANNOTATION_COLOURS = {"Successions": "tab:purple", "Holds": "tab:orange", "Drains": "tab:blue"}
_PLACEHOLDER = re.compile(r"\{\{\s*(\w+)\s*\}\}")
# Labels every row of a table shares, or that are too long to read in a lane's name.
_TABLE_QUIET = {
    "job",
    "instance",
    "model",
    "target_namespace",
    "target_component",
    "target_endpoint",
    "worker_type",
}


def _legend(metric: dict[str, str], legend: str) -> str:
    """Grafana's legend: the legend format with ``{{label}}`` filled in."""
    text = _PLACEHOLDER.sub(lambda m: _short(metric.get(m.group(1), "")), legend)
    return text.strip() or "value"


def _short(value: str) -> str:
    return f"{value[:8]}…" if len(value) == 64 else value


def _lane(metric: dict[str, str]) -> str:
    return " ".join(
        f"{k}={_short(v)}"
        for k, v in sorted(metric.items())
        if k not in _TABLE_QUIET and not k.startswith("incumbent_")
    )


def _annotation_times(record: dict[str, Any]) -> list[tuple[str, float]]:
    out = []
    for query in record["queries"]:
        if query["kind"] != "annotation":
            continue
        name = query["title"][len("annotation: ") :]
        for row in query["rows"]:
            previous = 0.0
            for t, v in row["values"]:
                value = float(v)
                if value > 0 and previous <= 0:
                    out.append((name, float(t)))
                previous = value
    return out


def draw(record: dict[str, Any], path: Path) -> None:
    """Write one figure with a subplot per panel to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    start, step = float(record["start"]), float(record["step"])
    panels: dict[str, list[dict[str, Any]]] = {}
    for query in record["queries"]:
        if query["kind"] != "annotation":
            panels.setdefault(query["title"], []).append(query)
    columns = 2
    lines = math.ceil(len(panels) / columns)
    figure, axes = plt.subplots(lines, columns, figsize=(16, 3.4 * lines), squeeze=False)
    annotations = _annotation_times(record)
    for index, (title, queries) in enumerate(panels.items()):
        ax = axes[index // columns][index % columns]
        if queries[0]["kind"] == "table":
            _timeline(ax, queries, start, step)
        else:
            for query in queries:
                for row in query["rows"]:
                    times = [float(t) - start for t, _ in row["values"]]
                    values = [float(v) for _, v in row["values"]]
                    ax.step(
                        times, values, where="post", label=_legend(row["metric"], query["legend"])
                    )
            if ax.lines:
                ax.legend(fontsize=7, loc="best", framealpha=0.7)
        for name, at in annotations:
            ax.axvline(at - start, color=_ANNOTATION_COLOURS.get(name, "grey"), linestyle="--")
        ax.set_title(f"{title} ({queries[0]['kind']})", fontsize=10, loc="left")
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if not any(query["rows"] for query in queries):
            ax.text(0.5, 0.5, "no series", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlim(0, float(record["end"]) - start)
    for index in range(len(panels), lines * columns):
        axes[index // columns][index % columns].axis("off")
    for ax in axes[-1]:
        ax.set_xlabel("seconds since Prometheus started scraping", fontsize=8)
    marks = ", ".join(
        f"{name} ({_ANNOTATION_COLOURS.get(name, 'grey')[4:]})"
        for name in sorted({name for name, _ in annotations})
    )
    figure.suptitle(
        "WorkerSet admission dashboard from a real Prometheus scraping `serve`: A serves, B is "
        "rejected, an outage holds A's tenure, B succeeds.\nTables are drawn as their rows over "
        f"time (value in the bar). Dashed lines: annotations, {marks or 'none'}.",
        fontsize=10,
    )
    figure.tight_layout(rect=(0, 0, 1, 0.96))
    figure.savefig(path, dpi=90)
    plt.close(figure)


def _timeline(ax: Any, queries: list[dict[str, Any]], start: float, step: float) -> None:
    """A table panel's rows as lanes: a bar wherever the row was there, its value written in."""
    lanes: list[str] = []
    for query in queries:
        for row in query["rows"]:
            lane = len(lanes)
            lanes.append(_lane(row["metric"]))
            spans: list[list[float]] = []
            for t, v in row["values"]:
                at = float(t) - start
                if spans and abs(spans[-1][1] - at) < step * 1.5:
                    spans[-1][1] = at + step
                    spans[-1][2] = float(v)
                else:
                    spans.append([at, at + step, float(v)])
            for begin, end, value in spans:
                ax.broken_barh([(begin, end - begin)], (lane - 0.3, 0.6), alpha=0.5)
                ax.text(begin + 0.2, lane, f"{value:.3g}", va="center", fontsize=7)
            ax.text(0.3, lane + 0.33, lanes[-1], va="bottom", fontsize=7)
    ax.set_yticks([])
    ax.set_ylim(-0.6, max(len(lanes), 1) - 0.1)
