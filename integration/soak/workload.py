"""The workers of the soak: records in a Dynamo file store that the bridge mirrors, and their truth.

A worker here is what a Dynamo 1.6.1 worker leaves in its file store (``--discovery-backend
file``): an endpoint record and a model card, one file each, whose mtime its owner refreshes
every third of the TTL. The soak owns the files: it writes them on join, refreshes them while
the worker lives, deletes them on a graceful leave, and stops refreshing them on a crash (the
files then go stale and count as gone after the TTL, as a SIGKILLed worker's do). Each group
is one WorkerSet (its own namespace); a worker's configuration is the card's KV block size.

The soak keeps the truth here: who is live, crashed or gone, drained or not, and each worker's
configuration, which the invariants compare the views and the frontends' status with.
"""

from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from support.fleet import card
from workerset_admission.card import encode_endpoint_record, encode_model_record
from workerset_admission.identity import EndpointId

__all__ = ["CONFIGS", "Fleet", "Worker", "namespace_of"]

# The two configurations every group can see: the KV block size is part of the checksum.
CONFIGS = {"A": card(16), "B": card(32)}
# Instance ids of one width, so that key order is the order of registration.
_FIRST_ID = 0x100000
_REFRESH = 3.0


def namespace_of(group: int) -> str:
    return f"soak-{group}"


@dataclass
class Worker:
    instance_id: int
    group: int
    config: str
    state: str = "live"  # live, crashed (files left to go stale), gone (files deleted)
    drained: bool = False
    crashed_at: float = 0.0

    @property
    def endpoint(self) -> EndpointId:
        return EndpointId(namespace_of(self.group), "backend", "generate")

    @property
    def path(self) -> str:
        return f"{namespace_of(self.group)}/backend/generate/{self.instance_id:x}"


@dataclass
class Fleet:
    """The file store and every worker ever started in it."""

    store: Path
    groups: int
    ttl: float = 10.0
    workers: dict[int, Worker] = field(default_factory=dict)
    _next: int = _FIRST_ID
    _refreshed: float = 0.0

    def __post_init__(self) -> None:
        for bucket in ("instances", "mdc"):
            (self.store / "v1" / bucket).mkdir(parents=True, exist_ok=True)

    def _files(self, worker: Worker) -> tuple[Path, Path]:
        name = quote(worker.path, safe="")
        return self.store / "v1" / "instances" / name, self.store / "v1" / "mdc" / name

    # -- what happens to workers ---------------------------------------------------------------

    def join(self, group: int, config: str) -> Worker:
        worker = Worker(self._next, group, config)
        self._next += 1
        instance, model = self._files(worker)
        ep = worker.endpoint
        for path, body in (
            (instance, encode_endpoint_record(ep, worker.instance_id)),
            (model, encode_model_record(ep, worker.instance_id, CONFIGS[config])),
        ):
            # As Dynamo does: staged under a temporary name, then linked into place.
            staged = path.parent / f".tmp_{worker.instance_id:016x}"
            staged.write_bytes(body)
            os.link(staged, path)
            staged.unlink()
        self.workers[worker.instance_id] = worker
        return worker

    def leave(self, worker: Worker) -> None:
        """A graceful stop: the worker deletes its records (the model card first, as Dynamo)."""
        instance, model = self._files(worker)
        for path in (model, instance):
            path.unlink(missing_ok=True)
        worker.state = "gone"

    def crash(self, worker: Worker) -> None:
        """A SIGKILL: the files stay and stop being refreshed."""
        worker.state = "crashed"
        worker.crashed_at = time.time()

    def refresh(self, force: bool = False) -> None:
        """Touch every live worker's files, as their owners do every third of the TTL."""
        now = time.time()
        if not force and now - self._refreshed < _REFRESH:
            return
        self._refreshed = now
        for worker in self.live():
            for path in self._files(worker):
                os.utime(path, (now, now))

    def reap(self) -> None:
        """Crashed workers whose files are past the TTL are gone (their files deleted)."""
        now = time.time()
        for worker in self.workers.values():
            if worker.state == "crashed" and now - worker.crashed_at > self.ttl + 1:
                self.leave(worker)

    # -- what is true now -----------------------------------------------------------------------

    def live(self, group: int | None = None) -> list[Worker]:
        return [
            w
            for w in self.workers.values()
            if w.state == "live" and (group is None or w.group == group)
        ]

    def present(self, group: int) -> list[Worker]:
        """Workers whose files are in the store (live, or crashed and not yet stale)."""
        return [w for w in self.workers.values() if w.state != "gone" and w.group == group]

    def configs_live(self, group: int) -> set[str]:
        return {w.config for w in self.live(group)}

    def pick(self, rng: random.Random, workers: list[Worker]) -> Worker | None:
        return rng.choice(sorted(workers, key=lambda w: w.instance_id)) if workers else None
