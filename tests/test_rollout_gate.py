"""The rollout gate decides from serving-admission records alone."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from workerset_admission.card.serving_record import (
    CapabilityRecord,
    NamespaceRecord,
    Record,
    parse_record,
)
from workerset_admission.cli.serve import render_status_table
from workerset_admission.errors import InvalidRecordError, RemoteDataError
from workerset_admission.rollout.gate import disagreements_with, evaluate_gate, render_table

MODEL = "llama"
OLD = "prod-v1"
NEW = "prod-v2"
GOOD = "a" * 64
BAD = "b" * 64


def worker_set(namespace: str) -> str:
    return json.dumps([namespace, "backend", "generate", "chat|completions", "aggregated"])


def member(namespace: str, instance: int) -> str:
    return f"{namespace}/backend/generate/{instance:x}"


def served(
    frontend: str,
    namespace: str,
    *,
    checksum: str = GOOD,
    instances: tuple[int, ...] = (1, 2),
    model: str = MODEL,
    generation: int = 1,
    published_at: float | None = None,
) -> Record:
    members = [member(namespace, i) for i in instances]
    value = {
        "protocol": "v1",
        "frontend": frontend,
        "namespace": namespace,
        "members": members,
        "groups": [
            {
                "model": model,
                "worker_set": worker_set(namespace),
                "checksum": checksum,
                "generation": generation,
                "members": members,
            }
        ],
    }
    return parse_record(
        f"v1.{frontend}.members.{namespace}", json.dumps(value).encode(), published_at
    )


def present(frontend: str, published_at: float | None = None) -> Record:
    value = {"protocol": "v1", "capability": True, "frontend": frontend}
    return parse_record(f"v1.{frontend}.capability", json.dumps(value).encode(), published_at)


def gate(records: list[Record], **options: Any) -> Any:
    return evaluate_gate(records, model=MODEL, namespace=NEW, **options)


class TestParsing:
    def test_a_namespace_record_keeps_its_groups_and_members(self) -> None:
        record = served("fe-a", NEW)
        assert isinstance(record, NamespaceRecord)
        assert record.frontend == "fe-a"
        assert record.namespace == NEW
        assert record.members == (member(NEW, 1), member(NEW, 2))
        assert record.groups is not None
        assert [(g.model, g.checksum, g.generation) for g in record.groups] == [(MODEL, GOOD, 1)]

    def test_a_capability_record_only_says_the_frontend_is_there(self) -> None:
        record = present("fe-a")
        assert record == CapabilityRecord(key="v1.fe-a.capability", frontend="fe-a")

    def test_a_capability_record_may_say_when_its_frontend_resynced_after_an_outage(self) -> None:
        key = "v1.fe-a.capability"
        value = {"protocol": "v1", "capability": True, "frontend": "fe-a", "resynced_at": 17}
        record = parse_record(key, json.dumps(value).encode())
        assert record == CapabilityRecord(key=key, frontend="fe-a", resynced_at=17.0)
        for bad in ("soon", -1, True):
            value["resynced_at"] = bad
            with pytest.raises(InvalidRecordError) as refused:
                parse_record(key, json.dumps(value).encode())
            assert refused.value.reason == "bad_field"

    def test_a_members_only_record_takes_its_namespace_from_the_members(self) -> None:
        value = {"protocol": "v1", "frontend": "fe-a", "members": [member(NEW, 7)]}
        record = parse_record(f"v1.fe-a.members.{NEW}", json.dumps(value).encode())
        assert isinstance(record, NamespaceRecord)
        assert record.namespace == NEW
        assert record.groups is None

    @pytest.mark.parametrize(
        ("raw", "reason"),
        [
            (b"\xff\xfe", "not_json"),
            (b"{not json", "not_json"),
            (b"[1, 2]", "not_object"),
            (b'{"protocol": "v2", "frontend": "f", "members": []}', "protocol"),
            (b'{"protocol": "v1", "members": []}', "no_frontend"),
            (b'{"protocol": "v1", "frontend": "", "members": []}', "no_frontend"),
            (b'{"protocol": "v1", "frontend": "f", "members": "x"}', "bad_members"),
            (b'{"protocol": "v1", "frontend": "f", "members": [1]}', "bad_members"),
            (b'{"protocol": "v1", "frontend": "f", "members": [], "groups": {}}', "bad_group"),
            (
                b'{"protocol": "v1", "frontend": "f", "members": [], "groups": [{"model": "m",'
                b' "worker_set": "w", "generation": true}]}',
                "bad_group",
            ),
            (
                b'{"protocol": "v1", "frontend": "f", "members": [], "groups": [{"model": "",'
                b' "worker_set": "w"}]}',
                "bad_group",
            ),
            (b'{"protocol": "v1", "frontend": "f", "members": [], "namespace": 3}', "bad_field"),
            # A record under frontend f's key claiming another frontend, or namespace.
            (b'{"protocol": "v1", "frontend": "g", "members": []}', "identity_mismatch"),
            (b'{"protocol": "v1", "frontend": "f.g", "members": []}', "identity_mismatch"),
            (b'{"protocol": "v1", "frontend": "f", "capability": true}', "identity_mismatch"),
            (
                b'{"protocol": "v1", "frontend": "f", "members": [], "namespace": "other"}',
                "identity_mismatch",
            ),
            (b'{"protocol": "v1", "frontend": "f", "members": ["a/b/c/1"]}', "identity_mismatch"),
        ],
    )
    def test_bad_records_are_refused_with_a_reason_and_their_key(
        self, raw: bytes, reason: str
    ) -> None:
        with pytest.raises(InvalidRecordError) as refused:
            parse_record("v1.f.members.ns", raw)
        assert refused.value.reason == reason
        assert refused.value.key == "v1.f.members.ns"
        assert isinstance(refused.value, RemoteDataError)

    @pytest.mark.parametrize(
        "key",
        ["v1.fe-b.capability", "fe-a.capability", "v1.fe-a.members.ns", "v1.fe-a", "v1.fe-a.x"],
    )
    def test_a_capability_counts_only_under_its_own_frontends_key(self, key: str) -> None:
        value = b'{"protocol": "v1", "frontend": "fe-a", "capability": true}'
        with pytest.raises(InvalidRecordError) as refused:
            parse_record(key, value)
        assert refused.value.reason == "identity_mismatch"

    def test_forged_records_for_other_frontends_are_refused_and_leave_the_gate_closed(
        self,
    ) -> None:
        # Frontend fe-b (which may write only under v1.fe-b.) claims that fe-a serves the new
        # namespace, and that an invented frontend is live and serves it too.
        for frontend in ("fe-a", "invented"):
            claim = {"protocol": "v1", "frontend": frontend, "namespace": NEW}
            claim["members"] = [member(NEW, 1)]
            for key in (f"v1.fe-b.members.{NEW}", "v1.fe-b.capability"):
                with pytest.raises(InvalidRecordError) as refused:
                    parse_record(key, json.dumps(claim).encode())
                assert refused.value.reason == "identity_mismatch"
        # Only fe-a's own records count: it serves the old namespace, so the gate stays closed.
        report = gate([present("fe-a"), served("fe-a", OLD)])
        assert not report.open
        assert report.missing == ("fe-a",)


class TestGate:
    def test_opens_when_every_live_frontend_serves_the_new_namespace(self) -> None:
        report = gate([served("fe-a", NEW), served("fe-b", NEW), present("fe-b")])
        assert report.open
        assert report.serving == ("fe-a", "fe-b")
        assert report.missing == ()
        assert report.reasons == ()

    def test_stays_closed_while_one_live_frontend_lacks_the_new_namespace(self) -> None:
        report = gate([served("fe-a", NEW), served("fe-b", OLD), present("fe-c")])
        assert not report.open
        assert report.missing == ("fe-b", "fe-c")
        assert "fe-b, fe-c" in report.reasons[0]

    def test_is_closed_when_no_frontend_is_live(self) -> None:
        report = gate([])
        assert not report.open
        assert report.reasons == ("no live frontend publishes serving admissions",)

    def test_a_frontend_whose_records_expired_is_not_counted(self) -> None:
        # fe-b stopped publishing: the bucket no longer holds its records.
        before = gate([served("fe-a", NEW), served("fe-b", OLD)])
        after = gate([served("fe-a", NEW)])
        assert not before.open
        assert after.open
        assert after.live == ("fe-a",)

    def test_a_frontend_whose_newest_record_is_too_old_is_not_live(self) -> None:
        records = [
            served("fe-a", NEW, published_at=100.0),
            served("fe-b", OLD, published_at=10.0),
            present("fe-b", published_at=20.0),
        ]
        report = gate(records, now=105.0, stale_after=30.0)
        assert report.open
        assert report.stale == ("fe-b",)
        assert report.live == ("fe-a",)

    def test_a_fresh_capability_record_keeps_a_frontend_live(self) -> None:
        records = [
            served("fe-a", NEW, published_at=100.0),
            served("fe-b", OLD, published_at=10.0),
            present("fe-b", published_at=100.0),
        ]
        report = gate(records, now=105.0, stale_after=30.0)
        assert not report.open
        assert report.missing == ("fe-b",)

    def test_an_empty_worker_set_does_not_count_as_serving(self) -> None:
        report = gate([served("fe-a", NEW, instances=())])
        assert not report.open
        assert report.missing == ("fe-a",)

    def test_another_model_in_the_new_namespace_does_not_count(self) -> None:
        report = gate([served("fe-a", NEW, model="mistral")])
        assert not report.open

    def test_frontends_still_serving_the_previous_generation_are_listed_but_do_not_block(
        self,
    ) -> None:
        records = [served("fe-a", NEW), served("fe-a", OLD), served("fe-b", NEW)]
        report = gate(records)
        assert report.open
        assert report.previous == ("fe-a",)
        assert report.frontends[0].previous_namespaces == (OLD,)

    def test_previous_generations_can_be_limited_to_named_namespaces(self) -> None:
        records = [served("fe-a", NEW), served("fe-a", OLD), served("fe-a", "canary")]
        report = gate(records, previous_namespaces=[OLD])
        assert report.frontends[0].previous_namespaces == (OLD,)

    def test_a_disagreement_on_the_incumbent_is_reported_and_open_by_default(self) -> None:
        records = [served("fe-a", NEW), served("fe-b", NEW), served("fe-c", NEW, checksum=BAD)]
        report = gate(records)
        assert report.open
        assert len(report.disagreements) == 1
        assert report.disagreements[0].worker_set == worker_set(NEW)
        assert report.disagreements[0].incumbents == ((GOOD, ("fe-a", "fe-b")), (BAD, ("fe-c",)))

    def test_a_disagreement_closes_the_gate_when_agreement_is_required(self) -> None:
        records = [served("fe-a", NEW), served("fe-c", NEW, checksum=BAD)]
        report = gate(records, require_agreement=True)
        assert not report.open
        # It says which frontends serve which configuration.
        assert report.reasons == (
            f"frontends disagree on the incumbent of {worker_set(NEW)}: "
            f"fe-a serves {GOOD[:12]}; fe-c serves {BAD[:12]}",
        )

    def test_an_expected_checksum_only_counts_frontends_with_that_incumbent(self) -> None:
        records = [served("fe-a", NEW), served("fe-c", NEW, checksum=BAD)]
        report = gate(records, expected_checksum=GOOD)
        assert not report.open
        assert report.missing == ("fe-c",)

    def test_a_members_only_record_serves_by_namespace_with_the_model_unverified(self) -> None:
        value = {"protocol": "v1", "frontend": "fe-a", "members": [member(NEW, 1)]}
        record = parse_record(f"v1.fe-a.members.{NEW}", json.dumps(value).encode())
        report = gate([record])
        assert report.open
        assert not report.frontends[0].model_verified
        assert not gate([record], expected_checksum=GOOD).open

    def test_the_answer_does_not_depend_on_record_order(self) -> None:
        records = [
            served("fe-a", NEW),
            served("fe-b", OLD),
            served("fe-c", NEW, checksum=BAD),
            present("fe-d"),
        ]
        answers = {json.dumps(gate(list(p)).as_json()) for p in itertools.permutations(records)}
        assert len(answers) == 1

    def test_refused_records_are_carried_into_the_report(self) -> None:
        report = gate([served("fe-a", NEW)], invalid=[("junk", "not_json")])
        assert report.as_json()["invalid"] == [{"key": "junk", "reason": "not_json"}]


def test_the_table_names_the_state_every_frontend_and_the_disagreement() -> None:
    report = gate([served("fe-a", NEW), served("fe-b", OLD), served("fe-c", NEW, checksum=BAD)])
    table = render_table(report)
    assert "gate: CLOSED" in table
    for frontend in ("fe-a", "fe-b", "fe-c"):
        assert frontend in table
    assert "disagreement on" in table
    assert BAD in table


# --- properties over arbitrary fleets ------------------------------------------------------------

FRONTENDS = ("fe-a", "fe-b", "fe-c", "fe-d")
NAMESPACES = (OLD, NEW, "canary")


@st.composite
def fleets(draw: st.DrawFn) -> list[Record]:
    records: list[Record] = []
    for frontend in draw(st.lists(st.sampled_from(FRONTENDS), unique=True, max_size=4)):
        if draw(st.booleans()):
            records.append(present(frontend))
        namespaces = draw(st.lists(st.sampled_from(NAMESPACES), unique=True, max_size=3))
        records.extend(
            served(
                frontend,
                namespace,
                checksum=draw(st.sampled_from((GOOD, BAD))),
                instances=tuple(draw(st.sets(st.integers(1, 4), max_size=2))),
                model=draw(st.sampled_from((MODEL, "mistral"))),
            )
            for namespace in namespaces
        )
    return records


@given(fleets())
def test_the_gate_is_open_exactly_when_every_live_frontend_serves(records: list[Record]) -> None:
    report = gate(records)
    assert set(report.live) == {record.frontend for record in records}
    assert set(report.serving) | set(report.missing) == set(report.live)
    assert report.open == (bool(report.live) and not report.missing)


@given(fleets(), st.sampled_from(FRONTENDS))
def test_a_frontend_going_away_never_closes_an_open_gate(
    records: list[Record], leaving: str
) -> None:
    remaining = [record for record in records if record.frontend != leaving]
    if gate(records).open and remaining:
        assert gate(remaining).open


@given(fleets(), st.sampled_from(FRONTENDS))
def test_a_frontend_that_serves_nothing_keeps_the_gate_closed(
    records: list[Record], newcomer: str
) -> None:
    others = [record for record in records if record.frontend != newcomer]
    assert not gate([*others, present(newcomer)]).open


@given(fleets())
def test_stricter_questions_never_open_a_closed_gate(records: list[Record]) -> None:
    plain = gate(records).open
    assert not (gate(records, expected_checksum=GOOD).open and not plain)
    assert not (gate(records, require_agreement=True).open and not plain)


def test_a_frontend_learns_which_peers_serve_another_configuration_of_its_groups() -> None:
    group = (MODEL, worker_set(NEW))
    records = [
        served("fe-1", NEW, checksum=GOOD),  # this frontend's own, older record: not read
        served("fe-2", NEW, checksum=BAD),
        served("fe-3", NEW, checksum=BAD),
        served("fe-4", NEW, checksum=GOOD),
        served("fe-5", NEW, checksum=BAD, instances=()),  # serving nobody: no configuration
        present("fe-6"),
    ]
    (found,) = disagreements_with(records, "fe-1", {group: GOOD})
    assert found.worker_set == worker_set(NEW)
    assert found.incumbents == ((GOOD, ("fe-1", "fe-4")), (BAD, ("fe-2", "fe-3")))
    assert found.in_words() == f"fe-1, fe-4 serve {GOOD[:12]}; fe-2, fe-3 serve {BAD[:12]}"
    agreeing = [served("fe-4", NEW, checksum=GOOD), served("fe-2", OLD, checksum=BAD)]
    assert disagreements_with(agreeing, "fe-1", {group: GOOD}) == ()


def test_the_status_table_says_which_frontends_serve_which_configuration() -> None:
    (found,) = disagreements_with(
        [served("fe-2", NEW, checksum=BAD)], "fe-1", {(MODEL, worker_set(NEW)): GOOD}
    )
    table = render_status_table({"groups": [], "disagreements": [found.as_json()]})
    assert f"disagreement on {worker_set(NEW)}: fe-1 serves {GOOD[:12]}; fe-2 serves" in table


def test_min_members_keeps_the_gate_closed_until_every_frontend_has_that_capacity() -> None:
    from support.drains import served

    one = [served("fe-1", "v2", 1), served("fe-2", "v2", 1, 2)]
    assert evaluate_gate(one, model="tiny", namespace="v2").open
    closed = evaluate_gate(one, model="tiny", namespace="v2", min_members=2)
    assert not closed.open
    assert closed.missing == ("fe-1",)
    assert "with at least 2 members" in closed.reasons[0]
    both = [served("fe-1", "v2", 1, 2), served("fe-2", "v2", 1, 2)]
    assert evaluate_gate(both, model="tiny", namespace="v2", min_members=2).open
