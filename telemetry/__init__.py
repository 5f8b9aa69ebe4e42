"""Tracing, metrics and logging helpers; exporter wiring is opt-in."""
