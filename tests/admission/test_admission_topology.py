"""Topology binding: prefill and encoder targets follow Dynamo 1.6.1's uniqueness rules."""

from __future__ import annotations

from admission_support import group_key
from workerset_admission.admission.topology import TopologySet, bind_topology
from workerset_admission.identity import EndpointId, WorkerType


def _set(
    component: str,
    worker_type: WorkerType,
    *,
    namespace: str = "ns1",
    model_types: str = "",
    handoff: bool = False,
    generation: int = 1,
) -> TopologySet:
    key = group_key(
        endpoint=EndpointId(namespace, component, "generate"),
        model_types=model_types,
        worker_type=worker_type,
    )
    return TopologySet(key, generation, handoff)


DECODE = _set("decode", WorkerType.DECODE, model_types="chat|completions")
PREFILL = _set("prefill", WorkerType.PREFILL)
ENCODE = _set("encode", WorkerType.ENCODE)


def test_one_prefill_and_one_decode_set_bind_the_prefill_hop() -> None:
    bound = bind_topology([DECODE, PREFILL])
    assert bound[DECODE.group].prefill_target == PREFILL
    assert bound[PREFILL.group].prefill_target is None


def test_two_prefill_sets_leave_decode_in_aggregated_mode() -> None:
    second = _set("prefill2", WorkerType.PREFILL)
    assert bind_topology([DECODE, PREFILL, second])[DECODE.group].prefill_target is None


def test_two_decode_sets_get_no_prefill_target() -> None:
    other = _set("decode2", WorkerType.DECODE, model_types="chat|completions")
    bound = bind_topology([DECODE, other, PREFILL])
    assert bound[DECODE.group].prefill_target is None
    assert bound[other.group].prefill_target is None


def test_decode_uses_the_encoder_only_when_the_single_prefill_advertises_handoff() -> None:
    without = bind_topology([DECODE, PREFILL, ENCODE])
    assert without[DECODE.group].encoder_target is None
    handoff_prefill = _set("prefill", WorkerType.PREFILL, handoff=True)
    bound = bind_topology([DECODE, handoff_prefill, ENCODE])
    assert bound[DECODE.group].encoder_target == ENCODE
    assert bound[handoff_prefill.group].encoder_target is None


def test_an_aggregated_set_uses_the_encoder_from_its_own_handoff() -> None:
    agg = _set("agg", WorkerType.AGGREGATED, model_types="chat", handoff=True)
    quiet = _set("agg2", WorkerType.AGGREGATED, model_types="chat")
    bound = bind_topology([agg, quiet, ENCODE])
    assert bound[agg.group].encoder_target == ENCODE
    assert bound[quiet.group].encoder_target is None


def test_two_encode_sets_disable_encoder_routing() -> None:
    agg = _set("agg", WorkerType.AGGREGATED, model_types="chat", handoff=True)
    other = _set("encode2", WorkerType.ENCODE)
    assert bind_topology([agg, ENCODE, other])[agg.group].encoder_target is None


def test_an_encode_set_with_a_model_type_is_not_an_encoder_target() -> None:
    agg = _set("agg", WorkerType.AGGREGATED, model_types="chat", handoff=True)
    typed = _set("encode", WorkerType.ENCODE, model_types="chat")
    assert bind_topology([agg, typed])[agg.group].encoder_target is None


def test_namespaces_are_bound_independently() -> None:
    other_decode = _set("decode", WorkerType.DECODE, namespace="ns2", model_types="chat")
    bound = bind_topology([DECODE, PREFILL, other_decode])
    assert bound[DECODE.group].prefill_target == PREFILL
    assert bound[other_decode.group].prefill_target is None
