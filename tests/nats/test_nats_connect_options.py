"""Connection options: validation, TLS loading, secrets kept out of repr."""

from __future__ import annotations

from pathlib import Path

import pytest
from workerset_admission.adapters.nats.connect import NatsConnectOptions, servers_from_text
from workerset_admission.errors import ConfigError


@pytest.mark.parametrize(
    "kwargs",
    [
        {"servers": ()},
        {"user": "u"},
        {"password": "p"},
        {"tls_cert_file": Path("c.pem")},
        {"nkey_seed": "SU", "nkey_seed_file": Path("seed.nk")},
    ],
)
def test_incomplete_or_conflicting_options_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        NatsConnectOptions(**kwargs)  # type: ignore[arg-type]


def test_secrets_do_not_appear_in_repr() -> None:
    options = NatsConnectOptions(user="u", password="pw-secret", token=None, nkey_seed=None)
    assert "pw-secret" not in repr(options)


def test_tls_is_off_for_plain_urls_and_on_for_tls_urls() -> None:
    assert NatsConnectOptions(servers=("nats://h:1",)).tls_context() is None
    assert NatsConnectOptions(servers=("tls://h:1",)).tls_context() is not None


def test_unreadable_tls_files_are_a_config_error(tmp_path: Path) -> None:
    options = NatsConnectOptions(tls_ca_file=tmp_path / "missing-ca.pem")
    with pytest.raises(ConfigError, match="TLS"):
        options.tls_context()


def test_server_lists_split_on_commas_and_drop_blanks() -> None:
    assert servers_from_text("nats://a:1, ,nats://b:2") == ("nats://a:1", "nats://b:2")
    assert servers_from_text(["nats://a:1"]) == ("nats://a:1",)
