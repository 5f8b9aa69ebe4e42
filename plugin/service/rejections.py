"""What a rejection report says: the group, both checksums, a representative and the differences.

One shape for every place a rejection is shown (``replay``, ``status --json``, the route
extension's ``/workersets``), built either from the core's report as it is made or from the
cohorts that still stand rejected. The differences are computed here, from the two normalized
cards, and not in the core, which only hands the cards on.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from workerset_admission.admission import GroupView, RejectionReported
from workerset_admission.card.differences import Difference, differences_json, differences_of
from workerset_admission.identity import GroupKey, Registration, group_fields

__all__ = ["Registrations", "StandingRejection", "standing_rejections"]


class Registrations(Protocol):
    """Where a registration's card is looked up by key: the core, or a group's copy."""

    def registration(self, key: str) -> Registration | None: ...


@dataclass(frozen=True, slots=True)
class StandingRejection:
    """A cohort rejected in a group: why, in terms of the checksum's inputs.

    ``differences`` is ``None`` when either card was not at hand (a host that feeds the core
    registrations without cards, or a held incumbent with no member left).
    """

    group: GroupKey
    incumbent_checksum: str
    rejected_checksum: str
    instance: str
    differences: tuple[Difference, ...] | None

    @classmethod
    def of_report(cls, report: RejectionReported) -> StandingRejection:
        checksums = (report.incumbent_checksum, report.rejected_checksum)
        return cls(
            group=report.group,
            incumbent_checksum=report.incumbent_checksum,
            rejected_checksum=report.rejected_checksum,
            instance=report.instance,
            differences=differences_of(report.incumbent_card, report.rejected_card, checksums),
        )

    def to_json(self) -> dict[str, Any]:
        out = group_fields(self.group)
        out["incumbent_checksum"] = self.incumbent_checksum
        out["rejected_checksum"] = self.rejected_checksum
        out["instance"] = self.instance
        out["differences"] = differences_json(self.differences)
        return out


def standing_rejections(
    core: Registrations, views: Iterable[GroupView]
) -> tuple[StandingRejection, ...]:
    """Every cohort that stands rejected now, group by group, in cohort order.

    The representative is the member Dynamo would name: the smallest registration key.
    """
    out: list[StandingRejection] = []
    for view in views:
        if view.incumbent is None or len(view.cohorts) < 2:
            continue
        incumbent = view.cohorts[0]
        incumbent_card = _card(core, min((m.key for m in incumbent.members), default=None))
        for cohort in view.rejected:
            if not cohort.members:
                continue
            instance = min(m.key for m in cohort.members)
            checksums = (view.incumbent, cohort.mdc_checksum)
            out.append(
                StandingRejection(
                    group=view.key,
                    incumbent_checksum=view.incumbent,
                    rejected_checksum=cohort.mdc_checksum,
                    instance=instance,
                    differences=differences_of(incumbent_card, _card(core, instance), checksums),
                )
            )
    return tuple(out)


def _card(core: Registrations, key: str | None) -> object:
    registration = None if key is None else core.registration(key)
    return None if registration is None else registration.card
