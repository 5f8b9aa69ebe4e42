"""Which committed WorkerSet each hop routes to: Dynamo 1.6.1's topology binding rules.

Bindings are decided per model and namespace, over committed WorkerSets only:

* a Decode set gets a prefill target only when the namespace has exactly one committed
  Prefill set and exactly one Decode set; otherwise it serves in aggregated mode;
* the encoder target is the namespace's single Encode set with an empty model type (none when
  there are zero or several); it is used by a Decode set only when there is exactly one
  Prefill set, it advertises encoder-result handoff, and there is exactly one Decode set; never
  by a Prefill set; by any other set when that set itself advertises handoff.

Every target is a committed group identified with its build generation, so a hop reaches its
peer through the peer's admission receiver and never through unrestricted discovery.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from workerset_admission.identity import GroupKey, WorkerType

__all__ = ["TopologyBinding", "TopologySet", "bind_topology"]


@dataclass(frozen=True, slots=True)
class TopologySet:
    """A committed WorkerSet as topology sees it."""

    group: GroupKey
    generation: int
    encoder_result_handoff: bool = False

    @property
    def worker_type(self) -> WorkerType:
        return self.group.worker_type

    @property
    def model_types(self) -> str:
        return str(json.loads(self.group.worker_set)[3])


@dataclass(frozen=True, slots=True)
class TopologyBinding:
    """The peers one WorkerSet's hops route to (``None``: that hop is not used)."""

    group: GroupKey
    prefill_target: TopologySet | None
    encoder_target: TopologySet | None

    def target(self, worker_type: WorkerType) -> TopologySet | None:
        """Return the peer of ``worker_type`` this set's hop routes to (``None``: not used)."""
        if worker_type is WorkerType.PREFILL:
            return self.prefill_target
        if worker_type is WorkerType.ENCODE:
            return self.encoder_target
        return None


def bind_topology(sets: Iterable[TopologySet]) -> Mapping[GroupKey, TopologyBinding]:
    """Bind every given committed set; sets of different models or namespaces never mix."""
    scopes: dict[tuple[str, str], list[TopologySet]] = defaultdict(list)
    for s in sets:
        scopes[(s.group.model, s.group.endpoint.namespace)].append(s)
    result: dict[GroupKey, TopologyBinding] = {}
    for scope in scopes.values():
        prefill = [s for s in scope if s.worker_type is WorkerType.PREFILL]
        decode = [s for s in scope if s.worker_type is WorkerType.DECODE]
        encode = [s for s in scope if s.worker_type is WorkerType.ENCODE and not s.model_types]
        pair = len(prefill) == 1 and len(decode) == 1
        unique_encode = encode[0] if len(encode) == 1 else None
        for s in scope:
            role = s.worker_type
            prefill_target = prefill[0] if pair and role is WorkerType.DECODE else None
            if role is WorkerType.DECODE:
                use_encoder = pair and prefill[0].encoder_result_handoff
            elif role is WorkerType.PREFILL:
                use_encoder = False
            else:
                use_encoder = s.encoder_result_handoff
            result[s.group] = TopologyBinding(
                group=s.group,
                prefill_target=prefill_target,
                encoder_target=unique_encode if use_encoder else None,
            )
    return result
