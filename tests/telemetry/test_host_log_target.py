"""The rejected-cohort line is named workerset_admission.admission in the Dynamo frontend too."""

from __future__ import annotations

import logging

import pytest
from workerset_admission.telemetry import AdmissionTelemetry

pytestmark = pytest.mark.conformance


class _Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_dynamos_log_bridge_names_the_rejected_cohort_line_as_the_docs_show() -> None:
    # Dynamo 1.6.1's own formatter names a Python line the way its Rust log bridge does
    # (``module.funcName``): without the plugin's filter this line read facade.cohort_rejected.
    runtime_logging = pytest.importorskip(
        "dynamo.runtime.logging", reason="needs ai-dynamo==1.6.1 (the dynamo extra)"
    )
    formatter_type = runtime_logging.VllmColorFormatter

    kept = _Kept()
    logger = logging.getLogger("workerset_admission.admission")
    logger.addHandler(kept)
    try:
        AdmissionTelemetry().cohort_rejected(
            model="tiny",
            worker_set='["prod","backend","generate","chat|completions","aggregated"]',
            incumbent_checksum="a" * 64,
            rejected_checksum="b" * 64,
            instance="prod/backend/generate/3c",
        )
    finally:
        logger.removeHandler(kept)
    (record,) = kept.records
    line = formatter_type().format(record)
    assert "workerset_admission.admission" in line
    assert "facade" not in line
    assert f"{record.module}.{record.funcName}" == "workerset_admission.admission"
