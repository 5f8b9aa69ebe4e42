"""Regenerate ``parity_cards.jsonl``: cards on which the decoder once disagreed with Dynamo 1.6.1.

Run ``python tests/corpus/build_parity_cards.py`` (with ``ai-dynamo-runtime==1.6.1`` installed)
after adding a case. Each case is written with the verdict the real runtime gives it, so the
committed file records 1.6.1's behaviour and the tests never depend on this script. Each line:
``name``; ``card_text``, the exact card; ``expected``, the checksum 1.6.1 derives (the basename
of ``local_dir()``) or null when ``ModelDeploymentCard.from_json_str`` refuses the card; ``why``;
and ``origin``: ``probe`` for a case written by hand around a known limit, ``fuzz`` for one the
differential fuzzer found.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

# Run as a script: the shared test builders live one folder up, in tests/support.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from support.cards import base_card as demo_card

BASE: dict[str, Any] = demo_card()
_CASES: list[dict[str, Any]] = []


def card_with(**changes: Any) -> dict[str, Any]:
    card = copy.deepcopy(BASE)
    card.update(changes)
    return card


def router(**kv: Any) -> dict[str, Any]:
    return {"router_mode": "k_v", "kv_router_config": kv, "load_threshold_config": {}}


def keyed(key_id: str) -> dict[str, Any]:
    return router(
        router_tracking_hash="keyed-xxh3-v1",
        router_tracking_key_file="/etc/dynamo/router.key",
        router_tracking_key_id=key_id,
    )


def case(name: str, why: str, card: Any, *, origin: str = "probe") -> None:
    text = card if isinstance(card, str) else json.dumps(card, ensure_ascii=False)
    _CASES.append({"name": name, "card_text": text, "why": why, "origin": origin})


def build() -> list[dict[str, Any]]:
    # --- indexer_identity bounds: 32 entries, 128-byte keys, 1024-byte values (UTF-8) --------
    entries = {f"k{i}": "v" for i in range(32)}
    case(
        "identity 32 entries",
        "at the entry limit",
        card_with(indexer_identity={"semantics": entries}),
    )
    case(
        "identity 33 entries",
        "one entry over the limit",
        card_with(indexer_identity={"semantics": entries | {"k32": "v"}}),
    )
    case(
        "identity 33 routing scope entries",
        "the limit holds for routing_scope too",
        card_with(indexer_identity={"routing_scope": entries | {"k32": "v"}}),
    )
    case(
        "identity 32 entries in each map",
        "the limit is per map, not per card",
        card_with(indexer_identity={"semantics": entries, "routing_scope": entries}),
    )
    case(
        "identity key 128 bytes",
        "at the key limit",
        card_with(indexer_identity={"semantics": {"k" * 128: "v"}}),
    )
    case(
        "identity key 129 bytes",
        "one byte over the key limit",
        card_with(indexer_identity={"semantics": {"k" * 129: "v"}}),
    )
    case(
        "identity key 64 two-byte characters",
        "128 UTF-8 bytes in 64 characters",
        card_with(indexer_identity={"semantics": {"é" * 64: "v"}}),
    )
    case(
        "identity key 65 two-byte characters",
        "130 UTF-8 bytes in 65 characters: the limit counts bytes",
        card_with(indexer_identity={"semantics": {"é" * 65: "v"}}),
    )
    case(
        "identity key 43 three-byte characters",
        "129 UTF-8 bytes in 43 characters",
        card_with(indexer_identity={"routing_scope": {"☃" * 43: "v"}}),
    )
    case(
        "identity value 1024 bytes",
        "at the value limit",
        card_with(indexer_identity={"routing_scope": {"k": "v" * 1024}}),
    )
    case(
        "identity value 1025 bytes",
        "one byte over the value limit",
        card_with(indexer_identity={"routing_scope": {"k": "v" * 1025}}),
    )
    case(
        "identity value 513 two-byte characters",
        "1026 UTF-8 bytes in 513 characters",
        card_with(indexer_identity={"semantics": {"k": "é" * 513}}),
    )
    case(
        "identity value 256 four-byte characters",
        "1024 UTF-8 bytes in 256 characters",
        card_with(indexer_identity={"semantics": {"k": "𝄞" * 256}}),
    )
    case(
        "identity value escaped past the limit",
        "the limit applies to the decoded text, not its escaped spelling",
        json.dumps(card_with(indexer_identity={"semantics": {"k": "é" * 513}}), ensure_ascii=True),
    )

    # --- router_tracking_key_id under keyed-xxh3-v1: non-empty and unchanged by trimming -------
    case("key id plain", "a plain id is accepted", card_with(router_config=keyed("a")))
    case("key id inner space", "inner whitespace is kept", card_with(router_config=keyed("a b")))
    case("key id only spaces", "empty after trimming", card_with(router_config=keyed("  ")))
    case("key id tab and newline", "empty after trimming", card_with(router_config=keyed("\t\n")))
    case(
        "key id trailing space",
        "surrounding whitespace is refused",
        card_with(router_config=keyed("a ")),
    )
    case(
        "key id surrounded",
        "surrounding whitespace is refused",
        card_with(router_config=keyed(" a ")),
    )
    case(
        "key id no-break space",
        "U+00A0 is Rust whitespace",
        card_with(router_config=keyed("a\u00a0")),
    )
    case(
        "key id ideographic space",
        "U+3000 is Rust whitespace",
        card_with(router_config=keyed("\u3000a")),
    )
    case("key id next line", "U+0085 is Rust whitespace", card_with(router_config=keyed("\u0085a")))
    case(
        "key id line separator",
        "U+2028 is Rust whitespace",
        card_with(router_config=keyed("\u2028")),
    )
    case(
        "key id file separator",
        "U+001C is whitespace to Python but not to Rust",
        card_with(router_config=keyed("a\u001c")),
    )
    case(
        "key id zero width space",
        "U+200B is not whitespace",
        card_with(router_config=keyed("a\u200b")),
    )

    # --- conditional disaggregation: a load policy inherits router_queue_threshold -------------
    for policy in ("prefill_load", "isl_or_load"):
        for queue in (None, 0, 0.5):
            kv: dict[str, Any] = {
                "conditional_disagg_enabled": True,
                "conditional_disagg_policy": policy,
            }
            if queue is not None:
                kv["router_queue_threshold"] = queue
            verdict = (
                "refused: no threshold at all" if queue is None else "inherits the queue threshold"
            )
            case(
                f"{policy} queue threshold {queue} without busy threshold",
                verdict,
                card_with(router_config=router(**kv)),
            )
    fuzz_found()
    return _CASES


def fuzz_found() -> None:
    """Divergences the differential fuzzer found, each cut down by hand to its cause."""
    base = json.dumps(BASE, ensure_ascii=False)[:-1]
    deep = "[" * 126 + "1" + "]" * 126
    file = json.dumps({"path": "t", "checksum": "blake3:" + "ab" * 32})

    def fuzz(name: str, why: str, tail: str) -> None:
        field = tail.split('"')[1]
        # The tail replaces the base card's own value of that field, if it has one.
        text = base.replace(f'"{field}": {json.dumps(BASE.get(field))}, ', "")
        case(name, why, text + tail, origin="fuzz")

    fuzz(
        "tokenizer variant key repeated",
        "read from text, an enum object ends after its one variant: a repeat is refused",
        ',"tokenizer":{' + f'"hf_tokenizer_json":{file},"hf_tokenizer_json":{file}' + "}}",
    )
    fuzz(
        "router mode unit variant repeated",
        "the object spelling of a unit variant cannot repeat its key either",
        ',"router_config":{"router_mode":{"k_v":null,"k_v":null},'
        '"kv_router_config":{},"load_threshold_config":{}}}',
    )
    fuzz(
        "router mode unit variant object",
        "the object spelling of a unit variant, once, is accepted",
        ',"router_config":{"router_mode":{"k_v":null},'
        '"kv_router_config":{},"load_threshold_config":{}}}',
    )
    fuzz(
        "runtime data repeated key with a deep earlier value",
        "the earlier value is parsed, and its depth counted, before the map drops it",
        ',"runtime_config":{"runtime_data":{"a":' + deep + ',"a":1}}}',
    )
    fuzz(
        "runtime data repeated key with an out-of-range earlier value",
        "the earlier value is parsed before the map drops it",
        ',"runtime_config":{"runtime_data":{"a":1e400,"a":1}}}',
    )
    fuzz(
        "runtime data repeated key with a lone surrogate earlier value",
        "the earlier value is parsed before the map drops it",
        ',"runtime_config":{"runtime_data":{"a":"\\ud800","a":1}}}',
    )
    fuzz(
        "topology domain repeated key with a wrongly typed earlier value",
        "each value of a typed map is decoded as it is read",
        ',"runtime_config":{"topology_domains":{"a":1,"a":"x"}}}',
    )
    fuzz(
        "topology domain repeated key with valid values",
        "the last value wins",
        ',"runtime_config":{"topology_domains":{"a":"y","a":"x"}}}',
    )
    fuzz(
        "tensor parameter repeated key with a wrongly typed earlier value",
        "each value of a typed map is decoded as it is read",
        ',"tensor_model_config":{"name":"x","inputs":[{"name":"a","data_type":"Bool",'
        '"shape":[],"parameters":{"p":{"bool":1},"p":{"bool":true}}}],"outputs":[]}}',
    )
    fuzz(
        "user data repeated key with a deep earlier value",
        "a free-form value counts the depth of what it drops",
        ',"user_data":{"a":' + deep + ',"a":1}}',
    )
    fetcher = (
        ',"media_fetcher":{"user_agent":"u","allow_direct_ip":true,"allow_direct_port":true,'
        '"allow_private_ips":true,"timeout":'
    )
    for name, timeout, why in (
        (
            "fetch timeout at the u64 edge",
            '{"secs":18446744073709551615,"nanos":999999999}',
            "fits",
        ),
        (
            "fetch timeout nanos carry past u64",
            '{"secs":18446744073709551615,"nanos":1000000000}',
            "a whole second of nanos carried into secs overflows u64",
        ),
        (
            "fetch timeout nanos carry two seconds",
            '{"secs":18446744073709551614,"nanos":2000000000}',
            "nanos may exceed a second; the carry is what overflows",
        ),
        (
            "fetch timeout array form carrying past u64",
            "[18446744073709551612,4294967295]",
            "the array form is checked the same way",
        ),
        ("fetch timeout array form at the edge", "[18446744073709551611,4294967295]", "fits"),
    ):
        fuzz(name, why, fetcher + timeout + "}}")
    fuzz(
        "unknown field repeated key with a deep earlier value",
        "an ignored field is skipped without a depth limit",
        ',"zz":{"a":' + deep + ',"a":1}}',
    )


def dynamo_verdict(text: str) -> str | None:
    import dynamo._core as core  # only the builder needs the runtime

    try:
        card = core.ModelDeploymentCard.from_json_str(text)
    except Exception:  # the runtime raises plain exceptions for any refusal
        return None
    return str(card.local_dir()).rsplit("/", 1)[1]


def main() -> None:
    out = Path(__file__).with_name("parity_cards.jsonl")
    cases = build()
    names = [c["name"] for c in cases]
    assert len(names) == len(set(names)), "case names must be unique"
    lines = []
    for entry in cases:
        entry = {**entry, "expected": dynamo_verdict(entry["card_text"])}
        lines.append(json.dumps(entry, ensure_ascii=True, separators=(",", ":")))
    out.write_text("\n".join(lines) + "\n")
    print(f"{len(lines)} cases -> {out}")


if __name__ == "__main__":
    main()
