"""The embedded nats-server launcher: binary lookup and start failures, with stand-in binaries."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from workerset_admission.adapters.nats.embedded import (
    BINARY_ENV_VAR,
    EmbeddedNatsServer,
    NatsServerNotFound,
    NatsServerStartError,
    find_nats_server_binary,
)


def stand_in(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "nats-server"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def test_the_environment_variable_wins_over_every_other_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = stand_in(tmp_path, "exit 0")
    monkeypatch.setenv(BINARY_ENV_VAR, str(fake))
    assert find_nats_server_binary() == fake


def test_a_variable_naming_no_file_falls_through_to_the_next_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(BINARY_ENV_VAR, str(tmp_path / "absent"))
    try:
        found = find_nats_server_binary()
    except NatsServerNotFound:
        return  # no binary anywhere on this machine is also a valid outcome
    assert found != tmp_path / "absent"


def test_a_server_that_exits_at_once_is_reported_with_its_log(tmp_path: Path) -> None:
    fake = stand_in(tmp_path, 'echo "bad flag -js" >&2; exit 3')
    server = EmbeddedNatsServer(tmp_path / "store", binary=fake, port=1, ready_timeout=5)
    try:
        with pytest.raises(NatsServerStartError, match=r"code 3.*bad flag"):
            server.start()
        assert not server.running
    finally:
        server.close()


def test_a_server_that_never_becomes_ready_is_stopped_and_reported(tmp_path: Path) -> None:
    fake = stand_in(tmp_path, "exec sleep 30")
    server = EmbeddedNatsServer(binary=fake, port=1, ready_timeout=0.3)
    try:
        with pytest.raises(NatsServerStartError, match="not ready"):
            server.start()
        assert not server.running
    finally:
        server.close()


def test_a_temporary_store_is_removed_on_close(tmp_path: Path) -> None:
    server = EmbeddedNatsServer(binary=stand_in(tmp_path, "exit 0"))
    store_parent = server.store_dir.parent
    assert store_parent.exists()
    server.close()
    assert not store_parent.exists()
