"""The first hour against real servers: refused credentials, a killed serve, the local serve."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from support.cards import base_card
from workerset_admission.adapters.nats.embedded import EmbeddedNatsServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

CLI = [sys.executable, "-m", "workerset_admission.cli"]
WORKER = ["--namespace", "dgd", "--component", "backend", "--endpoint", "generate"]


def cli_env(tmp_path: Path) -> dict[str, str]:
    # Settings come from flags only; the local serve's announcement lives in the test's folder.
    env = {k: v for k, v in os.environ.items() if not k.startswith("WORKERSET_ADMISSION_")}
    env["PYTHONUNBUFFERED"] = "1"
    env["WORKERSET_ADMISSION_SERVE_FILE"] = str(tmp_path / "serve.json")
    return env


@pytest.fixture
def password_server(tmp_path: Path) -> Iterator[EmbeddedNatsServer]:
    """A real nats-server that only lets in user ``u`` with password ``right``."""
    server = EmbeddedNatsServer(
        tmp_path / "store", extra_args=("--user", "u", "--pass", "right")
    ).start()
    try:
        yield server
    finally:
        server.close()


def _commands(tmp_path: Path) -> dict[str, list[str]]:
    card = tmp_path / "card.json"
    card.write_text(json.dumps(base_card()))
    store = tmp_path / "workers-kv"
    store.mkdir(exist_ok=True)
    return {
        "serve": ["serve"],
        "status": ["status"],
        "register": ["register", "--card", str(card), *WORKER],
        "deregister": ["deregister", *WORKER, "--instance-id", "1"],
        "record": ["record", "--duration", "1", "-o", str(tmp_path / "t.jsonl")],
        "rollout": ["rollout", "--model", "m", "--namespace", "dgd", "--wait"],
        "bridge": ["bridge", "--file-kv", str(store)],
    }


@pytest.mark.parametrize(
    "command", ["serve", "status", "register", "deregister", "record", "rollout", "bridge"]
)
def test_a_wrong_password_is_said_to_be_refused_with_status_5_on_every_connecting_command(
    command: str, password_server: EmbeddedNatsServer, tmp_path: Path
) -> None:
    argv = _commands(tmp_path)[command]
    flags = ["--nats-server", password_server.url, "--nats-user", "u", "--nats-password", "no"]
    ran = subprocess.run(
        [*CLI, *argv, *flags],
        capture_output=True,
        text=True,
        env=cli_env(tmp_path),
        timeout=60,
        check=False,
    )
    last = ran.stderr.splitlines()[-1]
    assert ran.returncode == 5, ran.stderr
    assert last == (
        f"workerset-admission {command}: NATS at {password_server.url} refused the credentials "
        "(nats: 'Authorization Violation'): check the NATS user and password, token, nkey seed "
        "or credentials file"
    )
    assert "no servers available" not in ran.stderr


def _read_line(process: subprocess.Popen[str], starting: str, timeout: float = 30) -> str:
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if line.startswith(starting):
            return line
        if not line and process.poll() is not None:
            break
    raise AssertionError(f"no line starting {starting!r}")


def _nats_children(pid: int) -> list[psutil.Process]:
    return [p for p in psutil.Process(pid).children() if p.name() == "nats-server"]


def test_a_killed_serve_takes_its_embedded_nats_server_with_it(tmp_path: Path) -> None:
    serve = subprocess.Popen(
        [*CLI, "serve", "--store-dir", str(tmp_path / "js")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=cli_env(tmp_path),
    )
    with serve:
        try:
            _read_line(serve, "synced:")
            (server,) = _nats_children(serve.pid)
            serve.send_signal(signal.SIGKILL)
            serve.wait(timeout=10)
            # SIGKILL leaves no chance to clean up: the kernel ends the server.
            _gone, alive = psutil.wait_procs([server], timeout=15)
            assert not alive, "the embedded nats-server outlived its serve"
        finally:
            if serve.poll() is None:
                serve.kill()


def test_register_record_rollout_and_status_find_a_local_serve_with_no_server_given(
    tmp_path: Path,
) -> None:
    env = cli_env(tmp_path)
    serve = subprocess.Popen(
        [*CLI, "serve", "--frontend-id", "fe-local"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    commands = _commands(tmp_path)
    with serve:
        try:
            _read_line(serve, "synced:")
            registered = subprocess.run(
                [*CLI, *commands["register"], "--instance-id", "0x2a", "--once"],
                capture_output=True,
                text=True,
                env=env,
                timeout=60,
                check=False,
            )
            assert registered.returncode == 0, registered.stderr
            for name in ("status", "record", "rollout"):
                argv = commands[name][:-1] if name == "rollout" else commands[name]
                ran = subprocess.run(
                    [*CLI, *argv], capture_output=True, text=True, env=env, timeout=60, check=False
                )
                # rollout answers 1: the gate for namespace dgd is closed while nothing serves.
                assert ran.returncode in (0, 1), (name, ran.stderr)
                assert "no NATS server given" not in ran.stderr
        finally:
            serve.send_signal(signal.SIGTERM)
            serve.wait(timeout=30)


def test_status_card_prints_the_served_card_in_a_form_diff_takes(tmp_path: Path) -> None:
    env = cli_env(tmp_path)
    serve = subprocess.Popen(
        [*CLI, "serve"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    commands = _commands(tmp_path)
    with serve:
        try:
            _read_line(serve, "synced:")
            subprocess.run(
                [*CLI, *commands["register"], "--instance-id", "42", "--once"],
                env=env, timeout=60, check=True, capture_output=True,
            )  # fmt: skip
            served = tmp_path / "served.json"
            deadline = time.monotonic() + 30
            while True:
                ran = subprocess.run(
                    [*CLI, "status", "--card", base_card()["display_name"]],
                    capture_output=True, text=True, env=env, timeout=60, check=False,
                )  # fmt: skip
                if ran.returncode == 0 or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert ran.returncode == 0, ran.stderr
            served.write_text(ran.stdout)
            same = subprocess.run(
                [*CLI, "diff", str(served), str(tmp_path / "card.json")],
                capture_output=True, text=True, env=env, timeout=60, check=False,
            )  # fmt: skip
            assert same.returncode == 0, same.stdout + same.stderr
            assert json.loads(ran.stdout) == base_card()
        finally:
            serve.send_signal(signal.SIGTERM)
            serve.wait(timeout=30)
