"""What a supervisor reads of ``serve``: systemd's notify protocol and an HTTP liveness endpoint.

Both follow the loop's beat (:class:`~workerset_admission.service.loop_watch.LoopWatch`), so a
process that is alive but no longer works is restarted like a dead one:

* under systemd (``Type=notify`` with ``WatchdogSec=``), ``READY=1`` once the loop runs and
  ``WATCHDOG=1`` at every beat: a stopped or stuck loop stops the pings and systemd restarts
  the unit;
* ``--health-port``: ``GET /livez`` answers 200 while the loop beats and 503 once it has been
  silent for ``STALLED_AFTER`` (20) seconds (served from a thread of its own, so it can say so
  while the loop is stuck; a paused process answers nothing, which a probe's timeout counts as
  a failure too); ``GET /readyz`` answers 200 once the service applied its first discovery
  listing. Kubernetes' liveness probe reads the first, its readiness probe the second. A
  probe that gave up before its answer (its timeout ran out while the process was paused)
  costs one DEBUG line, not a traceback.

A restart costs the frontend nothing: the admitted view outlives its writer for its horizon,
and the restarted writer adopts it.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from workerset_admission.service.loop_watch import STALLED_AFTER, LoopWatch

__all__ = ["HealthServer", "Probe", "SystemdNotifier"]

_log = logging.getLogger("workerset_admission.cli")


class SystemdNotifier:
    """Send sd_notify messages to ``NOTIFY_SOCKET``; a no-op where systemd did not set one."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        address = (os.environ if environ is None else environ).get("NOTIFY_SOCKET", "")
        # An abstract socket is named with a leading '@', sent as a leading NUL byte.
        self._address = "\0" + address[1:] if address.startswith("@") else address
        self._socket: socket.socket | None = None
        if self._address:
            self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._socket.setblocking(False)

    @property
    def enabled(self) -> bool:
        return self._socket is not None

    def notify(self, message: str) -> None:
        if self._socket is None:
            return
        try:
            self._socket.sendto(message.encode(), self._address)
        except OSError as exc:  # systemd gone or the socket full: the next beat tries again
            _log.debug("sd_notify %r failed: %s", message, exc)

    def follow(self, watch: LoopWatch, healthy: Callable[[], bool] | None = None) -> None:
        """Say ready now, and ping the watchdog at every beat of ``watch``.

        With ``healthy``, only at the beats when it says so: a process whose loop turns but
        whose work stopped (a bridge whose source loop hangs) misses the watchdog too.
        """
        if self._socket is None:
            return
        self.notify("READY=1")

        def ping() -> None:
            if healthy is None or healthy():
                self.notify("WATCHDOG=1")

        watch.on_beat(ping)

    def close(self) -> None:
        if self._socket is not None:
            self.notify("STOPPING=1")
            self._socket.close()
            self._socket = None


class _QuietServer(ThreadingHTTPServer):
    """An HTTP server that lets a client that hung up go with one DEBUG line, not a traceback."""

    def handle_error(self, request: object, client_address: object) -> None:
        failure = sys.exc_info()[1]
        if isinstance(failure, ConnectionError):
            _log.debug("a probe from %s went away: %s", client_address, failure)
            return
        super().handle_error(request, client_address)  # type: ignore[arg-type]


Probe = Callable[[], tuple[bool, dict[str, object]]]
"""A check of one's own: whether it passes, and what the answer's body says of it."""


class HealthServer:
    """``/livez`` and ``/readyz`` over HTTP, on a thread of their own.

    ``liveness`` and ``readiness``, when given, are checks of the process's own beside the
    loop's beat and ``ready`` (a bridge's source loop and its lag): each must pass too, and
    its figures join the answer's body. They are called on the server's thread.
    """

    def __init__(
        self,
        watch: LoopWatch,
        ready: Callable[[], bool],
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        stalled_after: float = STALLED_AFTER,
        liveness: Probe | None = None,
        readiness: Probe | None = None,
    ) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                status, body = outer.answer(self.path)
                data = json.dumps(body, sort_keys=True).encode() + b"\n"
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except ConnectionError as exc:
                    # The probe gave up first (its timeout ran out while the process was
                    # paused or busy): nobody is left to read the answer.
                    _log.debug("a %s probe went away before its answer: %s", self.path, exc)
                    self.close_connection = True

            def log_message(self, format: str, *args: object) -> None:
                return  # probes every few seconds would flood the log

        self._watch = watch
        self._ready = ready
        self._liveness = liveness
        self._readiness = readiness
        self._stalled_after = stalled_after
        self._server = _QuietServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="workerset-admission-health", daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def answer(self, path: str) -> tuple[int, dict[str, object]]:
        """Return the status and JSON body for ``path``."""
        silent = round(self._watch.silent_for(), 3)
        if path == "/livez":
            turning = not self._watch.stuck(self._stalled_after)
            body: dict[str, object] = {
                "loop": "turning" if turning else "stalled",
                "silent_for": silent,
                "stalls": self._watch.stalls,
                "longest_stall": round(self._watch.longest_stall, 3),
            }
            live = turning
            if self._liveness is not None:
                passes, figures = self._liveness()
                body.update(figures)
                live = live and passes
            return (200 if live else 503), body
        if path == "/readyz":
            ready = self._ready()
            answer: dict[str, object] = {"synced": ready, "silent_for": silent}
            if self._readiness is not None:
                passes, figures = self._readiness()
                answer.update(figures)
                ready = ready and passes
            return (200 if ready else 503), answer
        return 404, {"error": "not found: try /livez or /readyz"}

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
