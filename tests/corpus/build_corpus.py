"""Regenerate ``bad_records.jsonl``, the corpus of discovery records the plugin must refuse.

Run ``python tests/corpus/build_corpus.py`` after changing a case; the output is committed so
the tests never depend on this script. Each line is one case: ``name``; ``key``; the value as
``value`` (text) or ``value_b64`` (bytes that are not UTF-8); for card cases also
``card_text``, the card alone; ``layer``, the boundary stage that must refuse it (``key``,
``record``, ``identity``, ``card``, ``shape``); and ``why``. Cases of layer ``card`` are ones
Dynamo 1.6.1 itself refuses to decode (a conformance test checks that against the runtime).
"""

from __future__ import annotations

import base64
import copy
import json
import sys
from pathlib import Path
from typing import Any

# Run as a script: the shared test builders live one folder up, in tests/support.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from support.cards import base_card as demo_card

NS, COMP, EP, ID = "ns1", "backend", "generate", 0x1F
KEY = f"v1.mdc.{NS}.{COMP}.{EP}.{ID:x}"

CARD: dict[str, Any] = demo_card()


def record(card: Any = None, **fields: Any) -> dict[str, Any]:
    value: dict[str, Any] = {
        "type": "Model",
        "namespace": NS,
        "component": COMP,
        "endpoint": EP,
        "instance_id": ID,
        "card_json": copy.deepcopy(CARD) if card is None else card,
    }
    value.update(fields)
    return value


def card_with(**changes: Any) -> dict[str, Any]:
    card = copy.deepcopy(CARD)
    for name, value in changes.items():
        if value is _DROP:
            card.pop(name)
        else:
            card[name] = value
    return card


_DROP = object()
_CASES: list[dict[str, Any]] = []


def case(
    name: str,
    layer: str,
    why: str,
    *,
    key: str = KEY,
    value: Any = None,
    card_text: str | None = None,
) -> None:
    entry: dict[str, Any] = {"name": name, "layer": layer, "key": key}
    if card_text is not None:
        # The card's exact text matters (duplicate fields): splice it into the envelope as is.
        envelope = text(record(card="@CARD@"))
        value = envelope.replace('"@CARD@"', card_text)
        entry["card_text"] = card_text
    if isinstance(value, bytes):
        entry["value_b64"] = base64.b64encode(value).decode()
    elif isinstance(value, str):
        entry["value"] = value
    else:
        entry["value"] = json.dumps(value if value is not None else record(), separators=(",", ":"))
    entry["why"] = why
    _CASES.append(entry)


def text(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def build() -> list[dict[str, Any]]:
    good = text(record())
    lora_card = card_with(display_name="my-lora", slug="my-lora", lora={"name": "my-lora"})

    # --- keys -----------------------------------------------------------------------------------
    case("key too short", "key", "no instance id token", key=f"v1.mdc.{NS}.{COMP}.{EP}")
    case("key only prefix", "key", "nothing after the prefix", key="v1.mdc")
    case("key too long", "key", "seven tokens after v1.mdc", key=f"{KEY}.lora.extra")
    case(
        "key unknown version",
        "key",
        "v2 is not a discovery generation",
        key=f"v2.mdc.{NS}.{COMP}.{EP}.1f",
    )
    case("key unknown bucket", "key", "not mdc or instances", key=f"v1.things.{NS}.{COMP}.{EP}.1f")
    case("key id not hex", "key", "instance id must be hex", key=f"v1.mdc.{NS}.{COMP}.{EP}.zz")
    case(
        "key id empty escape",
        "key",
        "instance id token is an escape",
        key=f"v1.mdc.{NS}.{COMP}.{EP}.=31",
    )
    case(
        "key id leading zeros",
        "key",
        "Dynamo writes ids without padding",
        key=f"v1.mdc.{NS}.{COMP}.{EP}.001f",
    )
    case(
        "key id uppercase", "key", "Dynamo writes lowercase hex", key=f"v1.mdc.{NS}.{COMP}.{EP}.1F"
    )
    case(
        "key id over u64",
        "key",
        "instance ids are u64",
        key=f"v1.mdc.{NS}.{COMP}.{EP}.{2**64:x}",
    )
    case("key id negative", "key", "a sign is not hex", key=f"v1.mdc.{NS}.{COMP}.{EP}.-1f")
    case("key empty token", "key", "empty namespace token", key=f"v1.mdc..{COMP}.{EP}.1f")
    case("key bad escape digits", "key", "=G1 is not an escape", key=f"v1.mdc.n=G1.{COMP}.{EP}.1f")
    case("key truncated escape", "key", "escape cut short", key=f"v1.mdc.ns=4.{COMP}.{EP}.1f")
    case(
        "key lowercase escape",
        "key",
        "escapes are uppercase hex",
        key=f"v1.mdc.a=2eb.{COMP}.{EP}.1f",
    )
    case(
        "key needless escape",
        "key",
        "=41 escapes a letter that needs none",
        key=f"v1.mdc.=41.{COMP}.{EP}.1f",
    )
    case(
        "key escape of invalid utf-8",
        "key",
        "=FF alone is not UTF-8",
        key=f"v1.mdc.n=FF.{COMP}.{EP}.1f",
    )
    case("key unescaped slash", "key", "'/' must be escaped", key=f"v1.mdc.a/b.{COMP}.{EP}.1f")
    case("key unescaped colon", "key", "':' must be escaped", key=f"v1.mdc.a:b.{COMP}.{EP}.1f")
    case(
        "key unescaped space", "key", "whitespace must be escaped", key=f"v1.mdc.a b.{COMP}.{EP}.1f"
    )
    case(
        "key unescaped non-ascii",
        "key",
        "non-ASCII must be escaped",
        key=f"v1.mdc.ä.{COMP}.{EP}.1f",
    )
    case("key wildcard token", "key", "a literal '*' token", key=f"v1.mdc.*.{COMP}.{EP}.1f")
    case("key empty", "key", "nothing at all", key="")

    # --- record envelope ------------------------------------------------------------------------
    case("value empty", "record", "a put with no bytes", value="")
    case("value whitespace", "record", "only whitespace", value="  \n")
    case("value truncated json", "record", "cut in the middle", value=good[: len(good) // 2])
    case("value not json", "record", "plain text", value="hello")
    case("value trailing garbage", "record", "valid JSON then junk", value=good + "x")
    case("value two documents", "record", "two JSON objects", value=good + good)
    case("value json null", "record", "top level null", value="null")
    case("value json array", "record", "top level array", value="[]")
    case("value json string", "record", "top level string", value='"Model"')
    case("value json number", "record", "top level number", value="31")
    case(
        "value nan literal",
        "record",
        "NaN is not JSON",
        value=good.replace(f'"instance_id":{ID}', '"instance_id":NaN'),
    )
    case(
        "value invalid utf-8",
        "record",
        "bytes that are not UTF-8",
        value=good.encode()[:-2] + b"\xff\xfe}",
    )
    case(
        "value lone surrogate",
        "record",
        "escaped lone surrogate in a string",
        value=good.replace('"ns1"', '"ns\\ud800"', 1),
    )
    case(
        "value utf-8 bom",
        "record",
        "JSON must not start with a BOM",
        value=b"\xef\xbb\xbf" + good.encode(),
    )
    case("value utf-16", "record", "not UTF-8 at all", value=good.encode("utf-16"))
    case(
        "value no type",
        "record",
        "no record type",
        value={k: v for k, v in record().items() if k != "type"},
    )
    case("value unknown type", "record", "unknown record type", value=record(type="Widget"))
    case("value type not string", "record", "type is a number", value=record(type=1))
    case(
        "value event channel under mdc",
        "record",
        "an EventChannel record in the model bucket",
        value={
            "type": "EventChannel",
            "scope": {"kind": "namespace", "name": NS},
            "topic": "t",
            "instance_id": ID,
            "transport": {"kind": "nats", "config": {"subject_prefix": "x"}},
        },
    )
    case(
        "value endpoint under mdc",
        "record",
        "an Endpoint record in the model bucket",
        value={
            "type": "Endpoint",
            "namespace": NS,
            "component": COMP,
            "endpoint": EP,
            "instance_id": ID,
            "transport": {"tcp": "127.0.0.1:1"},
        },
    )
    case(
        "value instance id string",
        "record",
        "instance_id must be a number",
        value=record(instance_id=str(ID)),
    )
    case(
        "value instance id float",
        "record",
        "instance_id must be an integer",
        value=good.replace(f'"instance_id":{ID}', f'"instance_id":{ID}.0'),
    )
    case(
        "value instance id negative",
        "record",
        "instance_id is unsigned",
        value=record(instance_id=-ID),
    )
    case(
        "value instance id over u64",
        "record",
        "instance_id beyond u64",
        value=record(instance_id=2**64 + ID),
    )
    case(
        "value instance id 1e400",
        "record",
        "a number no double holds",
        value=good.replace(f'"instance_id":{ID}', '"instance_id":1e400'),
    )
    case(
        "value number with 5000 digits",
        "record",
        "a huge integer literal",
        value=good.replace('"migration_limit":0', '"migration_limit":' + "9" * 5000),
    )
    case(
        "value 1e400 in unknown card key",
        "record",
        "1.6.1 refuses this anywhere in the card",
        value=good[:-2] + ',"zzz":1e400}}',
    )
    case("value namespace not string", "record", "namespace is a number", value=record(namespace=5))
    case(
        "value card missing",
        "record",
        "no card_json",
        value={k: v for k, v in record().items() if k != "card_json"},
    )
    case(
        "value card null", "record", "card_json null", value=record(card=None) | {"card_json": None}
    )
    case(
        "value card array of junk",
        "record",
        "card_json is a list of numbers",
        value=record(card=[1, 2, 3]),
    )
    case("value card string", "record", "card_json is a string", value=record(card="{}"))
    case(
        "value model suffix not string",
        "record",
        "model_suffix is a number",
        value=record(model_suffix=7),
    )
    case(
        "value duplicate type key",
        "record",
        "two type fields",
        value=good.replace('{"type":"Model"', '{"type":"Model","type":"Endpoint"', 1),
    )
    case(
        "value deep nesting",
        "record",
        "5,000 nested arrays",
        value=good[:-2] + ',"zz":' + "[" * 5_000 + "]" * 5_000 + "}}",
    )

    # --- key/value identity ---------------------------------------------------------------------
    case(
        "identity namespace differs",
        "identity",
        "value claims ns2 under an ns1 key",
        value=record(namespace="ns2"),
    )
    case(
        "identity component differs",
        "identity",
        "value claims another component",
        value=record(component="other"),
    )
    case(
        "identity endpoint differs",
        "identity",
        "value claims another endpoint",
        value=record(endpoint="other"),
    )
    case(
        "identity instance differs",
        "identity",
        "value claims instance 0x20 under 0x1f",
        value=record(instance_id=0x20),
    )
    case(
        "identity suffix in value only",
        "identity",
        "model_suffix with a base key",
        value=record(card=lora_card, model_suffix="my-lora"),
    )
    case(
        "identity suffix in key only",
        "identity",
        "LoRA key with no model_suffix",
        key=f"{KEY}.my-lora",
        value=record(card=lora_card),
    )
    case(
        "identity suffix differs",
        "identity",
        "key and value name different adapters",
        key=f"{KEY}.my-lora",
        value=record(card=lora_card, model_suffix="other-lora"),
    )
    case(
        "identity lora suffix without lora card",
        "identity",
        "a suffix but the card has no lora",
        key=f"{KEY}.my-lora",
        value=record(model_suffix="my-lora"),
    )
    case(
        "identity lora card without suffix",
        "identity",
        "a lora card published as a base card",
        value=record(card=lora_card),
    )
    case(
        "identity escaped namespace differs",
        "identity",
        "key says a.b, value says a_b",
        key=f"v1.mdc.a=2Eb.{COMP}.{EP}.1f",
        value=record(namespace="a_b"),
    )
    case(
        "identity instance under instances bucket",
        "identity",
        "endpoint record for another instance",
        key=f"v1.instances.{NS}.{COMP}.{EP}.1f",
        value={
            "type": "Endpoint",
            "namespace": NS,
            "component": COMP,
            "endpoint": EP,
            "instance_id": 0x20,
            "transport": {"tcp": "127.0.0.1:1"},
        },
    )

    # --- cards Dynamo 1.6.1 refuses to decode ---------------------------------------------------
    def card_case(name: str, why: str, card: Any) -> None:
        case(name, "card", why, card_text=text(card))

    card_case("card block size negative", "u32 field given -1", card_with(kv_cache_block_size=-1))
    card_case("card block size float", "u32 field given 16.0", card_with(kv_cache_block_size=16.0))
    card_case(
        "card block size string", "u32 field given a string", card_with(kv_cache_block_size="16")
    )
    card_case("card block size over u32", "2^32 does not fit", card_with(kv_cache_block_size=2**32))
    card_case("card context over u32", "2^32 does not fit", card_with(context_length=2**32))
    card_case(
        "card block size missing",
        "a required field is missing",
        card_with(kv_cache_block_size=_DROP),
    )
    card_case("card model type unknown", "unknown model type flag", card_with(model_type="Bogus"))
    card_case("card model input unknown", "unknown model input", card_with(model_input="Audio"))
    card_case("card worker type unknown", "unknown worker type", card_with(worker_type="gpu"))
    card_case("card needs unknown type", "needs names an unknown role", card_with(needs=[["gpu"]]))
    card_case(
        "card needs not nested", "needs must be a list of lists", card_with(needs=["prefill"])
    )
    card_case("card name not string", "display_name is a number", card_with(display_name=5))
    card_case("card aliases not list", "aliases is a string", card_with(aliases="a"))
    card_case(
        "card runtime data null",
        "runtime_data must be a map",
        card_with(runtime_config={"runtime_data": None}),
    )
    card_case(
        "card checksum algorithm",
        "only blake3 exists",
        card_with(
            model_info={"hf_config_json": {"path": "/m/config.json", "checksum": "md5:abcd"}}
        ),
    )
    card_case(
        "card checksum digest",
        "digest must be 64 lowercase hex",
        card_with(
            model_info={"hf_config_json": {"path": "/m/config.json", "checksum": "blake3:xyz"}}
        ),
    )
    card_case(
        "card model info variant",
        "unknown model_info kind",
        card_with(model_info={"gguf": {"path": "/m", "checksum": "blake3:" + "0" * 64}}),
    )
    card_case(
        "card prompt context unknown",
        "unknown prompt context mixin",
        card_with(prompt_context=["nope"]),
    )
    card_case(
        "card router mode unknown",
        "unknown router mode",
        card_with(
            router_config={
                "router_mode": "fastest",
                "kv_router_config": {},
                "load_threshold_config": {},
            }
        ),
    )
    card_case("card lora not object", "lora must be an object", card_with(lora="x"))
    card_case(
        "card user data too deep",
        "nesting past 127 levels in user_data",
        card_with(user_data=json.loads("[" * 200 + "]" * 200)),
    )
    card_case(
        "card identity map over 32 entries",
        "an explicit identity map holds at most 32 entries",
        card_with(indexer_identity={"semantics": {f"k{i}": "v" for i in range(33)}}),
    )
    card_case(
        "card identity key over 128 bytes",
        "65 two-byte characters are 130 UTF-8 bytes",
        card_with(indexer_identity={"semantics": {"\u00e9" * 65: "v"}}),
    )
    card_case(
        "card identity value over 1024 bytes",
        "an identity value holds at most 1024 UTF-8 bytes",
        card_with(indexer_identity={"routing_scope": {"k": "v" * 1025}}),
    )
    card_case(
        "card keyed hash key id blank",
        "keyed-xxh3-v1 needs a key id that is non-empty after trimming",
        card_with(
            router_config={
                "router_mode": "k_v",
                "kv_router_config": {
                    "router_tracking_hash": "keyed-xxh3-v1",
                    "router_tracking_key_file": "/etc/dynamo/router.key",
                    "router_tracking_key_id": " \t ",
                },
                "load_threshold_config": {},
            }
        ),
    )
    # A struct field given twice inside card_json is not refused: the discovery envelope holds
    # the card as a generic JSON value first, where the last duplicate wins, exactly as 1.6.1.
    card_case("card is a number", "a card must be an object or field array", 5)

    # --- cards that decode but fail the boundary's shape rules ----------------------------------
    def shape_case(name: str, why: str, card: Any) -> None:
        case(name, "shape", why, card_text=text(card))

    shape_case("shape empty name", "a card needs a name", card_with(display_name=""))
    shape_case(
        "shape prefill with text input",
        "prefill requires token input",
        card_with(model_type="Prefill", model_input="Text", worker_type="prefill"),
    )
    shape_case(
        "shape tensor chat",
        "tensor input serves only tensor models",
        card_with(model_type="Chat", model_input="Tensor"),
    )
    return _CASES


def main() -> None:
    out = Path(__file__).with_name("bad_records.jsonl")
    lines = [json.dumps(c, ensure_ascii=True, separators=(",", ":")) for c in build()]
    names = [json.loads(line)["name"] for line in lines]
    assert len(names) == len(set(names)), "case names must be unique"
    out.write_text("\n".join(lines) + "\n")
    print(f"{len(lines)} cases -> {out}")


if __name__ == "__main__":
    main()
