"""Reported checksum differences, undone on the card, give the incumbent's checksum in 1.6.1 too.

Each decodable card of the parity corpus is paired with mutated copies; the differences we
report between the card and a copy are reverted on the copy's JSON, and the real runtime's
checksum of the result must be the original's, while with any one of them left as it was it
must not be.
"""

from __future__ import annotations

import copy
import gzip
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.differences import normalized, reverted
from workerset_admission.card import card_differences
from workerset_admission.errors import CardDecodeError

core = pytest.importorskip("dynamo._core", reason="ai-dynamo-runtime is not installed")

pytestmark = pytest.mark.conformance

CORPUS = Path(__file__).resolve().parents[1] / "corpus" / "parity_cards.jsonl"
DIGEST = "blake3:" + "1" * 64
ROUTER = {"router_mode": "k_v", "kv_router_config": {}, "load_threshold_config": {}}

Card = dict[str, Any]


def dynamo_checksum(card: Card) -> str | None:
    try:
        decoded = core.ModelDeploymentCard.from_json_str(json.dumps(card))
    except Exception:  # the runtime raises plain exceptions for any refusal
        return None
    return str(decoded.local_dir()).rsplit("/", 1)[1]


def _runtime_data(card: Card) -> dict[str, Any]:
    runtime = card.setdefault("runtime_config", {})
    return runtime.setdefault("runtime_data", {})  # type: ignore[no-any-return]


def _router_member(card: Card) -> None:
    router = card.get("router_config")
    if isinstance(router, dict) and isinstance(router.get("kv_router_config"), dict):
        router["kv_router_config"]["router_temperature"] = 0.25
    else:
        card["router_config"] = {**ROUTER, "kv_router_config": {"router_temperature": 0.25}}


MUTATIONS: dict[str, Callable[[Card], None]] = {
    "block size": lambda c: c.update(kv_cache_block_size=int(c["kv_cache_block_size"]) + 16),
    "runtime context length": lambda c: c.setdefault("runtime_config", {}).update(
        context_length=12345
    ),
    "architectural context length": lambda c: c.update(architectural_max_context_length=23456),
    "top-level context length": lambda c: c.update(context_length=34567),
    "router config present or gone": lambda c: (
        c.pop("router_config")
        if c.get("router_config") is not None
        else c.update(router_config=ROUTER)
    ),
    "router member": _router_member,
    "aliases": lambda c: c.update(aliases=[*c.get("aliases", []), "alias-x"]),
    "needs": lambda c: c.update(needs=[["encode"], ["decode"]]),
    "tokenizer": lambda c: c.update(
        tokenizer={"hf_tokenizer_json": {"path": "t.json", "checksum": DIGEST}}
    ),
    "runtime contract flag": lambda c: _runtime_data(c).update(vllm_inference_v1_generate=True),
    "video contract": lambda c: _runtime_data(c).update(
        vllm_nemotron_video_processor_contract={"frames": 8}
    ),
    "display name": lambda c: c.update(display_name=f"{c['display_name']}-v2"),
    "extra file": lambda c: c.update(
        extra_files=[*c.get("extra_files", []), {"path": "x/extra.json", "checksum": DIGEST}]
    ),
    "prompt context": lambda c: c.update(prompt_context=["llama3_date_time"]),
    "migration limit (unhashed)": lambda c: c.update(migration_limit=7),
    "user data (unhashed)": lambda c: c.update(user_data={"owner": "x"}),
}


def corpus_cards() -> list[Card]:
    out = []
    for line in CORPUS.read_text().splitlines():
        case = json.loads(line)
        if case["expected"] is None:
            continue
        card = json.loads(case["card_text"])
        # Mutations edit the object form; cards spelled in array form are left out.
        if not isinstance(card, dict) or not isinstance(card.get("runtime_config", {}), dict):
            continue
        try:
            normalized(card)
        except CardDecodeError:
            continue
        if dynamo_checksum(card) == case["expected"]:
            out.append(card)
    return out


def test_reverting_the_reported_fields_gives_the_incumbents_checksum_in_dynamo() -> None:
    rng = random.Random(25)
    cards = corpus_cards()
    assert len(cards) >= 10
    pairs = differing = 0
    for incumbent in cards:
        for _ in range(6):
            rejected = copy.deepcopy(incumbent)
            for name in rng.sample(sorted(MUTATIONS), rng.randint(1, 3)):
                MUTATIONS[name](rejected)
            try:
                differences = card_differences(normalized(incumbent), normalized(rejected))
            except CardDecodeError:
                # A mutation that makes the card invalid: 1.6.1 must refuse it too.
                assert dynamo_checksum(rejected) is None
                continue
            want, got = dynamo_checksum(incumbent), dynamo_checksum(rejected)
            assert got is not None
            pairs += 1
            fields = [d.field for d in differences]
            assert (not fields) == (want == got), fields
            assert dynamo_checksum(reverted(rejected, incumbent, fields)) == want, fields
            for kept in fields:
                partly = reverted(rejected, incumbent, [f for f in fields if f != kept])
                assert dynamo_checksum(partly) != want, kept
            differing += bool(fields)
    assert pairs >= 60
    assert differing >= pairs // 2


N2_CORPUS = CORPUS.with_name("n2_records.jsonl.gz")


def n2_cards() -> dict[str, dict[str, Card]]:
    """Per variant, the card each runtime version wrote for it (records 1.6.1 admits)."""
    with gzip.open(N2_CORPUS, "rt") as lines:
        records = [json.loads(line) for line in lines]
    out: dict[str, dict[str, Card]] = {}
    for record in records:
        card = json.loads(record["value"])["card_json"]
        legacy_prefill = card.get("worker_type") is None and "Prefill" in card["model_type"]
        if record["frontend"] == "admitted" and not legacy_prefill:
            out.setdefault(record["variant"], {})[record["version"]] = card
    return out


def test_an_upgrade_from_an_older_runtime_differs_in_what_dynamo_sees_differ() -> None:
    """The same worker as written by 1.4.2, 1.5.1 and 1.6.0, against 1.6.1's card."""
    pairs = flips = 0
    for variant, by_version in sorted(n2_cards().items()):
        incumbent = by_version.get("1.6.1")
        if incumbent is None:
            continue
        want = dynamo_checksum(incumbent)
        for version, rejected in sorted(by_version.items()):
            if version == "1.6.1":
                continue
            pairs += 1
            fields = [
                d.field for d in card_differences(normalized(incumbent), normalized(rejected))
            ]
            assert (not fields) == (dynamo_checksum(rejected) == want), (variant, version)
            assert dynamo_checksum(reverted(rejected, incumbent, fields)) == want, (variant, fields)
            for kept in fields:
                partly = reverted(rejected, incumbent, [f for f in fields if f != kept])
                assert dynamo_checksum(partly) != want, (variant, version, kept)
            flips += bool(fields)
    assert pairs >= 100
    assert 0 < flips < pairs
