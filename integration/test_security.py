"""Least privilege against a real nats-server: the plugin's documented permissions are enough.

Each server here is configured with exactly the permission lists of ``docs/security.md`` (built
by ``secfixture``); the plugin's adapters run under them, workers get per-namespace rights, and
every authentication method the settings offer is exercised.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import re
import ssl
import subprocess
import sys
import warnings
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client as NatsClient
from nats.js.api import KeyValueConfig
from nats.js.kv import KeyValue
from secfixture import (
    SecurityMaterial,
    configured_server,
    contains_secret,
    drain_permissions,
    operator_config,
    plugin_permissions,
    tls_config,
    token_config,
    users_config,
    worker_permissions,
)
from workerset_admission.adapters.nats.connect import NatsConnectOptions, connect
from workerset_admission.adapters.nats.source import JetStreamDiscoverySource
from workerset_admission.errors import CredentialsRefused
from workerset_admission.ports import SourceListing, SourcePut

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

DISCOVERY = "dynamo-discovery"
ADMISSION = "frontend-model-admission"
STATUS = "workerset-admission.status"
NAMESPACES = ("ns-a", "ns-b")
DOCS = Path(__file__).resolve().parents[1] / "docs" / "security.md"


@pytest.fixture(scope="module")
def material(tmp_path_factory: pytest.TempPathFactory) -> SecurityMaterial:
    return SecurityMaterial.generate(
        tmp_path_factory.mktemp("secmaterial"),
        discovery_bucket=DISCOVERY,
        admission_bucket=ADMISSION,
        status_subject=STATUS,
    )


@pytest.fixture(scope="module")
def users_server(
    tmp_path_factory: pytest.TempPathFactory, material: SecurityMaterial
) -> Iterator[str]:
    config = users_config(
        material,
        discovery_bucket=DISCOVERY,
        admission_bucket=ADMISSION,
        status_subject=STATUS,
        worker_namespaces=NAMESPACES,
    )
    with configured_server(tmp_path_factory.mktemp("users"), config) as server:
        yield server.url


@dataclass
class ErrorLog:
    """Collects what nats-py reports asynchronously (permission violations arrive here)."""

    errors: list[Exception]

    async def on_error(self, exc: Exception) -> None:
        self.errors.append(exc)

    def violations(self) -> list[str]:
        return [str(e) for e in self.errors if "permissions violation" in str(e)]


@contextlib.asynccontextmanager
async def client(url: str, **kwargs: Any) -> AsyncIterator[tuple[NatsClient, ErrorLog]]:
    log = ErrorLog([])
    nc = await nats.connect(url, error_cb=log.on_error, allow_reconnect=False, **kwargs)
    try:
        yield nc, log
    finally:
        await nc.close()


async def create_buckets(url: str, **auth: Any) -> None:
    async with client(url, **auth) as (nc, _):
        js = nc.jetstream()
        for bucket in (DISCOVERY, ADMISSION):
            with contextlib.suppress(Exception):
                await js.delete_key_value(bucket)
            await js.create_key_value(KeyValueConfig(bucket=bucket, history=1))


async def first_snapshot(options: NatsConnectOptions, timeout: float = 20.0) -> SourceListing:
    source = JetStreamDiscoverySource(options, bucket=DISCOVERY, bind_retry_max=0.5)

    async def first() -> SourceListing:
        async for event in source.events():
            if isinstance(event, SourceListing):
                return event
        raise AssertionError("the source ended without a snapshot")

    try:
        return await asyncio.wait_for(first(), timeout)
    finally:
        await source.close()


def record_key(namespace: str, instance: int) -> str:
    return f"v1.mdc.{namespace}.backend.generate.{instance:x}"


async def put_refused(kv: KeyValue, key: str, log: ErrorLog) -> bool:
    """Try a put the server should refuse; True when it was refused and nothing was stored."""
    try:
        await kv.put(key, b"{}")
    except nats.errors.TimeoutError:
        # A refused publish gets no stream acknowledgement: the JetStream request times out.
        pass
    else:
        return False
    for _ in range(50):
        if log.violations():
            return True
        await asyncio.sleep(0.02)
    return False


# -- the documented lists are the tested lists ------------------------------------------------


def _documented_block() -> tuple[list[str], list[str]]:
    text = DOCS.read_text()
    block = text.split("## The plugin's user", 1)[1].split("```", 2)[1]
    publish = re.search(r"publish: \{ allow: \[(.*?)\]", block, re.S)
    subscribe = re.search(r"subscribe: \{ allow: \[(.*?)\]", block, re.S)
    assert publish is not None
    assert subscribe is not None
    return re.findall(r'"([^"]+)"', publish.group(1)), re.findall(r'"([^"]+)"', subscribe.group(1))


def test_the_documented_plugin_permissions_are_exactly_the_tested_ones() -> None:
    documented_publish, documented_subscribe = _documented_block()
    tested = plugin_permissions(DISCOVERY, ADMISSION, STATUS)
    assert documented_publish == list(tested.publish)
    assert documented_subscribe == list(tested.subscribe)


def test_the_documented_worker_permissions_are_exactly_the_tested_ones() -> None:
    text = DOCS.read_text()
    block = text.split("## A worker's user", 1)[1].split("```", 2)[1]
    publish = re.search(r"publish: \{ allow: \[(.*?)\]", block, re.S)
    assert publish is not None
    documented = re.findall(r'"([^"]+)"', publish.group(1))
    assert documented == list(worker_permissions(DISCOVERY, "ns-a").publish)


def test_the_documented_drain_permissions_are_exactly_the_tested_ones() -> None:
    text = DOCS.read_text()
    block = text.split("## The drain tools' user", 1)[1].split("```", 2)[1]
    publish = re.search(r"publish: \{ allow: \[(.*?)\]", block, re.S)
    assert publish is not None
    documented = re.findall(r'"([^"]+)"', publish.group(1))
    assert documented == list(drain_permissions(DISCOVERY, ADMISSION, "ns-a").publish)


# -- workers -----------------------------------------------------------------------------------


async def test_a_worker_writes_its_own_namespace_but_not_another(
    users_server: str, material: SecurityMaterial
) -> None:
    await create_buckets(users_server, user="admin", password=material.admin_password)
    async with client(users_server, user="worker-ns-a", password=material.worker_password) as (
        nc,
        log,
    ):
        kv = await nc.jetstream(timeout=1.0).key_value(DISCOVERY)
        assert await kv.put(record_key("ns-a", 0x1F), b"{}") > 0
        assert await put_refused(kv, record_key("ns-b", 0x2F), log)
        assert await put_refused(kv, "v1.instances.ns-b.backend.generate.2f", log)

    async with client(users_server, user="admin", password=material.admin_password) as (nc, _):
        kv = await nc.jetstream().key_value(DISCOVERY)
        assert sorted(await kv.keys()) == [record_key("ns-a", 0x1F)]


# -- the plugin --------------------------------------------------------------------------------


def plugin_options(url: str, **auth: Any) -> NatsConnectOptions:
    return NatsConnectOptions(servers=(url,), reconnect_wait=0.1, max_reconnect_wait=0.5, **auth)


async def test_the_plugin_watches_discovery_under_its_documented_permissions(
    users_server: str, material: SecurityMaterial
) -> None:
    await create_buckets(users_server, user="admin", password=material.admin_password)
    async with client(users_server, user="worker-ns-a", password=material.worker_password) as (
        nc,
        _,
    ):
        kv = await nc.jetstream().key_value(DISCOVERY)
        await kv.put(record_key("ns-a", 0x1F), b'{"type":"Model"}')

        options = plugin_options(
            users_server, user="workerset-admission", password=material.plugin_password
        )
        source = JetStreamDiscoverySource(options, bucket=DISCOVERY)
        seen: list[str] = []

        async def watch() -> None:
            async for event in source.events():
                if isinstance(event, SourceListing):
                    seen.extend(e.key for e in event.entries)
                    await kv.put(record_key("ns-a", 0x2F), b'{"type":"Model"}')
                elif isinstance(event, SourcePut):
                    seen.append(event.entry.key)
                    return

        try:
            await asyncio.wait_for(watch(), 20)
        finally:
            await source.close()
    assert seen == [record_key("ns-a", 0x1F), record_key("ns-a", 0x2F)]


async def test_the_plugin_cannot_write_discovery_records(
    users_server: str, material: SecurityMaterial
) -> None:
    await create_buckets(users_server, user="admin", password=material.admin_password)
    async with client(
        users_server, user="workerset-admission", password=material.plugin_password
    ) as (nc, log):
        js = nc.jetstream(timeout=1.0)
        kv = await js.key_value(DISCOVERY)
        assert await put_refused(kv, record_key("ns-a", 0x1F), log)
        admission = await js.key_value(ADMISSION)
        own = b'{"protocol":"v1","frontend":"frontend-1","members":[]}'
        assert await admission.put("v1.frontend-1.members.ns-a", own) > 0


async def test_a_frontend_writes_its_own_serving_records_and_no_other_frontends(
    users_server: str, material: SecurityMaterial
) -> None:
    await create_buckets(users_server, user="admin", password=material.admin_password)
    async with client(
        users_server, user="workerset-admission-2", password=material.plugin_password
    ) as (nc, log):
        admission = await nc.jetstream(timeout=1.0).key_value(ADMISSION)
        assert await admission.put("v1.frontend-2.capability", b"{}") > 0
        # frontend-1's records, and those of a frontend nobody runs, are refused.
        assert await put_refused(admission, "v1.frontend-1.members.ns-b", log)
        assert await put_refused(admission, "v1.frontend-1.capability", log)
        assert await put_refused(admission, "v1.invented.capability", log)
        assert await put_refused(admission, "v1.frontend-2x.capability", log)
        log.errors.clear()
        # Deleting another frontend's record is a publish on its subject too: refused.
        with contextlib.suppress(nats.errors.TimeoutError):
            await admission.delete("v1.frontend-1.capability")
        await until_violation(log)
    async with client(users_server, user="admin", password=material.admin_password) as (nc, _):
        admission = await nc.jetstream().key_value(ADMISSION)
        assert sorted(await admission.keys()) == ["v1.frontend-2.capability"]


async def until_violation(log: ErrorLog) -> None:
    for _ in range(50):
        if log.violations():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the server reported no permission violation")


# -- every authentication method ----------------------------------------------------------------


@dataclass(frozen=True)
class Method:
    name: str
    config: Any
    admin: Any
    plugin: Any
    scheme: str = "nats"


def _methods() -> list[Method]:
    def users(m: SecurityMaterial) -> dict[str, Any]:
        return users_config(
            m,
            discovery_bucket=DISCOVERY,
            admission_bucket=ADMISSION,
            status_subject=STATUS,
            worker_namespaces=NAMESPACES,
        )

    return [
        Method(
            "user and password",
            users,
            lambda m: {"user": "admin", "password": m.admin_password},
            lambda m: {"user": "workerset-admission", "password": m.plugin_password},
        ),
        Method(
            "token",
            token_config,
            lambda m: {"token": m.token},
            lambda m: {"token": m.token},
        ),
        Method(
            "nkey",
            users,
            lambda m: {"user": "admin", "password": m.admin_password},
            lambda m: {"nkey_seed_file": m.plugin_nkey_file},
        ),
        Method(
            "creds file",
            operator_config,
            lambda m: {"user_credentials": str(m.admin_creds)},
            lambda m: {"creds_file": m.plugin_creds},
        ),
        Method(
            "tls client certificate",
            tls_config,
            lambda m: {"tls": _tls_context(m), "tls_hostname": "localhost"},
            lambda m: {
                "tls_ca_file": m.tls.ca_file,
                "tls_cert_file": m.tls.client_cert,
                "tls_key_file": m.tls.client_key,
                "tls_hostname": "localhost",
            },
            scheme="tls",
        ),
    ]


def _tls_context(m: SecurityMaterial) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(m.tls.ca_file))
    context.load_cert_chain(str(m.tls.client_cert), str(m.tls.client_key))
    return context


METHODS = _methods()


@pytest.mark.parametrize("method", METHODS, ids=[m.name for m in METHODS])
async def test_each_authentication_method_lets_the_plugin_read_discovery(
    method: Method, material: SecurityMaterial, tmp_path: Path
) -> None:
    with configured_server(tmp_path, method.config(material)) as server:
        url = server.url.replace("nats://", f"{method.scheme}://")
        await create_buckets(url, **method.admin(material))
        async with client(url, **method.admin(material)) as (nc, _):
            kv = await nc.jetstream().key_value(DISCOVERY)
            await kv.put(record_key("ns-a", 0x1F), b'{"type":"Model"}')
        snapshot = await first_snapshot(plugin_options(url, **method.plugin(material)))
    assert [e.key for e in snapshot.entries] == [record_key("ns-a", 0x1F)]


@pytest.mark.parametrize(
    "method", [m for m in METHODS if m.name != "tls client certificate"], ids=lambda m: m.name
)
async def test_a_wrong_secret_is_refused_and_never_echoed(
    method: Method, material: SecurityMaterial, tmp_path: Path
) -> None:
    other = SecurityMaterial.generate(
        tmp_path / "other",
        discovery_bucket=DISCOVERY,
        admission_bucket=ADMISSION,
        status_subject=STATUS,
    )
    with configured_server(tmp_path, method.config(material)) as server:
        url = server.url
        options = replace(plugin_options(url, **method.plugin(other)), connect_timeout=1.0)
        # Told apart from an unreachable server: the command line answers it with status 5.
        with pytest.raises(CredentialsRefused, match="Authorization Violation") as caught:
            await asyncio.wait_for(connect(options, allow_reconnect=False), 10)
    text = "".join(str(e) + repr(e) for e in _chain(caught.value))
    del caught
    collect_refused_sockets()
    assert contains_secret(text, other.secrets() + material.secrets()) == []


def collect_refused_sockets() -> None:
    """Collect the socket nats-py abandons when a connection attempt is refused.

    nats-py drops the client of a failed ``connect`` without closing its transport; left to
    the garbage collector, its ResourceWarning would surface in whichever test runs next.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: BaseException | None = exc
    while seen is not None:
        yield seen
        seen = seen.__cause__ or seen.__context__


async def test_a_client_certificate_from_another_ca_is_refused(
    material: SecurityMaterial, tmp_path: Path
) -> None:
    tls = material.tls
    with configured_server(tmp_path, tls_config(material)) as server:
        url = server.url
        options = NatsConnectOptions(
            servers=(url.replace("nats://", "tls://"),),
            tls_ca_file=tls.ca_file,
            tls_cert_file=tls.stranger_cert,
            tls_key_file=tls.stranger_key,
            tls_hostname="localhost",
            connect_timeout=1.0,
        )
        # The server resets the connection when the handshake offers an untrusted certificate.
        refused = False
        try:
            await asyncio.wait_for(connect(options, allow_reconnect=False), 10)
        except (OSError, nats.errors.Error):  # reset, broken pipe or a TLS alert
            refused = True
        collect_refused_sockets()
    assert refused


# -- the drain tools ---------------------------------------------------------------------------


def _drain_cli(url: str, user: str, password: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "workerset_admission.cli",
            "drain",
            *args,
            "--nats-server",
            url,
            "--nats-user",
            user,
            "--nats-password",
            password,
            "--timeout",
            "20",
        ],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


async def test_a_drain_user_drains_its_own_namespace_and_is_refused_another(
    users_server: str, material: SecurityMaterial
) -> None:
    await create_buckets(users_server, user="admin", password=material.admin_password)
    for ns, instance in (("ns-a", 0x1F), ("ns-b", 0x2F)):
        async with client(users_server, user=f"worker-{ns}", password=material.worker_password) as (
            nc,
            _,
        ):
            kv = await nc.jetstream(timeout=1.0).key_value(DISCOVERY)
            await kv.put(record_key(ns, instance), b"{}")

    own = await asyncio.to_thread(
        _drain_cli, users_server, "drain-ns-a", material.worker_password, "0x1f"
    )
    assert own.returncode == 0, own.stderr
    other = await asyncio.to_thread(
        _drain_cli, users_server, "drain-ns-a", material.worker_password, "0x2f"
    )
    assert other.returncode == 5, other.stderr
    assert "NATS refused to store the drain record v1.drain.ns-b.2f" in other.stderr
    assert material.worker_password not in other.stderr + other.stdout

    # A worker's user may not write a drain record, not even for its own namespace.
    async with client(users_server, user="worker-ns-a", password=material.worker_password) as (
        nc,
        log,
    ):
        kv = await nc.jetstream(timeout=1.0).key_value(DISCOVERY)
        assert await put_refused(kv, "v1.drain.ns-a.1f", log)

    async with client(users_server, user="admin", password=material.admin_password) as (nc, _):
        kv = await nc.jetstream().key_value(DISCOVERY)
        drains = sorted(k for k in await kv.keys() if k.startswith("v1.drain."))
    assert drains == ["v1.drain.ns-a.1f"]


async def test_a_host_drain_is_all_or_nothing_across_namespaces_and_limited_by_namespace(
    users_server: str, material: SecurityMaterial
) -> None:
    await create_buckets(users_server, user="admin", password=material.admin_password)
    host = "10.9.0.7"
    for ns, instance in (("ns-a", 0x1E), ("ns-b", 0x2E)):
        async with client(users_server, user=f"worker-{ns}", password=material.worker_password) as (
            nc,
            _,
        ):
            kv = await nc.jetstream(timeout=1.0).key_value(DISCOVERY)
            await kv.put(record_key(ns, instance), b"{}")
            endpoint = {
                "type": "Endpoint",
                "namespace": ns,
                "component": "backend",
                "endpoint": "generate",
                "instance_id": instance,
                "transport": {"tcp": f"{host}:4000/generate"},
            }
            await kv.put(
                f"v1.instances.{ns}.backend.generate.{instance:x}", json.dumps(endpoint).encode()
            )

    async def drain_keys() -> list[str]:
        async with client(users_server, user="admin", password=material.admin_password) as (
            nc,
            _,
        ):
            kv = await nc.jetstream().key_value(DISCOVERY)
            return sorted(k for k in await kv.keys() if k.startswith("v1.drain."))

    # Every namespace on the host: ns-b is refused, so ns-a's drain is withdrawn too.
    everything = await asyncio.to_thread(
        _drain_cli, users_server, "drain-ns-a", material.worker_password, "--host", host
    )
    assert everything.returncode == 5, everything.stderr
    (line,) = everything.stderr.strip().splitlines()[-1:]
    assert "NATS refused to store the drain record v1.drain.ns-b.2e" in line
    assert "withdrawn: nothing is drained" in line
    assert await drain_keys() == []

    # Limited to the namespace this user may write, the same host drains there only.
    limited = await asyncio.to_thread(
        _drain_cli,
        users_server,
        "drain-ns-a",
        material.worker_password,
        "--host",
        host,
        "--namespace",
        "ns-a",
    )
    assert limited.returncode == 0, limited.stderr
    assert await drain_keys() == ["v1.drain.ns-a.1e"]
