"""Settings from defaults, a config file, environment variables and command-line flags.

Precedence, lowest to highest: defaults < file (TOML or JSON) < environment
(``WORKERSET_ADMISSION_<SETTING>``) < flags. Every setting is validated once, here; an invalid
one raises :class:`~workerset_admission.errors.ConfigError` naming the setting and the rule,
never echoing the rejected value (it may be a secret).

A config file holds the settings by name, flat or grouped one level deep: ``[nats]`` with
``servers = [...]`` is the same as ``nats_servers = [...]``.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import itertools
import json
import logging
import os
import re
import socket
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from workerset_admission.admission import CoreSettings
from workerset_admission.discovery_paths import parse_endpoints
from workerset_admission.errors import ConfigError
from workerset_admission.keys import ADMISSION_BUCKET, DISCOVERY_BUCKET, STATUS_SUBJECT

__all__ = [
    "CONFIG_FILE_ENV",
    "CONNECTION_SETTINGS",
    "ENV_PREFIX",
    "FLAGGED_SETTINGS",
    "FlagSpec",
    "Settings",
    "add_settings_arguments",
    "default_frontend_id",
    "flags_from_args",
    "load_settings",
    "mask_url",
    "unknown_environment",
]

ENV_PREFIX = "WORKERSET_ADMISSION_"
_log = logging.getLogger(__name__)
CONFIG_FILE_ENV = f"{ENV_PREFIX}CONFIG_FILE"

_BUCKET_NAME = re.compile(r"^[A-Za-z0-9_-]+$")
_SUBJECT_TOKEN = re.compile(r"^[^\s.*>]+$")
# The core's defaults are Dynamo 1.6.1's, written once in the core; every setting that feeds the
# core takes its default from there.
_CORE = CoreSettings()


def mask_url(url: str) -> str:
    """Return ``url`` with any user, password or token in it masked, for messages."""
    scheme, sep, rest = url.rpartition("://")
    userinfo, at, host = rest.rpartition("@")
    return f"{scheme}{sep}***@{host}" if at and userinfo else url


def default_frontend_id() -> str:
    """Return ``<hostname>-<pid>``: unique per process on one host, readable in a bucket."""
    return f"{socket.gethostname() or 'frontend'}-{os.getpid()}"


class Settings(BaseModel):
    """Everything the plugin can be told; secrets are :class:`pydantic.SecretStr`."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)

    # NATS connection. No servers means: run an embedded nats-server.
    nats_servers: tuple[str, ...] = ()
    nats_user: str | None = None
    nats_password: SecretStr | None = None
    nats_token: SecretStr | None = None
    nats_nkey_seed_file: Path | None = None
    nats_creds_file: Path | None = None
    nats_tls_ca_file: Path | None = None
    nats_tls_cert_file: Path | None = None
    nats_tls_key_file: Path | None = None
    nats_tls_hostname: str | None = None
    # The subjects this client's replies and deliveries arrive on (nats-py's ``inbox_prefix``):
    # give each user a prefix of its own, outside ``_INBOX``, and grant it only ``<prefix>.>``,
    # so no other client can read them.
    nats_inbox_prefix: str = "_INBOX"
    embedded_store_dir: Path | None = None

    # Dynamo's etcd discovery store, read by ``bridge`` (no endpoints: the file store is read).
    etcd_endpoints: tuple[str, ...] = ()
    etcd_user: str | None = None
    etcd_password: SecretStr | None = None
    etcd_tls_ca_file: Path | None = None
    etcd_tls_cert_file: Path | None = None
    etcd_tls_key_file: Path | None = None

    # Buckets and subjects.
    discovery_bucket: str = DISCOVERY_BUCKET
    admission_bucket: str = ADMISSION_BUCKET
    # Replicas of the buckets this plugin creates: 1 for a single server, 3 on a cluster. An
    # existing bucket is never changed; a different value is only reported.
    bucket_replicas: int = Field(default=1, ge=1, le=5)
    status_subject: str = STATUS_SUBJECT

    # Which worker namespaces this frontend serves (Dynamo's namespace filter).
    namespace_filter_mode: Literal["global", "exact", "prefix"] = "global"
    namespace_filter: str | None = None
    namespace_prefix_strict: bool = False

    # Tokenizer overrides applied at the discovery boundary (not part of the checksum).
    tokenizer_backend: str | None = None
    tokenizer_fallback: bool | None = None
    # The Dynamo line of the frontend the admitted records feed: the boundary refuses what
    # that frontend would refuse. Inside the frontend the installed release decides (a set
    # value that disagrees with it is reported and overruled); for serve it is this setting.
    dynamo_version: Literal["1.6", "1.7"] = "1.6"

    # Limits.
    max_concurrent_builds: int = Field(default=_CORE.max_concurrent_builds, ge=1, le=1024)
    retry_delays: tuple[float, ...] = _CORE.retry_delays
    max_value_bytes: int = Field(default=1024 * 1024, ge=256, le=64 * 1024 * 1024)
    reconcile_interval: float = Field(default=30.0, gt=0, le=86400)
    # The TTL workers register with (Dynamo's default 10 s): a live worker, or the bridge
    # mirroring it, re-writes its record within it. It sizes the tenure hold, and how long a
    # held tenure keeps serving its members on their last known records.
    registration_ttl: float = Field(default=_CORE.registration_ttl, gt=0, le=3600)
    # How long a tenure is held when a resync after a lost connection lists none of its
    # workers (0 turns holding off); unset means three registration TTLs.
    tenure_hold: float | None = Field(default=None, ge=0, le=86400)
    # Refused records kept for status; the serving records are rewritten at most every
    # publish_interval seconds (like Dynamo's publisher), and a failed write is retried after
    # publish_retry.
    invalid_history: int = Field(default=100, ge=1, le=100_000)
    publish_interval: float = Field(default=0.2, ge=0, le=60)
    publish_retry: float = Field(default=1.0, gt=0, le=600)

    frontend_id: str = Field(default_factory=default_frontend_id)

    # Write the admitted discovery view here: the Dynamo frontend's DYN_FILE_KV directory.
    view_dir: Path | None = None
    # How long the frontend keeps the last view after its writer died, stalled or stopped
    # (fail static); past it the frontend's file store expires the view. 10 s is the store's
    # own expiry (fail closed at once); at most a week.
    view_horizon: float = Field(default=600.0, ge=10, le=7 * 86400)
    # Write every discovery event this frontend observes, and its build results, to this
    # file as a replay trace (what ``replay`` needs to reach the frontend's own decisions).
    trace_out: Path | None = None

    # Telemetry switches; exporters are wired only when asked for.
    tracing: bool = True
    metrics: bool = True
    log_format: Literal["plain", "json"] = "plain"
    # Install the OpenTelemetry SDK with the exporters the OTEL_* environment chooses.
    telemetry: bool = False
    # Serve the metrics for Prometheus on this port (alone enough: no OTLP export needed).
    prometheus_port: int | None = Field(default=None, ge=0, le=65535)
    prometheus_host: str = "127.0.0.1"
    # serve's liveness and readiness endpoints for a supervisor's probes (default off).
    health_port: int | None = Field(default=None, ge=0, le=65535)
    health_host: str = "127.0.0.1"

    @field_validator("nats_servers", "etcd_endpoints", mode="before")
    @classmethod
    def _split_servers(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("nats_servers")
    @classmethod
    def _check_servers(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for url in value:
            scheme, sep, rest = url.partition("://")
            if not sep or scheme not in ("nats", "tls", "ws", "wss") or not rest:
                raise ValueError("each server must be a nats://, tls://, ws:// or wss:// URL")
        return value

    @field_validator("etcd_endpoints")
    @classmethod
    def _check_etcd_endpoints(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if value:
            try:
                parse_endpoints(value)
            except ConfigError as exc:
                raise ValueError(str(exc)) from None
        return value

    @field_validator("retry_delays", mode="before")
    @classmethod
    def _split_delays(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("retry_delays")
    @classmethod
    def _check_delays(cls, value: tuple[float, ...]) -> tuple[float, ...]:
        if not 1 <= len(value) <= 32:
            raise ValueError("between 1 and 32 delays are required")
        if any(not 0 < d <= 3600 for d in value):
            raise ValueError("each delay must be above 0 and at most 3600 seconds")
        if any(b < a for a, b in itertools.pairwise(value)):
            raise ValueError("delays must not decrease")
        return value

    @field_validator("discovery_bucket", "admission_bucket")
    @classmethod
    def _check_bucket(cls, value: str) -> str:
        if not _BUCKET_NAME.match(value):
            raise ValueError("a bucket name uses only letters, digits, '_' and '-'")
        return value

    @field_validator("status_subject", "nats_inbox_prefix")
    @classmethod
    def _check_subject(cls, value: str) -> str:
        if len(value) > 255 or not all(_SUBJECT_TOKEN.match(t) for t in value.split(".")):
            raise ValueError(
                "a subject is dot-separated non-empty tokens without spaces or wildcards"
            )
        return value

    @field_validator("frontend_id")
    @classmethod
    def _check_frontend_id(cls, value: str) -> str:
        if not value or len(value) > 128 or not value.isprintable():
            raise ValueError("the frontend id must be 1 to 128 printable characters")
        return value

    @model_validator(mode="after")
    def _check_combinations(self) -> Settings:
        if (self.nats_user is None) != (self.nats_password is None):
            raise ValueError("nats_user and nats_password must be given together")
        if (self.nats_tls_cert_file is None) != (self.nats_tls_key_file is None):
            raise ValueError("nats_tls_cert_file and nats_tls_key_file must be given together")
        if (self.etcd_user is None) != (self.etcd_password is None):
            raise ValueError("etcd_user and etcd_password must be given together")
        if (self.etcd_tls_cert_file is None) != (self.etcd_tls_key_file is None):
            raise ValueError("etcd_tls_cert_file and etcd_tls_key_file must be given together")
        methods = [
            name
            for name, given in (
                ("user/password", self.nats_user is not None),
                ("token", self.nats_token is not None),
                ("nkey", self.nats_nkey_seed_file is not None),
                ("creds", self.nats_creds_file is not None),
            )
            if given
        ]
        if len(methods) > 1:
            raise ValueError(f"choose one NATS authentication method, not {' and '.join(methods)}")
        if self.namespace_filter_mode == "global" and self.namespace_filter:
            raise ValueError("namespace_filter needs namespace_filter_mode 'exact' or 'prefix'")
        if self.namespace_filter_mode != "global" and not self.namespace_filter:
            raise ValueError(f"namespace_filter_mode '{self.namespace_filter_mode}' needs a value")
        if self.nats_servers and self.embedded_store_dir is not None:
            raise ValueError("embedded_store_dir applies only when no nats_servers are set")
        return self

    @property
    def effective_tenure_hold(self) -> float:
        """The tenure hold in seconds: as set, or three registration TTLs."""
        return 3 * self.registration_ttl if self.tenure_hold is None else self.tenure_hold

    def core_settings(self) -> CoreSettings:
        """Return the core's parameters, from these settings."""
        return CoreSettings(
            max_concurrent_builds=self.max_concurrent_builds,
            retry_delays=tuple(self.retry_delays),
            tenure_hold=self.effective_tenure_hold,
            registration_ttl=self.registration_ttl,
        )

    @property
    def prometheus_address(self) -> tuple[str, int] | None:
        """Where to serve the Prometheus endpoint, or None when no port is set."""
        if self.prometheus_port is None:
            return None
        return (self.prometheus_host, self.prometheus_port)

    @property
    def embedded(self) -> bool:
        """Tell whether an embedded nats-server should be started (no servers configured)."""
        return not self.nats_servers

    def redacted(self) -> dict[str, Any]:
        """Return the settings as plain data with every secret masked, for display."""
        shown: dict[str, Any] = {}
        for name in type(self).model_fields:
            value = getattr(self, name)
            if isinstance(value, SecretStr):
                value = "**********"
            elif name == "nats_servers":
                value = tuple(mask_url(url) for url in value)
            elif isinstance(value, Path):
                value = str(value)
            shown[name] = value
        return shown


_FIELDS = frozenset(Settings.model_fields)
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def _env_settings(env: Mapping[str, str]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for name, raw in env.items():
        if not name.startswith(ENV_PREFIX):
            continue
        field = name[len(ENV_PREFIX) :].lower()
        if field not in _FIELDS:
            # Other tools share the prefix (the config-file variable, for one): not ours.
            continue
        annotation = str(Settings.model_fields[field].annotation)
        if "bool" in annotation and raw.strip().lower() in _TRUE | _FALSE:
            found[field] = raw.strip().lower() in _TRUE
        elif raw.strip() == "" and "None" in annotation:
            found[field] = None
        else:
            found[field] = raw
    return found


# Variables with the prefix that are read elsewhere, not settings: the settings file, where a
# local serve announces itself, and the test suite's own choices.
OTHER_VARIABLES = frozenset(
    f"{ENV_PREFIX}{name}"
    for name in (
        "CONFIG_FILE",
        "SERVE_FILE",
        "NATS",
        "NATS_IMAGE",
        "ETCD_BIN",
        "ENGINE_DIR",
        "RUN_PHOENIX",
    )
)


def unknown_environment(env: Mapping[str, str] | None = None) -> list[str]:
    """Name every ``WORKERSET_ADMISSION_*`` variable that no setting reads, with a guess.

    A misspelled variable would otherwise be ignored in silence, and the setting it meant would
    keep its default (``..._NATS_SERVER`` for ``..._NATS_SERVERS`` starts an embedded server).
    """
    environ = os.environ if env is None else env
    known = {f"{ENV_PREFIX}{field.upper()}" for field in _FIELDS} | OTHER_VARIABLES
    said = []
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX) or name in known:
            continue
        close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.8)
        hint = f" (did you mean {close[0]}?)" if close else ""
        said.append(f"unknown environment variable {name} is ignored{hint}")
    return said


def _flatten(data: Mapping[str, Any], source: str) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        name = str(key).replace("-", "_")
        if isinstance(value, Mapping):
            for inner, inner_value in value.items():
                flat[f"{name}_{str(inner).replace('-', '_')}"] = inner_value
        else:
            flat[name] = value
    unknown = sorted(set(flat) - _FIELDS)
    if unknown:
        raise ConfigError(f"{source}: unknown setting(s): {', '.join(unknown)}")
    return flat


def _toml_loads(text: str) -> Any:
    # tomllib is standard from 3.11; on 3.10 its backport, tomli, is a dependency.
    module = importlib.import_module("tomllib" if sys.version_info >= (3, 11) else "tomli")
    return module.loads(text)


def _file_settings(path: Path) -> dict[str, Any]:
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"config file {path}: cannot be read ({exc.strerror})") from exc
    suffix = path.suffix.lower()
    try:
        if suffix == ".json":
            data = json.loads(text)
        elif suffix == ".toml":
            data = _toml_loads(text.decode("utf-8"))
        else:
            raise ConfigError(f"config file {path}: use a .toml or .json file")
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path}: not valid {suffix[1:].upper()}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: the top level must be a table/object")
    return _flatten(data, f"config file {path}")


def _describe(error: ValidationError) -> str:
    lines = []
    for item in error.errors(include_input=False, include_url=False):
        where = ".".join(str(p) for p in item["loc"]) or "settings"
        message = str(item["msg"]).removeprefix("Value error, ")
        lines.append(f"{where}: {message}")
    return "invalid settings: " + "; ".join(lines)


def load_settings(
    *,
    flags: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    config_file: Path | str | None = None,
) -> Settings:
    """Merge defaults, file, environment and flags (highest wins) and validate once.

    ``env`` defaults to ``os.environ``. The file comes from ``config_file``, else from the
    ``WORKERSET_ADMISSION_CONFIG_FILE`` variable, else there is none.
    """
    environ = os.environ if env is None else env
    merged: dict[str, Any] = {}
    path = config_file if config_file is not None else environ.get(CONFIG_FILE_ENV) or None
    if path is not None:
        merged.update(_file_settings(Path(path)))
    merged.update(_env_settings(environ))
    for warning in unknown_environment(environ):
        _log.warning("%s", warning)
    if flags:
        given = {k: v for k, v in flags.items() if v is not None}
        unknown = sorted(set(given) - _FIELDS)
        if unknown:
            raise ConfigError(f"unknown setting(s): {', '.join(unknown)}")
        merged.update(given)
    try:
        return Settings(**merged)
    except ValidationError as exc:
        raise ConfigError(_describe(exc)) from None


# A settings flag: (flag, setting, help, argparse keyword arguments).
FlagSpec = tuple[str, str, str, dict[str, Any]]

# How every command that connects reaches NATS (and the settings file that may say so).
_CONNECTION_FLAGS: tuple[FlagSpec, ...] = (
    ("--config", "config_file", "a TOML or JSON settings file", {}),
    ("--nats-server", "nats_servers", "NATS server URL (repeat for several)", {"action": "append"}),
    ("--nats-user", "nats_user", "NATS user name", {}),
    ("--nats-password", "nats_password", "NATS password (prefer the environment)", {}),
    ("--nats-token", "nats_token", "NATS token (prefer the environment)", {}),
    ("--nats-nkey-seed-file", "nats_nkey_seed_file", "file holding an nkey seed", {}),
    ("--nats-creds-file", "nats_creds_file", "NATS .creds file (JWT and seed)", {}),
    ("--nats-tls-ca-file", "nats_tls_ca_file", "CA bundle for the server certificate", {}),
    ("--nats-tls-cert-file", "nats_tls_cert_file", "client certificate (mutual TLS)", {}),
    ("--nats-tls-key-file", "nats_tls_key_file", "client key (mutual TLS)", {}),
    ("--nats-tls-hostname", "nats_tls_hostname", "server name to verify", {}),
    (
        "--nats-inbox-prefix",
        "nats_inbox_prefix",
        "subject prefix of this client's replies (the one its NATS user may subscribe to)",
        {},
    ),
)

# Every other setting that has a flag; a command shows the flags of the settings it reads.
_SETTING_FLAGS: tuple[FlagSpec, ...] = (
    ("--discovery-bucket", "discovery_bucket", "discovery KV bucket", {}),
    ("--admission-bucket", "admission_bucket", "admission-record KV bucket", {}),
    (
        "--bucket-replicas",
        "bucket_replicas",
        "replicas of buckets created here (1; 3 on a cluster)",
        {"type": int},
    ),
    ("--frontend-id", "frontend_id", "this frontend's identity (default hostname-pid)", {}),
    ("--status-subject", "status_subject", "NATS subject answering status requests", {}),
    (
        "--namespace-filter-mode",
        "namespace_filter_mode",
        "which worker namespaces to serve",
        {"choices": ("global", "exact", "prefix")},
    ),
    ("--namespace-filter", "namespace_filter", "the namespace or prefix to serve", {}),
    ("--tokenizer-backend", "tokenizer_backend", "tokenizer backend override", {}),
    (
        "--dynamo-version",
        "dynamo_version",
        "Dynamo line of the frontend fed (1.6 or 1.7): refuse the cards it would refuse",
        {"choices": ("1.6", "1.7")},
    ),
    ("--reconcile-interval", "reconcile_interval", "seconds between full re-listings", {}),
    ("--max-value-bytes", "max_value_bytes", "largest discovery value accepted", {}),
    ("--max-concurrent-builds", "max_concurrent_builds", "pipeline builds at once", {}),
    ("--registration-ttl", "registration_ttl", "TTL workers register with (seconds)", {}),
    (
        "--tenure-hold",
        "tenure_hold",
        "seconds a tenure is held after an outage (default 3 registration TTLs; 0 off)",
        {},
    ),
    (
        "--prometheus-port",
        "prometheus_port",
        "serve Prometheus metrics on this port (0 picks a free one; default off)",
        {"type": int},
    ),
    ("--prometheus-host", "prometheus_host", "address of the Prometheus endpoint", {}),
    (
        "--health-port",
        "health_port",
        "serve /livez and /readyz for a supervisor's probes on this port (0 picks a free "
        "one; default off)",
        {"type": int},
    ),
    ("--health-host", "health_host", "address of the health endpoints", {}),
    (
        "--view-dir",
        "view_dir",
        "write the admitted discovery view here for a Dynamo frontend on --discovery-backend "
        "file (its DYN_FILE_KV)",
        {"type": Path},
    ),
    (
        "--view-horizon",
        "view_horizon",
        "seconds the frontend keeps the last view after this writer died or stalled "
        "(default 600; 10 drops it as soon as the file store would)",
        {},
    ),
    (
        "--trace-out",
        "trace_out",
        "record what this frontend observes (every discovery event, build result and the "
        "clock) to this file as a replay trace",
        {"type": Path},
    ),
    (
        "--etcd",
        "etcd_endpoints",
        "read Dynamo's etcd at URL[,URL] (http:// or https://) instead of its file store",
        {},
    ),
    ("--etcd-user", "etcd_user", "etcd user name", {}),
    ("--etcd-password", "etcd_password", "etcd password (prefer the environment)", {}),
    ("--etcd-tls-ca-file", "etcd_tls_ca_file", "CA bundle for etcd's certificate", {}),
    ("--etcd-tls-cert-file", "etcd_tls_cert_file", "client certificate for etcd (mutual TLS)", {}),
    ("--etcd-tls-key-file", "etcd_tls_key_file", "client key for etcd (mutual TLS)", {}),
)

CONNECTION_SETTINGS: tuple[str, ...] = tuple(spec[1] for spec in _CONNECTION_FLAGS[1:])
"""The settings behind the connection flags (``--config`` names a file, not a setting)."""
FLAGGED_SETTINGS: tuple[str, ...] = CONNECTION_SETTINGS + tuple(s[1] for s in _SETTING_FLAGS)
"""Every setting a flag can give."""


def add_settings_arguments(parser: argparse.ArgumentParser, settings: Sequence[str] = ()) -> None:
    """Add the NATS connection flags and the flags of ``settings`` to a subcommand parser."""
    by_setting = {spec[1]: spec for spec in _SETTING_FLAGS}
    unknown = [name for name in settings if name not in by_setting]
    if unknown:
        raise ValueError(f"no flag for the settings {unknown}")
    groups = (
        ("NATS connection (overrides environment and config file)", _CONNECTION_FLAGS),
        (
            "settings (override environment and config file)",
            tuple(by_setting[name] for name in settings),
        ),
    )
    for title, specs in groups:
        if not specs:
            continue
        group = parser.add_argument_group(title)
        for flag, dest, help_text, extra in specs:
            group.add_argument(flag, dest=dest, help=help_text, default=None, **extra)


def flags_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """Return the settings given as flags (unset flags are left out)."""
    flags: dict[str, Any] = {}
    for _flag, dest, _help, _extra in (*_CONNECTION_FLAGS[1:], *_SETTING_FLAGS):
        if getattr(args, dest, None) is not None:
            value = getattr(args, dest)
            # Repeated flags and comma-separated lists mean the same thing.
            flags[dest] = ",".join(value) if isinstance(value, list) else value
    return flags
