"""The drain's pure answers: which workers a selection names, and whether a model stays served."""

from __future__ import annotations

import dataclasses
import json
import logging

import pytest
from support.drains import MODEL, adapter, card, endpoint, served, worker
from workerset_admission.card import BoundarySettings
from workerset_admission.card.drain_record import (
    BudgetRead,
    Pending,
    budget_kv_key,
    decode_budget_record,
    encode_budget_record,
)
from workerset_admission.card.serving_record import CapabilityRecord, NamespaceRecord
from workerset_admission.errors import UsageError
from workerset_admission.keys import key_matches
from workerset_admission.rollout import routable
from workerset_admission.rollout.drain import (
    PENDING_WINDOW,
    Selection,
    Worker,
    budget_after,
    check_last_workers,
    find_workers,
    lost_models,
    models_of,
    pending_drains,
    transport_host,
    transport_port,
)
from workerset_admission.rollout.frontends import record_filters


def test_every_request_plane_of_1_6_1_names_its_host_or_its_subject() -> None:
    assert transport_host({"tcp": "10.0.0.7:4000/generate"}) == "10.0.0.7"
    assert transport_host({"tcp": "[fd00::7]:4000/generate"}) == "fd00::7"
    assert transport_host({"http": "http://10.0.0.8:8888/v1/rpc/generate"}) == "10.0.0.8"
    assert transport_host({"nats_tcp": "ns_backend.generate-1a"}) is None
    listing = [
        *worker("ns", 0xA, "10.0.0.7"),
        card("ns", 0xB),
        endpoint("ns", 0xB, {"http": "http://10.0.0.7:8888/v1/rpc/generate"}),
        card("ns", 0xC),
        endpoint("ns", 0xC, {"nats_tcp": "ns_backend.generate-c"}),
        *worker("other", 0xD, "10.0.0.9"),
    ]
    host = Selection(host="10.0.0.7")
    assert find_workers(listing, host) == [Worker("ns", 0xA), Worker("ns", 0xB)]
    # A NATS-plane worker is found through the server's view of its subscription.
    found = find_workers(listing, host, subject_hosts={"ns_backend.generate-c": "10.0.0.7"})
    assert found == [Worker("ns", 0xA), Worker("ns", 0xB), Worker("ns", 0xC)]
    # A host drain covers only the namespaces named.
    assert find_workers(listing, Selection(host="10.0.0.9", namespaces=("ns",))) == []


def test_a_namespace_a_workerset_or_a_model_is_selected_at_once() -> None:
    listing = [
        *worker("old", 1, "h1"),
        *worker("old", 2, "h2", model="other"),
        card("old", 3, component="prefill"),
        *worker("new", 4, "h4"),
    ]
    every = Selection(every=True, namespaces=("old",))
    assert find_workers(listing, every) == [Worker("old", 1), Worker("old", 2), Worker("old", 3)]
    by_model = Selection(every=True, namespaces=("old",), model="other")
    assert find_workers(listing, by_model) == [Worker("old", 2)]
    by_set = Selection(every=True, namespaces=("old",), component="prefill")
    assert find_workers(listing, by_set) == [Worker("old", 3)]


@pytest.mark.parametrize(
    ("selection", "words"),
    [
        (Selection(), "name the workers"),
        (Selection(instance_id=0x1A, host="X"), "an instance id and --host conflict"),
        (Selection(instance_id=1, every=True, namespaces=("a",)), "conflict"),
        (Selection(every=True), "name it with --namespace"),
        (Selection(instance_id=1, component="c"), "--component narrow --all"),
    ],
)
def test_a_selection_that_names_nothing_or_names_twice_is_refused(
    selection: Selection, words: str
) -> None:
    with pytest.raises(UsageError, match=words):
        selection.check()


def test_the_last_routable_worker_of_a_model_is_not_drained_unsaid() -> None:
    listing = [*worker("dgd", 0xA1, "h1"), *worker("dgd", 0xA2, "h2")]
    records = [served("fe-1", "dgd", 0xA1, 0xA2)]
    # One of two: the other stays.
    assert check_last_workers(records, listing, [Worker("dgd", 0xA1)]) == ()
    # Both, or the second once the first is drained already: the model would be gone.
    (both,) = check_last_workers(records, listing, [Worker("dgd", 0xA1), Worker("dgd", 0xA2)])
    assert (both.model, both.frontend) == (MODEL, "fe-1")
    assert "model tiny would be left with no routable worker on frontend fe-1" in str(both)
    (second,) = check_last_workers(
        records, listing, [Worker("dgd", 0xA2)], already_drained=[Worker("dgd", 0xA1)]
    )
    assert second.members == ("dgd/backend/generate/a1", "dgd/backend/generate/a2")


def test_another_namespace_or_a_successor_keeps_the_model_served() -> None:
    listing = [*worker("old", 1, "h1"), *worker("new", 2, "h2")]
    # A versioned rollout: the new namespace serves the model beside the old one.
    records = [served("fe-1", "old", 1), served("fe-1", "new", 2)]
    assert check_last_workers(records, listing, [Worker("old", 1)]) == ()
    # A frontend that does not serve the new namespace yet would lose it.
    lagging = [*records, served("fe-2", "old", 1)]
    (left,) = check_last_workers(lagging, listing, [Worker("old", 1)])
    assert left.frontend == "fe-2"
    # In place: a registered successor of the same WorkerSet takes over (a handover).
    in_place = [*worker("dgd", 0xA, "h"), *worker("dgd", 0xB, "h")]
    assert check_last_workers([served("fe-1", "dgd", 0xA)], in_place, [Worker("dgd", 0xA)]) == ()


def test_with_no_live_frontend_the_discovery_bucket_decides() -> None:
    listing = [*worker("dgd", 1, "h1"), *worker("dgd", 2, "h2")]
    assert check_last_workers([], listing, [Worker("dgd", 1)]) == ()
    (gone,) = check_last_workers([], listing, [Worker("dgd", 1), Worker("dgd", 2)])
    assert gone.frontend is None
    assert "in the discovery bucket" in str(gone)
    # A live frontend that watches none of dgd does not switch the bucket's check off.
    present = [CapabilityRecord("v1.fe-1.capability", "fe-1"), served("fe-1", "other", 9)]
    (gone,) = check_last_workers(present, listing, [Worker("dgd", 1), Worker("dgd", 2)])
    assert gone.frontend is None


def prefill_card(namespace: str, instance: int) -> tuple[str, bytes]:
    key, value = card(namespace, instance)
    record = json.loads(value)
    record["card_json"]["worker_type"] = "prefill"
    return key, json.dumps(record).encode()


def test_only_what_a_frontend_can_route_counts_as_what_is_left() -> None:
    # A card with no endpoint record is no worker: not in the bucket, not as a successor.
    card_only = [*worker("dgd", 1, "h1"), card("dgd", 2)]
    (gone,) = check_last_workers([], card_only, [Worker("dgd", 1)])
    assert gone.frontend is None
    (gone,) = check_last_workers([served("fe-1", "dgd", 1)], card_only, [Worker("dgd", 1)])
    assert gone.frontend == "fe-1"
    # A prefill worker serves nothing by itself.
    prefill = [
        *worker("dgd", 1, "h1"),
        prefill_card("dgd", 2),
        endpoint("dgd", 2, {"tcp": "h2:9/x"}),
    ]
    (gone,) = check_last_workers([], prefill, [Worker("dgd", 1)])
    assert gone.members == ("dgd/1 (1)",)
    # ... nor is it counted among what a frontend serves on the model's hop.
    hop = json.dumps(["dgd", "backend", "generate", "chat", "prefill"])
    record = served("fe-1", "dgd", 2)
    assert isinstance(record, NamespaceRecord)
    assert record.groups is not None
    prefill_group = dataclasses.replace(record.groups[0], worker_set=hop)
    both = [dataclasses.replace(served("fe-1", "dgd", 1, 2), groups=(
        dataclasses.replace(served("fe-1", "dgd", 1).groups[0]),  # type: ignore[union-attr]
        prefill_group,
    ))]  # fmt: skip
    (gone,) = check_last_workers(both, prefill, [Worker("dgd", 1)])
    assert gone.frontend == "fe-1"


def test_namespaces_no_live_frontend_watches_are_judged_on_the_bucket() -> None:
    listing = [*worker("ns-a", 1, "h1"), *worker("ns-b", 2, "h2")]
    watching_a = [served("fe-1", "ns-a", 1)]
    # ns-b is watched by no live frontend: the bucket decides for it. ns-a's worker is still
    # registered and routable there, so the model stays served ...
    assert check_last_workers(watching_a, listing, [Worker("ns-b", 2)]) == ()
    # ... unless it is drained too (then fe-1 loses it as well).
    gone = check_last_workers(watching_a, listing, [Worker("ns-b", 2)], [Worker("ns-a", 1)])
    assert [(g.frontend, g.members) for g in gone] == [(None, ("ns-b/2 (2)",))]
    both = [*watching_a, served("fe-1", "ns-b", 2)]
    assert check_last_workers(both, listing, [Worker("ns-b", 2)]) == ()


def test_budgets_count_drains_about_to_be_written_and_forget_them_once_recorded() -> None:
    a, b, c = Worker("dgd", 1), Worker("dgd", 2), Worker("dgd", 3)
    # A swap adds its workers with no time: the server's time of the write is theirs.
    raw = budget_after(MODEL, BudgetRead(), [a], [], now=None)
    assert decode_budget_record(raw) == (Pending("dgd", 1),)
    stored = BudgetRead(revision=5, raw=raw, stored_at=100.0)
    assert pending_drains({MODEL: stored}, [], now=110.0) == {a}
    # Recorded: the drain record says it now. Lapsed: its command died before writing.
    assert pending_drains({MODEL: stored}, [a], now=110.0) == set()
    assert pending_drains({MODEL: stored}, [], now=100.0 + PENDING_WINDOW) == set()
    # A swap keeps what still counts, with the server time it first held it, and adds its own.
    old = encode_budget_record(MODEL, (Pending("dgd", 1), Pending("dgd", 3, 0.0)))
    after = budget_after(MODEL, BudgetRead(6, old, 100.0), [b], [c], now=120.0)
    assert decode_budget_record(after) == (Pending("dgd", 1, 100.0), Pending("dgd", 2))
    assert decode_budget_record(b"not json") == ()


def test_no_budget_entry_counts_longer_than_the_window_by_the_servers_clock() -> None:
    a = Worker("dgd", 1)
    # Stamped a year ahead (a forged value, or a host far ahead): no older than its record.
    ahead = encode_budget_record(MODEL, (Pending("dgd", 1, 100.0 + 365 * 86400),))
    stored = BudgetRead(revision=3, raw=ahead, stored_at=100.0)
    assert pending_drains({MODEL: stored}, [], now=100.0 + PENDING_WINDOW - 1) == {a}
    assert pending_drains({MODEL: stored}, [], now=100.0 + PENDING_WINDOW) == set()
    # Carried on by a later swap, it keeps the record's time, not its stamp.
    carried = budget_after(MODEL, stored, [Worker("dgd", 2)], [], now=120.0)
    assert decode_budget_record(carried)[0] == Pending("dgd", 1, 100.0)
    # Without the server's time now, nothing in a record is older than the record itself.
    assert pending_drains({MODEL: stored}, [], now=None) == {a}


def test_a_budget_record_of_another_model_holds_nothing_for_this_one() -> None:
    name = "模" * 460
    key = budget_kv_key(name)
    # One length whatever the name: it always fits a key and a control line.
    assert len(key) == len(budget_kv_key("x")) == len("v1.budget.") + 64
    other = encode_budget_record("another", (Pending("dgd", 1),))
    stored = BudgetRead(revision=3, raw=other, stored_at=100.0)
    assert pending_drains({name: stored}, [], now=110.0) == set()
    mine = encode_budget_record(name, (Pending("dgd", 1),))
    assert pending_drains({name: BudgetRead(4, mine, 100.0)}, [], now=110.0) == {Worker("dgd", 1)}
    # The swap overwrites the other's value with this model's (by the revision read).
    assert json.loads(budget_after(name, stored, [], [], now=110.0))["model"] == name


def test_a_model_lost_while_waiting_is_named_with_its_frontend() -> None:
    before = [served("fe-1", "dgd", 1), served("fe-2", "dgd", 1)]
    now = [served("fe-1", "dgd"), served("fe-2", "dgd", 1)]
    assert lost_models(before, now) == (("fe-1", MODEL),)
    # A frontend that is gone loses nothing (it is no longer live).
    assert lost_models(before, [served("fe-2", "dgd", 1)]) == ()


def test_a_port_names_one_worker_among_those_sharing_a_host() -> None:
    listing = [
        card("dgd", 1),
        endpoint("dgd", 1, {"tcp": "10.0.0.5:9001/generate"}),
        card("dgd", 2),
        endpoint("dgd", 2, {"tcp": "10.0.0.5:9002/generate"}),
        card("dgd", 3),
        endpoint("dgd", 3, {"nats_tcp": "dgd_backend.generate-3"}),
    ]
    assert find_workers(listing, Selection(host="10.0.0.5")) == [Worker("dgd", 1), Worker("dgd", 2)]
    assert find_workers(listing, Selection(host="10.0.0.5", port=9002)) == [Worker("dgd", 2)]
    # A NATS-plane record names no port: a port never names it.
    hosts = {"dgd_backend.generate-3": "10.0.0.5"}
    assert find_workers(listing, Selection(host="10.0.0.5", port=9001), subject_hosts=hosts) == [
        Worker("dgd", 1)
    ]
    assert transport_port({"http": "http://10.0.0.8:8888/v1/rpc"}) == 8888
    with pytest.raises(UsageError, match="--port narrows --host"):
        Selection(instance_id=1, port=9001).check()


def test_an_older_card_says_prefill_by_its_model_type() -> None:
    key, value = card("dgd", 2)
    record = json.loads(value)
    record["card_json"]["model_type"] = "Chat | Prefill"
    del record["card_json"]["worker_type"]  # an older card names no worker type
    listing = [*worker("dgd", 1, "h1"), (key, json.dumps(record).encode()),
               endpoint("dgd", 2, {"tcp": "h2:9/x"})]  # fmt: skip
    (gone,) = check_last_workers([], listing, [Worker("dgd", 1)])
    assert gone.members == ("dgd/1 (1)",)


def test_a_poll_reads_the_keys_its_filters_name_and_no_other() -> None:
    filters = record_filters(["dgd", "a.b"])
    assert filters == (
        "v1.*.heartbeat",
        "v1.*.capability",
        "v1.*.members.a=2Eb",
        "v1.*.members.dgd",
    )
    assert key_matches("v1.fe-1.heartbeat", filters)
    assert key_matches("v1.fe-1.capability", filters)
    assert key_matches("v1.fe-2.members.dgd", filters)
    assert key_matches("v1.fe-2.members.a=2Eb", filters)
    assert not key_matches("v1.fe-2.members.other", filters)
    assert not key_matches("v1.fe-2.members.dgd.extra", filters)
    assert not key_matches("v1.capability", filters)
    assert key_matches("v1.x.y", ["v1.>"])
    assert not key_matches("v1", ["v1.>"])


# -- one rule for "routable": the core's ---------------------------------------------------


def test_a_same_configuration_card_without_an_endpoint_is_no_successor_on_a_live_frontend() -> None:
    # B registered the incumbent's configuration but has no endpoint record: the frontend's
    # core admits it (its record lists it) and can route nothing to it.
    listing = [*worker("dgd", 0xA, "h1"), card("dgd", 0xB)]
    (gone,) = check_last_workers([served("fe-1", "dgd", 0xA, 0xB)], listing, [Worker("dgd", 0xA)])
    assert (gone.model, gone.frontend, gone.members) == (MODEL, "fe-1", ("dgd/backend/generate/a",))
    # With its endpoint record it is a worker like any other.
    routable = [*listing, endpoint("dgd", 0xB, {"tcp": "h2:9/x"})]
    assert (
        check_last_workers([served("fe-1", "dgd", 0xA, 0xB)], routable, [Worker("dgd", 0xA)]) == ()
    )


def test_a_successor_whose_card_the_boundary_refuses_is_no_successor() -> None:
    refused = card("dgd", 0xB, block_size=32, kv_cache_block_size=-1)
    listing = [*worker("dgd", 0xA, "h1"), refused, endpoint("dgd", 0xB, {"tcp": "h2:9/x"})]
    (gone,) = check_last_workers([served("fe-1", "dgd", 0xA)], listing, [Worker("dgd", 0xA)])
    assert gone.frontend == "fe-1"
    (gone,) = check_last_workers([], listing, [Worker("dgd", 0xA)])
    assert gone.frontend is None
    # A successor the boundary admits hands over.
    good = [*worker("dgd", 0xA, "h1"), card("dgd", 0xB, block_size=32)]
    good.append(endpoint("dgd", 0xB, {"tcp": "h2:9/x"}))
    assert check_last_workers([served("fe-1", "dgd", 0xA)], good, [Worker("dgd", 0xA)]) == ()


def test_a_lora_adapter_is_a_model_whose_last_workers_are_refused() -> None:
    # A and B serve the base model; only A carries the adapter.
    listing = [*worker("dgd", 0xA, "h1"), adapter("dgd", 0xA, "ad"), *worker("dgd", 0xB, "h2")]
    assert models_of(listing, [Worker("dgd", 0xA)]) == ["ad", MODEL]
    assert models_of(listing, [Worker("dgd", 0xB)]) == [MODEL]
    records = [served("fe-1", "dgd", 0xA, 0xB)]
    (gone,) = check_last_workers(records, listing, [Worker("dgd", 0xA)])
    assert (gone.model, gone.frontend) == ("ad", "fe-1")
    (gone,) = check_last_workers([], listing, [Worker("dgd", 0xA)])
    assert (gone.model, gone.frontend) == ("ad", None)
    # Another worker with the adapter keeps it served; B alone never touches it.
    both = [*listing, adapter("dgd", 0xB, "ad")]
    assert check_last_workers(records, both, [Worker("dgd", 0xA)]) == ()
    assert check_last_workers(records, listing, [Worker("dgd", 0xB)]) == ()
    # Two drains at once: the second counts the first as drained.
    gone = check_last_workers(records, both, [Worker("dgd", 0xB)], [Worker("dgd", 0xA)])
    assert {(g.model, g.frontend) for g in gone} == {("ad", "fe-1"), (MODEL, "fe-1")}


def test_the_checks_own_core_tells_nobody_of_what_it_decides(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A handover (the incumbent's last worker drained, a successor waiting) runs in the drain's
    # own core: the succession it makes is not the frontends', and is not logged.
    listing = [*worker("dgd", 0xA, "h1"), card("dgd", 0xB, block_size=32)]
    listing.append(endpoint("dgd", 0xB, {"tcp": "h2:9/x"}))
    with caplog.at_level(logging.DEBUG, logger="workerset_admission"):
        assert check_last_workers([served("fe-1", "dgd", 0xA)], listing, [Worker("dgd", 0xA)]) == ()
    # Only to its own logger, which hands nothing on (no handler, no parent).
    told = [r.getMessage() for r in caplog.records if r.name != routable._QUIET.name]
    assert told == []
    assert not routable._QUIET.propagate


def test_the_bucket_is_judged_with_the_frontends_boundary_settings_on_every_namespace() -> None:
    listing = [*worker("dgd", 1, "h1"), *worker("dgd", 2, "h2")]
    # Cards over the frontends' value limit are refused there: no worker is left either way.
    small = BoundarySettings(max_value_size=64)
    assert models_of(listing, [Worker("dgd", 1)], boundary=small) == []
    assert models_of(listing, [Worker("dgd", 1)]) == [MODEL]
    # A namespace filter is not applied: a frontend starting now may watch dgd.
    elsewhere = BoundarySettings(namespace="other")
    assert models_of(listing, [Worker("dgd", 1)], boundary=elsewhere) == [MODEL]
    (gone,) = check_last_workers(
        [], listing, [Worker("dgd", 1), Worker("dgd", 2)], boundary=elsewhere
    )
    assert gone.frontend is None


def test_a_lora_adapter_selects_the_workers_that_serve_it() -> None:
    listing = [*worker("dgd", 0xA, "h1"), adapter("dgd", 0xA, "ad"), *worker("dgd", 0xB, "h2")]
    by_adapter = Selection(every=True, namespaces=("dgd",), model="ad")
    assert find_workers(listing, by_adapter) == [Worker("dgd", 0xA)]
