"""What the soak reads of each frontend, and the invariants it checks at every quiet point.

The invariants (``docs/faults.md`` states them too), for every WorkerSet and every frontend:

1. every card in a view is an admitted, live, undrained worker's;
2. no view holds two configurations of one WorkerSet;
3. the frontends agree on each incumbent;
4. a WorkerSet with live, undrained workers has one in every view;
5. the incumbent is a configuration with a live worker whenever the WorkerSet has one (a
   succession happened when the last incumbent worker went).
"""

from __future__ import annotations

import bisect
import contextlib
import json
import os
import re
import time
import urllib.request
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from soak.workload import Fleet

__all__ = ["read_view", "repeated_lines", "subscriptions", "violations"]

View = dict[str, dict[int, int | None]]  # namespace -> instance id -> KV block size in the card


def _block_size(raw: bytes) -> int | None:
    with contextlib.suppress(ValueError, AttributeError, TypeError):
        record = json.loads(raw)
        size = (record.get("card_json") or record).get("kv_cache_block_size")
        return int(size) if size is not None else None
    return None


def read_view(view: Path) -> View:
    """Every card file in a view directory: its namespace, instance id and block size."""
    out: View = {}
    folder = view / "v1" / "mdc"
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(folder):
            if name.startswith("."):
                continue
            parts = unquote(name).split("/")
            if len(parts) < 4:
                continue
            with contextlib.suppress(FileNotFoundError):
                size = _block_size((folder / name).read_bytes())
                out.setdefault(parts[0], {})[int(parts[3], 16)] = size
    return out


def subscriptions(monitor_port: int, frontend: str) -> tuple[int, int] | None:
    """(connections, subscriptions) nats-server counts for ``frontend``; None: no answer."""
    url = f"http://127.0.0.1:{monitor_port}/connz?subs=1&limit=1024"
    try:
        with urllib.request.urlopen(url, timeout=3) as reply:
            body = json.loads(reply.read())
    except (OSError, ValueError):
        return None
    mine = [
        c for c in body.get("connections", []) if str(c.get("name", "")).endswith(f" {frontend}")
    ]
    return len(mine), sum(int(c.get("subscriptions", 0)) for c in mine)


_SIZES = {16: "A", 32: "B"}


def violations(
    fleet: Fleet, views: dict[str, View], statuses: dict[str, dict[str, Any]]
) -> list[str]:
    """Every invariant broken now, one line each (empty when all hold)."""
    found: list[str] = []
    incumbents: dict[str, dict[str, str | None]] = {}
    admitted: dict[str, dict[str, set[int]]] = {}
    for frontend, status in statuses.items():
        for group in status.get("groups", []):
            ns = group.get("namespace")
            cohorts = group.get("cohorts") or []
            members = cohorts[0].get("members", []) if cohorts and group.get("incumbent") else []
            configs = {fleet.workers[i].config for i in members if i in fleet.workers}
            incumbents.setdefault(ns, {})[frontend] = ",".join(sorted(configs)) or None
            admitted.setdefault(ns, {})[frontend] = set(group.get("admitted") or [])
    for g in range(fleet.groups):
        ns = f"soak-{g}"
        live = fleet.live(g)
        undrained = [w for w in live if not w.drained]
        for frontend, view in views.items():
            cards = view.get(ns, {})
            sizes = set(cards.values())
            if len(sizes) > 1:
                found.append(
                    f"{frontend}: view holds two configurations of {ns}: {sorted(map(str, sizes))}"
                )
            for instance, size in sorted(cards.items()):
                worker = fleet.workers.get(instance)
                what = f"{frontend}: card {instance:x} of {ns}"
                if worker is None:
                    found.append(f"{what} belongs to no worker the soak started")
                    continue
                if worker.state != "live":
                    found.append(f"{what} belongs to a {worker.state} worker")
                if worker.drained:
                    found.append(f"{what} belongs to a drained worker")
                if _SIZES.get(size or 0) != worker.config:
                    found.append(
                        f"{what} carries block size {size}, the worker's is {worker.config}"
                    )
                if instance not in admitted.get(ns, {}).get(frontend, set()):
                    found.append(f"{what} is not admitted in that frontend's status")
            if undrained and not cards:
                ids = ", ".join(f"{w.instance_id:x}" for w in undrained)
                found.append(f"{frontend}: no card of {ns}, which has live undrained workers {ids}")
        seen = incumbents.get(ns, {})
        if len(set(seen.values())) > 1:
            found.append(f"frontends disagree on the incumbent of {ns}: {seen}")
        live_configs = {w.config for w in live}
        for frontend, config in seen.items():
            if live_configs and (config is None or not set(config.split(",")) & live_configs):
                found.append(
                    f"{frontend}: incumbent of {ns} is {config}, "
                    f"live configurations {sorted(live_configs)}"
                )
    return found


_LINE = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) (INFO|WARNING|ERROR|CRITICAL) (\S+) (.*)$"
)
_START = re.compile(r"^--- start (\d+) at ")


def repeated_lines(text: str, episodes: Sequence[float], log: str) -> list[str]:
    """Warnings or errors one process wrote more than once in one fault episode.

    An episode runs from one fault's injection (wall clock, ``episodes`` sorted) to the next;
    a fault is to be logged once, with what the service did about it, and a retry that fails
    again only counts. A warning that comes back after its logger said at INFO that it got
    over it (a disk nearly full, written once and refused again) is a new occurrence, not a
    repeat. ``text`` is a log with the soak's ``--- start N`` markers between the process's
    lives.
    """
    counts: dict[tuple[str, str], int] = {}
    repeats: Counter[str] = Counter()
    place: tuple[int, int] = (0, 0)
    life = 0
    for line in text.splitlines():
        if start := _START.match(line):
            life = int(start.group(1))
            continue
        match = _LINE.match(line)
        if match is None:
            continue
        at = time.mktime(time.strptime(match.group(1), "%Y-%m-%d %H:%M:%S"))
        at += int(match.group(2)) / 1000
        level, logger, message = match.group(3), match.group(4), match.group(5)
        if (life, bisect.bisect_right(episodes, at)) != place:
            place = (life, bisect.bisect_right(episodes, at))
            counts.clear()
        if level == "INFO":
            counts = {k: v for k, v in counts.items() if k[0] != logger}
            continue
        key = (logger, f"{level} {logger} {message}")
        counts[key] = counts.get(key, 0) + 1
        if counts[key] > 1:
            repeats[key[1]] = max(repeats[key[1]], counts[key])
    return [
        f"{log}: logged {count} times in one fault episode: {message[:300]}"
        for message, count in repeats.items()
    ]
