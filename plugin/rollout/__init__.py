"""The rollout gate: is a new deployment generation served by every live frontend."""

from __future__ import annotations

from workerset_admission.rollout.gate import (
    Disagreement,
    FrontendServing,
    GateReport,
    evaluate_gate,
    render_table,
)

__all__ = [
    "Disagreement",
    "FrontendServing",
    "GateReport",
    "evaluate_gate",
    "render_table",
]
