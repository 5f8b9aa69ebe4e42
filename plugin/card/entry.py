"""What a discovery entry is: its kind, told once from its key, and the boundary's one decode.

Every record in the discovery key space (``keys.py``) is one of five kinds, told by its key's
prefix alone: a model card (``v1.mdc.``), an endpoint instance (``v1.instances.``), an
event-plane source or channel (``v1.event_sources.``, ``v1.event_channels.``), a drain
(``v1.drain.``), or a key outside the space (unknown, refused). :func:`entry_kind` is the one
place that reads the prefixes; :class:`EntryDecoder` asks it once per entry and hands the entry
to the decoder of that kind, so ingestion never looks at a key's spelling itself.

A source that is not a KV bucket (a store with its own watch) files its records under these
keys too (``model_kv_key``, ``endpoint_kv_key``, ``drain_kv_key``, ``event_kv_key``), and
everything after the source judges them the same way.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

from workerset_admission.card.boundary import BoundarySettings, decode_model_entry
from workerset_admission.card.drain_record import decode_drain_record
from workerset_admission.card.endpoint_record import decode_endpoint_record
from workerset_admission.card.events import decode_event_record, is_event_key, parse_event_key
from workerset_admission.identity import Drain, EndpointId, Registration
from workerset_admission.keys import (
    DRAIN_PREFIX,
    ENDPOINT_PREFIX,
    MODEL_PREFIX,
    parse_drain_key,
    parse_key,
)

__all__ = [
    "DecodedEntry",
    "EntryDecoder",
    "EntryKind",
    "EventEntry",
    "LiveInstance",
    "Removal",
    "entry_kind",
]


class EntryKind(enum.Enum):
    """The five kinds of discovery entry, told by the key alone."""

    CARD = "card"
    ENDPOINT = "endpoint"
    EVENT = "event"
    DRAIN = "drain"
    UNKNOWN = "unknown"


def entry_kind(key: str) -> EntryKind:
    """Tell what a discovery key names from its prefix (the key may still be malformed)."""
    if key.startswith(MODEL_PREFIX):
        return EntryKind.CARD
    if key.startswith(ENDPOINT_PREFIX):
        return EntryKind.ENDPOINT
    if key.startswith(DRAIN_PREFIX):
        return EntryKind.DRAIN
    if is_event_key(key):
        return EntryKind.EVENT
    return EntryKind.UNKNOWN


class LiveInstance(NamedTuple):
    """What the boundary makes of an endpoint-instance record: this instance is live."""

    endpoint: EndpointId
    instance_id: int


class EventEntry(NamedTuple):
    """What the boundary makes of a valid event-plane record: checked, left out of admission.

    ``worker_id`` is the worker an event source names (``None`` for a channel).
    """

    key: str
    worker_id: int | None = None


DecodedEntry = Registration | LiveInstance | EventEntry | Drain | None
"""What the boundary makes of a put: a registration, a live endpoint instance, a valid
event-plane record, a drain, or ``None`` (a record this frontend ignores)."""


class Removal(NamedTuple):
    """What a removed key was: its kind and the name it is known by.

    A model card is known by its registration key (``<ns>/<component>/<endpoint>/<id hex>``
    with its suffix), an endpoint instance and a drain by their bucket key.
    """

    kind: EntryKind
    name: str


class EntryDecoder:
    """The card boundary as ingestion asks it: one decode per entry, by the entry's kind.

    Endpoint-instance records become :class:`LiveInstance` values for the liveness index;
    event-plane records are validated and otherwise left alone (they only ride along with the
    workers admission admits); both are ignored outside the namespace filter, as model records
    and drains are. Model records become registrations, their card decoded and hashed by the
    boundary (which caches by card text, so a fleet sharing one card pays for it once).
    ``decode`` and ``removal`` raise :class:`~workerset_admission.errors.RemoteDataError` for
    records they refuse, an unknown key included.
    """

    def __init__(self, settings: BoundarySettings | None = None) -> None:
        self._settings = settings if settings is not None else BoundarySettings()

    @property
    def settings(self) -> BoundarySettings:
        """The boundary settings records are judged with."""
        return self._settings

    def decode(self, key: str, value: bytes) -> DecodedEntry:
        settings = self._settings
        kind = entry_kind(key)
        if kind is EntryKind.CARD:
            return decode_model_entry(key, value, settings)
        if kind is EntryKind.EVENT:
            parsed_event = parse_event_key(key)
            if not settings.namespace_matches(parsed_event.namespace):
                return None
            event = decode_event_record(parsed_event, value, max_value_size=settings.max_value_size)
            return EventEntry(key, event.worker_id)
        if kind is EntryKind.DRAIN:
            drain = decode_drain_record(key, value)
            return drain if settings.namespace_matches(drain.namespace) else None
        # An endpoint record, or an unknown key, which parse_key refuses.
        parsed = parse_key(key)
        if not settings.namespace_matches(parsed.endpoint.namespace):
            return None
        record = decode_endpoint_record(parsed, value, settings)
        return LiveInstance(record.endpoint, record.instance_id)

    def removal(self, key: str) -> Removal | None:
        """Say what a removed key was; ``None`` for one that changes nothing here."""
        kind = entry_kind(key)
        if kind is EntryKind.EVENT:
            parse_event_key(key)
            return None
        if kind is EntryKind.DRAIN:
            namespace, _ = parse_drain_key(key)
            return Removal(kind, key) if self._settings.namespace_matches(namespace) else None
        parsed = parse_key(key)
        if parsed.kind == "model":
            return Removal(EntryKind.CARD, parsed.instance_key)
        return Removal(EntryKind.ENDPOINT, key)
