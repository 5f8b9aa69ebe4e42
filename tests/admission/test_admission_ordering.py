"""The order a listing is observed in: peer-aligned for new groups, otherwise key order."""

from __future__ import annotations

from admission_support import G, group_key, reg
from hypothesis import given
from hypothesis import strategies as st
from workerset_admission.admission import AdmissionCore, Listing, WorkerAdded
from workerset_admission.admission.ordering import observation_order, peer_choice
from workerset_admission.identity import EndpointId

GID = (G.model, G.worker_set)
OTHER = group_key(endpoint=EndpointId("ns2", "workers", "generate"))


def incumbent_after(listing: list) -> str | None:  # type: ignore[type-arg]
    core = AdmissionCore()
    core.apply(Listing(listing))
    view = core.group(G)
    return None if view is None else view.incumbent


def test_without_peers_a_listing_is_observed_in_key_order_whatever_order_it_came_in() -> None:
    listing = [reg(0x30, "B"), reg(0x10, "A"), reg(0x20, "B")]
    ordered = observation_order(listing)
    assert [r.instance_id for r in ordered] == [0x10, 0x20, 0x30]
    assert incumbent_after(ordered) == "A"


def test_the_cohort_live_peers_serve_is_observed_first() -> None:
    listing = [reg(0x10, "A"), reg(0x20, "B"), reg(0x30, "B")]
    ordered = observation_order(listing, {GID: ["B", "B"]})
    assert [r.mdc_checksum for r in ordered] == ["B", "B", "A"]
    assert incumbent_after(ordered) == "B"


def test_a_checksum_peers_serve_that_has_no_worker_listed_falls_back_to_key_order() -> None:
    listing = [reg(0x20, "B"), reg(0x10, "A")]
    assert incumbent_after(observation_order(listing, {GID: ["C"]})) == "A"


def test_peers_never_reorder_a_group_the_frontend_already_holds() -> None:
    listing = [reg(0x10, "A"), reg(0x20, "B")]
    assert [r.instance_id for r in observation_order(listing, {GID: ["B"]}, known={GID})] == [
        0x10,
        0x20,
    ]


def test_peers_of_one_group_do_not_reorder_another() -> None:
    listing = [reg(0x20, "B", group=OTHER), reg(0x10, "A", group=OTHER), reg(0x5, "A")]
    ordered = observation_order(listing, {GID: ["A"]})
    assert [(r.group == G, r.instance_id) for r in ordered] == [
        (True, 5),
        (False, 0x10),
        (False, 0x20),
    ]


def test_disagreeing_peers_resolve_to_the_most_served_then_the_smallest_checksum() -> None:
    assert peer_choice(["B", "A", "B"], {"A", "B"}) == "B"
    assert peer_choice(["B", "A"], {"A", "B"}) == "A"
    assert peer_choice(["C", "C", "B"], {"A", "B"}) == "B"
    assert peer_choice([], {"A"}) is None


@given(
    st.permutations([reg(i, cs) for i, cs in ((1, "A"), (2, "B"), (3, "A"), (9, "C"), (5, "B"))]),
    st.sampled_from([None, ["B"], ["C", "A"], ["D"]]),
)
def test_every_frontend_computes_the_same_order_from_any_listing_order(
    listing: list,
    peers: list[str] | None,  # type: ignore[type-arg]
) -> None:
    served = None if peers is None else {GID: peers}
    ordered = observation_order(listing, served)
    assert sorted(r.key for r in ordered) == sorted(r.key for r in listing)
    assert ordered == observation_order(sorted(listing, key=lambda r: r.key), served)
    expected = {None: "A", ("B",): "B", ("C", "A"): "A", ("D",): "A"}[
        None if peers is None else tuple(peers)
    ]
    assert incumbent_after(ordered) == expected


def test_live_puts_after_the_listing_keep_their_own_order() -> None:
    core = AdmissionCore()
    core.apply(Listing(observation_order([reg(0x20, "B")], {GID: ["A"]})))
    core.apply(WorkerAdded(reg(0x10, "A")))
    assert core.group(G).incumbent == "B"  # type: ignore[union-attr]


def test_a_recorded_cohort_order_is_reproduced_and_wins_over_peers() -> None:
    listing = [reg(0x10, "A"), reg(0x20, "B"), reg(0x30, "C"), reg(0x40, "B")]
    ordered = observation_order(listing, {GID: ["A"]}, recorded={GID: ["C", "B"]})
    assert [r.mdc_checksum for r in ordered] == ["C", "B", "B", "A"]
    core = AdmissionCore()
    core.apply(Listing(ordered))
    assert [c.mdc_checksum for c in core.group(G).cohorts] == ["C", "B", "A"]  # type: ignore[union-attr]
