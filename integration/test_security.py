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
    Permissions,
    SecurityMaterial,
    bridge_permissions,
    configured_server,
    contains_secret,
    drain_permissions,
    gate_permissions,
    inbox_prefix,
    operator_config,
    plugin_permissions,
    status_permissions,
    tls_config,
    token_config,
    users_config,
    worker_permissions,
)
from support.buckets import live_keys
from support.cards import base_card
from workerset_admission.adapters.nats.connect import NatsConnectOptions, connect
from workerset_admission.adapters.nats.source import JetStreamDiscoverySource
from workerset_admission.errors import CredentialsRefused
from workerset_admission.ownership import bridge_writer
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


def _documented(section: str) -> Permissions:
    """The permission block a section of docs/security.md shows (its first code block)."""
    return _documented_in(DOCS.read_text().split(f"## {section}", 1)[1])


def _documented_in(text: str) -> Permissions:
    """The permission block of the first code block in ``text``."""
    block = text.split("```", 2)[1]
    lists = []
    for direction in ("publish", "subscribe"):
        found = re.search(direction + r": \{ allow: \[(.*?)\]", block, re.S)
        assert found is not None, direction
        lists.append(tuple(re.findall(r'"([^"]+)"', found.group(1))))
    return Permissions(publish=lists[0], subscribe=lists[1])


DOCUMENTED = {
    "The plugin's user": plugin_permissions(DISCOVERY, ADMISSION, STATUS),
    "The `status` command's user": status_permissions(STATUS),
    "A worker's user": worker_permissions(DISCOVERY, "ns-a"),
    "The drain tools' user": drain_permissions(DISCOVERY, ADMISSION, "ns-a"),
    "The bridge's user": bridge_permissions(DISCOVERY),
}


def test_the_gates_documented_permission_list_is_exactly_the_tested_one() -> None:
    text = (DOCS.parent / "operations.md").read_text()
    section = text.split("### Permissions for the gate", 1)[1]
    documented = _documented_in(section)
    assert documented.publish == gate_permissions(ADMISSION).publish
    assert documented.subscribe == gate_permissions(ADMISSION).subscribe


@pytest.mark.parametrize("section", DOCUMENTED)
def test_each_documented_permission_list_is_exactly_the_tested_one(section: str) -> None:
    documented, tested = _documented(section), DOCUMENTED[section]
    assert documented.publish == tested.publish
    assert documented.subscribe == tested.subscribe


def test_no_documented_tool_may_read_another_users_inbox_or_consumers() -> None:
    """Only Dynamo's workers keep ``_INBOX``; no list names a consumer or reads one by name."""
    for section, permissions in DOCUMENTED.items():
        inboxes = [s for s in permissions.subscribe if s.startswith("_INBOX")]
        if section == "A worker's user":
            assert inboxes == ["_INBOX.>"]
        else:
            assert len(inboxes) == 1
            assert inboxes[0].startswith("_INBOX_"), (section, inboxes)
        consumer_rights = [p for p in permissions.publish if p.startswith("$JS.API.CONSUMER.")]
        assert all(
            p.count(".") == 4 and p.startswith("$JS.API.CONSUMER.CREATE.KV_")
            for p in consumer_rights
        ), (section, consumer_rights)


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
        assert await live_keys(kv) == [record_key("ns-a", 0x1F)]


# -- the plugin --------------------------------------------------------------------------------


def plugin_options(url: str, **auth: Any) -> NatsConnectOptions:
    return NatsConnectOptions(
        servers=(url,),
        reconnect_wait=0.1,
        max_reconnect_wait=0.5,
        inbox_prefix=inbox_prefix("frontend-1"),
        **auth,
    )


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
        users_server,
        user="workerset-admission",
        password=material.plugin_password,
        inbox_prefix=inbox_prefix("frontend-1"),
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
        users_server,
        user="workerset-admission-2",
        password=material.plugin_password,
        inbox_prefix=inbox_prefix("frontend-2"),
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
        assert await live_keys(admission) == ["v1.frontend-2.capability"]


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
    prefix = inbox_prefix(user)
    return _cli(
        url, user, password, "drain", *args, "--nats-inbox-prefix", prefix, "--timeout", "20"
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
    assert "NATS refused this user the write of v1.drain.ns-b.2f" in other.stderr
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
        drains = await live_keys(kv, "v1.drain.>")
    assert drains == ["v1.drain.ns-a.1f"]


# -- one namespace's tools cannot stall another's discovery -------------------------------------


def frontend_options(url: str, material: SecurityMaterial, frontend: str) -> NatsConnectOptions:
    user = "workerset-admission" if frontend == "frontend-1" else "workerset-admission-2"
    return NatsConnectOptions(
        servers=(url,),
        user=user,
        password=material.plugin_password,
        inbox_prefix=inbox_prefix(frontend),
        reconnect_wait=0.1,
        max_reconnect_wait=0.5,
    )


@dataclass
class Seen:
    """The keys one frontend's source has seen, listings and live puts alike, and when."""

    keys: dict[str, float]
    listings: list[str]


@contextlib.asynccontextmanager
async def watching(options: NatsConnectOptions) -> AsyncIterator[Seen]:
    source = JetStreamDiscoverySource(options, bucket=DISCOVERY, bind_retry_max=0.5)
    seen = Seen({}, [])
    loop = asyncio.get_running_loop()

    async def run() -> None:
        async for event in source.events():
            if isinstance(event, SourceListing):
                seen.listings.append(event.reason)
                for entry in event.entries:
                    seen.keys.setdefault(entry.key, loop.time())
            elif isinstance(event, SourcePut):
                seen.keys.setdefault(event.entry.key, loop.time())

    task = asyncio.ensure_future(run())
    try:
        for _ in range(200):
            if seen.listings:
                break
            await asyncio.sleep(0.05)
        assert seen.listings, "the source never listed the bucket"
        yield seen
    finally:
        await source.close()
        await asyncio.wait_for(task, 10)


async def consumer_of(admin: NatsClient, frontend: str) -> str:
    """The name of the watch consumer delivering to this frontend's inbox prefix."""
    for info in await admin.jetstream().consumers_info(f"KV_{DISCOVERY}"):
        deliver = info.config.deliver_subject or ""
        if deliver.startswith(f"{inbox_prefix(frontend)}."):
            return info.name
    raise AssertionError(f"no watch consumer delivers to {frontend}")


async def refused_request(nc: NatsClient, log: ErrorLog, subject: str) -> bool:
    """Send a request the server should refuse: True when it was refused and not answered."""
    log.errors.clear()
    with contextlib.suppress(nats.errors.TimeoutError, nats.errors.NoRespondersError):
        answer = await nc.request(subject, b"", timeout=1.0)
        raise AssertionError(f"{subject} was answered: {answer.data!r}")
    await until_violation(log)
    # nats-py's own client lowers the case of the server's error line.
    assert any(subject.lower() in v for v in log.violations()), log.violations()
    return True


async def test_a_drain_user_can_neither_learn_nor_delete_a_frontends_watch_consumer(
    users_server: str, material: SecurityMaterial
) -> None:
    """The attack: subscribe to every inbox, read consumer names from the deliveries, delete.

    With the documented lists every step is refused, and the frontend's consumer stays.
    """
    await create_buckets(users_server, user="admin", password=material.admin_password)
    options = frontend_options(users_server, material, "frontend-1")
    async with (
        watching(options),
        client(users_server, user="admin", password=material.admin_password) as (admin, _),
    ):
        name = await consumer_of(admin, "frontend-1")
        async with client(
            users_server,
            user="drain-ns-a",
            password=material.worker_password,
            inbox_prefix=inbox_prefix("drain-ns-a"),
        ) as (nc, log):
            # Snooping on every inbox, the default one or the frontend's own, is refused.
            for wildcard in ("_INBOX.>", f"{inbox_prefix('frontend-1')}.>", ">"):
                log.errors.clear()
                await nc.subscribe(wildcard)
                await until_violation(log)
                assert any("subscription" in v for v in log.violations()), log.violations()
            # Knowing the name (here from the admin) is worth nothing: read, update, delete.
            stream = f"KV_{DISCOVERY}"
            for subject in (
                f"$JS.API.CONSUMER.DELETE.{stream}.{name}",
                f"$JS.API.CONSUMER.INFO.{stream}.{name}",
                f"$JS.API.CONSUMER.CREATE.{stream}.{name}",
                f"$JS.API.CONSUMER.PAUSE.{stream}.{name}",
                f"$JS.API.CONSUMER.LIST.{stream}",
                f"$JS.API.CONSUMER.NAMES.{stream}",
            ):
                assert await refused_request(nc, log, subject), subject
            # The one consumer right it has, creating a consumer the server names, cannot take
            # over an existing one by naming it in the request.
            consumers = await admin.jetstream().consumers_info(stream)
            info = next(c for c in consumers if c.name == name)
            config = {**info.config.as_dict(), "deliver_subject": f"{inbox_prefix('drain-ns-a')}.x"}
            answer = await nc.request(
                f"$JS.API.CONSUMER.CREATE.{stream}",
                json.dumps({"stream_name": stream, "config": {**config, "name": name}}).encode(),
                timeout=2.0,
            )
            assert "already in use" in json.loads(answer.data)["error"]["description"]
        # Still there, still delivering to the frontend.
        assert await consumer_of(admin, "frontend-1") == name


async def test_a_deleted_watch_consumer_is_re_created_at_once_and_said_at_warning(
    users_server: str, material: SecurityMaterial, caplog: pytest.LogCaptureFixture
) -> None:
    """Someone allowed to (an admin) deletes one frontend's consumer: both see the next change."""
    await create_buckets(users_server, user="admin", password=material.admin_password)
    caplog.set_level("WARNING", logger="workerset_admission.adapters.nats.source")
    async with (
        watching(frontend_options(users_server, material, "frontend-1")) as first,
        watching(frontend_options(users_server, material, "frontend-2")) as second,
        client(users_server, user="admin", password=material.admin_password) as (admin, _),
        client(users_server, user="worker-ns-a", password=material.worker_password) as (nc, _),
    ):
        kv = await nc.jetstream(timeout=2.0).key_value(DISCOVERY)
        loop = asyncio.get_running_loop()
        for round_ in range(3):
            name = await consumer_of(admin, "frontend-1")
            assert await admin.jetstream().delete_consumer(f"KV_{DISCOVERY}", name)
            key = record_key("ns-a", 0x100 + round_)
            put_at = loop.time()
            await kv.put(key, b'{"type":"Model"}')
            for _ in range(100):
                if key in first.keys and key in second.keys:
                    break
                await asyncio.sleep(0.03)
            delays = {
                frontend: seen.keys[key] - put_at
                for frontend, seen in (("frontend-1", first), ("frontend-2", second))
                if key in seen.keys
            }
            assert set(delays) == {"frontend-1", "frontend-2"}, delays
            assert max(delays.values()) < 3.0, delays
            assert await consumer_of(admin, "frontend-1") != name
    warnings_ = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert sum("was deleted on the server; re-creating it" in w for w in warnings_) == 3, warnings_
    assert first.listings == ["initial", "reconnect", "reconnect", "reconnect"]
    assert second.listings == ["initial"]


# -- a permission refusal is said as one ---------------------------------------------------------


def _cli(url: str, user: str, password: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "workerset_admission.cli",
            *args,
            "--nats-server",
            url,
            "--nats-user",
            user,
            "--nats-password",
            password,
        ],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


def _refused_commands(folder: Path) -> dict[str, tuple[str, list[str], str]]:
    """Per command: the user it runs as, its arguments, the subject the server refuses."""
    card = folder / "card.json"
    card.write_text(json.dumps(base_card()))
    store = folder / "workers-kv"
    store.mkdir(exist_ok=True)
    worker = ["--namespace", "ns-b", "--component", "backend", "--endpoint", "generate"]
    return {
        # A worker's user of ns-a registering into ns-b.
        "register": (
            "worker-ns-a",
            ["register", "--card", str(card), *worker, "--instance-id", "0x2f", "--once"],
            f"$KV.{DISCOVERY}.v1.",
        ),
        # A bridge run as a worker's user: it may not list the bucket.
        "bridge": (
            "worker-ns-a",
            ["bridge", "--file-kv", str(store), "--once"],
            f"$JS.API.CONSUMER.CREATE.KV_{DISCOVERY}",
        ),
        # The drain user without its inbox prefix: its replies' subscription is refused.
        "drain": ("drain-ns-a", ["drain", "0x1f", "--timeout", "20"], "_INBOX."),
        # A worker's user reading the serving records: it may not.
        "rollout": (
            "worker-ns-a",
            ["rollout", "--model", "m", "--namespace", "ns-a", "--timeout", "5"],
            f"$JS.API.STREAM.INFO.KV_{ADMISSION}",
        ),
        # A frontend run as a worker's user: it may not read the discovery bucket.
        "serve": (
            "worker-ns-a",
            ["serve", "--frontend-id", "frontend-1", "--status-subject", STATUS],
            f"$JS.API.CONSUMER.CREATE.KV_{DISCOVERY}",
        ),
        # A worker's user asking for a status: it may not publish on the status subject.
        "status": ("worker-ns-a", ["status", "--timeout", "2"], STATUS),
        "record": (
            "worker-ns-a",
            ["record", "--duration", "1", "-o", str(folder / "t.jsonl")],
            f"$JS.API.STREAM.INFO.KV_{ADMISSION}",
        ),
    }


@pytest.mark.parametrize(
    "command", ["register", "bridge", "drain", "rollout", "status", "record", "serve"]
)
async def test_a_permission_refusal_exits_5_naming_the_subject(
    command: str, users_server: str, material: SecurityMaterial, tmp_path: Path
) -> None:
    await create_buckets(users_server, user="admin", password=material.admin_password)
    async with client(users_server, user="worker-ns-a", password=material.worker_password) as (
        nc,
        _,
    ):
        kv = await nc.jetstream(timeout=1.0).key_value(DISCOVERY)
        await kv.put(record_key("ns-a", 0x1F), b"{}")
    user, args, subject = _refused_commands(tmp_path)[command]
    ran = await asyncio.to_thread(_cli, users_server, user, material.worker_password, *args)
    assert ran.returncode == 5, (ran.returncode, ran.stderr)
    lines = ran.stderr.strip().splitlines()
    assert lines[-1].startswith(f"workerset-admission {command}: NATS refused this user"), lines
    assert f'to "{subject}' in lines[-1], lines[-1]
    assert "timeout" not in lines[-1]
    assert material.worker_password not in ran.stderr + ran.stdout


async def test_the_bridge_mirrors_under_its_documented_permissions(
    users_server: str, material: SecurityMaterial, tmp_path: Path
) -> None:
    """The bridge's user lists the bucket and prunes what it wrote, and nothing is refused."""
    await create_buckets(users_server, user="admin", password=material.admin_password)
    store = tmp_path / "empty-store"
    store.mkdir()
    owner = bridge_writer(store, "edge-1")
    async with client(users_server, user="admin", password=material.admin_password) as (nc, _):
        js = nc.jetstream()
        for key in ("v1.mdc.ns-a.backend.generate.dead", "v1.instances.ns-b.backend.generate.1"):
            await js.publish(f"$KV.{DISCOVERY}.{key}", b"{}", headers=owner.headers())
        await js.publish(f"$KV.{DISCOVERY}.v1.drain.ns-a.1f", b"{}")
    ran = await asyncio.to_thread(
        _cli,
        users_server,
        "bridge",
        material.worker_password,
        "bridge",
        "--file-kv",
        str(store),
        "--once",
        "--bridge-id",
        "edge-1",
        "--nats-inbox-prefix",
        inbox_prefix("bridge"),
    )
    assert ran.returncode == 0, ran.stderr
    assert "refused" not in ran.stderr, ran.stderr
    async with client(users_server, user="admin", password=material.admin_password) as (nc, _):
        kv = await nc.jetstream().key_value(DISCOVERY)
        assert await live_keys(kv) == ["v1.drain.ns-a.1f"]


async def test_the_gate_answers_under_its_documented_permissions(
    users_server: str, material: SecurityMaterial
) -> None:
    await create_buckets(users_server, user="admin", password=material.admin_password)
    async with client(users_server, user="admin", password=material.admin_password) as (nc, _):
        admission = await nc.jetstream().key_value(ADMISSION)
        record = {"protocol": "v1", "frontend": "frontend-1", "namespace": "ns-a", "members": []}
        await admission.put("v1.frontend-1.members.ns-a", json.dumps(record).encode())
    ran = await asyncio.to_thread(
        _cli,
        users_server,
        "rollout",
        material.worker_password,
        "rollout",
        "--model",
        "m",
        "--namespace",
        "ns-a",
        "--json",
        "--nats-inbox-prefix",
        inbox_prefix("rollout"),
    )
    # The gate read the bucket (closed: the record serves no group of model m).
    assert ran.returncode == 1, ran.stderr
    assert json.loads(ran.stdout)["open"] is False
    assert "refused" not in ran.stderr


async def test_register_writes_its_own_namespace_under_the_workers_documented_permissions(
    users_server: str, material: SecurityMaterial, tmp_path: Path
) -> None:
    await create_buckets(users_server, user="admin", password=material.admin_password)
    card = tmp_path / "card.json"
    card.write_text(json.dumps(base_card()))
    worker = ["--namespace", "ns-a", "--component", "backend", "--endpoint", "generate"]
    ran = await asyncio.to_thread(
        _cli,
        users_server,
        "worker-ns-a",
        material.worker_password,
        *["register", "--card", str(card), *worker, "--instance-id", "0x1f", "--once"],
    )
    assert ran.returncode == 0, ran.stderr
    async with client(users_server, user="admin", password=material.admin_password) as (nc, _):
        kv = await nc.jetstream().key_value(DISCOVERY)
        assert record_key("ns-a", 0x1F) in await live_keys(kv)


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
            return await live_keys(kv, "v1.drain.>")

    # Every namespace on the host: ns-b is refused before anything is written, ns-a's too.
    everything = await asyncio.to_thread(
        _drain_cli, users_server, "drain-ns-a", material.worker_password, "--host", host
    )
    assert everything.returncode == 5, everything.stderr
    (line,) = everything.stderr.strip().splitlines()[-1:]
    assert "NATS refused this user the write of v1.drain.ns-b.2e" in line
    assert "nothing was drained" in line
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
