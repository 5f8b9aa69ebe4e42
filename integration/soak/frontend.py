"""The soak's third mode: the real Dynamo 1.6.1 frontend on a view beside Dynamo alone, under load.

It reuses the side-by-side deployment (``integration/sidebyside.py``): real ``dynamo.mocker``
workers on their own file store, the bridge, ``serve --view-dir``, a frontend on the view
("view") and one on the workers' own store ("direct"), each under the same steady load. The
seed chooses one fault after another until the time is up: the plugin's nats-server killed
(store kept, or wiped), ``serve`` or the bridge killed or stopped, a worker SIGKILLed or
SIGTERMed, a rolling update to a conflicting configuration, drained or not.

Invariants, over every request: none answered by a rejected worker (a newcomer before the
last incumbent began to leave) or by a drained worker after its drain completed, and the view
loses no more requests than Dynamo alone beside it, give or take one per succession (the
frontend's own rebuild of the model at a flip, which Dynamo alone pays too, by chance).
"""

from __future__ import annotations

import json
import random
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

from sidebyside import Outcome, SideBySide, side_by_side
from workerset_admission.adapters.nats.embedded import EmbeddedNatsServer

__all__ = ["FRONTEND_FAULTS", "run_frontend_mode"]

FRONTEND_FAULTS = {
    "kill nats": 2,
    "wipe nats": 1,
    "kill serve": 3,
    "stop serve": 1,
    "kill bridge": 2,
    "kill worker": 1,
    "stop worker": 1,
    "rolling update": 1,
    "drained rolling update": 1,
}


def _signal_sidecar(running: SideBySide, rng: random.Random, kill: bool) -> None:
    deployment = running.deployment
    if kill:
        deployment.kill_sidecar()
        time.sleep(rng.uniform(0.5, 3.0))
        deployment.start_sidecar()
    else:
        assert deployment.sidecar is not None
        deployment.sidecar.send_signal(signal.SIGSTOP)
        time.sleep(rng.uniform(1.0, 5.0))
        deployment.sidecar.send_signal(signal.SIGCONT)


def _kill_bridge(running: SideBySide, rng: random.Random) -> None:
    deployment = running.deployment
    assert deployment.bridge is not None
    deployment.bridge.kill()
    deployment.bridge.wait(10)
    time.sleep(rng.uniform(0.5, 3.0))
    deployment.start_bridge()


def _one(running: SideBySide, rng: random.Random, kind: str) -> Outcome:
    if kind == "kill nats":
        return running.outage(seconds=rng.uniform(2.0, 8.0), settle=5.0)
    if kind == "wipe nats":
        return running.wipe(downtime=rng.uniform(1.0, 3.0), settle=15.0)
    if kind in ("kill serve", "stop serve"):
        return running._under_load(
            kind, lambda: _signal_sidecar(running, rng, kind == "kill serve"), settle=3.0
        )
    if kind == "kill bridge":
        return running._under_load(kind, lambda: _kill_bridge(running, rng), settle=3.0)
    if kind == "kill worker":
        return running.kill()
    if kind == "stop worker":
        return running.drain()
    return running.rolling_update(
        rivals=2, spacing=rng.uniform(2.0, 5.0), drained=kind.startswith("drained")
    )


def _drained_answers(running: SideBySide, outcome: Outcome) -> int:
    """View requests answered by a worker after its ``drain --wait`` returned."""
    drained = {worker: at for kind, worker, at in running.marks if kind == "drained"}
    load = running.loads.get("view")
    if load is None or not drained:
        return 0
    return sum(
        1
        for r in load.between(outcome.started, outcome.ended)
        if r.ok and r.worker in drained and r.sent > drained[r.worker] + 0.5
    )


def run_frontend_mode(minutes: float, seed: int, out: Path) -> dict[str, Any]:
    """Run seeded faults through the real frontend until ``minutes`` pass; the report."""
    rng = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    faults: Counter[str] = Counter()
    failed: Counter[str] = Counter()
    sent: Counter[str] = Counter()
    rejected_answers = drained_answers = successions = 0
    violations: list[str] = []
    trace = (out / "trace.jsonl").open("w")
    started = time.monotonic()
    plugin_nats = EmbeddedNatsServer(out / "plugin-nats")
    plugin_nats.start()
    try:
        with side_by_side(out / "deployment", plugin_nats) as running:
            running.start()
            running.serve(3)
            step = 0
            while time.monotonic() - started < minutes * 60:
                step += 1
                kind = rng.choices(list(FRONTEND_FAULTS), weights=list(FRONTEND_FAULTS.values()))[0]
                running.marks = []
                outcome = _one(running, rng, kind)
                faults[kind] += 1
                successions += kind.endswith("rolling update")
                for name, figures in outcome.figures.items():
                    failed[name] += figures.failed
                    sent[name] += figures.sent
                view = outcome.figures["view"]
                rejected_answers += view.to_rejected
                drained_now = _drained_answers(running, outcome)
                drained_answers += drained_now
                entry = {
                    "step": step,
                    "t": round(time.monotonic() - started, 1),
                    "fault": kind,
                    "failed": {n: f.failed for n, f in outcome.figures.items()},
                    "sent": {n: f.sent for n, f in outcome.figures.items()},
                    "to_rejected": view.to_rejected,
                    "to_drained": drained_now,
                    "errors": {n: list(f.errors[:3]) for n, f in outcome.figures.items()},
                }
                trace.write(json.dumps(entry) + "\n")
                trace.flush()
                if view.to_rejected or drained_now:
                    violations.append(
                        f"step {step} ({kind}): {view.to_rejected} answered by a rejected "
                        f"worker, {drained_now} by a drained one"
                    )
                    break
    finally:
        plugin_nats.close()
        trace.close()
    if not violations and failed["view"] > failed["direct"] + successions:
        violations.append(
            f"the view lost {failed['view']} requests, Dynamo alone {failed['direct']} "
            f"(allowed: one more per succession, {successions})"
        )
    return {
        "mode": "frontend",
        "seed": seed,
        "minutes": round((time.monotonic() - started) / 60, 2),
        "faults": dict(sorted(faults.items())),
        "process_kills": sum(n for k, n in faults.items() if k.startswith(("kill", "wipe"))),
        "requests": dict(sent),
        "failed": dict(failed),
        "answered_by_rejected": rejected_answers,
        "answered_by_drained": drained_answers,
        "violations": violations,
        "replay": f"python -m integration.soak --mode frontend --seed {seed} --minutes {minutes:g}",
    }
