"""How fast the real frontend follows admission through the admitted view, and what a
succession costs in requests.

A plain script: ``python integration/bench/bench_view.py [CHANGES] [SUCCESSIONS]`` (20 and 10
by default; ``BENCH_QUICK=1`` runs 6 and 2). It starts its own loopback nats-server, three
``python -m dynamo.mocker`` workers (A1 and A2 of one configuration, B of another block size)
on their own file store, ``python -m dynamo.frontend`` (round robin) on the view directory, and
the admission service with the view writer in this process. It plays the bridge's part itself,
putting the workers' recorded records into the bucket and deleting them, so each change is
exactly one bucket operation.

* A membership change deletes or restores A2's model card: the receiver publishes ``{A1}`` or
  ``{A1, A2}``. The figure is the time from the receiver's publication (the core step's
  effects, observed in process) to the first request the frontend routes by the new set: the
  first one A2 serves after it returns, or the first one after A2's last after it leaves.
* A succession deletes the incumbent's cards: the old receiver retires, the successor commits.
  The figures are the time from the commit (and from the retirement) to the first request the
  successor serves, and the requests that failed between the retirement and that request.

A probe thread sends chat requests back to back the whole time (their spacing bounds the
resolution, and is printed). Results go to ``results/bench_view.json``.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent))

import nats  # noqa: E402
from dynamoview import Deployment, Frontend  # noqa: E402
from workerset_admission.adapters.dynamo.bridge import bucket_key_for  # noqa: E402
from workerset_admission.adapters.dynamo.filestore import scan_file_store  # noqa: E402
from workerset_admission.adapters.nats.buckets import BucketSpec, ensure_bucket  # noqa: E402
from workerset_admission.adapters.nats.embedded import EmbeddedNatsServer  # noqa: E402
from workerset_admission.admission import CommitGroup, PublishAdmissions, RetireReceiver  # noqa: E402
from workerset_admission.service.step import EffectReader  # noqa: E402
from workerset_admission.settings import Settings  # noqa: E402
from workerset_admission.wiring.compose import create_service  # noqa: E402

RESULTS = HERE / "results"


class Probe:
    """Chat requests back to back on one frontend: (send time, decode worker or None)."""

    def __init__(self, frontend: Frontend) -> None:
        self.frontend = frontend
        self.log: list[tuple[float, int | None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            sent = time.monotonic()
            try:
                decode = self.frontend.ask().decode
            except Exception:
                decode = None
                time.sleep(0.002)
            self.log.append((sent, decode))

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def after(self, moment: float) -> list[tuple[float, int | None]]:
        return [row for row in self.log if row[0] >= moment]


def _records(store: Path, instance_id: int) -> dict[str, bytes]:
    """The bucket keys and values of one worker, read once from the workers' store."""
    out = {}
    for record in scan_file_store(store).records:
        worker = record.instance_id
        if record.event is not None:
            source = json.loads(record.value)
            worker = ((source.get("metadata") or {}).get("worker") or {}).get("worker_id", worker)
        if worker == instance_id:
            out[bucket_key_for(record)] = record.value
    return out


def _percentile(values: Sequence[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


async def _wait(condition: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {seconds:g} s")
        await asyncio.sleep(0.01)


async def main(changes: int, successions: int) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="bench-view-"))
    server = EmbeddedNatsServer(root / "jetstream")
    server.start()
    bucket = f"bench-view-{uuid.uuid4().hex[:8]}"
    deployment = Deployment(root, server.url, bucket)
    client = await nats.connect(server.url)
    service = None
    probe = None
    try:
        kv = (await ensure_bucket(client.jetstream(), BucketSpec(name=bucket))).kv
        frontend = deployment.start_frontend("frontend")
        a1 = deployment.start_worker("a1", block_size=16)
        a2 = deployment.start_worker("a2", block_size=16)
        b = deployment.start_worker("b", block_size=32)
        await asyncio.sleep(1.0)  # every record written, event records included
        records = {w: _records(deployment.store, w) for w in (a1, a2, b)}
        cards = {w: next(k for k in keys if k.startswith("v1.mdc.")) for w, keys in records.items()}

        async def put(worker: int, only_card: bool = False) -> None:
            for key, value in records[worker].items():
                if not only_card or key == cards[worker]:
                    await kv.put(key, value)

        for worker in (a1, a2):
            await put(worker)
        # Every receiver publication and commit, timed as the core step makes it.
        moments: list[tuple[float, str, frozenset[int]]] = []

        def on_effects(effects: Sequence[object]) -> None:
            now = time.monotonic()
            for effect in effects:
                if isinstance(effect, PublishAdmissions):
                    moments.append((now, "publish", effect.admitted))
                elif isinstance(effect, CommitGroup):
                    moments.append((now, "commit", effect.admitted))
                elif isinstance(effect, RetireReceiver):
                    moments.append((now, "retire", frozenset()))

        settings = Settings(
            nats_servers=(server.url,),
            discovery_bucket=bucket,
            admission_bucket=f"{bucket}-adm",
            view_dir=deployment.view,
            frontend_id="bench-view",
        )
        service = await create_service(settings, publish=False, status=False)
        service.subscribe(EffectReader(on_effects))
        await _wait(lambda: "tiny" in frontend.models(), 60, "the frontend serves the model")
        await put(b)
        probe = Probe(frontend)
        probe.start()
        await _wait(lambda: {d for _t, d in probe.log[-10:]} == {a1, a2}, 30, "A1 and A2 serve")

        def moment_of(kind: str, admitted: frozenset[int], since: int) -> float:
            return next(t for t, k, ids in moments[since:] if k == kind and ids == admitted)

        membership: list[float] = []
        for turn in range(changes):
            leaving = turn % 2 == 0
            mark = len(moments)
            if leaving:
                await kv.delete(cards[a2])
                wanted = frozenset({a1})
            else:
                await put(a2, only_card=True)
                wanted = frozenset({a1, a2})
            await _wait(
                lambda m=mark, w=wanted: any(ids == w for _t, _k, ids in moments[m:]),
                10,
                "receiver",
            )
            changed = moment_of("publish", wanted, mark)
            if leaving:
                await asyncio.sleep(1.0)  # long enough to see A2 never come back
                rows = probe.after(changed)
                last_a2 = max((i for i, (_t, d) in enumerate(rows) if d == a2), default=-1)
                routed = rows[last_a2 + 1][0]
            else:
                await _wait(
                    lambda c=changed: any(d == a2 for _t, d in probe.after(c)), 20, "A2 back"
                )
                routed = next(t for t, d in probe.after(changed) if d == a2)
            membership.append(max(0.0, routed - changed))
            await asyncio.sleep(0.2)

        succession_rows: list[dict[str, float | int]] = []
        incumbent, successor = (a1, a2), (b,)
        for _ in range(successions):
            mark = len(moments)
            for worker in incumbent:
                await kv.delete(cards[worker])
            target = frozenset(successor)
            await _wait(
                lambda m=mark, t=target: any(
                    k == "commit" and ids == t for _t, k, ids in moments[m:]
                ),
                20,
                "the successor commits",
            )
            retired = next(t for t, k, _ids in moments[mark:] if k == "retire")
            committed = moment_of("commit", target, mark)
            await _wait(
                lambda c=committed, t=target: any(d in t for _t, d in probe.after(c)), 30, "served"
            )
            routed = next(t for t, d in probe.after(committed) if d in target)
            lost = sum(1 for t, d in probe.log if d is None and retired - 0.5 <= t <= routed)
            succession_rows.append(
                {
                    "commit_to_routed_ms": (routed - committed) * 1e3,
                    "retire_to_routed_ms": (routed - retired) * 1e3,
                    "lost_requests": lost,
                }
            )
            # The old cohort comes back (rejected behind the new incumbent) for the next turn.
            for worker in incumbent:
                await put(worker, only_card=True)
            await asyncio.sleep(0.5)
            incumbent, successor = successor, incumbent
        spacing = statistics.median(
            b2[0] - b1[0] for b1, b2 in zip(probe.log, probe.log[1:], strict=False)
        )
    finally:
        if probe is not None:
            probe.stop()
        if service is not None:
            await service.stop()
        await client.close()
        deployment.close()
        server.close()
        shutil.rmtree(root, ignore_errors=True)
    ms = [m * 1e3 for m in membership]
    gaps = [float(r["commit_to_routed_ms"]) for r in succession_rows]
    outages = [float(r["retire_to_routed_ms"]) for r in succession_rows]
    lost = [int(r["lost_requests"]) for r in succession_rows]
    return {
        "membership_changes": len(ms),
        "membership_p50_ms": round(_percentile(ms, 0.5), 1),
        "membership_p99_ms": round(_percentile(ms, 0.99), 1),
        "membership_max_ms": round(max(ms), 1),
        "successions": len(succession_rows),
        "succession_p50_ms": round(_percentile(gaps, 0.5), 1),
        "succession_p99_ms": round(_percentile(gaps, 0.99), 1),
        "retire_to_routed_p50_ms": round(_percentile(outages, 0.5), 1),
        "retire_to_routed_p99_ms": round(_percentile(outages, 0.99), 1),
        "lost_per_succession_mean": round(statistics.mean(lost), 2),
        "lost_per_succession_max": max(lost),
        "probe_spacing_ms": round(spacing * 1e3, 2),
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg()[0],
    }


if __name__ == "__main__":
    quick = os.environ.get("BENCH_QUICK") == "1"
    changes = int(sys.argv[1]) if len(sys.argv) > 1 else 6 if quick else 20
    successions = int(sys.argv[2]) if len(sys.argv) > 2 else 2 if quick else 10
    result = asyncio.run(main(changes, successions))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_view.json").write_text(json.dumps(result, indent=2) + "\n")
    for name, value in result.items():
        print(f"{name:28} {value}")
