"""Ingestion: what a put, a removal or a listing means for the core, liveness and refusals."""

from __future__ import annotations

import json

from support.cards import EP, base_card, endpoint_entry, model_entry
from workerset_admission.admission import (
    AdmissionCore,
    Effect,
    Listing,
    RejectionReported,
    WorkerAdded,
    WorkerRemoved,
)
from workerset_admission.card import BoundarySettings
from workerset_admission.identity import EndpointId
from workerset_admission.keys import endpoint_kv_key, model_kv_key
from workerset_admission.ports import SourceDelete, SourceListing
from workerset_admission.service.ingest import CardRecordDecoder, Ingestor


def test_a_model_record_becomes_one_worker_added() -> None:
    entry = model_entry(1)
    result = Ingestor().put(entry.key, entry.value)
    (added,) = result.inputs
    assert isinstance(added, WorkerAdded)
    assert added.registration.key == "dgd-v1/backend/generate/1"
    assert result.refusals == ()


def test_a_refused_record_is_reported_and_gives_the_core_nothing() -> None:
    ingest = Ingestor()
    result = ingest.put(model_kv_key(EP, 1), b"{not json")
    assert result.inputs == ()
    (verdict,) = result.refusals
    assert verdict.refusal is not None
    assert verdict.refusal.reason == "invalid_json"


def test_an_endpoint_record_updates_liveness_and_its_removal_clears_it() -> None:
    ingest = Ingestor()
    entry = endpoint_entry(7)
    put = ingest.put(entry.key, entry.value)
    assert (put.inputs, put.liveness_changed, put.decision) == ((), True, "liveness")
    assert ingest.liveness.live_ids(EP) == {7}
    removed = ingest.delete(entry.key)
    assert (removed.inputs, removed.liveness_changed) == ((), True)
    assert ingest.liveness.live_ids(EP) == frozenset()


def test_a_record_outside_the_namespace_filter_is_ignored() -> None:
    ingest = Ingestor(CardRecordDecoder(BoundarySettings(namespace="prod")))
    entry = model_entry(1)
    result = ingest.put(entry.key, entry.value)
    assert (result.inputs, result.refusals, result.decision) == ((), (), "ignored")


def test_a_removed_model_key_becomes_worker_removed() -> None:
    (removed,) = Ingestor().delete(model_kv_key(EP, 0x1A)).inputs
    assert removed == WorkerRemoved("dgd-v1/backend/generate/1a")


def test_a_listing_keeps_the_last_valid_value_of_a_key_whose_new_value_is_refused() -> None:
    ingest = Ingestor()
    good, other = model_entry(1), model_entry(2, base_card(32))
    result = ingest.listed([(good.key, good.value), (other.key, b"{broken")])
    (snapshot,) = result.inputs
    assert isinstance(snapshot, Listing)
    assert [r.key for r in snapshot.registrations] == ["dgd-v1/backend/generate/1"]
    assert list(snapshot.retain) == ["dgd-v1/backend/generate/2"]
    assert [v.key for v in result.refusals] == [other.key]


def test_keys_touched_during_a_listing_keep_their_live_state() -> None:
    ingest = Ingestor()
    live = endpoint_entry(3)
    ingest.put(live.key, live.value)
    # The listing predates the live put: it does not name the key, which stays live.
    result = ingest.listed([], keep={live.key})
    assert ingest.liveness.live_ids(EP) == {3}
    assert result.liveness_changed is False


def test_a_value_seen_before_under_the_same_key_is_not_decoded_again() -> None:
    calls: list[str] = []

    class Counting(CardRecordDecoder):
        def decode(self, key: str, value: bytes) -> object:  # type: ignore[override]
            calls.append(key)
            return super().decode(key, value)

    ingest = Ingestor(Counting())
    entry = model_entry(1)
    ingest.listed([(entry.key, entry.value)])
    ingest.listed([(entry.key, entry.value)])
    assert calls == [entry.key]


def test_another_endpoint_keeps_its_own_liveness() -> None:
    ingest = Ingestor()
    elsewhere = EndpointId("dgd-v1", "backend", "other")
    ingest.put(endpoint_kv_key(elsewhere, 1), endpoint_entry(1, elsewhere).value)
    assert ingest.liveness.live_ids(EP) == frozenset()
    assert ingest.liveness.live_ids(elsewhere) == {1}


def test_a_namespace_mismatch_is_described_as_one() -> None:
    other = EndpointId("prod", EP.component, EP.endpoint)
    value = model_entry(1, endpoint=other).value
    (verdict,) = Ingestor().put(model_kv_key(EP, 1), value).refusals
    assert verdict.refusal is not None
    assert verdict.refusal.reason == "identity_mismatch"
    assert (
        verdict.refusal.detail == "the value's namespace 'prod' disagrees with the key's 'dgd-v1'"
    )


def test_an_expiry_reports_what_happened_and_when_and_judges_nothing() -> None:
    # Whether an expiry follows an outage is the core's judgement (its last reconnect listing),
    # so ingestion says the same thing before and after a reconnect listing.
    ingest = Ingestor()
    key = "v1.mdc.ns.backend.generate.1"
    expired = SourceDelete(key, 2, operation="expired")
    assert ingest.removal(expired, now=5.0).inputs == (
        WorkerRemoved("ns/backend/generate/1", expired_at=5.0),
    )
    ingest.listing(SourceListing((), reason="reconnect"), now=10.0)
    assert ingest.removal(expired, now=20.0).inputs == (
        WorkerRemoved("ns/backend/generate/1", expired_at=20.0),
    )
    deleted = SourceDelete(key, 3, operation="delete")
    assert ingest.removal(deleted, now=20.0).inputs == (WorkerRemoved("ns/backend/generate/1"),)


def test_cards_differing_in_model_types_are_two_worksets_and_neither_is_rejected() -> None:
    # Dynamo 1.6.1's worker_set_key joins the model types: Chat and Chat|Completions are two
    # WorkerSets, whatever their checksums, so neither rejects the other.
    ingest = Ingestor()
    core = AdmissionCore()
    chat = model_entry(1, base_card(model_type="Chat"))
    both = model_entry(2, base_card(block_size=32))
    effects: list[Effect] = []
    for entry in (chat, both):
        for event in ingest.put(entry.key, entry.value).inputs:
            effects += core.apply(event)
    assert not [e for e in effects if isinstance(e, RejectionReported)]
    views = core.groups()
    assert sorted(json.loads(v.key.worker_set)[3] for v in views) == ["chat", "chat|completions"]
    assert len({v.incumbent for v in views}) == 2
    assert all(len(v.cohorts) == 1 for v in views)


class _Counting(CardRecordDecoder):
    """The card boundary, counting the values it is asked to decode, by key."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def decode(self, key: str, value: bytes) -> object:  # type: ignore[override]
        self.calls.append(key)
        return super().decode(key, value)


def test_a_quiet_relisting_decodes_nothing_and_gives_the_core_the_same_registrations() -> None:
    # The periodic reconciliation: every listed key hits, and what it hits is what was decoded.
    decoder = _Counting()
    ingest = Ingestor(decoder)
    entries = [(e.key, e.value) for i in (1, 2) for e in (model_entry(i), endpoint_entry(i))]
    (first,) = ingest.listed(entries).inputs
    decoder.calls.clear()
    again = ingest.listed([(key, bytes(bytearray(value))) for key, value in entries])
    (second,) = again.inputs
    assert decoder.calls == []
    assert isinstance(first, Listing)
    assert isinstance(second, Listing)
    assert list(second.registrations) == list(first.registrations)
    assert all(a is b for a, b in zip(first.registrations, second.registrations, strict=True))
    assert ingest.liveness.live_ids(EP) == {1, 2}


def test_a_changed_value_under_a_held_key_is_decoded_again() -> None:
    decoder = _Counting()
    ingest = Ingestor(decoder)
    entry, changed = model_entry(1), model_entry(1, base_card(32))
    ingest.listed([(entry.key, entry.value)])
    (listing,) = ingest.listed([(changed.key, changed.value)]).inputs
    assert decoder.calls == [entry.key, entry.key]
    assert isinstance(listing, Listing)
    (fresh,) = Ingestor().put(changed.key, changed.value).inputs
    assert isinstance(fresh, WorkerAdded)
    assert list(listing.registrations) == [fresh.registration]
    (old,) = Ingestor().put(entry.key, entry.value).inputs
    assert isinstance(old, WorkerAdded)
    assert old.registration.mdc_checksum != fresh.registration.mdc_checksum


def test_the_cache_forgets_a_key_a_listing_omits_a_removal_names_or_a_refusal_replaces() -> None:
    # It holds no more than the keys last listed or put: each way a key leaves, it is decoded
    # afresh when it comes back.
    decoder = _Counting()
    ingest = Ingestor(decoder)
    one, two = model_entry(1), model_entry(2)
    ingest.listed([(one.key, one.value), (two.key, two.value)])
    ingest.listed([(one.key, one.value)])  # two is gone
    ingest.delete(one.key)  # one is removed
    ingest.put(two.key, b"{broken")  # refused: nothing is remembered for two
    decoder.calls.clear()
    ingest.listed([(one.key, one.value), (two.key, two.value)])
    assert sorted(decoder.calls) == sorted([one.key, two.key])


def test_a_key_kept_through_a_listing_keeps_its_cached_decode() -> None:
    decoder = _Counting()
    ingest = Ingestor(decoder)
    entry = model_entry(1)
    ingest.put(entry.key, entry.value)
    ingest.listed([], keep={entry.key})  # touched while the listing was read
    decoder.calls.clear()
    ingest.listed([(entry.key, entry.value)])
    assert decoder.calls == []
