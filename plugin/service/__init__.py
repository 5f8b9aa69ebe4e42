"""The async shell around the admission core: the service, its one step, and what it drives.

``AdmissionService`` (``admission_service.py``) owns every task; ``AdmissionStep``
(``step.py``) turns source events into core steps and carries out their effects, for the live
service and for ``replay`` alike. What the service runs on (the source, the publishers, the view,
the trace) is put together outside it, in ``workerset_admission.wiring``.
"""

from __future__ import annotations

from workerset_admission.service.admission_service import (
    AdmissionService,
    BuildRequest,
    CardRecordDecoder,
    GroupStatusReport,
    PipelineBuilder,
    ServiceStatus,
)
from workerset_admission.service.step import AdmissionStep

__all__ = [
    "AdmissionService",
    "AdmissionStep",
    "BuildRequest",
    "CardRecordDecoder",
    "GroupStatusReport",
    "PipelineBuilder",
    "ServiceStatus",
]
