"""How the commands that connect reach NATS: a connection named after the command."""

from __future__ import annotations

from typing import TYPE_CHECKING

from workerset_admission.settings import Settings

if TYPE_CHECKING:
    from workerset_admission.adapters.nats.connect import NatsConnectOptions

__all__ = ["client_options", "servers"]


def client_options(settings: Settings, command: str) -> NatsConnectOptions:
    """Connect options for a command, named after it, to the configured (or local) servers."""
    from workerset_admission.adapters.nats.connect import connect_options

    return connect_options(
        settings, servers(settings), client_name=f"workerset-admission {command}"
    )


def servers(settings: Settings) -> tuple[str, ...]:
    """Return the configured servers, or the conventional local one when none is configured."""
    from workerset_admission.adapters.nats.connect import DEFAULT_SERVERS

    # A tool talks to an existing server; with none configured, the conventional local one.
    return settings.nats_servers or DEFAULT_SERVERS
