"""A namespace record of held workers only: peers read whom a hold waits for, nobody else does.

A tenure held after an outage with nobody served keeps its group entry with no members and the
hold's workers under ``held``. Its frontend routes to none of them, so the drain, the gate and
the last-worker check read such a record as they read no record at all.
"""

from __future__ import annotations

import json

from support.drains import worker
from test_drain_silent_answers import MODEL, capability, heartbeat, members, parsed
from workerset_admission.card.serving_record import LIVENESS_HEARTBEAT, NamespaceRecord, RawEntry
from workerset_admission.rollout.drain import Worker, check_drained, check_last_workers
from workerset_admission.rollout.frontends import watched_namespaces
from workerset_admission.rollout.gate import evaluate_gate, expand_checksum

HELD_CHECKSUM = "abcdef0123456789"


def held(frontend: str, namespace: str, *instances: int) -> RawEntry:
    keys = [f"{namespace}/backend/generate/{i:x}" for i in instances]
    group = {
        "model": MODEL,
        "worker_set": "[]",
        "checksum": HELD_CHECKSUM,
        "generation": 2,
        "members": [],
        "held": keys,
    }
    value = {
        "protocol": "v1",
        "frontend": frontend,
        "namespace": namespace,
        "members": [],
        "groups": [group],
        "liveness": LIVENESS_HEARTBEAT,
    }
    return RawEntry(f"v1.{frontend}.members.{namespace}", json.dumps(value).encode(), 990.0)


def test_a_record_of_held_workers_only_says_so_and_one_with_members_does_not() -> None:
    (record,) = parsed([held("fe-1", "dgd", 1, 2)])
    assert isinstance(record, NamespaceRecord)
    assert record.held_only
    (served,) = parsed([members("fe-1", "dgd", 1)])
    assert isinstance(served, NamespaceRecord)
    assert not served.held_only


def test_a_drain_of_held_workers_is_confirmed_by_a_live_or_silent_frontend() -> None:
    for beat in ([heartbeat("fe-1")], []):
        records = parsed([*beat, capability("fe-1"), held("fe-1", "dgd", 1, 2)])
        check = check_drained(records, [Worker("dgd", 1), Worker("dgd", 2)])
        (fe,) = check.frontends
        assert fe.silent == (not beat)
        assert fe.confirmed
        assert check.safe


def test_a_namespace_with_held_workers_only_is_watched_by_no_frontend() -> None:
    records = parsed(
        [heartbeat("fe-1"), capability("fe-1"), held("fe-1", "dgd", 1), members("fe-1", "x", 3)]
    )
    assert watched_namespaces(records) == {"fe-1": frozenset({"x"})}


def test_the_gate_reads_a_held_tenure_as_serving_nothing() -> None:
    records = parsed([heartbeat("fe-1"), capability("fe-1"), held("fe-1", "dgd", 1)])
    report = evaluate_gate(records, model=MODEL, namespace="dgd")
    assert not report.open
    (view,) = report.frontends
    assert not view.serving
    assert view.members == 0
    assert view.checksums == ()
    # A prefix of the held checksum names no configuration served: it stays as given.
    assert expand_checksum(records, MODEL, HELD_CHECKSUM[:8]) == HELD_CHECKSUM[:8]


def test_the_last_worker_check_judges_a_held_namespace_on_the_bucket() -> None:
    # The bucket serves worker 5 alone; fe-1 holds a tenure for worker 1, which is gone.
    entries = worker("dgd", 5, "10.0.0.5")
    records = parsed([heartbeat("fe-1"), capability("fe-1"), held("fe-1", "dgd", 1)])
    (emptied,) = check_last_workers(records, entries, [Worker("dgd", 5)])
    assert emptied.model == MODEL
    assert emptied.frontend is None
