"""etcd settings for ``bridge``: config file, environment and flags, validated once."""

from __future__ import annotations

from pathlib import Path

import pytest
from workerset_admission.adapters.etcd.client import etcd_options
from workerset_admission.discovery_paths import EtcdEndpoint, parse_endpoints
from workerset_admission.errors import ConfigError
from workerset_admission.settings import load_settings


def test_endpoints_parse_like_dynamos_etcd_endpoints() -> None:
    assert parse_endpoints("http://127.0.0.1:2379, https://etcd.example:4001") == (
        EtcdEndpoint("127.0.0.1", 2379, secure=False),
        EtcdEndpoint("etcd.example", 4001, secure=True),
    )
    assert parse_endpoints("localhost") == (EtcdEndpoint("localhost", 2379, secure=False),)


@pytest.mark.parametrize(
    "url",
    ["nats://127.0.0.1:4222", "http://user:pw@127.0.0.1:2379", "http://h:notaport", "http://h/x"],
)
def test_an_endpoint_that_is_not_a_plain_etcd_url_is_refused(url: str) -> None:
    with pytest.raises(ConfigError):
        parse_endpoints(url)


def test_a_refused_endpoint_never_echoes_a_password_in_it() -> None:
    with pytest.raises(ConfigError) as refused:
        load_settings(env={}, flags={"etcd_endpoints": "http://u:s3cret@h:2379"})
    assert "s3cret" not in str(refused.value)


def test_the_config_file_groups_etcd_settings_and_the_environment_overrides_them(
    tmp_path: Path,
) -> None:
    config = tmp_path / "settings.toml"
    config.write_text(
        '[etcd]\nendpoints = ["http://10.0.0.1:2379"]\nuser = "bridge"\npassword = "pw"\n'
        'tls_ca_file = "/etc/etcd/ca.pem"\n'
    )
    env = {"WORKERSET_ADMISSION_ETCD_ENDPOINTS": "https://a:2379,https://b:2379"}

    settings = load_settings(env=env, config_file=config)

    assert settings.etcd_endpoints == ("https://a:2379", "https://b:2379")
    assert settings.etcd_user == "bridge"
    assert settings.etcd_tls_ca_file == Path("/etc/etcd/ca.pem")
    assert settings.redacted()["etcd_password"] == "**********"


@pytest.mark.parametrize(
    ("flags", "rule"),
    [
        ({"etcd_user": "u"}, "etcd_user and etcd_password"),
        ({"etcd_tls_cert_file": "/c.pem"}, "etcd_tls_cert_file and etcd_tls_key_file"),
    ],
)
def test_credentials_that_come_only_half_given_are_refused(
    flags: dict[str, str], rule: str
) -> None:
    with pytest.raises(ConfigError, match=rule):
        load_settings(env={}, flags={"etcd_endpoints": "http://h:2379", **flags})


def test_etcd_options_carry_the_secret_and_tls_files_to_the_reader() -> None:
    settings = load_settings(
        env={},
        flags={
            "etcd_endpoints": "https://h:2379",
            "etcd_user": "u",
            "etcd_password": "pw",
            "etcd_tls_cert_file": "/c.pem",
            "etcd_tls_key_file": "/k.pem",
        },
    )

    options = etcd_options(settings)

    assert options.endpoints == (EtcdEndpoint("h", 2379, secure=True),)
    assert (options.user, options.password) == ("u", "pw")
    assert (options.cert_file, options.key_file) == (Path("/c.pem"), Path("/k.pem"))


def test_a_tls_file_that_cannot_be_read_is_a_config_error_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "absent-ca.pem"
    settings = load_settings(
        env={}, flags={"etcd_endpoints": "https://h:2379", "etcd_tls_ca_file": str(missing)}
    )

    with pytest.raises(ConfigError, match=r"absent-ca\.pem"):
        etcd_options(settings).credentials()


def test_an_etcd_bridge_is_named_by_host_and_endpoints_so_a_restart_owns_its_keys() -> None:
    from workerset_admission.ownership import WRITER_HEADER, etcd_bridge_writer

    first = etcd_bridge_writer(["http://etcd-0:2379", "http://etcd-1:2379"])
    again = etcd_bridge_writer(["http://etcd-0:2379", "http://etcd-1:2379"])
    other = etcd_bridge_writer(["http://etcd-9:2379"])

    assert first == again
    assert first.owns({WRITER_HEADER: again.token})
    assert not first.owns({WRITER_HEADER: other.token})
    assert etcd_bridge_writer(["http://e:2379"], "rack-7").token == "bridge:rack-7"
