"""The opt-in SDK wiring: OTEL_* variables drive it, nothing is installed at import."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from workerset_admission.errors import ConfigError
from workerset_admission.ports import DiscoveryEntry, SourcePut
from workerset_admission.telemetry import AdmissionTelemetry, setup_telemetry


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No OTEL_* setting of the machine leaks in; no test ever exports to a default endpoint."""
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")


def test_importing_the_package_installs_no_sdk_and_touches_no_logging() -> None:
    probe = (
        "import logging, sys\n"
        "factory = logging.getLogRecordFactory()\n"
        "root_handlers = list(logging.getLogger().handlers)\n"
        "import workerset_admission.telemetry\n"
        "from opentelemetry import trace\n"
        "assert logging.getLogRecordFactory() is factory\n"
        "assert logging.getLogger().handlers == root_handlers\n"
        "assert not logging.getLogger('workerset_admission').handlers\n"
        "assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry.sdk')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"


def test_the_handle_exports_what_was_buffered_when_it_shuts_down() -> None:
    spans = InMemorySpanExporter()
    handle = setup_telemetry(span_exporters=[spans], metric_readers=[], set_global=False)
    telemetry = AdmissionTelemetry(tracer_provider=handle.tracer_provider)
    with telemetry.apply_update(SourcePut(DiscoveryEntry("k", b"", 1))):
        pass
    handle.shutdown()
    assert [s.name for s in spans.get_finished_spans()] == ["apply discovery_update"]
    handle.shutdown()  # twice is harmless


def test_the_service_name_defaults_to_the_projects_and_the_environment_overrides_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    handle = setup_telemetry(span_exporters=[InMemorySpanExporter()], set_global=False)
    assert handle.tracer_provider is not None
    attrs = handle.tracer_provider.resource.attributes
    assert attrs["service.name"] == "workerset-admission"
    handle.shutdown()

    monkeypatch.setenv("OTEL_SERVICE_NAME", "frontend-a")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test,team=serving")
    handle = setup_telemetry(span_exporters=[InMemorySpanExporter()], set_global=False)
    assert handle.tracer_provider is not None
    attrs = handle.tracer_provider.resource.attributes
    assert attrs["service.name"] == "frontend-a"
    assert attrs["deployment.environment"] == "test"
    assert attrs["team"] == "serving"
    handle.shutdown()


def test_the_sampler_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    spans = InMemorySpanExporter()
    handle = setup_telemetry(span_exporters=[spans], set_global=False)
    telemetry = AdmissionTelemetry(tracer_provider=handle.tracer_provider)
    with telemetry.apply_update(SourcePut(DiscoveryEntry("k", b"", 1))) as update:
        assert not update.span.is_recording()
    handle.shutdown()
    assert spans.get_finished_spans() == ()


def test_disabling_the_sdk_gives_a_handle_with_nothing_installed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    factory = logging.getLogRecordFactory()
    handle = setup_telemetry(span_exporters=[InMemorySpanExporter()], set_global=False)
    assert handle.tracer_provider is None
    assert handle.meter_provider is None
    assert logging.getLogRecordFactory() is factory
    handle.shutdown()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("OTEL_TRACES_EXPORTER", "zipkin"),
        ("OTEL_METRICS_EXPORTER", "statsd"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
    ],
)
def test_settings_that_cannot_work_are_refused_with_a_config_error(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "otlp")
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=value):
        setup_telemetry(set_global=False)


def test_log_correlation_is_installed_by_setup_and_removed_by_shutdown() -> None:
    before = logging.getLogRecordFactory()
    handle = setup_telemetry(span_exporters=[InMemorySpanExporter()], set_global=False)
    assert logging.getLogRecordFactory() is not before
    handle.shutdown()
    assert logging.getLogRecordFactory() is before


def test_metrics_go_to_the_readers_given() -> None:
    reader = InMemoryMetricReader()
    handle = setup_telemetry(span_exporters=[], metric_readers=[reader], set_global=False)
    assert handle.tracer_provider is None
    telemetry = AdmissionTelemetry(meter_provider=handle.meter_provider)
    telemetry.invalid_record("k", "bad_json")
    data = reader.get_metrics_data()
    assert data is not None
    (resource_metrics,) = data.resource_metrics
    assert resource_metrics.resource.attributes["service.name"] == "workerset-admission"
    handle.shutdown()


def test_update_spans_start_once_a_global_sdk_is_installed_after_the_facade_was_made() -> None:
    # Global providers can be set once per process, so this runs in a fresh interpreter.
    probe = (
        "from opentelemetry.sdk.trace.export.in_memory_span_exporter import "
        "InMemorySpanExporter\n"
        "from workerset_admission.ports import DiscoveryEntry, SourcePut\n"
        "from workerset_admission.telemetry import AdmissionTelemetry, setup_telemetry\n"
        "telemetry = AdmissionTelemetry()\n"
        "def updates(count):\n"
        "    for i in range(count):\n"
        "        with telemetry.apply_update(SourcePut(DiscoveryEntry('k', b'', i))):\n"
        "            pass\n"
        "updates(10)\n"
        "spans = InMemorySpanExporter()\n"
        "handle = setup_telemetry(span_exporters=[spans], metric_readers=[])\n"
        "updates(3000)\n"
        "handle.shutdown()\n"
        "print(len(spans.get_finished_spans()))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    out = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env=env,
    )
    # All but the first few updates after the install have spans: the facade looks for an SDK
    # only now and then, to keep that lookup off the per-update path.
    assert 1900 <= int(out.stdout.strip()) <= 3000


def test_an_exporter_list_may_mix_in_none_and_none_alone_installs_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console,none")
    handle = setup_telemetry(metric_readers=[], set_global=False, log_correlation=False)
    assert handle.tracer_provider is not None
    handle.shutdown()

    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    handle = setup_telemetry(metric_readers=[], set_global=False, log_correlation=False)
    assert handle.tracer_provider is None
    handle.shutdown()
