"""configure_logging: the plugin's own logger tree only, plain or JSON, with trace fields."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider
from workerset_admission.errors import UsageError
from workerset_admission.telemetry import configure_logging, install_log_correlation

TREE = "workerset_admission"


@pytest.fixture(autouse=True)
def restore_tree() -> Iterator[None]:
    logger = logging.getLogger(TREE)
    saved = (list(logger.handlers), logger.level, logger.propagate)
    yield
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    for handler in saved[0]:
        logger.addHandler(handler)
    logger.setLevel(saved[1])
    logger.propagate = saved[2]


def test_json_lines_hold_message_level_logger_and_extras() -> None:
    stream = io.StringIO()
    configure_logging("json", logging.INFO, stream=stream)
    logging.getLogger(f"{TREE}.admission").error(
        "rejected cohort %s", "b", extra={"model": "llama", "rejected_checksum": "b"}
    )
    line = json.loads(stream.getvalue())
    assert line["level"] == "ERROR"
    assert line["logger"] == f"{TREE}.admission"
    assert line["message"] == "rejected cohort b"
    assert line["model"] == "llama"
    assert line["rejected_checksum"] == "b"
    assert "time" in line


def test_json_lines_carry_the_trace_and_span_ids_when_correlation_is_on() -> None:
    stream = io.StringIO()
    configure_logging("json", stream=stream)
    tracer = TracerProvider(shutdown_on_exit=False).get_tracer("t")
    uninstall = install_log_correlation()
    try:
        with tracer.start_as_current_span("apply discovery_update") as span:
            logging.getLogger(TREE).warning("inside")
    finally:
        uninstall()
    line = json.loads(stream.getvalue())
    assert line["trace_id"] == format(span.get_span_context().trace_id, "032x")
    assert line["span_id"] == format(span.get_span_context().span_id, "016x")


def test_plain_lines_show_no_ids_without_correlation_and_never_fail() -> None:
    stream = io.StringIO()
    configure_logging("plain", "DEBUG", stream=stream)
    logging.getLogger(f"{TREE}.service").debug("started")
    text = stream.getvalue()
    assert "DEBUG" in text
    assert "started" in text
    assert "trace_id" not in text
    assert "span_id" not in text


@pytest.mark.parametrize("fmt", ["plain", "json"])
def test_ids_appear_only_on_lines_logged_inside_a_valid_span(fmt: str) -> None:
    stream = io.StringIO()
    configure_logging(fmt, stream=stream)  # type: ignore[arg-type]
    tracer = TracerProvider(shutdown_on_exit=False).get_tracer("t")
    uninstall = install_log_correlation()
    try:
        logging.getLogger(TREE).warning("outside any span")
        with tracer.start_as_current_span("apply discovery_update") as span:
            logging.getLogger(TREE).warning("inside a span")
    finally:
        uninstall()
    outside, inside = stream.getvalue().splitlines()
    trace_id = format(span.get_span_context().trace_id, "032x")
    assert "outside any span" in outside
    assert "trace_id" not in outside
    assert "span_id" not in outside
    assert "inside a span" in inside
    assert trace_id in inside
    assert format(span.get_span_context().span_id, "016x") in inside


def test_the_root_logger_is_left_alone_and_repeated_calls_do_not_stack_handlers() -> None:
    root = logging.getLogger()
    root_state = (list(root.handlers), root.level)
    configure_logging("plain")
    configure_logging("json")
    assert (list(root.handlers), root.level) == root_state
    ours = logging.getLogger(TREE)
    assert len(ours.handlers) == 1
    assert isinstance(ours.handlers[0].formatter, logging.Formatter)
    assert not ours.propagate


def test_an_unknown_format_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="xml"):
        configure_logging("xml")  # type: ignore[arg-type]
