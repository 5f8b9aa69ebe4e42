"""The soak's loop: churn and seeded faults, a quiet point now and then, invariants, leak samples.

Every choice (the next workload operation, the next fault, its target and length) comes from one
``random.Random(seed)``; the trace (``trace.jsonl`` in the run's folder) records each step with
its number and time, so a violation names the seed and the step and shows what led to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import psutil

from soak import checks, leaks
from soak.clocked import ClockedFrontend
from soak.disk import SmallDisks
from soak.net import NetLab
from soak.procs import (
    CLI,
    Proc,
    bridge_argv,
    monitor_port,
    nats_nodes,
    serve_argv,
    servers_argv,
)
from soak.workload import Fleet, Worker

__all__ = ["FAULTS", "Options", "Soak", "Violation"]

BUCKET = "soak-discovery"

# Fault kinds and their weights; process kills are the most frequent, as in production.
FAULTS = {
    "kill serve": 3,
    "kill bridge": 2,
    "kill nats": 2,
    "stop serve": 1,
    "stop bridge": 1,
    "stop nats": 1,
    "partition": 2,
    "loss": 1,
    "throttle": 1,
    "disk full": 1,
    "read-only": 1,
    "clock jump": 1,
}
CLOCKED = "fe-clock"
OPERATIONS = {
    "join": 3,
    "leave": 2,
    "crash": 1,
    "conflict": 1,
    "conflict leaves": 1,
    "succession": 1,
    "drain": 1.5,
    "undrain": 1,
}


class Violation(Exception):
    """An invariant broke at a quiet point."""


@dataclass
class Options:
    minutes: float
    seed: int
    out: Path
    mode: str = "views"  # views: one nats-server; cluster: three nodes
    frontends: int = 3
    groups: int = 4
    active: float = 45.0  # seconds of churn and faults between two quiet points
    quiet_timeout: float = 60.0
    sample_every: float = 10.0
    op_every: float = 1.5
    steady: int = 0  # the frontend never killed or stopped: its leaks are measured


@dataclass
class Soak:
    options: Options
    rng: random.Random = field(init=False)
    trace: list[dict[str, Any]] = field(default_factory=list)
    faults: Counter[str] = field(default_factory=Counter)
    operations: Counter[str] = field(default_factory=Counter)
    samples: list[leaks.Sample] = field(default_factory=list)
    quiet_points: int = 0
    quiet_waits: list[float] = field(default_factory=list)
    episodes: list[float] = field(default_factory=list)  # each fault's injection, wall clock
    _drain_task: asyncio.Task[None] | None = None
    exits: Counter[str] = field(default_factory=Counter)  # exits of their own, by process
    step: int = 0

    def __post_init__(self) -> None:
        self.rng = random.Random(self.options.seed)
        self.out = self.options.out
        self.out.mkdir(parents=True, exist_ok=True)
        self.trace_file = (self.out / "trace.jsonl").open("w")
        self.net = NetLab(self.options.frontends)
        self.disks = SmallDisks()
        self.nats: list[Proc] = []
        self.serves: list[Proc] = []
        self.bridge: Proc | None = None
        self.clocked: ClockedFrontend | None = None
        self.fleet = Fleet(self.out / "workers-kv", self.options.groups)
        self.incumbent: dict[int, str] = {}
        self.started = time.monotonic()
        self.nc: Any = None

    # -- the trace --------------------------------------------------------------------------

    def record(self, kind: str, **detail: Any) -> None:
        self.step += 1
        entry = {"step": self.step, "t": round(time.monotonic() - self.started, 2), "kind": kind}
        entry.update(detail)
        self.trace.append(entry)
        self.trace_file.write(json.dumps(entry) + "\n")
        self.trace_file.flush()

    # -- setting up and tearing down --------------------------------------------------------

    @property
    def urls(self) -> list[str]:
        return [f"nats://{node.ready[0]}:{node.ready[1]}" for node in self.nats if node.ready]

    def frontend(self, index: int) -> str:
        return f"fe-{index}"

    @property
    def names(self) -> list[str]:
        """Every frontend the checks read: the ``serve`` processes and the clocked one."""
        return [*map(self.frontend, range(self.options.frontends)), CLOCKED]

    def view(self, name: str) -> Path:
        return self.out / f"view-{name}"

    async def open(self) -> None:
        self.net.open()
        logs = self.out / "logs"
        logs.mkdir(exist_ok=True)
        self.nats = nats_nodes(
            self.out / "nats", self.net.host_address, 3 if self.options.mode == "cluster" else 1
        )
        for node in self.nats:
            node.popen = None
            node.log = logs / f"{node.name}.log"
            node.start()
        replicas = len(self.nats)
        self.bridge = Proc(
            "bridge",
            bridge_argv(self.fleet.store, self.urls, BUCKET, replicas),
            logs / "bridge.log",
        )
        for index in range(self.options.frontends):
            self.disks.mount(self.frontend(index), self.view(self.frontend(index)))
            argv = serve_argv(
                self.net.prefix(index),
                self.view(self.frontend(index)),
                self.urls,
                BUCKET,
                self.frontend(index),
                replicas,
            )
            if index == self.options.steady and os.environ.get("SOAK_STEADY_TRACE"):
                # What the steady frontend observed, to read a violation by: its replay trace
                # (every discovery event the core was fed) and its DEBUG log.
                argv += ["--trace-out", str(logs / f"{self.frontend(index)}.trace.jsonl")]
                argv += ["--log-level", "DEBUG"]
            self.serves.append(
                Proc(self.frontend(index), argv, logs / f"{self.frontend(index)}.log")
            )
        self.nc = await nats.connect(
            servers=self.urls, max_reconnect_attempts=-1, reconnect_time_wait=0.2,
            connect_timeout=2, error_cb=_ignore, disconnected_cb=_nothing,
        )  # fmt: skip
        if self.options.mode == "cluster":
            await self._wait_cluster()
        self.bridge.start()
        for serve in self.serves:
            serve.start()
        self.disks.mount(CLOCKED, self.view(CLOCKED))
        self.clocked = ClockedFrontend(
            CLOCKED, self.view(CLOCKED), self.urls, BUCKET, replicas, logs / f"{CLOCKED}.log"
        )
        self.clocked.start()
        for group in range(self.options.groups):
            for _ in range(3):
                self.fleet.join(group, "A")
            self.incumbent[group] = "A"
        self.record("start", mode=self.options.mode, seed=self.options.seed, urls=self.urls)

    async def _wait_cluster(self) -> None:
        js = self.nc.jetstream(timeout=2)
        from nats.js.api import StreamConfig

        config = StreamConfig(name="soak-probe", subjects=["soak-probe.>"], num_replicas=3)
        deadline = time.monotonic() + 30
        while not await _answers(js.add_stream(config)):
            if time.monotonic() > deadline:
                raise RuntimeError("the cluster did not accept a three-replica stream in 30 s")
            await asyncio.sleep(0.3)
        await js.delete_stream("soak-probe")

    async def close(self) -> None:
        if self._drain_task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._drain_task, 30)
        with contextlib.suppress(Exception):
            if self.nc is not None:
                await self.nc.close()
        if self.clocked is not None:
            with contextlib.suppress(Exception):
                self.clocked.close()
        for proc in [*self.serves, *([self.bridge] if self.bridge else []), *self.nats]:
            with contextlib.suppress(Exception):
                proc.close()
        self.disks.close()
        self.net.close()
        self.trace_file.close()

    # -- faults -----------------------------------------------------------------------------

    def _victims(self, what: str) -> list[Proc]:
        if what == "serve":
            return [s for i, s in enumerate(self.serves) if i != self.options.steady]
        if what == "bridge":
            return [self.bridge] if self.bridge else []
        return self.nats

    def inject(self) -> tuple[str, Any, float]:
        """Choose and inflict one fault; return it, its target and how long it lasts."""
        kind = self.rng.choices(list(FAULTS), weights=list(FAULTS.values()))[0]
        verb, _, what = kind.partition(" ")
        if verb in ("kill", "stop"):
            proc = self.rng.choice(self._victims(what))
            length = self.rng.uniform(0.5, 3.0) if verb == "kill" else self.rng.uniform(1.0, 6.0)
            proc.kill() if verb == "kill" else proc.pause()
            target: Any = proc.name
        elif kind == "clock jump":
            # Forward as after a suspended host, or back; the service is woken either way.
            target = CLOCKED
            length = self.rng.choice((-20.0, 15.0, 45.0, 120.0))
            assert self.clocked is not None
            self.clocked.jump(length)
        elif kind in ("disk full", "read-only"):
            target = self.rng.choice(self.names)
            length = self.rng.uniform(3.0, 10.0)
            if kind == "disk full":
                self.disks.fill(target)
            else:
                self.disks.read_only(target)
        else:
            index = self.rng.randrange(self.options.frontends)
            target = self.frontend(index)
            length = self.rng.uniform(3.0, 10.0)
            if kind == "partition":
                self.net.partition(index)
            elif kind == "loss":
                self.net.lose(index, round(self.rng.uniform(0.2, 0.5), 2))
            else:
                self.net.throttle(index, self.rng.choice(("16kbit", "32kbit", "64kbit")))
        self.faults[kind] += 1
        self.episodes.append(time.time())
        self.record("fault", fault=kind, target=target, seconds=round(length, 2))
        # A jump is instantaneous: the next fault may follow at once.
        return kind, target, 0.0 if kind == "clock jump" else length

    def heal(self, kind: str, target: Any) -> None:
        verb = kind.partition(" ")[0]
        if verb in ("kill", "stop"):
            proc = next(
                p for p in [*self.serves, self.bridge, *self.nats] if p and p.name == target
            )
            if verb == "kill":
                proc.start()
            else:
                proc.resume()
        elif kind in ("partition", "loss", "throttle"):
            self.net.heal(int(target.split("-")[1]))
        elif kind != "clock jump":
            self.disks.heal(target)
        self.record("heal", fault=kind, target=target)

    # -- supervision ---------------------------------------------------------------------------

    def supervise(self) -> None:
        """Restart a frontend or the bridge that exited by itself, as the shipped units do.

        ``deploy/systemd``: ``Restart=on-failure``, ``RestartSec=2``, and never after status 2
        (bad input) or 5 (refused credentials), which no fault here may cause: a violation.
        """
        for proc in [*self.serves, *([self.bridge] if self.bridge else [])]:
            if proc.held_down or proc.popen is None or proc.popen.poll() is None:
                continue
            code = proc.popen.returncode
            if proc.exited_at is None:
                proc.exited_at = time.monotonic()
                self.exits[proc.name] += 1
                self.record("exited", target=proc.name, status=code)
                if code in (2, 5):
                    raise Violation(f"{proc.name} exited with status {code}; see {proc.log}")
            elif time.monotonic() - proc.exited_at >= 2.0:
                proc.start()
                self.record("restarted", target=proc.name)

    # -- the workload ------------------------------------------------------------------------

    def _members(self, group: int, config: str, *, undrained: bool = False) -> list[Worker]:
        return [
            w
            for w in self.fleet.live(group)
            if w.config == config and not (undrained and w.drained)
        ]

    def operate(self, nats_down: bool) -> None:
        """One workload operation, chosen by the seed; some are skipped when they cannot apply."""
        kind = self.rng.choices(list(OPERATIONS), weights=list(OPERATIONS.values()))[0]
        group = self.rng.randrange(self.options.groups)
        config = self.incumbent[group]
        other = "B" if config == "A" else "A"
        keep = self._members(group, config, undrained=True)
        done: dict[str, Any] | None = None
        if kind == "join" and len(self.fleet.live(group)) < 6:
            done = {"worker": self.fleet.join(group, config).instance_id}
        elif kind in ("leave", "crash") and len(keep) >= 2:
            worker = self.fleet.pick(self.rng, keep)
            assert worker is not None
            self.fleet.leave(worker) if kind == "leave" else self.fleet.crash(worker)
            done = {"worker": worker.instance_id}
        elif kind == "conflict" and not self._members(group, other):
            done = {"workers": [self.fleet.join(group, other).instance_id for _ in range(2)]}
        elif kind == "conflict leaves" and (rivals := self._members(group, other)):
            for worker in rivals:
                self.fleet.leave(worker)
            done = {"workers": [w.instance_id for w in rivals]}
        elif kind == "succession":
            leaving = self._members(group, config)
            for worker in leaving:
                self.fleet.leave(worker)
            if self._members(group, other):
                self.incumbent[group] = other
            else:
                for _ in range(3):
                    self.fleet.join(group, config)
            done = {"left": [w.instance_id for w in leaving], "incumbent": self.incumbent[group]}
        elif kind in ("drain", "undrain") and not nats_down:
            # The drain tool runs in the background (it takes seconds); the worker counts as
            # drained (or not) from now, and goes back if the tool fails.
            drained = [w for w in self.fleet.live(group) if w.drained]
            worker = self.fleet.pick(self.rng, keep if kind == "drain" else drained)
            busy = self._drain_task is not None and not self._drain_task.done()
            if worker is not None and not busy and (kind == "undrain" or len(keep) >= 2):
                worker.drained = kind == "drain"
                self._drain_task = asyncio.create_task(self._drain(worker, kind))
                done = {"worker": worker.instance_id}
        if done is not None:
            self.operations[kind] += 1
            self.record("operation", operation=kind, group=group, **done)

    async def _drain(self, worker: Worker, kind: str) -> None:
        argv = [
            *CLI, "drain", str(worker.instance_id), "--namespace", f"soak-{worker.group}",
            "--timeout", "10", "--by", "soak", *servers_argv(self.urls),
            "--discovery-bucket", BUCKET, "--admission-bucket", f"{BUCKET}-adm",
            *(["--cancel"] if kind == "undrain" else []),
        ]  # fmt: skip
        process = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        output, _ = await process.communicate()
        if process.returncode != 0:
            worker.drained = kind == "undrain"
            self.record(
                f"{kind} failed",
                worker=worker.instance_id,
                output=output.decode(errors="replace")[-300:],
            )

    # -- observing ----------------------------------------------------------------------------

    async def status(self, name: str, timeout: float = 3.0) -> dict[str, Any] | None:
        try:
            reply = await self.nc.request(f"soak.status.{name}", b"", timeout=timeout)
        except Exception:
            return None
        answer: dict[str, Any] = json.loads(reply.data)
        return answer

    async def sample(self) -> None:
        """Read each process's figures; run as a task of its own, it never holds up faults."""
        now = round(time.monotonic() - self.started, 1)
        targets = [(self.frontend(i), s) for i, s in enumerate(self.serves)]
        if self.bridge is not None:
            targets.append(("bridge", self.bridge))
        for name, proc in targets:
            pid = proc.pid
            if pid is None or proc.stopped:
                continue
            try:
                info = psutil.Process(pid)
                rss, fds = info.memory_info().rss / 2**20, info.num_fds()
            except psutil.Error:
                continue
            tasks = connections = subscriptions = None
            if name != "bridge":
                status = await self.status(name, timeout=2.0)
                if status is not None:
                    tasks = status.get("process", {}).get("asyncio_tasks")
                nodes = [n for n in self.nats if n.running and not n.stopped]
                counts = [
                    c
                    for node in nodes
                    if (
                        c := await asyncio.to_thread(checks.subscriptions, monitor_port(node), name)
                    )
                    is not None
                ]
                if len(counts) == len(self.nats):
                    connections = sum(c for c, _ in counts)
                    subscriptions = sum(s for _, s in counts)
            self.samples.append(
                leaks.Sample(name, now, round(rss, 1), fds, tasks, connections, subscriptions)
            )

    async def quiet_point(self) -> None:
        """Heal every fault, let crashed workers expire, then wait for every invariant."""
        began = time.monotonic()
        if self._drain_task is not None:
            await self._drain_task
        while any(w.state == "crashed" for w in self.fleet.workers.values()):
            self.fleet.refresh()
            self.fleet.reap()
            self.supervise()
            await asyncio.sleep(0.5)
        deadline = time.monotonic() + self.options.quiet_timeout
        found: list[str] = []
        while time.monotonic() < deadline:
            self.fleet.refresh()
            self.supervise()
            statuses = {}
            for name in self.names:
                status = await self.status(name)
                if status is not None:
                    statuses[name] = status
            views = {name: checks.read_view(self.view(name)) for name in self.names}
            found = checks.violations(self.fleet, views, statuses)
            if missing := sorted(set(self.names) - set(statuses)):
                found.append(f"no status from {missing}")
            if not found:
                found = self.log_repeats()
                if found:
                    break
                self.quiet_points += 1
                waited = round(time.monotonic() - began, 1)
                self.quiet_waits.append(waited)
                self.record("quiet point", number=self.quiet_points, waited=waited)
                return
            await asyncio.sleep(1.0)
        self.record("violation", violations=found)
        raise Violation("\n".join(found))

    def log_repeats(self) -> list[str]:
        """Warnings a frontend or the bridge wrote more than once for one fault."""
        found = []
        logs = [(p.name, p.log) for p in [*self.serves, *([self.bridge] if self.bridge else [])]]
        if self.clocked is not None:
            logs.append((CLOCKED, self.clocked.log))
        for name, log in logs:
            with contextlib.suppress(FileNotFoundError):
                text = log.read_text(errors="replace")
                found += checks.repeated_lines(text, self.episodes, name)
        return found

    # -- the run ------------------------------------------------------------------------------

    async def run(self) -> dict[str, Any]:
        try:
            # Inside the try: a start that fails half-way still removes what it made.
            await self.open()
            await self.quiet_point()
            end = self.started + self.options.minutes * 60
            next_sample = 0.0
            sampling: asyncio.Task[None] | None = None
            while time.monotonic() < end:
                phase_end = min(end, time.monotonic() + self.options.active)
                active: tuple[str, Any, float] | None = None
                heal_at = next_op = next_fault = time.monotonic()
                while time.monotonic() < phase_end:
                    now = time.monotonic()
                    self.fleet.refresh()
                    self.fleet.reap()
                    self.supervise()
                    if active is not None and now >= heal_at:
                        self.heal(active[0], active[1])
                        active = None
                        next_fault = now + self.rng.uniform(0.5, 2.0)
                    elif active is None and now >= next_fault and now < phase_end - 3:
                        active = self.inject()
                        heal_at = now + active[2]
                    if now >= next_op:
                        nats_down = active is not None and active[0].endswith("nats")
                        self.operate(nats_down)
                        next_op = now + self.options.op_every
                    if now >= next_sample and (sampling is None or sampling.done()):
                        sampling = asyncio.create_task(self.sample())
                        next_sample = now + self.options.sample_every
                    await asyncio.sleep(0.1)
                if active is not None:
                    self.heal(active[0], active[1])
                if sampling is not None:
                    await sampling
                await self.quiet_point()
                await self.sample()
            return self.report(violations=[])
        except Violation as violation:
            report = self.report(violations=str(violation).splitlines())
            # The seed, the step, and what led to it: enough to replay it or read it offline.
            led_to = {"step": self.step, "trace_tail": self.trace[-60:]}
            (self.out / "violation.json").write_text(json.dumps(report | led_to, indent=2) + "\n")
            return report
        finally:
            await self.close()

    def report(self, violations: list[str]) -> dict[str, Any]:
        kills = sum(n for k, n in self.faults.items() if k.startswith("kill"))
        return {
            "mode": self.options.mode,
            "seed": self.options.seed,
            "minutes": round((time.monotonic() - self.started) / 60, 2),
            "steps": self.step,
            "faults": dict(sorted(self.faults.items())),
            "process_kills": kills,
            "exits_restarted": dict(sorted(self.exits.items())),
            "operations": dict(sorted(self.operations.items())),
            "quiet_points": self.quiet_points,
            "quiet_wait_max_s": max(self.quiet_waits, default=0.0),
            "violations": violations,
            "replay": f"python -m integration.soak --mode {self.options.mode} "
            f"--seed {self.options.seed} --minutes {self.options.minutes:g}; "
            f"trace: {self.out / 'trace.jsonl'}",
            "leaks": leaks.summary(self.samples),
        }


async def _answers(call: Any) -> bool:
    """Whether ``call`` worked (a cluster answers 503 until its meta leader is elected)."""
    try:
        await call
    except Exception:
        return False
    return True


async def _ignore(_error: Exception) -> None:
    return None


async def _nothing() -> None:
    return None
