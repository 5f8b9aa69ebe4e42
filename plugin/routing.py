"""The routing vocabulary a hop and the service share: hop roles and routing settings.

A committed group's hop routes with settings resolved from the selected card it was committed
with (its router config and KV block size), plus the frontend's own choices. The service's hop
bindings (``service/bindings.py``) and the Dynamo hops (``adapters/dynamo/hop.py``) both speak
it; neither imports the other.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from workerset_admission.identity import WorkerType

__all__ = [
    "FrontendRouting",
    "HopRole",
    "RoutingSettings",
    "card_field",
    "encoder_handoff",
]


def card_field(card: Any, name: str, default: Any = None) -> Any:
    """Read one field of a normalized card: a decoded card, a plain mapping, or an object."""
    if card is None:
        return default
    if isinstance(card, Mapping):
        return card.get(name, default)
    fields = getattr(card, "fields", None)  # the card boundary's DecodedCard
    if isinstance(fields, Mapping):
        return fields.get(name, default)
    return getattr(card, name, default)


def encoder_handoff(card: Any) -> bool:
    """Whether the card advertises encoder-result handoff (``runtime_data``, 1.6.1)."""
    runtime = card_field(card, "runtime_config")
    data = runtime.get("runtime_data") if isinstance(runtime, Mapping) else None
    if not isinstance(data, Mapping):
        data = card_field(card, "runtime_data")
    return isinstance(data, Mapping) and data.get("encoder_result_handoff") is True


class HopRole(str, enum.Enum):
    """The three discovery-managed hops of a request."""

    DECODE = "decode"  # decode or aggregated serving
    PREFILL = "prefill"
    ENCODER = "encoder"

    @classmethod
    def for_worker_type(cls, worker_type: WorkerType) -> HopRole:
        """Return the hop that routes to workers of ``worker_type``."""
        return cls(worker_type.hop)

    @property
    def peer_type(self) -> WorkerType | None:
        """The worker type of the peer set this hop routes to (``None``: the group's own)."""
        return _PEER_OF_HOP.get(self)


# The hops that route to a peer WorkerSet the topology binds, by their peer's worker type; every
# other worker type is served by the hop of its own group (identity.py says which is which).
_PEER_OF_HOP = {HopRole(kind.hop): kind for kind in WorkerType if kind.is_peer}


@dataclass(frozen=True, slots=True)
class FrontendRouting:
    """Frontend-local routing choices.

    ``router_mode`` applies only to a card that advertises no router config; the policies and
    the session affinity mode always stay the frontend's, as in Dynamo 1.6.1.
    """

    router_mode: str = "round_robin"
    router_prefill_policy: Any = None
    router_decode_policy: Any = None
    session_affinity_mode: str | None = None


@dataclass(frozen=True, slots=True)
class RoutingSettings:
    """Routing settings resolved from the selected card (plus the frontend-local choices)."""

    router_mode: str
    kv_cache_block_size: int | None
    router_config: Mapping[str, Any] | None = field(default=None, compare=False)
    from_card: bool = False

    @classmethod
    def resolve(cls, card: Any, frontend: FrontendRouting) -> RoutingSettings:
        advertised = card_field(card, "router_config")
        block_size = card_field(card, "kv_cache_block_size")
        if not isinstance(advertised, Mapping):
            return cls(frontend.router_mode, block_size, None, False)
        # The card's config wins wholesale, except the frontend-local knobs.
        config = dict(advertised)
        kv = dict(config.get("kv_router_config") or {})
        if frontend.router_prefill_policy is not None:
            kv["router_prefill_policy"] = frontend.router_prefill_policy
        if frontend.router_decode_policy is not None:
            kv["router_decode_policy"] = frontend.router_decode_policy
        if kv:
            config["kv_router_config"] = kv
        if frontend.session_affinity_mode is not None:
            config["session_affinity_mode"] = frontend.session_affinity_mode
        mode = str(config.get("router_mode") or frontend.router_mode)
        return cls(mode, block_size, config, True)
