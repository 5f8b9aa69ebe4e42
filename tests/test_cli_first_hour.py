"""What a new operator meets first: errors, versions, the empty status, the local serve."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from support.cards import base_card
from workerset_admission import cli
from workerset_admission.cli.serve import render_status_table
from workerset_admission.errors import CredentialsRefused
from workerset_admission.settings import load_settings, unknown_environment


def _closed_port_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"nats://127.0.0.1:{port}"


def test_the_status_table_of_a_service_with_no_groups_is_headers_and_totals() -> None:
    table = render_status_table(
        {"groups": [], "readiness": [], "health": "healthy", "live_instances": 0}
    )
    lines = table.splitlines()
    assert lines[0] == "group  incumbent  status  gen  admitted  rejected  readiness"
    assert lines[1].startswith("health: healthy  groups: 0  live instances: 0")


@pytest.mark.parametrize("name", sorted(cli.COMMANDS))
def test_every_command_answers_version(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ended:
        cli.main([name, "--version"])
    assert ended.value.code == cli.EXIT_OK
    top = capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main(["--version"])
    assert top == capsys.readouterr().out
    assert top.startswith("workerset-admission ")


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["rollout"], "workerset-admission rollout: the following arguments are required"),
        (["status", "--bogus"], "workerset-admission status: unrecognized arguments: --bogus"),
        (["status", "--timeout", "soon"], "workerset-admission status: argument --timeout"),
        (["serve", "--log-level", "LOUD"], "workerset-admission serve: argument --log-level"),
        (["statsu"], "workerset-admission: argument COMMAND: invalid choice: 'statsu'"),
    ],
)
def test_an_argument_error_is_one_line_naming_the_command_with_status_2(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as ended:
        cli.main(argv)
    assert ended.value.code == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith(said)
    assert err.count("\n") == 1
    assert "usage:" not in err


def test_refused_credentials_have_their_own_exit_status() -> None:
    assert cli.exit_status(CredentialsRefused("refused")) == cli.EXIT_CREDENTIALS == 5
    assert "refused the credentials" in cli.EXIT_STATUSES[cli.EXIT_CREDENTIALS]


def test_a_misspelled_variable_is_named_with_the_setting_it_probably_meant(
    caplog: pytest.LogCaptureFixture,
) -> None:
    env = {
        "WORKERSET_ADMISSION_NATS_SERVER": "nats://nats:4222",
        "WORKERSET_ADMISSION_CONFIG_FILE": "",
        "WORKERSET_ADMISSION_SERVE_FILE": "/run/x.json",
        "WORKERSET_ADMISSION_DISCOVERY_BUCKET": "b",
    }
    assert unknown_environment(env) == [
        "unknown environment variable WORKERSET_ADMISSION_NATS_SERVER is ignored "
        "(did you mean WORKERSET_ADMISSION_NATS_SERVERS?)"
    ]
    with caplog.at_level(logging.WARNING, logger="workerset_admission.settings"):
        settings = load_settings(env=env)
    assert settings.embedded
    assert "WORKERSET_ADMISSION_NATS_SERVER is ignored" in caplog.text


def test_a_misspelled_variable_is_warned_about_at_the_start_of_a_command(
    tmp_path: Path,
) -> None:
    env = {
        **os.environ,
        "WORKERSET_ADMISSION_NATS_SERVER": _closed_port_url(),
        "WORKERSET_ADMISSION_SERVE_FILE": str(tmp_path / "none.json"),
    }
    env.pop("WORKERSET_ADMISSION_NATS_SERVERS", None)
    ran = subprocess.run(
        [sys.executable, "-m", "workerset_admission.cli", "status"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    first = ran.stderr.splitlines()[0]
    assert first.startswith("WARNING workerset_admission.settings: unknown environment variable ")
    assert "WORKERSET_ADMISSION_NATS_SERVER is ignored" in first


@pytest.mark.parametrize(
    "argv",
    [
        ["status"],
        [
            "register",
            "--card",
            "card.json",
            "--namespace",
            "a",
            "--component",
            "b",
            "--endpoint",
            "c",
        ],
        [
            "deregister",
            "--namespace",
            "a",
            "--component",
            "b",
            "--endpoint",
            "c",
            "--instance-id",
            "1",
        ],
        ["record", "--duration", "1", "-o", "trace.jsonl"],
        ["rollout", "--model", "m", "--namespace", "n"],
        ["bridge", "--file-kv", "."],
    ],
)
def test_every_connecting_command_without_a_server_looks_for_the_local_serve_the_same_way(
    argv: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "card.json").write_text(json.dumps(base_card()))
    monkeypatch.delenv("WORKERSET_ADMISSION_NATS_SERVERS", raising=False)
    announcement = tmp_path / "serve.json"
    monkeypatch.setenv("WORKERSET_ADMISSION_SERVE_FILE", str(announcement))
    # A serve that was killed leaves its announcement behind: it is not believed.
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    announcement.write_text(json.dumps({"url": _closed_port_url(), "pid": int(dead.stdout)}))
    status = cli.main(argv)
    err = capsys.readouterr().err
    assert (status, err) == (
        cli.EXIT_UNREACHABLE,
        f"workerset-admission {argv[0]}: no NATS server given (--nats-server, "
        "WORKERSET_ADMISSION_NATS_SERVERS or the settings file) and no running local serve "
        f"announced in {announcement}\n",
    )


def test_bridge_with_no_store_names_the_flags_and_no_path_the_user_never_typed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("DYN_FILE_KV", raising=False)
    monkeypatch.delenv("WORKERSET_ADMISSION_ETCD_ENDPOINTS", raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    assert cli.main(["bridge", "--nats-server", _closed_port_url()]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err == (
        "workerset-admission bridge: no discovery store given: --file-kv DIR (the workers' "
        "DYN_FILE_KV) for Dynamo's file store, or --etcd ENDPOINTS for etcd\n"
    )
    assert str(tmp_path) not in err


def test_a_model_name_holding_a_newline_stays_in_its_row_of_the_status_table() -> None:
    group = {
        "model": "m\nhealth: healthy  groups: 0",
        "namespace": "ns",
        "component": "backend",
        "endpoint": "generate",
        "worker_type": "aggregated",
        "incumbent": "a" * 64,
        "status": "ready",
        "generation": 1,
        "admitted": [1],
        "cohorts": [{"checksum": "a" * 64, "members": [1]}],
        "drained": [{"instance_id": 2, "by": "ops\nforged", "at": 0.0}],
    }
    table = render_status_table(
        {"groups": [group], "readiness": [], "health": "healthy", "live_instances": 1}
    )
    lines = table.splitlines()
    assert len(lines) == 4  # header, the group, totals, the drained worker
    assert lines[1].startswith("m\\nhealth: healthy  groups: 0 @ ns/backend/generate")
    assert lines[2].startswith("health: healthy  groups: 1")
    assert lines[3].startswith("drained 2 in m\\nhealth")
    assert "by ops\\nforged" in lines[3]
