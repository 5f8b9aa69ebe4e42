"""The facade given the core's real effects: ERROR logs, events, counters and spans."""

from __future__ import annotations

import logging

import pytest
from opentelemetry import trace
from support.cards import base_card
from support.differences import normalized
from support.registrations import reg
from telemetry_harness import Harness
from workerset_admission.admission import (
    AdmissionCore,
    BuildFinished,
    CommitGroup,
    Listing,
    MutationRefused,
    RejectionReported,
    RetryScheduled,
    StartBuild,
    TenureHeld,
    TenureHoldEnded,
    WorkerAdded,
    WorkerRemoved,
)
from workerset_admission.card import card_checksum
from workerset_admission.errors import wire_text
from workerset_admission.identity import EndpointId, GroupKey, Registration, WorkerType
from workerset_admission.ports import DiscoveryEntry, SourceDelete, SourceListing, SourcePut
from workerset_admission.telemetry import (
    AdmissionStateSummary,
    HeldGroup,
    decision_of,
    install_log_correlation,
)
from workerset_admission.telemetry import names as n

ENDPOINT = EndpointId("ns", "backend", "generate")
GROUP = GroupKey.build("llama", ENDPOINT, "chat", WorkerType.DECODE)
FIELDS = ("model", "worker_set", "incumbent_checksum", "rejected_checksum", "instance")


def registration(instance_id: int, checksum: str, group: GroupKey = GROUP) -> Registration:
    return reg(instance_id, checksum, group=group, fingerprint="")


def apply(harness: Harness, core: AdmissionCore, event: object) -> list[object]:
    """Apply one discovery change the way the service does: inside an update scope."""
    if isinstance(event, WorkerAdded):
        source: SourcePut | SourceDelete = SourcePut(
            DiscoveryEntry(key=event.registration.key, value=b"", revision=1)
        )
    else:
        assert isinstance(event, WorkerRemoved)
        source = SourceDelete(key=event.key, revision=2)
    with harness.telemetry.apply_update(source) as update:
        effects: list[object] = list(core.apply(event))  # type: ignore[arg-type]
        update.effects(effects)
    return effects


def errors(records: list[logging.LogRecord]) -> list[logging.LogRecord]:
    return [r for r in records if r.levelno == logging.ERROR]


def test_a_newly_rejected_cohort_is_logged_once_at_error_with_every_field_as_extra_and_in_text(
    harness: Harness, rejection_records: list[logging.LogRecord]
) -> None:
    core = AdmissionCore()
    apply(harness, core, WorkerAdded(registration(1, "aaaa")))
    effects = apply(harness, core, WorkerAdded(registration(2, "bbbb")))
    assert any(isinstance(e, RejectionReported) for e in effects)

    (record,) = errors(rejection_records)
    expected = {
        "model": "llama",
        "worker_set": GROUP.worker_set,
        "incumbent_checksum": "aaaa",
        "rejected_checksum": "bbbb",
        "instance": "ns/backend/generate/2",
    }
    for field, value in expected.items():
        assert getattr(record, field) == value
        # The Dynamo host forwards only the message text, so each value is in it too.
        assert f"{field}={value}" in record.getMessage()
    assert record.name.startswith("workerset_admission")


def test_repeats_of_a_rejected_cohort_are_not_logged_again(
    harness: Harness, rejection_records: list[logging.LogRecord]
) -> None:
    core = AdmissionCore()
    apply(harness, core, WorkerAdded(registration(1, "aaaa")))
    apply(harness, core, WorkerAdded(registration(2, "bbbb")))
    apply(harness, core, WorkerAdded(registration(3, "bbbb")))  # same cohort, bigger
    apply(harness, core, WorkerAdded(registration(2, "bbbb")))  # a duplicate put
    assert len(errors(rejection_records)) == 1
    model = frozenset({("model", "llama")})
    assert harness.points(n.METRIC_REJECTED_COHORTS)[model].value == 1


def test_after_a_succession_the_remaining_disagreement_is_reported_against_the_new_incumbent(
    harness: Harness, rejection_records: list[logging.LogRecord]
) -> None:
    core = AdmissionCore()
    apply(harness, core, WorkerAdded(registration(1, "aaaa")))
    apply(harness, core, WorkerAdded(registration(2, "bbbb")))
    apply(harness, core, WorkerAdded(registration(3, "cccc")))
    apply(harness, core, WorkerRemoved("ns/backend/generate/1"))

    reports = [(r.incumbent_checksum, r.rejected_checksum) for r in errors(rejection_records)]  # type: ignore[attr-defined]
    assert reports == [("aaaa", "bbbb"), ("aaaa", "cccc"), ("bbbb", "cccc")]
    (succeed,) = harness.finished(n.SPAN_SUCCEED)
    assert succeed.attributes is not None
    assert succeed.attributes[n.ATTR_OLD_CHECKSUM] == "aaaa"
    assert succeed.attributes[n.ATTR_NEW_CHECKSUM] == "bbbb"
    model = frozenset({("model", "llama")})
    assert harness.points(n.METRIC_SUCCESSIONS)[model].value == 1


def test_the_rejection_is_an_event_on_the_apply_span_of_the_update_that_caused_it(
    harness: Harness, rejection_records: list[logging.LogRecord]
) -> None:
    core = AdmissionCore()
    apply(harness, core, WorkerAdded(registration(1, "aaaa")))
    apply(harness, core, WorkerAdded(registration(2, "bbbb")))

    first, second = harness.finished(n.SPAN_APPLY_UPDATE)
    assert first.events == ()
    (event,) = second.events
    assert event.name == "workerset_admission.cohort_rejected"
    assert dict(event.attributes or {}) == {
        n.ATTR_MODEL: "llama",
        n.ATTR_WORKER_SET: GROUP.worker_set,
        n.ATTR_INCUMBENT_CHECKSUM: "aaaa",
        n.ATTR_REJECTED_CHECKSUM: "bbbb",
        n.ATTR_INSTANCE: "ns/backend/generate/2",
    }
    assert [s.attributes[n.ATTR_DECISION] for s in (first, second)] == ["admitted", "rejected"]  # type: ignore[index]


def test_the_error_record_carries_the_trace_and_span_of_the_update_once_correlation_is_on(
    harness: Harness, rejection_records: list[logging.LogRecord]
) -> None:
    core = AdmissionCore()
    apply(harness, core, WorkerAdded(registration(1, "aaaa")))
    uninstall = install_log_correlation()
    try:
        apply(harness, core, WorkerAdded(registration(2, "bbbb")))
    finally:
        uninstall()

    (record,) = errors(rejection_records)
    span = harness.finished(n.SPAN_APPLY_UPDATE)[-1]
    assert record.otelTraceID == format(span.context.trace_id, "032x")  # type: ignore[attr-defined]
    assert record.otelSpanID == format(span.context.span_id, "016x")  # type: ignore[attr-defined]


def test_records_carry_no_trace_fields_until_correlation_is_installed(
    rejection_records: list[logging.LogRecord],
) -> None:
    logging.getLogger("workerset_admission.admission").error("plain")
    (record,) = errors(rejection_records)
    assert not hasattr(record, "otelTraceID")


def test_correlation_leaves_other_loggers_records_alone() -> None:
    seen: list[logging.LogRecord] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    other = logging.getLogger("somebody.else")
    handler = Collect()
    other.addHandler(handler)
    uninstall = install_log_correlation()
    try:
        with trace.get_tracer("t").start_as_current_span("s"):
            other.warning("hello")
    finally:
        uninstall()
        other.removeHandler(handler)
    assert not hasattr(seen[0], "otelTraceID")


def test_a_full_build_cycle_gives_build_commit_and_retry_telemetry(harness: Harness) -> None:
    core = AdmissionCore()
    effects = apply(harness, core, WorkerAdded(registration(1, "aaaa")))
    (start,) = [e for e in effects if isinstance(e, StartBuild)]

    with harness.telemetry.build_attempt(start.group, start.mdc_checksum, start.generation) as b:
        b.set_outcome("failed", "RuntimeError")
    failed = core.apply(
        BuildFinished(start.group, start.mdc_checksum, start.generation, ok=False, error="boom")
    )
    with harness.telemetry.build_attempt(start.group, start.mdc_checksum, start.generation):
        harness.telemetry.effects(failed)
    assert any(isinstance(e, RetryScheduled) for e in failed)

    build_span = harness.finished(n.SPAN_BUILD)[-1]
    (retry,) = build_span.events
    assert retry.name == "workerset_admission.build_retry_scheduled"
    assert retry.attributes is not None
    assert retry.attributes[n.ATTR_BUILD_ATTEMPT] == 1
    assert isinstance(retry.attributes[n.ATTR_RETRY_DELAY], float)

    commit = CommitGroup(
        GROUP, "aaaa", 9, receiver=1, members=(), admitted=frozenset(), representative="x"
    )
    harness.telemetry.effects([commit])
    (commit_span,) = harness.finished(n.SPAN_COMMIT)
    assert commit_span.attributes is not None
    assert commit_span.attributes[n.ATTR_GENERATION] == 9


def test_a_refused_in_place_change_counts_as_an_invalid_record(harness: Harness) -> None:
    core = AdmissionCore()
    apply(harness, core, WorkerAdded(registration(1, "aaaa")))
    effects = apply(harness, core, WorkerAdded(registration(1, "ffff")))
    assert any(isinstance(e, MutationRefused) for e in effects)

    reason = frozenset({("reason", "mutation_refused")})
    assert harness.points(n.METRIC_INVALID_RECORDS)[reason].value == 1
    span = harness.finished(n.SPAN_APPLY_UPDATE)[-1]
    assert span.attributes is not None
    assert span.attributes[n.ATTR_DECISION] == "refused"


def test_decisions_follow_from_the_effects_of_one_update() -> None:
    core = AdmissionCore()
    assert decision_of(core.apply(WorkerAdded(registration(1, "aaaa")))) == ("admitted", GROUP)
    assert decision_of(core.apply(WorkerAdded(registration(2, "bbbb")))) == ("rejected", GROUP)
    assert decision_of(core.apply(WorkerAdded(registration(2, "bbbb")))) == ("unchanged", None)
    assert decision_of(core.apply(WorkerRemoved("ns/backend/generate/2"))) == ("removed", GROUP)


def test_a_listing_is_reconciled_not_admitted_or_rejected(harness: Harness) -> None:
    core = AdmissionCore()
    listing = [registration(1, "aaaa"), registration(2, "bbbb")]
    with harness.telemetry.apply_update(SourceListing([], reason="initial")) as update:
        update.effects(core.apply(Listing(listing)))
    with harness.telemetry.apply_update(SourceListing([], reason="periodic")) as update:
        update.effects(core.apply(Listing(listing)))
    first, second = harness.finished(n.SPAN_APPLY_SNAPSHOT)
    assert first.attributes is not None
    assert second.attributes is not None
    assert first.attributes[n.ATTR_DECISION] == "reconciled"
    assert second.attributes[n.ATTR_DECISION] == "unchanged"


def test_a_held_tenure_is_logged_counted_and_spanned(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    held_group = HeldGroup(GROUP.id, 1130.0, (1, 2), 1110.0)
    harness.telemetry.observe_state(
        lambda: AdmissionStateSummary({}, 0, held_groups=1, held=(held_group,))
    )
    harness.telemetry.effects(
        [
            TenureHeld(GROUP, "a", 3, 2, 130.0, ("ns/c/e/1", "ns/c/e/2"), 110.0),
            TenureHoldEnded(GROUP, "a", "expired", 30.0),
        ]
    )
    held, ended = harness.finished(n.SPAN_HOLD)
    assert held.attributes[n.ATTR_HOLD_DEADLINE] == 130.0
    assert tuple(held.attributes[n.ATTR_HOLD_LAST_KNOWN]) == ("ns/c/e/1", "ns/c/e/2")
    assert held.attributes[n.ATTR_HOLD_LAST_KNOWN_UNTIL] == 110.0
    assert ended.attributes[n.ATTR_HOLD_OUTCOME] == "expired"
    (point,) = harness.metrics()["workerset_admission.groups.held"].data.data_points
    assert point.value == 1
    assert point.attributes[n.ATTR_HOLD_LAST_KNOWN] == "1,2"
    assert point.attributes[n.ATTR_HOLD_LAST_KNOWN_UNTIL] == 1110.0
    assert "2 of them (ns/c/e/1, ns/c/e/2) stay admitted" in caplog.text
    assert [r.levelname for r in caplog.records if "hold" in r.getMessage()] == [
        "WARNING",
        "WARNING",
    ]


def carded(instance_id: int, card: dict[str, object]) -> Registration:
    decoded = normalized(card)
    return reg(instance_id, card_checksum(decoded), group=GROUP, fingerprint="", card=decoded)


def test_the_error_line_the_extra_and_the_event_say_what_the_rejected_card_differs_in(
    harness: Harness, rejection_records: list[logging.LogRecord]
) -> None:
    core = AdmissionCore()
    apply(harness, core, WorkerAdded(carded(1, base_card(16))))
    apply(harness, core, WorkerAdded(carded(2, base_card(32, aliases=["x"]))))

    (record,) = errors(rejection_records)
    assert 'differs in: kv_cache_block_size 16 -> 32; aliases [] -> ["x"] (' in record.getMessage()
    assert record.differences == [  # type: ignore[attr-defined]
        {"field": "kv_cache_block_size", "incumbent": "16", "rejected": "32"},
        {"field": "aliases", "incumbent": "[]", "rejected": '["x"]'},
    ]
    (event,) = harness.finished(n.SPAN_APPLY_UPDATE)[1].events
    assert event.attributes is not None
    assert list(event.attributes[n.ATTR_DIFFERENCES]) == [  # type: ignore[arg-type]
        "kv_cache_block_size 16 -> 32",
        'aliases [] -> ["x"]',
    ]


def test_the_error_line_shows_five_differences_and_counts_the_rest(
    harness: Harness, rejection_records: list[logging.LogRecord]
) -> None:
    changed = base_card(
        32,
        display_name="other",
        source_path="elsewhere",
        context_length=8192,
        needs=[["decode"]],
        aliases=["x"],
        prompt_context=["oai_chat"],
    )
    core = AdmissionCore()
    apply(harness, core, WorkerAdded(carded(1, base_card(16))))
    apply(harness, core, WorkerAdded(carded(2, changed)))

    (record,) = errors(rejection_records)
    said = record.getMessage().split("differs in: ", 1)[1]
    assert said.startswith('display_name "Qwen/Qwen3-0.6B" -> "other"; source_path ')
    assert "; and 2 more (" in said
    assert said.count(" -> ") == 5
    assert len(record.differences) == 7  # type: ignore[attr-defined]


FORGED = "llama\nERROR workerset_admission.facade forged: everything is fine\r\x1b[2K\u2028"


def test_a_model_name_holding_a_newline_cannot_start_a_log_line_of_its_own(
    harness: Harness, rejection_records: list[logging.LogRecord]
) -> None:
    """Every value from the wire is escaped in the line: no raw newline or control character."""
    endpoint = EndpointId("ns\nWARNING forged", "backend", "generate")
    group = GroupKey.build(FORGED, endpoint, "chat", WorkerType.DECODE)
    core = AdmissionCore()
    apply(harness, core, WorkerAdded(registration(1, "aaaa", group)))
    apply(harness, core, WorkerAdded(registration(2, "bbbb", group)))  # rejected
    apply(harness, core, WorkerRemoved(registration(1, "aaaa", group).key))  # succession
    harness.telemetry.worker_drained(group, "ns/backend/generate/2", "bbbb", True, "ops\nx")
    harness.telemetry.invalid_record("v1.mdc.ns.a.b.1", "invalid_json", "bad\n{json")

    lines = [r.getMessage() for r in rejection_records]
    assert any("rejected cohort" in line for line in lines), lines
    assert any("succession" in line for line in lines), lines
    assert any("drained" in line and "by ops\\nx" in line for line in lines), lines
    for line in lines:
        assert not any(ch in line for ch in "\n\r\x1b\u2028"), line
    (rejected,) = errors(rejection_records)
    assert "model=llama\\nERROR workerset_admission.facade forged" in rejected.getMessage()
    # The structured fields keep the value as it was; a JSON log encodes it on its own.
    assert rejected.model == FORGED  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("plain text, é and 中文", "plain text, é and 中文"),
        ("a\nb", "a\\nb"),
        ("a\r\tb", "a\\r\\tb"),
        ("\x1b[31mred\x7f\x85", "\\x1b[31mred\\x7f\\x85"),
        ("\u2028\u202e\u2066", "\\u2028\\u202e\\u2066"),
        (42, "42"),
    ],
)
def test_wire_text_escapes_every_character_that_ends_or_rewrites_a_line(
    value: object, shown: str
) -> None:
    assert wire_text(value) == shown


def test_wire_text_cuts_what_it_escapes_to_its_limit() -> None:
    assert wire_text("\n" * 1000, 10) == "\\n\\n\\n\\n\\n… (2000 characters)"
