"""Applying a listing holds the cyclic collector off only while it runs, and leaves it as found."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest
from support.cards import base_card as demo_card
from workerset_admission.card import encode_model_record, model_kv_key
from workerset_admission.identity import EndpointId
from workerset_admission.ports import DiscoveryEntry, SourceListing
from workerset_admission.service.admission_service import AdmissionService
from workerset_admission.service.ingest import Ingestor

EP = EndpointId("dynamo", "backend", "generate")


class IdleSource:
    """A source never started: these tests hand events to the service directly."""


def listing(count: int) -> SourceListing:
    return SourceListing(
        entries=tuple(
            DiscoveryEntry(model_kv_key(EP, i), encode_model_record(EP, i, demo_card()), i)
            for i in range(1, count + 1)
        )
    )


@pytest.fixture
def collector_state() -> Iterator[None]:
    was_enabled = gc.isenabled()
    yield
    if was_enabled:
        gc.enable()
    else:
        gc.disable()


async def test_the_collector_is_off_while_a_listing_is_applied_and_on_again_after(
    collector_state: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    gc.enable()
    service = AdmissionService(IdleSource())  # type: ignore[arg-type]
    seen: list[bool] = []
    listing_of = Ingestor.listing

    def judged(self: Ingestor, *args: Any, **kwargs: Any) -> Any:
        seen.append(gc.isenabled())
        return listing_of(self, *args, **kwargs)

    monkeypatch.setattr(Ingestor, "listing", judged)
    service.handle_event(listing(3))
    assert seen == [False]
    assert gc.isenabled()
    assert sum(len(c.members) for g in service.core.groups() for c in g.cohorts) == 3


async def test_a_collector_the_host_turned_off_stays_off(collector_state: None) -> None:
    gc.disable()
    service = AdmissionService(IdleSource())  # type: ignore[arg-type]
    service.handle_event(listing(2))
    assert not gc.isenabled()
