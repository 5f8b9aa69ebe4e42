"""The status read-model as a fold: a change rebuilds the groups it names, never the fleet.

Theory of operation
-------------------

What the service shows (its status, its serving records, the gauges read from them) is per
group: a group's picture, its standing rejections, its readiness unit and its entry in its
namespace's serving record depend on that group's state in the core and on the liveness of its
endpoint's instances, and on nothing else. So the fold keeps those four parts per group and
rebuilds a group's parts only when something named it since the last read:

* every step's delta (:class:`~workerset_admission.ports.StepDelta`): the groups it names
  (an effect named them) may have changed;
* the delta's endpoints whose liveness moved: an endpoint record that came or went changes
  which admitted ids are routable at that endpoint, for every group there.

A namespace's serving record is rebuilt when one of its groups was; the status's tuples are
put together from the kept parts (linear in the groups, not in the workers). The first read
builds everything, as the full path does; :func:`~.status_model.serving_records`,
:func:`~.status_model.readiness` and :func:`~.status_model.standing_rejections` are that full
path, and a differential test (``tests/test_status_fold.py``) holds the fold to them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from workerset_admission.admission import AdmissionCore
from workerset_admission.admission.readiness import ReadinessUnit
from workerset_admission.identity import EndpointId, GroupKey
from workerset_admission.ports import StepDelta
from workerset_admission.service.liveness import LivenessIndex
from workerset_admission.service.status_model import (
    GroupStatusReport,
    ModelReadiness,
    ServingRecord,
    StandingRejection,
    group_status_report,
    judge_readiness,
    readiness_unit,
    serving_group,
    serving_record,
    standing_rejections,
)

__all__ = ["StatusFold"]


@dataclass(frozen=True, slots=True)
class _GroupParts:
    """What one group contributes to the status and the serving records."""

    status: GroupStatusReport
    rejections: tuple[StandingRejection, ...]
    unit: ReadinessUnit | None
    serving: dict[str, Any] | None


class StatusFold:
    """Per-group status parts, rebuilt for the groups a change named; see the module doc."""

    def __init__(
        self, core: AdmissionCore, liveness: LivenessIndex, clock: Callable[[], float]
    ) -> None:
        self._core = core
        self._liveness = liveness
        self._clock = clock
        self._parts: dict[GroupKey, _GroupParts] = {}
        self._by_endpoint: dict[EndpointId, set[GroupKey]] = {}
        self._by_namespace: dict[str, set[GroupKey]] = {}
        self._records: dict[str, ServingRecord] = {}
        self._dirty: set[GroupKey] = set()
        self._everything = True
        # What the last read put together, kept until a group changes.
        self._groups: tuple[GroupStatusReport, ...] = ()
        self._rejections: tuple[StandingRejection, ...] = ()
        self._readiness: tuple[ModelReadiness, ...] = ()
        self._assembled = True
        # Readiness per (model, namespace), judged again when one of its groups changed.
        self._judged: dict[tuple[str, str], ModelReadiness] = {}
        self.rebuilt = 0

    def step(self, delta: StepDelta) -> None:
        """Note the groups one step named, and those at endpoints whose liveness moved."""
        self._dirty.update(delta.groups)
        for endpoint in delta.endpoints:
            self._dirty.update(self._by_endpoint.get(endpoint, ()))

    def groups(self) -> tuple[GroupStatusReport, ...]:
        self._assemble()
        return self._groups

    def rejections(self) -> tuple[StandingRejection, ...]:
        self._assemble()
        return self._rejections

    def readiness(self) -> tuple[ModelReadiness, ...]:
        self._assemble()
        return self._readiness

    def serving_records(self) -> dict[str, ServingRecord]:
        """Return what this frontend serves, per worker namespace (a copy of the kept records)."""
        self._refresh()
        return dict(self._records)

    # -- the fold ----------------------------------------------------------------------------

    def _refresh(self) -> None:
        if self._everything:
            self._everything = False
            self._dirty.update(view.key for view in self._core.groups())
            self._dirty.update(self._parts)
        if not self._dirty:
            return
        dirty, self._dirty = self._dirty, set()
        serving = self._core.serving()
        namespaces = set()
        for key in dirty:
            namespaces.add(key.endpoint.namespace)
            self._rebuild(key, serving.get(key))
        for namespace in namespaces:
            self._record(namespace)
        for model, namespace in {(key.model, key.endpoint.namespace) for key in dirty}:
            self._judge(model, namespace)
        self._assembled = False

    def _assemble(self) -> None:
        """Put the status's tuples together from the kept parts (a status read, not a change)."""
        self._refresh()
        if self._assembled:
            return
        ordered = [self._parts[key] for key in sorted(self._parts)]
        self._groups = tuple(p.status for p in ordered)
        self._rejections = tuple(r for p in ordered for r in p.rejections)
        self._readiness = tuple(self._judged[k] for k in sorted(self._judged))
        self._assembled = True

    def _judge(self, model: str, namespace: str) -> None:
        """Judge one model's readiness in one namespace from its committed groups' units."""
        parts = self._parts
        units = [
            (key, unit)
            for key in self._by_namespace.get(namespace, ())
            if key.model == model and (unit := parts[key].unit) is not None
        ]
        judged = judge_readiness(units)
        if judged:
            self._judged[(model, namespace)] = judged[0]
        else:
            self._judged.pop((model, namespace), None)

    def _rebuild(self, key: GroupKey, served: Any) -> None:
        self.rebuilt += 1
        core = self._core
        view = core.group(key)
        if view is None:
            if self._parts.pop(key, None) is not None:
                _unindex(self._by_endpoint, key.endpoint, key)
                _unindex(self._by_namespace, key.endpoint.namespace, key)
            return
        # Only a committed group (one that serves) has a readiness unit and a serving entry.
        self._parts[key] = _GroupParts(
            status=group_status_report(view, self._liveness, self._clock),
            rejections=standing_rejections(core, [view]),
            unit=None if served is None else readiness_unit(core, view, self._liveness),
            serving=None if served is None else serving_group(view, served),
        )
        self._by_endpoint.setdefault(key.endpoint, set()).add(key)
        self._by_namespace.setdefault(key.endpoint.namespace, set()).add(key)

    def _record(self, namespace: str) -> None:
        parts = self._parts
        entries = [
            entry
            for key in sorted(self._by_namespace.get(namespace, ()))
            if (entry := parts[key].serving) is not None
        ]
        if entries:
            self._records[namespace] = serving_record(entries)
        else:
            self._records.pop(namespace, None)


def _unindex(index: dict[Any, set[GroupKey]], at: Any, key: GroupKey) -> None:
    keys = index[at]
    keys.discard(key)
    if not keys:
        del index[at]
