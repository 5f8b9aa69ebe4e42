"""Who wrote a discovery record: a writer identity stamped on every record a tool writes.

Tools that write discovery records for others (the file-store ``bridge``, ``register``) share
one bucket with workers and with each other. A tool may only ever remove what it wrote itself,
so every record it writes carries its :class:`WriterId`, and a clean-up (the bridge's prune)
selects keys by that stamp, never by key pattern alone.

The stamp is a pair of strings kept as record metadata: on NATS the ``Workerset-Writer``
message header. A store without per-record headers keeps the same token beside the record
(etcd: a sibling key under the record's lease), so a bridge for such a store reuses
:meth:`WriterId.token`, :meth:`WriterId.parse` and :meth:`WriterId.owns` unchanged; only where
the token is stored differs.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from workerset_admission.errors import ConfigError

__all__ = ["WRITER_HEADER", "WriterId", "bridge_writer", "etcd_bridge_writer", "register_writer"]

WRITER_HEADER: Final = "Workerset-Writer"
_MAX_TOKEN: Final = 512


@dataclass(frozen=True, slots=True)
class WriterId:
    """One writer: its kind (``bridge``, ``register``) and a name stable across its restarts.

    A restarted writer must own what its previous run wrote (so a restarted bridge can prune
    removals it missed), hence a name derived from what the writer serves, not from its pid.
    """

    kind: str
    name: str

    def __post_init__(self) -> None:
        if not self.kind or not self.kind.isidentifier():
            raise ConfigError(f"a writer kind is a plain word, not {self.kind!r}")
        # Headers are one line of printable text.
        if not self.name or not self.name.isprintable() or len(self.token) > _MAX_TOKEN:
            raise ConfigError("a writer name is 1 to 500 printable characters")

    @property
    def token(self) -> str:
        """The stamp stored with each record: ``<kind>:<name>``."""
        return f"{self.kind}:{self.name}"

    @classmethod
    def parse(cls, token: str) -> WriterId | None:
        """Read a stamp back; ``None`` for anything that is not one."""
        kind, sep, name = token.partition(":")
        if not sep:
            return None
        try:
            return cls(kind, name)
        except ConfigError:
            return None

    def headers(self) -> dict[str, str]:
        """Return the metadata to write with a record."""
        return {WRITER_HEADER: self.token}

    def owns(self, headers: Mapping[str, str] | None) -> bool:
        """Whether a record with this metadata was written by this writer."""
        return bool(headers) and headers.get(WRITER_HEADER) == self.token  # type: ignore[union-attr]


def bridge_writer(root: Path, name: str | None = None) -> WriterId:
    """Name the bridge: as given, or by this host and the store it mirrors."""
    if name is None:
        name = f"{socket.gethostname() or 'host'}:{root.expanduser().resolve()}"
    return WriterId("bridge", name)


def etcd_bridge_writer(endpoints: Sequence[str], name: str | None = None) -> WriterId:
    """Name a bridge that reads etcd: as given, or by this host and the endpoints it reads."""
    if name is None:
        name = f"{socket.gethostname() or 'host'}:etcd:{','.join(endpoints)}"
    return WriterId("bridge", name)


def register_writer(instance_key: str) -> WriterId:
    """Name a ``register`` process by the instance it registers."""
    return WriterId("register", instance_key)
