"""The N-2 corpus: records the real 1.4.2, 1.5.1, 1.6.0 and 1.6.1 runtimes wrote, judged by 1.6.1.

``tests/corpus/n2_records.jsonl.gz`` (made by ``tests/corpus/build_n2_corpus.py``) holds each
record as a worker of that version wrote it, with 1.6.1's verdicts: the runtime's ``mdcsum``
and whether a real 1.6.1 frontend admitted the record at its discovery check. The boundary
must give the same checksum and the same verdict for every record.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
from workerset_admission.card import decode_model_record, model_kv_key, parse_key
from workerset_admission.errors import CardDecodeError
from workerset_admission.identity import EndpointId

pytestmark = pytest.mark.conformance

CORPUS = Path(__file__).resolve().parents[1] / "corpus" / "n2_records.jsonl.gz"
with gzip.open(CORPUS, "rt") as _lines:
    RECORDS: list[dict[str, Any]] = [json.loads(line) for line in _lines]
VERSIONS = ("1.4.2", "1.5.1", "1.6.0", "1.6.1")


def boundary(record: dict[str, Any]) -> tuple[str, str | None]:
    """The boundary's verdict on a record: (``admitted``, checksum) or (``refused``, reason)."""
    namespace, component, endpoint, instance, *suffix = record["key"].split("/")
    key = model_kv_key(
        EndpointId(namespace, component, endpoint), int(instance, 16), suffix[0] if suffix else None
    )
    try:
        registration = decode_model_record(parse_key(key), record["value"].encode())
    except CardDecodeError as error:
        return "refused", error.reason
    assert registration is not None
    return "admitted", registration.mdc_checksum


def test_the_corpus_holds_every_version_and_both_verdicts() -> None:
    per_version = Counter(record["version"] for record in RECORDS)
    verdicts = Counter((record["version"], record["frontend"]) for record in RECORDS)
    print("\nrecords per version:", dict(sorted(per_version.items())))
    print("1.6.1 frontend verdicts:", dict(sorted(verdicts.items())))
    assert set(per_version) == set(VERSIONS)
    assert all(per_version[version] >= 50 for version in VERSIONS)
    assert all(verdicts[(version, "refused")] > 0 for version in VERSIONS)


def test_the_boundary_gives_every_record_the_verdicts_of_1_6_1() -> None:
    agree: Counter[str] = Counter()
    disagree = []
    for record in RECORDS:
        verdict, detail = boundary(record)
        if verdict == "admitted":
            same = record["frontend"] == "admitted" and detail == record["mdcsum"]
        else:
            same = record["frontend"] == "refused" and detail == "invalid_card_shape"
        if same:
            agree[record["version"]] += 1
        else:
            disagree.append((record["version"], record["variant"], verdict, detail))
    print("\nboundary agrees with 1.6.1:", dict(sorted(agree.items())), f"of {len(RECORDS)}")
    assert not disagree, disagree[:10]


def test_every_checksum_is_the_one_the_1_6_1_runtime_computes() -> None:
    core = pytest.importorskip("dynamo._core", reason="needs ai-dynamo-runtime==1.6.1")
    for record in RECORDS:
        card = core.ModelDeploymentCard.from_json_str(
            json.dumps(json.loads(record["value"])["card_json"])
        )
        assert str(card.local_dir()).rsplit("/", 1)[1] == record["mdcsum"], record["variant"]


def flip_cause(old: dict[str, Any], new: dict[str, Any]) -> str | None:
    """Which documented cause separates an older worker's card from a 1.6.1 worker's."""
    old_card, new_card = (json.loads(r["value"])["card_json"] for r in (old, new))
    kv = (old_card.get("router_config") or {}).get("kv_router_config") or {}
    new_kv = (new_card.get("router_config") or {}).get("kv_router_config") or {}
    if "shared_cache_multiplier" in kv and "shared_cache_multiplier" not in new_kv:
        return "router config"
    if "source_path" not in old_card and "source_path" in new_card:
        return "no source_path"
    return None


def test_mixed_version_fleets_blend_or_flip_as_the_operations_guide_says() -> None:
    """Per setup, does an older worker share the 1.6.1 worker's checksum (blend) or not (flip)."""
    by_variant: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    for record in RECORDS:
        # A LoRA record (a key suffix) never forms a cohort of its own: it rides on its
        # worker's base record.
        if record["frontend"] == "admitted" and len(record["key"].split("/")) == 4:
            by_variant[record["variant"]][record["version"]] = record
    table: Counter[tuple[str, str]] = Counter()
    unexplained = []
    for records in by_variant.values():
        newest = records.get("1.6.1")
        for version in VERSIONS[:-1]:
            if newest is None or version not in records:
                continue
            if records[version]["mdcsum"] == newest["mdcsum"]:
                table[(version, "blend")] += 1
                continue
            cause = flip_cause(records[version], newest)
            table[(version, f"flip: {cause}")] += 1
            if cause is None:
                unexplained.append((version, records[version]["variant"]))
    print("\nsame setup, older worker vs a 1.6.1 worker:", dict(sorted(table.items())))
    assert not unexplained, unexplained
    # The numbers in docs/operations.md, "Mixed-version rollouts".
    assert table == {
        ("1.6.0", "blend"): 72,
        ("1.5.1", "blend"): 33,
        ("1.5.1", "flip: router config"): 34,
        ("1.5.1", "flip: no source_path"): 4,
        ("1.4.2", "blend"): 28,
        ("1.4.2", "flip: router config"): 34,
        ("1.4.2", "flip: no source_path"): 9,
    }


def test_a_worker_that_self_hosts_its_metadata_never_blends_with_one_that_does_not() -> None:
    # The self-hosting worker lists the model directory's other files in extra_files, which
    # the checksum covers.
    checksums = {(r["version"], r["variant"]): r["mdcsum"] for r in RECORDS}
    pairs = [
        (version, variant.removesuffix("-hosted"))
        for version, variant in checksums
        if variant.endswith("-hosted") and (version, variant.removesuffix("-hosted")) in checksums
    ]
    assert len(pairs) >= 4 * 20
    same = [p for p in pairs if checksums[p] == checksums[(p[0], p[1] + "-hosted")]]
    assert not same
