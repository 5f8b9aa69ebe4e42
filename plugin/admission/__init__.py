"""The admission core: pure, synchronous, deterministic WorkerSet admission decisions.

Nothing in this package performs I/O or imports asyncio, NATS, OpenTelemetry, logging or
pydantic. Feed it inputs with :meth:`AdmissionCore.apply` and carry out the effects it returns.
"""

from __future__ import annotations

from workerset_admission.admission.core import AdmissionCore, CoreSettings
from workerset_admission.admission.effects import (
    BuildDiscarded,
    CancelBuild,
    CommitGroup,
    Effect,
    LoraAdapter,
    LoraProjectionChanged,
    LoraWorker,
    MutationRefused,
    OpenReceiver,
    PublishAdmissions,
    RejectionReported,
    RetireReceiver,
    RetryScheduled,
    StartBuild,
    StatusChanged,
    Succession,
    TaintsUpdated,
    TenureHeld,
    TenureHoldEnded,
    WithdrawGroup,
    WorkerDeparted,
    WorkerPlaced,
)
from workerset_admission.admission.inputs import (
    BuildFinished,
    CommitFailed,
    Input,
    Snapshot,
    TenureRecorded,
    Tick,
    WorkerAdded,
    WorkerRemoved,
)
from workerset_admission.admission.status import GroupStatus, StatusEvent, StatusMachine
from workerset_admission.admission.views import CohortView, GroupView, MemberView, PlacementView

__all__ = [
    "AdmissionCore",
    "BuildDiscarded",
    "BuildFinished",
    "CancelBuild",
    "CohortView",
    "CommitFailed",
    "CommitGroup",
    "CoreSettings",
    "Effect",
    "GroupStatus",
    "GroupView",
    "Input",
    "LoraAdapter",
    "LoraProjectionChanged",
    "LoraWorker",
    "MemberView",
    "MutationRefused",
    "OpenReceiver",
    "PlacementView",
    "PublishAdmissions",
    "RejectionReported",
    "RetireReceiver",
    "RetryScheduled",
    "Snapshot",
    "StartBuild",
    "StatusChanged",
    "StatusEvent",
    "StatusMachine",
    "Succession",
    "TaintsUpdated",
    "TenureHeld",
    "TenureHoldEnded",
    "TenureRecorded",
    "Tick",
    "WithdrawGroup",
    "WorkerAdded",
    "WorkerDeparted",
    "WorkerPlaced",
    "WorkerRemoved",
]
