"""Differential fuzzing of the card decoder against the real Dynamo 1.6.1 runtime.

Cards come from the structure-aware generator in ``fuzz_cards`` (the whole 1.6.1 card schema,
boundary values everywhere). For each card the verdict of ``ModelDeploymentCard.from_json_str``
(refused, or the checksum that names its ``local_dir()``) must equal ours.

The default run is deterministic: a fixed seed and a fixed budget, so CI sees the same cards
every time. Every divergence a run has ever found is kept, cut down to its cause, in the
committed parity corpus (``tests/corpus/parity_cards.jsonl``, checked by
``test_parity_corpus.py``), so a fixed divergence can never come back unnoticed. The long run
(``-m bench``) explores far more cards over many seeds; set ``CARD_FUZZ_REPORT`` to a path to
get its figures and every divergence as JSON, and ``CARD_FUZZ_SEED`` to explore other cards.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, seed, settings
from workerset_admission.card import mdcsum
from workerset_admission.errors import CardDecodeError

from .fuzz_cards import SECTIONS, Files, fuzz_cards

core = pytest.importorskip("dynamo._core", reason="ai-dynamo-runtime is not installed")

pytestmark = [
    pytest.mark.conformance,
    pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisDeprecationWarning"),
]

EXAMPLES = int(os.environ.get("CARD_FUZZ_EXAMPLES", "2500"))
LONG_EXAMPLES = int(os.environ.get("CARD_FUZZ_LONG_EXAMPLES", "100000"))
LONG_CHUNK = 5000
SEED = int(os.environ.get("CARD_FUZZ_SEED", "20261201"))


def dynamo_verdict(text: str) -> str | None:
    try:
        card = core.ModelDeploymentCard.from_json_str(text)
    except Exception:  # the runtime raises plain exceptions for any refusal
        return None
    return str(card.local_dir()).rsplit("/", 1)[1]


def our_verdict(text: str) -> str | None:
    try:
        return mdcsum(text)
    except CardDecodeError:
        return None


@dataclass
class Tally:
    compared: int = 0
    accepted: int = 0
    sections: dict[str, int] = field(default_factory=dict)
    divergences: list[dict[str, str | None]] = field(default_factory=list)

    def judge(self, text: str) -> None:
        self.compared += 1
        expected, actual = dynamo_verdict(text), our_verdict(text)
        if expected is not None:
            self.accepted += 1
            for name in json.loads(text):
                if name in SECTIONS:
                    self.sections[name] = self.sections.get(name, 0) + 1
        if expected != actual:
            self.divergences.append({"card": text, "dynamo": expected, "ours": actual})


def run(files: Files, examples: int, at_seed: int, tally: Tally) -> None:
    @seed(at_seed)
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(fuzz_cards(files))
    def compare(text: str) -> None:
        tally.judge(text)

    compare()


@pytest.fixture(scope="module")
def files() -> Iterator[Files]:
    # A private folder, not pytest's tmp_path: other pytest sessions of the same user prune
    # old base temp folders, which would pull the policy file away under a long run.
    with tempfile.TemporaryDirectory(prefix="card-fuzz-") as folder:
        contents = {
            "policy.yaml": "router: {}\n",
            "broken.yaml": ": : :\n- x",
            "selection.yaml": "worker_selection: {zz: 1}\n",
            "key.bin": "secret",
        }
        for name, text in contents.items():
            Path(folder, name).write_text(text)
        names = ("policy.yaml", "broken.yaml", "selection.yaml", "missing.yaml")
        policies = tuple(str(Path(folder, n)) for n in names)
        yield Files(policies, (str(Path(folder, "key.bin")),))


def test_fuzzed_cards_get_the_same_verdict_and_checksum_as_dynamo(files: Files) -> None:
    tally = Tally()
    run(files, EXAMPLES, SEED, tally)
    print(json.dumps({"cards": tally.compared, "accepted_by_dynamo": tally.accepted}))
    assert tally.compared >= min(EXAMPLES, 2000)
    # Both verdicts well represented, and every section present in accepted cards, or the
    # comparison proves little.
    assert tally.compared * 0.2 <= tally.accepted <= tally.compared * 0.8
    assert set(tally.sections) == set(SECTIONS)
    assert min(tally.sections.values()) >= 20
    assert not tally.divergences, f"{len(tally.divergences)} divergences: {tally.divergences[:3]}"


@pytest.mark.bench
@pytest.mark.timeout(3600)
def test_a_long_fuzzing_run_finds_no_divergence(files: Files) -> None:
    tally = Tally()
    started = time.monotonic()
    chunks = max(LONG_EXAMPLES // LONG_CHUNK, 1)
    for chunk in range(chunks):
        run(files, LONG_CHUNK, SEED + 1 + chunk, tally)
    report = {
        "cards": tally.compared,
        "accepted_by_dynamo": tally.accepted,
        "divergences": len(tally.divergences),
        "seconds": round(time.monotonic() - started, 1),
        "seeds": [SEED + 1, SEED + chunks],
        "accepted_by_section": dict(sorted(tally.sections.items())),
        "examples": tally.divergences[:50],
    }
    target = os.environ.get("CARD_FUZZ_REPORT")
    if target:
        Path(target).write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "examples"}))
    assert tally.compared >= min(LONG_EXAMPLES, 100_000) * 0.95
    assert not tally.divergences, f"{len(tally.divergences)} divergences: {tally.divergences[:3]}"
