"""A report that fails is logged at WARNING, once a minute per kind of effect, and the rest go on.

Telemetry's one guarded place is the dispatch over effect kinds: a broken exporter or a
malformed value fails one effect's report, which is said at WARNING (not more than once a
minute for that kind, so a broken exporter does not flood the log), and every other effect of
the step is still reported.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from telemetry_harness import Harness
from workerset_admission.admission import RejectionReported, Succession
from workerset_admission.identity import EndpointId, GroupKey, WorkerType
from workerset_admission.telemetry import AdmissionTelemetry
from workerset_admission.telemetry import names as n
from workerset_admission.telemetry.guard import FailureGuard

GROUP = GroupKey.build("llama", EndpointId("ns", "backend", "generate"), "chat", WorkerType.DECODE)
SUCCESSION = Succession(GROUP, "a", "b", 1, 2, 1, 2)
REJECTION = RejectionReported(GROUP, "llama", GROUP.worker_set, "a", "b", "ns/b/g/1")


def _failures(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if "reporting a Succession effect failed" in r.getMessage()]


def test_a_failing_report_is_logged_at_warning_once_a_minute_and_the_others_are_reported(
    harness: Harness, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: AdmissionTelemetry, *args: Any, **kwargs: Any) -> None:
        raise ConnectionError("the exporter is gone")

    monkeypatch.setattr(AdmissionTelemetry, "succession", broken)
    telemetry = harness.telemetry
    now = [0.0]
    telemetry._guard = FailureGuard(clock=lambda: now[0])
    with caplog.at_level(logging.WARNING):
        telemetry.effects([SUCCESSION, REJECTION])
        telemetry.effects([SUCCESSION, REJECTION])
    [failure] = _failures(caplog)
    assert failure.levelno == logging.WARNING
    assert failure.exc_info is not None
    assert isinstance(failure.exc_info[1], ConnectionError)
    # Both rejections were reported although the successions beside them failed.
    rejected = harness.points(n.METRIC_REJECTED_COHORTS)
    assert sum(point.value for point in rejected.values()) == 2

    # A minute on, the same kind is said again.
    now[0] += 61.0
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        telemetry.effects([SUCCESSION])
    assert len(_failures(caplog)) == 1
