"""The order a listing is observed in: peer-aligned for new groups, otherwise key order.

Theory of operation
-------------------

The incumbent is the first configuration a frontend observes. Live puts come one at a time,
so their order is the order they happened. A *listing* (the full listing a frontend starts or
resyncs from) is one point in time with no order of its own: the store hands it over in
last-write order, which registration heartbeats reshuffle every few seconds. Observing it in
that order would make a new or restarted frontend pick an effectively random cohort of a
conflicting WorkerSet, and two frontends started a second apart disagree.

So a listing is observed in an order every frontend computes alike:

1. *Peer-aligned.* For a group this frontend holds no registration of yet, when live peer
   frontends already serve a checksum of it and that checksum has workers in the listing,
   that cohort is observed first. A frontend that joins a running fleet (or recovers from an
   empty state) thus reserves what the fleet already serves instead of a random cohort. When
   peers disagree, the checksum served by the most peers wins, then the smallest checksum:
   any rule is fine as long as every frontend applies the same one.
2. *Key order* for everything else (and for everything when there are no peers), sorted by
   instance key: the order etcd lists keys in, which is what Dynamo's own frontends observe,
   so frontends that cold-start together agree with each other and with a Dynamo frontend.

Groups the frontend already holds keep their cohort order: it is first-observation order and a
listing never changes it, because the core keeps every cohort it holds in place whatever order
the listing comes in, not because this function leaves such groups alone. Ingestion passes no
``known`` groups, so the peer rule applies to them too, and all it can change there is the
relative order of cohorts the frontend has not seen yet, which join behind the ones it holds.
The function is pure and total; it never drops or duplicates a registration.

A *recorded* cohort order (the decision state a trace starts with, taken from a live frontend)
is the same idea made exact: the listing that follows is observed so that every group's cohorts
line up in the order that frontend holds them, and a replay reaches the decision it made.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Container, Iterable, Mapping, Sequence

from workerset_admission.identity import Registration

__all__ = ["GroupId", "PeerServed", "observation_order", "peer_choice"]

GroupId = tuple[str, str]
"""A group as (model, worker_set key): the form peers publish it in."""

PeerServed = Mapping[GroupId, Collection[str]]
"""Per group, the checksum each live peer frontend serves (one entry per peer)."""


def peer_choice(served: Iterable[str], present: Container[str]) -> str | None:
    """Pick the peers' checksum to observe first: most peers, then smallest; ``None`` if absent."""
    counts = Counter(checksum for checksum in served if checksum in present)
    if not counts:
        return None
    return min(counts, key=lambda checksum: (-counts[checksum], checksum))


def observation_order(
    registrations: Sequence[Registration],
    peers: PeerServed | None = None,
    *,
    known: Container[GroupId] = (),
    recorded: Mapping[GroupId, Sequence[str]] | None = None,
) -> list[Registration]:
    """Return ``registrations`` in the order to observe them (see the theory of operation).

    ``known`` names groups whose registrations peers must not reorder (they keep key order);
    the service and replay pass none (see the theory of operation). ``recorded`` gives, per
    group, a cohort order to reproduce (checksums, first first); it wins over peers. LoRA
    adapters never create a group and keep their key order.
    """
    first: dict[GroupId, Mapping[str, int]] = {}
    if recorded:
        for group, order in recorded.items():
            first[group] = {checksum: i for i, checksum in enumerate(dict.fromkeys(order))}
    if peers:
        present: dict[GroupId, set[str]] = {}
        for reg in registrations:
            if reg.model_suffix is None:
                gk = reg.group
                present.setdefault((gk.model, gk.worker_set), set()).add(reg.mdc_checksum)
        for group, checksums in present.items():
            if group in known or group in first:
                continue
            choice = peer_choice(peers.get(group, ()), checksums)
            if choice is not None:
                first[group] = {choice: 0}
    last = len(registrations) + 1

    def rank(reg: Registration) -> tuple[int, str]:
        if first and reg.model_suffix is None:
            gk = reg.group
            order = first.get((gk.model, gk.worker_set))
            if order is not None:
                return (order.get(reg.mdc_checksum, last), reg.key)
        return (last, reg.key)

    return sorted(registrations, key=rank)
