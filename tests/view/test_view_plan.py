"""The view's pure plan: which files a tenure calls for, and the phase each change goes in.

No directory here: what a directory holds is a plain dict, and a change is applied to it by
hand, as the view's differ applies it.
"""

from __future__ import annotations

import ast
from collections.abc import Collection, Iterable
from pathlib import Path

from support.viewworld import EP, GROUP, FedTable, mdc_file, table_of, worker_records
from workerset_admission.card import endpoint_kv_key
from workerset_admission.identity import EndpointId, store_file_name
from workerset_admission.ports import SourceDelete, TenureFacts
from workerset_admission.view import (
    BUCKETS,
    SCOPE_TOPICS,
    FileChange,
    Phase,
    ViewChanges,
    ViewFile,
    ViewPlan,
    contribution_files,
    plan_view,
    untied_topics,
)

A1, A2, B = 0x6030FDDB01885992, 0x11, 0x22
ROOM = Path(__file__).resolve().parents[2] / "plugin" / "view"

Written = dict[ViewFile, bytes | None]


def instance_file(instance_id: int) -> ViewFile:
    return ("instances", store_file_name(f"pns/backend/generate/{instance_id:x}"))


def query_file(instance_id: int) -> ViewFile:
    query = EndpointId("pns", "backend", f"worker_kv_query_source_{instance_id:x}")
    path = f"{query.namespace}/{query.component}/{query.endpoint}/{instance_id:x}"
    return ("instances", store_file_name(path))


def of(instance_id: int, files: Iterable[ViewFile]) -> set[ViewFile]:
    """The files of one worker of these tests (its records, and its event records')."""
    marks = (f"{instance_id:x}", f"{instance_id % 1000 + 5000:x}")
    return {f for f in files if any(f[1].endswith(f"%2F{m}") for m in marks)}


def update(
    plan: ViewPlan,
    tenures: Iterable[TenureFacts],
    table: FedTable,
    written: Written,
    drained: Collection[tuple[str, int]] = (),
) -> tuple[FileChange, ...]:
    changes = ViewChanges(tenures={t.group: t for t in tenures}, everything=True)
    return plan.update(changes, table, written, drained)


def apply(
    plan: ViewPlan,
    changes: Iterable[FileChange],
    written: Written,
    fail: Collection[ViewFile] = (),
) -> None:
    """Carry the changes out on ``written`` as the differ does; writes of ``fail`` fail."""
    changes = list(changes)
    unwritten: set[object] = set()
    for change in changes:
        if change.phase is Phase.WRITE:
            if change.file in fail:
                unwritten |= change.groups
            else:
                written[change.file] = change.value
    for change in changes:
        if change.phase is Phase.WITHDRAW or (
            change.phase is Phase.REMOVE and not change.groups & unwritten
        ):
            written.pop(change.file, None)
    plan.settled(written)


def phases(changes: Iterable[FileChange]) -> list[Phase]:
    return [change.phase for change in changes]


def test_a_tenure_is_written_bucket_by_bucket_with_its_model_card_last() -> None:
    plan, written = ViewPlan(), {}
    table = table_of(worker_records(A1))

    changes = update(plan, [TenureFacts(GROUP, 1, frozenset({A1}))], table, written)

    assert phases(changes) == [Phase.WRITE] * 5
    buckets = [change.file[0] for change in changes]
    assert buckets == sorted(buckets, key=BUCKETS.index)
    assert changes[-1].file == mdc_file(A1)
    assert all(change.groups == {GROUP} and change.value for change in changes)
    apply(plan, changes, written)
    assert plan.unsettled == 0
    assert update(plan, [TenureFacts(GROUP, 1, frozenset({A1}))], table, written) == ()


def test_a_succession_withdraws_the_ended_tenure_before_the_successor_is_written() -> None:
    plan, written = ViewPlan(), {}
    table = table_of(worker_records(A1), worker_records(B, block_size=32))
    apply(plan, update(plan, [TenureFacts(GROUP, 1, frozenset({A1}))], table, written), written)

    changes = update(plan, [TenureFacts(GROUP, 4, frozenset({B}))], table, written)

    assert phases(changes) == [Phase.WITHDRAW] * 5 + [Phase.WRITE] * 5
    # The card goes first, and comes last: no frontend builds a model on half its records.
    assert changes[0].file == mdc_file(A1)
    assert changes[-1].file == mdc_file(B)
    assert {c.file for c in changes[:5]} == of(A1, written)


def test_a_handover_writes_the_successor_first_and_ties_the_drained_tenure_to_it() -> None:
    plan, written = ViewPlan(), {}
    table = table_of(worker_records(A1), worker_records(B, block_size=32))
    apply(plan, update(plan, [TenureFacts(GROUP, 1, frozenset({A1}))], table, written), written)
    held_before = set(written)

    successor = TenureFacts(GROUP, 4, frozenset({B}), handover_from=1)
    changes = update(plan, [successor], table, written)

    assert phases(changes) == [Phase.WRITE] * 5 + [Phase.REMOVE] * 5
    assert changes[4].file == mdc_file(B)
    assert changes[5].file == mdc_file(A1)
    removals = changes[5:]
    assert {c.file for c in removals} == held_before
    assert all(c.groups == {GROUP} and c.value is None for c in removals)


def test_a_drained_tenure_stays_while_a_write_of_its_successor_failed() -> None:
    plan, written = ViewPlan(), {}
    table = table_of(worker_records(A1), worker_records(B, block_size=32))
    apply(plan, update(plan, [TenureFacts(GROUP, 1, frozenset({A1}))], table, written), written)
    successor = TenureFacts(GROUP, 4, frozenset({B}), handover_from=1)

    apply(plan, update(plan, [successor], table, written), written, fail={mdc_file(B)})

    # The drained tenure keeps serving from the view until its successor is whole.
    assert mdc_file(A1) in written
    assert plan.unsettled == 6
    retry = plan.publication(written, table)
    assert [(c.phase, c.file) for c in retry[:1]] == [(Phase.WRITE, mdc_file(B))]
    assert phases(retry) == [Phase.WRITE] + [Phase.REMOVE] * 5
    apply(plan, retry, written)
    assert set(written) == of(B, written)
    assert plan.unsettled == 0


def test_a_departed_member_goes_after_its_replacement_joins() -> None:
    plan, written = ViewPlan(), {}
    table = table_of(worker_records(A1), worker_records(A2))
    apply(plan, update(plan, [TenureFacts(GROUP, 1, frozenset({A1}))], table, written), written)

    changes = update(plan, [TenureFacts(GROUP, 1, frozenset({A2}))], table, written)

    assert phases(changes) == [Phase.WRITE] * 5 + [Phase.REMOVE] * 5
    # A member leaving a tenure that goes on waits for nothing.
    assert all(c.groups == frozenset() for c in changes[5:])
    # Removal is the publication order reversed: the card before the instance records.
    buckets = [c.file[0] for c in changes[5:]]
    assert buckets == sorted(buckets, key=lambda b: -BUCKETS.index(b))


def test_a_drained_members_endpoint_records_linger_until_its_records_leave_the_bucket() -> None:
    plan, written = ViewPlan(), {}
    table = table_of(worker_records(A1), worker_records(A2))
    tenure = TenureFacts(GROUP, 1, frozenset({A1, A2}))
    apply(plan, update(plan, [tenure], table, written), written)
    drained = {("pns", A1)}
    kept = {instance_file(A1), query_file(A1)}

    changes = update(plan, [TenureFacts(GROUP, 1, frozenset({A2}))], table, written, drained)

    assert {c.file for c in changes} == of(A1, written) - kept
    assert phases(changes) == [Phase.REMOVE] * 3
    apply(plan, changes, written)
    assert kept <= set(written)
    # Still pending: planned again at every pass, and they go once the worker's own go.
    assert plan.unsettled == 2
    assert plan.publication(written, table, drained) == ()
    table.apply(SourceDelete(endpoint_kv_key(EP, A1), 9))
    query = EndpointId("pns", "backend", f"worker_kv_query_source_{A1:x}")
    table.apply(SourceDelete(endpoint_kv_key(query, A1), 10))
    changes = plan.publication(written, table, drained)
    assert {c.file for c in changes} == kept
    assert phases(changes) == [Phase.REMOVE] * 2


def test_a_drained_generation_with_no_successor_withdraws_its_cards_alone() -> None:
    plan, written = ViewPlan(), {}
    table = table_of(worker_records(A1))
    apply(plan, update(plan, [TenureFacts(GROUP, 1, frozenset({A1}))], table, written), written)

    changes = update(plan, [], table, written, {("pns", A1)})

    assert phases(changes) == [Phase.WITHDRAW] * 3
    assert changes[0].file == mdc_file(A1)
    assert not {instance_file(A1), query_file(A1)} & {c.file for c in changes}


def test_a_drained_generations_endpoint_records_go_when_a_successor_serves() -> None:
    plan, written = ViewPlan(), {}
    table = table_of(worker_records(A1), worker_records(B, block_size=32))
    apply(plan, update(plan, [TenureFacts(GROUP, 1, frozenset({A1}))], table, written), written)

    successor = TenureFacts(GROUP, 4, frozenset({B}), handover_from=1)
    changes = update(plan, [successor], table, written, {("pns", A1)})

    assert {instance_file(A1), query_file(A1)} <= {c.file for c in changes[5:]}


def test_a_serving_tenure_carries_its_endpoints_scope_channels_and_names_the_rest() -> None:
    table = table_of(worker_records(A1, channels=("kv_metrics", "odd_topic")))
    serving = TenureFacts(GROUP, 1, frozenset({A1}))
    idle = TenureFacts(GROUP, 1, frozenset())

    scope = contribution_files(serving, None, table)

    assert len(scope) == 1
    assert store_file_name("topic/kv_metrics/") in next(iter(scope))[1]
    assert "kv_metrics" in SCOPE_TOPICS
    assert contribution_files(idle, None, table) == {}
    assert untied_topics([serving], table) == {"odd_topic"}
    assert untied_topics([idle], table) == set()
    # The member's own files carry its KV events, never another topic's channels.
    member = contribution_files(serving, A1, table)
    assert not set(member) & set(scope)
    assert not any(store_file_name("odd_topic") in name for _, name in member)
    plan = ViewPlan()
    update(plan, [serving], table, {})
    assert plan.untied == {"odd_topic"}
    assert plan.wanted() == plan_view([serving], table)


def test_an_adapter_card_is_planned_only_while_the_projection_names_it() -> None:
    from support.cards import lora_card, model_entry
    from workerset_admission.ports import SourcePut

    table = table_of(worker_records(A1))
    table.apply(SourcePut(model_entry(A1, lora_card("sql", 4), suffix="sql", endpoint=EP)))
    adapter = ("mdc", store_file_name(f"pns/backend/generate/{A1:x}/sql"))

    plain = contribution_files(TenureFacts(GROUP, 1, frozenset({A1})), A1, table)
    served = TenureFacts(GROUP, 1, frozenset({A1}), adapters=frozenset({(A1, "sql")}))

    assert adapter not in plain
    assert adapter in contribution_files(served, A1, table)


def test_adopted_files_the_plan_does_not_want_are_withdrawn_and_wanted_ones_rewritten() -> None:
    plan = ViewPlan()
    table = table_of(worker_records(A1))
    written: Written = {mdc_file(A1): None, mdc_file(B): None}
    plan.adopt(written)

    changes = update(plan, [TenureFacts(GROUP, 1, frozenset({A1}))], table, written)

    assert (Phase.WITHDRAW, mdc_file(B)) in [(c.phase, c.file) for c in changes]
    assert (Phase.WRITE, mdc_file(A1)) in [(c.phase, c.file) for c in changes]


def test_a_workers_records_are_its_own_and_its_sources_channels_in_its_component() -> None:
    table = table_of(worker_records(A1, channels=("kv_metrics",)), worker_records(A2))

    own, events = table.worker_records("pns", "backend", A1)

    assert {r.file for r in own} == {instance_file(A1), query_file(A1), mdc_file(A1)}
    # Its KV event source, then the channel its publisher published in the same scope; the
    # endpoint's other channels name no worker and are the scope's.
    assert [r.file[0] for r in events] == ["event_sources", "event_channels"]
    assert {r.instance_id for r in events} == {A1 % 1000 + 5000}
    assert table.worker_records("pns", "frontend", A1) == ([], [])
    assert table.worker_records("other", "backend", A1) == ([], [])


_IMPURE = {"asyncio", "logging", "os", "pathlib", "socket", "threading", "time", "nats"}


def test_the_plan_imports_no_io_logging_or_clock_and_no_adapter() -> None:
    for path in sorted(ROOM.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = {
            alias.name if isinstance(node, ast.Import) else node.module or ""
            for node in ast.walk(tree)
            if isinstance(node, (ast.Import, ast.ImportFrom))
            for alias in node.names
        }
        assert not {n.split(".")[0] for n in names} & _IMPURE, path.name
        assert not [n for n in names if n.startswith("workerset_admission.adapters")], path.name
