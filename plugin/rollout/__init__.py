"""The rollout gate: is a new deployment generation served by every live frontend."""

from __future__ import annotations

from workerset_admission.rollout.gate import (
    PROTOCOL,
    BucketRead,
    CapabilityRecord,
    Disagreement,
    FrontendView,
    GateReport,
    NamespaceRecord,
    RawEntry,
    Record,
    ServedGroup,
    evaluate_gate,
    parse_record,
    render_table,
)

__all__ = [
    "PROTOCOL",
    "BucketRead",
    "CapabilityRecord",
    "Disagreement",
    "FrontendView",
    "GateReport",
    "NamespaceRecord",
    "RawEntry",
    "Record",
    "ServedGroup",
    "evaluate_gate",
    "parse_record",
    "render_table",
]
