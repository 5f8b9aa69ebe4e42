"""The heal decisions every bridge shares: when the bucket was lost, and what to write again."""

from __future__ import annotations

import pytest
from workerset_admission.mirror import (
    BucketMark,
    BucketValue,
    heal_reason,
    healed_mirror,
    reconciled_mirror,
)

BASE = BucketMark(existed=True, created="t0", last_seq=10, connections=1)


def _mark(**changes: object) -> BucketMark:
    fields = {
        "existed": BASE.existed,
        "created": BASE.created,
        "last_seq": BASE.last_seq,
        "written_seq": BASE.written_seq,
        "connections": BASE.connections,
    }
    fields.update(changes)
    return BucketMark(**fields)  # type: ignore[arg-type]


def test_an_unchanged_bucket_needs_no_healing() -> None:
    assert heal_reason(BASE, _mark(last_seq=25, written_seq=25)) is None


def test_the_first_mark_compares_with_nothing() -> None:
    assert heal_reason(None, _mark(last_seq=0)) is None


@pytest.mark.parametrize(
    ("now", "reason"),
    [
        (_mark(existed=False, created="t1", last_seq=0), "gone"),
        (_mark(created="t1", last_seq=30), "re-created"),
        (_mark(last_seq=4), "went back"),
        (_mark(last_seq=12, written_seq=14), "went back"),
        (_mark(connections=2), "re-established"),
    ],
    ids=["gone", "new creation time", "lower sequence", "below own writes", "reconnect"],
)
def test_a_lost_replaced_or_reconnected_bucket_is_healed(now: BucketMark, reason: str) -> None:
    said = heal_reason(BASE, now)
    assert said is not None
    assert reason in said


def test_a_bucket_found_gone_is_healed_even_at_the_first_mark() -> None:
    assert heal_reason(None, _mark(existed=False)) is not None


def test_keys_the_bucket_lost_are_forgotten_so_they_are_written_again() -> None:
    desired = {"a": b"1", "b": b"2"}
    mirrored: dict[str, bytes | None] = {"a": b"1", "b": b"2"}
    held = {"a": BucketValue(b"1", owned=True)}

    assert reconciled_mirror(desired, mirrored, held, prune=True) == {"a": b"1"}


def test_a_wiped_bucket_leaves_nothing_remembered() -> None:
    assert reconciled_mirror({"a": b"1"}, {"a": b"1"}, {}, prune=True) == {}


def test_a_remembered_key_holding_another_value_keeps_the_value_the_bucket_holds() -> None:
    held = {"a": BucketValue(b"changed", owned=False)}

    assert reconciled_mirror({"a": b"1"}, {"a": b"1"}, held, prune=True) == {"a": b"changed"}


def test_an_owned_key_no_longer_wanted_is_remembered_so_it_is_deleted_only_when_pruning() -> None:
    held = {"old": BucketValue(b"x", owned=True)}

    assert reconciled_mirror({}, {}, held, prune=True) == {"old": b"x"}
    assert reconciled_mirror({}, {}, held, prune=False) == {}


def test_another_writers_key_is_never_claimed_unless_it_holds_exactly_what_is_wanted() -> None:
    held = {
        "theirs": BucketValue(b"their value", owned=False),
        "same": BucketValue(b"wanted", owned=False),
        "differs": BucketValue(b"their value", owned=False),
    }
    desired = {"same": b"wanted", "differs": b"wanted"}

    # "differs" is left out, so the bridge's diff puts the value its own store holds.
    assert reconciled_mirror(desired, {}, held, prune=True) == {"same": b"wanted"}


def test_a_delete_still_owed_is_kept_even_when_the_reading_does_not_show_the_key() -> None:
    mirrored: dict[str, bytes | None] = {"gone from the store": b"1", "kept": b"2"}

    memory = reconciled_mirror({"kept": b"2"}, mirrored, {}, prune=True)

    assert memory == {"gone from the store": b"1"}


def test_healing_names_in_order_the_wanted_keys_the_bucket_lost() -> None:
    desired = {"b": b"2", "a": b"1", "kept": b"3"}
    mirrored: dict[str, bytes | None] = {"b": b"2", "a": b"1", "kept": b"3"}
    held = {"kept": BucketValue(b"3", owned=True)}

    healed = healed_mirror(desired, mirrored, held, prune=True)

    assert healed.memory == {"kept": b"3"}
    assert healed.lost == ("a", "b")


def test_a_key_holding_another_value_or_no_longer_wanted_is_not_counted_as_lost() -> None:
    desired = {"changed": b"1", "new": b"2"}
    mirrored: dict[str, bytes | None] = {"changed": b"1", "owed delete": b"x"}
    held = {"changed": BucketValue(b"other", owned=False)}

    healed = healed_mirror(desired, mirrored, held, prune=True)

    # "new" was never written and "owed delete" is no longer wanted: neither was lost.
    assert healed.memory == {"changed": b"other", "owed delete": b"x"}
    assert healed.lost == ()
