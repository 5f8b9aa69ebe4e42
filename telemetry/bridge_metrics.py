"""The bridge's gauges: how far behind its source (a file store, etcd) the bucket is.

Read at every collection from the bridge's progress (plain floats, safe from the exporter's
thread), so a scrape sees the lag grow while the bridge's loop is stuck. The names are in
:mod:`workerset_admission.telemetry.names`; in the Prometheus text format they read
``workerset_admission_bridge_lag_seconds``, ``..._bridge_unwritten_seconds``,
``..._bridge_last_write_age_seconds`` and ``..._bridge_source_loop_silent_seconds``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Protocol

from workerset_admission.telemetry import names as n

if TYPE_CHECKING:
    from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation

    _Callback = Callable[[CallbackOptions], Iterable[Observation]]

__all__ = ["BridgeFigures", "observe_bridge"]


class BridgeFigures(Protocol):
    """What the gauges read: a bridge's progress (``adapters/bridge_progress.py``)."""

    def lag(self) -> float: ...

    def unwritten_for(self) -> float: ...

    def last_write_age(self) -> float | None: ...

    def silent_for(self) -> float: ...


def observe_bridge(meter_provider: MeterProvider, figures: BridgeFigures) -> None:
    """Register the bridge's gauges on ``meter_provider``, each reading ``figures``."""
    from opentelemetry.metrics import Observation

    meter = meter_provider.get_meter(n.INSTRUMENTATION_NAME)

    def gauge(read: Callable[[], float | None]) -> _Callback:
        def observe(_options: CallbackOptions) -> Iterable[Observation]:
            value = read()
            return [] if value is None else [Observation(value)]

        return observe

    table: tuple[tuple[str, Callable[[], float | None], str], ...] = (
        (
            n.METRIC_BRIDGE_LAG,
            figures.lag,
            "Seconds since the bucket last held everything the bridge's source held.",
        ),
        (
            n.METRIC_BRIDGE_UNWRITTEN,
            figures.unwritten_for,
            "Seconds the oldest change seen in the source has waited for the bucket (0: none).",
        ),
        (
            n.METRIC_BRIDGE_LAST_WRITE_AGE,
            figures.last_write_age,
            "Seconds since the bucket last acknowledged a write of the bridge.",
        ),
        (
            n.METRIC_BRIDGE_SOURCE_SILENT,
            figures.silent_for,
            "Seconds since the bridge's source loop last finished a pass, listing or probe.",
        ),
    )
    for name, read, description in table:
        meter.create_observable_gauge(
            name, callbacks=[gauge(read)], unit="s", description=description
        )
