"""Write the tenure-hold traces in ``tests/golden/hold`` (run by hand, review the diff).

Each trace is one rule of the hold (``plugin/CONTRACT.md``, "Refinements across outages"):
what a hold serves while it lasts, what ends it, and that it delays a decision without
changing it. ``python tests/golden/make_hold_traces.py`` rewrites every ``<name>.jsonl`` and its
replay output ``<name>.expected.json`` (default settings: a 30 s hold, a 10 s registration TTL);
``tests/golden/test_hold_traces.py`` replays them byte for byte.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from make_controller_traces import EP, GID, SPEC, add, build, remove, tick
from workerset_admission.traces.replay import render, replay

OUT = Path(__file__).with_name("hold")
Event = dict[str, Any]
del SPEC, remove  # the shared builders this module does not use


def reconnect(*entries: tuple[int, str]) -> Event:
    """A listing after a lost connection holding only these (instance, spec) records."""
    listed = [add(i, spec) for i, spec in entries]
    return {
        "kind": "snapshot",
        "reason": "reconnect",
        "entries": [{"key": e["key"], "value": e["value"]} for e in listed],
    }


def expire(instance_id: int) -> Event:
    return {"kind": "delete", "key": add(instance_id)["key"], "operation": "expired"}


def a_new_instance_during_a_hold_is_tracked_and_joins_the_end_on_expiry() -> list[Event]:
    return [add(1), add(2, "first"), reconnect((2, "first")), tick(5), add(7), tick(25)]


def a_pre_hold_member_returning_ends_the_hold_in_the_same_tenure() -> list[Event]:
    return [add(1), add(3), add(2, "first"), reconnect((2, "first")), tick(5), add(1), tick(30)]


def a_new_instance_and_a_returning_member_join_the_incumbent_together() -> list[Event]:
    return [add(1), add(2, "first"), reconnect((2, "first")), tick(2), add(7), tick(3), add(1)]


def within_one_ttl_the_last_known_members_stay_admitted() -> list[Event]:
    return [add(1), add(3), add(2, "first"), reconnect((2, "first")), tick(9)]


def after_one_ttl_nobody_is_admitted_and_the_tenure_is_still_held() -> list[Event]:
    return [add(1), add(3), add(2, "first"), reconnect((2, "first")), tick(10)]


def an_expiry_after_a_reconnect_holds_only_until_the_reconnect_plus_the_hold() -> list[Event]:
    return [
        add(1),
        add(2, "first"),
        tick(100),
        reconnect((1, "spec"), (2, "first")),
        tick(25),
        expire(1),
        tick(4),
    ]


def a_retry_pending_when_a_hold_begins_waits_for_a_member() -> list[Event]:
    return [add(1), build("failed", GID), reconnect(), tick(6)]


TRACES: list[Callable[[], list[Event]]] = [
    a_new_instance_during_a_hold_is_tracked_and_joins_the_end_on_expiry,
    a_pre_hold_member_returning_ends_the_hold_in_the_same_tenure,
    a_new_instance_and_a_returning_member_join_the_incumbent_together,
    within_one_ttl_the_last_known_members_stay_admitted,
    after_one_ttl_nobody_is_admitted_and_the_tenure_is_still_held,
    an_expiry_after_a_reconnect_holds_only_until_the_reconnect_plus_the_hold,
    a_retry_pending_when_a_hold_begins_waits_for_a_member,
]


def main() -> None:
    OUT.mkdir(exist_ok=True)
    assert EP.namespace == "namespace"
    for build_trace in TRACES:
        name = build_trace.__name__
        lines = [json.dumps(e, ensure_ascii=False, separators=(",", ":")) for e in build_trace()]
        (OUT / f"{name}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
        (OUT / f"{name}.expected.json").write_text(render(replay(lines)), encoding="utf-8")


if __name__ == "__main__":
    main()
