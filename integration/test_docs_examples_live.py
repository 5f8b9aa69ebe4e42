"""The docs' examples that need servers, run as written: beside a serve, and the walkthrough."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.cards import base_card
from support.docs import ROOT, Block, command_blocks, marked

pytestmark = [pytest.mark.integration]

CLI = [sys.executable, "-m", "workerset_admission.cli"]
BIN = Path(sys.executable).parent


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WORKERSET_ADMISSION_")}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    env["WORKERSET_ADMISSION_SERVE_FILE"] = str(tmp_path / "serve.json")
    return env


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _read_until(process: subprocess.Popen[str], starting: str, timeout: float = 60) -> str:
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if starting in line:
            return line
        if not line and process.poll() is not None:
            break
    raise AssertionError(f"no line with {starting!r}")


@pytest.fixture
def local_serve(tmp_path: Path) -> Iterator[dict[str, str]]:
    """A serve with an embedded nats-server, and one worker of base_card() admitted."""
    env = _env(tmp_path)
    serve = subprocess.Popen(
        [*CLI, "serve"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    try:
        _read_until(serve, "synced:")
        card = tmp_path / "card.json"
        card.write_text(json.dumps(base_card()))
        worker = ["--namespace", "dgd", "--component", "backend", "--endpoint", "generate"]
        subprocess.run(
            [*CLI, "register", "--card", str(card), *worker, "--instance-id", "42", "--once"],
            env=env, timeout=60, check=True, capture_output=True,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            status = subprocess.run(
                [*CLI, "status", "--json"], env=env, timeout=60, capture_output=True, text=True,
                check=True,
            )  # fmt: skip
            groups = json.loads(status.stdout)["groups"]
            if groups and groups[0]["admitted"]:
                break
            time.sleep(0.2)
        yield env
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.communicate(timeout=30)


BESIDE_A_SERVE = [b for b in command_blocks() if b.marker == "runs beside a local serve"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("block", BESIDE_A_SERVE, ids=[b.where for b in BESIDE_A_SERVE])
def test_an_example_beside_a_local_serve_runs_as_written(
    block: Block, local_serve: dict[str, str], tmp_path: Path
) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    ran = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", block.text],
        cwd=scratch, env=local_serve, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert "tracked but not admitted" not in ran.stderr
    if "status --card" in block.text:
        assert json.loads((scratch / "serving-card.json").read_text()) == base_card()


@pytest.mark.timeout(120)
def test_the_fields_the_runbooks_jq_filters_read_are_in_status_json(
    local_serve: dict[str, str],
) -> None:
    status = json.loads(
        subprocess.run(
            [*CLI, "status", "--json"],
            env=local_serve,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
    )
    runbook = (ROOT / "docs" / "runbook.md").read_text(encoding="utf-8")
    filters = re.findall(r"workerset-admission status --json \| jq '([^']+)'", runbook)
    assert filters
    fields = {name for f in filters for name in re.findall(r"\.([a-z_]+)", f)}
    assert {"groups", "status", "recent_invalid"} <= fields
    assert fields <= set(status) | set(status["groups"][0]), fields


def _normalized(text: str) -> str:
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    text = re.sub(r"\d{4}-\d\d-\d\d[T ][\d:.,]+Z?", "<time>", text)
    text = re.sub(r"\b[0-9a-f]{64}\b", "<checksum>", text)
    text = re.sub(r"\b[0-9a-f]{12}\b", "<short>", text)
    text = re.sub(r"chatcmpl-[0-9a-f-]+", "<completion>", text)
    text = re.sub(r'"created":\d+', '"created":<n>', text)
    text = re.sub(r"/generate/[0-9a-f]+\b", "/generate/<hex>", text)
    text = re.sub(r"\b\d{6,20}\b", "<id>", text)
    text = re.sub(r"frontend: \S+", "frontend: <host-pid>", text)
    return "\n".join(re.sub(r"\s+", " ", line).strip() for line in text.strip().splitlines())


@pytest.mark.timeout(180)
def test_the_demo_prints_the_error_line_the_readme_shows(tmp_path: Path) -> None:
    (shown,) = marked("output of workerset-admission demo")
    demo = subprocess.run(
        [*CLI, "demo"], env=_env(tmp_path), capture_output=True, text=True, timeout=150,
        check=True,
    )  # fmt: skip
    (line,) = [x for x in (demo.stdout + demo.stderr).splitlines() if " ERROR " in x]
    assert line.split(" ", 2)[2] == shown.text.strip().split(" ", 2)[2]


@pytest.mark.timeout(120)
def test_serve_gives_up_an_unreachable_collector_as_the_runbook_says(tmp_path: Path) -> None:
    env = _env(tmp_path)
    collector = f"http://127.0.0.1:{_free_port()}"
    env.update({"OTEL_EXPORTER_OTLP_ENDPOINT": collector, "OTEL_SERVICE_NAME": "frontend-a"})
    serve = subprocess.Popen(
        [*CLI, "serve", "--telemetry"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    _read_until(serve, "synced:")
    time.sleep(1)
    asked = time.monotonic()
    serve.send_signal(signal.SIGTERM)
    out, _ = serve.communicate(timeout=60)
    took = time.monotonic() - asked
    assert serve.returncode == 0
    # The runbook says about 3 s (the final flush's grace); measured 3.03 s.
    assert took < 6, took
    (shown,) = marked("output of serve --telemetry with the collector away")
    first = shown.text.splitlines()[0].replace("http://otel-collector:4318", collector)
    ours = [x for x in out.splitlines() if "workerset_admission.telemetry.setup" in x]
    assert any(x.endswith(first.split("setup ", 1)[1]) for x in ours), ours
    # The SDK's own warning comes out once, as the runbook says, not once per retry.
    assert sum("Transient error" in x for x in out.splitlines()) <= 2


def _walkthrough() -> Block:
    (block,) = [
        b for b in command_blocks() if b.marker == "runs as the walkthrough, with real Dynamo"
    ]
    return block


@pytest.mark.dynamo
@pytest.mark.timeout(420)
def test_the_walkthrough_runs_as_written_and_prints_what_the_readme_shows(tmp_path: Path) -> None:
    pytest.importorskip("dynamo.frontend", reason="needs ai-dynamo==1.6.1 (see the README)")
    work = tmp_path / "work"
    for name in ("tmp", "home"):
        (work / name).mkdir(parents=True)
    env = _env(tmp_path)
    env = {k: v for k, v in env.items() if not k.startswith("DYN_")}
    env.update(
        {
            "WORK": str(work),
            "NATS_PORT": str(_free_port()),
            "HTTP_PORT": str(_free_port()),
            # Every Dynamo process leaves a file in TMPDIR and the frontend a cache in HOME.
            "TMPDIR": str(work / "tmp"),
            "HOME": str(work / "home"),
        }
    )
    shell = subprocess.Popen(
        ["bash", "-c", _walkthrough().text],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = shell.communicate(timeout=300)
        assert shell.returncode == 0, out
        (shown,) = marked("output of the walkthrough")
        assert _normalized(out) == _normalized(shown.text), out
        # Requests went to the incumbent; the rejected worker has no file in the view.
        answer = json.loads(out.splitlines()[0])
        rejected = re.search(r"instance=prod/backend/generate/([0-9a-f]+)", out)
        assert rejected is not None
        view = "\n".join(p.name for p in (work / "view-kv").rglob("*"))
        assert rejected.group(1) not in view.lower()
        assert int(rejected.group(1), 16) != answer["nvext"]["worker_id"]["decode_worker_id"]
    finally:
        # The walkthrough's background jobs: the nats-server, the workers, the bridge and the
        # frontend, all in the shell's own session.
        with_group = shell.pid
        for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 5)):
            try:
                os.killpg(with_group, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                try:
                    os.killpg(with_group, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.2)
