"""Arize Phoenix as a tracing backend for tests: its own virtual environment, start, query, stop.

Phoenix and its few hundred megabytes of dependencies live in a separate virtual environment so
that nothing of them mixes with the project's. ``PHOENIX_VENV`` names that environment; when it
already holds ``bin/phoenix`` it is reused as it is, otherwise it is created there (or in the
caller's scratch directory) with a bounded install.

Phoenix's OTLP gRPC listener binds every interface whatever ``PHOENIX_HOST`` says, so the server
is only ever started inside a private network namespace holding nothing but loopback (see
``phoenix_scenario.py``); :func:`network_namespace_problem` tells whether such a namespace can be
made here.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "PHOENIX_REQUIREMENT",
    "PHOENIX_VENV_ENV",
    "RUN_PHOENIX_ENV",
    "PhoenixServer",
    "PhoenixVenvError",
    "ensure_phoenix_venv",
    "fetch_spans",
    "network_namespace_problem",
    "phoenix_enabled",
    "run_in_own_session",
]

PHOENIX_REQUIREMENT = "arize-phoenix==20.26.1"
PHOENIX_VENV_ENV = "PHOENIX_VENV"
RUN_PHOENIX_ENV = "WORKERSET_ADMISSION_RUN_PHOENIX"

# Phoenix reaches out to the internet for telemetry, fonts, model catalogues and sandboxes
# unless told not to; in a namespace without a network every such attempt would only cost
# time and log noise.
_OFFLINE: Mapping[str, str] = {
    "PHOENIX_ALLOW_EXTERNAL_RESOURCES": "false",
    "PHOENIX_TELEMETRY_ENABLED": "false",
    "PHOENIX_DISABLE_AGENT_ASSISTANT": "true",
    "PHOENIX_ALLOWED_SANDBOX_PROVIDERS": "NONE",
    "PHOENIX_ENABLE_MCP_SERVER": "false",
}


class PhoenixVenvError(RuntimeError):
    """Phoenix's virtual environment could not be found or made."""


def phoenix_enabled(flag: bool, environ: Mapping[str, str] | None = None) -> bool:
    """Return True when the Phoenix tests were asked for, by flag or by environment."""
    env = os.environ if environ is None else environ
    return flag or env.get(RUN_PHOENIX_ENV, "").strip().lower() in ("1", "true", "yes")


def network_namespace_problem() -> str | None:
    """Return why a private network namespace cannot be made here, or None when it can."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return "unshare --net is not permitted here: unshare is not installed"
    ip = shutil.which("ip")
    if ip is None:
        return "the ip command is not installed; it brings up loopback in the namespace"
    try:
        probe = subprocess.run(
            [unshare, "--net", "--", ip, "link", "set", "lo", "up"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare --net is not permitted here: {exc}"
    if probe.returncode != 0:
        detail = (probe.stderr or probe.stdout).strip() or f"exit status {probe.returncode}"
        return f"unshare --net is not permitted here: {detail}"
    return None


def run_in_own_session(
    command: list[str], env: Mapping[str, str], timeout: float
) -> tuple[int | None, str]:
    """Run a scenario in a session of its own; return its exit status (None: it overran).

    Its own session, so a scenario that overruns, or a run interrupted some other way (Ctrl-C,
    a test timeout), is killed with everything it started, wherever it got stuck.
    """
    scenario = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(env),
        start_new_session=True,
    )
    try:
        output, _ = scenario.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(scenario.pid, signal.SIGKILL)
        output, _ = scenario.communicate()
        return None, output
    finally:
        if scenario.poll() is None:
            os.killpg(scenario.pid, signal.SIGKILL)
            scenario.wait(timeout=10)
    return scenario.returncode, output


def _phoenix_in(venv: Path) -> Path | None:
    executable = venv / "bin" / "phoenix"
    return executable if executable.is_file() and os.access(executable, os.X_OK) else None


def ensure_phoenix_venv(scratch: Path, *, timeout: float = 240.0) -> Path:
    """Return the ``phoenix`` executable, installing Phoenix first when needed.

    ``$PHOENIX_VENV`` is used when it already holds Phoenix; otherwise Phoenix is installed
    there (a re-run then reuses it), or under ``scratch`` when the variable is unset. An
    existing directory that is neither empty nor a virtual environment is left untouched.
    """
    chosen = os.environ.get(PHOENIX_VENV_ENV, "").strip()
    venv = Path(chosen).absolute() if chosen else scratch / "venv-phoenix"
    found = _phoenix_in(venv)
    if found is not None:
        return found
    if venv.exists() and any(venv.iterdir()) and not (venv / "pyvenv.cfg").is_file():
        raise PhoenixVenvError(f"{venv} exists and is not a virtual environment; not touching it")
    deadline = time.monotonic() + timeout
    steps = [
        [sys.executable, "-m", "venv", str(venv)],
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", PHOENIX_REQUIREMENT],
    ]
    for step in steps:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise PhoenixVenvError(f"installing {PHOENIX_REQUIREMENT} took over {timeout:.0f} s")
        try:
            done = subprocess.run(
                step, capture_output=True, text=True, timeout=remaining, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise PhoenixVenvError(
                f"installing {PHOENIX_REQUIREMENT} took over {timeout:.0f} s"
            ) from exc
        if done.returncode != 0:
            raise PhoenixVenvError(
                f"{' '.join(step)} failed ({done.returncode}): {done.stderr.strip()[-2000:]}"
            )
    found = _phoenix_in(venv)
    if found is None:
        raise PhoenixVenvError(f"{PHOENIX_REQUIREMENT} installed but {venv}/bin/phoenix is missing")
    return found


class PhoenixServer:
    """One ``phoenix serve`` process on 127.0.0.1, its data in ``working_dir``.

    ``environ`` is the base environment for the process (HOME and TMPDIR should point at
    scratch space); the Phoenix settings are added to it here.
    """

    def __init__(
        self,
        executable: Path,
        working_dir: Path,
        *,
        http_port: int,
        grpc_port: int,
        environ: Mapping[str, str],
        log_path: Path,
    ) -> None:
        self.executable = executable
        self.working_dir = working_dir
        self.http_port = http_port
        self.grpc_port = grpc_port
        self.log_path = log_path
        self._environ = dict(environ)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def traces_endpoint(self) -> str:
        """Where OTLP/HTTP exporters send spans."""
        return f"{self.base_url}/v1/traces"

    def environment(self) -> dict[str, str]:
        env = dict(self._environ)
        env.update(_OFFLINE)
        env.update(
            {
                "PHOENIX_HOST": "127.0.0.1",
                "PHOENIX_PORT": str(self.http_port),
                "PHOENIX_GRPC_PORT": str(self.grpc_port),
                "PHOENIX_WORKING_DIR": str(self.working_dir),
            }
        )
        return env

    def launch(self) -> None:
        """Start the process without waiting for it (see :meth:`wait_ready`)."""
        self.working_dir.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [str(self.executable), "serve"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.environment(),
                cwd=self.working_dir,
            )

    def wait_ready(self, timeout: float) -> None:
        """Wait until ``/healthz`` answers 200; raise if the process exits or time runs out."""
        process = self.process
        if process is None:
            raise RuntimeError("phoenix was not launched")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(
                    f"phoenix exited with status {process.returncode}: {self.log_tail()}"
                )
            if _get_status(f"{self.base_url}/healthz") == 200:
                return
            time.sleep(0.25)
        raise RuntimeError(f"phoenix not ready after {timeout:.0f} s: {self.log_tail()}")

    def start(self, ready_timeout: float = 90.0) -> PhoenixServer:
        """Start the server and wait until it is ready."""
        self.launch()
        self.wait_ready(ready_timeout)
        return self

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM, then SIGKILL if it lingers; returns the exit status (None if never started)."""
        process, self.process = self.process, None
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=timeout)
        return process.returncode

    def log_tail(self, lines: int = 20) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""


def _get_status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            status: int = reply.status
            return status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (OSError, ValueError):
        return None


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return json.load(reply)


def _pages(base_url: str, project: str, page_size: int) -> Iterator[list[dict[str, Any]]]:
    cursor: str | None = None
    path = f"{base_url}/v1/projects/{urllib.parse.quote(project, safe='')}/spans"
    while True:
        query: dict[str, str | int] = {"limit": page_size}
        if cursor is not None:
            query["cursor"] = cursor
        page = _get_json(f"{path}?{urllib.parse.urlencode(query)}")
        yield list(page["data"])
        cursor = page.get("next_cursor")
        if not cursor:
            return


def fetch_spans(base_url: str, project: str, *, page_size: int = 100) -> list[dict[str, Any]]:
    """Return every span of ``project`` through the REST API, following the cursor.

    A project that does not exist yet (no span reached it) has no spans.
    """
    spans: list[dict[str, Any]] = []
    try:
        for page in _pages(base_url, project, page_size):
            spans.extend(page)
    except urllib.error.HTTPError as exc:
        if exc.code == 404 and not spans:
            return []
        raise
    return spans
