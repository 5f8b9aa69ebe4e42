"""The async shell around the admission core: the service, its one step, and what it drives.

``AdmissionService`` (``admission_service.py``) owns every task; ``AdmissionStep``
(``step.py``) turns source events into core steps and carries out their effects, for the live
service and for ``replay`` alike; ``create_service`` (``factory.py``) assembles a service from
settings, connected to NATS.
"""

from __future__ import annotations

from workerset_admission.service.admission_service import (
    AdmissionService,
    BuildRequest,
    CardRecordDecoder,
    GroupStatusView,
    PipelineBuilder,
    ServiceStatus,
)
from workerset_admission.service.factory import create_service
from workerset_admission.service.step import AdmissionStep

__all__ = [
    "AdmissionService",
    "AdmissionStep",
    "BuildRequest",
    "CardRecordDecoder",
    "GroupStatusView",
    "PipelineBuilder",
    "ServiceStatus",
    "create_service",
]
