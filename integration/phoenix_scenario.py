"""A rolling update traced into Arize Phoenix, run inside a private loopback-only network namespace.

Run as ``unshare --net -- python integration/phoenix_scenario.py --out result.json
--phoenix <venv>/bin/phoenix`` (``test_phoenix.py`` does). Inside the namespace it brings up
loopback, starts Phoenix and a nats-server on free 127.0.0.1 ports, runs
``workerset-admission serve --telemetry`` exporting OTLP/HTTP to Phoenix, and plays a rolling
update with a conflicting cohort: an incumbent cohort registers, a cohort with another
configuration arrives and is rejected, the incumbent drains and the other cohort succeeds it.
Phoenix boots while the update plays (serve holds its spans until it stops). Once ``status``
shows the succession and Phoenix is ready, ``serve`` gets SIGTERM (which flushes its spans), and
every span of the run's Phoenix project is read back through Phoenix's REST API and written,
with what the scenario published and saw, to the result file. Everything it started is stopped
and everything it wrote outside the result file is removed before it exits.

The span processor's schedule is set far beyond the run's length, so every span reaches Phoenix
through the flush at shutdown; the result records how many spans Phoenix had just before the
SIGTERM to show it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import nats
import psutil  # type: ignore[import-untyped]
from nats.js.client import JetStreamContext
from phoenixfixture import PhoenixServer, fetch_spans
from support.cards import base_card as demo_card
from workerset_admission.adapters.nats.buckets import stream_name
from workerset_admission.adapters.nats.embedded import EmbeddedNatsServer, free_loopback_port
from workerset_admission.adapters.nats.registrar import WorkerRegistrar
from workerset_admission.card import (
    encode_endpoint_record,
    encode_model_record,
    endpoint_kv_key,
    model_kv_key,
)
from workerset_admission.identity import EndpointId

__all__ = [
    "CONFLICTING",
    "ENDPOINT",
    "INCUMBENT",
    "SUCCESSOR_IDS",
    "WORKER_IDS",
    "card",
    "main",
]

ENDPOINT = EndpointId("dgd", "backend", "generate")
WORKER_IDS = (0x1A, 0x2B)
SUCCESSOR_IDS = (0x3C, 0x4D)
CLI = [sys.executable, "-m", "workerset_admission.cli"]
FRONTEND_ID = "fe-phoenix"
# Small on purpose: the run's spans then span several pages, so reading them back goes through
# Phoenix's cursor pagination.
PAGE_SIZE = 5


def card(block_size: int) -> dict[str, Any]:
    """A model card; the KV cache block size is the setting the two cohorts disagree on."""
    return demo_card(block_size)


INCUMBENT = card(16)
CONFLICTING = card(32)


class ScenarioError(RuntimeError):
    """A step of the scenario did not reach the state it waits for."""


@dataclass
class Published:
    """What the scenario wrote to the discovery bucket, in order."""

    writes: list[dict[str, Any]] = field(default_factory=list)


class LineReader:
    """Collects a child's output lines on a thread, so reading never blocks the scenario."""

    def __init__(self, stream: IO[str]) -> None:
        self.lines: list[str] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._pump, args=(stream,), daemon=True)
        self._thread.start()

    def _pump(self, stream: IO[str]) -> None:
        for line in stream:
            with self._lock:
                self.lines.append(line.rstrip("\n"))
        stream.close()

    def wait_for(self, prefix: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                for line in self.lines:
                    if line.startswith(prefix):
                        return line
            if not self._thread.is_alive():
                break
            time.sleep(0.05)
        raise ScenarioError(f"no output line starting with {prefix!r}: {self.tail()}")

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def tail(self, count: int = 30) -> list[str]:
        with self._lock:
            return self.lines[-count:]


def bring_up_loopback() -> None:
    """A fresh network namespace has its loopback interface down."""
    ip = shutil.which("ip")
    if ip is None:
        raise ScenarioError("the ip command is needed to bring up loopback in the namespace")
    subprocess.run([ip, "link", "set", "lo", "up"], check=True, timeout=10)


def child_record(name: str, pid: int | None) -> dict[str, Any]:
    """Name, pid and start time of a child, so the caller can tell it is gone for good."""
    if pid is None:
        return {"name": name, "pid": None, "create_time": None}
    try:
        started = psutil.Process(pid).create_time()
    except psutil.Error:
        started = None
    return {"name": name, "pid": pid, "create_time": started}


def status(url: str, environ: Mapping[str, str]) -> dict[str, Any] | None:
    """Ask the running service through ``workerset-admission status --json``."""
    answer = subprocess.run(
        [*CLI, "status", "--nats-server", url, "--json", "--timeout", "2"],
        capture_output=True,
        text=True,
        env=dict(environ),
        timeout=30,
        check=False,
    )
    if answer.returncode != 0:
        return None
    reply: dict[str, Any] = json.loads(answer.stdout)
    return reply


def wait_status(
    url: str,
    environ: Mapping[str, str],
    condition: Callable[[dict[str, Any]], bool],
    what: str,
    timeout: float,
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    last: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        last = status(url, environ)
        if last is not None and condition(last):
            return last
        time.sleep(0.2)
    raise ScenarioError(f"timed out waiting until {what}; last status {last!r}")


def only_group(answer: Mapping[str, Any]) -> dict[str, Any] | None:
    groups = answer.get("groups") or []
    return dict(groups[0]) if len(groups) == 1 else None


def incumbent_served(answer: Mapping[str, Any]) -> bool:
    group = only_group(answer)
    return (
        group is not None
        and group["status"] == "ready"
        and group["admitted"] == list(WORKER_IDS)
        and group["generation"] is not None
    )


def conflict_tracked(answer: Mapping[str, Any]) -> bool:
    group = only_group(answer)
    return (
        group is not None
        and group["admitted"] == list(WORKER_IDS)
        and len(group["cohorts"]) == 2
        and group["cohorts"][1]["members"] == list(SUCCESSOR_IDS)
    )


def successor_served(answer: Mapping[str, Any]) -> bool:
    group = only_group(answer)
    return (
        group is not None
        and group["status"] == "ready"
        and group["admitted"] == list(SUCCESSOR_IDS)
        and len(group["cohorts"]) == 1
        and answer.get("live_instances") == len(SUCCESSOR_IDS)
    )


async def register_cohort(
    workers: WorkerRegistrar, ids: tuple[int, ...], config: Mapping[str, Any], out: Published
) -> None:
    """Register each worker as Dynamo does: its endpoint instance, then its model card."""
    for instance_id in ids:
        for kind, key, value in (
            ("endpoint", endpoint_kv_key(ENDPOINT, instance_id), endpoint_record(instance_id)),
            (
                "model",
                model_kv_key(ENDPOINT, instance_id),
                encode_model_record(ENDPOINT, instance_id, config),
            ),
        ):
            revision = await workers.put(key, value)
            out.writes.append({"key": key, "operation": "put", "revision": revision, "kind": kind})


async def drain_cohort(
    workers: WorkerRegistrar, js: JetStreamContext, ids: tuple[int, ...], out: Published
) -> None:
    """Deregister each worker, card and endpoint record, noting each delete's revision."""
    for instance_id in ids:
        for key in await workers.deregister(ENDPOINT, instance_id, endpoint_record=True):
            kind = "model" if key == model_kv_key(ENDPOINT, instance_id) else "endpoint"
            out.writes.append({"key": key, "operation": "delete", "revision": None, "kind": kind})
    # Nobody else writes to the bucket, so its stream's sequence numbers are exactly the
    # revisions of the deletes just made, in order.
    info = await js.stream_info(stream_name(workers.bucket))
    deletes = [w for w in out.writes if w["operation"] == "delete"]
    last = int(info.state.last_seq)
    for offset, write in enumerate(reversed(deletes)):
        write["revision"] = last - offset


def endpoint_record(instance_id: int) -> bytes:
    return encode_endpoint_record(ENDPOINT, instance_id)


def serve_environment(
    base: Mapping[str, str], traces_endpoint: str, project: str
) -> dict[str, str]:
    """The serve process's environment: OTLP/HTTP to Phoenix, spans only, flushed at exit."""
    env = {
        k: v
        for k, v in base.items()
        if not k.startswith(("OTEL_", "WORKERSET_ADMISSION_", "PHOENIX_"))
    }
    env.update(
        {
            "PYTHONUNBUFFERED": "1",
            "OTEL_TRACES_EXPORTER": "otlp",
            # Phoenix takes traces only; a metrics exporter would log a failure every minute.
            "OTEL_METRICS_EXPORTER": "none",
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": traces_endpoint,
            "OTEL_RESOURCE_ATTRIBUTES": f"openinference.project.name={project}",
            "OTEL_SERVICE_NAME": "workerset-admission-phoenix",
            # Far longer than the run: only the flush that SIGTERM triggers exports anything.
            "OTEL_BSP_SCHEDULE_DELAY": "600000",
        }
    )
    return env


@contextlib.contextmanager
def started_serve(url: str, environ: Mapping[str, str]) -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(
        [*CLI, "serve", "--nats-server", url, "--telemetry", "--frontend-id", FRONTEND_ID],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(environ),
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)


def wait_spans_settled(base_url: str, project: str, timeout: float) -> list[dict[str, Any]]:
    """Poll Phoenix until the project's span count stops changing (ingest is asynchronous).

    Phoenix stores what it received in batches a little later; a count seen unchanged on three
    reads half a second apart is taken as everything.
    """
    deadline = time.monotonic() + timeout
    counts: list[int] = []
    spans: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        spans = fetch_spans(base_url, project, page_size=PAGE_SIZE)
        counts = [*counts[-2:], len(spans)]
        if spans and len(counts) == 3 and len(set(counts)) == 1:
            return spans
        time.sleep(0.5)
    raise ScenarioError(f"Phoenix's span count for {project!r} never settled ({len(spans)} seen)")


def scratch_environment(scratch: Path) -> dict[str, str]:
    """The children's environment: HOME and TMPDIR inside the scratch directory."""
    environ = dict(os.environ)
    for name in ("HOME", "TMPDIR"):
        path = scratch / name.lower()
        path.mkdir()
        environ[name] = str(path)
    return environ


def listeners(pids: Mapping[str, int]) -> list[dict[str, Any]]:
    """Every TCP socket listening in this namespace, with the child that owns it."""
    names = {pid: name for name, pid in pids.items()}
    return [
        {
            "owner": names.get(conn.pid or -1, str(conn.pid)),
            "address": conn.laddr.ip,
            "port": conn.laddr.port,
        }
        for conn in psutil.net_connections(kind="tcp")
        if conn.status == psutil.CONN_LISTEN and conn.laddr
    ]


def play(args: argparse.Namespace, scratch: Path, result: dict[str, Any]) -> None:
    """Run the whole scenario; fills ``result`` as it goes, so a failure still reports."""
    step_timeout = args.step_timeout
    children: list[dict[str, Any]] = result["children"]
    environ = scratch_environment(scratch)
    result["interfaces"] = sorted(psutil.net_if_addrs())

    with contextlib.ExitStack() as stack:
        phoenix = PhoenixServer(
            Path(args.phoenix),
            scratch / "phoenix",
            http_port=free_loopback_port(),
            grpc_port=free_loopback_port(),
            environ=environ,
            log_path=scratch / "phoenix.log",
        )
        stack.callback(lambda: result.update(phoenix_exit=phoenix.stop()))
        # Phoenix takes the longest to start; the rollout does not need it until serve stops
        # (serve keeps its spans until then), so both go on at once.
        phoenix_launched = time.monotonic()
        phoenix.launch()
        assert phoenix.process is not None
        children.append(child_record("phoenix", phoenix.process.pid))

        nats_server = EmbeddedNatsServer(scratch / "jetstream")
        stack.callback(nats_server.close)
        nats_server.start()
        children.append(child_record("nats-server", nats_server.pid))

        serve_env = serve_environment(environ, phoenix.traces_endpoint, args.project)
        serve = stack.enter_context(started_serve(nats_server.url, serve_env))
        children.append(child_record("serve", serve.pid))
        assert serve.stdout is not None
        output = LineReader(serve.stdout)
        stack.callback(lambda: result.update(serve_output=output.tail(60)))
        output.wait_for("synced:", step_timeout)

        published = Published()
        result["published"] = {"writes": published.writes}
        statuses: dict[str, Any] = result["status"]

        async def publish(step: Callable[[WorkerRegistrar, JetStreamContext], Any]) -> None:
            nc = await nats.connect(nats_server.url)
            try:
                js = nc.jetstream()
                await step(WorkerRegistrar(js, ttl=None), js)
            finally:
                await nc.close()

        def wait(condition: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
            return wait_status(nats_server.url, environ, condition, what, step_timeout)

        rollout_started = time.monotonic()
        asyncio.run(publish(lambda w, _: register_cohort(w, WORKER_IDS, INCUMBENT, published)))
        statuses["incumbent"] = wait(incumbent_served, "the incumbent is served")
        asyncio.run(publish(lambda w, _: register_cohort(w, SUCCESSOR_IDS, CONFLICTING, published)))
        statuses["conflict"] = wait(conflict_tracked, "the other cohort is tracked")
        asyncio.run(publish(lambda w, js: drain_cohort(w, js, WORKER_IDS, published)))
        statuses["succession"] = wait(successor_served, "the successor is served")
        result["timings"]["rollout_s"] = round(time.monotonic() - rollout_started, 2)

        phoenix.wait_ready(args.phoenix_timeout - (time.monotonic() - phoenix_launched))
        result["timings"]["phoenix_ready_s"] = round(time.monotonic() - phoenix_launched, 2)
        result["listeners"] = listeners({c["name"]: c["pid"] for c in children})
        result["spans_before_sigterm"] = len(fetch_spans(phoenix.base_url, args.project))

        serve.send_signal(signal.SIGTERM)
        try:
            result["serve_exit"] = serve.wait(timeout=step_timeout)
        except subprocess.TimeoutExpired as exc:
            raise ScenarioError("serve did not stop within the step timeout after SIGTERM") from exc
        output.join(5)

        started = time.monotonic()
        result["spans"] = wait_spans_settled(phoenix.base_url, args.project, step_timeout)
        result["timings"]["spans_settled_s"] = round(time.monotonic() - started, 2)
        result["phoenix_log_tail"] = phoenix.log_tail()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="where the result JSON goes")
    parser.add_argument("--phoenix", required=True, help="the phoenix executable")
    parser.add_argument("--project", required=True, help="Phoenix project the spans land in")
    parser.add_argument("--step-timeout", type=float, default=30.0, help="seconds per step")
    parser.add_argument("--phoenix-timeout", type=float, default=90.0, help="seconds to start")
    args = parser.parse_args(argv)

    result: dict[str, Any] = {
        "project": args.project,
        "children": [],
        "status": {},
        "timings": {},
        "error": None,
    }
    began = time.monotonic()
    code = 0
    try:
        bring_up_loopback()
        with tempfile.TemporaryDirectory(prefix="phoenix-scenario-") as scratch:
            play(args, Path(scratch), result)
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
        code = 1
    result["timings"]["total_s"] = round(time.monotonic() - began, 2)
    args.out.write_text(json.dumps(result, indent=2, sort_keys=True), encoding="utf-8")
    return code


if __name__ == "__main__":
    sys.exit(main())
