"""A probe that gave up while ``serve`` was paused leaves no traceback once serve runs again."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

CLI = [sys.executable, "-m", "workerset_admission.cli"]


def _status(url: str, timeout: float) -> int | None:
    """The probe's answer, or None when it timed out (as a kubelet's probe counts it)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as refused:
        return refused.code
    except (TimeoutError, urllib.error.URLError):
        return None


def test_probes_that_timed_out_while_serve_was_paused_leave_no_traceback(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WORKERSET_ADMISSION_")}
    env["PYTHONUNBUFFERED"] = "1"
    env["WORKERSET_ADMISSION_SERVE_FILE"] = str(tmp_path / "serve.json")
    serve = subprocess.Popen(
        [*CLI, "serve", "--store-dir", str(tmp_path / "js"), "--frontend-id", "fe-paused"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**env, "WORKERSET_ADMISSION_HEALTH_PORT": "0"},
    )
    try:
        assert serve.stdout is not None
        url = None
        deadline = time.monotonic() + 30
        while url is None:
            assert time.monotonic() < deadline, "serve named no health endpoint"
            line = serve.stdout.readline()
            assert line, "serve ended before naming its health endpoint"
            if found := re.search(r"liveness on (http://\S+)/livez", line):
                url = found.group(1)
        assert _status(f"{url}/livez", 5) == 200
        serve.send_signal(signal.SIGSTOP)
        try:
            # Each probe is accepted by the kernel, sends its request, and gives up.
            assert [_status(f"{url}/livez", 0.5) for _ in range(3)] == [None, None, None]
        finally:
            serve.send_signal(signal.SIGCONT)
        time.sleep(1.0)  # serve answers the three requests to sockets that are gone
        assert _status(f"{url}/livez", 5) == 200
        serve.send_signal(signal.SIGTERM)
        _out, err = serve.communicate(timeout=30)
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.communicate(timeout=10)
    assert serve.returncode == 0, err
    assert "Traceback" not in err
    assert "BrokenPipeError" not in err
    assert "ConnectionResetError" not in err
