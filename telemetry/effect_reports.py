"""How the core's effects become telemetry: which effects are reported, and by what call.

Effects are the core's frozen dataclasses, dispatched on their exact type. The import goes one
way only: the core never imports telemetry.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final, Protocol

from workerset_admission.admission import effects as fx
from workerset_admission.card.differences import Difference, differences_of
from workerset_admission.identity import GroupKey


class ReportSink(Protocol):
    """What the handlers report to: the telemetry facade (``facade.AdmissionTelemetry``).

    Named here as a shape so this module does not import the facade that imports it.
    """

    def cohort_rejected(
        self,
        *,
        model: str,
        worker_set: str,
        incumbent_checksum: str,
        rejected_checksum: str,
        instance: str,
        differences: Sequence[Difference] | None = None,
    ) -> None: ...

    def invalid_record(
        self, key: str, reason: str, detail: str = "", *, span: Any = None
    ) -> None: ...

    def group_committed(self, group: object, checksum: str, generation: int) -> None: ...

    def group_withdrawn(
        self, group: object, checksum: str | None, generation: int | None
    ) -> None: ...

    def succession(
        self,
        group: object,
        old_checksum: str | None,
        new_checksum: str | None,
        old_generation: int | None,
        new_generation: int | None,
        *,
        drained: bool = False,
    ) -> None: ...

    def worker_drained(
        self, group: object, key: str, checksum: str, was_admitted: bool, by: str
    ) -> None: ...

    def handover_ended(
        self, group: object, checksum: str, generation: int, reason: str
    ) -> None: ...

    def tenure_held(
        self,
        group: object,
        checksum: str,
        generation: int | None,
        deadline: float,
        last_known: Sequence[str] = (),
        last_known_until: float | None = None,
    ) -> None: ...

    def tenure_hold_ended(
        self, group: object, checksum: str, outcome: str, held_for: float
    ) -> None: ...

    def retry_scheduled(
        self,
        group: object,
        checksum: str,
        generation: int,
        attempt: int,
        delay: float,
        error: str,
    ) -> None: ...

    def tenure_began(self, group: object, receiver: int | None) -> None: ...

    def tenure_ended(self, group: object, receiver: int | None) -> None: ...


__all__ = ["EFFECT_HANDLERS", "MUTATION_REFUSED", "decision_of"]

MUTATION_REFUSED: Final = "mutation_refused"
"""The invalid-record reason counted for a registration key re-sent with another identity."""


def _on_rejection(telemetry: ReportSink, effect: fx.RejectionReported) -> None:
    telemetry.cohort_rejected(
        model=effect.model,
        worker_set=effect.worker_set,
        incumbent_checksum=effect.incumbent_checksum,
        rejected_checksum=effect.rejected_checksum,
        instance=effect.instance,
        differences=differences_of(
            effect.incumbent_card,
            effect.rejected_card,
            (effect.incumbent_checksum, effect.rejected_checksum),
        ),
    )


def _on_mutation(telemetry: ReportSink, effect: fx.MutationRefused) -> None:
    telemetry.invalid_record(
        effect.key,
        MUTATION_REFUSED,
        f"{effect.reason}: kept {effect.kept_group.id} {effect.kept_checksum}, "
        f"offered {effect.offered_group.id} {effect.offered_checksum}",
    )


def _on_commit(telemetry: ReportSink, effect: fx.CommitGroup) -> None:
    telemetry.group_committed(effect.group, effect.mdc_checksum, effect.generation)


def _on_withdraw(telemetry: ReportSink, effect: fx.WithdrawGroup) -> None:
    telemetry.group_withdrawn(effect.group, effect.mdc_checksum, effect.generation)


def _on_succession(telemetry: ReportSink, effect: fx.Succession) -> None:
    telemetry.succession(
        effect.group,
        effect.old_checksum,
        effect.new_checksum,
        effect.old_generation,
        effect.new_generation,
        drained=effect.drained,
    )


def _on_drained(telemetry: ReportSink, effect: fx.WorkerDrained) -> None:
    telemetry.worker_drained(
        effect.group, effect.key, effect.mdc_checksum, effect.was_admitted, effect.drain.by
    )


def _on_handover_ended(telemetry: ReportSink, effect: fx.HandoverEnded) -> None:
    telemetry.handover_ended(effect.group, effect.mdc_checksum, effect.generation, effect.reason)


def _on_held(telemetry: ReportSink, effect: fx.TenureHeld) -> None:
    telemetry.tenure_held(
        effect.group,
        effect.mdc_checksum,
        effect.generation,
        effect.deadline,
        effect.last_known,
        effect.last_known_until,
    )


def _on_hold_ended(telemetry: ReportSink, effect: fx.TenureHoldEnded) -> None:
    telemetry.tenure_hold_ended(effect.group, effect.mdc_checksum, effect.outcome, effect.held_for)


def _on_retry(telemetry: ReportSink, effect: fx.RetryScheduled) -> None:
    telemetry.retry_scheduled(
        effect.group,
        effect.mdc_checksum,
        effect.generation,
        effect.attempt,
        effect.delay,
        effect.error,
    )


def _on_open(telemetry: ReportSink, effect: fx.OpenReceiver) -> None:
    telemetry.tenure_began(effect.group, effect.receiver)


def _on_retire(telemetry: ReportSink, effect: fx.RetireReceiver) -> None:
    telemetry.tenure_ended(effect.group, effect.receiver)


# The effects worth reporting; the others (publications, build requests) are the service's to
# carry out and show up in the spans of the work they cause. A receiver opened or retired marks
# a tenure's start or end, which the incumbent gauge reports.
EFFECT_HANDLERS: Final[dict[type, Callable[[ReportSink, Any], None]]] = {
    fx.RejectionReported: _on_rejection,
    fx.MutationRefused: _on_mutation,
    fx.CommitGroup: _on_commit,
    fx.WithdrawGroup: _on_withdraw,
    fx.Succession: _on_succession,
    fx.WorkerDrained: _on_drained,
    fx.HandoverEnded: _on_handover_ended,
    fx.TenureHeld: _on_held,
    fx.TenureHoldEnded: _on_hold_ended,
    fx.RetryScheduled: _on_retry,
    fx.OpenReceiver: _on_open,
    fx.RetireReceiver: _on_retire,
}


def _placed(effect: fx.WorkerPlaced) -> tuple[str, GroupKey | None]:
    return ("admitted" if effect.admitted else "rejected"), effect.group


def _departed(effect: fx.WorkerDeparted) -> tuple[str, GroupKey | None]:
    return "removed", effect.group


def _set_aside(effect: fx.WorkerDrained) -> tuple[str, GroupKey | None]:
    return "drained", effect.group


def _refused(effect: fx.MutationRefused) -> tuple[str, GroupKey | None]:
    return "refused", effect.kept_group


# The effects that say what became of the update's registration; the first one found decides.
_DECISIONS: Final[dict[type, Callable[[Any], tuple[str, GroupKey | None]]]] = {
    fx.WorkerPlaced: _placed,
    fx.WorkerDeparted: _departed,
    fx.WorkerDrained: _set_aside,
    fx.MutationRefused: _refused,
}


def decision_of(effects: Sequence[object]) -> tuple[str, GroupKey | None]:
    """Summarize what the core's effects say about the one update that caused them.

    ``admitted`` or ``rejected`` for a registration placed in the incumbent or another cohort,
    ``removed`` for a departure, ``drained`` for a registration a drain set aside,
    ``refused`` for a refused in-place change, ``updated`` for any other change,
    ``unchanged`` for a duplicate.
    """
    for effect in effects:
        decide = _DECISIONS.get(type(effect))
        if decide is not None:
            return decide(effect)
    return ("updated" if effects else "unchanged"), None
