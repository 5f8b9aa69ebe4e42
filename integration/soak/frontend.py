"""The soak's third mode: the real Dynamo 1.6.1 frontend on a view beside Dynamo alone, under load.

It reuses the side-by-side deployment (``integration/sidebyside.py``): real ``dynamo.mocker``
workers on their own file store, the bridge, ``serve --view-dir``, a frontend on the view
("view") and one on the workers' own store ("direct"), each under the same steady load.
``serve`` runs in a network namespace of its own (``soak.net``) and reaches the plugin's
nats-server on the soak's bridge address, where the bridge and the tools reach it too; its view
directory is a small tmpfs of its own (``soak.disk``).

The seed chooses one fault after another until the time is up. Faults of ``serve`` alone, with
the workers left as they are: SIGKILL and a restart 0.5 to 3 s later or 15 to 70 s later (past
the frontend file store's 10 s expiry), SIGSTOP for 1 to 5 s or for 12 to 70 s, a partition
from the plugin's NATS, packet loss or a slow link on that path, its view directory full or
read-only; the first round runs each of these once, in an order the seed shuffles, so a run of
a few minutes sees every one. Then, by weight, those and the rest: the plugin's nats-server
killed (store kept, or wiped), the bridge killed, a worker SIGKILLed or SIGTERMed, a rolling
update to a conflicting configuration, drained or not.

Invariants, over every request: none answered by a rejected worker (a newcomer before the
last incumbent began to leave) or by a drained worker after its drain completed; a fault of
``serve`` alone costs the view no request that Dynamo alone beside it does not lose in the
same window; and over the run the view loses no more requests than Dynamo alone, give or take
one per succession (the frontend's own rebuild of the model at a flip, which Dynamo alone pays
too, by chance). A process that exits by itself is restarted, as the shipped units do, and
reported; an exit with status 2 or 5 (bad input, refused credentials) is a violation.
"""

from __future__ import annotations

import functools
import json
import random
import shutil
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dynamoview import Deployment
from sidebyside import Outcome, SideBySide, side_by_side

from soak.disk import SmallDisks
from soak.net import NetLab
from soak.procs import nats_nodes

__all__ = ["FRONTEND_FAULTS", "SERVE_FAULTS", "run_frontend_mode"]

FRONTEND_FAULTS = {
    "kill nats": 2,
    "wipe nats": 1,
    "kill serve": 3,
    "kill serve, late restart": 1,
    "stop serve": 1,
    "stop serve over 10 s": 1,
    "partition serve": 2,
    "loss serve": 1,
    "throttle serve": 1,
    "view full": 1,
    "view read-only": 1,
    "kill bridge": 2,
    "kill worker": 1,
    "stop worker": 1,
    "rolling update": 1,
    "drained rolling update": 1,
}

# Faults of serve alone, each held for a length drawn from its range (seconds). The workers stay
# as they are, so whatever the view loses here beyond Dynamo alone is the plugin's own cost.
SERVE_FAULTS = {
    "kill serve": (0.5, 3.0),
    "kill serve, late restart": (15.0, 70.0),
    "stop serve": (1.0, 5.0),
    "stop serve over 10 s": (12.0, 70.0),
    "partition serve": (3.0, 20.0),
    "loss serve": (3.0, 20.0),
    "throttle serve": (3.0, 20.0),
    "view full": (3.0, 20.0),
    "view read-only": (3.0, 20.0),
}

VIEW = "view"  # the name of the view directory's tmpfs
# A succession in place flips the view to the new configuration, and the frontend rebuilds the
# model then (Dynamo alone blends both and has no flip): a request in flight on the last
# incumbent is cancelled (503) and one may find the model missing (404). As the rollout tests
# hold it (test_drain_frontend.py), a flip is held to those kinds and to the rebuild's length,
# not to a count against Dynamo alone.
FLIP_STATUSES = frozenset({404, 503})
FLIP_LENGTH = 1.5
SETTLE = 3.0  # seconds of load after a fault heals, in its window


class PluginNats:
    """The plugin's nats-server on the soak's bridge address, restarted on the same port and store.

    The handle ``SideBySide`` drives (``url``, ``restart``), so ``serve`` in its namespace, the
    bridge and the tools outside it all reach one server, and a partition of ``serve`` cuts
    only ``serve``'s path to it.
    """

    def __init__(self, root: Path, host: str) -> None:
        (self.proc,) = nats_nodes(root, host, 1)
        self.store = root / "n1" / "store"

    @property
    def url(self) -> str:
        assert self.proc.ready is not None
        host, port = self.proc.ready
        return f"nats://{host}:{port}"

    def start(self) -> None:
        self.proc.start()

    def restart(self, *, wipe: bool = False, kill: bool = False, downtime: float = 0.0) -> None:
        if kill:
            self.proc.kill()
        else:
            self.proc.close()
        if wipe:
            shutil.rmtree(self.store, ignore_errors=True)
            self.store.mkdir(parents=True)
        time.sleep(downtime)
        self.proc.start()

    def close(self) -> None:
        self.proc.close()


@dataclass
class NamespacedDeployment(Deployment):
    """The side-by-side deployment with ``serve`` run through ``sidecar_prefix`` (``nsenter``).

    ``nsenter --net`` enters the namespace and then executes ``serve`` in its own place, so
    the process handle is ``serve``'s own and its signals reach it.
    """

    sidecar_prefix: list[str] = field(default_factory=list)

    def _start(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        # start_sidecar names its process "sidecar"; everything else stays in the soak's network.
        if name == "sidecar":
            argv = [*self.sidecar_prefix, *argv]
        return super()._start(name, argv, env)


@dataclass
class Lab:
    """What the faults of ``serve`` act on: its process, its network namespace, its view disk."""

    running: SideBySide
    net: NetLab
    disks: SmallDisks


def _draw(rng: random.Random, kind: str) -> tuple[float, str]:
    """How long a fault of ``serve`` lasts, and its setting (a loss rate, a link's rate)."""
    low, high = SERVE_FAULTS[kind]
    seconds = rng.uniform(low, high)
    setting = ""
    if kind == "loss serve":
        setting = f"{rng.uniform(0.2, 0.5):.2f}"
    elif kind == "throttle serve":
        setting = rng.choice(("16kbit", "32kbit", "64kbit"))
    return seconds, setting


def _hold(start: Callable[[], object], stop: Callable[[], object], seconds: float) -> None:
    start()
    try:
        time.sleep(seconds)
    finally:
        stop()


def _serve_fault(lab: Lab, kind: str, seconds: float, setting: str) -> None:
    deployment = lab.running.deployment
    sidecar = deployment.sidecar
    assert sidecar is not None
    if kind.startswith("kill serve"):
        _hold(deployment.kill_sidecar, deployment.start_sidecar, seconds)
    elif kind.startswith("stop serve"):
        _hold(
            lambda: sidecar.send_signal(signal.SIGSTOP),
            lambda: sidecar.send_signal(signal.SIGCONT),
            seconds,
        )
    elif kind == "partition serve":
        _hold(lambda: lab.net.partition(0), lambda: lab.net.heal(0), seconds)
    elif kind == "loss serve":
        _hold(lambda: lab.net.lose(0, float(setting)), lambda: lab.net.heal(0), seconds)
    elif kind == "throttle serve":
        _hold(lambda: lab.net.throttle(0, setting), lambda: lab.net.heal(0), seconds)
    elif kind == "view full":
        _hold(lambda: lab.disks.fill(VIEW), lambda: lab.disks.heal(VIEW), seconds)
    else:
        _hold(lambda: lab.disks.read_only(VIEW), lambda: lab.disks.heal(VIEW), seconds)


def _kill_bridge(running: SideBySide, rng: random.Random) -> None:
    deployment = running.deployment
    assert deployment.bridge is not None
    deployment.bridge.kill()
    deployment.bridge.wait(10)
    time.sleep(rng.uniform(0.5, 3.0))
    deployment.start_bridge()


def _one(lab: Lab, rng: random.Random, kind: str) -> tuple[Outcome, dict[str, Any]]:
    """Run one fault under load; its outcome and what the trace says of it."""
    running = lab.running
    if kind in SERVE_FAULTS:
        seconds, setting = _draw(rng, kind)
        fault = functools.partial(_serve_fault, lab, kind, seconds, setting)
        detail: dict[str, Any] = {"seconds": round(seconds, 2)}
        if setting:
            detail["setting"] = setting
        return running._under_load(kind, fault, settle=SETTLE), detail
    if kind == "kill nats":
        seconds = rng.uniform(2.0, 8.0)
        return running.outage(seconds=seconds, settle=5.0), {"seconds": round(seconds, 2)}
    if kind == "wipe nats":
        seconds = rng.uniform(1.0, 3.0)
        return running.wipe(downtime=seconds, settle=15.0), {"seconds": round(seconds, 2)}
    if kind == "kill bridge":
        return running._under_load(kind, lambda: _kill_bridge(running, rng), settle=SETTLE), {}
    if kind == "kill worker":
        return running.kill(), {}
    if kind == "stop worker":
        return running.drain(), {}
    spacing = rng.uniform(2.0, 5.0)
    drained = kind.startswith("drained")
    # A drained worker stops a grace after its drain answered, as the README's recipe says.
    outcome = running.rolling_update(
        rivals=2, spacing=spacing, drained=drained, grace=2.0 if drained else 0.0
    )
    return outcome, {"spacing": round(spacing, 2)}


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


def _supervise(running: SideBySide) -> list[tuple[str, int]]:
    """Restart ``serve`` or the bridge if it exited by itself; each one that did, with its status.

    Called between faults only, when every process of the deployment should be running.
    """
    deployment = running.deployment
    exited = []
    pieces = (
        ("serve", deployment.sidecar, deployment.start_sidecar),
        ("bridge", deployment.bridge, deployment.start_bridge),
    )
    for name, process, start in pieces:
        if process is not None and process.poll() is not None:
            exited.append((name, process.returncode))
            start()
    return exited


def run_frontend_mode(minutes: float, seed: int, out: Path) -> dict[str, Any]:
    """Run seeded faults through the real frontend until ``minutes`` pass; the report."""
    rng = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    faults: Counter[str] = Counter()
    failed: Counter[str] = Counter()
    sent: Counter[str] = Counter()
    # Per fault of serve: how many, the longest, and the requests each frontend lost to them.
    by_fault: dict[str, dict[str, float]] = {}
    exits: Counter[str] = Counter()
    rejected_answers = drained_answers = flips = 0
    violations: list[str] = []
    first_round = list(SERVE_FAULTS)
    rng.shuffle(first_round)
    trace = (out / "trace.jsonl").open("w")
    started = time.monotonic()
    net = NetLab(1)
    disks = SmallDisks(size="16m")
    plugin_nats: PluginNats | None = None
    try:
        net.open()
        root = out / "deployment"
        disks.mount(VIEW, root / "view-kv")
        plugin_nats = PluginNats(out / "plugin-nats", net.host_address)
        plugin_nats.start()
        deployment = functools.partial(NamespacedDeployment, sidecar_prefix=net.prefix(0))
        with side_by_side(root, plugin_nats, deployment=deployment) as running:
            lab = Lab(running, net, disks)
            running.start()
            running.serve(3)
            print(f"soak: serving after {time.monotonic() - started:.0f} s", flush=True)
            step = 0
            while first_round or time.monotonic() - started < minutes * 60:
                step += 1
                if first_round:
                    kind = first_round.pop(0)
                else:
                    weights = list(FRONTEND_FAULTS.values())
                    kind = rng.choices(list(FRONTEND_FAULTS), weights=weights)[0]
                running.marks = []
                outcome, detail = _one(lab, rng, kind)
                faults[kind] += 1
                for name, figures in outcome.figures.items():
                    failed[name] += figures.failed
                    sent[name] += figures.sent
                view, direct = outcome.figures["view"], outcome.figures["direct"]
                if kind.endswith("rolling update") and view.failed > direct.failed:
                    if {s for s, _ in view.statuses} <= FLIP_STATUSES and (
                        view.longest_gap <= FLIP_LENGTH
                    ):
                        flips += view.failed - direct.failed
                    else:
                        violations.append(
                            f"step {step} ({kind}): the view lost {view.failed} requests, "
                            f"Dynamo alone {direct.failed}, not as a flip's rebuild does "
                            f"(by status: {dict(view.statuses)}; longest gap "
                            f"{view.longest_gap:.2f} s)"
                        )
                rejected_answers += view.to_rejected
                drained_now = _drained_answers(running, outcome)
                drained_answers += drained_now
                exited = _supervise(running)
                entry = {
                    "step": step,
                    "t": round(time.monotonic() - started, 1),
                    "fault": kind,
                    **detail,
                    "failed": {n: f.failed for n, f in outcome.figures.items()},
                    "sent": {n: f.sent for n, f in outcome.figures.items()},
                    "statuses": {n: dict(f.statuses) for n, f in outcome.figures.items()},
                    "longest_gap": {n: round(f.longest_gap, 2) for n, f in outcome.figures.items()},
                    "to_rejected": view.to_rejected,
                    "to_drained": drained_now,
                    "errors": {n: list(f.errors[:3]) for n, f in outcome.figures.items()},
                }
                if exited:
                    entry["exited"] = exited
                trace.write(json.dumps(entry) + "\n")
                trace.flush()
                print(
                    f"soak: step {step} at {entry['t']} s: {kind} {detail}; failed view "
                    f"{view.failed}, direct {direct.failed}",
                    flush=True,
                )
                if kind in SERVE_FAULTS:
                    row = by_fault.setdefault(
                        kind, {"count": 0, "longest_s": 0.0, "view_failed": 0, "direct_failed": 0}
                    )
                    row["count"] += 1
                    row["longest_s"] = max(row["longest_s"], detail["seconds"])
                    row["view_failed"] += view.failed
                    row["direct_failed"] += direct.failed
                    if view.failed > direct.failed:
                        violations.append(
                            f"step {step} ({kind}, {detail['seconds']} s): the view lost "
                            f"{view.failed} requests, Dynamo alone {direct.failed} "
                            f"(view failures by status: {dict(view.statuses)})"
                        )
                for name, status in exited:
                    exits[f"{name} {status}"] += 1
                    if status in (2, 5):
                        violations.append(f"step {step} ({kind}): {name} exited with {status}")
                if view.to_rejected or drained_now:
                    violations.append(
                        f"step {step} ({kind}): {view.to_rejected} answered by a rejected "
                        f"worker, {drained_now} by a drained one"
                    )
                    break
    finally:
        if plugin_nats is not None:
            plugin_nats.close()
        disks.close()
        net.close()
        trace.close()
    if failed["view"] > failed["direct"] + flips:
        violations.append(
            f"the view lost {failed['view']} requests, Dynamo alone {failed['direct']} "
            f"(of them at a flip's rebuild: {flips})"
        )
    return {
        "mode": "frontend",
        "seed": seed,
        "minutes": round((time.monotonic() - started) / 60, 2),
        "faults": dict(sorted(faults.items())),
        "process_kills": sum(n for k, n in faults.items() if k.startswith(("kill", "wipe"))),
        "requests": dict(sent),
        "failed": dict(failed),
        "serve_faults": by_fault,
        "exits": dict(exits),
        "answered_by_rejected": rejected_answers,
        "answered_by_drained": drained_answers,
        "violations": violations,
        "replay": f"python -m integration.soak --mode frontend --seed {seed} --minutes {minutes:g}",
    }
