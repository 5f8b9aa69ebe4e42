"""``serve`` SIGKILLed at random points of its passes: each restart's view is a fresh start's.

A real ``workerset-admission serve --view-dir`` over a real nats-server, a fleet of a few hundred
workers in the discovery bucket. One chain of ``serve`` processes writes one view directory;
each trial SIGKILLs the running one at a random point of one of its passes:

* ``first``: its first pass after a restart, over a fleet that changed while it was down;
* ``succession``: the pass that follows the cohort being replaced in the bucket while it runs;
* ``keep-alive``: while it touches the view's files (a refresh is under way);
* ``relisting``: at a random instant while the bucket is listed again every few seconds.

While it is down the bucket may change (the cohort replaced, or members replaced), and the
manifest a previous release kept may be found emptied or truncated (a host crash); then a new
``serve`` starts on the same directory. Once it has synced and its view settled, the view must
equal, name for name and byte for byte, what a fresh ``serve`` writes into an empty directory
from the same bucket (with its own admission bucket, so nothing of the chain reaches it).
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import nats
import pytest
from natsfixture import NatsServer
from support.cards import base_card
from support.serve_process import ServeProcess
from workerset_admission.adapters.nats.registrar import WorkerRegistrar
from workerset_admission.card import (
    encode_endpoint_record,
    encode_model_record,
    endpoint_kv_key,
    model_kv_key,
)
from workerset_admission.identity import EndpointId

pytestmark = [pytest.mark.integration]

EP = EndpointId("crash", "backend", "generate")
FLEET = 300
TRIALS = int(os.environ.get("VIEW_CRASH_TRIALS", "50"))
# The whole chain is bounded: a slow machine fails the test rather than running on.
BUDGET = 240.0
HORIZON = "20"  # a refresh every 2.5 s, so keep-alives come often
RELIST = "3"
MANIFEST = ".workerset-admission.files"
Files = dict[str, bytes]
State = tuple[int, int]  # (KV block size of the cohort, which set of members)


def _ids(state: State) -> range:
    block, members = state
    base = 0x10000 if block == 16 else 0x20000
    # Members set 1 replaced a tenth of the fleet.
    start = base + members * (FLEET // 10)
    return range(start, start + FLEET)


def bucket_of(state: State) -> dict[str, bytes]:
    block, _members = state
    out = {}
    for instance in _ids(state):
        out[model_kv_key(EP, instance)] = encode_model_record(EP, instance, base_card(block))
        out[endpoint_kv_key(EP, instance)] = encode_endpoint_record(
            EP, instance, {"tcp": f"10.1.{instance >> 8 & 0xFF}.{instance & 0xFF}:4000/x"}
        )
    return out


STATES: list[State] = [(16, 0), (16, 1), (32, 0)]


@dataclass
class Bucket:
    url: str
    name: str
    held: dict[str, bytes] = field(default_factory=dict)
    state: State | None = None

    def become(self, state: State) -> None:
        asyncio.run(self._become(bucket_of(state)))
        self.state = state

    async def _become(self, wanted: dict[str, bytes]) -> None:
        nc = await nats.connect(self.url)
        try:
            registrar = WorkerRegistrar(nc.jetstream(), bucket=self.name, ttl=None)
            gone = [key for key in self.held if key not in wanted]
            changed = [(k, v) for k, v in wanted.items() if self.held.get(k) != v]
            for start in range(0, len(gone), 100):
                await asyncio.gather(*(registrar.delete(k) for k in gone[start : start + 100]))
            for start in range(0, len(changed), 100):
                batch = changed[start : start + 100]
                await asyncio.gather(*(registrar.put(k, v, ttl=None) for k, v in batch))
        finally:
            await nc.close()
        self.held = dict(wanted)


def listing(view: Path) -> Files:
    """Every record file of the view (dot names are not records): its bucket, name and bytes."""
    out = {}
    root = view / "v1"
    for folder in sorted(root.iterdir()) if root.exists() else ():
        for name in os.listdir(folder):
            if not name.startswith("."):
                try:
                    out[f"{folder.name}/{name}"] = (folder / name).read_bytes()
                except FileNotFoundError:
                    continue
    return out


def _all_names(view: Path) -> list[str]:
    root = view / "v1"
    return [name for folder in root.iterdir() for name in os.listdir(folder)]


def _dir_stamps(view: Path) -> tuple[int, ...]:
    folders = (view / "v1" / "instances", view / "v1" / "mdc")
    return tuple(folder.stat().st_mtime_ns if folder.exists() else 0 for folder in folders)


def wait_for_change(view: Path, before: tuple[int, ...], timeout: float) -> bool:
    """Wait until a bucket folder of the view changes (a pass renames or removes a file)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _dir_stamps(view) != before:
            return True
        time.sleep(0.002)
    return False


def settled(view: Path, timeout: float = 30.0, quiet: float = 0.5) -> Files:
    """The view once no bucket folder changed for ``quiet`` seconds."""
    deadline = time.monotonic() + timeout
    last, since = _dir_stamps(view), time.monotonic()
    while time.monotonic() - since < quiet:
        assert time.monotonic() < deadline, "the view never settled"
        time.sleep(0.02)
        now = _dir_stamps(view)
        if now != last:
            last, since = now, time.monotonic()
    return listing(view)


class Chain:
    """The chain of ``serve`` processes on one view; the next one is always armed and waiting."""

    def __init__(self, args: list[str], view: Path) -> None:
        self.args = args
        self.view = view
        self.running: ServeProcess | None = None
        self.spare = self._arm()
        self.kills = 0

    def _arm(self) -> ServeProcess:
        return ServeProcess(self.args, view_dir=self.view, armed=True)

    def start(self) -> ServeProcess:
        assert self.running is None
        self.running, self.spare = self.spare, self._arm()
        self.running.fire()
        return self.running

    def kill(self) -> None:
        assert self.running is not None
        self.running.kill()
        self.running = None
        self.kills += 1

    def close(self) -> None:
        for process in (self.running, self.spare):
            if process is not None:
                process.kill()


def _serve_args(url: str, discovery: str, admission: str, frontend: str, view: Path) -> list[str]:
    return [
        "--nats-server", url, "--discovery-bucket", discovery, "--admission-bucket", admission,
        "--frontend-id", frontend, "--status-subject", f"status-{uuid.uuid4().hex[:8]}",
        "--view-dir", str(view), "--view-horizon", HORIZON, "--reconcile-interval", RELIST,
    ]  # fmt: skip


@dataclass
class Fresh:
    files: Files
    pass_seconds: float


@pytest.fixture
def world(nats_server: NatsServer, tmp_path: Path) -> tuple[Bucket, Path]:
    return Bucket(nats_server.url, f"crash-{uuid.uuid4().hex[:8]}"), tmp_path


def fresh_view(bucket: Bucket, folder: Path, state: State) -> Fresh:
    """What a fresh ``serve`` writes from the bucket in ``state``, and how long its pass took."""
    bucket.become(state)
    view = folder / f"fresh-{state[0]}-{state[1]}"
    view.mkdir()
    args = _serve_args(bucket.url, bucket.name, f"adm-{uuid.uuid4().hex[:8]}", "fe-fresh", view)
    process = ServeProcess(args, view_dir=view)
    try:
        assert wait_for_change(view, _dir_stamps(view), 60), process.output
        began = time.monotonic()
        files = settled(view)
        pass_seconds = max(0.05, time.monotonic() - began - 0.5)
    finally:
        process.stop()
    assert len(files) == 2 * FLEET, sorted(files)[:4]
    return Fresh(files, pass_seconds)


def _damage_manifest(view: Path, how: str) -> None:
    """What a host crash leaves of a manifest: emptied, or cut short (made if there is none)."""
    path = view / MANIFEST
    text = path.read_text() if path.exists() else '["mdc/crash%2Fbackend%2Fgenerate%2F10000"]\n'
    path.write_text("" if how == "emptied" else text[: max(1, len(text) // 3)])


def _announce(text: str) -> None:
    print(f"\n[view crash] {text}", file=sys.__stderr__)


@pytest.mark.rollout
@pytest.mark.timeout(300)
def test_serve_killed_at_random_points_of_its_passes_restarts_to_a_fresh_view(
    world: tuple[Bucket, Path],
) -> None:
    bucket, folder = world
    rng = random.Random(int(os.environ.get("VIEW_CRASH_SEED", "55")))
    started = time.monotonic()
    fresh = {state: fresh_view(bucket, folder, state) for state in STATES}
    _announce(
        "fresh views: "
        + ", ".join(
            f"{s}: {len(f.files)} files, pass {f.pass_seconds:.2f} s" for s, f in fresh.items()
        )
    )

    view = folder / "chain"
    view.mkdir()
    args = _serve_args(bucket.url, bucket.name, f"adm-{uuid.uuid4().hex[:8]}", "fe-chain", view)
    bucket.become(STATES[0])
    chain = Chain(args, view)
    failures: list[str] = []
    kinds: dict[str, int] = {}
    damaged = interrupted = 0
    try:
        # The first trial: the chain's first serve killed in its first pass over an empty view.
        kind = "first"
        for trial in range(TRIALS):
            assert time.monotonic() - started < BUDGET, f"over budget after {trial} trials"
            state = bucket.state
            assert state is not None
            if kind == "first":
                # Down, the fleet changed, back: killed in the first pass over the new fleet.
                if chain.running is not None:
                    chain.kill()
                    state = rng.choice([s for s in STATES if s != state])
                    bucket.become(state)
                before = _dir_stamps(view)
                chain.start()
                wait_for_change(view, before, 30)
                time.sleep(rng.uniform(0, 1.5 * fresh[state].pass_seconds))
            elif kind == "succession":
                other = rng.choice([s for s in STATES if s[0] != state[0]])
                before = _dir_stamps(view)
                bucket.become(other)
                wait_for_change(view, before, 30)
                time.sleep(rng.uniform(0, 1.5 * fresh[other].pass_seconds))
            elif kind == "keep-alive":
                probe = view / "v1" / "mdc" / sorted(os.listdir(view / "v1" / "mdc"))[-1]
                stamp = probe.stat().st_mtime_ns
                deadline = time.monotonic() + 5
                while probe.stat().st_mtime_ns == stamp and time.monotonic() < deadline:
                    time.sleep(0.002)
                time.sleep(rng.uniform(0, 0.05))
            else:  # relisting: a random instant while the bucket is listed every 3 s
                time.sleep(rng.uniform(0, float(RELIST)))
            chain.kill()
            kinds[kind] = kinds.get(kind, 0) + 1
            # Caught in the middle of a pass: files written aside and not yet renamed, or a
            # view that is a mix, no state's whole view.
            left = listing(view)
            staged = any(name.startswith(".tmp_") for name in _all_names(view))
            if staged or (left and all(left != f.files for f in fresh.values())):
                interrupted += 1

            # While it is down: the bucket may change; a manifest may be found damaged.
            if rng.random() < 0.7:
                bucket.become(rng.choice([s for s in STATES if s != bucket.state]))
            if trial % 4 == 3:
                _damage_manifest(view, rng.choice(["emptied", "truncated"]))
                damaged += 1

            restarted = chain.start()
            restarted.wait_for_line("synced:", 60)
            now = settled(view)
            assert bucket.state is not None
            want = fresh[bucket.state].files
            if now != want:
                extra = sorted(set(now) - set(want))
                missing = sorted(set(want) - set(now))
                differ = sorted(n for n in set(now) & set(want) if now[n] != want[n])
                failures.append(
                    f"trial {trial} ({kind}): {len(extra)} extra (e.g. {extra[:1]}), "
                    f"{len(missing)} missing, {len(differ)} with other bytes"
                )
            kind = rng.choice(["first", "succession", "keep-alive", "relisting"])
    finally:
        chain.close()
    elapsed = time.monotonic() - started
    _announce(
        f"{TRIALS} trials, {chain.kills} SIGKILLs ({kinds}), {interrupted} trials' kills left a "
        f"pass half done, {damaged} manifests damaged, {len(failures)} restarted views unlike a "
        f"fresh one, {elapsed:.0f} s"
    )
    for line in failures:
        _announce(line)
    assert not failures, f"{len(failures)} of {TRIALS} restarted views differ from a fresh one"
    # The kills did land inside passes, not only between them.
    assert interrupted >= TRIALS // 10, interrupted


# -- a writer whose clock runs ahead -------------------------------------------------------------

DAY = 86400.0
LEASE = 600.0 - 10.0 + 60.0  # the default horizon's lease (Horizon().lease)


def _stamps(view: Path) -> list[float]:
    return [p.stat().st_mtime for p in (view / "v1").rglob("*") if p.is_file()]


def _unreachable_url() -> str:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"nats://127.0.0.1:{probe.getsockname()[1]}"


@pytest.mark.timeout(120)
def test_a_serve_whose_clock_runs_a_day_ahead_stamps_its_view_one_lease_ahead_of_the_hosts(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """A real ``serve`` with its wall clock a day fast, then one that starts with NATS down."""
    bucket = Bucket(nats_server.url, f"clock-{uuid.uuid4().hex[:8]}")
    asyncio.run(bucket._become(dict(list(bucket_of((16, 0)).items())[:6])))
    view = tmp_path / "view"
    view.mkdir()
    args = [
        "--nats-server", bucket.url, "--discovery-bucket", bucket.name,
        "--admission-bucket", f"adm-{uuid.uuid4().hex[:8]}", "--frontend-id", "fe-fast",
        "--status-subject", f"status-{uuid.uuid4().hex[:8]}", "--view-dir", str(view),
    ]  # fmt: skip
    fast = ServeProcess(args, view_dir=view, clock_skew=DAY)
    try:
        fast.wait_for_line("synced:", 60)
        deadline = time.monotonic() + 30
        while len(_stamps(view)) < 6 and time.monotonic() < deadline:
            time.sleep(0.05)
        stamped = _stamps(view)
        assert len(stamped) == 6
        # One lease beyond this host's clock (the frontend's), not a day and a lease.
        assert max(stamped) <= time.time() + LEASE + 2.0, max(stamped) - time.time()
        assert min(stamped) >= time.time() + LEASE - 30.0
    finally:
        fast.kill()

    # Files a day ahead, as a writer whose clock ran ahead left them (stamped by hand: the
    # writer above could not), and a ``serve`` that starts while NATS is out of reach.
    for path in (view / "v1").rglob("*"):
        if path.is_file():
            os.utime(path, (time.time() + DAY, time.time() + DAY))
    down = [*args[:1], _unreachable_url(), *args[2:]]
    keeper = ServeProcess(down, view_dir=view)
    try:
        keeper.wait_for_line("cannot reach NATS yet", 60)
        line = next(x for x in keeper.output.splitlines() if "cannot reach NATS yet" in x)
        said = re.search(r"view file\(s\) for (\d+) s more", line)
        assert said is not None, line
        kept_for = float(said.group(1))
        assert 0 < kept_for <= LEASE + 10.0 + 1.0, line
        assert max(_stamps(view)) <= time.time() + LEASE + 2.0
    finally:
        keeper.kill()
