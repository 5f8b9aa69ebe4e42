"""Admission channels: one watch channel per group tenure, carrying the admitted worker ids.

Besides the ids, a channel carries what the core may change without a rebuild: the group's
LoRA projection (``LoraProjectionChanged``) and the taints of its workers (``TaintsUpdated``),
so every hop bound to the tenure sees them on its next read.

A channel has two halves, after anyio's memory streams. The service holds the
:class:`AdmissionSender`; every routing hop holds an :class:`AdmissionReceiver`. A receiver
always has a current value (watch semantics: a late reader sees only the latest state, never a
backlog) and can wait for the next change. When the group's tenure ends the sender retires the
channel: its admissions are cleared, every waiter wakes with :class:`ReceiverRetired`, and
nothing can be sent through it again. A successor tenure always gets a *new* channel, so a
hop that kept an old receiver can never see a successor's ids, even when the same endpoint or
checksum comes back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from workerset_admission.admission.admitted import AdmittedIds, HoldsAdmittedIds
from workerset_admission.admission.effects import (
    LoraProjectionChanged,
    LoraWorker,
    OpenReceiver,
    PublishAdmissions,
    RetireReceiver,
)
from workerset_admission.errors import ReceiverClosed, ReceiverRetired, UsageError
from workerset_admission.identity import GroupKey

__all__ = [
    "AdmissionChannels",
    "AdmissionReceiver",
    "AdmissionSender",
    "AdmissionState",
    "open_admission_channel",
]


@dataclass(frozen=True, slots=True)
class AdmissionState(HoldsAdmittedIds):
    """What a receiver sees: the tenure's identity, its admitted ids and the selected card.

    ``version`` counts the values sent through the channel, starting at 0. ``lora`` is the group's
    LoRA projection (the adapters each admitted worker serves) and ``taints`` the taints changed in
    place during the tenure, by registration key. ``ids`` is the core's lazy ``AdmittedIds`` of the
    admitted ids (any other set given here is wrapped in one); ``admitted`` reads it as a frozenset,
    so a burst of publications between two reads costs one materialisation.
    """

    group: GroupKey
    receiver: int
    mdc_checksum: str
    generation: int
    ids: AdmittedIds
    version: int = 0
    card: Any = field(default=None, compare=False, repr=False)
    lora: tuple[LoraWorker, ...] = ()
    taints: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: _NO_TAINTS)
    # Admitted ids a held tenure serves on their last known records (see PublishAdmissions).
    last_known: frozenset[int] = frozenset()


_NO_TAINTS: Mapping[str, tuple[str, ...]] = MappingProxyType({})
_NOBODY = AdmittedIds.of(())


class _Channel:
    __slots__ = ("changed", "retired", "state")

    def __init__(self, state: AdmissionState) -> None:
        self.state = state
        self.retired = False
        # One event per version: setting it wakes everyone waiting on that version.
        self.changed = asyncio.Event()

    def bump(self, state: AdmissionState) -> None:
        self.state = state
        event, self.changed = self.changed, asyncio.Event()
        event.set()


class AdmissionReceiver:
    """The reading half: ``current()``, ``await changed()``, ``async for``, ``close()``."""

    __slots__ = ("_channel", "_closed", "_seen")

    def __init__(self, channel: _Channel) -> None:
        self._channel = channel
        self._seen = channel.state.version
        self._closed = False

    @property
    def receiver_id(self) -> int:
        return self._channel.state.receiver

    @property
    def group(self) -> GroupKey:
        return self._channel.state.group

    @property
    def retired(self) -> bool:
        return self._channel.retired

    def _check(self) -> None:
        # Retirement is news about the group and wins over a local close.
        if self._channel.retired:
            raise ReceiverRetired(
                f"admission receiver {self.receiver_id} of group {self.group.id} is retired"
            )
        if self._closed:
            raise ReceiverClosed(f"admission receiver {self.receiver_id} was closed")

    def current(self) -> AdmissionState:
        """Return the latest state without waiting; raise once retired or closed."""
        self._check()
        return self._channel.state

    def admitted(self) -> frozenset[int]:
        return self.current().admitted

    async def changed(self) -> AdmissionState:
        """Wait for a state newer than the last one this receiver returned, and return it."""
        while True:
            self._check()
            channel = self._channel
            if channel.state.version > self._seen:
                self._seen = channel.state.version
                return channel.state
            await channel.changed.wait()

    def clone(self) -> AdmissionReceiver:
        """Another independent reader of the same channel."""
        self._check()
        return AdmissionReceiver(self._channel)

    def close(self) -> None:
        """Stop using this receiver; other receivers and the sender are unaffected."""
        self._closed = True

    def __aiter__(self) -> AdmissionReceiver:
        return self

    async def __anext__(self) -> AdmissionState:
        """Yield each new state; the iteration ends when the channel is retired."""
        try:
            return await self.changed()
        except ReceiverRetired:
            raise StopAsyncIteration from None

    def __repr__(self) -> str:
        state = "retired" if self._channel.retired else "closed" if self._closed else "open"
        return f"<AdmissionReceiver {self.receiver_id} {self.group.id} {state}>"


class AdmissionSender:
    """The writing half, held by the service."""

    __slots__ = ("_channel",)

    def __init__(self, channel: _Channel) -> None:
        self._channel = channel

    @property
    def state(self) -> AdmissionState:
        return self._channel.state

    @property
    def retired(self) -> bool:
        return self._channel.retired

    def send(
        self,
        admitted: Iterable[int],
        *,
        generation: int | None = None,
        card: Any = None,
        last_known: frozenset[int] = frozenset(),
    ) -> AdmissionState:
        """Replace the admitted ids (and optionally generation and card); wake the readers.

        An :class:`AdmittedIds` is kept as it is, unread, until a reader asks.
        """
        channel = self._channel
        if channel.retired:
            raise UsageError(f"admission channel {channel.state.receiver} is retired")
        old = channel.state
        new = replace(
            old,
            ids=AdmittedIds.of(admitted),
            generation=old.generation if generation is None else generation,
            card=old.card if card is None else card,
            version=old.version + 1,
            last_known=last_known,
        )
        channel.bump(new)
        return new

    def update(
        self,
        *,
        lora: tuple[LoraWorker, ...] | None = None,
        taints: tuple[str, tuple[str, ...]] | None = None,
    ) -> AdmissionState:
        """Change the LoRA projection, or one worker's taints; the ids stay; wake the readers."""
        channel = self._channel
        if channel.retired:
            raise UsageError(f"admission channel {channel.state.receiver} is retired")
        old = channel.state
        held = old.taints
        if taints is not None:
            key, values = taints
            held = MappingProxyType({**old.taints, key: values})
        new = replace(
            old,
            lora=old.lora if lora is None else lora,
            taints=held,
            version=old.version + 1,
        )
        channel.bump(new)
        return new

    def subscribe(self) -> AdmissionReceiver:
        """Open a new reader that starts at the current value."""
        if self._channel.retired:
            raise ReceiverRetired(f"admission channel {self._channel.state.receiver} is retired")
        return AdmissionReceiver(self._channel)

    def retire(self) -> None:
        """End the tenure: clear the ids, wake every reader with ``ReceiverRetired``. Idempotent."""
        channel = self._channel
        if channel.retired:
            return
        channel.retired = True
        old = channel.state
        channel.bump(replace(old, ids=_NOBODY, version=old.version + 1))


def open_admission_channel(
    group: GroupKey,
    receiver: int,
    mdc_checksum: str,
    generation: int,
    admitted: Iterable[int] = (),
    card: Any = None,
) -> tuple[AdmissionSender, AdmissionReceiver]:
    """Create a channel for one tenure and return its two halves."""
    channel = _Channel(
        AdmissionState(group, receiver, mdc_checksum, generation, AdmittedIds.of(admitted), 0, card)
    )
    return AdmissionSender(channel), AdmissionReceiver(channel)


class AdmissionChannels:
    """Every open admission channel, driven by the core's receiver effects.

    One typed method per effect it carries: :meth:`open` (``OpenReceiver``), :meth:`publish`
    (``PublishAdmissions``), :meth:`project` (``LoraProjectionChanged``) and :meth:`retire`
    (``RetireReceiver``); the step chooses which, so nothing here looks at an effect's type.
    ``update_taints`` carries ``TaintsUpdated`` to the group whose tenure serves the worker (the
    core names it; the channel does not look it up).
    """

    __slots__ = ("_by_group", "_by_id")

    def __init__(self) -> None:
        self._by_id: dict[int, AdmissionSender] = {}
        self._by_group: dict[GroupKey, AdmissionSender] = {}

    def open(self, effect: OpenReceiver) -> None:
        """Open the channel of a new tenure."""
        if effect.receiver in self._by_id:
            raise UsageError(f"admission channel {effect.receiver} is already open")
        sender, _reader = open_admission_channel(
            effect.group, effect.receiver, effect.mdc_checksum, effect.generation
        )
        self._by_id[effect.receiver] = sender
        self._by_group[effect.group] = sender

    def publish(self, effect: PublishAdmissions) -> None:
        """Send a tenure's admitted ids to its readers."""
        sender = self._by_id.get(effect.receiver)
        if sender is None:
            raise UsageError(f"no open admission channel {effect.receiver}")
        # The ``AdmittedIds``, not effect.admitted: readers materialise it only if they look.
        sender.send(
            effect.ids,
            generation=effect.generation,
            card=effect.card,
            last_known=effect.last_known,
        )

    def project(self, effect: LoraProjectionChanged) -> None:
        """Change a tenure's LoRA projection; the ids stay."""
        sender = self._by_id.get(effect.receiver)
        if sender is not None:
            sender.update(lora=effect.workers)

    def retire(self, effect: RetireReceiver) -> None:
        """End a tenure: its readers see ``ReceiverRetired``. Idempotent."""
        sender = self._by_id.pop(effect.receiver, None)
        if sender is not None:
            sender.retire()
            if self._by_group.get(effect.group) is sender:
                del self._by_group[effect.group]

    def update_taints(self, group: GroupKey, key: str, taints: tuple[str, ...]) -> bool:
        """Tell the group's tenure that worker ``key`` now has ``taints``; False if none is open."""
        sender = self._by_group.get(group)
        if sender is None or sender.retired:
            return False
        sender.update(taints=(key, taints))
        return True

    def subscribe(self, group: GroupKey) -> AdmissionReceiver | None:
        """Open a receiver on the group's current tenure, or return ``None`` when it has none."""
        sender = self._by_group.get(group)
        return None if sender is None else sender.subscribe()

    def sender(self, receiver: int) -> AdmissionSender | None:
        return self._by_id.get(receiver)

    def __len__(self) -> int:
        return len(self._by_id)
