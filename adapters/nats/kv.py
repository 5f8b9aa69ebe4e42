"""The JetStream KV conventions every reader and writer here shares: names and headers.

A KV bucket ``B`` is the stream ``KV_B``; key ``K`` is the subject ``$KV.B.K``. A removal is a
message without a value that says why in a header: ``KV-Operation`` (``DEL`` or ``PURGE``) from
a client, or ``Nats-Marker-Reason`` from the server (2.11+; ``MaxAge`` when a TTL expired).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Literal

__all__ = [
    "KV_OPERATION",
    "MARKER_REASON",
    "RemovalKind",
    "delete_headers",
    "removal_kind",
    "stream_name",
    "subject_prefix",
]

KV_OPERATION: Final = "KV-Operation"
MARKER_REASON: Final = "Nats-Marker-Reason"

RemovalKind = Literal["delete", "purge", "expired"]

# Server-placed markers name why the message went away; anything not listed is still a
# removal, because a marker never carries a value.
_MARKER_KINDS: Final[Mapping[str, RemovalKind]] = {
    "MaxAge": "expired",
    "Purge": "purge",
    "Remove": "delete",
}
_OPERATION_KINDS: Final[Mapping[str, RemovalKind]] = {"DEL": "delete", "PURGE": "purge"}


def stream_name(bucket: str) -> str:
    """Return the JetStream stream behind a KV bucket."""
    return f"KV_{bucket}"


def subject_prefix(bucket: str) -> str:
    """Return the subject prefix of a bucket's keys (a key's subject is prefix + key)."""
    return f"$KV.{bucket}."


def delete_headers() -> dict[str, str]:
    """Return the headers of a client-side delete (what ``KeyValue.delete`` sends)."""
    return {KV_OPERATION: "DEL"}


def removal_kind(headers: Mapping[str, str] | None) -> RemovalKind | None:
    """Tell a put from a removal, and which removal, from a KV message's headers."""
    if not headers:
        return None
    operation = headers.get(KV_OPERATION)
    if operation is not None:
        return _OPERATION_KINDS.get(operation)
    reason = headers.get(MARKER_REASON)
    if reason is not None:
        return _MARKER_KINDS.get(reason, "purge")
    return None
