"""Replay traces: the format, the writer a live frontend records with, and their checks."""

from __future__ import annotations

from workerset_admission.traces.format import TRACE_VERSION, TraceError, read_trace

__all__ = ["TRACE_VERSION", "TraceError", "read_trace"]
