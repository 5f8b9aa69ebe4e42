"""The Dynamo 1.6.1 ModelDeploymentCard as a serde-faithful schema, and its decoder.

The schema mirrors what the 1.6.1 frontend accepts (field order, required keys, defaults,
aliases, value ranges, cross-field rules, the array form of structs). The shims for the
earlier wire generations in the N-2 window, and the generation each one serves:

* N (1.6.1) writes ``architectural_max_context_length``, ``indexer_identity``, the runtime
  contract keys in ``runtime_data`` and a ``size`` in every CheckedFile.
* N-1 carried the context length only in the top-level ``context_length`` field: 1.6.1 reads
  it as the last fallback of the effective context length (and still writes it).
* N-1 and N-2 (the window the old spellings are kept for):

  - ``overlap_score_weight``, the old name of ``prefill_load_scale``: when present it
    replaces ``prefill_load_scale``, and a zero weight also zeroes ``overlap_score_credit``;
    ``router_prefill_load_model: "ais"`` is read as ``"aic"``;
  - CheckedFile without ``size``;
  - ``hf_chat_template_jinja``, an alias of the ``hf_chat_template`` slot;
  - prefill workers without ``worker_type``, marked only by the ``Prefill`` model-type bit
    (the discovery boundary normalizes them before hashing, see ``boundary.normalize_card``);
  - ``enforce_disagg``: accepted; it no longer changes routing but is still part of the router
    config digest.

This module holds the top-level card, its file slots and the decoder; the sections with rules
of their own live beside it (``runtime_config``, ``router_config`` with ``router_policy``,
``indexer_identity``, ``media``, ``tensor``) and their structs are re-exported here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from workerset_admission.card import jsonio
from workerset_admission.card.indexer_identity import INDEXER_IDENTITY
from workerset_admission.card.media import (
    DURATION,
    IMAGE_DECODER,
    IMAGE_LIMITS,
    MEDIA_DECODER,
    MEDIA_FETCHER,
)
from workerset_admission.card.router_config import (
    KV_ROUTER_CONFIG,
    LOAD_THRESHOLD_CONFIG,
    ROUTER_CONFIG,
    ROUTER_MODES,
)
from workerset_admission.card.runtime_config import (
    DISAGGREGATED_ENDPOINT,
    RUNTIME_CONFIG,
    STRUCTURAL_TAG,
)
from workerset_admission.card.schema import (
    ANY,
    BOOL,
    STR,
    U32,
    U64,
    Ctx,
    EnumT,
    ExtTagged,
    Field,
    Opt,
    Refused,
    Seq,
    Struct,
    Type,
    Validated,
    none,
    rust_trim,
)
from workerset_admission.card.tensor import (
    TENSOR_DATA_TYPES,
    TENSOR_METADATA,
    TENSOR_MODEL_CONFIG,
    TENSOR_PARAMETER,
)
from workerset_admission.errors import CardDecodeError
from workerset_admission.identity import WorkerType

# The section structs live in their own modules and stay importable from here.
__all__ = [
    "CARD",
    "CHECKED_FILE",
    "DISAGGREGATED_ENDPOINT",
    "DURATION",
    "GEN_CONFIG",
    "IMAGE_DECODER",
    "IMAGE_LIMITS",
    "INDEXER_IDENTITY",
    "KV_ROUTER_CONFIG",
    "LOAD_THRESHOLD_CONFIG",
    "LORA",
    "MEDIA_DECODER",
    "MEDIA_FETCHER",
    "MODEL_INFO",
    "MODEL_TYPE_NAMES",
    "PREFILL_BIT",
    "PROMPT_FORMATTER",
    "ROUTER_CONFIG",
    "ROUTER_MODES",
    "RUNTIME_CONFIG",
    "STRUCTURAL_TAG",
    "TENSOR_DATA_TYPES",
    "TENSOR_METADATA",
    "TENSOR_MODEL_CONFIG",
    "TENSOR_PARAMETER",
    "TOKENIZER",
    "WORKER_TYPES",
    "DecodedCard",
    "decode_card",
    "decode_card_value",
    "model_type_names",
    "rust_trim",
]

# ModelType bit order; the first name is the Display spelling, the second the as_vec spelling.
MODEL_TYPE_NAMES: tuple[tuple[str, str], ...] = (
    ("Chat", "chat"),
    ("Completions", "completions"),
    ("Embedding", "embedding"),
    ("TensorBased", "tensor"),
    ("Prefill", "prefill"),
    ("Images", "images"),
    ("Audios", "audios"),
    ("Videos", "videos"),
    ("Realtime", "realtime"),
    ("Classify", "classify"),
    ("Pooling", "pooling"),
    ("Rerank", "rerank"),
)
_FLAG_BY_NAME = {name: 1 << bit for bit, (name, _) in enumerate(MODEL_TYPE_NAMES)}
PREFILL_BIT = _FLAG_BY_NAME["Prefill"]
# The spellings a card may give, in Dynamo's order: the worker types of identity.py.
WORKER_TYPES = tuple(kind.value for kind in WorkerType)


class _ModelTypeT(Type):
    """bitflags text: names or ``0x`` hex joined by ``|``; unknown bits are kept."""

    expected = "a string value of `|` separated flags"

    def decode(self, value: Any, level: int, ctx: Ctx) -> Any:
        if not isinstance(value, str):
            raise Refused("invalid_type", f"invalid type, expected {self.expected}")
        text = rust_trim(value)
        bits = 0
        if not text:
            return 0
        for part in text.split("|"):
            flag = rust_trim(part)
            if not flag:
                raise Refused("invalid_model_type", "encountered empty flag")
            if flag.startswith("0x"):
                digits = flag[2:]
                # u16::from_str_radix: optional '+', then hex digits.
                body = digits[1:] if digits.startswith("+") else digits
                if not body or not all(c in "0123456789abcdefABCDEF" for c in body):
                    raise Refused("invalid_model_type", f"invalid hex flag `{digits}`")
                number = int(body, 16)
                if number > 0xFFFF:
                    raise Refused("invalid_model_type", f"invalid hex flag `{digits}`")
                bits |= number
            else:
                bit = _FLAG_BY_NAME.get(flag)
                if bit is None:
                    raise Refused("invalid_model_type", f"unrecognized named flag `{flag}`")
                bits |= bit
        return bits


def model_type_names(bits: int) -> str:
    """``ModelType::as_vec().join("|")``: the known flags, lowercase, in bit order."""
    return "|".join(short for bit, (_, short) in enumerate(MODEL_TYPE_NAMES) if bits >> bit & 1)


_SLUG_RE = re.compile(r"[a-z0-9_-]*")


def _check_slug(value: str, ctx: Ctx) -> str:
    if not _SLUG_RE.fullmatch(value):
        bad = next(c for c in value if not re.fullmatch(r"[a-z0-9_-]", c))
        raise Refused(
            "invalid_slug", f"Invalid char {bad!r}. String can only contain a-z, 0-9, - and _."
        )
    return value


_HEX64 = re.compile(r"[0-9a-f]{64}")


def _check_checksum(value: str, ctx: Ctx) -> tuple[str, str]:
    algo, sep, digest = value.partition(":")
    if not sep or algo != "blake3":
        raise Refused("invalid_checksum", f"invalid checksum algorithm {algo!r}")
    if not _HEX64.fullmatch(digest):
        raise Refused("invalid_checksum", "invalid checksum hash")
    return (algo, digest)


CHECKED_FILE = Struct(
    "WireCheckedFile",
    (
        Field("path", STR),
        Field("checksum", Validated(STR, _check_checksum)),
        Field("size", Opt(U64), default=lambda: None),
    ),
)

_CHAT_TEMPLATE = Struct("ChatTemplateFile", (Field("is_custom", BOOL), Field("file", CHECKED_FILE)))

PROMPT_FORMATTER = ExtTagged(
    {
        "hf_tokenizer_config_json": CHECKED_FILE,
        "hf_chat_template": _CHAT_TEMPLATE,
        "hf_chat_template_json": _CHAT_TEMPLATE,
    },
    # N-1 spelling of the Jinja chat template slot.
    aliases={"hf_chat_template_jinja": "hf_chat_template"},
)


_WORKER_TYPE = EnumT(WORKER_TYPES)

LORA = Struct("LoraInfo", (Field("name", STR), Field("max_gpu_lora_count", Opt(U32), default=none)))


MODEL_INFO = ExtTagged({"hf_config_json": CHECKED_FILE})
TOKENIZER = ExtTagged({"hf_tokenizer_json": CHECKED_FILE, "tik_token_model": CHECKED_FILE})
GEN_CONFIG = ExtTagged({"hf_generation_config_json": CHECKED_FILE})

CARD = Struct(
    "ModelDeploymentCard",
    (
        Field("display_name", STR),
        Field("slug", Validated(STR, _check_slug)),
        Field("source_path", Opt(STR), default=none),
        Field("model_info", Opt(MODEL_INFO)),
        Field("tokenizer", Opt(TOKENIZER)),
        Field("prompt_formatter", Opt(PROMPT_FORMATTER), default=none),
        Field("chat_template_file", Opt(PROMPT_FORMATTER), default=none),
        Field("gen_config", Opt(GEN_CONFIG), default=none),
        Field("prompt_context", Opt(Seq(EnumT(("oai_chat", "llama3_date_time")))), default=none),
        Field("architectural_max_context_length", Opt(U32), default=none),
        Field("context_length", Opt(U32), default=none),
        Field("kv_cache_block_size", U32),
        Field("migration_limit", U32),
        Field("model_type", _ModelTypeT()),
        Field("model_input", EnumT(("Text", "Tokens", "Tensor"))),
        Field("worker_type", Opt(_WORKER_TYPE), default=none),
        Field("needs", Seq(Seq(_WORKER_TYPE)), default=list),
        Field("lora", Opt(LORA), default=none),
        Field("aliases", Seq(STR), default=list),
        Field("user_data", Opt(ANY), default=none),
        Field(
            "runtime_config", RUNTIME_CONFIG, default=lambda: RUNTIME_CONFIG.decode({}, 0, Ctx())
        ),
        Field("tensor_model_config", Opt(TENSOR_MODEL_CONFIG), default=none),
        Field("media_decoder", Opt(MEDIA_DECODER), default=none),
        Field("media_fetcher", Opt(MEDIA_FETCHER), default=none),
        Field("router_config", Opt(ROUTER_CONFIG), default=none),
        Field("indexer_identity", Opt(INDEXER_IDENTITY), default=none),
        Field("extra_files", Seq(CHECKED_FILE), default=list),
    ),
)


@dataclass(frozen=True, slots=True)
class DecodedCard:
    """A card as 1.6.1 decoded it: ``fields`` maps each card field to its decoded value.

    Struct values are dicts in declaration order, enum variants ``(name, content)`` pairs,
    ``model_type`` an int bit set, CheckedFile checksums ``(algo, hex)`` pairs.
    """

    fields: dict[str, Any]

    @property
    def display_name(self) -> str:
        return str(self.fields["display_name"])

    @property
    def slug(self) -> str:
        return str(self.fields["slug"])

    @property
    def model_type_bits(self) -> int:
        return int(self.fields["model_type"])

    @property
    def model_input(self) -> str:
        return str(self.fields["model_input"])

    @property
    def worker_type(self) -> str | None:
        value = self.fields["worker_type"]
        return None if value is None else str(value)

    @property
    def needs(self) -> list[list[str]]:
        return [list(alt) for alt in self.fields["needs"]]

    @property
    def runtime_config(self) -> dict[str, Any]:
        return dict(self.fields["runtime_config"])

    @property
    def lora(self) -> dict[str, Any] | None:
        value = self.fields["lora"]
        return None if value is None else dict(value)


def decode_card_value(
    value: Any, *, strict_dups: bool, check_strings: bool, ctx: Ctx | None = None
) -> DecodedCard:
    """Decode an already parsed card (see :func:`decode_card` for text)."""
    context = Ctx(strict_dups, check_strings, ctx.read_file if ctx is not None else None)
    try:
        fields = CARD.decode(value, 0, context)
    except Refused as exc:
        raise CardDecodeError(exc.reason, exc.detail) from None
    return DecodedCard(fields)


def decode_card(text: str | bytes, ctx: Ctx | None = None) -> DecodedCard:
    """Decode card JSON text exactly as ``ModelDeploymentCard.from_json_str`` would."""
    try:
        value = jsonio.loads(text)
    except jsonio.JsonError as exc:
        raise CardDecodeError(exc.reason, exc.detail) from None
    raw = text.decode("utf-8", "replace") if isinstance(text, (bytes, bytearray)) else text
    return decode_card_value(
        value,
        strict_dups=True,
        check_strings=jsonio.has_lone_surrogate_escape(raw),
        ctx=ctx,
    )
