"""The admission core's LoRA adapters: attachment to admitted base cards and their projection."""

from __future__ import annotations

from workerset_admission.admission import effects as fx
from workerset_admission.admission.state import _base_key, _CoreState, _Group
from workerset_admission.identity import Registration


class _LoraMixin(_CoreState):
    """Adapters and in-place changes of ``AdmissionCore``."""

    def _update_in_place(self, old: Registration, reg: Registration) -> None:
        if old.group != reg.group or old.mdc_checksum != reg.mdc_checksum:
            self._out.append(
                fx.MutationRefused(
                    key=reg.key,
                    reason="in-place materialization change; the first incarnation is kept",
                    kept_group=old.group,
                    kept_checksum=old.mdc_checksum,
                    offered_group=reg.group,
                    offered_checksum=reg.mdc_checksum,
                )
            )
            return
        taints_changed = old.taints != reg.taints
        fingerprint_changed = old.lora_fingerprint != reg.lora_fingerprint
        if not (taints_changed or fingerprint_changed):
            return  # a duplicate: the first incarnation's card stays
        if reg.model_suffix is None:
            self._regs[reg.key] = reg
            group = self._group_of(reg)
            hold = group.hold
            if hold is not None and hold.arrivals.get(reg.instance_id) is old:
                hold.arrivals[reg.instance_id] = reg
            else:
                group.cohorts[reg.mdc_checksum].members[reg.instance_id] = reg
        else:
            self._loras[reg.key] = reg
            self._adapters_at[_base_key(reg)][reg.key] = reg
        if taints_changed:
            self._out.append(fx.TaintsUpdated(reg.key, reg.taints))
        if fingerprint_changed:
            base_key = _base_key(reg)
            host = self._admitted_host(base_key)
            if host is not None and base_key in self._adapters_at:
                self._mark_lora(host)

    def _add_lora(self, reg: Registration) -> None:
        old = self._loras.get(reg.key)
        if old is not None:
            self._update_in_place(old, reg)
            return
        base_key = _base_key(reg)
        self._loras[reg.key] = reg
        self._adapters_at.setdefault(base_key, {})[reg.key] = reg
        host = self._admitted_host(base_key)
        if host is not None:
            self._mark_lora(host)

    def _remove_lora(self, key: str) -> None:
        reg = self._loras.pop(key, None)
        if reg is None:
            return  # an unknown key: removing it again is harmless
        base_key = _base_key(reg)
        adapters = self._adapters_at[base_key]
        del adapters[key]
        if not adapters:
            del self._adapters_at[base_key]
        host = self._admitted_host(base_key)
        if host is not None:
            self._mark_lora(host)

    def _projection(self, group: _Group) -> tuple[fx.LoraWorker, ...]:
        assert group.checksum is not None
        workers = []
        adapters_at = self._adapters_at
        for reg in group.cohorts[group.checksum].members.values():
            adapters = adapters_at.get(reg.key)
            if adapters:
                workers.append(
                    fx.LoraWorker(
                        endpoint=reg.endpoint,
                        instance_id=reg.instance_id,
                        base_fingerprint=reg.lora_fingerprint,
                        adapters=tuple(
                            fx.LoraAdapter(a.key, a.model_suffix or "", a.lora_fingerprint, a.card)
                            for a in sorted(adapters.values(), key=lambda a: a.key)
                        ),
                    )
                )
        workers.sort(key=lambda w: w.instance_id)
        return tuple(workers)
