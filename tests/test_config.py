"""Settings: sources, precedence, validation, and secrets kept out of sight."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from workerset_admission.adapters.nats.connect import connect_options
from workerset_admission.errors import ConfigError
from workerset_admission.settings import (
    Settings,
    add_settings_arguments,
    flags_from_args,
    load_settings,
)

ENV = "WORKERSET_ADMISSION_"


def test_defaults_follow_the_documented_values() -> None:
    settings = load_settings(env={})
    assert settings.discovery_bucket == "dynamo-discovery"
    assert settings.admission_bucket == "frontend-model-admission"
    assert settings.reconcile_interval == 30.0
    assert settings.max_concurrent_builds == 8
    assert settings.retry_delays == (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)
    assert settings.embedded is True
    host, _, pid = settings.frontend_id.rpartition("-")
    assert host
    assert pid.isdigit()


def test_flags_beat_environment_which_beats_the_file(tmp_path: Path) -> None:
    config = tmp_path / "settings.toml"
    config.write_text(
        'discovery_bucket = "from-file"\n'
        'admission_bucket = "file-admission"\n'
        "reconcile_interval = 10\n"
        "[nats]\n"
        'servers = ["nats://file:4222"]\n'
    )
    env = {f"{ENV}DISCOVERY_BUCKET": "from-env", f"{ENV}RECONCILE_INTERVAL": "5"}
    settings = load_settings(
        env=env, config_file=config, flags={"discovery_bucket": "from-flag", "nats_user": None}
    )
    assert settings.discovery_bucket == "from-flag"
    assert settings.reconcile_interval == 5.0
    assert settings.admission_bucket == "file-admission"
    assert settings.nats_servers == ("nats://file:4222",)


def test_the_config_file_can_be_named_by_the_environment_and_be_json(tmp_path: Path) -> None:
    config = tmp_path / "settings.json"
    config.write_text(json.dumps({"nats_servers": ["nats://a:1", "tls://b:2"], "tracing": False}))
    settings = load_settings(env={f"{ENV}CONFIG_FILE": str(config)})
    assert settings.nats_servers == ("nats://a:1", "tls://b:2")
    assert settings.tracing is False
    assert settings.embedded is False


def test_environment_lists_and_booleans_are_parsed() -> None:
    settings = load_settings(
        env={
            f"{ENV}NATS_SERVERS": "nats://a:1, nats://b:2",
            f"{ENV}RETRY_DELAYS": "0.5,1,1",
            f"{ENV}METRICS": "off",
            f"{ENV}NAMESPACE_PREFIX_STRICT": "yes",
            "UNRELATED": "x",
        }
    )
    assert settings.nats_servers == ("nats://a:1", "nats://b:2")
    assert settings.retry_delays == (0.5, 1.0, 1.0)
    assert settings.metrics is False
    assert settings.namespace_prefix_strict is True


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"discovery_bucket": "bad.name"}, "discovery_bucket"),
        ({"nats_servers": "localhost:4222"}, "nats_servers"),
        ({"retry_delays": "4,2"}, "must not decrease"),
        ({"retry_delays": "0"}, "above 0"),
        ({"max_concurrent_builds": 0}, "max_concurrent_builds"),
        ({"reconcile_interval": -1}, "reconcile_interval"),
        ({"max_value_bytes": 10}, "max_value_bytes"),
        ({"prometheus_port": 70000}, "prometheus_port"),
        ({"log_format": "xml"}, "log_format"),
        ({"status_subject": "a..b"}, "status_subject"),
        ({"status_subject": "a.*"}, "status_subject"),
        ({"frontend_id": ""}, "frontend_id"),
        ({"namespace_filter_mode": "prefix"}, "needs a value"),
        ({"namespace_filter": "dgd"}, "namespace_filter_mode"),
        ({"nats_user": "u"}, "together"),
        ({"nats_tls_cert_file": "c.pem"}, "together"),
        ({"nats_token": "t", "nats_creds_file": "x.creds"}, "one NATS authentication"),
        ({"embedded_store_dir": "/tmp/x", "nats_servers": "nats://a:1"}, "embedded_store_dir"),
        ({"no_such_setting": 1}, "unknown setting"),
    ],
)
def test_invalid_settings_raise_a_config_error_naming_the_problem(
    overrides: dict[str, object], fragment: str
) -> None:
    with pytest.raises(ConfigError, match=fragment):
        load_settings(env={}, flags=overrides)


def test_errors_never_echo_a_rejected_secret() -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(env={f"{ENV}NATS_PASSWORD": "hunter2-secret"})
    assert "hunter2-secret" not in str(caught.value)
    assert "together" in str(caught.value)


def test_secrets_are_masked_in_repr_and_in_the_redacted_view() -> None:
    settings = load_settings(
        env={f"{ENV}NATS_USER": "svc", f"{ENV}NATS_PASSWORD": "hunter2-secret"}
    )
    assert "hunter2-secret" not in repr(settings)
    assert "hunter2-secret" not in json.dumps(settings.redacted())
    options = connect_options(settings, ["nats://127.0.0.1:4222"])
    assert options.password == "hunter2-secret"
    assert "hunter2-secret" not in repr(options)


def test_a_file_with_an_unknown_key_or_bad_syntax_is_refused(tmp_path: Path) -> None:
    typo = tmp_path / "typo.toml"
    typo.write_text("discovery_buckets = 'x'\n")
    with pytest.raises(ConfigError, match="discovery_buckets"):
        load_settings(env={}, config_file=typo)
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_settings(env={}, config_file=broken)
    with pytest.raises(ConfigError, match="cannot be read"):
        load_settings(env={}, config_file=tmp_path / "missing.toml")
    odd = tmp_path / "settings.yaml"
    odd.write_text("a: 1")
    with pytest.raises(ConfigError, match=r"\.toml or \.json"):
        load_settings(env={}, config_file=odd)


def test_command_line_flags_reach_the_settings_and_repeat_into_lists(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_settings_arguments(parser, ("frontend_id",))
    args = parser.parse_args(
        ["--nats-server", "nats://a:1", "--nats-server", "nats://b:2", "--frontend-id", "fe-1"]
    )
    settings = load_settings(env={f"{ENV}FRONTEND_ID": "from-env"}, flags=flags_from_args(args))
    assert settings.nats_servers == ("nats://a:1", "nats://b:2")
    assert settings.frontend_id == "fe-1"


def test_numeric_and_choice_flags_are_validated_like_every_other_source() -> None:
    parser = argparse.ArgumentParser()
    read = (
        "namespace_filter_mode",
        "namespace_filter",
        "reconcile_interval",
        "max_concurrent_builds",
    )
    add_settings_arguments(parser, read)
    args = parser.parse_args(
        [
            "--namespace-filter-mode",
            "prefix",
            "--namespace-filter",
            "dgd",
            "--reconcile-interval",
            "5",
        ]
    )
    settings = load_settings(env={}, flags=flags_from_args(args))
    assert (settings.namespace_filter_mode, settings.namespace_filter) == ("prefix", "dgd")
    assert settings.reconcile_interval == 5.0
    bad = parser.parse_args(["--max-concurrent-builds", "many"])
    with pytest.raises(ConfigError, match="max_concurrent_builds"):
        load_settings(env={}, flags=flags_from_args(bad))


def test_a_flag_is_offered_only_for_a_setting_that_has_one() -> None:
    with pytest.raises(ValueError, match="log_format"):
        add_settings_arguments(argparse.ArgumentParser(), ("discovery_bucket", "log_format"))


def test_settings_are_immutable() -> None:
    settings = Settings()
    with pytest.raises(ValueError, match="frozen"):
        settings.discovery_bucket = "other"  # type: ignore[misc]


def test_credentials_inside_server_urls_are_masked_wherever_settings_are_shown() -> None:
    from workerset_admission.adapters.nats.connect import servers_for_display

    settings = load_settings(
        flags={
            "nats_servers": ["nats://watcher:s3cret-pw@nats-0:4222", "nats://tok3n@nats-1:4222"]
        },
        env={},
    )
    shown = settings.redacted()["nats_servers"]
    assert shown == ("nats://***@nats-0:4222", "nats://***@nats-1:4222")
    text = servers_for_display(settings.nats_servers)
    assert "s3cret-pw" not in text
    assert "tok3n" not in text
    assert text == "nats://***@nats-0:4222, nats://***@nats-1:4222"
    assert servers_for_display(["nats://127.0.0.1:4222"]) == "nats://127.0.0.1:4222"


def test_serve_warns_only_when_its_own_dyn_file_kv_names_another_directory(
    tmp_path: Path,
) -> None:
    from workerset_admission.cli.serve import view_store_mismatch

    view = tmp_path / "view"
    view.mkdir()
    (tmp_path / "same").symlink_to(view)
    assert view_store_mismatch(view, {}) is None  # the frontend's environment is not serve's
    assert view_store_mismatch(view, {"DYN_FILE_KV": str(tmp_path / "same")}) is None
    said = view_store_mismatch(view, {"DYN_FILE_KV": str(tmp_path / "workers")})
    assert said is not None
    assert f"the view directory {view} is not DYN_FILE_KV={tmp_path / 'workers'}" in said
