"""The drain protocol as one pure machine: read, judge, swap, write, release.

Theory of operation
-------------------
A drain must not take a model's last routable worker unsaid, and two drains run at once must
not both pass a check that only one of them may pass. The store offers one atomic step, a
compare-and-set of a key on its revision; each model a drain touches has one budget record
(``card/drain_record.py``) that every drain of that model swaps before it writes anything a
frontend reads. This module holds the whole protocol as a state machine that performs no I/O:
the driver (``cli/drain.py``) asks it for an :class:`Action`, carries it out on the store, and
reports what came of it as one of the events below. The machine decides everything else: what
to read, whether the check passes, what each budget becomes, when to retry, when to give up.

The states and what happens in each::

    READING ──read──▶ JUDGING ──pass (first)──▶ PREPARING ──prepared──▶ SWAPPING
       ▲                 │  └──pass (again)─────────────────────────────▶ SWAPPING
       │                 └──refuse──▶ REFUSED, or RELEASING_REFUSED ──released──▶ REFUSED
       │                                                              (budgets it swapped)
       └───────retry─────── SWAPPING ──swapped──▶ SWAPPING ──all swapped──▶ WRITING
                              │                                              │
                              └──give up──▶ GAVE_UP, or                   written
                                  RELEASING_GAVE_UP ──released──▶ GAVE_UP     ▼
                                                                  RELEASING ──released──▶ DONE

*Reading* takes, in this order, the budget record of every model (its revision, its value, the
server's time of it), the drain records in force, the serving records, the discovery listing,
and the server's time now; a budget read first and the drains after means a pending drain a
later swap dropped because its drain record was seen is in that listing. *Judging* runs the
last-worker check with the drains in force and the budgets' pending ones counted as drained;
a refusal ends the protocol (after taking this drain's workers out of any budget it swapped
them into, on a retry). The first pass asks the driver to *prepare*: to try this user's right to
write every record it will write, storing none. *Swapping* writes each budget record, one
after another, expecting the revision read: a swap that finds the record moved is a lost race,
and the protocol reads everything again (after a spread-out pause, so one of the contenders
wins the next round), or, past the deadline, gives up. Once every budget holds this drain's
workers, *writing* the drain records is safe: any other drain reads the budgets after this
one's swap and counts these workers as drained. *Releasing* takes them out of the budgets
again once their drain records say it.

Transitions live in one table, :data:`TRANSITIONS`, keyed by (state, event); the machine fires
only what the table names. An event the table does not name for the current state raises
:class:`ProtocolError` and leaves the machine exactly as it was (h11's rule): a driver that
reports out of turn is a bug, not a new state. Outcomes that depend on data (does the check
pass, is every budget swapped, is the deadline past) are decided by the machine and fired as
its own events (``PASSED``, ``ALL_SWAPPED``, ``GIVE_UP`` ...), through the same table.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from workerset_admission.card.drain_record import budget_kv_key
from workerset_admission.card.serving_record import Record
from workerset_admission.rollout.drain import (
    PENDING_WINDOW,
    BudgetRead,
    Emptied,
    Worker,
    budget_after,
    budget_released,
    pending_drains,
)

__all__ = [
    "TRANSITIONS",
    "Action",
    "DrainProtocol",
    "Event",
    "Finish",
    "Judge",
    "Prepare",
    "ProtocolError",
    "Read",
    "Release",
    "Snapshot",
    "State",
    "Swap",
    "Write",
]


class State(enum.Enum):
    READING = "reading"
    JUDGING = "judging"
    PREPARING = "preparing"
    SWAPPING = "swapping"
    WRITING = "writing"
    RELEASING = "releasing"
    RELEASING_REFUSED = "releasing_refused"
    RELEASING_GAVE_UP = "releasing_gave_up"
    DONE = "done"
    REFUSED = "refused"
    GAVE_UP = "gave_up"


class Event(enum.Enum):
    # Reported by the driver.
    READ = "read"
    PREPARED = "prepared"
    SWAPPED = "swapped"
    RACED = "raced"
    WRITTEN = "written"
    RELEASED = "released"
    # Fired by the machine itself, from what it judged.
    PASSED = "passed"
    PASSED_AGAIN = "passed_again"
    REFUSE = "refuse"
    REFUSE_AFTER_SWAP = "refuse_after_swap"
    ALL_SWAPPED = "all_swapped"
    RETRY = "retry"
    GIVE_UP = "give_up"
    GIVE_UP_AFTER_SWAP = "give_up_after_swap"


S, E = State, Event

TRANSITIONS: Mapping[tuple[State, Event], State] = {
    (S.READING, E.READ): S.JUDGING,
    (S.JUDGING, E.PASSED): S.PREPARING,
    (S.JUDGING, E.PASSED_AGAIN): S.SWAPPING,
    (S.JUDGING, E.REFUSE): S.REFUSED,
    (S.JUDGING, E.REFUSE_AFTER_SWAP): S.RELEASING_REFUSED,
    (S.PREPARING, E.PREPARED): S.SWAPPING,
    (S.SWAPPING, E.SWAPPED): S.SWAPPING,
    (S.SWAPPING, E.ALL_SWAPPED): S.WRITING,
    (S.SWAPPING, E.RACED): S.SWAPPING,
    (S.SWAPPING, E.RETRY): S.READING,
    (S.SWAPPING, E.GIVE_UP): S.GAVE_UP,
    (S.SWAPPING, E.GIVE_UP_AFTER_SWAP): S.RELEASING_GAVE_UP,
    (S.WRITING, E.WRITTEN): S.RELEASING,
    (S.RELEASING, E.RELEASED): S.DONE,
    (S.RELEASING_REFUSED, E.RELEASED): S.REFUSED,
    (S.RELEASING_GAVE_UP, E.RELEASED): S.GAVE_UP,
}
"""Every transition there is: (state, event) -> the state it leads to."""

FINAL = frozenset({S.DONE, S.REFUSED, S.GAVE_UP})


class ProtocolError(Exception):
    """An event reported out of turn (the machine's state is unchanged)."""


# -- what the machine asks the driver to do ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class Read:
    """Read the budgets of ``models`` (in order), then the drains, serving, listing, server time.

    ``pause`` seconds first: a retry after a lost race spreads the contenders out.
    """

    models: tuple[str, ...]
    listing: bool
    pause: float = 0.0


@dataclass(frozen=True, slots=True)
class Prepare:
    """Try this user's right to write the drain records and these budget keys, storing none."""

    budget_keys: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Swap:
    """Write ``value`` to ``key`` only if it is still at ``revision``; keep it ``ttl`` seconds."""

    model: str
    key: str
    value: bytes
    revision: int | None
    ttl: float


@dataclass(frozen=True, slots=True)
class Write:
    """Write the drain records of ``workers`` (the budgets hold them)."""

    workers: tuple[Worker, ...]
    # The check's findings the operator allowed (--allow-empty), to be told.
    allowed: tuple[Emptied, ...] = ()


@dataclass(frozen=True, slots=True)
class Release:
    """Take this drain's workers out of the budgets of ``models`` (see :meth:`released`)."""

    models: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Finish:
    """The protocol ended in ``state``: done, refused (``emptied``), or gave up (``model``)."""

    state: State
    emptied: tuple[Emptied, ...] = ()
    # A retry that lost a race refuses with other drains' workers taken first.
    raced: bool = False
    model: str | None = None


Action = Read | Prepare | Swap | Write | Release | Finish


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One reading of the store, in the order :class:`Read` asks for it."""

    budgets: Mapping[str, BudgetRead]
    in_force: Sequence[Worker]
    serving: Sequence[Record]
    listing: Sequence[tuple[str, bytes]]
    # The NATS server's time now (Unix seconds); None when it did not say it.
    server_now: float | None


# The last-worker check (``rollout/drain.py``): (records, listing, workers, drained) -> findings.
Judge = Callable[
    [Sequence[Record], Sequence[tuple[str, bytes]], Sequence[Worker], Sequence[Worker]],
    tuple[Emptied, ...],
]


@dataclass(slots=True)
class DrainProtocol:
    """One drain's protocol; see the module doc. Ask :meth:`next_action`, report events."""

    workers: tuple[Worker, ...]
    models: tuple[str, ...]
    judge: Judge
    allow_empty: bool = False
    window: float = PENDING_WINDOW
    state: State = State.READING
    attempt: int = 0
    prepared: bool = False
    # What the last read and judgement found, and the swaps left to make.
    snapshot: Snapshot | None = None
    emptied: tuple[Emptied, ...] = ()
    swaps: list[Swap] = field(default_factory=list)
    swapped: list[str] = field(default_factory=list)
    raced_model: str | None = None
    # A random number in [0, 1) per retry, to spread contenders (the driver's source).
    jitter: Callable[[], float] = lambda: 0.5

    # -- the table ---------------------------------------------------------------------------

    def _fire(self, event: Event) -> None:
        nxt = TRANSITIONS.get((self.state, event))
        if nxt is None:
            raise ProtocolError(f"no transition from {self.state.value} on {event.value}")
        self.state = nxt

    def _check(self, event: Event) -> None:
        """Raise unless ``event`` may be reported now; changes nothing."""
        if (self.state, event) not in TRANSITIONS:
            raise ProtocolError(f"no transition from {self.state.value} on {event.value}")

    # -- what to do next ---------------------------------------------------------------------

    def next_action(self) -> Action:
        state = self.state
        if state is S.READING:
            pause = 0.0
            if self.attempt:
                pause = self.jitter() * min(0.02 * self.attempt, 0.3)
            return Read(self.models, listing=self.attempt > 0, pause=pause)
        if state is S.PREPARING:
            return Prepare(tuple(budget_kv_key(m) for m in self.models))
        if state is S.SWAPPING:
            return self.swaps[0]
        if state is S.WRITING:
            allowed = self.emptied if self.allow_empty else ()
            return Write(self.workers, allowed)
        if state in (S.RELEASING, S.RELEASING_REFUSED, S.RELEASING_GAVE_UP):
            return Release(tuple(self.swapped))
        if state is S.REFUSED:
            return Finish(state, self.emptied, raced=self.attempt > 0)
        if state is S.GAVE_UP:
            return Finish(state, model=self.raced_model)
        if state is S.DONE:
            return Finish(state, self.emptied if self.allow_empty else ())
        raise ProtocolError(f"nothing to do in {state.value}")  # JUDGING never rests

    # -- what the driver reports -------------------------------------------------------------

    def read(self, snapshot: Snapshot) -> None:
        """Report the store read: judge it, and go on to prepare, swap or refuse."""
        self._check(E.READ)
        in_force = list(snapshot.in_force)
        pending = pending_drains(snapshot.budgets, in_force, snapshot.server_now, self.window)
        emptied = self.judge(
            snapshot.serving,
            snapshot.listing,
            self.workers,
            [*in_force, *sorted(pending - set(self.workers))],
        )
        self._fire(E.READ)
        self.snapshot, self.emptied = snapshot, emptied
        if emptied and not self.allow_empty:
            self._fire(E.REFUSE_AFTER_SWAP if self.swapped else E.REFUSE)
            return
        self.swaps = [
            Swap(
                model,
                budget_kv_key(model),
                budget_after(
                    model,
                    snapshot.budgets.get(model, BudgetRead()),
                    self.workers,
                    in_force,
                    snapshot.server_now,
                    self.window,
                ),
                snapshot.budgets.get(model, BudgetRead()).revision,
                self.window,
            )
            for model in self.models
        ]
        self._fire(E.PASSED_AGAIN if self.prepared else E.PASSED)
        self._all_swapped()

    def prepare_done(self) -> None:
        """Report that this user may write every record the drain writes."""
        self._fire(E.PREPARED)
        self.prepared = True
        self._all_swapped()

    def swapped_one(self) -> None:
        """Report that the swap asked for went through."""
        self._check(E.SWAPPED)
        swap = self.swaps.pop(0)
        self._fire(E.SWAPPED)
        if swap.model not in self.swapped:
            self.swapped.append(swap.model)
        self._all_swapped()

    def raced(self, past_deadline: bool) -> None:
        """Report the swap asked for found the record moved: read again, or give up."""
        self._check(E.RACED)
        model = self.swaps[0].model
        self._fire(E.RACED)
        self.attempt += 1
        self.swaps = []
        if past_deadline:
            self.raced_model = model
            self._fire(E.GIVE_UP_AFTER_SWAP if self.swapped else E.GIVE_UP)
        else:
            self._fire(E.RETRY)

    def written(self) -> None:
        """Report every drain record written."""
        self._fire(E.WRITTEN)

    def released(self) -> None:
        """Report this drain's workers out of every budget it swapped."""
        self._fire(E.RELEASED)

    def _all_swapped(self) -> None:
        if self.state is S.SWAPPING and not self.swaps:
            self._fire(E.ALL_SWAPPED)

    @property
    def finished(self) -> bool:
        return self.state in FINAL

    def release_value(self, model: str, budget: BudgetRead) -> bytes | None:
        """Return the budget of ``model`` with this drain's workers out (None: nothing to do)."""
        return budget_released(model, budget, self.workers)
