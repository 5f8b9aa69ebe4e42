"""``mdcsum()`` of Dynamo 1.6.1, plus its slug and metadata-cache path helpers.

The checksum is blake3 over a byte layout built from the decoded card (see ``_layout``); the
field order and encodings follow 1.6.1 exactly, including the raw 32-byte digest of the
router config's canonical re-serialization and the runtime-contract dimensions appended last.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Mapping
from typing import Any

import blake3
from workerset_admission.card import jsonio
from workerset_admission.card.lines import check_line
from workerset_admission.card.model import DecodedCard, decode_card, rust_trim
from workerset_admission.card.paths import file_basename
from workerset_admission.errors import CardDecodeError, UsageError
from workerset_admission.identity import WorkerType

__all__ = [
    "CHECKSUM_INPUTS",
    "card_checksum",
    "mdc_local_path",
    "mdcsum",
    "router_config_json",
    "slug",
]

# The byte mdcsum gives each worker type (0: none), from the one list of them in identity.py.
_WT_CODE: dict[str | None, int] = {None: 0, **{kind.value: kind.code for kind in WorkerType}}
_PROMPT_CONTEXT_DEBUG = {"oai_chat": "OaiChat", "llama3_date_time": "Llama3DateTime"}
_SLOTS = ("model_info", "tokenizer", "prompt_formatter", "chat_template_file", "gen_config")
_CONTRACT_TAG = b"\0dynamo/model-card/runtime-contract/v1\0"
_INDEXER_TAG = b"dynamo/model-card/indexer-identity/v1"
_VIDEO_CONTRACT = "vllm_nemotron_video_processor_contract"
_TRUTHY_FLAGS = ("vllm_enable_tower_connector_lora", "vllm_inference_v1_generate")


def _u32(value: int) -> bytes:
    return struct.pack(">I", value)


def _slot_checksum(slot: tuple[str, Any]) -> str:
    _variant, content = slot
    checked = content["file"] if "file" in content and "is_custom" in content else content
    algo, digest = checked["checksum"]
    return f"{algo}:{digest}"


def _effective_context_length(fields: Mapping[str, Any]) -> int:
    for value in (
        fields["runtime_config"]["context_length"],
        fields["architectural_max_context_length"],
        fields["context_length"],
    ):
        if value is not None:
            return int(value)
    return 0


def _kv_router_json(kv: Mapping[str, Any]) -> dict[str, Any]:
    # The order and skip rules of 1.6.1's KvRouterConfig serialization.
    out: dict[str, Any] = {
        "overlap_score_credit": kv["overlap_score_credit"],
        "overlap_score_credit_decay": kv["overlap_score_credit_decay"],
        "prefill_load_scale": kv["prefill_load_scale"],
    }
    if kv["decode_active_request_weight"] != 0.0:
        out["decode_active_request_weight"] = kv["decode_active_request_weight"]
    for name in (
        "host_cache_hit_weight",
        "disk_cache_hit_weight",
        "router_temperature",
        "use_kv_events",
        "router_replica_sync",
        "router_track_active_blocks",
        "router_track_output_blocks",
        "router_assume_kv_reuse",
        "router_track_prefill_tokens",
    ):
        out[name] = kv[name]
    if kv["router_tracking_hash"] != "public-xxh3-v1":
        out["router_tracking_hash"] = kv["router_tracking_hash"]
    for name in ("router_tracking_key_file", "router_tracking_key_id"):
        if kv[name] is not None:
            out[name] = kv[name]
    out["router_prefill_load_model"] = kv["router_prefill_load_model"]
    out["router_ttl_secs"] = kv["router_ttl_secs"]
    out["router_queue_threshold"] = kv["router_queue_threshold"]
    out["router_policy_config"] = kv["router_policy_config"]
    out["router_event_threads"] = kv["router_event_threads"]
    out["skip_initial_worker_wait"] = kv["skip_initial_worker_wait"]
    out["router_queue_policy"] = kv["router_queue_policy"]
    out["use_remote_indexer"] = kv["use_remote_indexer"]
    out["serve_indexer"] = kv["serve_indexer"]
    if kv["enable_session_prefix_index"]:
        out["enable_session_prefix_index"] = True
    if kv["shared_cache_multiplier"] is not None:
        out["shared_cache_multiplier"] = kv["shared_cache_multiplier"]
    out["shared_cache_type"] = kv["shared_cache_type"]
    out["router_predicted_ttl_secs"] = kv["router_predicted_ttl_secs"]
    if kv["conditional_disagg_enabled"]:
        out["conditional_disagg_enabled"] = True
    if kv["conditional_disagg_policy"] != "isl_bounding":
        out["conditional_disagg_policy"] = kv["conditional_disagg_policy"]
    if kv["conditional_disagg_eff_isl_threshold"] != 2048:
        out["conditional_disagg_eff_isl_threshold"] = kv["conditional_disagg_eff_isl_threshold"]
    if kv["conditional_disagg_eff_isl_ratio_threshold"] != 0.7:
        out["conditional_disagg_eff_isl_ratio_threshold"] = kv[
            "conditional_disagg_eff_isl_ratio_threshold"
        ]
    for name in (
        "conditional_disagg_prefill_busy_threshold",
        "conditional_disagg_decode_busy_threshold",
    ):
        if kv[name] is not None:
            out[name] = kv[name]
    return out


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, float):
        return jsonio.format_f64(value)
    if isinstance(value, int):
        return str(value)
    return jsonio.quote(value)


def _flat_object(fields: Mapping[str, Any]) -> str:
    # Router config members are scalars with plain ASCII names.
    return "{" + ",".join(f'"{name}":{_scalar(value)}' for name, value in fields.items()) + "}"


def router_config_json(router: Mapping[str, Any]) -> str:
    """Re-serialize a router config as 1.6.1 does (the text its digest covers)."""
    load = {k: v for k, v in router["load_threshold_config"].items() if v is not None}
    return (
        f'{{"router_mode":{_scalar(router["router_mode"])}'
        f',"kv_router_config":{_flat_object(_kv_router_json(router["kv_router_config"]))}'
        f',"load_threshold_config":{_flat_object(load)}'
        f',"enforce_disagg":{_scalar(router["enforce_disagg"])}'
        f',"session_affinity_ttl_secs":{_scalar(router["session_affinity_ttl_secs"])}'
        f',"session_affinity_mode":{_scalar(router["session_affinity_mode"])}}}'
    )


def _truthy(value: Any) -> bool:
    if value is True:
        return True
    if isinstance(value, str):
        return rust_trim(value).lower() in ("1", "true", "yes", "on")
    return False


# The inputs of the checksum in the order the layout takes them: each reads the card's fields
# and gives the bytes it adds (nothing when the input is absent). ``differences`` compares two
# cards input by input over this table, so what it reports is exactly what is hashed.


def _display_name(fields: Mapping[str, Any]) -> bytes:
    return bytes(fields["display_name"].encode())


def _source_path(fields: Mapping[str, Any]) -> bytes:
    path = fields["source_path"]
    return b"" if path is None else bytes(path.encode())


def _slot(name: str) -> Callable[[Mapping[str, Any]], bytes]:
    def part(fields: Mapping[str, Any]) -> bytes:
        value = fields[name]
        return b"" if value is None else _slot_checksum(value).encode()

    return part


def _extra_files(fields: Mapping[str, Any]) -> bytes:
    extra = sorted((file_basename(f["path"]), f["checksum"][1]) for f in fields["extra_files"])
    return b"".join(name.encode() + b"\0" + digest.encode() for name, digest in extra)


def _prompt_context(fields: Mapping[str, Any]) -> bytes:
    items = fields["prompt_context"]
    if items is None:
        return b""
    return ("[" + ", ".join(_PROMPT_CONTEXT_DEBUG[item] for item in items) + "]").encode()


def _context_length(fields: Mapping[str, Any]) -> bytes:
    return _u32(_effective_context_length(fields))


def _block_size(fields: Mapping[str, Any]) -> bytes:
    return _u32(fields["kv_cache_block_size"])


def _worker_type(fields: Mapping[str, Any]) -> bytes:
    return bytes((_WT_CODE[fields["worker_type"]],))


def _needs(fields: Mapping[str, Any]) -> bytes:
    out = bytearray(_u32(len(fields["needs"])))
    for alternative in fields["needs"]:
        out += _u32(len(alternative))
        out += bytes(_WT_CODE[item] for item in alternative)
    return bytes(out)


def _router_config(fields: Mapping[str, Any]) -> bytes:
    router = fields["router_config"]
    return b"" if router is None else blake3.blake3(router_config_json(router).encode()).digest()


def _indexer_identity(fields: Mapping[str, Any]) -> bytes:
    identity = fields["indexer_identity"]
    return b"" if identity is None else _indexer_identity_bytes(identity)


def _aliases(fields: Mapping[str, Any]) -> bytes:
    aliases = fields["aliases"]
    if not aliases:
        return b""
    out = bytearray(_u32(len(aliases)))
    for alias in aliases:
        data = alias.encode()
        out += _u32(len(data)) + data
    return bytes(out)


def _flag(flag: str) -> Callable[[Mapping[str, Any]], bytes]:
    def part(fields: Mapping[str, Any]) -> bytes:
        if _truthy(fields["runtime_config"]["runtime_data"].get(flag)):
            return b"\0" + flag.encode() + b"\0true"
        return b""

    return part


def _video_contract(fields: Mapping[str, Any]) -> bytes:
    runtime_data = fields["runtime_config"]["runtime_data"]
    if _VIDEO_CONTRACT not in runtime_data:
        return b""
    key = _VIDEO_CONTRACT.encode()
    value = jsonio.dumps_compact(jsonio.sorted_keys(runtime_data[_VIDEO_CONTRACT])).encode()
    return _CONTRACT_TAG + struct.pack(">Q", len(key)) + key + struct.pack(">Q", len(value)) + value


_RUNTIME_DATA = "runtime_config.runtime_data."

CHECKSUM_INPUTS: tuple[tuple[str, Callable[[Mapping[str, Any]], bytes]], ...] = (
    ("display_name", _display_name),
    ("source_path", _source_path),
    *((name, _slot(name)) for name in _SLOTS),
    ("extra_files", _extra_files),
    ("prompt_context", _prompt_context),
    ("context_length", _context_length),
    ("kv_cache_block_size", _block_size),
    ("worker_type", _worker_type),
    ("needs", _needs),
    ("router_config", _router_config),
    ("indexer_identity", _indexer_identity),
    ("aliases", _aliases),
    *((_RUNTIME_DATA + flag, _flag(flag)) for flag in _TRUTHY_FLAGS),
    (_RUNTIME_DATA + _VIDEO_CONTRACT, _video_contract),
)
"""Every input of ``mdcsum()`` in layout order: its dotted card path and the bytes it adds."""


# The layout itself is written out in one function: it runs for every distinct card, and the
# table's call per input would cost about as much again. A test holds the two byte-equal.
def _layout(card: DecodedCard) -> bytes:
    fields = card.fields
    out = bytearray(fields["display_name"].encode())
    if fields["source_path"] is not None:
        out += fields["source_path"].encode()
    for slot in _SLOTS:
        if fields[slot] is not None:
            out += _slot_checksum(fields[slot]).encode()
    extra = sorted((file_basename(f["path"]), f["checksum"][1]) for f in fields["extra_files"])
    for name, digest in extra:
        out += name.encode() + b"\0" + digest.encode()
    if fields["prompt_context"] is not None:
        debug = ", ".join(_PROMPT_CONTEXT_DEBUG[item] for item in fields["prompt_context"])
        out += f"[{debug}]".encode()
    out += _u32(_effective_context_length(fields))
    out += _u32(fields["kv_cache_block_size"])
    out.append(_WT_CODE[fields["worker_type"]])
    out += _u32(len(fields["needs"]))
    for alternative in fields["needs"]:
        out += _u32(len(alternative))
        out += bytes(_WT_CODE[item] for item in alternative)
    if fields["router_config"] is not None:
        out += blake3.blake3(router_config_json(fields["router_config"]).encode()).digest()
    identity = fields["indexer_identity"]
    if identity is not None:
        out += _indexer_identity_bytes(identity)
    if fields["aliases"]:
        out += _u32(len(fields["aliases"]))
        for alias in fields["aliases"]:
            data = alias.encode()
            out += _u32(len(data)) + data
    runtime_data = fields["runtime_config"]["runtime_data"]
    for flag in _TRUTHY_FLAGS:
        if _truthy(runtime_data.get(flag)):
            out += b"\0" + flag.encode() + b"\0true"
    if _VIDEO_CONTRACT in runtime_data:
        key = _VIDEO_CONTRACT.encode()
        value = jsonio.dumps_compact(jsonio.sorted_keys(runtime_data[_VIDEO_CONTRACT])).encode()
        out += _CONTRACT_TAG
        out += struct.pack(">Q", len(key)) + key + struct.pack(">Q", len(value)) + value
    return bytes(out)


def _indexer_identity_bytes(identity: Mapping[str, Any]) -> bytes:
    # Unlike the rest of the layout, these lengths are little-endian u32.
    out = bytearray(_INDEXER_TAG)
    for name in ("semantics", "routing_scope"):
        entries = identity[name]
        if entries is None:
            out.append(0)
            continue
        out.append(1)
        out += struct.pack("<I", len(entries))
        for key in sorted(entries):
            for part in (key, entries[key]):
                data = part.encode()
                out += struct.pack("<I", len(data)) + data
    return bytes(out)


def card_checksum(card: DecodedCard) -> str:
    """``mdcsum()`` of an already decoded (and normalized) card."""
    return blake3.blake3(_layout(card)).hexdigest()


def mdcsum(
    card: str | bytes | bytearray | memoryview | Mapping[str, Any], *, dynamo_line: str = "1.6"
) -> str:
    """Dynamo 1.6.1 ``ModelDeploymentCard::mdcsum()`` of a card given as JSON text or mapping.

    Raises :class:`~workerset_admission.errors.CardDecodeError` for a card 1.6.1 refuses, or,
    with ``dynamo_line="1.7"``, a card a 1.7 runtime refuses (see ``lines``; the checksum of a
    card both accept is the same).
    """
    if isinstance(card, Mapping):
        # Round-trip through JSON text so a mapping is judged exactly like the text it stands
        # for (tuples become arrays; NaN, infinities and non-string keys are refused).
        try:
            text = jsonio.dumps_compact(dict(card))
        except (TypeError, ValueError) as exc:
            raise CardDecodeError("invalid_json", f"card mapping is not JSON: {exc}") from None
        decoded = decode_card(text)
    elif isinstance(card, (str, bytes, bytearray, memoryview)):
        decoded = decode_card(card if isinstance(card, (str, bytes)) else bytes(card))
    else:
        raise UsageError(f"mdcsum takes JSON text, bytes or a mapping, not {type(card).__name__}")
    check_line(decoded, dynamo_line)
    return card_checksum(decoded)


def slug(name: str) -> str:
    """1.6.1 ``Slug::slugify``.

    Lowercase (Unicode rules), anything outside ``[a-z0-9_-]`` becomes ``_``, then leading
    underscores are dropped (``"_a"`` and ``"Üa"`` both give ``"a"``); trailing ones stay.
    """
    mapped = "".join(
        c if ("a" <= c <= "z" or "0" <= c <= "9" or c in "-_") else "_" for c in name.lower()
    )
    return mapped.lstrip("_")


def mdc_local_path(slug_text: str, checksum: str, home: str | None = None) -> str:
    """``~/.cache/dynamo/mdc/by-slug/<slug>/<mdcsum>``, rooted as 1.6.1 roots it."""
    root = home
    if root is None:
        root = os.environ.get("HOME") or os.environ.get("USERPROFILE") or "."
    return f"{root}/.cache/dynamo/mdc/by-slug/{slug_text}/{checksum}"
