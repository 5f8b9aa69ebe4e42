"""Security material and locked-down nats-server configurations, generated per test run.

Everything here is made fresh in a temporary folder: a private CA with server and client
certificates, passwords and tokens, user nkeys, and an operator/account/user JWT chain with a
``.creds`` file. The permission lists are the ones ``docs/security.md`` documents; the tests run
the plugin under exactly these lists, so the document and the tests cannot drift apart.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import hashlib
import ipaddress
import json
import secrets
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nkeys
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from workerset_admission.adapters.nats.embedded import EmbeddedNatsServer
from workerset_admission.keys import (
    ADMISSION_BUCKET,
    DISCOVERY_BUCKET,
    STATUS_SUBJECT,
    escape_token,
)

__all__ = [
    "Identity",
    "Permissions",
    "SecurityMaterial",
    "TlsFiles",
    "bridge_permissions",
    "configured_server",
    "contains_secret",
    "drain_permissions",
    "gate_permissions",
    "inbox_prefix",
    "operator_config",
    "plugin_permissions",
    "render_config",
    "status_permissions",
    "tls_config",
    "token_config",
    "users_config",
    "worker_permissions",
    "write_config",
]


@dataclass(frozen=True, slots=True)
class Permissions:
    """Publish and subscribe allow lists, the only shape the plugin and workers need."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    # Lets the user answer requests it received (status requests) without publish rights on
    # the requesters' reply subjects.
    allow_responses: bool = False

    def as_config(self) -> dict[str, Any]:
        config: dict[str, Any] = {
            "publish": {"allow": list(self.publish)},
            "subscribe": {"allow": list(self.subscribe)},
        }
        if self.allow_responses:
            config["allow_responses"] = True
        return config

    def as_jwt_claims(self) -> dict[str, Any]:
        claims: dict[str, Any] = {
            "pub": {"allow": list(self.publish)},
            "sub": {"allow": list(self.subscribe)},
        }
        if self.allow_responses:
            claims["resp"] = {"max": 1, "ttl": 0}
        return claims


def _stream(bucket: str) -> str:
    return f"KV_{bucket}"


def inbox_prefix(user: str) -> str:
    """The inbox prefix a tool connecting as ``user`` is given (``nats_inbox_prefix``).

    Outside ``_INBOX``, which Dynamo's workers keep (their user is granted ``_INBOX.>``), so no
    other documented user can subscribe to this user's replies and deliveries.
    """
    return f"_INBOX_{escape_token(user)}"


def _listing(stream: str) -> tuple[str, ...]:
    """Create the ordered consumers that read a bucket's stream, and nothing more.

    Only the form without a consumer name in the subject: the server names the consumer, and no
    user may create (or update), read or delete a consumer by name, so knowing another user's
    consumer name is worth nothing. An ordered consumer is removed by the server once its
    subscriber is gone, so nobody needs the right to delete one.
    """
    return (f"$JS.API.CONSUMER.CREATE.{stream}",)


def _reading(stream: str) -> tuple[str, ...]:
    """Bind a bucket, list it and read single keys, answering the listing's flow control."""
    return (
        f"$JS.API.STREAM.INFO.{stream}",
        *_listing(stream),
        f"$JS.API.DIRECT.GET.{stream}.>",
        f"$JS.API.STREAM.MSG.GET.{stream}",
        f"$JS.FC.{stream}.>",
    )


def plugin_permissions(
    discovery_bucket: str,
    admission_bucket: str,
    status_subject: str,
    *,
    frontend_id: str = "frontend-1",
) -> Permissions:
    """What the plugin needs: watch and read the discovery bucket, write its admission bucket.

    It writes only its own frontend's serving records (``v1.<frontend id>.``, escaped as a
    key token): a frontend cannot write, or delete, another frontend's records. Its replies and
    deliveries arrive under its own inbox prefix, and it hears when its watch consumer is
    deleted (the server's advisory), so it re-creates the consumer at once.

    Reading a KV bucket means creating ordered consumers on its stream and answering their flow
    control; writing means publishing to the bucket's ``$KV`` subjects; status requests arrive
    on the status subject and are answered as responses. Nothing here lets the plugin write
    discovery records or read any other stream.
    """
    disc = _stream(discovery_bucket)
    adm = _stream(admission_bucket)
    return Permissions(
        publish=(
            "$JS.API.INFO",
            *_reading(disc),
            f"$JS.API.STREAM.INFO.{adm}",
            f"$JS.API.DIRECT.GET.{adm}.>",
            f"$JS.API.STREAM.MSG.GET.{adm}",
            # Reading the peers' serving records when it starts or resyncs.
            *_listing(adm),
            f"$JS.FC.{adm}.>",
            f"$KV.{admission_bucket}.v1.{escape_token(frontend_id)}.>",
        ),
        subscribe=(
            f"{inbox_prefix(frontend_id)}.>",
            f"$JS.EVENT.ADVISORY.CONSUMER.DELETED.{disc}.*",
            status_subject,
            f"{status_subject}.*",
        ),
        allow_responses=True,
    )


def status_permissions(
    status_subject: str, admission_bucket: str = ADMISSION_BUCKET
) -> Permissions:
    """What ``workerset-admission status`` needs: send a request, read the reply, and read the
    serving records (to say where frontends disagree), nothing else."""
    adm = _stream(admission_bucket)
    return Permissions(
        publish=(
            status_subject,
            "$JS.API.INFO",
            f"$JS.API.STREAM.INFO.{adm}",
            *_listing(adm),
            f"$JS.FC.{adm}.>",
        ),
        subscribe=(f"{inbox_prefix('status')}.>",),
    )


def worker_permissions(discovery_bucket: str, namespace: str) -> Permissions:
    """What a worker of one namespace needs: write its own namespace's discovery records only.

    Dynamo's workers use the default inbox prefix ``_INBOX``; no tool of this project does.
    """
    disc = _stream(discovery_bucket)
    return Permissions(
        publish=(
            "$JS.API.INFO",
            f"$JS.API.STREAM.INFO.{disc}",
            f"$KV.{discovery_bucket}.v1.mdc.{namespace}.>",
            f"$KV.{discovery_bucket}.v1.instances.{namespace}.>",
        ),
        subscribe=("_INBOX.>",),
    )


def drain_permissions(discovery_bucket: str, admission_bucket: str, namespace: str) -> Permissions:
    """What ``drain``/``undrain`` for one namespace need: read both buckets, write its drains.

    It lists the discovery bucket (to find the worker) and the serving records (to answer
    "safe to stop"), and writes and withdraws drain records of its own namespace only: it
    cannot drain another namespace's workers or touch any worker's own records.
    """
    disc = _stream(discovery_bucket)
    adm = _stream(admission_bucket)
    return Permissions(
        publish=(
            "$JS.API.INFO",
            *_reading(disc),
            f"$KV.{discovery_bucket}.v1.drain.{escape_token(namespace)}.>",
            # Every model's drain budget: a model may be served from several namespaces, and
            # their drains must see one another (a drain takes no worker through it).
            f"$KV.{discovery_bucket}.v1.budget.>",
            f"$JS.API.STREAM.INFO.{adm}",
            *_listing(adm),
            f"$JS.FC.{adm}.>",
        ),
        subscribe=(f"{inbox_prefix(f'drain-{namespace}')}.>",),
    )


def gate_permissions(admission_bucket: str) -> Permissions:
    """What ``rollout`` needs (a CI job gating rollouts): read the serving records, nothing else."""
    adm = _stream(admission_bucket)
    return Permissions(
        publish=(
            "$JS.API.INFO",
            f"$JS.API.STREAM.INFO.{adm}",
            *_listing(adm),
            f"$JS.FC.{adm}.>",
        ),
        subscribe=(f"{inbox_prefix('rollout')}.>",),
    )


def bridge_permissions(discovery_bucket: str) -> Permissions:
    """What ``bridge`` needs: mirror the workers' records into the discovery bucket, nothing else.

    It writes worker records of every namespace (it mirrors the whole store Dynamo's workers
    registered in) but no drain record, reads the bucket back to heal it, and never touches the
    serving records.
    """
    disc = _stream(discovery_bucket)
    return Permissions(
        publish=(
            "$JS.API.INFO",
            *_reading(disc),
            f"$KV.{discovery_bucket}.v1.mdc.>",
            f"$KV.{discovery_bucket}.v1.instances.>",
            f"$KV.{discovery_bucket}.v1.event_sources.>",
            f"$KV.{discovery_bucket}.v1.event_channels.>",
        ),
        subscribe=(f"{inbox_prefix('bridge')}.>",),
    )


# --- secrets and keys -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Identity:
    """An nkey pair: ``seed`` is secret, ``public`` is what a server or a JWT names."""

    seed: str
    public: str

    @classmethod
    def generate(cls, prefix: int) -> Identity:
        seed = nkeys.encode_seed(secrets.token_bytes(32), prefix).decode()
        pair = nkeys.from_seed(seed.encode())
        return cls(seed=seed, public=pair.public_key.decode())

    def sign(self, data: bytes) -> bytes:
        return bytes(nkeys.from_seed(self.seed.encode()).sign(data))


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _sign_jwt(issuer: Identity, subject: str, name: str, nats_claims: Mapping[str, Any]) -> str:
    """A NATS v2 JWT, signed by hand with the issuer's ed25519 nkey.

    The ``jti`` is the base32 SHA-256 of the claims without it, as the NATS JWT library does; the
    server only needs it to be present and unique.
    """
    claims: dict[str, Any] = {
        "iat": int(datetime.datetime.now(tz=datetime.timezone.utc).timestamp()),
        "iss": issuer.public,
        "name": name,
        "sub": subject,
        "nats": dict(nats_claims),
    }
    digest = hashlib.sha256(json.dumps(claims, sort_keys=True).encode()).digest()
    claims["jti"] = base64.b32encode(digest).rstrip(b"=").decode()
    header = _b64url(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}).encode())
    payload = _b64url(json.dumps(claims).encode())
    signing_input = f"{header}.{payload}".encode()
    return f"{header}.{payload}.{_b64url(issuer.sign(signing_input))}"


def _creds_text(user_jwt: str, user_seed: str) -> str:
    return (
        "-----BEGIN NATS USER JWT-----\n"
        f"{user_jwt}\n"
        "------END NATS USER JWT------\n\n"
        "-----BEGIN USER NKEY SEED-----\n"
        f"{user_seed}\n"
        "------END USER NKEY SEED------\n"
    )


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """PEM files of a private CA, a server certificate for loopback, and a client certificate."""

    ca_file: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    stranger_cert: Path
    stranger_key: Path


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _certificate(
    subject_cn: str,
    key: ec.EllipticCurvePrivateKey,
    issuer_cn: str,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool = False,
    server: bool = False,
) -> x509.Certificate:
    now = datetime.datetime.now(tz=datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject_cn)]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer_cn)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    elif server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        ).add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    else:
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
    return builder.sign(issuer_key, hashes.SHA256())


def _write(path: Path, data: bytes | str, *, secret: bool = False) -> Path:
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    if secret:
        path.chmod(0o600)
    return path


def _make_tls(folder: Path) -> TlsFiles:
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = _certificate(
        "workerset-admission test CA", ca_key, "workerset-admission test CA", ca_key, ca=True
    )
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = _certificate(
        "localhost", server_key, "workerset-admission test CA", ca_key, server=True
    )
    client_key = ec.generate_private_key(ec.SECP256R1())
    client_cert = _certificate(
        "workerset-admission", client_key, "workerset-admission test CA", ca_key
    )
    # A client certificate from a CA the server does not trust: must be refused.
    other_ca_key = ec.generate_private_key(ec.SECP256R1())
    stranger_key = ec.generate_private_key(ec.SECP256R1())
    stranger_cert = _certificate("stranger", stranger_key, "some other CA", other_ca_key)
    pem = serialization.Encoding.PEM
    return TlsFiles(
        ca_file=_write(folder / "ca.pem", ca_cert.public_bytes(pem)),
        server_cert=_write(folder / "server.pem", server_cert.public_bytes(pem)),
        server_key=_write(folder / "server-key.pem", _key_pem(server_key), secret=True),
        client_cert=_write(folder / "client.pem", client_cert.public_bytes(pem)),
        client_key=_write(folder / "client-key.pem", _key_pem(client_key), secret=True),
        stranger_cert=_write(folder / "stranger.pem", stranger_cert.public_bytes(pem)),
        stranger_key=_write(folder / "stranger-key.pem", _key_pem(stranger_key), secret=True),
    )


_ACCOUNT_LIMITS = {
    "subs": -1,
    "data": -1,
    "payload": -1,
    "imports": -1,
    "exports": -1,
    "wildcards": True,
    "conn": -1,
    "leaf": -1,
    # JetStream is enabled for an account only when it is given storage.
    "mem_storage": -1,
    "disk_storage": -1,
    "streams": -1,
    "consumer": -1,
}


@dataclass(frozen=True, slots=True)
class SecurityMaterial:
    """Every secret one test run needs, each different from the others and from any other run.

    ``secrets()`` lists the strings that must never show up in logs, traces or output.
    """

    folder: Path
    plugin_password: str
    admin_password: str
    worker_password: str
    token: str
    plugin_nkey: Identity
    plugin_nkey_file: Path
    operator: Identity
    account: Identity
    system_account: Identity
    plugin_user: Identity
    admin_user: Identity
    operator_jwt: str
    account_jwt: str
    system_account_jwt: str
    plugin_creds: Path
    admin_creds: Path
    tls: TlsFiles

    @classmethod
    def generate(
        cls,
        folder: Path,
        *,
        discovery_bucket: str,
        admission_bucket: str,
        status_subject: str,
    ) -> SecurityMaterial:
        folder.mkdir(parents=True, exist_ok=True)
        operator = Identity.generate(nkeys.PREFIX_BYTE_OPERATOR)
        account = Identity.generate(nkeys.PREFIX_BYTE_ACCOUNT)
        system_account = Identity.generate(nkeys.PREFIX_BYTE_ACCOUNT)
        plugin_user = Identity.generate(nkeys.PREFIX_BYTE_USER)
        admin_user = Identity.generate(nkeys.PREFIX_BYTE_USER)
        plugin_nkey = Identity.generate(nkeys.PREFIX_BYTE_USER)

        operator_jwt = _sign_jwt(
            operator,
            operator.public,
            "test-operator",
            {"type": "operator", "version": 2, "system_account": system_account.public},
        )
        account_jwt = _sign_jwt(
            operator,
            account.public,
            "dynamo",
            {"type": "account", "version": 2, "limits": _ACCOUNT_LIMITS},
        )
        system_account_jwt = _sign_jwt(
            operator,
            system_account.public,
            "SYS",
            {"type": "account", "version": 2, "limits": {"conn": -1, "subs": -1}},
        )
        perms = plugin_permissions(discovery_bucket, admission_bucket, status_subject)
        plugin_jwt = _sign_jwt(
            account,
            plugin_user.public,
            "workerset-admission",
            {
                "type": "user",
                "version": 2,
                "issuer_account": account.public,
                "subs": -1,
                "data": -1,
                "payload": -1,
                **perms.as_jwt_claims(),
            },
        )
        admin_jwt = _sign_jwt(
            account,
            admin_user.public,
            "admin",
            {"type": "user", "version": 2, "subs": -1, "data": -1, "payload": -1},
        )
        return cls(
            folder=folder,
            plugin_password=secrets.token_urlsafe(18),
            admin_password=secrets.token_urlsafe(18),
            worker_password=secrets.token_urlsafe(18),
            token=secrets.token_urlsafe(24),
            plugin_nkey=plugin_nkey,
            plugin_nkey_file=_write(folder / "plugin.nk", plugin_nkey.seed + "\n", secret=True),
            operator=operator,
            account=account,
            system_account=system_account,
            plugin_user=plugin_user,
            admin_user=admin_user,
            operator_jwt=operator_jwt,
            account_jwt=account_jwt,
            system_account_jwt=system_account_jwt,
            plugin_creds=_write(
                folder / "plugin.creds", _creds_text(plugin_jwt, plugin_user.seed), secret=True
            ),
            admin_creds=_write(
                folder / "admin.creds", _creds_text(admin_jwt, admin_user.seed), secret=True
            ),
            tls=_make_tls(folder),
        )

    def secrets(self) -> tuple[str, ...]:
        """Strings that must never appear in any log, trace, status output or error text."""
        return (
            self.plugin_password,
            self.admin_password,
            self.worker_password,
            self.token,
            self.plugin_nkey.seed,
            self.plugin_user.seed,
            self.admin_user.seed,
            self.operator.seed,
            self.account.seed,
            self.tls.client_key.read_text().splitlines()[1],
        )


# --- server configurations ---------------------------------------------------------------------


# Host, port and JetStream store come from the launcher's command line (loopback, a free port, a
# temporary store); a configuration file only adds authentication and permissions.


def render_config(value: Mapping[str, Any]) -> str:
    """nats-server reads JSON as configuration; keys starting with ``$`` are quoted by JSON."""
    return json.dumps(value, indent=2)


def write_config(folder: Path, name: str, value: Mapping[str, Any]) -> Path:
    """Write a configuration file readable only by its owner (it holds secrets)."""
    return _write(folder / f"{name}.conf", render_config(value), secret=True)


def users_config(
    material: SecurityMaterial,
    *,
    discovery_bucket: str = DISCOVERY_BUCKET,
    admission_bucket: str = ADMISSION_BUCKET,
    status_subject: str = STATUS_SUBJECT,
    worker_namespaces: Iterable[str],
) -> dict[str, Any]:
    """Password and nkey users: the plugin (both ways), one worker per namespace, an admin.

    Worker users are named ``worker-<namespace>``, the drain tools' ``drain-<namespace>``, and
    share ``material.worker_password``; the ``status`` command's user is ``status-reader``, the
    bridge's ``bridge`` and the rollout gate's ``rollout``, with the same password. Each tool's
    inbox prefix is :func:`inbox_prefix` of its user (``status`` for the status reader).
    """
    perms = plugin_permissions(discovery_bucket, admission_bucket, status_subject).as_config()
    users: list[dict[str, Any]] = [
        {"user": "workerset-admission", "password": material.plugin_password, "permissions": perms},
        {"nkey": material.plugin_nkey.public, "permissions": perms},
        # A second frontend's user, to show one frontend cannot write another's records.
        {
            "user": "workerset-admission-2",
            "password": material.plugin_password,
            "permissions": plugin_permissions(
                discovery_bucket, admission_bucket, status_subject, frontend_id="frontend-2"
            ).as_config(),
        },
        {"user": "admin", "password": material.admin_password},
        {
            "user": "status-reader",
            "password": material.worker_password,
            "permissions": status_permissions(status_subject, admission_bucket).as_config(),
        },
        {
            "user": "bridge",
            "password": material.worker_password,
            "permissions": bridge_permissions(discovery_bucket).as_config(),
        },
        {
            "user": "rollout",
            "password": material.worker_password,
            "permissions": gate_permissions(admission_bucket).as_config(),
        },
    ]
    for ns in worker_namespaces:
        users.append(
            {
                "user": f"worker-{ns}",
                "password": material.worker_password,
                "permissions": worker_permissions(discovery_bucket, ns).as_config(),
            }
        )
        users.append(
            {
                "user": f"drain-{ns}",
                "password": material.worker_password,
                "permissions": drain_permissions(
                    discovery_bucket, admission_bucket, ns
                ).as_config(),
            }
        )
    return {"authorization": {"users": users}}


def token_config(material: SecurityMaterial) -> dict[str, Any]:
    """A single shared token: the simplest method, with no per-user permissions."""
    return {"authorization": {"token": material.token}}


def operator_config(material: SecurityMaterial) -> dict[str, Any]:
    """Decentralized JWT auth with an in-memory resolver preloaded with both accounts."""
    return {
        "operator": material.operator_jwt,
        "system_account": material.system_account.public,
        "resolver": "MEMORY",
        "resolver_preload": {
            material.account.public: material.account_jwt,
            material.system_account.public: material.system_account_jwt,
        },
    }


def tls_config(material: SecurityMaterial) -> dict[str, Any]:
    """Mutual TLS: the server insists on a client certificate from the test CA."""
    tls = material.tls
    return {
        "tls": {
            "cert_file": str(tls.server_cert),
            "key_file": str(tls.server_key),
            "ca_file": str(tls.ca_file),
            "verify": True,
            "timeout": 2,
        },
    }


@contextlib.contextmanager
def configured_server(
    folder: Path, config: Mapping[str, Any], name: str = "server"
) -> Iterator[EmbeddedNatsServer]:
    """A loopback server on a free port, with a temporary store and this auth configuration."""
    conf = write_config(folder, name, config)
    with EmbeddedNatsServer(folder / f"{name}-store", extra_args=("-c", str(conf))) as server:
        yield server


def contains_secret(text: str, material_secrets: Sequence[str]) -> list[str]:
    """Which of the given secrets occur in ``text`` (an empty list is the only good answer)."""
    return [s for s in material_secrets if s and s in text]
