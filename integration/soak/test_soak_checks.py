"""The soak's checks on made-up states: each broken invariant, repeated line and leak is found."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from soak.checks import read_view, repeated_lines, violations
from soak.leaks import Sample, growth, summary
from soak.workload import Fleet


def _fleet(tmp_path: Path) -> Fleet:
    fleet = Fleet(tmp_path / "store", groups=1)
    for _ in range(2):
        fleet.join(0, "A")
    return fleet


def _status(frontend: str, members: list[int], admitted: list[int] | None = None) -> dict[str, Any]:
    group = {
        "namespace": "soak-0",
        "incumbent": "checksum" if members else None,
        "cohorts": [{"checksum": "checksum", "members": members}] if members else [],
        "admitted": members if admitted is None else admitted,
    }
    return {"frontend": frontend, "groups": [group]}


def _agreeing(fleet: Fleet) -> tuple[dict[str, Any], dict[str, Any]]:
    ids = sorted(w.instance_id for w in fleet.live(0) if w.config == "A")
    views = {f: {"soak-0": dict.fromkeys(ids, 16)} for f in ("fe-0", "fe-1")}
    statuses = {f: _status(f, ids) for f in ("fe-0", "fe-1")}
    return views, statuses


def test_a_consistent_state_breaks_nothing(tmp_path: Path) -> None:
    fleet = _fleet(tmp_path)
    assert violations(fleet, *_agreeing(fleet)) == []


def test_each_broken_invariant_is_named(tmp_path: Path) -> None:
    fleet = _fleet(tmp_path)
    first, second = sorted(fleet.workers)
    rival = fleet.join(0, "B").instance_id

    views, statuses = _agreeing(fleet)
    fleet.workers[first].drained = True
    assert violations(fleet, views, statuses) == [
        f"fe-0: card {first:x} of soak-0 belongs to a drained worker",
        f"fe-1: card {first:x} of soak-0 belongs to a drained worker",
    ]
    fleet.workers[first].drained = False

    views, statuses = _agreeing(fleet)
    views["fe-1"]["soak-0"][rival] = 32
    statuses["fe-1"]["groups"][0]["admitted"].append(rival)
    found = violations(fleet, views, statuses)
    assert "fe-1: view holds two configurations of soak-0: ['16', '32']" in found

    views, statuses = _agreeing(fleet)
    statuses["fe-1"] = _status("fe-1", [rival])
    found = violations(fleet, views, statuses)
    assert any(f.startswith("frontends disagree on the incumbent of soak-0") for f in found)

    views, statuses = _agreeing(fleet)
    views["fe-0"] = {}
    assert violations(fleet, views, statuses) == [
        f"fe-0: no card of soak-0, which has live undrained workers "
        f"{first:x}, {second:x}, {rival:x}"
    ]

    views, statuses = _agreeing(fleet)
    statuses["fe-0"]["groups"][0]["admitted"] = [second]
    assert violations(fleet, views, statuses) == [
        f"fe-0: card {first:x} of soak-0 is not admitted in that frontend's status"
    ]

    views, statuses = _agreeing(fleet)
    fleet.leave(fleet.workers[first])
    found = violations(fleet, views, statuses)
    assert f"fe-0: card {first:x} of soak-0 belongs to a gone worker" in found


def test_an_incumbent_with_no_live_worker_is_a_missed_succession(tmp_path: Path) -> None:
    fleet = _fleet(tmp_path)
    old = sorted(fleet.workers)
    rival = fleet.join(0, "B").instance_id
    for instance in old:
        fleet.leave(fleet.workers[instance])
    views = {f: {"soak-0": {rival: 32}} for f in ("fe-0", "fe-1")}
    statuses = {f: _status(f, [rival]) for f in ("fe-0", "fe-1")}
    assert violations(fleet, views, statuses) == []

    statuses["fe-0"] = _status("fe-0", old, admitted=[rival])
    found = violations(fleet, views, statuses)
    assert "fe-0: incumbent of soak-0 is A, live configurations ['B']" in found


def test_the_view_is_read_from_dynamo_file_names_and_cards(tmp_path: Path) -> None:
    fleet = _fleet(tmp_path)
    view = read_view(fleet.store)
    assert view == {"soak-0": dict.fromkeys(fleet.workers, 16)}


def _line(at: float, message: str, level: str = "WARNING") -> str:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))
    return f"{stamp},{int(at % 1 * 1000):03d} {level} some.logger {message}"


def test_a_warning_repeated_within_one_fault_is_found_and_once_per_fault_is_not() -> None:
    t0 = float(int(time.time()))
    episodes = [t0, t0 + 10]
    once_each = "\n".join([_line(t0 + 1, "lost NATS"), _line(t0 + 11, "lost NATS")])
    assert repeated_lines(once_each, episodes, "fe-1") == []
    # A restarted process saying it again is its first time.
    restarted = "\n".join(
        [_line(t0 + 1, "lost NATS"), "--- start 2 at 1", _line(t0 + 2, "lost NATS")]
    )
    assert repeated_lines(restarted, episodes, "fe-1") == []
    twice = "\n".join([_line(t0 + 1, "could not write x"), _line(t0 + 2, "could not write x")])
    assert repeated_lines(twice, episodes, "fe-1") == [
        "fe-1: logged 2 times in one fault episode: WARNING some.logger could not write x"
    ]
    # Interleaved with other warnings it is still a flood.
    flood = [_line(t0 + 1 + i / 10, f"could not remove {name}") for i in range(3) for name in "ab"]
    assert len(repeated_lines("\n".join(flood), episodes, "fe-1")) == 2
    # Refused, written, refused again: two occurrences, each logged once.
    flapping = "\n".join(
        [
            _line(t0 + 1, "could not save x"),
            _line(t0 + 2, "saved x after 1 failed attempt(s)", "INFO"),
            _line(t0 + 3, "could not save x"),
        ]
    )
    assert repeated_lines(flapping, episodes, "fe-1") == []


def test_growth_is_the_second_halfs_fitted_rise_over_its_mean() -> None:
    flat = [(float(t), 100.0 + (t % 2)) for t in range(20)]
    rising = [(float(t), 100.0 + t) for t in range(20)]
    assert abs(growth(flat) or 0) < 0.01
    assert growth(rising) == 9 / 114.5
    assert growth(rising[:4]) is None
    # A request in flight holding one subscription at the last sample is not a leak.
    spike = [(float(t), 5.0 + (t == 19)) for t in range(20)]
    assert growth(spike) == 0.0


def test_the_summary_gives_each_figure_of_each_process() -> None:
    samples = [Sample("fe-0", float(t), 50.0, 10, 24, 2, 5 + t) for t in range(10)]
    figures = summary(samples)["fe-0"]
    assert figures["rss_mb"]["second_half_growth"] == 0.0
    assert figures["subscriptions"]["first"] == 5.0
    assert figures["subscriptions"]["second_half_growth"] > 0.05
