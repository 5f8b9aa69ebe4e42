"""A frontend whose writer fell silent routes by its last view: the drain and the gate count it."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Sequence

from support.drains import worker
from test_drain_cli import MemoryStore
from workerset_admission import cli
from workerset_admission.card.serving_record import (
    LIVENESS_HEARTBEAT,
    RawEntry,
    Record,
    parse_record,
    routing_records,
)
from workerset_admission.cli.drain import run_drain
from workerset_admission.keys import drain_kv_key
from workerset_admission.rollout.drain import Worker, check_drained, gone_unconfirmed
from workerset_admission.rollout.frontends import silent_frontends
from workerset_admission.rollout.gate import evaluate_gate, render_table

MODEL = "tiny"


def heartbeat(frontend: str) -> RawEntry:
    value = {"protocol": "v1", "frontend": frontend, "heartbeat": True, "view_outlives": 660}
    return RawEntry(f"v1.{frontend}.heartbeat", json.dumps(value).encode(), 1000.0)


def capability(frontend: str, routes_for: float | None = 780.0) -> RawEntry:
    value: dict[str, object] = {
        "protocol": "v1",
        "capability": True,
        "frontend": frontend,
        "liveness": LIVENESS_HEARTBEAT,
    }
    if routes_for is not None:
        value["routes_for"] = routes_for
    return RawEntry(f"v1.{frontend}.capability", json.dumps(value).encode(), 1000.0)


def members(frontend: str, namespace: str, *instances: int) -> RawEntry:
    keys = [f"{namespace}/backend/generate/{i:x}" for i in instances]
    value = {
        "protocol": "v1",
        "frontend": frontend,
        "namespace": namespace,
        "members": keys,
        "groups": [{"model": MODEL, "worker_set": "[]", "checksum": "c", "members": keys}],
        "liveness": LIVENESS_HEARTBEAT,
    }
    return RawEntry(f"v1.{frontend}.members.{namespace}", json.dumps(value).encode(), 990.0)


def unpublished(frontend: str, namespace: str) -> RawEntry:
    value = {
        "protocol": "v1",
        "frontend": frontend,
        "namespace": namespace,
        "members": [],
        "unpublished": 1_200_000,
        "liveness": LIVENESS_HEARTBEAT,
    }
    return RawEntry(f"v1.{frontend}.members.{namespace}", json.dumps(value).encode(), 990.0)


def parsed(entries: Sequence[RawEntry]) -> list[Record]:
    return [parse_record(e.key, e.value, e.published_at) for e in entries]


def drain(store: MemoryStore, *argv: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    args = cli.build_parser().parse_args(["drain", *argv])
    status = asyncio.run(run_drain(args, store, out, err, environ={}))
    return status, out.getvalue() + err.getvalue()


LISTING = [*worker("dgd", 1, "h1"), *worker("dgd", 2, "h2")]
WAIT = ("--wait", "--interval", "0.02", "--timeout", "0.5")


def test_a_frontend_with_no_heartbeat_and_a_lease_on_its_view_is_silent_and_not_confirmed() -> None:
    records = parsed([capability("fe-1"), members("fe-1", "dgd", 1, 2)])
    assert silent_frontends(records) == {"fe-1": 1780.0}
    check = check_drained(records, [Worker("dgd", 1)])
    (fe,) = check.frontends
    assert fe.silent
    assert not fe.confirmed
    assert fe.still_serving == ("dgd/backend/generate/1",)
    # Every live frontend let go (there is none), but the silent one still routes: not safe.
    assert check.settled
    assert not check.safe
    assert check.silent_routing == ("fe-1",)
    # Its last view does not hold worker 3: for that one it is confirmed.
    assert check_drained(records, [Worker("dgd", 3)]).safe


def test_without_a_lease_a_frontend_with_no_heartbeat_is_gone_as_before() -> None:
    records = parsed([capability("fe-1", routes_for=None), members("fe-1", "dgd", 1)])
    assert routing_records(records) == []
    assert check_drained(records, [Worker("dgd", 1)]).frontends == ()


def test_a_frontend_whose_lease_ran_out_let_go_and_one_without_a_lease_is_unconfirmed() -> None:
    leased = parsed([heartbeat("fe-1"), capability("fe-1"), members("fe-1", "dgd", 1)])
    bare = parsed([heartbeat("fe-2"), capability("fe-2", None), members("fe-2", "dgd", 1)])
    # Both leave the bucket: fe-1's lease was removed by the server (its view expired).
    assert gone_unconfirmed([*leased, *bare], [], confirmed=()) == ("fe-2",)
    # A lease seen during the wait counts as well as one seen at the start.
    assert gone_unconfirmed(bare, [], confirmed=(), leased={"fe-2"}) == ()


def test_drain_wait_never_answers_safe_while_a_silent_frontends_view_holds_the_worker() -> None:
    store = MemoryStore(
        LISTING, [heartbeat("fe-1"), capability("fe-1"), members("fe-1", "dgd", 1, 2)]
    )
    # serve was killed: its heartbeat expired, its lease and its last records stay.
    store.later = [capability("fe-1"), members("fe-1", "dgd", 1, 2)]
    status, said = drain(store, "1", *WAIT)
    assert status == cli.EXIT_UNCONFIRMED
    assert "could not confirm: fe-1 fell silent" in said
    assert "silent, still routing by its last view: fe-1" in said
    assert drain_kv_key("dgd", 1) in store.kv  # the drain stays in place


def test_a_drain_begun_while_the_frontend_is_silent_waits_for_it_too() -> None:
    silent = [capability("fe-1"), members("fe-1", "dgd", 1, 2)]
    store = MemoryStore(LISTING, silent)
    status, said = drain(store, "1", *WAIT, "--json")
    assert status == cli.EXIT_UNCONFIRMED
    answer = json.loads(said[: said.index("\n}") + 2])
    assert answer["safe"] is False
    assert answer["silent_routing"] == ["fe-1"]
    assert answer["frontends"][0]["routes_until"] == 1780.0


def test_a_silent_frontend_that_comes_back_and_lets_go_confirms_the_drain() -> None:
    store = MemoryStore(LISTING, [capability("fe-1"), members("fe-1", "dgd", 1, 2)])
    # serve restarted: its heartbeat is back and its records no longer list worker 1.
    store.later = [heartbeat("fe-1"), capability("fe-1"), members("fe-1", "dgd", 2)]
    status, said = drain(store, "1", *WAIT)
    assert status == cli.EXIT_OK
    assert "safe to stop" in said


def test_a_silent_frontend_whose_lease_runs_out_no_longer_routes() -> None:
    store = MemoryStore(LISTING, [capability("fe-1"), members("fe-1", "dgd", 1, 2)])
    store.later = [members("fe-1", "dgd", 1, 2)]  # the server removed the lease: view expired
    status, said = drain(store, "1", *WAIT)
    assert status == cli.EXIT_OK, said


def test_allow_unconfirmed_counts_a_silent_frontend_as_let_go() -> None:
    store = MemoryStore(LISTING, [capability("fe-1"), members("fe-1", "dgd", 1, 2)])
    status, said = drain(store, "1", *WAIT, "--allow-unconfirmed")
    assert status == cli.EXIT_OK, said


def test_a_record_too_large_to_publish_is_a_frontend_that_has_not_confirmed() -> None:
    records = parsed([heartbeat("fe-1"), capability("fe-1"), unpublished("fe-1", "dgd")])
    check = check_drained(records, [Worker("dgd", 1)])
    (fe,) = check.frontends
    assert not fe.confirmed
    assert not fe.silent
    assert "too large to publish" in fe.still_serving[0]
    assert check_drained(records, [Worker("other", 1)]).safe
    # Live with the marker: still routed to at the timeout (status 1), never safe.
    store = MemoryStore(
        LISTING,
        [heartbeat("fe-1"), capability("fe-1"), members("fe-1", "dgd", 1, 2)],
    )
    store.later = [heartbeat("fe-1"), capability("fe-1"), unpublished("fe-1", "dgd")]
    status, said = drain(store, "1", *WAIT)
    assert status == cli.EXIT_NO, said
    # Silent with the marker: could not confirm (status 7).
    store = MemoryStore(LISTING, [capability("fe-1"), members("fe-1", "dgd", 1, 2)])
    store.later = [capability("fe-1"), unpublished("fe-1", "dgd")]
    assert drain(store, "1", *WAIT)[0] == cli.EXIT_UNCONFIRMED


def test_the_gate_counts_a_silent_frontend_on_its_last_view() -> None:
    live = [heartbeat("fe-1"), capability("fe-1"), members("fe-1", "new", 3)]
    silent = [capability("fe-2"), members("fe-2", "old", 1)]
    report = evaluate_gate(parsed([*live, *silent]), model=MODEL, namespace="new")
    assert not report.open
    assert report.missing == ("fe-2",)
    assert "fe-2 (silent: routing by its last view)" in report.reasons[0]
    assert "fe-2 (silent)" in render_table(report)
    # Its lease gone, it no longer routes: the gate opens on the live one.
    gone = [members("fe-2", "old", 1)]
    assert evaluate_gate(parsed([*live, *gone]), model=MODEL, namespace="new").open


def test_the_json_of_a_silent_frontend_says_so_and_a_live_ones_is_unchanged() -> None:
    live = [heartbeat("fe-1"), capability("fe-1"), members("fe-1", "new", 3)]
    silent = [capability("fe-2"), members("fe-2", "new", 1)]
    report = evaluate_gate(parsed([*live, *silent]), model=MODEL, namespace="new")
    shown = {f["frontend"]: f for f in report.as_json()["frontends"]}
    assert "silent" not in shown["fe-1"]
    assert shown["fe-2"]["silent"] is True
    check = check_drained(parsed([*live, *silent]), [Worker("new", 1)])
    by_frontend = {f["frontend"]: f for f in check.as_json()["frontends"]}
    assert set(by_frontend["fe-1"]) == {"frontend", "confirmed", "still_serving"}
    assert by_frontend["fe-2"]["silent"] is True
    assert by_frontend["fe-2"]["routes_until"] == 1780.0
