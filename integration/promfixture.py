"""Prometheus' own tools for the tests: promtool, and a real Prometheus server on loopback.

Both come from Debian's ``prometheus`` package (``apt-get install prometheus``; ``.ci/run``
installs it), or from the paths ``WORKERSET_ADMISSION_PROMTOOL_BIN`` and
``WORKERSET_ADMISSION_PROMETHEUS_BIN`` name. Where a tool cannot be found the test is skipped
with a reason that starts with :data:`SKIP_PREFIX`; the run's summary counts those skips.

The server listens on 127.0.0.1 on a free port, keeps its data in the test's folder, and is
stopped by its PID at the end of the test; every wait on it is bounded.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

__all__ = ["SKIP_PREFIX", "PrometheusServer", "tool"]

SKIP_PREFIX = "[prometheus tools]"


def tool(name: str) -> str:
    """The path of ``promtool`` or ``prometheus``, or skip the test saying why."""
    override = os.environ.get(f"WORKERSET_ADMISSION_{name.upper()}_BIN")
    found = override or shutil.which(name)
    if not found or not os.access(found, os.X_OK):
        where = f"not at {override}" if override else "not on PATH"
        pytest.skip(
            f"{SKIP_PREFIX} no {name} executable ({where}): install Debian's prometheus "
            "package (apt-get install prometheus), as .ci/run does"
        )
    return found


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class PrometheusServer:
    """One Prometheus server scraping ``targets`` every ``interval`` seconds."""

    def __init__(
        self,
        folder: Path,
        targets: dict[str, list[str]],
        *,
        interval: float = 1.0,
        rule_files: tuple[Path, ...] = (),
    ) -> None:
        self.binary = tool("prometheus")
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.interval = interval
        self.rule_files = rule_files
        self.config = folder / "prometheus.yml"
        self.write_config(
            [
                {"job_name": job, "static_configs": [{"targets": addresses}]}
                for job, addresses in targets.items()
            ]
        )
        self.log = folder / "prometheus.log"
        self.process: subprocess.Popen[bytes] | None = None

    def write_config(self, scrape_configs: list[dict[str, Any]]) -> None:
        """Write the configuration: these scrape jobs, the rule files, one interval for both."""
        every = f"{self.interval:g}s"
        config = {
            "global": {"scrape_interval": every, "evaluation_interval": every},
            "rule_files": [str(path) for path in self.rule_files],
            "scrape_configs": scrape_configs,
        }
        self.config.write_text(yaml.safe_dump(config), encoding="utf-8")

    def start(self, timeout: float = 30.0) -> PrometheusServer:
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                [
                    self.binary,
                    f"--config.file={self.config}",
                    f"--storage.tsdb.path={self.folder / 'data'}",
                    "--storage.tsdb.retention.time=1h",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.folder,
            )
        self.wait(lambda: self._ready(), timeout, "Prometheus to answer")
        return self

    def _ready(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"prometheus exited:\n{self.log.read_text(errors='replace')}")
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as reply:
                return bool(reply.status == 200)
        except OSError:
            return False

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)

    def api(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as reply:
            body = json.loads(reply.read())
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query: ``[{"metric": {...}, "value": [t, "v"]}, ...]``."""
        params = {"query": expr} if at is None else {"query": expr, "time": f"{at:.3f}"}
        data = self.api("query", **params)
        result = data["result"]
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": result}]
        return list(result)

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        data = self.api(
            "query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step=f"{step:g}"
        )
        return list(data["result"])

    def values(self, expr: str) -> dict[frozenset[tuple[str, str]], float]:
        """An instant query's series: labels (without job and instance) -> value."""
        return {
            frozenset(
                (k, v) for k, v in row["metric"].items() if k not in ("job", "instance")
            ): float(row["value"][1])
            for row in self.query(expr)
        }

    def wait(self, condition: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{what} did not happen within {timeout:g} s; Prometheus log:\n"
                    + self.log.read_text(errors="replace")[-3000:]
                )
            time.sleep(0.2)

    def wait_for(self, expr: str, timeout: float, what: str) -> list[dict[str, Any]]:
        """Wait until ``expr`` returns at least one series; return them."""
        found: list[dict[str, Any]] = []

        def seen() -> bool:
            nonlocal found
            found = self.query(expr)
            return bool(found)

        self.wait(seen, timeout, what)
        return found
