"""The command line's exit statuses: one table, its meanings, and how an error maps to one."""

from __future__ import annotations

import asyncio
import sys

from workerset_admission.errors import (
    CredentialsRefused,
    LastWorkerRefused,
    RemoteDataError,
    StoreUnavailable,
    Unreachable,
    UsageError,
    ViewDirectoryError,
    ViewDirectoryUnavailable,
    WorkersetAdmissionError,
)

__all__ = [
    "EXIT_CREDENTIALS",
    "EXIT_FAILED",
    "EXIT_LAST_WORKER",
    "EXIT_NO",
    "EXIT_OK",
    "EXIT_STATUSES",
    "EXIT_UNCONFIRMED",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
    "exit_status",
    "transport_errors",
    "unreachable_errors",
]

EXIT_OK = 0
"""Done; for a command that runs until stopped, stopped by a signal."""
EXIT_NO = 1
"""The answer is no: ``rollout``'s gate is closed, ``explain``'s instance is not admitted,
``diff``'s cards would not join one cohort."""
EXIT_USAGE = 2
"""Bad input from the operator: flags, settings, a trace, a card, an output path or folder."""
EXIT_UNREACHABLE = 3
"""NATS (or, for ``bridge``, etcd) could not be reached or did not answer in time."""
EXIT_FAILED = 4
"""The command failed while it ran (the service stopped on an error, an unexpected fault), or
``serve``'s view directory was read-only or full when it started (a restart may succeed)."""
EXIT_CREDENTIALS = 5
"""NATS answered and refused the credentials, or the user's permissions refused a publish or a
subscription (``drain`` of a namespace its user may not drain, ``register`` into a namespace
its user may not write, a ``bridge`` with too few rights): retrying the same cannot help."""
EXIT_LAST_WORKER = 6
"""``drain`` refused to take a model's last routable worker on a live frontend (nothing was
written); ``--allow-empty`` drains it anyway."""
EXIT_UNCONFIRMED = 7
"""``drain --wait``: every live frontend let the workers go, but a frontend that was live when
the drain began went away (its serving records expired) without confirming: it may still route
to them. The drain stays in place; ``--allow-unconfirmed`` counts such a frontend as let go."""


def transport_errors() -> tuple[type[Exception], ...]:
    """Return what a round trip to NATS (or etcd) raises when the far side is away or refuses."""
    errors: tuple[type[Exception], ...] = (OSError, asyncio.TimeoutError, TimeoutError)
    # Only when a command loaded the NATS client: an offline command never imports it.
    if "nats" in sys.modules:
        from workerset_admission.adapters.nats.errors import NatsError

        errors += (NatsError,)
    return errors


def unreachable_errors() -> tuple[type[Exception], ...]:
    """Every error that may mean the server is out of reach (exit status 3, or a row above)."""
    return (Unreachable, StoreUnavailable, *transport_errors())


def _exit_table() -> tuple[tuple[tuple[type[BaseException], ...], int], ...]:
    return (
        ((UsageError,), EXIT_USAGE),
        ((CredentialsRefused,), EXIT_CREDENTIALS),
        ((LastWorkerRefused,), EXIT_LAST_WORKER),
        # A view directory read-only or full for now: a supervisor's restart may succeed.
        ((ViewDirectoryUnavailable,), EXIT_FAILED),
        ((RemoteDataError, ViewDirectoryError), EXIT_USAGE),
        ((Unreachable, StoreUnavailable), EXIT_UNREACHABLE),
        (transport_errors(), EXIT_UNREACHABLE),
        ((WorkersetAdmissionError,), EXIT_FAILED),
    )


EXIT_STATUSES: dict[int, str] = {
    EXIT_OK: "success (a long-running command stopped by SIGINT or SIGTERM counts as success)",
    EXIT_NO: "the answer is no: rollout gate closed, explain instance not admitted, diff cards "
    "differ, drain --wait still routed to at its timeout",
    EXIT_USAGE: "bad flags, settings, trace, card, output path or view folder; nothing changed",
    EXIT_UNREACHABLE: "NATS (or etcd, for bridge) unreachable, or no answer in time",
    EXIT_FAILED: "the command failed while running",
    EXIT_CREDENTIALS: "NATS refused the credentials, or this user's publish or subscription",
    EXIT_LAST_WORKER: "drain refused: a model would be left with no routable worker on a live "
    "frontend; nothing was drained (--allow-empty drains anyway)",
    EXIT_UNCONFIRMED: "drain --wait could not confirm: a silent frontend still routes by its "
    "last view at the timeout, or one live when the drain began went away without confirming; "
    "the drain stays in place (--allow-unconfirmed counts it as let go)",
}
"""Every exit status the command line uses, with its meaning (the README shows this table)."""


def exit_status(error: BaseException) -> int:
    """Map an error that ended a command to its exit status (first matching row wins)."""
    for kinds, status in _exit_table():
        if isinstance(error, kinds):
            return status
    return EXIT_FAILED
