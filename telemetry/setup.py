"""The one opt-in function that installs the OpenTelemetry SDK and its exporters.

Nothing in the package calls it at import: ``serve`` calls it, and so does the Dynamo
frontend's route extension when its settings ask for telemetry (with providers of its own, not
the process's global ones); any other host may call it or wire its own SDK. It follows the
standard environment variables:

- ``OTEL_SDK_DISABLED=true`` turns everything off;
- ``OTEL_TRACES_EXPORTER`` / ``OTEL_METRICS_EXPORTER``: ``otlp`` (default), ``console`` or
  ``none``, or a comma-separated list of the first two;
- ``OTEL_EXPORTER_OTLP_PROTOCOL`` (or the per-signal ``..._TRACES_PROTOCOL`` /
  ``..._METRICS_PROTOCOL``): ``http/protobuf`` (default) or ``grpc``;
- ``OTEL_EXPORTER_OTLP_ENDPOINT`` and friends, ``OTEL_SERVICE_NAME``,
  ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER`` / ``..._ARG``, ``OTEL_BSP_*``,
  ``OTEL_METRIC_EXPORT_INTERVAL``: read by the SDK and the exporters themselves.

Metrics can also be served in the Prometheus text format on a loopback port, through the
OpenTelemetry Prometheus exporter, with a registry of our own (so two setups in one process,
or a host's own prometheus_client metrics, never collide). The endpoint is a
``worker_state_page.PrometheusPage``: the per-worker state family, one series per worker, is
served there as text the telemetry keeps, not rendered by the exporter at every scrape.

An exporter that cannot reach its collector costs only the telemetry it drops: the exports run
on the SDK's own threads, and the failure is said once per outage (one WARNING of ours, one
record of the exporter's own; its retries are kept out of the log until an export succeeds
again, which is said at INFO). At shutdown a collector already known to be away is not waited
for, and the final flush of any other gets a grace of a few seconds, never the exporters' full
retry timeout.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from workerset_admission.errors import ConfigError
from workerset_admission.telemetry.guard import guarded
from workerset_admission.telemetry.logs import install_log_correlation

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import MetricExporter, MetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from workerset_admission.telemetry.worker_state_page import PrometheusPage

__all__ = ["DEFAULT_SERVICE_NAME", "TelemetryHandle", "setup_telemetry"]

DEFAULT_SERVICE_NAME = "workerset-admission"

_log = logging.getLogger(__name__)
_PROTOCOLS = ("http/protobuf", "grpc")
_EXPORTERS = ("otlp", "console", "none")
_SHUTDOWN_GRACE = 3.0


class TelemetryHandle:
    """What ``setup_telemetry`` installed; ``shutdown()`` flushes and stops all of it.

    ``tracer_provider`` / ``meter_provider`` are None when that signal is off; hand them to
    ``AdmissionTelemetry`` (they are also the global providers when the setup set them).
    ``prometheus_port`` is the port the metrics endpoint listens on, when one was asked for,
    ``prometheus_url`` its whole address (``http://host:port/metrics``), and
    ``prometheus_page`` the page it serves (hand it to ``AdmissionTelemetry`` too).
    """

    def __init__(
        self,
        tracer_provider: TracerProvider | None,
        meter_provider: MeterProvider | None,
        prometheus_port: int | None,
        closers: Sequence[Callable[[], None]],
        *,
        prometheus_url: str | None = None,
        prometheus_page: PrometheusPage | None = None,
        exports: Sequence[_ExportHealth] = (),
    ) -> None:
        self.tracer_provider = tracer_provider
        self.meter_provider = meter_provider
        self.prometheus_port = prometheus_port
        self.prometheus_url = prometheus_url
        self.prometheus_page = prometheus_page
        self._closers = list(closers)
        self._exports = list(exports)
        self._lock = threading.Lock()
        self._closed = False

    def force_flush(self, timeout_millis: int = 10_000) -> bool:
        """Export whatever is buffered now; False when an exporter did not finish in time."""
        ok = True
        for provider in (self.tracer_provider, self.meter_provider):
            if provider is None:
                continue
            flushed = False
            with guarded("the flush of an exporter", "what it held may be lost"):
                flushed = bool(provider.force_flush(timeout_millis))
            ok = flushed and ok
        return ok

    def shutdown(self) -> None:
        """Flush, stop the exporters and the metrics endpoint. Idempotent; never raises."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for export in self._exports:
            export.closing()
        # The final flush gets a short grace; a collector that does not answer within it is
        # given up, so an outage never holds up the process's exit for the exporters' timeout.
        deadline = threading.Timer(_SHUTDOWN_GRACE, self._abandon_exports)
        deadline.daemon = True
        deadline.start()
        try:
            for provider in (self.tracer_provider, self.meter_provider):
                if provider is None:
                    continue
                with guarded("the shutdown of an exporter", "the others are still shut down"):
                    provider.shutdown()
        finally:
            deadline.cancel()
        for close in reversed(self._closers):
            _quietly(close)

    def _abandon_exports(self) -> None:
        for export in self._exports:
            export.abandon()


def _quietly(close: Callable[[], None]) -> None:
    with guarded("closing a part of the telemetry", "the other parts are still closed"):
        close()


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() == "true"


def _exporter_choices(signal: str) -> list[str]:
    """Read ``OTEL_<signal>_EXPORTER``: a comma-separated list, ``none`` meaning no exporter."""
    raw = os.environ.get(f"OTEL_{signal}_EXPORTER", "otlp")
    choices = [part.strip().lower() for part in raw.split(",") if part.strip()] or ["otlp"]
    for choice in choices:
        if choice not in _EXPORTERS:
            raise ConfigError(
                f"OTEL_{signal}_EXPORTER={raw!r}: {choice!r} is not supported; "
                f"use {', '.join(_EXPORTERS)}"
            )
    return [choice for choice in dict.fromkeys(choices) if choice != "none"]


def _protocol(signal: str) -> str:
    value = (
        os.environ.get(f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL")
        or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()
    if value not in _PROTOCOLS:
        raise ConfigError(
            f"OTLP protocol {value!r} is not supported; use one of {', '.join(_PROTOCOLS)}"
        )
    return value


def _resource(service_name: str, attributes: Mapping[str, str] | None) -> Any:
    from opentelemetry.sdk.resources import SERVICE_NAME, OTELResourceDetector, Resource

    explicit: dict[str, Any] = dict(attributes or {})
    # The operator's OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES beat the code's default name.
    from_env = OTELResourceDetector().detect().attributes
    if SERVICE_NAME not in explicit and SERVICE_NAME not in from_env:
        explicit[SERVICE_NAME] = service_name
    return Resource.create(explicit)


class _ExportHealth(logging.Filter):
    """Says once that a signal's export fails, and once that it works again.

    Also a filter on the exporter library's own loggers: the first warning of an outage passes
    (it carries the detail: refused, timed out, a 4xx), the retries after it do not, until an
    export succeeds. Without it an unreachable collector would log every few seconds for as
    long as it stays away.
    """

    def __init__(self, signal: str, where: str) -> None:
        super().__init__()
        self._signal = signal
        self._where = where
        self._lock = threading.Lock()
        self._failing = False
        self._quiet = False
        self._abandoned = False
        self._abandon: Callable[[], None] | None = None
        self._loggers: list[logging.Logger] = []

    @property
    def abandoned(self) -> bool:
        """Tell whether exports are dropped at once: given up during shutdown."""
        return self._abandoned

    def closing(self) -> None:
        """Prepare for shutdown: a collector already known to be away is waited for no more.

        Otherwise the final flush would retry for the whole exporter timeout per signal
        (10 s by default) and hold up the process's exit for nothing.
        """
        if self._failing:
            self.abandon()

    def abandon(self) -> None:
        """Drop every export from now on, and stop the one retrying, if any."""
        with self._lock:
            self._abandoned = True
            abandon, self._abandon = self._abandon, None
        if abandon is not None:
            # Shutting the exporter down interrupts a retry it is sleeping in.
            _quietly(abandon)

    def record(self, ok: bool) -> None:
        with self._lock:
            changed = ok == self._failing
            self._failing = not ok
            if ok:
                self._quiet = False
        if changed and not ok:
            _log.warning(
                "%s export to %s failed; %s are dropped until it works again "
                "(admission is unaffected; said once per outage)",
                self._signal,
                self._where,
                self._signal,
            )
        elif changed:
            _log.info("%s export to %s works again", self._signal, self._where)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        with self._lock:
            if self._quiet:
                return False
            self._quiet = True
        return True

    def watch(self, exporter: object, close: Callable[[], None]) -> None:
        """Filter the loggers of the modules the exporter's classes come from."""
        self._abandon = close
        modules = {
            cls.__module__
            for cls in type(exporter).__mro__
            if cls.__module__.startswith("opentelemetry.exporter.")
        }
        for module in sorted(modules):
            logger = logging.getLogger(module)
            logger.addFilter(self)
            self._loggers.append(logger)

    def unwatch(self) -> None:
        for logger in self._loggers:
            logger.removeFilter(self)
        self._loggers.clear()


def _otlp_where(signal: str) -> str:
    # The exporters resolve the real URL themselves; this only names it in the one warning.
    return (
        os.environ.get(f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or "the default OTLP endpoint"
    )


def _once(action: Callable[[], None]) -> Callable[[], None]:
    lock = threading.Lock()
    done = False

    def run() -> None:
        nonlocal done
        with lock:
            if done:
                return
            done = True
        action()

    return run


def _watched_span_exporter(exporter: SpanExporter, health: _ExportHealth) -> SpanExporter:
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    close = _once(exporter.shutdown)

    class Watched(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            if health.abandoned:
                return SpanExportResult.FAILURE
            result = SpanExportResult.FAILURE
            with guarded("a span export", "those spans are dropped"):
                result = exporter.export(spans)
            health.record(result is SpanExportResult.SUCCESS)
            return result

        def shutdown(self) -> None:
            try:
                close()
            finally:
                health.unwatch()

        def force_flush(self, timeout_millis: int = 30_000) -> bool:
            return exporter.force_flush(timeout_millis)

    health.watch(exporter, close)
    return Watched()


def _watched_metric_exporter(exporter: MetricExporter, health: _ExportHealth) -> MetricExporter:
    from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult

    close = _once(exporter.shutdown)

    class Watched(MetricExporter):
        def export(
            self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any
        ) -> MetricExportResult:
            if health.abandoned:
                return MetricExportResult.FAILURE
            result = MetricExportResult.FAILURE
            with guarded("a metric export", "those metrics are dropped"):
                result = exporter.export(metrics_data, timeout_millis=timeout_millis, **kwargs)
            health.record(result is MetricExportResult.SUCCESS)
            return result

        def force_flush(self, timeout_millis: float = 10_000) -> bool:
            return exporter.force_flush(timeout_millis)

        def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
            try:
                close()
            finally:
                health.unwatch()

    health.watch(exporter, close)
    # The reader asks its exporter for these; the wrapped one's choices must stay in force.
    return Watched(
        preferred_temporality=getattr(exporter, "_preferred_temporality", None),
        preferred_aggregation=getattr(exporter, "_preferred_aggregation", None),
    )


def _span_exporter(choice: str, healths: list[_ExportHealth]) -> SpanExporter:
    if choice == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    exporter: SpanExporter
    if _protocol("TRACES") == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcSpanExporter,
        )

        exporter = GrpcSpanExporter()
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()
    health = _ExportHealth("traces", _otlp_where("TRACES"))
    healths.append(health)
    return _watched_span_exporter(exporter, health)


def _metric_reader(choice: str, healths: list[_ExportHealth]) -> MetricReader:
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    if choice == "console":
        from opentelemetry.sdk.metrics.export import ConsoleMetricExporter

        return PeriodicExportingMetricReader(ConsoleMetricExporter())
    exporter: MetricExporter
    if _protocol("METRICS") == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
            OTLPMetricExporter as GrpcMetricExporter,
        )

        exporter = GrpcMetricExporter()
    else:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

        exporter = OTLPMetricExporter()
    health = _ExportHealth("metrics", _otlp_where("METRICS"))
    healths.append(health)
    return PeriodicExportingMetricReader(_watched_metric_exporter(exporter, health))


def _prometheus(
    host: str, port: int
) -> tuple[MetricReader, PrometheusPage, int, Callable[[], None]]:
    try:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from prometheus_client import CollectorRegistry
    except ImportError as exc:  # pragma: no cover - a dependency of the package
        raise ConfigError(
            "the Prometheus endpoint needs opentelemetry-exporter-prometheus"
        ) from exc
    from workerset_admission.telemetry.worker_state_page import PrometheusPage
    from workerset_admission.telemetry.worker_state_page import stop as stop_page

    registry = CollectorRegistry(auto_describe=True)
    reader = PrometheusMetricReader(registry=registry)
    page = PrometheusPage(registry)
    try:
        server, thread = page.start(host, port)
    except OSError as exc:
        raise ConfigError(f"cannot serve Prometheus metrics on {host}:{port}: {exc}") from exc

    def close() -> None:
        stop_page(server, thread)

    return reader, page, int(server.server_port), close


def setup_telemetry(
    service_name: str = DEFAULT_SERVICE_NAME,
    *,
    resource_attributes: Mapping[str, str] | None = None,
    span_exporters: Sequence[SpanExporter] | None = None,
    metric_readers: Sequence[MetricReader] | None = None,
    prometheus: tuple[str, int] | None = None,
    otlp: bool = True,
    set_global: bool = True,
    log_correlation: bool = True,
) -> TelemetryHandle:
    """Install the SDK: tracer and meter providers, exporters, log correlation.

    ``span_exporters`` / ``metric_readers`` replace the ones the environment would choose
    (for tests, or a host with exporters of its own). ``prometheus=(host, port)`` also serves
    metrics in the Prometheus text format (port 0 picks a free one, see the handle).
    ``otlp=False`` installs no exporter of the environment's choosing: with ``prometheus``
    alone, the metrics are only served for scraping and nothing is pushed anywhere.
    With ``set_global`` the providers become the process's global ones, unless the host
    already installed its own, which are then left alone. Raises ``ConfigError`` for settings
    that cannot work (an unknown exporter or protocol, a port already taken).
    """
    closers: list[Callable[[], None]] = []
    if _env_flag("OTEL_SDK_DISABLED"):
        return TelemetryHandle(None, None, None, closers)

    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = _resource(service_name, resource_attributes)

    healths: list[_ExportHealth] = []
    exporters = (
        list(span_exporters)
        if span_exporters is not None
        else [_span_exporter(choice, healths) for choice in _exporter_choices("TRACES") if otlp]
    )
    readers = (
        list(metric_readers)
        if metric_readers is not None
        else [_metric_reader(choice, healths) for choice in _exporter_choices("METRICS") if otlp]
    )

    prometheus_port: int | None = None
    prometheus_url: str | None = None
    prometheus_page: PrometheusPage | None = None
    if prometheus is not None:
        reader, prometheus_page, prometheus_port, close = _prometheus(*prometheus)
        readers.append(reader)
        closers.append(close)
        host = f"[{prometheus[0]}]" if ":" in prometheus[0] else prometheus[0]
        prometheus_url = f"http://{host}:{prometheus_port}/metrics"

    tracer_provider: TracerProvider | None = None
    if exporters:
        tracer_provider = TracerProvider(resource=resource)
        for exporter in exporters:
            tracer_provider.add_span_processor(BatchSpanProcessor(exporter))
    meter_provider: MeterProvider | None = None
    if readers:
        meter_provider = MeterProvider(resource=resource, metric_readers=readers)

    if set_global:
        # A host that installed its own SDK keeps it; overriding would only log a warning.
        if tracer_provider is not None and isinstance(
            trace.get_tracer_provider(), trace.ProxyTracerProvider
        ):
            trace.set_tracer_provider(tracer_provider)
        if meter_provider is not None and type(metrics.get_meter_provider()).__name__ == (
            "_ProxyMeterProvider"
        ):
            metrics.set_meter_provider(meter_provider)

    if log_correlation:
        closers.append(install_log_correlation())
    return TelemetryHandle(
        tracer_provider,
        meter_provider,
        prometheus_port,
        closers,
        prometheus_url=prometheus_url,
        prometheus_page=prometheus_page,
        exports=healths,
    )
