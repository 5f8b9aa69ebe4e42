"""The command line: one runner, one module per job, one exit-code table."""

from __future__ import annotations

from workerset_admission.cli.runner import (
    COMMANDS,
    EXIT_CREDENTIALS,
    EXIT_FAILED,
    EXIT_LAST_WORKER,
    EXIT_NO,
    EXIT_OK,
    EXIT_STATUSES,
    EXIT_UNCONFIRMED,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    CommandSpec,
    build_parser,
    exit_status,
    main,
    positive_seconds,
    seconds_within,
    text_within,
)

__all__ = [
    "COMMANDS",
    "EXIT_CREDENTIALS",
    "EXIT_FAILED",
    "EXIT_LAST_WORKER",
    "EXIT_NO",
    "EXIT_OK",
    "EXIT_STATUSES",
    "EXIT_UNCONFIRMED",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
    "CommandSpec",
    "build_parser",
    "exit_status",
    "main",
    "positive_seconds",
    "seconds_within",
    "text_within",
]
