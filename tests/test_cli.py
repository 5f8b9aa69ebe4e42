"""The command line's one runner: flags, settings, and the table of exit statuses, code by code."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import types
from pathlib import Path

import pytest
from support.cards import EP, base_card, lora_card
from workerset_admission import cli
from workerset_admission.card import encode_model_record, model_kv_key
from workerset_admission.errors import (
    ConfigError,
    InvalidRecordError,
    LastWorkerRefused,
    StoreUnavailable,
    Unreachable,
    ViewDirectoryError,
    ViewDirectoryUnavailable,
    WorkersetAdmissionError,
)
from workerset_admission.settings import CONNECTION_SETTINGS, FLAGGED_SETTINGS

README = Path(__file__).resolve().parents[1] / "README.md"


def _trace(tmp_path: Path) -> Path:
    """Two workers with different cards: 1 is admitted, 2 is rejected."""
    lines = [
        {"kind": "put", "key": model_kv_key(EP, i), "value": encode_model_record(EP, i, c).decode()}
        for i, c in ((1, base_card(16)), (2, base_card(32)))
    ]
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return trace


def _closed_port_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"nats://127.0.0.1:{port}"


def test_status_0_a_replay_that_succeeds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["replay", str(_trace(tmp_path))]) == cli.EXIT_OK
    assert json.loads(capsys.readouterr().out)["groups"]


def test_status_1_explain_answers_no_for_a_rejected_instance(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["explain", str(_trace(tmp_path)), "2"]) == cli.EXIT_NO
    assert "is not admitted" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        ["replay", "--log-level", "LOUD", "x"],
        ["replay", "/no/such/trace.jsonl"],
        ["record", "-o", "/no/such/folder/trace.jsonl"],
        ["rollout", "--model", "m", "--namespace", "n", "--bucket-replicas", "two"],
        ["status", "--namespace-filter-mode", "exact"],
        ["serve", "--frontend-id", ""],
    ],
    ids=["log level", "trace file", "output folder", "bad flag", "settings", "empty id"],
)
def test_status_2_bad_input_is_one_line_without_a_traceback(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = cli.main(argv)
    except SystemExit as ended:  # argparse refuses a flag by exiting with its own status 2
        code = int(ended.code or 0)
    assert code == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.strip()


def test_status_2_register_refuses_a_card_the_service_would_refuse_with_its_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    card = tmp_path / "card.json"
    card.write_text(json.dumps(base_card(kv_cache_block_size="sixteen")), encoding="utf-8")
    argv = ["register", "--nats-server", _closed_port_url(), "--card", str(card), "--once"]
    argv += ["--namespace", "dgd", "--component", "backend", "--endpoint", "generate"]
    assert cli.main(argv) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    # The boundary's own reason, before any connection is tried.
    assert err.startswith("workerset-admission register: invalid_type")
    assert "cannot reach NATS" not in err


def test_status_2_register_for_a_1_7_frontend_refuses_a_ttl_past_the_duration_limit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    router = {"router_mode": "k_v", "kv_router_config": {"router_ttl_secs": 1e21}}
    router["load_threshold_config"] = {}
    card = tmp_path / "card.json"
    card.write_text(json.dumps(base_card(router_config=router)), encoding="utf-8")
    argv = ["register", "--nats-server", _closed_port_url(), "--card", str(card), "--once"]
    argv += ["--namespace", "dgd", "--component", "backend", "--endpoint", "generate"]
    assert cli.main([*argv, "--dynamo-version", "1.7"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("workerset-admission register: invalid_router_config")
    assert "not a valid duration for a Dynamo 1.7 frontend" in err
    # For a 1.6 frontend the card is fine: register goes on to connect (and finds no server).
    assert cli.main([*argv, "--dynamo-version", "1.6"]) != cli.EXIT_USAGE
    assert "invalid_router_config" not in capsys.readouterr().err


def test_status_2_register_refuses_an_adapter_card_without_its_suffix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    card = tmp_path / "card.json"
    card.write_text(json.dumps(lora_card("sql-lora")), encoding="utf-8")
    argv = ["register", "--nats-server", _closed_port_url(), "--card", str(card), "--once"]
    argv += ["--namespace", "dgd", "--component", "b", "--endpoint", "g"]
    assert cli.main(argv) == cli.EXIT_USAGE
    assert "lora_mismatch" in capsys.readouterr().err


def test_status_2_register_refuses_a_namespace_the_frontends_do_not_watch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    card = tmp_path / "card.json"
    card.write_text(json.dumps(base_card()), encoding="utf-8")
    argv = ["register", "--nats-server", _closed_port_url(), "--card", str(card), "--once"]
    argv += ["--namespace", "other", "--component", "b", "--endpoint", "g"]
    argv += ["--namespace-filter-mode", "exact", "--namespace-filter", "dgd"]
    assert cli.main(argv) == cli.EXIT_USAGE
    assert "outside the frontends' namespace filter" in capsys.readouterr().err


def test_status_3_an_unreachable_server_is_reported_at_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["status", "--nats-server", _closed_port_url(), "--timeout", "5"]
    assert cli.main(argv) == cli.EXIT_UNREACHABLE
    err = capsys.readouterr().err
    assert err.startswith("workerset-admission status: cannot reach NATS")


def test_status_3_record_against_no_server_says_so_instead_of_waiting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "trace.jsonl"
    argv = ["record", "--nats-server", _closed_port_url(), "-o", str(out), "--duration", "60"]
    assert cli.main(argv) == cli.EXIT_UNREACHABLE
    assert "workerset-admission record: cannot connect" in capsys.readouterr().err
    assert not out.exists()


def test_status_4_a_command_that_fails_while_running(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    failing = types.ModuleType("failing_command")

    def arguments(name: str, parser: argparse.ArgumentParser) -> None:
        del name, parser

    async def main(name: str, args: argparse.Namespace, stop: asyncio.Event) -> int:
        raise WorkersetAdmissionError("the service stopped on an error")

    failing.arguments = arguments  # type: ignore[attr-defined]
    failing.main = main  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "failing_command", failing)
    monkeypatch.setitem(cli.COMMANDS, "fail", cli.CommandSpec("failing_command", "fails", False))
    assert cli.main(["fail"]) == cli.EXIT_FAILED
    assert capsys.readouterr().err == "workerset-admission fail: the service stopped on an error\n"


def _card_file(tmp_path: Path, name: str, card: object) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(card), encoding="utf-8")
    return str(path)


def test_status_0_diff_of_cards_that_would_join_one_cohort(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    a = _card_file(tmp_path, "a.json", base_card(16))
    # Unhashed fields differ; the second card comes as a whole discovery record, on stdin.
    record = encode_model_record(EP, 7, base_card(16, migration_limit=3))
    monkeypatch.setattr(
        sys, "stdin", types.SimpleNamespace(buffer=types.SimpleNamespace(read=lambda: record))
    )
    assert cli.main(["diff", "--json", a, "-"]) == cli.EXIT_OK
    answer = json.loads(capsys.readouterr().out)
    assert answer["equal"] is True
    assert answer["differences"] == []
    assert answer["card_a"]["mdc_checksum"] == answer["card_b"]["mdc_checksum"]


def test_status_1_diff_of_cards_that_differ_names_what_differs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = _card_file(tmp_path, "a.json", base_card(16))
    b = _card_file(tmp_path, "b.json", base_card(32))
    assert cli.main(["diff", a, b]) == cli.EXIT_NO
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in out[:2]] == [["card", "A"], ["card", "B"]]
    assert out[2:] == [
        "different checksums; B differs from A in 1 input(s):",
        "  kv_cache_block_size: 16 -> 32",
    ]


def test_status_2_diff_refuses_a_card_the_service_would_refuse_with_its_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = _card_file(tmp_path, "a.json", base_card(16))
    b = _card_file(tmp_path, "b.json", base_card(kv_cache_block_size="sixteen"))
    assert cli.main(["diff", a, b]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith(
        f"workerset-admission diff: {b}: the service would refuse it: invalid_type"
    )
    assert cli.main(["diff", a, str(tmp_path / "missing.json")]) == cli.EXIT_USAGE
    assert "cannot read" in capsys.readouterr().err


def _readme_commands() -> dict[int, str]:
    rows = re.findall(r"^\| (\d+) \| [^|]+ \| ([^|]+) \|$", README.read_text(), flags=re.M)
    return {int(code): commands for code, commands in rows}


def test_the_readme_table_gives_the_drain_its_own_status_for_the_last_worker() -> None:
    commands = _readme_commands()
    assert commands[cli.EXIT_LAST_WORKER].strip() == "`drain`"
    assert "--allow-empty" in cli.EXIT_STATUSES[cli.EXIT_LAST_WORKER]
    assert cli.exit_status(LastWorkerRefused("x")) == cli.EXIT_LAST_WORKER


def test_the_readme_table_names_the_statuses_diff_answers_with() -> None:
    commands = _readme_commands()
    assert commands[cli.EXIT_OK].strip() == "all"
    assert "`diff`" in commands[cli.EXIT_NO]
    assert commands[cli.EXIT_USAGE].strip() == "all"
    assert "diff cards differ" in cli.EXIT_STATUSES[cli.EXIT_NO]


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (ConfigError("x"), cli.EXIT_USAGE),
        (InvalidRecordError("bad_key"), cli.EXIT_USAGE),
        (ViewDirectoryError("owned by another live writer"), cli.EXIT_USAGE),
        (ViewDirectoryUnavailable("is not writable (Read-only file system)"), cli.EXIT_FAILED),
        (Unreachable("x"), cli.EXIT_UNREACHABLE),
        (StoreUnavailable("etcd: connection refused"), cli.EXIT_UNREACHABLE),
        (ConnectionRefusedError(), cli.EXIT_UNREACHABLE),
        (asyncio.TimeoutError(), cli.EXIT_UNREACHABLE),
        (WorkersetAdmissionError("x"), cli.EXIT_FAILED),
        (RuntimeError("x"), cli.EXIT_FAILED),
    ],
)
def test_each_error_maps_to_its_row_of_the_table(error: BaseException, status: int) -> None:
    assert cli.exit_status(error) == status


def test_the_readme_table_lists_every_exit_status() -> None:
    text = README.read_text(encoding="utf-8")
    # The exit-status table alone: from its header to the first line that is not a row.
    table = text[text.index("| Status | Meaning | Commands |") :].split("\n\n", 1)[0]
    rows = re.findall(r"^\| (\d+) \| ", table, flags=re.MULTILINE)
    assert [int(code) for code in rows] == sorted(cli.EXIT_STATUSES)


def test_version_is_printed(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ended:
        cli.main(["--version"])
    assert ended.value.code == 0
    assert re.fullmatch(r"workerset-admission \S+\n", capsys.readouterr().out)


def _flags(name: str) -> set[str]:
    parser = cli.build_parser()
    subparsers = next(
        a for a in parser._actions if isinstance(a, argparse._SubParsersAction)
    ).choices
    return {f for a in subparsers[name]._actions for f in a.option_strings}


def _settings_shown(name: str) -> set[str]:
    """The settings whose flags ``name --help`` lists in its settings groups."""
    parser = cli.build_parser()
    subparsers = next(
        a for a in parser._actions if isinstance(a, argparse._SubParsersAction)
    ).choices
    groups = [g for g in subparsers[name]._action_groups if g.title and "override" in g.title]
    shown = {a.dest for g in groups for a in g._group_actions}
    assert shown <= {*FLAGGED_SETTINGS, "config_file"}
    return shown - {"config_file"}


@pytest.mark.parametrize("name", list(cli.COMMANDS))
def test_each_command_shows_the_connection_flags_only_if_it_connects(name: str) -> None:
    flags = _flags(name)
    assert ("--nats-server" in flags) is cli.COMMANDS[name].connects
    assert ("--config" in flags) is cli.COMMANDS[name].connects
    assert "--log-level" in flags


@pytest.mark.parametrize("name", list(cli.COMMANDS))
def test_each_command_shows_the_flags_of_the_settings_it_reads_and_no_others(name: str) -> None:
    """What a command reads is checked against its code by integration/test_cli_settings.py."""
    spec = cli.COMMANDS[name]
    expected = set(spec.settings) | (set(CONNECTION_SETTINGS) if spec.connects else set())
    assert _settings_shown(name) == expected


def test_the_rollout_gate_shows_no_build_tenure_tokenizer_or_etcd_setting() -> None:
    flags = _flags("rollout")
    unused = {
        "--max-concurrent-builds",
        "--tenure-hold",
        "--registration-ttl",
        "--tokenizer-backend",
        "--reconcile-interval",
        "--max-value-bytes",
        "--discovery-bucket",
        "--etcd",
    }
    assert flags & unused == set()
    assert "--admission-bucket" in flags


def test_only_bridge_shows_the_etcd_flags_and_only_serve_the_service_limits() -> None:
    for name in cli.COMMANDS:
        flags = _flags(name)
        assert ("--etcd" in flags) is (name == "bridge"), name
        # replay and explain apply a tenure hold of their own, as the service would.
        assert ("--tenure-hold" in flags) is (name in {"serve", "replay", "explain"}), name
        assert ("--max-concurrent-builds" in flags) is (name == "serve"), name
        assert ("--prometheus-port" in flags) is (name in {"serve", "bridge"}), name


def test_the_bridge_says_it_reads_a_file_store_or_etcd() -> None:
    assert "etcd" in cli.COMMANDS["bridge"].help
    assert "file store" in cli.COMMANDS["bridge"].help


def test_bridge_etcd_without_the_etcd_extra_says_so_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys

    for name in [m for m in sys.modules if m.startswith("workerset_admission.adapters.etcd")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "aetcd", None)  # as if the extra were not installed
    argv = [
        "bridge",
        "--etcd",
        "http://127.0.0.1:1",
        "--once",
        "--nats-server",
        "nats://127.0.0.1:1",
    ]
    assert cli.main(argv) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err == (
        "workerset-admission bridge: --etcd needs the etcd extra (aetcd is not installed): "
        "pip install '.[etcd]' in a checkout\n"
    )


def _run_with_stdout_closed(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """Run the command line with a standard output whose reader has already gone."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader left before the first line, as after `| head -0`
    try:
        return subprocess.run(
            [sys.executable, "-m", "workerset_admission.cli", *argv],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)


def test_status_0_a_closed_stdout_pipe_ends_a_command_quietly(tmp_path: Path) -> None:
    done = _run_with_stdout_closed(["replay", str(_trace(tmp_path))])
    assert done.returncode == cli.EXIT_OK, done.stderr
    # What a replay says on stderr anyway (its trace carries no times), and nothing more.
    assert "pipe" not in done.stderr.lower()
    assert "Traceback" not in done.stderr


_LONG_RUNNING_PIPE = """
import asyncio, sys, types
from workerset_admission import cli

service = types.ModuleType("pipe_service")
service.arguments = lambda name, parser: None

async def main(name, args, stop):
    while True:  # a service writing its lines until its reader goes away
        print("a line", flush=True)
        await asyncio.sleep(0.01)

service.main = main
sys.modules["pipe_service"] = service
cli.COMMANDS["pipe-service"] = cli.CommandSpec(
    "pipe_service", "writes lines", False, runs_until_stopped=True
)
sys.exit(cli.main(["pipe-service"]))
"""


def test_status_4_a_service_whose_stdout_closed_stops_to_be_restarted() -> None:
    # A filter ends quietly (0) on a closed pipe; a service (serve, register, record) that
    # loses its output has failed: its supervisor's Restart=on-failure must bring it back.
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [sys.executable, "-c", _LONG_RUNNING_PIPE],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)
    assert done.returncode == cli.EXIT_FAILED, done.stderr
    assert "standard output was closed" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_broken_pipe_that_is_not_stdout_is_still_reported(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A NATS connection the server closed also raises BrokenPipeError: that one is an outage.
    failing = types.ModuleType("pipe_command")

    def arguments(name: str, parser: argparse.ArgumentParser) -> None:
        del name, parser

    async def main(name: str, args: argparse.Namespace, stop: asyncio.Event) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    failing.arguments = arguments  # type: ignore[attr-defined]
    failing.main = main  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pipe_command", failing)
    monkeypatch.setitem(cli.COMMANDS, "pipe", cli.CommandSpec("pipe_command", "pipes", False))
    assert cli.main(["pipe"]) == cli.EXIT_UNREACHABLE
    assert capsys.readouterr().err == "workerset-admission pipe: cannot reach NATS: broken pipe\n"


def test_error_lines_say_a_timeout_and_no_server_in_words() -> None:
    from nats.errors import NoServersError
    from nats.errors import TimeoutError as NatsTimeoutError
    from workerset_admission.errors import error_in_words

    where = "nats://127.0.0.1:4222"
    assert error_in_words(NoServersError(), where=where) == f"no NATS server answered at {where}"
    assert error_in_words(NatsTimeoutError(), timeout=5) == "timed out after 5 s"
    assert error_in_words(asyncio.TimeoutError(), timeout=2.5) == "timed out after 2.5 s"
    assert error_in_words(TimeoutError()) == "timed out"
    assert "()" not in error_in_words(ValueError())


def test_explain_shows_an_undrain_in_the_history_of_the_worker_it_returns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from workerset_admission.card.drain_record import encode_drain_record
    from workerset_admission.identity import Drain
    from workerset_admission.keys import drain_kv_key

    card = base_card(16)
    lines: list[dict[str, object]] = [
        {
            "kind": "put",
            "key": model_kv_key(EP, i),
            "value": encode_model_record(EP, i, card).decode(),
        }
        for i in (1, 2)
    ]
    drain = Drain(EP.namespace, 2, by="ops")
    lines.append(
        {
            "kind": "put",
            "key": drain_kv_key(EP.namespace, 2),
            "value": encode_drain_record(drain).decode(),
        }
    )
    lines.append({"kind": "delete", "key": drain_kv_key(EP.namespace, 2), "operation": "delete"})
    trace = tmp_path / "undrain.jsonl"
    trace.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    assert cli.main(["explain", str(trace), "2"]) == cli.EXIT_OK
    out = capsys.readouterr().out
    events = [line.strip() for line in out.splitlines() if line.strip().startswith("line ")]
    assert events == [
        "line 2: valid record (" + events[0].split("(")[1],
        "line 3: drained by ops",
        "line 4: undrained: rejoins its cohort as a returning member",
    ]


@pytest.mark.parametrize(
    "argv",
    [
        ["status"],
        ["record", "--duration", "1"],
        ["drain", "--namespace", "ns", "--all", "--timeout", "1"],
    ],
    ids=["status", "record", "drain"],
)
def test_an_unreachable_server_is_said_in_words_not_as_an_exception_repr(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = _closed_port_url()
    assert cli.main([*argv, "--nats-server", url]) == cli.EXIT_UNREACHABLE
    err = capsys.readouterr().err
    assert "no NATS server answered" in err
    assert url in err
    assert "Error()" not in err


def test_a_refusal_an_earlier_command_of_the_process_heard_does_not_explain_this_ones_failure(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # An embedding host (or a test run) may run several commands in one process: a permission
    # refused to an earlier one must not turn this one's outage into "refused" (status 5).
    from workerset_admission.adapters.nats import connect

    monkeypatch.setattr(connect._REFUSED_HERE, "count", connect._REFUSED_HERE.count + 1)
    monkeypatch.setattr(connect._REFUSED_HERE, "last", ("publish", "$KV.elsewhere.v1.x"))
    argv = ["status", "--nats-server", _closed_port_url(), "--timeout", "5"]
    assert cli.main(argv) == cli.EXIT_UNREACHABLE
    assert "refused" not in capsys.readouterr().err
