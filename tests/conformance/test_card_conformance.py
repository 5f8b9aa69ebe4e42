"""Card by card, our checksum and accept/refuse decision against the real Dynamo 1.6.1."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, seed, settings
from workerset_admission.card import mdcsum
from workerset_admission.errors import CardDecodeError

from .cards import cards

core = pytest.importorskip("dynamo._core", reason="ai-dynamo-runtime is not installed")

pytestmark = [
    pytest.mark.conformance,
    pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisDeprecationWarning"),
]

EXAMPLES = int(os.environ.get("CARD_CONFORMANCE_EXAMPLES", "1200"))


def oracle(text: str) -> str | None:
    try:
        card = core.ModelDeploymentCard.from_json_str(text)
    except Exception:
        return None
    return str(card.local_dir()).rsplit("/", 1)[1]


def ours(text: str) -> str | None:
    try:
        return mdcsum(text)
    except CardDecodeError:
        return None


@pytest.fixture(scope="module")
def router_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("router-files")
    files = {
        "good.yaml": "router: {}\n",
        "empty.yaml": "{}\n",
        "list.yaml": "router: []\n",
        "bad.yaml": ": : :\n- x",
        "dup.yaml": "router: {}\nrouter: {}\n",
        "classifier.yaml": "request_classifier: {type: x}\n",
        "selection.yaml": "worker_selection: {zz: 1}\n",
        "models.yaml": "router: {}\nmodels: null\n",
        "key.bin": "secret",
    }
    out = {}
    for name, content in files.items():
        path = Path(folder, name)
        path.write_text(content)
        out[name] = str(path)
    out["missing"] = str(Path(folder, "missing.yaml"))
    return out


def test_checksums_and_refusals_match_dynamo_card_by_card(router_files: dict[str, str]) -> None:
    compared: list[int] = [0]
    accepted: list[int] = [0]
    mismatches: list[tuple[str, str | None, str | None]] = []

    @seed(20261129)
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(cards(router_files))
    def compare(text: str) -> None:
        compared[0] += 1
        expected, actual = oracle(text), ours(text)
        accepted[0] += expected is not None
        if expected != actual:
            mismatches.append((text, expected, actual))

    compare()
    assert compared[0] >= min(EXAMPLES, 1000)
    # Both verdicts must be well represented, or the comparison proves little.
    assert compared[0] * 0.15 <= accepted[0] <= compared[0] * 0.85
    assert mismatches[:3] == []
    assert len(mismatches) == 0


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(cards())
def test_fresh_cards_also_match_dynamo(text: str) -> None:
    assert ours(text) == oracle(text)
