"""The admission core's read-only views of groups, registrations and placements."""

from __future__ import annotations

from collections.abc import Iterator

from workerset_admission.admission.state import CoreSettings, _base_key, _CoreState, _Group
from workerset_admission.admission.views import CohortView, GroupView, MemberView, PlacementView
from workerset_admission.identity import GroupKey, Registration


class _ReadoutMixin(_CoreState):
    """Read-only views of ``AdmissionCore``."""

    @property
    def settings(self) -> CoreSettings:
        return self._settings

    @property
    def now(self) -> float:
        """The latest clock value a ``Tick`` brought."""
        return self._now

    def group(self, key: GroupKey) -> GroupView | None:
        group = self._groups.get((key.model, key.worker_set))
        return None if group is None else self._view(group)

    def groups(self) -> list[GroupView]:
        """Every group ever seen (idle ones included), sorted by model then WorkerSet key."""
        return [self._view(g) for g in sorted(self._groups.values(), key=lambda g: g.key)]

    def registration(self, key: str) -> Registration | None:
        """Return the registration held for ``key`` (base or LoRA): its first incarnation."""
        return self._regs.get(key) or self._loras.get(key)

    def registrations(self) -> Iterator[Registration]:
        yield from self._regs.values()
        yield from self._loras.values()

    def placement(self, key: str) -> PlacementView | None:
        """Where ``key`` stands: cohort position, whether admitted, adapter attachment."""
        reg = self._regs.get(key)
        if reg is not None:
            group = self._group_of(reg)
            hold = group.hold
            if hold is not None and hold.arrivals.get(reg.instance_id) is reg:
                # A new instance of a held incumbent's checksum: tracked, in no cohort yet.
                return PlacementView(key, reg.group, reg.mdc_checksum, False, None, False, None)
            position = list(group.cohorts).index(reg.mdc_checksum)
            return PlacementView(
                key=key,
                group=reg.group,
                mdc_checksum=reg.mdc_checksum,
                is_lora=False,
                position=position,
                admitted=position == 0,
                attached_to=None,
            )
        lora = self._loras.get(key)
        if lora is None:
            return None
        host = self._admitted_host(_base_key(lora))
        return PlacementView(
            key=key,
            group=lora.group,
            mdc_checksum=lora.mdc_checksum,
            is_lora=True,
            position=None,
            admitted=host is not None,
            attached_to=None if host is None else host.key,
        )

    def _view(self, group: _Group) -> GroupView:
        cohorts = tuple(
            CohortView(
                mdc_checksum=c.checksum,
                members=tuple(
                    sorted(
                        (MemberView(r.key, r.instance_id) for r in c.members.values()),
                        key=lambda m: (m.instance_id, m.key),
                    )
                ),
            )
            for c in group.cohorts.values()
        )
        admitted = tuple(sorted(self._admitted(group))) if group.checksum is not None else ()
        hold = group.hold
        return GroupView(
            key=group.key,
            incumbent=group.checksum,
            status=group.status.state,
            generation=group.generation,
            committed_generation=group.committed_generation,
            receiver=group.receiver,
            admitted=admitted,
            cohorts=cohorts,
            attempt=group.attempt,
            deadline=group.deadline,
            lora=group.lora or (),
            held_until=hold.until if hold is not None and hold.held else None,
            last_known=() if hold is None else tuple(sorted(hold.last_known)),
            last_known_until=hold.last_known_until
            if hold is not None and hold.last_known
            else None,
            arrivals=() if hold is None else tuple(sorted(hold.arrivals)),
        )

    def _admitted(self, group: _Group) -> frozenset[int]:
        assert group.checksum is not None
        cohort = group.cohorts[group.checksum]
        return cohort.snapshot(group.served_ids(cohort)).as_frozenset()
