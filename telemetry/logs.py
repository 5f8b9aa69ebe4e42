"""Logging helpers: trace-correlated records, plain or JSON output for the plugin's own tree.

Nothing here runs at import. :func:`install_log_correlation` (called by the opt-in telemetry
setup) stamps records of the ``workerset_admission`` logger tree with the current trace and span
IDs; :func:`configure_logging` (called by ``serve``) gives that tree one handler of its own and
never touches the root logger, which belongs to whoever hosts the plugin.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import sys
import threading
from collections.abc import Callable
from typing import Any, Literal, TextIO

from opentelemetry import trace
from workerset_admission.errors import UsageError
from workerset_admission.telemetry.guard import guarded
from workerset_admission.telemetry.names import PREFIX

__all__ = [
    "LOGGER_NAME",
    "SPAN_ID_FIELD",
    "TRACE_FLAGS_FIELD",
    "TRACE_ID_FIELD",
    "JsonFormatter",
    "RefusalWarnings",
    "configure_logging",
    "install_log_correlation",
    "name_records_for_hosts",
    "named_for_hosts",
]

LOGGER_NAME = PREFIX
# The same field names the OpenTelemetry logging instrumentation uses, so existing formats and
# log pipelines that look for them keep working.
TRACE_ID_FIELD = "otelTraceID"
SPAN_ID_FIELD = "otelSpanID"
TRACE_FLAGS_FIELD = "otelTraceSampled"

_PLAIN_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
_PLAIN_TRACED_FORMAT = (
    "%(asctime)s %(levelname)s %(name)s [trace_id=%(otelTraceID)s span_id=%(otelSpanID)s] "
    "%(message)s"
)
# Attributes every LogRecord has; anything else on a record came from ``extra``.
_STANDARD_FIELDS = frozenset(
    logging.LogRecord("", 0, "", 0, "", None, None).__dict__.keys()
    | {"message", "asctime", "taskName", TRACE_ID_FIELD, SPAN_ID_FIELD, TRACE_FLAGS_FIELD}
)
_HANDLER_MARK = f"_{PREFIX}_handler"
_install_lock = threading.Lock()


def _in_tree(name: str) -> bool:
    return name == LOGGER_NAME or name.startswith(LOGGER_NAME + ".")


def _stamp(record: logging.LogRecord) -> None:
    # Only a real span's IDs: zeros for "no span" would read as data in every log line.
    context = trace.get_current_span().get_span_context()
    if context.is_valid:
        record.otelTraceID = format(context.trace_id, "032x")
        record.otelSpanID = format(context.span_id, "016x")
        record.otelTraceSampled = context.trace_flags.sampled


class _PlainFormatter(logging.Formatter):
    """One plain line; the trace and span IDs appear only on a record made inside a span."""

    def __init__(self) -> None:
        super().__init__(_PLAIN_FORMAT)
        self._traced = logging.Formatter(_PLAIN_TRACED_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        if getattr(record, TRACE_ID_FIELD, None) is not None:
            return self._traced.format(record)
        return super().format(record)


def install_log_correlation() -> Callable[[], None]:
    """Stamp this package's log records with the current trace and span IDs.

    Wraps the process's log record factory; records from other loggers pass through untouched.
    Returns a function that undoes the installation (a no-op if someone replaced the factory
    since, so their factory is never thrown away).
    """
    with _install_lock:
        previous = logging.getLogRecordFactory()

        def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
            record = previous(*args, **kwargs)
            if _in_tree(record.name):
                # A log line must never fail because of tracing.
                with guarded("stamping a log record with its trace", "the line is unstamped"):
                    _stamp(record)
            return record

        logging.setLogRecordFactory(factory)

    def uninstall() -> None:
        with _install_lock:
            if logging.getLogRecordFactory() is factory:
                logging.setLogRecordFactory(previous)

    return uninstall


def _name_by_logger(record: logging.LogRecord) -> None:
    record.module, _, record.funcName = record.name.rpartition(".")


class _NamedByLogger(logging.Filter):
    """Give a record the logger's name as its ``module.funcName``.

    The Dynamo frontend's log bridge names each Python line by ``module.funcName`` (the
    rejected-cohort line would read ``facade.cohort_rejected``); with this filter it reads as
    the logger, ``workerset_admission.admission``, in the frontend's log as everywhere else.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        _name_by_logger(record)
        return True


_hosts_naming = False


def name_records_for_hosts() -> Callable[[], None]:
    """Have every record of this package named by its logger in a host's log (idempotent).

    :func:`named_for_hosts` does it for one logger; a host that embeds the whole package (the
    Dynamo frontend) would otherwise show the other lines by module and function
    (``facade.succession``, ``view.close``). Wraps the log record factory for this package's
    records only; every other record passes through untouched.
    """
    global _hosts_naming
    with _install_lock:
        if _hosts_naming:
            return lambda: None
        previous = logging.getLogRecordFactory()

        def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
            record = previous(*args, **kwargs)
            if _in_tree(record.name):
                _name_by_logger(record)
            return record

        logging.setLogRecordFactory(factory)
        _hosts_naming = True

    def uninstall() -> None:
        global _hosts_naming
        with _install_lock:
            if logging.getLogRecordFactory() is factory:
                logging.setLogRecordFactory(previous)
                _hosts_naming = False

    return uninstall


def named_for_hosts(logger: logging.Logger) -> logging.Logger:
    """Have ``logger``'s records named by the logger in a host's log too (idempotent)."""
    if not any(isinstance(f, _NamedByLogger) for f in logger.filters):
        logger.addFilter(_NamedByLogger())
    return logger


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, trace IDs, and every ``extra``."""

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "time": _dt.datetime.fromtimestamp(record.created, tz=_dt.timezone.utc).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        trace_id = getattr(record, TRACE_ID_FIELD, None)
        if trace_id is not None:
            payload["trace_id"] = trace_id
            payload["span_id"] = getattr(record, SPAN_ID_FIELD)
        for key, value in record.__dict__.items():
            if key not in _STANDARD_FIELDS and key not in payload:
                payload[key] = value
        if record.exc_info:
            payload["exception"] = self.formatException(record.exc_info)
        return json.dumps(payload, default=str, ensure_ascii=False)


def configure_logging(
    fmt: Literal["plain", "json"] = "plain",
    level: int | str = logging.INFO,
    *,
    stream: TextIO | None = None,
) -> logging.Handler:
    """Give the ``workerset_admission`` logger tree one handler writing to ``stream``.

    Calling it again replaces the handler it installed before instead of adding another. The
    tree stops propagating to the root logger so a host that logs too does not print each
    line twice; the root logger itself is left alone.
    """
    if fmt not in ("plain", "json"):
        raise UsageError(f"log format must be 'plain' or 'json', not {fmt!r}")
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    formatter: logging.Formatter = JsonFormatter() if fmt == "json" else _PlainFormatter()
    handler.setFormatter(formatter)
    setattr(handler, _HANDLER_MARK, True)

    logger = logging.getLogger(LOGGER_NAME)
    for old in [h for h in logger.handlers if getattr(h, _HANDLER_MARK, False)]:
        logger.removeHandler(old)
        old.close()
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
    return handler


class RefusalWarnings:
    """One WARNING per refused discovery record, at most ``burst`` per ``window`` seconds.

    A fleet that publishes a bad card to every worker must not flood the log: past the burst,
    refusals are counted, and the next warning says how many were left out. The metric and the
    status's recent-invalid list still see every one.
    """

    def __init__(
        self,
        logger: logging.Logger,
        *,
        burst: int = 10,
        window: float = 60.0,
        clock: Callable[[], float] | None = None,
    ) -> None:
        import time

        if burst < 1 or window <= 0:
            raise UsageError("a refusal warning needs a positive burst and window")
        self._logger = logger
        self._burst = burst
        self._window = window
        self._clock = clock or time.monotonic
        self._window_start = -float("inf")
        self._sent = 0
        self.suppressed = 0

    def refused(self, key: str, reason: str, detail: str) -> bool:
        """Log one refusal unless the burst is spent; return whether it was logged."""
        now = self._clock()
        if now - self._window_start >= self._window:
            self._window_start, self._sent = now, 0
        if self._sent >= self._burst:
            self.suppressed += 1
            return False
        self._sent += 1
        left_out, self.suppressed = self.suppressed, 0
        more = f" ({left_out} more refused since the last warning)" if left_out else ""
        self._logger.warning("refused discovery record %s: %s: %s%s", key, reason, detail, more)
        return True
