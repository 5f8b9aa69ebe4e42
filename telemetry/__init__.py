"""Tracing, metrics and logging helpers; exporter wiring is opt-in.

Importing this package installs nothing: without ``setup_telemetry`` (or a host's own SDK)
every span and instrument is an OpenTelemetry API no-op, and log records are left as they are.
"""

from __future__ import annotations

from workerset_admission.telemetry.facade import (
    AdmissionStateSummary,
    AdmissionTelemetry,
    BuildScope,
    UpdateScope,
    decision_of,
)
from workerset_admission.telemetry.instruments import HeldGroup
from workerset_admission.telemetry.logs import (
    JsonFormatter,
    RefusalWarnings,
    configure_logging,
    install_log_correlation,
)
from workerset_admission.telemetry.propagation import inject_headers, link_from_headers
from workerset_admission.telemetry.setup import (
    DEFAULT_SERVICE_NAME,
    TelemetryHandle,
    setup_telemetry,
)

__all__ = [
    "DEFAULT_SERVICE_NAME",
    "AdmissionStateSummary",
    "AdmissionTelemetry",
    "BuildScope",
    "HeldGroup",
    "JsonFormatter",
    "RefusalWarnings",
    "TelemetryHandle",
    "UpdateScope",
    "configure_logging",
    "decision_of",
    "inject_headers",
    "install_log_correlation",
    "link_from_headers",
    "setup_telemetry",
]
