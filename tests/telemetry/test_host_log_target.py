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


def test_every_line_of_the_package_is_named_by_its_logger_inside_the_frontend() -> None:
    # The succession, drain and handover lines and the view's lines used to read
    # facade.succession, facade.worker_drained, facade.handover_ended, view.close.
    runtime_logging = pytest.importorskip(
        "dynamo.runtime.logging", reason="needs ai-dynamo==1.6.1 (the dynamo extra)"
    )
    from workerset_admission.telemetry.logs import name_records_for_hosts

    kept = _Kept()
    ours = logging.getLogger("workerset_admission.adapters.dynamo.view")
    theirs = logging.getLogger("some.host.module")
    for logger in (ours, theirs):
        logger.addHandler(kept)
        logger.setLevel(logging.INFO)
    undo = name_records_for_hosts()
    try:
        assert name_records_for_hosts()() is None  # a second call changes nothing
        ours.info("admitted view withdrawn (%d file(s))", 3)
        theirs.info("a host's own line")
    finally:
        undo()
        for logger in (ours, theirs):
            logger.removeHandler(kept)
            logger.setLevel(logging.NOTSET)
    mine, host = kept.records
    line = runtime_logging.VllmColorFormatter().format(mine)
    assert "workerset_admission.adapters.dynamo.view" in line
    assert "view.close" not in line
    assert (host.module, host.funcName) != ("some.host", "module")
