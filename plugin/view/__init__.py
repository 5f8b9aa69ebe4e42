"""The admitted view's plan, pure: tenure facts and accepted records in, files and phases out.

``records`` files the records the core accepted by what ties them to a worker; ``plan`` says
which files each tenure's contributions call for and in which phase each change goes. The
adapter that writes the directory (``adapters/dynamo/view.py``) applies what the plan says.
"""

from workerset_admission.view.plan import (
    BUCKETS,
    SCOPE_TOPICS,
    FileChange,
    Phase,
    ViewChanges,
    ViewPlan,
    contribution_files,
    note_ties,
    plan_view,
    untied_topics,
)
from workerset_admission.view.records import (
    KV_EVENTS,
    PublishableRecord,
    RecordTable,
    Tie,
    ViewFile,
)

__all__ = [
    "BUCKETS",
    "KV_EVENTS",
    "SCOPE_TOPICS",
    "FileChange",
    "Phase",
    "PublishableRecord",
    "RecordTable",
    "Tie",
    "ViewChanges",
    "ViewFile",
    "ViewPlan",
    "contribution_files",
    "note_ties",
    "plan_view",
    "untied_topics",
]
