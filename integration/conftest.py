"""Integration fixtures: a real nats-server with JetStream, on loopback, on a free port."""

from __future__ import annotations

import sys
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
from clusterfixture import NatsCluster
from etcdfixture import EtcdServer, MockerWorkers, dynamo_etcd_environment, running_etcd
from nats.aio.client import Client as NatsClient
from natsfixture import NatsServer, restartable_server, set_announcer, shared_server
from phoenixfixture import RUN_PHOENIX_ENV, phoenix_enabled
from promfixture import SKIP_PREFIX as PROMETHEUS_SKIP


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    """One server for the session (a container when Docker answers, else the local binary)."""
    yield from shared_server(tmp_path_factory.mktemp("nats-session"))


@pytest.fixture
def nats_server_fn(tmp_path: Path) -> Iterator[NatsServer]:
    """A private server for one test, container or binary; ``.handle`` restarts, kills, wipes."""
    yield from restartable_server(tmp_path)


@pytest.fixture
def etcd_server(tmp_path: Path) -> Iterator[EtcdServer]:
    """A private etcd for one test on loopback; it can be stopped, killed and started again."""
    yield from running_etcd(tmp_path / "etcd")


@pytest.fixture
def dynamo_etcd_env(
    tmp_path: Path, etcd_server: EtcdServer, nats_server: NatsServer
) -> dict[str, str]:
    """Environment for real Dynamo processes registering in the test's etcd."""
    pytest.importorskip("dynamo.mocker", reason="needs ai-dynamo==1.6.1 (see the README)")
    from support.workers import file_discovery_environment

    scratch = file_discovery_environment(tmp_path / "dynamo")
    return dynamo_etcd_environment(etcd_server.url, nats_server.url, scratch)


@pytest.fixture
def mockers(dynamo_etcd_env: dict[str, str], tmp_path: Path) -> Iterator[MockerWorkers]:
    """Real ``python -m dynamo.mocker`` workers on etcd discovery, all ended on teardown."""
    workers = MockerWorkers(dynamo_etcd_env, tmp_path)
    try:
        yield workers
    finally:
        workers.close()


@pytest.fixture
async def etcd_client(etcd_server: EtcdServer) -> AsyncIterator[Any]:
    """An aetcd client on the test's etcd, to read (and compact) what etcd really holds."""
    import aetcd  # type: ignore[import-untyped]

    client = aetcd.Client("127.0.0.1", etcd_server.client_port, timeout=5)
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture
async def client(nats_server: NatsServer) -> AsyncIterator[NatsClient]:
    """A nats-py connection to the session's server, closed after the test."""
    nc = await nats.connect(nats_server.url)
    try:
        yield nc
    finally:
        await nc.close()


@pytest.fixture
def bucket_name() -> str:
    """A bucket name no other test uses, so tests can share the session server."""
    return f"disc-{uuid.uuid4().hex[:12]}"


# Which kind of nats-server and which etcd each test ran against, and how long each
# integration test took (setup, call and teardown), for the run's summary.
_KINDS: dict[str, set[str]] = {}
_ETCDS: dict[str, set[str]] = {}
_SECONDS: Counter[str] = Counter()
# Tests skipped because promtool or prometheus could not be found, with the reason.
_PROMETHEUS_SKIPS: dict[str, str] = {}


def pytest_runtest_call(item: pytest.Item) -> None:
    """Note the servers the test uses (its fixtures are set up by now)."""
    values = list(getattr(item, "funcargs", {}).values())
    _KINDS[item.nodeid] = {v.kind for v in values if isinstance(v, NatsServer | NatsCluster)}
    etcds = {v.binary.label() for v in values if isinstance(v, EtcdServer)}
    if etcds:
        _ETCDS[item.nodeid] = etcds


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _SECONDS[report.nodeid] += report.duration
    if report.skipped and isinstance(report.longrepr, tuple):
        reason = str(report.longrepr[2])
        if PROMETHEUS_SKIP in reason:
            _PROMETHEUS_SKIPS[report.nodeid] = reason


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _SECONDS:
        return
    tests: Counter[str] = Counter()
    spent: Counter[str] = Counter()
    for nodeid, kinds in _KINDS.items():
        for kind in kinds:
            tests[kind] += 1
            spent[kind] += _SECONDS[nodeid]
    terminalreporter.write_line(
        f"nats-server kinds: {tests['container']} tests on container "
        f"({spent['container']:.0f} s), {tests['binary']} tests on binary "
        f"({spent['binary']:.0f} s); integration tests: {len(_SECONDS)} in "
        f"{sum(_SECONDS.values()):.0f} s"
    )
    reasons = sorted(set(_PROMETHEUS_SKIPS.values()))
    terminalreporter.write_line(
        f"prometheus tools: {len(_PROMETHEUS_SKIPS)} tests skipped for want of them"
        + (f" ({'; '.join(reasons)})" if reasons else "")
    )
    on_etcd: Counter[str] = Counter(etcd for etcds in _ETCDS.values() for etcd in etcds)
    terminalreporter.write_line(
        "etcd servers: "
        + ("; ".join(f"{n} tests on {etcd}" for etcd, n in sorted(on_etcd.items())) or "none used")
    )


def pytest_configure(config: pytest.Config) -> None:
    """Write fixture announcements to the terminal, past pytest's output capture."""

    def write(line: str) -> None:
        capture = config.pluginmanager.get_plugin("capturemanager")
        terminal = config.pluginmanager.get_plugin("terminalreporter")
        if capture is None or terminal is None:
            print(line, file=sys.__stderr__)
            return
        with capture.global_and_fixture_disabled():
            # On a line of its own even between progress dots, where the CI log looks for it.
            terminal.write("\n")
            terminal.write_line(line)

    set_announcer(write)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--run-phoenix",
        action="store_true",
        default=False,
        help=f"also run the tests marked phoenix (or set {RUN_PHOENIX_ENV}=1)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the Arize Phoenix tests unless asked for: they install and run a large server."""
    if phoenix_enabled(bool(config.getoption("--run-phoenix"))):
        return
    skip = pytest.mark.skip(
        reason=f"Arize Phoenix tests run only with --run-phoenix or {RUN_PHOENIX_ENV}=1"
    )
    for item in items:
        if item.get_closest_marker("phoenix") is not None:
            item.add_marker(skip)
