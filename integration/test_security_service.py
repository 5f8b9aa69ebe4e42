"""The whole service under least privilege, and secrets kept out of everything it says.

The service runs as a host runs it (``create_service`` from settings, and the ``serve`` and
``status`` commands as processes) against servers configured with exactly the permissions of
``docs/security.md``. Every log record (all loggers, DEBUG), every span and attribute, the
status output and every error text is searched for the run's generated secrets.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client as NatsClient
from nats.js.api import KeyValueConfig
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from secfixture import (
    SecurityMaterial,
    configured_server,
    contains_secret,
    inbox_prefix,
    operator_config,
    tls_config,
    token_config,
    users_config,
)
from support.buckets import live_keys
from support.fleet import card, until
from workerset_admission.adapters.nats.embedded import EmbeddedNatsServer
from workerset_admission.card import (
    encode_endpoint_record,
    encode_model_record,
    endpoint_kv_key,
    model_kv_key,
)
from workerset_admission.cli.serve import render_status_table
from workerset_admission.identity import EndpointId
from workerset_admission.service.admission_service import AdmissionService
from workerset_admission.settings import Settings
from workerset_admission.telemetry import AdmissionTelemetry
from workerset_admission.wiring.compose import create_service

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

DISCOVERY = "dynamo-discovery"
ADMISSION = "frontend-model-admission"
STATUS = "workerset-admission.status"
NAMESPACES = ("ns-a", "ns-b")
EP_A = EndpointId("ns-a", "backend", "generate")
CARD = card()


@pytest.fixture(scope="module")
def material(tmp_path_factory: pytest.TempPathFactory) -> SecurityMaterial:
    return SecurityMaterial.generate(
        tmp_path_factory.mktemp("secmaterial"),
        discovery_bucket=DISCOVERY,
        admission_bucket=ADMISSION,
        status_subject=STATUS,
    )


def users(material: SecurityMaterial) -> dict[str, Any]:
    return users_config(
        material,
        discovery_bucket=DISCOVERY,
        admission_bucket=ADMISSION,
        status_subject=STATUS,
        worker_namespaces=NAMESPACES,
    )


@contextlib.asynccontextmanager
async def connected(url: str, **auth: Any) -> AsyncIterator[NatsClient]:
    nc = await nats.connect(url, allow_reconnect=False, **auth)
    try:
        yield nc
    finally:
        await nc.close()


async def prepare(url: str, admin: dict[str, Any], *, register: bool = True) -> None:
    """Create both buckets (the operator's job) and register one worker of namespace ns-a."""
    async with connected(url, **admin) as nc:
        js = nc.jetstream()
        kv = await js.create_key_value(KeyValueConfig(bucket=DISCOVERY, history=1))
        await js.create_key_value(KeyValueConfig(bucket=ADMISSION, history=1, ttl=60))
        if register:
            await kv.put(endpoint_kv_key(EP_A, 0x1F), encode_endpoint_record(EP_A, 0x1F))
            await kv.put(model_kv_key(EP_A, 0x1F), encode_model_record(EP_A, 0x1F, CARD))


def settings(url: str, **auth: Any) -> Settings:
    return Settings(
        nats_servers=(url,),
        discovery_bucket=DISCOVERY,
        admission_bucket=ADMISSION,
        status_subject=STATUS,
        frontend_id="frontend-1",
        nats_inbox_prefix=inbox_prefix("frontend-1"),
        reconcile_interval=0.5,
        retry_delays=(0.1, 0.2),
        **auth,
    )


def plugin_violations(server: EmbeddedNatsServer, user: str = "workerset-admission") -> list[str]:
    return [line for line in server.log_text().splitlines() if "Violation" in line and user in line]


# -- least privilege, end to end --------------------------------------------------------------


async def test_the_service_runs_with_only_its_documented_permissions(
    material: SecurityMaterial, tmp_path: Path
) -> None:
    with configured_server(tmp_path, users(material)) as server:
        admin = {"user": "admin", "password": material.admin_password}
        await prepare(server.url, admin)
        service = await create_service(
            settings(
                server.url, nats_user="workerset-admission", nats_password=material.plugin_password
            )
        )
        try:
            await service.wait_synced(20)
            await until(lambda: [g.status for g in service.status().groups] == ["ready"])
            assert service.status().groups[0].admitted == (0x1F,)
            # A periodic re-listing, the serving records and a status request all happen
            # under the same user.
            await until(lambda: service.counters.listings >= 2)
            async with connected(server.url, **admin) as nc:
                admission = await nc.jetstream().key_value(ADMISSION)

                async def members() -> list[str]:
                    with contextlib.suppress(Exception):
                        entry = await admission.get("v1.frontend-1.members.ns-a")
                        return list(json.loads(entry.value or b"{}")["members"])
                    return []

                for _ in range(400):
                    if await members() == ["ns-a/backend/generate/1f"]:
                        break
                    await asyncio.sleep(0.05)
                assert await members() == ["ns-a/backend/generate/1f"]
                reply = await nc.request(STATUS, b"", timeout=5)
                assert json.loads(reply.data)["groups"][0]["admitted"] == [0x1F]
        finally:
            await service.stop()
        async with connected(server.url, **admin) as nc:
            admission = await nc.jetstream().key_value(ADMISSION)
            assert [k for k in await live_keys(admission) if ".members." in k] == []
        assert plugin_violations(server) == []


async def test_the_service_waits_for_buckets_it_may_not_create(
    material: SecurityMaterial, tmp_path: Path
) -> None:
    with configured_server(tmp_path, users(material)) as server:
        service = await create_service(
            settings(
                server.url, nats_user="workerset-admission", nats_password=material.plugin_password
            )
        )
        try:
            await asyncio.sleep(1.0)
            assert not service.synced
            assert service.running, "a missing bucket must not stop the service"
            await prepare(server.url, {"user": "admin", "password": material.admin_password})
            await service.wait_synced(30)
            await until(lambda: [g.admitted for g in service.status().groups] == [(0x1F,)])
        finally:
            await service.stop()


async def test_a_worker_record_claiming_another_identity_is_refused(
    material: SecurityMaterial, tmp_path: Path
) -> None:
    with configured_server(tmp_path, users(material)) as server:
        await prepare(server.url, {"user": "admin", "password": material.admin_password})
        service = await create_service(
            settings(
                server.url, nats_user="workerset-admission", nats_password=material.plugin_password
            )
        )
        try:
            await service.wait_synced(20)
            before = [g.to_json() for g in service.status().groups]
            async with connected(
                server.url, user="worker-ns-a", password=material.worker_password
            ) as nc:
                kv = await nc.jetstream().key_value(DISCOVERY)
                # Under its own key, a worker of ns-a claims to be an ns-b worker.
                forged = encode_model_record(EndpointId("ns-b", "backend", "generate"), 0x2F, CARD)
                await kv.put(model_kv_key(EP_A, 0x2F), forged)
            await until(lambda: service.status().invalid_total == 1)
            refused = service.status().recent_invalid[-1]
            assert refused.reason == "identity_mismatch"
            assert refused.key == model_kv_key(EP_A, 0x2F)
            assert [g.to_json() for g in service.status().groups] == before
        finally:
            await service.stop()


# -- secrets ------------------------------------------------------------------------------------


class Capture(logging.Handler):
    """Every record of every logger, formatted with its traceback."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record) + repr(getattr(record, "__dict__", {})))


@contextlib.contextmanager
def capture_logs() -> Iterator[Capture]:
    handler = Capture()
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def span_text(exporter: InMemorySpanExporter) -> str:
    parts = []
    for span in exporter.get_finished_spans():
        parts.append(span.name)
        parts.append(repr(dict(span.attributes or {})))
        parts.extend(f"{e.name} {dict(e.attributes or {})}" for e in span.events)
        parts.append(repr(span.status.description))
    return "\n".join(parts)


METHODS = ["user and password", "token", "nkey", "creds file", "tls client certificate"]


def method_setup(name: str, m: SecurityMaterial) -> tuple[Any, dict[str, Any], dict[str, Any], str]:
    """(server config, admin connect kwargs, plugin settings, URL scheme) for one method."""
    if name == "user and password":
        return (
            users(m),
            {"user": "admin", "password": m.admin_password},
            {"nats_user": "workerset-admission", "nats_password": m.plugin_password},
            "nats",
        )
    if name == "token":
        return token_config(m), {"token": m.token}, {"nats_token": m.token}, "nats"
    if name == "nkey":
        return (
            users(m),
            {"user": "admin", "password": m.admin_password},
            {"nats_nkey_seed_file": m.plugin_nkey_file},
            "nats",
        )
    if name == "creds file":
        return (
            operator_config(m),
            {"user_credentials": str(m.admin_creds)},
            {"nats_creds_file": m.plugin_creds},
            "nats",
        )
    import ssl

    context = ssl.create_default_context(cafile=str(m.tls.ca_file))
    context.load_cert_chain(str(m.tls.client_cert), str(m.tls.client_key))
    return (
        tls_config(m),
        {"tls": context, "tls_hostname": "localhost"},
        {
            "nats_tls_ca_file": m.tls.ca_file,
            "nats_tls_cert_file": m.tls.client_cert,
            "nats_tls_key_file": m.tls.client_key,
            "nats_tls_hostname": "localhost",
        },
        "tls",
    )


@pytest.mark.parametrize("method", METHODS)
async def test_no_secret_appears_in_logs_spans_status_or_errors(
    method: str, material: SecurityMaterial, tmp_path: Path
) -> None:
    config, admin, auth, scheme = method_setup(method, material)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    texts: list[str] = []
    with configured_server(tmp_path, config) as server, capture_logs() as logs:
        url = server.url.replace("nats://", f"{scheme}://")
        await prepare(url, admin)
        chosen = settings(url, **auth)
        texts += [repr(chosen), str(chosen), json.dumps(chosen.redacted(), default=str)]
        service: AdmissionService = await create_service(
            chosen, telemetry=AdmissionTelemetry(tracer_provider=provider)
        )
        try:
            await service.wait_synced(20)
            await until(lambda: [g.status for g in service.status().groups] == ["ready"])
            status = json.loads(service.render_status())
            texts += [json.dumps(status), render_status_table(status)]
        finally:
            await service.stop()
        assert exporter.get_finished_spans(), "the run must have produced spans to search"

        # The same settings with the secret made wrong: whatever the failure says. (A client
        # certificate has no wrong value to try here; an untrusted one is refused in the
        # handshake, tested in test_security.)
        wrong_values = _wrong_secrets(method, tmp_path)
        if wrong_values:
            wrong = chosen.model_copy(update={k: v for k, v in wrong_values.items() if k in auth})
            failing = await _error_text(create_service(wrong))
            assert failing, "the wrong secret must have been refused"
            texts.append(failing)
    texts += logs.lines
    texts.append(span_text(exporter))
    provider.shutdown()
    assert logs.lines, "the run must have logged something to search"
    assert contains_secret("\n".join(texts), material.secrets()) == []


def _wrong_secrets(method: str, folder: Path) -> dict[str, Any]:
    if method == "tls client certificate":
        return {}
    other = SecurityMaterial.generate(
        folder / "other",
        discovery_bucket=DISCOVERY,
        admission_bucket=ADMISSION,
        status_subject=STATUS,
    )
    return {
        "nats_password": other.plugin_password,
        "nats_token": other.token,
        "nats_nkey_seed_file": other.plugin_nkey_file,
        "nats_creds_file": other.plugin_creds,
    }


async def _error_text(attempt: Any) -> str:
    """Run a start that should fail (or stop it if it does not) and return every error text."""
    try:
        service = await asyncio.wait_for(attempt, 15)
    except BaseException as exc:
        texts = []
        seen: BaseException | None = exc
        while seen is not None:
            texts += [str(seen), repr(seen)]
            seen = seen.__cause__ or seen.__context__
        return "\n".join(texts)
    await service.stop()
    return ""


# -- the commands, as processes ------------------------------------------------------------------


async def _cli(args: list[str], env: dict[str, str], timeout: float = 30) -> tuple[int, str]:
    """Run one command to its end; return its exit code and everything it printed."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "workerset_admission.cli",
        *args,
        env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), timeout)
    return proc.returncode or 0, out.decode()


@contextlib.asynccontextmanager
async def serving(env: dict[str, str]) -> AsyncIterator[list[str]]:
    """``serve`` as a process until the block ends (SIGTERM); its output lands in the list."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "workerset_admission.cli",
        "serve",
        "--log-level",
        "debug",
        env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output: list[str] = []
    try:
        yield output
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        out, _ = await asyncio.wait_for(proc.communicate(), 30)
        output.append(out.decode())


async def ready_status(env: dict[str, str]) -> str:
    """Ask ``status --json`` until the service reports a ready group; return what it printed."""
    printed = ""
    for _ in range(20):
        code, printed = await _cli(["status", "--json", "--timeout", "2"], env)
        if code == 0 and '"ready"' in printed:
            return printed
        await asyncio.sleep(0.2)
    raise AssertionError(f"the service never reported a ready group: {printed}")


def _env(
    url: str, password: str | None = None, user: str = "workerset-admission"
) -> dict[str, str]:
    env = {
        "WORKERSET_ADMISSION_NATS_SERVERS": url,
        "WORKERSET_ADMISSION_DISCOVERY_BUCKET": DISCOVERY,
        "WORKERSET_ADMISSION_ADMISSION_BUCKET": ADMISSION,
        "WORKERSET_ADMISSION_STATUS_SUBJECT": STATUS,
    }
    if password is not None:
        env["WORKERSET_ADMISSION_NATS_USER"] = user
        env["WORKERSET_ADMISSION_NATS_PASSWORD"] = password
    # Each user reads its replies under its own inbox prefix (docs/security.md).
    if user == "workerset-admission":
        env["WORKERSET_ADMISSION_FRONTEND_ID"] = "frontend-1"
        env["WORKERSET_ADMISSION_NATS_INBOX_PREFIX"] = inbox_prefix("frontend-1")
    elif user == "status-reader":
        env["WORKERSET_ADMISSION_NATS_INBOX_PREFIX"] = inbox_prefix("status")
    return env


async def test_serve_and_status_print_no_secret(material: SecurityMaterial, tmp_path: Path) -> None:
    with configured_server(tmp_path, users(material)) as server:
        await prepare(server.url, {"user": "admin", "password": material.admin_password})
        env = _env(server.url, material.plugin_password)
        # The status command runs as its own user, allowed only to ask (docs/security.md).
        reader = _env(server.url, material.worker_password, user="status-reader")
        outputs: list[str] = []
        async with serving(env) as served:
            outputs.append(await ready_status(reader))
            outputs.append((await _cli(["status"], reader))[1])
            code, refused = await _cli(
                ["status"], _env(server.url, "not-the-password", user="status-reader")
            )
            assert code != 0
            outputs.append(refused)
    outputs += served
    assert served[0], "serve must have said something to search"
    assert contains_secret("\n".join(outputs), material.secrets()) == []


async def test_credentials_inside_a_server_url_are_not_printed(
    material: SecurityMaterial, tmp_path: Path
) -> None:
    with configured_server(tmp_path, users(material)) as server:
        await prepare(server.url, {"user": "admin", "password": material.admin_password})
        host = server.url.removeprefix("nats://")
        env = _env(f"nats://workerset-admission:{material.plugin_password}@{host}")
        reader = _env(server.url, material.worker_password, user="status-reader")
        async with serving(env) as served:
            printed = await ready_status(reader)
    assert "connecting" in served[0] or "watching" in served[0], served[0]
    assert contains_secret(served[0] + printed, material.secrets()) == []


async def test_a_service_stopped_while_it_connects_over_tls_stops_promptly(
    material: SecurityMaterial, tmp_path: Path
) -> None:
    """A host may stop the service at any moment, the TLS handshake included.

    Stopping while the first connection is still in its TLS handshake used to hang forever
    (closing the half-open connection never completed); twenty starts each stopped after a
    different short delay land some stops inside the handshake.
    """
    config, admin, auth, _ = method_setup("tls client certificate", material)
    with configured_server(tmp_path, config) as server:
        url = server.url.replace("nats://", "tls://")
        await prepare(url, admin)
        for attempt in range(20):
            service = await create_service(settings(url, **auth))
            await asyncio.sleep(0.001 * (attempt % 10))
            await asyncio.wait_for(service.stop(), 10)
            assert not service.running
