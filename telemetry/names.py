"""Every span name, attribute key and metric name the plugin emits, defined once.

Semantic-convention keys are spelled as the OpenTelemetry conventions spell them; everything
else lives under the one project prefix, so a backend query for ``workerset_admission.*`` finds
all of it. Span names follow ``{verb} {object}`` and never carry a key or a checksum, which keeps
their cardinality low.
"""

from __future__ import annotations

from typing import Final

from workerset_admission.admission.status import GroupStatus

__all__ = [
    "ATTR_BUILD_ATTEMPT",
    "ATTR_BUILD_OUTCOME",
    "ATTR_CHECKSUM",
    "ATTR_DECISION",
    "ATTR_DETAIL",
    "ATTR_DIFFERENCES",
    "ATTR_DISCOVERY_KEY",
    "ATTR_DISCOVERY_OPERATION",
    "ATTR_DISCOVERY_REVISION",
    "ATTR_DRAINED",
    "ATTR_DRAIN_BY",
    "ATTR_ERROR_TYPE",
    "ATTR_GENERATION",
    "ATTR_GROUP",
    "ATTR_HANDOVER_REASON",
    "ATTR_HOLD_DEADLINE",
    "ATTR_HOLD_DURATION",
    "ATTR_HOLD_LAST_KNOWN",
    "ATTR_HOLD_LAST_KNOWN_UNTIL",
    "ATTR_HOLD_OUTCOME",
    "ATTR_INCUMBENT_CHECKSUM",
    "ATTR_INSTANCE",
    "ATTR_MESSAGING_DESTINATION",
    "ATTR_MESSAGING_OPERATION_TYPE",
    "ATTR_MESSAGING_SYSTEM",
    "ATTR_MODEL",
    "ATTR_NEW_CHECKSUM",
    "ATTR_NEW_GENERATION",
    "ATTR_OLD_CHECKSUM",
    "ATTR_OLD_GENERATION",
    "ATTR_REASON",
    "ATTR_REJECTED_CHECKSUM",
    "ATTR_RETRY_DELAY",
    "ATTR_SNAPSHOT_ENTRIES",
    "ATTR_SNAPSHOT_REASON",
    "ATTR_WORKER_SET",
    "BUILD_OUTCOMES",
    "EVENT_COHORT_REJECTED",
    "EVENT_INVALID_RECORD",
    "EVENT_RETRY_SCHEDULED",
    "GROUP_STATUSES",
    "INSTRUMENTATION_NAME",
    "LABEL_DECISION",
    "LABEL_DIFFERS_IN",
    "LABEL_INCUMBENT_CHECKSUM",
    "LABEL_MDC_CHECKSUM",
    "LABEL_MODEL",
    "LABEL_OPERATION",
    "LABEL_OUTCOME",
    "LABEL_REASON",
    "LABEL_ROUTER_WORKER_ID",
    "LABEL_STATE",
    "LABEL_STATUS",
    "METRIC_ADMISSION_LATENCY",
    "METRIC_BRIDGE_LAG",
    "METRIC_BRIDGE_LAST_WRITE_AGE",
    "METRIC_BRIDGE_SOURCE_SILENT",
    "METRIC_BRIDGE_UNWRITTEN",
    "METRIC_BUILDS",
    "METRIC_BUILD_DURATION",
    "METRIC_GROUPS",
    "METRIC_GROUPS_HELD",
    "METRIC_HOLDS",
    "METRIC_INCUMBENT_SINCE",
    "METRIC_INVALID_RECORDS",
    "METRIC_REJECTED_COHORTS",
    "METRIC_REJECTED_COHORT_WORKERS",
    "METRIC_ROUTER_WORKERS",
    "METRIC_ROUTER_WORKER_STATE",
    "METRIC_SUCCESSIONS",
    "METRIC_UPDATES",
    "METRIC_VIEW_LAG",
    "METRIC_WORKERS",
    "METRIC_WORKERS_ADMITTED",
    "PREFIX",
    "SPAN_APPLY_SNAPSHOT",
    "SPAN_APPLY_UPDATE",
    "SPAN_BUILD",
    "SPAN_COMMIT",
    "SPAN_DRAIN",
    "SPAN_HANDOVER",
    "SPAN_HOLD",
    "SPAN_SUCCEED",
    "SPAN_WITHDRAW",
    "WORKER_STATES",
]

PREFIX: Final = "workerset_admission"
INSTRUMENTATION_NAME: Final = "workerset_admission"

# --- span names -------------------------------------------------------------------------------
SPAN_APPLY_UPDATE: Final = "apply discovery_update"
SPAN_APPLY_SNAPSHOT: Final = "apply discovery_snapshot"
SPAN_BUILD: Final = "build worker_set"
SPAN_COMMIT: Final = "commit worker_set"
SPAN_WITHDRAW: Final = "withdraw worker_set"
SPAN_SUCCEED: Final = "succeed worker_set"
SPAN_HOLD: Final = "hold worker_set"
SPAN_DRAIN: Final = "drain worker"
SPAN_HANDOVER: Final = "handover worker_set"

# --- span events ------------------------------------------------------------------------------
EVENT_COHORT_REJECTED: Final = f"{PREFIX}.cohort_rejected"
EVENT_INVALID_RECORD: Final = f"{PREFIX}.invalid_record"
EVENT_RETRY_SCHEDULED: Final = f"{PREFIX}.build_retry_scheduled"

# --- semantic-convention attributes -----------------------------------------------------------
ATTR_MESSAGING_SYSTEM: Final = "messaging.system"
ATTR_MESSAGING_DESTINATION: Final = "messaging.destination.name"
ATTR_MESSAGING_OPERATION_TYPE: Final = "messaging.operation.type"
ATTR_ERROR_TYPE: Final = "error.type"

# --- project span attributes ------------------------------------------------------------------
ATTR_DISCOVERY_KEY: Final = f"{PREFIX}.discovery.key"
ATTR_DISCOVERY_REVISION: Final = f"{PREFIX}.discovery.revision"
ATTR_DISCOVERY_OPERATION: Final = f"{PREFIX}.discovery.operation"
ATTR_SNAPSHOT_ENTRIES: Final = f"{PREFIX}.snapshot.entries"
ATTR_SNAPSHOT_REASON: Final = f"{PREFIX}.snapshot.reason"
ATTR_GROUP: Final = f"{PREFIX}.group"
ATTR_MODEL: Final = f"{PREFIX}.model"
ATTR_WORKER_SET: Final = f"{PREFIX}.worker_set"
ATTR_DECISION: Final = f"{PREFIX}.decision"
ATTR_CHECKSUM: Final = f"{PREFIX}.mdc_checksum"
ATTR_GENERATION: Final = f"{PREFIX}.generation"
ATTR_BUILD_ATTEMPT: Final = f"{PREFIX}.build.attempt"
ATTR_BUILD_OUTCOME: Final = f"{PREFIX}.build.outcome"
ATTR_RETRY_DELAY: Final = f"{PREFIX}.build.retry_delay"
ATTR_INCUMBENT_CHECKSUM: Final = f"{PREFIX}.incumbent_checksum"
ATTR_REJECTED_CHECKSUM: Final = f"{PREFIX}.rejected_checksum"
ATTR_INSTANCE: Final = f"{PREFIX}.instance"
# A drain: who drained the worker (the drain record's ``by``), whether a succession was caused
# by a drain, and why a drained tenure's handover ended.
ATTR_DRAIN_BY: Final = f"{PREFIX}.drain.by"
ATTR_DRAINED: Final = f"{PREFIX}.drained"
ATTR_HANDOVER_REASON: Final = f"{PREFIX}.handover.reason"
ATTR_DIFFERENCES: Final = f"{PREFIX}.differences"
ATTR_OLD_CHECKSUM: Final = f"{PREFIX}.succession.old_checksum"
ATTR_NEW_CHECKSUM: Final = f"{PREFIX}.succession.new_checksum"
ATTR_OLD_GENERATION: Final = f"{PREFIX}.succession.old_generation"
ATTR_NEW_GENERATION: Final = f"{PREFIX}.succession.new_generation"
ATTR_REASON: Final = f"{PREFIX}.reason"
ATTR_HOLD_DEADLINE: Final = f"{PREFIX}.hold.deadline"
ATTR_HOLD_OUTCOME: Final = f"{PREFIX}.hold.outcome"
ATTR_HOLD_DURATION: Final = f"{PREFIX}.hold.duration"
# The instance keys a held tenure serves on their last known records, and until when.
ATTR_HOLD_LAST_KNOWN: Final = f"{PREFIX}.hold.last_known"
ATTR_HOLD_LAST_KNOWN_UNTIL: Final = f"{PREFIX}.hold.last_known_until"
ATTR_DETAIL: Final = f"{PREFIX}.detail"

# --- metric attributes ------------------------------------------------------------------------
# Short on purpose: the metric name already carries the project prefix, and these become
# Prometheus labels, which by convention are plain words.
LABEL_OPERATION: Final = "operation"
LABEL_DECISION: Final = "decision"
LABEL_REASON: Final = "reason"
LABEL_MODEL: Final = "model"
LABEL_OUTCOME: Final = "outcome"
LABEL_STATUS: Final = "status"
LABEL_STATE: Final = "state"
# Dynamo's own label names for a WorkerSet and a worker (its frontend's router metrics), so a
# query written for Dynamo reads this plugin's series unchanged; the WorkerSet's five labels are
# ``worker_states.WorkerSetLabels``.
LABEL_ROUTER_WORKER_ID: Final = "router_worker_id"
# The first input of the checksum a rejected card differs in (``worker_states.differs_in``).
LABEL_DIFFERS_IN: Final = "differs_in"
LABEL_MDC_CHECKSUM: Final = "mdc_checksum"
LABEL_INCUMBENT_CHECKSUM: Final = "incumbent_checksum"

# --- metrics ----------------------------------------------------------------------------------
METRIC_UPDATES: Final = f"{PREFIX}.discovery.updates"
METRIC_INVALID_RECORDS: Final = f"{PREFIX}.discovery.invalid_records"
METRIC_REJECTED_COHORTS: Final = f"{PREFIX}.cohorts.rejected"
METRIC_SUCCESSIONS: Final = f"{PREFIX}.successions"
METRIC_BUILDS: Final = f"{PREFIX}.builds"
METRIC_BUILD_DURATION: Final = f"{PREFIX}.build.duration"
METRIC_GROUPS: Final = f"{PREFIX}.groups"
METRIC_GROUPS_HELD: Final = f"{PREFIX}.groups.held"
METRIC_WORKERS_ADMITTED: Final = f"{PREFIX}.workers.admitted"
METRIC_WORKERS: Final = f"{PREFIX}.workers"
METRIC_ADMISSION_LATENCY: Final = f"{PREFIX}.admission.latency"
# Dynamo's router worker metrics under this plugin's prefix, with Dynamo's labels and values
# (deploy/prometheus/README.md says why not under Dynamo's own names).
METRIC_ROUTER_WORKERS: Final = f"{PREFIX}.router.workers"
METRIC_ROUTER_WORKER_STATE: Final = f"{PREFIX}.router.worker_state"
METRIC_INCUMBENT_SINCE: Final = f"{PREFIX}.incumbent.since"
METRIC_REJECTED_COHORT_WORKERS: Final = f"{PREFIX}.rejected_cohort.workers"
METRIC_HOLDS: Final = f"{PREFIX}.holds"
METRIC_VIEW_LAG: Final = f"{PREFIX}.view.lag"
# The bridges' (``workerset-admission bridge``): how far behind its source the bucket is.
METRIC_BRIDGE_LAG: Final = f"{PREFIX}.bridge.lag"
METRIC_BRIDGE_UNWRITTEN: Final = f"{PREFIX}.bridge.unwritten"
METRIC_BRIDGE_LAST_WRITE_AGE: Final = f"{PREFIX}.bridge.last_write.age"
METRIC_BRIDGE_SOURCE_SILENT: Final = f"{PREFIX}.bridge.source_loop.silent"

# Every status the core's transition table knows; the gauge reports each of them (zero
# included) so a status that empties shows 0 instead of a series that silently vanishes.
GROUP_STATUSES: Final = tuple(status.value for status in GroupStatus)

# Every outcome of a build attempt; the build counter reports each from the start, at 0.
BUILD_OUTCOMES: Final = ("ok", "failed", "cancelled")

# The states the worker gauge counts registered workers in; each is reported for every model
# (zero included), so an alert on "rejected" sees it clear.
WORKER_STATES: Final = ("admitted", "rejected", "held", "drained")
