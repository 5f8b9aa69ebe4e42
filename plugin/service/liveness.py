"""The liveness index: which endpoint instances have a live ``v1.instances`` record."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from workerset_admission.admission.admitted import routable_ids
from workerset_admission.identity import EndpointId

__all__ = ["LivenessIndex"]


class LivenessIndex:
    """Live endpoint instances, from ``v1.instances`` records, for hops to intersect with.

    A hop never routes to an admitted id that has no live endpoint record, and never to a live
    instance that is not admitted. ``live_ids`` is read on every routing decision, so each
    endpoint's frozen set is built once per change, not once per read.
    """

    __slots__ = ("_by_key", "_frozen", "_live", "_touched")

    def __init__(self) -> None:
        # endpoint -> instance id -> how many records name it (normally one).
        self._live: dict[EndpointId, dict[int, int]] = {}
        self._by_key: dict[str, tuple[EndpointId, int]] = {}
        self._frozen: dict[EndpointId, frozenset[int]] = {}
        # Endpoints whose live ids changed since the status read-model last asked.
        self._touched: set[EndpointId] = set()

    def live_ids(self, endpoint: EndpointId) -> frozenset[int]:
        frozen = self._frozen.get(endpoint)
        if frozen is None:
            frozen = self._frozen[endpoint] = frozenset(self._live.get(endpoint, ()))
        return frozen

    def routable(
        self, endpoint: EndpointId, admitted: Iterable[int], last_known: Iterable[int] = ()
    ) -> frozenset[int]:
        """Return the ids a hop of ``endpoint`` may route to (:func:`routable_ids`)."""
        return routable_ids(admitted, self._live.get(endpoint, {}), last_known)

    def take_touched(self) -> set[EndpointId]:
        """Return the endpoints whose live ids changed since the last call, and forget them."""
        touched, self._touched = self._touched, set()
        return touched

    def __len__(self) -> int:
        return len(self._by_key)

    def entry(self, key: str) -> tuple[EndpointId, int] | None:
        return self._by_key.get(key)

    def put(self, key: str, endpoint: EndpointId, instance_id: int) -> bool:
        if self._by_key.get(key) == (endpoint, instance_id):
            return False
        self._discard(key)
        self._by_key[key] = (endpoint, instance_id)
        ids = self._live.setdefault(endpoint, {})
        ids[instance_id] = ids.get(instance_id, 0) + 1
        self._frozen.pop(endpoint, None)
        self._touched.add(endpoint)
        return True

    def remove(self, key: str) -> bool:
        return self._discard(key)

    def replace(self, entries: Mapping[str, tuple[EndpointId, int]]) -> bool:
        """Make the index exactly ``entries`` (a listing); report whether anything changed."""
        if entries == self._by_key:
            return False
        self._by_key = dict(entries)
        live: dict[EndpointId, dict[int, int]] = {}
        for endpoint, instance_id in entries.values():
            ids = live.setdefault(endpoint, {})
            ids[instance_id] = ids.get(instance_id, 0) + 1
        old = self._live
        self._touched.update(e for e in old.keys() | live.keys() if old.get(e) != live.get(e))
        self._live = live
        self._frozen = {}
        return True

    def _discard(self, key: str) -> bool:
        old = self._by_key.pop(key, None)
        if old is None:
            return False
        endpoint, instance_id = old
        ids = self._live[endpoint]
        if ids[instance_id] > 1:
            ids[instance_id] -= 1
        else:
            del ids[instance_id]
            if not ids:
                del self._live[endpoint]
            self._frozen.pop(endpoint, None)
            self._touched.add(endpoint)
        return True
