"""The view's record table: one slot per worker, its records' names held once, exact lookups."""

from __future__ import annotations

from itertools import product

from support.heap import held_size
from support.viewworld import GROUP, table_of, worker_records
from workerset_admission.card import endpoint_kv_key, model_kv_key
from workerset_admission.identity import EndpointId
from workerset_admission.ports import AcceptedRecord, TenureFacts
from workerset_admission.view import ViewChanges, ViewPlan
from workerset_admission.view.records import PublishableRecord, RecordTable, Tie

A1, A2 = 0x6030FDDB01885992, 0x11
EP = EndpointId("pns", "backend", "generate")


def card_and_endpoint(endpoint: EndpointId, instance_id: int) -> list[AcceptedRecord]:
    return [
        AcceptedRecord(model_kv_key(endpoint, instance_id), b"card %x" % instance_id, "model"),
        AcceptedRecord(endpoint_kv_key(endpoint, instance_id), b"ep %x" % instance_id, "instance"),
    ]


def pair(table: RecordTable, instance_id: int) -> tuple[PublishableRecord, PublishableRecord]:
    own = table.lookup("worker", EP.namespace, EP.component, instance_id)
    card = next(r for r in own if r.bucket == "mdc")
    endpoint = next(r for r in own if r.bucket == "instances" and r.endpoint == EP.endpoint)
    return card, endpoint


def test_a_workers_card_and_endpoint_record_hold_one_file_name_and_one_instance_id() -> None:
    listed = RecordTable()
    listed.listing(card_and_endpoint(EP, A1), ())
    card_first, endpoint_first = RecordTable(), RecordTable()
    for record in card_and_endpoint(EP, A1):
        card_first.put(record.key, record)
    for record in reversed(card_and_endpoint(EP, A1)):
        endpoint_first.put(record.key, record)

    for table in (listed, card_first, endpoint_first):
        card, endpoint = pair(table, A1)
        assert card.file == ("mdc", endpoint.file_name)
        assert card.file_name is endpoint.file_name
        assert card.instance_id is endpoint.instance_id


def test_a_card_put_again_keeps_sharing_its_workers_name() -> None:
    table = RecordTable()
    card, endpoint = card_and_endpoint(EP, A1)
    table.put(card.key, card)
    table.put(endpoint.key, endpoint)
    table.put(card.key, AcceptedRecord(card.key, b"card again", "model"))

    new_card, held_endpoint = pair(table, A1)
    assert new_card.value == b"card again"
    assert new_card.file_name is held_endpoint.file_name


def _every_tie(table: RecordTable) -> set[Tie]:
    ties = {tie for record in table.records() for tie in RecordTable._ties(record)}
    # And ties no record has: each number under every kind, namespace and component.
    numbers = {tie[3] for tie in ties}
    components = {tie[2] for tie in ties}
    kinds = ("worker", "instance", "source", "publisher", "channel", "scope")
    return ties | {
        (kind, namespace, component, number)
        for kind, namespace, component, number in product(
            kinds, ("pns", "other"), components, numbers
        )
        if (kind == "scope") == isinstance(number, str)
    }


def test_every_lookup_finds_exactly_the_records_that_have_the_tie() -> None:
    # Numbers that collide: one instance id in two namespaces and two components, a worker
    # whose id is another's publisher id, event records with other topics.
    workers = [
        worker_records(A1, channels=("kv_metrics", "odd_topic")),
        worker_records(A2),
        worker_records(A1 % 1000 + 5000),
    ]
    table = table_of(*workers)
    others = [
        record
        for endpoint in (EndpointId("other", "backend", "generate"), EndpointId("pns", "pre", "x"))
        for record in card_and_endpoint(endpoint, A1)
    ]
    for record in others:
        table.put(record.key, record)
    keys = [entry.key for worker in workers for entry in worker] + [r.key for r in others]
    key_of = {id(table.get(key)): key for key in keys if table.get(key) is not None}
    assert len(key_of) == len(table) > 10

    for tie in _every_tie(table):
        expected = sorted(
            (r for r in table.records() if tie in RecordTable._ties(r)),
            key=lambda r: key_of[id(r)],
        )
        assert table.lookup(*tie) == expected, tie
        assert table.lookup_last_known(*tie) == expected, tie


def test_a_table_holds_a_worker_in_at_most_520_bytes_besides_its_keys_and_bytes() -> None:
    # A worker's card and endpoint record: two records (104 B each), their two file tuples,
    # the one file name, the one instance id, two map slots and one index slot: 493 B. The
    # table held 832 B per worker when it kept a tie per record and each record its own name.
    given = [r for i in range(2000) for r in card_and_endpoint(EP, 0x1000 + i * 7919)]
    table = RecordTable()
    table.listing(given, ())

    per_worker = held_size(table, besides=given) / 2000
    assert per_worker <= 520, per_worker


def test_a_plan_holds_a_worker_in_at_most_260_bytes_besides_the_tables() -> None:
    # Per file its bytes and its owners (the tenure's one tuple of it, shared), per member
    # the tuple of its files: 2 x (2 map slots) and a tuple and a slot for the member, 242 B.
    # Each file held a tuple of its own owner before: 337 B.
    ids = [0x1000 + i * 7919 for i in range(2000)]
    table = RecordTable()
    table.listing([r for i in ids for r in card_and_endpoint(EP, i)], ())
    tenure = TenureFacts(GROUP, 1, frozenset(ids))
    plan, written = ViewPlan(), {}
    for change in plan.update(ViewChanges({GROUP: tenure}, everything=True), table, written):
        written[change.file] = change.value
    plan.settled(written)
    assert len(written) == 4000

    per_worker = held_size(plan, besides=[table, tenure]) / 2000
    assert per_worker <= 260, per_worker
