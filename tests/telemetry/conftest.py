"""Fixtures for the telemetry tests: the in-memory harness and the plugin's log records."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from telemetry_harness import Harness, make_harness


@pytest.fixture
def harness() -> Harness:
    return make_harness()


@pytest.fixture
def rejection_records() -> Iterator[list[logging.LogRecord]]:
    """Every record the rejection logger emits during the test."""
    records: list[logging.LogRecord] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Collect(level=logging.DEBUG)
    logger = logging.getLogger("workerset_admission")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
