"""Hop bindings: admitted and live only, settings from the selected card, new binding per tenure."""

from __future__ import annotations

from typing import Any

import pytest
from support.fakes import LiveInstanceSet, handle_all
from support.registrations import reg
from workerset_admission.admission import (
    AdmissionCore,
    BuildFinished,
    Effect,
    StartBuild,
    WorkerAdded,
    WorkerRemoved,
)
from workerset_admission.admission.admitted import routable_ids
from workerset_admission.errors import ReceiverRetired
from workerset_admission.identity import (
    EndpointId,
    GroupKey,
    Registration,
    WorkerType,
)
from workerset_admission.service.bindings import (
    FrontendRouting,
    HopBindings,
    HopRole,
    LegacyExplicitEndpointBinding,
    RoutingSettings,
)
from workerset_admission.service.liveness import LivenessIndex
from workerset_admission.service.receivers import AdmissionChannels

EP = EndpointId("ns1", "workers", "generate")
G = GroupKey.build("m", EP, "chat|completions", WorkerType.DECODE)
KV_CARD = {
    "kv_cache_block_size": 32,
    "router_config": {"router_mode": "k_v", "kv_router_config": {"router_temperature": 0.0}},
}


def _reg(
    instance_id: int,
    checksum: str,
    card: Any = None,
    group: GroupKey = G,
) -> Registration:
    card = card if card is not None else {"kv_cache_block_size": 16, "router_config": None}
    return reg(instance_id, checksum, group=group, card=card)


class Frontend:
    """The core plus channels and bindings, wired the way a service wires them."""

    def __init__(self) -> None:
        self.core = AdmissionCore()
        self.channels = AdmissionChannels()
        self.live = LiveInstanceSet()
        self.bindings = HopBindings(self.channels, self.live, FrontendRouting("round_robin"))

    def run(self, effects: list[Effect]) -> list[Effect]:
        handle_all(self.channels, effects)
        handle_all(self.bindings, effects)
        for start in [e for e in effects if isinstance(e, StartBuild)]:
            self.run(
                self.core.apply(
                    BuildFinished(start.group, start.mdc_checksum, start.generation, True)
                )
            )
        return effects

    def add(self, registration: Registration, live: bool = True) -> None:
        if live:
            self.live.add(registration.endpoint, registration.instance_id)
        self.run(self.core.apply(WorkerAdded(registration)))

    def remove(self, registration: Registration) -> None:
        self.run(self.core.apply(WorkerRemoved(registration.key)))


def test_a_hop_routes_only_to_instances_both_live_and_admitted() -> None:
    fe = Frontend()
    fe.add(_reg(1, "A"))
    fe.add(_reg(2, "A"), live=False)
    fe.add(_reg(3, "B"))
    binding = fe.bindings.binding(G)
    assert binding is not None
    assert binding.routable() == frozenset({1})
    fe.live.add(EP, 2)
    assert binding.routable() == frozenset({1, 2})


def test_the_one_routable_rule_is_live_and_admitted_or_held_on_last_known_records() -> None:
    assert routable_ids({1, 2, 3}, {2, 3, 4}) == frozenset({2, 3})
    assert routable_ids({1, 2, 3}, {2, 3, 4}, last_known={1}) == frozenset({1, 2, 3})
    # Nothing live and nothing held is nothing routable, never every instance.
    assert routable_ids({1, 2}, set()) == frozenset()
    index = LivenessIndex()
    index.put("k2", EP, 2)
    # The liveness index answers with the same rule as the bindings (held members included).
    assert index.routable(EP, [1, 2], last_known=[1]) == routable_ids({1, 2}, {2}, {1})
    assert index.routable(EP, [1, 2]) == frozenset({2})


def test_routing_settings_come_from_the_selected_card_only() -> None:
    fe = Frontend()
    fe.add(_reg(1, "A", card=KV_CARD))
    fe.add(_reg(2, "B", card={"kv_cache_block_size": 64, "router_config": None}))
    binding = fe.bindings.binding(G)
    assert binding is not None
    assert (binding.settings.router_mode, binding.settings.kv_cache_block_size) == ("k_v", 32)


def test_a_card_without_router_config_takes_the_frontends_mode() -> None:
    settings = RoutingSettings.resolve({"kv_cache_block_size": 16}, FrontendRouting("random"))
    assert (settings.router_mode, settings.from_card) == ("random", False)


def test_frontend_local_policies_override_the_cards_kv_router_config() -> None:
    settings = RoutingSettings.resolve(
        KV_CARD, FrontendRouting("random", router_prefill_policy="p", session_affinity_mode="soft")
    )
    assert settings.router_config is not None
    assert settings.router_config["kv_router_config"]["router_prefill_policy"] == "p"
    assert settings.router_config["session_affinity_mode"] == "soft"
    assert settings.router_mode == "k_v"


def test_compatible_membership_changes_keep_the_same_binding() -> None:
    fe = Frontend()
    fe.add(_reg(1, "A"))
    first = fe.bindings.binding(G)
    fe.add(_reg(2, "A"))
    fe.remove(_reg(1, "A"))
    assert fe.bindings.binding(G) is first
    assert first is not None
    assert first.routable() == frozenset({2})


def test_a_succession_makes_a_new_binding_even_for_the_same_endpoint() -> None:
    fe = Frontend()
    fe.add(_reg(1, "A"))
    fe.add(_reg(2, "B"))
    old = fe.bindings.binding(G)
    assert old is not None
    fe.remove(_reg(1, "A"))
    new = fe.bindings.binding(G)
    assert new is not None
    assert new.id.group == old.id.group == G
    assert new.id.generation > old.id.generation
    assert new.routable() == frozenset({2})
    with pytest.raises(ReceiverRetired):
        old.routable()


def test_a_withdrawn_group_has_no_binding_and_never_falls_back_to_discovery() -> None:
    fe = Frontend()
    fe.add(_reg(1, "A"))
    binding = fe.bindings.binding(G)
    fe.remove(_reg(1, "A"))
    fe.live.add(EP, 1)
    assert fe.bindings.binding(G) is None
    assert binding is not None
    with pytest.raises(ReceiverRetired):
        binding.routable()


def test_prefill_and_encoder_hops_resolve_to_committed_admitted_bindings() -> None:
    fe = Frontend()
    prefill = GroupKey.build("m", EndpointId("ns1", "prefill", "generate"), "", WorkerType.PREFILL)
    fe.add(_reg(1, "A"))
    fe.add(_reg(7, "P", group=prefill))
    fe.add(_reg(8, "Q", group=prefill))
    peer = fe.bindings.peer(G, HopRole.PREFILL)
    assert peer is not None
    assert peer.role is HopRole.PREFILL
    assert peer.routable() == frozenset({7})
    assert fe.bindings.peer(G, HopRole.ENCODER) is None


def test_the_legacy_explicit_endpoint_binding_takes_every_live_instance() -> None:
    live = LiveInstanceSet()
    for i in (1, 2, 3):
        live.add(EP, i)
    legacy = LegacyExplicitEndpointBinding(EP, live, RoutingSettings("round_robin", None))
    assert legacy.routable() == frozenset({1, 2, 3})
    live.remove(EP, 2)
    assert legacy.routable() == frozenset({1, 3})


def test_settings_resolve_from_a_decoded_card_of_the_card_boundary() -> None:
    from workerset_admission.card import (
        decode_model_record,
        encode_model_record,
        model_kv_key,
        parse_key,
    )

    card = {
        "display_name": "m",
        "slug": "m",
        "source_path": "m",
        "model_info": None,
        "tokenizer": None,
        "context_length": 4096,
        "kv_cache_block_size": 64,
        "migration_limit": 0,
        "model_type": "Chat | Completions",
        "model_input": "Tokens",
        "worker_type": "aggregated",
        "needs": [],
        "router_config": {
            "router_mode": "k_v",
            "kv_router_config": {},
            "load_threshold_config": {},
        },
        "runtime_config": {"runtime_data": {"encoder_result_handoff": True}},
    }
    key = model_kv_key(EP, 5)
    registration = decode_model_record(parse_key(key), encode_model_record(EP, 5, card))
    assert registration is not None
    settings = RoutingSettings.resolve(registration.card, FrontendRouting("random"))
    assert (settings.router_mode, settings.kv_cache_block_size) == ("k_v", 64)
    from workerset_admission.routing import encoder_handoff

    assert encoder_handoff(registration.card)


def test_each_hop_role_names_the_worker_type_it_routes_to_once() -> None:
    # A hop that routes to a peer set finds it by the peer's worker type; the table in
    # routing.py is the one place a hop kind is tied to a worker type.
    for role in HopRole:
        if role.peer_type is not None:
            assert HopRole.for_worker_type(role.peer_type) is role
    assert HopRole.DECODE.peer_type is None
    assert HopRole.for_worker_type(WorkerType.AGGREGATED) is HopRole.DECODE
    assert HopRole.for_worker_type(WorkerType.DECODE) is HopRole.DECODE
