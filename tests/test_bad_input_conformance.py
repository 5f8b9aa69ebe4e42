"""The corpus's card cases are judged by the real Dynamo 1.6.1 runtime, not by our reading of it.

Every case of layer ``card`` must be one 1.6.1 refuses to decode; every case of layer ``shape``
must decode in 1.6.1 (its refusal comes from the frontend's shape rules, applied after decoding).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.conformance

CORPUS = Path(__file__).with_name("corpus") / "bad_records.jsonl"
CARD_CASES = [
    case
    for case in (json.loads(line) for line in CORPUS.read_text().splitlines())
    if case["layer"] in ("card", "shape")
]


def decodes_in_dynamo(card_text: str) -> bool:
    core = pytest.importorskip("dynamo._core", reason="needs ai-dynamo-runtime==1.6.1")
    try:
        core.ModelDeploymentCard.from_json_str(card_text)
    except Exception:  # the runtime raises plain exceptions for any refusal
        return False
    return True


def test_the_corpus_has_card_cases_with_their_card_text() -> None:
    assert len(CARD_CASES) > 10
    assert all(case["card_text"] in case["value"] for case in CARD_CASES)


@pytest.mark.parametrize("case", CARD_CASES, ids=lambda c: c["name"])
def test_dynamo_decodes_a_card_case_exactly_when_it_is_a_shape_case(case: dict[str, str]) -> None:
    assert decodes_in_dynamo(case["card_text"]) == (case["layer"] == "shape")
