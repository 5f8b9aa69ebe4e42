"""Readiness of the WorkerSets a replayed trace ends up serving, as the service computes it.

One readiness unit per committed WorkerSet (status ``ready`` or ``blocked_ready``): its worker
type and needs from the incumbent's first member, and as live count the admitted workers whose
endpoint record is present at the end of the trace (the replay itself tracks no liveness).
Every namespace a trace names is judged, so a namespace with nothing committed shows up as
not ready.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from workerset_admission.admission.readiness import ReadinessUnit, evaluate_readiness
from workerset_admission.card import parse_key
from workerset_admission.traces.replay import ReplayResult


def _live_endpoints(lines: Iterable[str]) -> tuple[set[tuple[str, int]], set[str]]:
    live: set[tuple[str, int]] = set()
    namespaces: set[str] = set()
    for line in lines:
        event = json.loads(line)
        if event["kind"] not in ("put", "delete"):
            continue
        parsed = parse_key(event["key"])
        namespaces.add(parsed.endpoint.namespace)
        if parsed.kind != "endpoint":
            continue
        ident = (parsed.endpoint.path(), parsed.instance_id)
        if event["kind"] == "put":
            live.add(ident)
        else:
            live.discard(ident)
    return live, namespaces


def readiness_of(result: ReplayResult, lines: list[str]) -> dict[str, Any]:
    """``"<model> @ <namespace>"`` -> the verdict, with its present/missing/ambiguous roles."""
    live, namespaces = _live_endpoints(lines)
    units: dict[tuple[str, str], list[ReadinessUnit]] = {}
    for view in result.core.groups():
        namespace = view.key.endpoint.namespace
        units.setdefault((view.key.model, namespace), [])
        if not view.status.committed:
            continue
        first = view.cohorts[0].members[0].key
        registration = result.core.registration(first)
        assert registration is not None
        count = sum((view.key.endpoint.path(), i) in live for i in view.admitted)
        units[(view.key.model, namespace)].append(
            ReadinessUnit(registration.worker_type, count, registration.needs)
        )
    out: dict[str, Any] = {}
    for (model, namespace), group_units in sorted(units.items()):
        verdict = evaluate_readiness(group_units)
        out[f"{model} @ {namespace}"] = {
            "ready": verdict.ready,
            "has_legacy": verdict.has_legacy,
            "present": [r.value for r in verdict.present],
            "missing": [r.value for r in verdict.missing],
            "ambiguous": [r.value for r in verdict.ambiguous],
            "units": len(group_units),
        }
    missing_namespaces = namespaces - {ns for _, ns in units}
    for namespace in sorted(missing_namespaces):
        out[f"(none) @ {namespace}"] = {"ready": False, "units": 0}
    return out
