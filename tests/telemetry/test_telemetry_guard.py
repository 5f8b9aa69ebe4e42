"""What code telemetry does not own raises is stopped at one guard, said once a minute a kind."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from opentelemetry import propagate
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from workerset_admission.telemetry.guard import FailureGuard
from workerset_admission.telemetry.propagation import inject_headers, link_from_headers

GUARD_LOGGER = "workerset_admission.telemetry.guard"


@pytest.fixture(autouse=True)
def fresh_guard(monkeypatch: pytest.MonkeyPatch) -> None:
    # The process's guard remembers what it said within the minute; each test starts unsaid.
    from workerset_admission.telemetry import guard

    monkeypatch.setattr(guard, "_GUARD", FailureGuard())


def _warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == GUARD_LOGGER and r.levelno >= logging.WARNING]


def test_a_failure_is_said_once_a_minute_per_kind_with_the_count_of_the_unsaid(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    guard = FailureGuard(quiet_for=60.0, clock=lambda: now[0])
    for _ in range(5):
        with guard.guarded("a span export", "those spans are dropped"):
            raise ConnectionError("collector away")
    with guard.guarded("a metric export", "those metrics are dropped"):
        raise ValueError("bad point")
    assert guard.failures_unsaid("a span export") == 4
    now[0] = 61.0
    with guard.guarded("a span export", "those spans are dropped"):
        raise ConnectionError("collector away")
    said = _warnings(caplog)
    assert [r.getMessage().split(";")[0] for r in said] == [
        "telemetry: a span export failed",
        "telemetry: a metric export failed",
        "telemetry: a span export failed (4 more since the last warning)",
    ]
    assert all(r.exc_info is not None for r in said)
    assert "those spans are dropped" in said[0].getMessage()
    assert guard.failures_unsaid("a span export") == 0


async def test_the_guard_never_stops_a_cancellation() -> None:
    import asyncio

    guard = FailureGuard()
    with pytest.raises(asyncio.CancelledError), guard.guarded("anything", "nothing"):
        raise asyncio.CancelledError


class _Broken:
    """A propagator the environment chose that fails at every call."""

    fields: set[str] = set()

    def inject(self, carrier: Any, context: Any = None, setter: Any = None) -> None:
        raise RuntimeError("propagator broke")

    def extract(self, carrier: Any, context: Any = None, getter: Any = None) -> Any:
        raise RuntimeError("propagator broke")


def test_a_broken_propagator_is_said_at_warning_and_the_message_goes_without_context(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(propagate, "_HTTP_TEXT_FORMAT", _Broken())
    assert inject_headers() == {}
    assert link_from_headers({"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}) is None
    kinds = {r.getMessage().split(" failed")[0] for r in _warnings(caplog)}
    assert {"telemetry: trace context injection", "telemetry: trace context extraction"} <= kinds


def test_an_exporter_that_raises_fails_its_export_and_is_said_at_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from workerset_admission.telemetry.setup import _ExportHealth, _watched_span_exporter

    class Raising(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            raise OSError("socket gone")

        def shutdown(self) -> None:
            return None

    watched = _watched_span_exporter(Raising(), _ExportHealth("traces", "nowhere"))
    assert watched.export([]) is SpanExportResult.FAILURE
    assert any("a span export failed" in r.getMessage() for r in _warnings(caplog))
    watched.shutdown()
