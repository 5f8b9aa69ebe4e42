"""Every exception the plugin raises, in one tree.

::

    WorkersetAdmissionError
    ├── UsageError                  the caller misused an API (a bug on our side or the host's)
    │   ├── ConfigError             settings that do not validate
    │   ├── TransitionRefused       a group status change the transition table does not allow
    │   └── ReceiverClosed          an admission receiver used after its holder closed it
    ├── RemoteDataError             data from the wire that we refuse; state stays unchanged
    │   ├── CardDecodeError         a card Dynamo 1.6.1 would refuse to decode
    │   └── InvalidRecordError      a discovery key/value pair we refuse (shape, identity, size)
    ├── Unreachable                 NATS, or a service answering over it, did not answer
    ├── CredentialsRefused          NATS answered and refused the credentials
    │   └── PermissionRefused       ... or refused this user a publish or a subscription
    ├── LastWorkerRefused           a drain would leave a model with no routable worker
    ├── ReceiverRetired             an admission receiver whose group's tenure has ended
    ├── NoRoutableInstance          a routing hop with no instance both live and admitted
    ├── ViewDirectoryError          the admitted view's directory cannot be used
    │   └── ViewDirectoryUnavailable    ... for now: read-only or full (a restart may succeed)
    ├── DiscoveryStoreError         Dynamo's etcd discovery store could not be read
    │   ├── StoreUnavailable        unreachable, timed out, or refused our credentials
    │   └── StoreCompacted          a watch asked for history that etcd has compacted away
    └── EmbeddedServerError         the embedded nats-server could not be used
        ├── NatsServerNotFound      no nats-server binary is installed where we look
        └── NatsServerStartError    the process exited or did not become ready in time

Caller misuse and bad remote data are different branches on purpose: the first is a defect to
fix, the second is an everyday event to report and count.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = [
    "DETAIL_LIMIT",
    "REFUSAL_REASONS",
    "TABLE_LINE_LIMIT",
    "CardDecodeError",
    "ConfigError",
    "CredentialsRefused",
    "DiscoveryStoreError",
    "EmbeddedServerError",
    "InvalidRecordError",
    "LastWorkerRefused",
    "NatsServerNotFound",
    "NatsServerStartError",
    "NoRoutableInstance",
    "PermissionRefused",
    "ReceiverClosed",
    "ReceiverRetired",
    "RemoteDataError",
    "StoreCompacted",
    "StoreUnavailable",
    "TransitionRefused",
    "Unreachable",
    "UsageError",
    "ViewDirectoryError",
    "ViewDirectoryUnavailable",
    "WorkersetAdmissionError",
    "bounded_text",
    "error_in_words",
    "wire_text",
]


class WorkersetAdmissionError(Exception):
    """Root of every error raised by this package."""


class UsageError(WorkersetAdmissionError):
    """An API was called in a way it does not support."""


class ConfigError(UsageError):
    """Settings failed validation; the message names the setting and why."""


class TransitionRefused(UsageError):
    """A group status change the transition table does not allow; the status is left as it was."""


class ReceiverClosed(UsageError):
    """An admission receiver was used after its holder called ``close()`` on it."""


DETAIL_LIMIT = 400
"""The most characters of remote text an error detail or a refusal report carries."""


def bounded_text(text: str, limit: int = DETAIL_LIMIT) -> str:
    """Return ``text``, or its first ``limit`` characters and how long it was."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text)} characters)"


# Characters that end, rewrite or reorder a line on a terminal or in a log file: the C0 and C1
# controls (newline, carriage return, escape...), DEL, Unicode's line and paragraph separators,
# and the bidirectional overrides and isolates.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_SHORT_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(found: re.Match[str]) -> str:
    char = found.group()
    short = _SHORT_ESCAPES.get(char)
    if short is not None:
        return short
    code = ord(char)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


TABLE_LINE_LIMIT = 20_000
"""The longest line of a table a command prints (a row may list many workers)."""


def wire_text(value: object, limit: int = DETAIL_LIMIT) -> str:
    r"""Return a value from the wire as one line of text fit for a log: escaped, then cut.

    Every log line and refusal detail that carries what a writer sent (a model name, a key,
    a drain's author, a refusal's detail) shows it through here, so no writer can start a line
    of its own in the operator's log (a newline becomes ``\n``, any other control character
    ``\xNN`` or ``\uNNNN``) or make a line longer than ``limit`` characters.
    """
    text = value if isinstance(value, str) else str(value)
    return bounded_text(_UNPRINTABLE.sub(_escape, text), limit)


def error_in_words(
    error: BaseException, *, where: str | None = None, timeout: float | None = None
) -> str:
    """Say what a failure was in words, for a one-line message: never the exception's repr.

    A timeout (whose text is empty) reads "timed out after 5 s"; an OS error its own words
    without the errno prefix; the NATS client's errors without their ``nats:`` prefix, and
    "no servers available" as "no NATS server answered at <where>". Anything else is its text,
    or its class name spelled out when it has none.
    """
    # By name, not by class: this module imports neither asyncio nor the NATS client, and on
    # Python 3.10 asyncio's TimeoutError is not the builtin one.
    kinds = {kind.__name__ for kind in type(error).__mro__}
    name = type(error).__name__
    if name == "NoServersError":
        return f"no NATS server answered at {where}" if where else "no NATS server answered"
    if name == "NoRespondersError":
        return "nothing answers on that subject (no responders)"
    if "TimeoutError" in kinds:
        return f"timed out after {timeout:g} s" if timeout is not None else "timed out"
    if isinstance(error, OSError) and error.strerror:
        return error.strerror[:1].lower() + error.strerror[1:] + _os_detail(error)
    text = str(error).removeprefix("nats: ").strip()
    if text:
        return text
    # "ConnectionClosedError" -> "connection closed error"
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", name).lower()


def _os_detail(error: OSError) -> str:
    # What asyncio adds after the errno's words (the address it tried), if anything.
    text = str(error)
    head = f"[Errno {error.errno}] {error.strerror}"
    return text[len(head) :] if text.startswith(head) else ""


REFUSAL_REASONS: Final[frozenset[str]] = frozenset(
    {
        # The key and the record around a card (card/envelope.py, events.py, drain_record.py).
        "bad_key",
        "value_too_large",
        "invalid_utf8",
        "invalid_json",
        "depth_limit",
        "number_out_of_range",
        "invalid_string",
        "invalid_record",
        "duplicate_field",
        "wrong_record_type",
        "identity_mismatch",
        "lora_mismatch",
        # The card, as Dynamo 1.6.1 would decode it (card/schema.py and its neighbours).
        "invalid_type",
        "out_of_range",
        "missing_field",
        "unknown_field",
        "unknown_variant",
        "invalid_enum",
        "invalid_length",
        "invalid_slug",
        "invalid_checksum",
        "invalid_model_type",
        "invalid_router_config",
        "router_policy_config",
        "invalid_router_policy",
        "invalid_indexer_identity",
        "invalid_card_shape",
        # Not a 1.6.1 rule: a model name, LoRA name or alias over MAX_NAME_CHARS (card_facts).
        "name_too_long",
        # A live key whose identity changed in place: the core keeps its first incarnation.
        "mutation_refused",
    }
)
"""Every ``reason`` the service counts a refused discovery record under: the one table of them.

The service counts refusals by reason, and its counter starts at 0 for each of these, so an
alert on ``increase()`` sees the first refusal of any kind. A test holds the refusals the
boundary really makes to this table.
"""


class RemoteDataError(WorkersetAdmissionError):
    """Data received from discovery was refused.

    ``reason`` is a short, stable, machine-friendly token (used as a metric label and in the
    replay output); ``detail`` is the human explanation.
    """

    def __init__(self, reason: str, detail: str = "") -> None:
        self.reason = reason
        # A detail may quote the remote data; it is cut here, once, so no log line, span,
        # status reply or refusal list can grow with what a writer sends.
        self.detail = detail = wire_text(detail)
        super().__init__(f"{reason}: {detail}" if detail else reason)


class CardDecodeError(RemoteDataError):
    """A model deployment card that Dynamo 1.6.1 would not decode."""


class InvalidRecordError(RemoteDataError):
    """A discovery record refused at the boundary (bad key, bad value, key/value disagreement)."""

    def __init__(self, reason: str, detail: str = "", *, key: str | None = None) -> None:
        self.key = key
        super().__init__(reason, detail)


class Unreachable(WorkersetAdmissionError):
    """NATS, or a service answering over it, could not be reached or did not answer in time."""


class CredentialsRefused(WorkersetAdmissionError):
    """NATS answered and refused the credentials: retrying with the same ones cannot help."""


class PermissionRefused(CredentialsRefused):
    """NATS refused this user a publish or a subscription; ``subject`` is the one it named."""

    def __init__(self, message: str, subject: str) -> None:
        super().__init__(message)
        self.subject = subject


class LastWorkerRefused(WorkersetAdmissionError):
    """A drain was refused: it would take a model's last routable worker (``--allow-empty``)."""


class ReceiverRetired(WorkersetAdmissionError):
    """The admission receiver's group was succeeded or removed; it will never change again."""


class NoRoutableInstance(WorkersetAdmissionError):
    """A routing hop found no instance that is both live and admitted; it never widens the set.

    ``group`` and ``generation`` name the binding (both ``None`` on the legacy explicit-endpoint
    path); ``instance_id`` is set when the caller asked for one instance by id.
    """

    def __init__(
        self, group: str | None, generation: int | None, instance_id: int | None = None
    ) -> None:
        self.group = group
        self.generation = generation
        self.instance_id = instance_id
        where = f"group {group} generation {generation}" if group else "the explicit endpoint"
        if instance_id is None:
            super().__init__(f"no instance is both live and admitted for {where}")
        else:
            super().__init__(f"instance {instance_id:x} is not both live and admitted for {where}")


class ViewDirectoryError(WorkersetAdmissionError):
    """The admitted view's directory cannot be used; the message names it and says why.

    It is missing, not writable, owned by another live writer, or not the frontend's store.
    """


class ViewDirectoryUnavailable(ViewDirectoryError):
    """The view's directory cannot be written for now: its file system is read-only or full.

    A state that passes (a remount, space freed), unlike a missing directory or one this user may
    not write: a supervisor's restart may succeed, so it is not a settings error.
    """


class DiscoveryStoreError(WorkersetAdmissionError):
    """Dynamo's own discovery store (etcd) could not be read; the last mirrored state stands."""


class StoreUnavailable(DiscoveryStoreError):
    """The store did not answer, timed out, or refused the credentials; retried with backoff."""


class StoreCompacted(DiscoveryStoreError):
    """A watch started below etcd's compaction revision; the caller must list again."""

    def __init__(self, compacted_revision: int) -> None:
        self.compacted_revision = compacted_revision
        super().__init__(f"history before revision {compacted_revision} was compacted")


class EmbeddedServerError(WorkersetAdmissionError):
    """The embedded nats-server (used when no server URL is configured) is unavailable."""


class NatsServerNotFound(EmbeddedServerError):
    """No nats-server binary was found; the message says how to install one."""


class NatsServerStartError(EmbeddedServerError):
    """The nats-server process exited or did not accept clients in time; carries its log tail."""
