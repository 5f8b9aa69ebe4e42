"""What a decoded card means at the boundary: normalization, shape rules, checksum and fingerprint.

Everything here depends on the card (and the settings) only, never on the record carrying it,
so it is computed once per distinct card and shared by every record that carries it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, NamedTuple

import blake3
from workerset_admission.card import jsonio
from workerset_admission.card.boundary_settings import BoundarySettings
from workerset_admission.card.checksum import card_checksum
from workerset_admission.card.lines import check_line
from workerset_admission.card.model import (
    PREFILL_BIT,
    DecodedCard,
    decode_card_value,
    model_type_names,
)
from workerset_admission.card.schema import Ctx
from workerset_admission.errors import CardDecodeError
from workerset_admission.identity import EndpointId, GroupKey, WorkerType

__all__ = [
    "MAX_NAME_CHARS",
    "CardFacts",
    "card_facts",
    "facts_for",
    "lora_projection_fingerprint",
    "normalize_card",
]


def lora_projection_fingerprint(card: DecodedCard) -> str:
    """1.6.1's LoRA projection fingerprint: blake3 of the key-sorted projection JSON."""
    fields = card.fields
    lora = fields["lora"]
    if lora is not None:
        # LoraInfo leaves out an unset capacity when it is serialized.
        lora = {
            k: v
            for k, v in (("name", lora["name"]), ("max_gpu_lora_count", lora["max_gpu_lora_count"]))
            if v is not None
        }
    projection = {
        "aliases": list(fields["aliases"]),
        "base_capacity": fields["runtime_config"]["max_gpu_lora_count"],
        "display_name": fields["display_name"],
        "lora": lora,
    }
    text = jsonio.dumps_compact(jsonio.sorted_keys(projection))
    return blake3.blake3(text.encode()).hexdigest()


# 1.6.1's supported (input, model type) combinations, as its frontend checks them before
# admission: Text serves any declared surface; Tokens needs at least one surface its
# preprocessor can build (chat, completions or embedding), whatever else the card declares;
# Tensor needs TensorBased among its types. A prefill worker (explicit or through the legacy
# Prefill bit) and a surface-less encode worker are checked on their input alone.
_TOKENS_SURFACES = 0b111  # chat, completions, embedding
_TENSOR_BIT = 1 << 3


# The longest model name, LoRA name or alias the boundary accepts. 1.6.1 sets no bound, but
# these names travel on into the serving records, logs and status of every frontend: a card
# whose names are longer than any real model's is refused as invalid here, so one namespace's
# worker cannot grow another namespace's records past what the server takes.
MAX_NAME_CHARS: Final = 1024


def _check_names(card: DecodedCard) -> None:
    fields = card.fields
    lora = fields["lora"]
    names = (
        ("model name", card.display_name),
        ("LoRA name", lora["name"] if lora is not None else ""),
        *(("alias", alias) for alias in fields["aliases"]),
    )
    for what, name in names:
        if len(name) > MAX_NAME_CHARS:
            raise CardDecodeError(
                "name_too_long",
                f"{what} of {len(name)} characters is longer than {MAX_NAME_CHARS}",
            )


def _validate_shape(card: DecodedCard, effective: str) -> None:
    bits = card.model_type_bits
    model_input = card.model_input
    if not card.display_name:
        raise CardDecodeError("invalid_card_shape", "model name must not be empty")
    _check_names(card)
    if _WORKER_TYPES[effective].requires_token_input(has_model_type=bits != 0):
        if model_input != "Tokens":
            article = "an" if effective[0] in "aeiou" else "a"
            raise CardDecodeError(
                "invalid_card_shape", f"{article} {effective} worker requires Tokens input"
            )
        return
    if bits == 0 or model_input == "Text":
        return
    if model_input == "Tokens" and bits & _TOKENS_SURFACES:
        return
    if model_input == "Tensor" and bits & _TENSOR_BIT:
        return
    raise CardDecodeError(
        "invalid_card_shape",
        f"unsupported model input {model_input} for model type {model_type_names(bits)!r}",
    )


def normalize_card(card: DecodedCard, settings: BoundarySettings) -> DecodedCard:
    """Legacy prefill topology and tokenizer overrides, as 1.6.1 applies them before mdcsum."""
    fields = card.fields
    changed = False
    if fields["worker_type"] is None and fields["model_type"] & PREFILL_BIT:
        # N-2 prefill workers announced themselves only through the Prefill model-type bit.
        fields = dict(fields)
        fields["worker_type"] = "prefill"
        if not fields["needs"]:
            fields["needs"] = [["decode"]]
        changed = True
    backend, fallback = settings.overrides
    if backend is not None or fallback is not None:
        fields = dict(fields) if not changed else fields
        runtime = dict(fields["runtime_config"])
        if backend is not None:
            runtime["tokenizer_backend"] = backend
        if fallback is not None:
            runtime["tokenizer_fallback_enabled"] = fallback
        fields["runtime_config"] = runtime
        changed = True
    return DecodedCard(fields) if changed else card


def _effective_worker_type(card: DecodedCard) -> str:
    if card.worker_type is not None:
        return card.worker_type
    return "prefill" if card.model_type_bits & PREFILL_BIT else "aggregated"


class CardFacts(NamedTuple):
    """Everything about a card that does not depend on the record carrying it.

    A named tuple rather than a frozen dataclass: one is built for every distinct card, and a
    tuple is built in one step instead of one attribute at a time.
    """

    card: DecodedCard
    checksum: str
    fingerprint: str
    model_types: str
    effective: WorkerType
    worker_type: WorkerType | None
    needs: tuple[tuple[WorkerType, ...], ...]
    taints: tuple[str, ...]
    has_lora: bool

    def group_key(self, endpoint: EndpointId) -> GroupKey:
        """Return the group a record of this card under ``endpoint`` would materialize."""
        return GroupKey.build(self.card.display_name, endpoint, self.model_types, self.effective)


_WORKER_TYPES = {kind.value: kind for kind in WorkerType}


def card_facts(
    card: DecodedCard,
    settings: BoundarySettings,
    *,
    fingerprint: Callable[[DecodedCard], str] = lora_projection_fingerprint,
    model_types: Callable[[int], str] = model_type_names,
) -> CardFacts:
    """Normalize a decoded card, check it and compute what the boundary needs of it.

    The checks are its shape and what the settings' Dynamo line refuses (``lines``).

    ``fingerprint`` and ``model_types`` are the two pure functions computed here; a caller
    that memoizes them may pass its memoized versions, which must answer as these do.
    """
    card = normalize_card(card, settings)
    check_line(card, settings.dynamo_line)
    effective = _effective_worker_type(card)
    _validate_shape(card, effective)
    worker_type = card.worker_type
    fields = card.fields
    needs = fields["needs"]
    return CardFacts(
        card=card,
        checksum=card_checksum(card),
        fingerprint=fingerprint(card),
        model_types=model_types(card.model_type_bits),
        effective=_WORKER_TYPES[effective],
        worker_type=None if worker_type is None else _WORKER_TYPES[worker_type],
        needs=tuple(tuple(_WORKER_TYPES[w] for w in alt) for alt in needs) if needs else (),
        taints=tuple(sorted(fields["runtime_config"]["taints"])),
        has_lora=fields["lora"] is not None,
    )


def facts_for(
    card_value: Any, check_strings: bool, settings: BoundarySettings, ctx: Ctx | None
) -> CardFacts:
    card = decode_card_value(card_value, strict_dups=False, check_strings=check_strings, ctx=ctx)
    return card_facts(card, settings)
