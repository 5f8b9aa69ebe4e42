"""``workerset-admission serve`` as a real process, for tests that kill and restart it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

__all__ = ["CLI", "ServeProcess"]

CLI = (sys.executable, "-m", "workerset_admission.cli")

# An armed process has made serve's imports and waits for a line on stdin before it starts
# serving: a restart then takes what serve itself takes, not what loading Python takes on a
# busy machine.
_ARMED = """\
import sys
import workerset_admission.wiring.compose
from workerset_admission.cli.runner import main
print("armed", flush=True)
sys.stdin.readline()
sys.exit(main(["serve", *sys.argv[1:]]))
"""


# A host whose clock is off: the process's wall clock (``time.time``) runs ``skew`` seconds from
# this machine's. Monotonic time is untouched, as on a real host.
_SKEWED = """\
import time
_skew = {skew!r}
_time, _time_ns = time.time, time.time_ns
time.time = lambda: _time() + _skew
time.time_ns = lambda: _time_ns() + int(_skew * 1e9)
"""

_SERVE = """\
import sys
from workerset_admission.cli.runner import main
sys.exit(main(["serve", *sys.argv[1:]]))
"""


class ServeProcess:
    """One ``serve`` process; its output is read as it comes, so a test can wait for a line.

    With ``armed`` it starts serving only when :meth:`fire` is called; with ``clock_skew`` its
    wall clock is that many seconds off this machine's.
    """

    def __init__(
        self,
        args: Sequence[str],
        *,
        view_dir: Path | None = None,
        armed: bool = False,
        clock_skew: float = 0.0,
    ) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("WORKERSET_ADMISSION_")}
        env["PYTHONUNBUFFERED"] = "1"
        if view_dir is not None:
            env["DYN_FILE_KV"] = str(view_dir)
        command = [sys.executable, "-c", _ARMED, *args] if armed else [*CLI, "serve", *args]
        if clock_skew:
            code = _SKEWED.format(skew=float(clock_skew)) + (_ARMED if armed else _SERVE)
            command = [sys.executable, "-c", code, *args]
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE if armed else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        self._lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.append(line)

    def fire(self) -> None:
        """Let an armed process start serving."""
        assert self.process.stdin is not None
        self.process.stdin.write("\n")
        self.process.stdin.close()

    @property
    def output(self) -> str:
        return "".join(self._lines)

    def wait_for_line(self, text: str, timeout: float) -> None:
        """Wait until a line of the output holds ``text``; fail with the output so far."""
        deadline = time.monotonic() + timeout
        while text not in self.output:
            if self.process.poll() is not None and not self._reader.is_alive():
                raise AssertionError(f"serve exited before saying {text!r}:\n{self.output}")
            if time.monotonic() > deadline:
                raise AssertionError(f"serve did not say {text!r} in {timeout:g} s:\n{self.output}")
            time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL: what a crash looks like; nothing is withdrawn."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=30)
        self._finish()

    def _finish(self) -> None:
        self._reader.join(timeout=10)
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None and not stream.closed:
                stream.close()

    def stop(self) -> tuple[int, str]:
        """SIGTERM and wait (SIGKILL after 30 s); return the exit status and the output."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=30)
        self._finish()
        return self.process.returncode, self.output
