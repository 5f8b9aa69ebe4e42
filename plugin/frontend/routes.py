"""The Dynamo frontend route extension: admission state over the frontend's own HTTP server.

Registered under the ``dynamo.frontend.routes`` entry-point group as ``workerset-admission``;
an operator enables it with ``--frontend-route-extension workerset-admission`` or
``DYN_FRONTEND_ROUTE_EXTENSIONS=workerset-admission``. The provider starts the admission service
on its own thread and event loop (configured from ``WORKERSET_ADMISSION_*`` and the optional
config file), stops it when the process exits, and returns four GET routes under
:data:`ROUTE_PREFIX` (a built-in path collision would stop the frontend at startup):

* ``/workerset-admission/v1/workersets``: every WorkerSet with its identity, incumbent,
  status, build generation, admitted and routable ids, and its cohorts (incumbent first, then
  the rejected); and every rejected cohort with the checksum inputs its card differs in;
* ``/workerset-admission/v1/readiness``: readiness per model and namespace from the shared
  evaluator, beside what the frontend itself reports for the model;
* ``/workerset-admission/v1/workers``: every worker this frontend knows, with its WorkerSet,
  its admission state and upstream's serving-state words (``serving``, ``draining``,
  ``drained``, ``unavailable``, ``unknown``; see ``service/worker_listing.py``);
* ``/workerset-admission/v1/health``: 200 once the service has applied its first discovery
  snapshot, 503 while starting, retrying, draining or stopped (a readiness probe).

Handlers are synchronous and only read the service's last immutable status.

The boundary judges cards as this frontend does: the Dynamo line comes from the installed
release (:func:`frontend_settings`), whatever ``WORKERSET_ADMISSION_DYNAMO_VERSION`` says.

With ``WORKERSET_ADMISSION_VIEW_DIR`` set (the frontend's own ``DYN_FILE_KV``, with
``--discovery-backend file``) the service also writes the admitted discovery view the frontend
routes from (see ``view``). The directory is checked and locked when the provider is called, so
a view the frontend would never read, or one another live writer owns, stops the frontend at
startup with the reason, instead of leaving it to route by its own choices.

Telemetry is opt-in here as in ``serve``: ``WORKERSET_ADMISSION_TELEMETRY=1`` installs the
OpenTelemetry SDK with the exporters the ``OTEL_*`` environment chooses, and
``WORKERSET_ADMISSION_PROMETHEUS_PORT`` serves the metrics for Prometheus on a port of the
plugin's own (``WORKERSET_ADMISSION_PROMETHEUS_HOST``, loopback by default). Dynamo 1.6.1 gives
a route extension no way onto the frontend's ``/metrics``: a route's body is always sent as
JSON, the provider is handed no runtime, and the runtime's metrics callbacks feed only the
system status server, which the frontend never starts. The providers are the plugin's own and
never the process's global ones: the process belongs to the frontend, whose libraries (or a
later release) may install their own, and a global provider can be set only once. Telemetry
that cannot start is logged and left off; the service starts regardless.
"""

from __future__ import annotations

import atexit
import importlib.metadata
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from workerset_admission.card.lines import line_of_version
from workerset_admission.errors import UsageError, ViewDirectoryError, WorkersetAdmissionError
from workerset_admission.frontend.host import HostState, RunningService, ServiceThread
from workerset_admission.identity import with_id_strings
from workerset_admission.service.admission_service import ServiceStatus
from workerset_admission.service.loop_watch import LoopWatch
from workerset_admission.settings import Settings, load_settings

if TYPE_CHECKING:
    from workerset_admission.adapters.dynamo.view import DirectoryFiles
    from workerset_admission.telemetry import AdmissionTelemetry, TelemetryHandle

__all__ = [
    "HEALTH_PATH",
    "READINESS_PATH",
    "ROUTE_PREFIX",
    "WORKERSETS_PATH",
    "WORKERS_PATH",
    "AdmissionRoutes",
    "ExtensionContext",
    "Reply",
    "frontend_routes",
    "frontend_settings",
    "installed_dynamo_release",
    "open_extension_view",
    "shared_host",
    "shared_telemetry",
    "start_extension_telemetry",
    "stop_shared_host",
]

_log = logging.getLogger(__name__)

ROUTE_PREFIX = "/workerset-admission/v1"
WORKERSETS_PATH = f"{ROUTE_PREFIX}/workersets"
READINESS_PATH = f"{ROUTE_PREFIX}/readiness"
HEALTH_PATH = f"{ROUTE_PREFIX}/health"
WORKERS_PATH = f"{ROUTE_PREFIX}/workers"


class ExtensionContext(Protocol):
    """The part of Dynamo's ``FrontendExtensionContext`` the handlers read."""

    def is_cancelled(self) -> bool: ...

    def is_model_ready_to_serve(self, model: str) -> bool: ...


class StatusService(RunningService, Protocol):
    def settled_status(self, timeout: float = 1.0) -> ServiceStatus: ...


@dataclass(frozen=True, slots=True)
class Reply:
    """A handler's answer: HTTP status and a JSON-serializable body."""

    status: int
    body: dict[str, Any]


class AdmissionRoutes:
    """Answer the extension's routes from whatever state the host holds right now."""

    def __init__(
        self, state: Callable[[], HostState[StatusService]], watch: LoopWatch | None = None
    ) -> None:
        self._state = state
        self._watch = watch

    def _current(self) -> tuple[HostState[StatusService], ServiceStatus | None]:
        state = self._state()
        # Every step before the request, as a NATS status answer has it.
        return state, None if state.service is None else state.service.settled_status()

    def workersets(self, ctx: ExtensionContext) -> Reply:
        state, current = self._current()
        if current is None:
            return Reply(503, _not_running(state))
        return Reply(
            200,
            # Every id list a second time as decimal strings: JSON tools that read numbers as
            # doubles round ids above 2^53.
            with_id_strings(
                {
                    "health": current.health,
                    "synced": current.synced,
                    "workersets": [group.to_json() for group in current.groups],
                    "rejections": [rejection.to_json() for rejection in current.rejections],
                    "invalid_total": current.invalid_total,
                    "recent_invalid": [record.to_json() for record in current.recent_invalid],
                }
            ),
        )

    def workers(self, ctx: ExtensionContext) -> Reply:
        from workerset_admission.service.worker_listing import worker_listing

        state, current = self._current()
        if current is None:
            return Reply(503, _not_running(state))
        rows = worker_listing(current)
        return Reply(200, with_id_strings({"synced": current.synced, "workers": rows}))

    def readiness(self, ctx: ExtensionContext) -> Reply:
        state, current = self._current()
        if current is None:
            return Reply(503, _not_running(state))
        models = []
        for unit in current.readiness:
            answer = unit.to_json()
            # Dynamo's own answer for the model, for comparison with the evaluator's.
            answer["frontend_ready"] = ctx.is_model_ready_to_serve(unit.model)
            models.append(answer)
        return Reply(200, {"synced": current.synced, "models": models})

    def health(self, ctx: ExtensionContext) -> Reply:
        state, current = self._current()
        if current is None:
            return Reply(503, _not_running(state))
        if ctx.is_cancelled():
            return Reply(503, {"status": "shutting_down"})
        if self._watch is not None and self._watch.stuck():
            # The service's loop stopped turning: the view stands still (for its horizon).
            silent = round(self._watch.silent_for(), 3)
            return Reply(503, {"status": "stalled", "silent_for": silent})
        healthy = current.health == "healthy"
        body = {
            "status": current.health,
            "synced": current.synced,
            "workersets": len(current.groups),
            "live_instances": current.live_instances,
        }
        return Reply(200 if healthy else 503, body)

    def frontend_routes(self) -> list[Any]:
        """Wrap the handlers as Dynamo ``FrontendRoute`` objects."""
        from dynamo.llm import FrontendRoute

        table: list[tuple[str, Callable[[ExtensionContext], Reply]]] = [
            (WORKERSETS_PATH, self.workersets),
            (READINESS_PATH, self.readiness),
            (WORKERS_PATH, self.workers),
            (HEALTH_PATH, self.health),
        ]
        return [FrontendRoute("GET", path, _frontend_handler(path, h)) for path, h in table]


def _not_running(state: HostState[Any]) -> dict[str, Any]:
    body: dict[str, Any] = {"status": state.phase, "attempts": state.attempts}
    if state.error is not None:
        body["error"] = state.error
    return body


def _frontend_handler(
    path: str, handler: Callable[[ExtensionContext], Reply]
) -> Callable[[Any], Any]:
    from dynamo.llm import FrontendResponse

    def answer(ctx: Any) -> Any:
        try:
            reply = handler(ctx)
        except WorkersetAdmissionError as exc:
            # Said in this plugin's words; anything else the frontend answers itself ("frontend
            # route extension failed", a 500) and logs, so it is never a frontend fault.
            _log.warning("route %s failed: %s", path, exc, exc_info=True)
            return FrontendResponse(500, {"status": "error", "error": str(exc)})
        return FrontendResponse(reply.status, reply.body)

    return answer


def start_extension_telemetry(settings: Settings) -> TelemetryHandle | None:
    """Install the telemetry the settings ask for, with providers of the plugin's own.

    None when none is asked for, or when it cannot start (the reason is logged once: telemetry
    never keeps admission from running).
    """
    from workerset_admission.telemetry import setup_telemetry

    prometheus = settings.prometheus_address
    if not settings.telemetry and prometheus is None:
        return None
    try:
        handle = setup_telemetry(otlp=settings.telemetry, prometheus=prometheus, set_global=False)
    except (WorkersetAdmissionError, OSError, ValueError, ImportError) as exc:
        # A bad OTEL_* value, a taken port or a missing exporter; admission goes on.
        _log.warning("workerset-admission telemetry is off: %s", exc)
        return None
    if handle.prometheus_url is not None:
        _log.info("workerset-admission metrics for Prometheus on %s", handle.prometheus_url)
    return handle


async def _start_from_environment(
    telemetry: AdmissionTelemetry | None, view: DirectoryFiles | None
) -> StatusService:
    from workerset_admission.wiring.compose import create_service

    # The same composition root as ``workerset-admission serve``: discovery source,
    # serving-admission publisher, status responder, view and trace, all from
    # WORKERSET_ADMISSION_* and the config file.
    service: StatusService = await create_service(
        frontend_settings(load_settings()), telemetry=telemetry, view_files=view
    )
    return service


# The distributions a Dynamo frontend's release can be read from, the frontend's own first.
DYNAMO_DISTRIBUTIONS = ("ai-dynamo", "ai-dynamo-runtime")


def installed_dynamo_release(
    version_of: Callable[[str], str] = importlib.metadata.version,
) -> str | None:
    """Return the release of the Dynamo installed in this process, or ``None`` when none is."""
    found = [_version_or_none(version_of, name) for name in DYNAMO_DISTRIBUTIONS]
    return next((version for version in found if version is not None), None)


def _version_or_none(version_of: Callable[[str], str], name: str) -> str | None:
    try:
        return version_of(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def frontend_settings(settings: Settings, release: str | None = None) -> Settings:
    """Return the settings with the Dynamo line of the frontend this extension runs inside.

    The boundary must refuse what this frontend refuses, so the installed release (``release``,
    else the one :func:`installed_dynamo_release` finds) decides the line. A ``dynamo_version``
    the operator set that disagrees is overruled, with a warning naming both; with no release
    found the setting stands.
    """
    release = release if release is not None else installed_dynamo_release()
    if release is None:
        _log.info(
            "no Dynamo release found installed; judging cards as Dynamo %s",
            settings.dynamo_version,
        )
        return settings
    try:
        line = line_of_version(release)
    except UsageError as exc:
        _log.warning("%s; judging cards as Dynamo %s", exc, settings.dynamo_version)
        return settings
    if line == settings.dynamo_version:
        return settings
    if "dynamo_version" in settings.model_fields_set:
        _log.warning(
            "dynamo_version is set to %s but this frontend runs Dynamo %s: judging cards as "
            "Dynamo %s, as the frontend does",
            settings.dynamo_version,
            release,
            line,
        )
    return settings.model_copy(update={"dynamo_version": line})


_shared_view: DirectoryFiles | None = None


def open_extension_view() -> DirectoryFiles | None:
    """Lock the view directory the settings name, once per process; refuse an unusable one.

    Raises :class:`ViewDirectoryError` when it is not the frontend's file store, missing, not
    writable, or owned by another live writer. Bad settings of any other kind are left to the
    service's start, which reports them on the health route.
    """
    global _shared_view
    from workerset_admission.adapters.dynamo.view import DirectoryFiles, check_frontend_store

    with _shared_lock:
        if _shared_view is not None:
            return _shared_view
        try:
            settings = load_settings()
        except WorkersetAdmissionError:
            return None
        if settings.view_dir is None:
            return None
        check_frontend_store(settings.view_dir)
        _shared_view = DirectoryFiles.open(settings.view_dir)
        atexit.register(_release_view)
        return _shared_view


def _release_view() -> None:
    global _shared_view
    with _shared_lock:
        view, _shared_view = _shared_view, None
    if view is not None:
        view.release()


_shared: ServiceThread[StatusService] | None = None
_shared_telemetry: TelemetryHandle | None = None
_shared_lock = threading.Lock()


def _extension_telemetry() -> tuple[TelemetryHandle | None, AdmissionTelemetry | None]:
    from workerset_admission.wiring.compose import admission_telemetry

    try:
        settings = load_settings()
    except WorkersetAdmissionError:
        # The service's own start reports bad settings, on the health route and in the log.
        return None, None
    handle = start_extension_telemetry(settings)
    if handle is None:
        return None, None
    # One facade for every start attempt: its instruments are registered once per provider.
    return handle, admission_telemetry(settings, handle)


def shared_host(view: DirectoryFiles | None = None) -> ServiceThread[StatusService]:
    """Return the process's one admission service thread, starting it on first use."""
    global _shared, _shared_telemetry
    with _shared_lock:
        if _shared is None:
            _shared_telemetry, telemetry = _extension_telemetry()
            _shared = ServiceThread(
                lambda: _start_from_environment(telemetry, view), name="workerset-admission"
            )
            # Registered before the thread registers its own stop, so at exit it runs after
            # it: the service's last spans are made before the exporters flush and close.
            atexit.register(stop_shared_host)
        host = _shared
    host.start()
    return host


def shared_telemetry() -> TelemetryHandle | None:
    """Return the telemetry the running extension installed, if any (its Prometheus port)."""
    return _shared_telemetry


def stop_shared_host() -> None:
    """Stop the process's admission service, then its telemetry (also runs at exit)."""
    global _shared, _shared_telemetry
    with _shared_lock:
        host, _shared = _shared, None
        handle, _shared_telemetry = _shared_telemetry, None
    atexit.unregister(stop_shared_host)
    if host is not None:
        host.stop()
    if handle is not None:
        handle.shutdown()


def frontend_routes() -> list[Any]:
    """Provide the extension's routes to Dynamo's loader; starts the service behind them.

    A view directory it cannot use stops the frontend with one line and status 1 (a
    ``SystemExit`` with the reason), not a traceback through the frontend's start-up.
    """
    from workerset_admission.telemetry.logs import name_records_for_hosts

    # The frontend names a Python line by module and function: name ours by their loggers.
    name_records_for_hosts()
    try:
        view = open_extension_view()
    except ViewDirectoryError as exc:
        raise SystemExit(f"workerset-admission refuses to start: {exc}") from None
    host = shared_host(view)
    return AdmissionRoutes(lambda: host.state, host.watch).frontend_routes()
