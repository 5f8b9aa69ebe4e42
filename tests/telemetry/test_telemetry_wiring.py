"""Who installs telemetry, and how little a failing exporter costs: serve, the frontend, outages."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from workerset_admission.cli.serve import start_serve_telemetry
from workerset_admission.frontend.routes import start_extension_telemetry
from workerset_admission.settings import Settings, load_settings
from workerset_admission.telemetry import setup as telemetry_setup
from workerset_admission.telemetry import setup_telemetry

EXPORTER_LOGGER = "opentelemetry.exporter.fake"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(("OTEL_", "WORKERSET_ADMISSION_")):
            monkeypatch.delenv(name)


@pytest.fixture
def records() -> Iterator[list[logging.LogRecord]]:
    """Warnings of the plugin and of the (fake) exporter library, as the host would see them."""
    seen: list[logging.LogRecord] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    handler = Collect(level=logging.DEBUG)
    loggers = [logging.getLogger("workerset_admission"), logging.getLogger(EXPORTER_LOGGER)]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)
    try:
        yield seen
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.removeHandler(handler)
            logger.setLevel(level)


class FlakyExporter(SpanExporter):
    """Fails while ``down``, logging each retry as an OTLP exporter does."""

    __module__ = EXPORTER_LOGGER

    def __init__(self) -> None:
        self.down = True
        self.calls = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.calls += 1
        if self.down:
            logging.getLogger(EXPORTER_LOGGER).warning("transient error, retrying")
            logging.getLogger(EXPORTER_LOGGER).warning("transient error, retrying")
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS


def messages(records: list[logging.LogRecord], name: str, level: int) -> list[str]:
    return [r.getMessage() for r in records if r.name == name and r.levelno == level]


def test_an_outage_is_said_once_and_its_end_once_and_a_second_outage_again(
    records: list[logging.LogRecord],
) -> None:
    inner = FlakyExporter()
    health = telemetry_setup._ExportHealth("traces", "http://collector:4318")
    exporter = telemetry_setup._watched_span_exporter(inner, health)
    ours = "workerset_admission.telemetry.setup"

    for _ in range(5):
        assert exporter.export([]) is SpanExportResult.FAILURE
    assert len(messages(records, ours, logging.WARNING)) == 1
    assert "http://collector:4318" in messages(records, ours, logging.WARNING)[0]
    assert len(messages(records, EXPORTER_LOGGER, logging.WARNING)) == 1

    inner.down = False
    for _ in range(3):
        assert exporter.export([]) is SpanExportResult.SUCCESS
    assert messages(records, ours, logging.INFO) == [
        "traces export to http://collector:4318 works again"
    ]

    inner.down = True
    exporter.export([])
    exporter.export([])
    assert len(messages(records, ours, logging.WARNING)) == 2
    assert len(messages(records, EXPORTER_LOGGER, logging.WARNING)) == 2
    assert inner.calls == 10

    exporter.shutdown()
    # Shut down, the exporter library's loggers are the host's again, unfiltered.
    assert not logging.getLogger(EXPORTER_LOGGER).filters


def test_an_exporter_that_raises_counts_as_a_failed_export(
    records: list[logging.LogRecord],
) -> None:
    class Raising(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            raise ConnectionError("refused")

    health = telemetry_setup._ExportHealth("traces", "here")
    exporter = telemetry_setup._watched_span_exporter(Raising(), health)
    assert exporter.export([]) is SpanExportResult.FAILURE
    assert len(messages(records, "workerset_admission.telemetry.setup", logging.WARNING)) == 1


def test_without_otlp_the_environments_exporters_are_not_installed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "otlp")
    handle = setup_telemetry(otlp=False, set_global=False, log_correlation=False)
    assert handle.tracer_provider is None
    assert handle.meter_provider is None
    handle.shutdown()


def test_serve_installs_nothing_unless_telemetry_or_a_prometheus_port_is_asked_for() -> None:
    assert start_serve_telemetry(Settings(), otlp=False) is None


def test_the_frontend_installs_nothing_unless_the_settings_ask_for_it() -> None:
    assert start_extension_telemetry(Settings()) is None


def test_telemetry_the_frontend_cannot_start_is_logged_and_left_off(
    monkeypatch: pytest.MonkeyPatch, records: list[logging.LogRecord]
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "zipkin")
    assert start_extension_telemetry(Settings(telemetry=True)) is None
    (warning,) = messages(records, "workerset_admission.frontend.routes", logging.WARNING)
    assert "telemetry is off" in warning
    assert "zipkin" in warning


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, (False, None)),
        ({"WORKERSET_ADMISSION_TELEMETRY": "1"}, (True, None)),
        ({"WORKERSET_ADMISSION_PROMETHEUS_PORT": "9464"}, (False, ("127.0.0.1", 9464))),
        (
            {
                "WORKERSET_ADMISSION_PROMETHEUS_PORT": "9464",
                "WORKERSET_ADMISSION_PROMETHEUS_HOST": "::1",
            },
            (False, ("::1", 9464)),
        ),
    ],
)
def test_the_telemetry_settings_come_from_the_environment(
    env: dict[str, str], expected: tuple[bool, Any]
) -> None:
    settings = load_settings(env=env)
    assert (settings.telemetry, settings.prometheus_address) == expected


class RecordingExporter(FlakyExporter):
    """A flaky exporter that also notes when it is shut down."""

    def __init__(self) -> None:
        super().__init__()
        self.shut_down = 0

    def shutdown(self) -> None:
        self.shut_down += 1


def test_at_shutdown_a_collector_known_to_be_away_is_given_up_at_once() -> None:
    inner = RecordingExporter()
    health = telemetry_setup._ExportHealth("traces", "here")
    exporter = telemetry_setup._watched_span_exporter(inner, health)
    exporter.export([])
    health.closing()
    # The exporter is stopped (which ends a retry it sleeps in), and the final flush is dropped.
    assert inner.shut_down == 1
    assert exporter.export([]) is SpanExportResult.FAILURE
    assert inner.calls == 1
    exporter.shutdown()
    assert inner.shut_down == 1


def test_at_shutdown_a_working_collector_still_receives_the_final_flush() -> None:
    inner = RecordingExporter()
    inner.down = False
    health = telemetry_setup._ExportHealth("traces", "here")
    exporter = telemetry_setup._watched_span_exporter(inner, health)
    health.closing()
    assert exporter.export([]) is SpanExportResult.SUCCESS
    assert inner.calls == 1
    exporter.shutdown()
    assert inner.shut_down == 1


def test_a_collector_that_does_not_answer_within_the_grace_is_given_up() -> None:
    inner = RecordingExporter()
    inner.down = False
    health = telemetry_setup._ExportHealth("traces", "here")
    exporter = telemetry_setup._watched_span_exporter(inner, health)
    health.abandon()
    assert exporter.export([]) is SpanExportResult.FAILURE
    assert (inner.calls, inner.shut_down) == (0, 1)
