"""A frontend that starts during an outage: its first listing holds as a reconnect listing does."""

from __future__ import annotations

from admission_support import G, finish, of, one, reg
from workerset_admission.admission import (
    AdmissionCore,
    CoreSettings,
    Listing,
    OpenReceiver,
    PeerTenure,
    PublishAdmissions,
    StartBuild,
    Succession,
    TenureHeld,
    TenureHoldEnded,
    Tick,
    WorkerAdded,
    WorkerRemoved,
)

GID = (G.model, G.worker_set)


def _started_at(now: float = 100.0) -> AdmissionCore:
    core = AdmissionCore(CoreSettings(tenure_hold=30.0, registration_ttl=10.0))
    core.apply(Tick(now))
    return core


def test_an_expiry_soon_after_a_first_listing_after_an_outage_holds_the_incumbent() -> None:
    core = _started_at()
    listing = Listing([reg(1, "A"), reg(2, "A"), reg(3, "B")], outage_start=True)
    finish(core, core.apply(listing))
    core.apply(WorkerRemoved(reg(1).key, expired_at=101.0))
    effects = core.apply(WorkerRemoved(reg(2).key, expired_at=101.0))
    held = one(effects, TenureHeld)
    # Counted from the listing, as a reconnect listing's hold is; its members served meanwhile.
    assert (held.mdc_checksum, held.deadline, held.last_known_until) == ("A", 130.0, 110.0)
    assert of(effects, Succession) == []
    # One of them back: the same tenure goes on.
    effects = core.apply(WorkerAdded(reg(1, "A")))
    assert one(effects, TenureHoldEnded).outcome == "rejoined"
    view = core.group(G)
    assert view is not None
    assert (view.incumbent, view.held_until) == ("A", None)


def test_the_same_expiry_after_an_ordinary_first_listing_succeeds_at_once() -> None:
    core = _started_at()
    finish(core, core.apply(Listing([reg(1, "A"), reg(2, "A"), reg(3, "B")])))
    core.apply(WorkerRemoved(reg(1).key, expired_at=101.0))
    effects = core.apply(WorkerRemoved(reg(2).key, expired_at=101.0))
    assert of(effects, TenureHeld) == []
    assert one(effects, Succession).new_checksum == "B"


def test_after_an_outage_a_group_whose_peers_serve_an_unlisted_checksum_is_held_for_it() -> None:
    core = _started_at()
    peers = {GID: PeerTenure("A", (1, 2))}
    effects = core.apply(Listing([reg(3, "B")], outage_start=True, peer_tenures=peers))
    opened = one(effects, OpenReceiver)
    held = one(effects, TenureHeld)
    assert (opened.mdc_checksum, held.mdc_checksum, held.deadline) == ("A", "A", 130.0)
    # Nothing is served: this frontend never saw the peers' workers' records.
    assert (held.last_known, held.last_known_until) == ((), None)
    assert of(effects, StartBuild) == []
    view = core.group(G)
    assert view is not None
    assert [c.mdc_checksum for c in view.cohorts] == ["A", "B"]
    assert (view.incumbent, view.admitted, view.held_until) == ("A", (), 130.0)

    # A worker the peers serve comes back: the hold ends and the tenure builds.
    effects = core.apply(WorkerAdded(reg(2, "A")))
    assert one(effects, TenureHoldEnded).outcome == "rejoined"
    build = one(effects, StartBuild)
    assert build.mdc_checksum == "A"
    finish(core, effects)
    view = core.group(G)
    assert view is not None
    assert (view.incumbent, view.admitted, view.held_until) == ("A", (2,), None)


def test_a_new_instance_of_the_peers_checksum_does_not_end_that_hold() -> None:
    core = _started_at()
    peers = {GID: PeerTenure("A", (1, 2))}
    core.apply(Listing([reg(3, "B")], outage_start=True, peer_tenures=peers))
    effects = core.apply(WorkerAdded(reg(9, "A")))
    assert of(effects, TenureHoldEnded) == []
    view = core.group(G)
    assert view is not None
    assert (view.admitted, view.held_until) == ((), 130.0)


def test_when_none_of_the_peers_members_returns_the_oldest_remaining_cohort_succeeds() -> None:
    core = _started_at()
    peers = {GID: PeerTenure("A", (1, 2))}
    core.apply(Listing([reg(3, "B")], outage_start=True, peer_tenures=peers))
    assert of(core.apply(Tick(129.9)), Succession) == []
    effects = core.apply(Tick(130.0))
    assert one(effects, TenureHoldEnded).outcome == "expired"
    assert one(effects, Succession).new_checksum == "B"
    finish(core, effects)
    view = core.group(G)
    assert view is not None
    assert (view.incumbent, view.admitted) == ("B", (3,))


def test_peers_change_nothing_without_an_outage_or_when_the_listing_holds_their_checksum() -> None:
    peers = {GID: PeerTenure("A", (1, 2))}
    quiet = _started_at()
    effects = quiet.apply(Listing([reg(3, "B")], peer_tenures=peers))
    assert of(effects, TenureHeld) == []
    assert one(effects, OpenReceiver).mdc_checksum == "B"

    listed = _started_at()
    effects = listed.apply(
        Listing([reg(1, "A"), reg(3, "B")], outage_start=True, peer_tenures=peers)
    )
    assert of(effects, TenureHeld) == []
    assert one(effects, OpenReceiver).mdc_checksum == "A"


def test_a_group_this_frontend_holds_keeps_its_own_tenure_after_a_reconnect() -> None:
    core = _started_at()
    finish(core, core.apply(WorkerAdded(reg(3, "B"))))
    peers = {GID: PeerTenure("A", (1, 2))}
    effects = core.apply(Listing([reg(3, "B")], reconnect=True, peer_tenures=peers))
    assert of(effects, TenureHeld) == []
    assert of(effects, OpenReceiver) == []
    view = core.group(G)
    assert view is not None
    assert (view.incumbent, view.admitted) == ("B", (3,))
    assert of(effects, PublishAdmissions) == []


def test_no_hold_for_peers_when_holding_is_turned_off() -> None:
    core = AdmissionCore(CoreSettings(tenure_hold=0.0))
    peers = {GID: PeerTenure("A", (1, 2))}
    effects = core.apply(Listing([reg(3, "B")], outage_start=True, peer_tenures=peers))
    assert of(effects, TenureHeld) == []
    assert one(effects, OpenReceiver).mdc_checksum == "B"


def test_a_first_listing_soon_after_a_peers_resync_is_one_of_that_outage_counted_from_it() -> None:
    # A peer resynced after an outage at 95; this frontend starts at 100 with the store back.
    core = _started_at()
    listing = Listing([reg(1, "A"), reg(2, "A"), reg(3, "B")], peer_outage_at=95.0)
    finish(core, core.apply(listing))
    core.apply(WorkerRemoved(reg(1).key, expired_at=101.0))
    effects = core.apply(WorkerRemoved(reg(2).key, expired_at=101.0))
    held = one(effects, TenureHeld)
    # Its hold ends with the peer's: the peer's reconnect plus the hold.
    assert (held.deadline, held.last_known_until) == (125.0, 105.0)
    assert of(effects, Succession) == []


def test_a_peers_resync_longer_ago_than_the_hold_is_no_outage_of_this_listing() -> None:
    core = _started_at()
    listing = Listing([reg(1, "A"), reg(3, "B")], peer_outage_at=70.0)
    finish(core, core.apply(listing))
    effects = core.apply(WorkerRemoved(reg(1).key, expired_at=101.0))
    assert of(effects, TenureHeld) == []
    assert one(effects, Succession).new_checksum == "B"


def test_what_peers_serve_and_the_listing_lacks_is_held_from_the_peers_resync() -> None:
    core = _started_at()
    peers = {GID: PeerTenure("A", (1, 2))}
    effects = core.apply(Listing([reg(3, "B")], peer_tenures=peers, peer_outage_at=95.0))
    assert one(effects, TenureHeld).deadline == 125.0
    effects = core.apply(Tick(125.0))
    assert one(effects, TenureHoldEnded).held_for == 30.0
    assert one(effects, Succession).new_checksum == "B"


def test_an_expiry_of_what_peers_serve_soon_after_a_first_listing_holds_the_incumbent() -> None:
    # Started after the store came back, before any peer resynced: nobody said there was an
    # outage, but the live peers served A when this frontend listed.
    core = _started_at()
    peers = {GID: PeerTenure("A", (1, 2))}
    finish(core, core.apply(Listing([reg(1, "A"), reg(2, "A"), reg(3, "B")], peer_tenures=peers)))
    core.apply(WorkerRemoved(reg(1).key, expired_at=101.6))
    effects = core.apply(WorkerRemoved(reg(2).key, expired_at=101.9))
    held = one(effects, TenureHeld)
    assert (held.mdc_checksum, held.deadline, held.last_known_until) == ("A", 130.0, 110.0)
    assert of(effects, Succession) == []
    # Workers that really died are succeeded once the hold is over, as the peers did.
    effects = core.apply(Tick(130.0))
    assert one(effects, TenureHoldEnded).outcome == "expired"
    assert one(effects, Succession).new_checksum == "B"


def test_that_expiry_is_live_once_the_hold_window_is_over_or_peers_served_another() -> None:
    core = _started_at()
    peers = {GID: PeerTenure("A", (1, 2))}
    finish(core, core.apply(Listing([reg(1, "A"), reg(2, "A"), reg(3, "B")], peer_tenures=peers)))
    core.apply(WorkerRemoved(reg(1).key, expired_at=130.0))
    effects = core.apply(WorkerRemoved(reg(2).key, expired_at=130.5))
    assert of(effects, TenureHeld) == []
    assert one(effects, Succession).new_checksum == "B"

    core = _started_at()
    peers = {GID: PeerTenure("B", (3,))}
    finish(core, core.apply(Listing([reg(1, "A"), reg(2, "A"), reg(3, "B")], peer_tenures=peers)))
    core.apply(WorkerRemoved(reg(1).key, expired_at=101.0))
    effects = core.apply(WorkerRemoved(reg(2).key, expired_at=101.0))
    assert of(effects, TenureHeld) == []
    assert one(effects, Succession).new_checksum == "B"


def test_a_later_listing_never_starts_that_window() -> None:
    core = _started_at()
    finish(core, core.apply(Listing([reg(1, "A"), reg(2, "A"), reg(3, "B")])))
    peers = {GID: PeerTenure("A", (1, 2))}
    core.apply(Listing([reg(1, "A"), reg(2, "A"), reg(3, "B")], peer_tenures=peers))
    core.apply(WorkerRemoved(reg(1).key, expired_at=101.0))
    effects = core.apply(WorkerRemoved(reg(2).key, expired_at=101.0))
    assert one(effects, Succession).new_checksum == "B"
