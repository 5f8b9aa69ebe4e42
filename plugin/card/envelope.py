"""Discovery record envelopes: size and text checks, the whole-record parse, key/value agreement.

A registration is built here too, from a checked envelope and the facts of the card it carries.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from workerset_admission.card import jsonio
from workerset_admission.card.boundary_settings import BoundarySettings
from workerset_admission.card.card_facts import CardFacts
from workerset_admission.errors import InvalidRecordError
from workerset_admission.identity import EndpointId, GroupKey, Registration
from workerset_admission.keys import ParsedKey

__all__ = [
    "CARD_MARK",
    "MODEL_FIELDS",
    "as_text",
    "build_registration",
    "check_envelope",
    "check_limit",
    "check_size",
    "mapping_value",
    "parse",
    "registration",
    "text_within",
]

MODEL_FIELDS = ("namespace", "component", "endpoint", "instance_id", "card_json", "model_suffix")
CARD_MARK = '"card_json":'


def check_limit(raw: bytes | str, limit: int, key: str) -> None:
    """Refuse a value over ``limit`` bytes (a text value counts its UTF-8 bytes)."""
    size = len(raw)
    if isinstance(raw, str) and size <= limit < size * 4:
        size = len(raw.encode("utf-8", "surrogatepass"))
    if size > limit:
        raise InvalidRecordError(
            "value_too_large", f"value of {size} bytes exceeds {limit}", key=key
        )


def check_size(raw: bytes | str, settings: BoundarySettings, key: str) -> None:
    check_limit(raw, settings.max_value_size, key)


def text_within(raw: bytes | str, limit: int, key: str) -> str:
    """Return the value's text: at most ``limit`` bytes of valid UTF-8."""
    check_limit(raw, limit, key)
    if isinstance(raw, str):
        return raw
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRecordError("invalid_utf8", str(exc), key=key) from None


def as_text(raw: bytes | str, settings: BoundarySettings, key: str) -> str:
    return text_within(raw, settings.max_value_size, key)


def mapping_value(raw: Mapping[str, Any], key: str) -> Any:
    """Read a record handed over as a mapping the way its compact JSON text would be read."""
    try:
        return jsonio.loads(jsonio.dumps_compact(dict(raw)))
    except (TypeError, jsonio.JsonError) as exc:
        raise InvalidRecordError("invalid_record", str(exc), key=key) from None


def parse(text: str, key: str) -> Any:
    # A record is parsed whole into serde_json values: every number is evaluated.
    try:
        value = jsonio.loads(text)
    except jsonio.JsonError as exc:
        raise InvalidRecordError(exc.reason, exc.detail, key=key) from None
    if isinstance(value, dict) and all(not isinstance(v, (dict, list)) for v in value.values()):
        overflow = any(isinstance(v, jsonio.Overflow) for v in value.values())
    else:
        overflow = jsonio.has_overflow(value)
    if overflow:
        raise InvalidRecordError("number_out_of_range", "number out of range", key=key)
    return value


def check_envelope(
    obj: Any, parsed: ParsedKey, expected_type: str, fields: tuple[str, ...]
) -> dict[str, Any]:
    key = parsed.key
    if not isinstance(obj, dict):
        raise InvalidRecordError(
            "invalid_record", "a discovery value must be a JSON object", key=key
        )
    if isinstance(obj, jsonio.DupDict):
        for name in obj.dups:
            if name == "type" or name in fields:
                raise InvalidRecordError("duplicate_field", f"duplicate field `{name}`", key=key)
    kind = obj.get("type")
    if kind != expected_type:
        raise InvalidRecordError(
            "wrong_record_type", f"expected a {expected_type} record, got type {kind!r}", key=key
        )
    for name in ("namespace", "component", "endpoint"):
        if not isinstance(obj.get(name), str):
            raise InvalidRecordError("invalid_record", f"field `{name}` must be a string", key=key)
    instance_id = obj.get("instance_id")
    if (
        isinstance(instance_id, bool)
        or not isinstance(instance_id, int)
        or not 0 <= instance_id < 1 << 64
    ):
        raise InvalidRecordError("invalid_record", "field `instance_id` must be a u64", key=key)
    endpoint = parsed.endpoint
    if (obj["namespace"], obj["component"], obj["endpoint"]) != (
        endpoint.namespace,
        endpoint.component,
        endpoint.endpoint,
    ) or instance_id != parsed.instance_id:
        raise InvalidRecordError("identity_mismatch", _disagreement(obj, parsed), key=key)
    return obj


def _disagreement(obj: dict[str, Any], parsed: ParsedKey) -> str:
    # Name each field that disagrees, so "namespace prod vs the key's dev" reads as it is.
    endpoint = parsed.endpoint
    pairs = (
        ("namespace", obj["namespace"], endpoint.namespace),
        ("component", obj["component"], endpoint.component),
        ("endpoint", obj["endpoint"], endpoint.endpoint),
        ("instance_id", obj["instance_id"], parsed.instance_id),
    )
    return "; ".join(
        f"the value's {name} {mine!r} disagrees with the key's {theirs!r}"
        for name, mine, theirs in pairs
        if mine != theirs
    )


def registration(
    obj: dict[str, Any],
    parsed_key: ParsedKey,
    facts: CardFacts,
    key: str,
    group: GroupKey | None = None,
) -> Registration:
    """Check the envelope's suffix against the key and the card, then build the registration."""
    suffix = obj.get("model_suffix")
    if suffix != parsed_key.model_suffix:
        if suffix is not None and not isinstance(suffix, str):
            raise InvalidRecordError(
                "invalid_record", "field `model_suffix` must be a string", key=key
            )
        raise InvalidRecordError(
            "identity_mismatch", "the value's model_suffix disagrees with its key", key=key
        )
    if (suffix is not None) is not facts.has_lora:
        raise InvalidRecordError(
            "lora_mismatch", "LoRA discovery identity and card metadata disagree", key=key
        )
    return build_registration(parsed_key.endpoint, parsed_key.instance_id, suffix, facts, group)


def build_registration(
    endpoint: EndpointId,
    instance_id: int,
    suffix: str | None,
    facts: CardFacts,
    group: GroupKey | None = None,
) -> Registration:
    """Build the registration of a record whose identity and card agree (the caller checked).

    ``group`` is the card's group under this endpoint when the caller already holds it.
    """
    path = f"{endpoint.namespace}/{endpoint.component}/{endpoint.endpoint}/{instance_id:x}"
    return Registration(
        key=f"{path}/{suffix}" if suffix else path,
        endpoint=endpoint,
        instance_id=instance_id,
        model_suffix=suffix,
        group=facts.group_key(endpoint) if group is None else group,
        mdc_checksum=facts.checksum,
        lora_fingerprint=facts.fingerprint,
        worker_type=facts.worker_type,
        needs=facts.needs,
        taints=facts.taints,
        card=facts.card,
    )
