"""Worker-type facts live on the worker type: the hop, peering, ambiguity and card shape rules."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from workerset_admission.admission.readiness import ReadinessUnit, evaluate_readiness
from workerset_admission.identity import WorkerType
from workerset_admission.routing import HopRole

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("plugin", "adapters", "telemetry")
# The modules a new kind of hop touches: its facts, its hop role, its topology rules.
HOP_KIND_HOMES = {
    ROOT / "plugin" / "identity.py",
    ROOT / "plugin" / "routing.py",
    ROOT / "plugin" / "admission" / "topology.py",
}


def _members_named(path: Path) -> list[str]:
    """Every ``WorkerType.<member>`` and ``HopRole.<member>`` a module names."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        f"{node.value.id}.{node.attr}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in ("WorkerType", "HopRole")
        and node.attr.isupper()
    ]


def test_no_module_but_identity_routing_and_topology_switches_on_a_worker_type_or_hop() -> None:
    offenders = {
        path.relative_to(ROOT).as_posix(): names
        for top in PRODUCT
        for path in sorted((ROOT / top).rglob("*.py"))
        if path not in HOP_KIND_HOMES and (names := _members_named(path))
    }
    assert offenders == {}


def test_the_switch_check_sees_a_member_named() -> None:
    assert _members_named(ROOT / "plugin" / "admission" / "topology.py")


@pytest.mark.parametrize("kind", list(WorkerType), ids=str)
def test_each_worker_type_names_a_hop_and_the_hop_agrees(kind: WorkerType) -> None:
    role = HopRole.for_worker_type(kind)
    assert role.value == kind.hop
    # A peer is reached through the hop that names it as its peer; the others serve through
    # their own group's hop, which has no peer type.
    assert (role.peer_type is kind) is kind.is_peer
    if not kind.is_peer:
        assert role.peer_type is None


def test_the_hops_and_their_peers_are_dynamos() -> None:
    assert {k: k.hop for k in WorkerType} == {
        WorkerType.PREFILL: "prefill",
        WorkerType.DECODE: "decode",
        WorkerType.ENCODE: "encoder",
        WorkerType.AGGREGATED: "decode",
    }
    assert {k for k in WorkerType if k.is_peer} == {WorkerType.PREFILL, WorkerType.ENCODE}
    assert [k.code for k in WorkerType] == [1, 2, 3, 4]


def test_only_aggregated_sets_serve_side_by_side_without_ambiguity() -> None:
    assert {k for k in WorkerType if not k.ambiguous_when_several} == {WorkerType.AGGREGATED}
    for kind in WorkerType:
        units = [ReadinessUnit(kind, 1, ()), ReadinessUnit(kind, 2, ())]
        assert (kind in evaluate_readiness(units).ambiguous) is kind.ambiguous_when_several


def test_token_input_is_required_of_prefill_always_and_of_a_bare_encoder() -> None:
    required = {
        (k, has): k.requires_token_input(has_model_type=has)
        for k in WorkerType
        for has in (False, True)
    }
    assert {pair for pair, needed in required.items() if needed} == {
        (WorkerType.PREFILL, False),
        (WorkerType.PREFILL, True),
        (WorkerType.ENCODE, False),
    }
