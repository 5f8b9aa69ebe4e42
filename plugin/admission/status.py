"""Group status: every state, every event and every allowed transition, in one place.

Theory of operation
-------------------

A group (a WorkerSet plus its model) moves through a small lifecycle while the core decides what
to serve. The core never assigns a status directly; it *processes an event* against this table,
and an event the table does not list for the current state is refused with
:class:`~workerset_admission.errors.TransitionRefused` while the status stays exactly as it was.
A refusal is always a defect in the core, never a consequence of remote data, so it is raised
rather than reported.

States::

    idle           no incumbent cohort: nothing reserved, nothing served
    queued         an incumbent is reserved and waits for a build slot
    building       one build attempt for the incumbent is in flight
    ready          the last build succeeded and the group is committed (served)
    retrying       the last build failed; a new attempt is due at a deadline
    blocked        the commit of a successful build failed; a rebuild is due at a deadline
    blocked_ready  a replacement (a LoRA projection the core refused) failed; the last safe
                   commit is still served and the replacement is retried at a deadline

Events::

    RESERVE         the first valid card (or the successor cohort) reserves the group
    START_BUILD     a build slot was granted
    BUILD_OK        the attempt in flight succeeded (fenced by checksum and generation)
    BUILD_FAILED    the attempt in flight failed
    RETRY_DUE       the retry deadline of a failed build or commit was reached
    MEMBERS_CHANGED a worker joined or left the incumbent cohort while a retry was pending:
                    the rebuild starts at once instead of waiting out the backoff
    COMMIT_FAILED   the service could not commit a successful build (also from
                    ``blocked_ready``: the core refused the commit's LoRA projection first)
    REPLACE_FAILED  the committed group's LoRA projection was refused (the core judges it)
    REPLACE_DUE     the deadline to retry a failed replacement was reached
    END_TENURE      the incumbent cohort lost its last member (or was drained): the tenure ends

``END_TENURE`` is accepted from every state but ``idle`` because a tenure can end at any point of
its life; after it the core may at once ``RESERVE`` again for the successor cohort. Reservation
happens on entry to ``queued``, not on a successful build, which is why a larger competing
cohort never displaces an incumbent that is still building or retrying.

A tenure *held* after an outage is not a status of its own: a ready group stays ready while its
last known members are served, a retrying group stays retrying (the due retry waits for a
member, since there is nothing to build for), and ``END_TENURE`` is processed only if the hold
runs out with no member back. Keeping the hold beside the status rather than in it means no
transition of this table changes; the hold's phases have a table of their own (``hold.py``).
So has a handover (``drain.py``): the drained tenure's status ends (``END_TENURE``) when its
successor reserves the group, while its committed build goes on serving beside it.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from workerset_admission.errors import TransitionRefused

__all__ = [
    "TRANSITIONS",
    "GroupStatus",
    "StatusEvent",
    "StatusMachine",
]


class GroupStatus(str, enum.Enum):
    """Where a group is in its lifecycle; the value is the spelling used in output."""

    IDLE = "idle"
    QUEUED = "queued"
    BUILDING = "building"
    READY = "ready"
    RETRYING = "retrying"
    BLOCKED = "blocked"
    BLOCKED_READY = "blocked_ready"

    @property
    def committed(self) -> bool:
        """Whether a commit of this group is being served in this state."""
        return self is GroupStatus.READY or self is GroupStatus.BLOCKED_READY


class StatusEvent(str, enum.Enum):
    """Something that happened to a group and may move its status."""

    RESERVE = "reserve"
    START_BUILD = "start_build"
    BUILD_OK = "build_ok"
    BUILD_FAILED = "build_failed"
    RETRY_DUE = "retry_due"
    MEMBERS_CHANGED = "members_changed"
    COMMIT_FAILED = "commit_failed"
    REPLACE_FAILED = "replace_failed"
    REPLACE_DUE = "replace_due"
    END_TENURE = "end_tenure"


_S = GroupStatus
_E = StatusEvent

# (state, event) -> next state. Anything absent is refused.
TRANSITIONS: Mapping[tuple[GroupStatus, StatusEvent], GroupStatus] = {
    (_S.IDLE, _E.RESERVE): _S.QUEUED,
    (_S.QUEUED, _E.START_BUILD): _S.BUILDING,
    (_S.QUEUED, _E.END_TENURE): _S.IDLE,
    (_S.BUILDING, _E.BUILD_OK): _S.READY,
    (_S.BUILDING, _E.BUILD_FAILED): _S.RETRYING,
    (_S.BUILDING, _E.END_TENURE): _S.IDLE,
    (_S.READY, _E.COMMIT_FAILED): _S.BLOCKED,
    (_S.READY, _E.REPLACE_FAILED): _S.BLOCKED_READY,
    (_S.READY, _E.END_TENURE): _S.IDLE,
    (_S.RETRYING, _E.RETRY_DUE): _S.QUEUED,
    (_S.RETRYING, _E.MEMBERS_CHANGED): _S.QUEUED,
    (_S.RETRYING, _E.END_TENURE): _S.IDLE,
    (_S.BLOCKED, _E.RETRY_DUE): _S.QUEUED,
    (_S.BLOCKED, _E.MEMBERS_CHANGED): _S.QUEUED,
    (_S.BLOCKED, _E.END_TENURE): _S.IDLE,
    (_S.BLOCKED_READY, _E.REPLACE_DUE): _S.READY,
    (_S.BLOCKED_READY, _E.REPLACE_FAILED): _S.BLOCKED_READY,
    # The core refuses a conflicting LoRA projection as it commits; a hop may still refuse
    # the commit itself right after, and then nothing is served.
    (_S.BLOCKED_READY, _E.COMMIT_FAILED): _S.BLOCKED,
    (_S.BLOCKED_READY, _E.END_TENURE): _S.IDLE,
}


class StatusMachine:
    """The status of one group, changed only through :data:`TRANSITIONS`."""

    __slots__ = ("state",)

    def __init__(self, state: GroupStatus = GroupStatus.IDLE) -> None:
        self.state = state

    def process(self, event: StatusEvent) -> GroupStatus:
        """Apply ``event`` and return the new state, or raise and leave the state untouched."""
        try:
            new_state = TRANSITIONS[(self.state, event)]
        except KeyError:
            raise TransitionRefused(
                f"can't handle event {event.value!r} in status {self.state.value!r}"
            ) from None
        self.state = new_state
        return new_state

    def allows(self, event: StatusEvent) -> bool:
        return (self.state, event) in TRANSITIONS

    def __repr__(self) -> str:
        return f"StatusMachine({self.state.value})"
