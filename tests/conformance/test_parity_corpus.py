"""The parity corpus: cards on which the decoder once disagreed with Dynamo 1.6.1 stay settled.

Each case records the verdict of the real runtime (a checksum, or null for a refusal). Our
decoder must give the same verdict; where the runtime is installed it must still give it too,
so a corpus case can never drift from what 1.6.1 does.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from workerset_admission.card import mdcsum
from workerset_admission.errors import CardDecodeError

pytestmark = pytest.mark.conformance

CORPUS = Path(__file__).resolve().parents[1] / "corpus" / "parity_cards.jsonl"
CASES = [json.loads(line) for line in CORPUS.read_text().splitlines()]


def ours(text: str) -> str | None:
    try:
        return mdcsum(text)
    except CardDecodeError:
        return None


def test_the_corpus_holds_both_verdicts_and_every_known_divergence() -> None:
    names = {case["name"] for case in CASES}
    assert {
        "identity 33 entries",
        "identity key 129 bytes",
        "identity value 1025 bytes",
        "key id surrounded",
        "prefill_load queue threshold 0.5 without busy threshold",
    } <= names
    verdicts = [case["expected"] is None for case in CASES]
    assert any(verdicts)
    assert not all(verdicts)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["name"])
def test_our_verdict_is_the_recorded_verdict_of_dynamo(case: dict[str, str | None]) -> None:
    assert ours(str(case["card_text"])) == case["expected"]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["name"])
def test_dynamo_still_gives_the_recorded_verdict(case: dict[str, str | None]) -> None:
    core = pytest.importorskip("dynamo._core", reason="needs ai-dynamo-runtime==1.6.1")
    try:
        card = core.ModelDeploymentCard.from_json_str(str(case["card_text"]))
    except Exception:  # the runtime raises plain exceptions for any refusal
        verdict = None
    else:
        verdict = str(card.local_dir()).rsplit("/", 1)[1]
    assert verdict == case["expected"]
