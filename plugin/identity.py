"""Identity types shared by the card boundary and the admission core.

These are plain frozen dataclasses with no third-party imports, so the pure core can use them.
Names follow Dynamo's discovery controller: a *group key* is (model name, WorkerSet key), an
*instance key* is Dynamo's discovery path ``<ns>/<component>/<endpoint>/<id hex>[/<suffix>]``.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "ID_LIST_FIELDS",
    "STORE_NAME_MAX",
    "AttemptId",
    "CarriesAttempt",
    "Drain",
    "EndpointId",
    "GroupKey",
    "Registration",
    "WorkerType",
    "compact_json",
    "group_fields",
    "instance_key",
    "parse_instance_id",
    "path_name_problem",
    "store_file_name",
    "with_id_strings",
]

STORE_NAME_MAX = 255
"""The longest file name (in bytes) a Linux file system takes: Dynamo's file store names each
record's file after its whole discovery path, so a longer path has no file."""

_ALNUM = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")


def compact_json(value: Any) -> str:
    """Serialize like ``serde_json::to_string``: no spaces, non-ASCII kept as is."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


class WorkerType(str, enum.Enum):
    """A worker's role in (dis)aggregated serving; the value is Dynamo's wire spelling.

    Every fact about a worker type lives here (:data:`_FACTS`), so a new kind of hop touches
    this module, the hop roles (``routing.py``) and the topology rules (``admission/topology.py``)
    and nothing else: the card boundary and readiness read the facts, never the type's name.
    """

    PREFILL = "prefill"
    DECODE = "decode"
    ENCODE = "encode"
    AGGREGATED = "aggregated"

    @property
    def code(self) -> int:
        """The byte Dynamo's mdcsum uses for this role (0 is reserved for "none")."""
        return _FACTS[self].code

    @property
    def hop(self) -> str:
        """The hop that routes to workers of this type (a ``routing.HopRole`` value)."""
        return _FACTS[self].hop

    @property
    def is_peer(self) -> bool:
        """Whether another set's hop reaches it, through the peer the topology binds.

        The other types serve requests through their own group's hop.
        """
        return _FACTS[self].peer

    @property
    def ambiguous_when_several(self) -> bool:
        """Whether several live sets of this type in one namespace leave the topology unbound.

        Dynamo 1.6.1 pairs one prefill set with one decode set and binds a single encoder;
        aggregated sets serve side by side.
        """
        return _FACTS[self].ambiguous_when_several

    def requires_token_input(self, *, has_model_type: bool) -> bool:
        """Whether a card of this type must take ``Tokens`` input (Dynamo 1.6.1's card shape)."""
        rule = _FACTS[self].token_input
        return rule == "always" or (rule == "without_model_type" and not has_model_type)


@dataclass(frozen=True, slots=True)
class _WorkerTypeFacts:
    code: int
    hop: str
    peer: bool
    ambiguous_when_several: bool
    # When a card of the type must take token input: always, only when it declares no model
    # type (an encoder serving no surface of its own), or never.
    token_input: Literal["always", "without_model_type", "never"]


_FACTS = {
    WorkerType.PREFILL: _WorkerTypeFacts(1, "prefill", True, True, "always"),
    WorkerType.DECODE: _WorkerTypeFacts(2, "decode", False, True, "never"),
    WorkerType.ENCODE: _WorkerTypeFacts(3, "encoder", True, True, "without_model_type"),
    WorkerType.AGGREGATED: _WorkerTypeFacts(4, "decode", False, False, "never"),
}


@dataclass(frozen=True, slots=True, order=True)
class EndpointId:
    """A Dynamo endpoint: namespace, component, endpoint name."""

    namespace: str
    component: str
    endpoint: str

    def path(self) -> str:
        return f"{self.namespace}/{self.component}/{self.endpoint}"


def instance_key(endpoint: EndpointId, instance_id: int, model_suffix: str | None = None) -> str:
    """Dynamo's per-instance path: lowercase hex id without padding, plus the LoRA suffix."""
    key = f"{endpoint.path()}/{instance_id:x}"
    return f"{key}/{model_suffix}" if model_suffix else key


def store_file_name(path: str) -> str:
    """Dynamo's file-store name for a path: each byte outside ``[A-Za-z0-9]`` as ``%XX``."""
    return "".join(chr(b) if b in _ALNUM else f"%{b:02X}" for b in path.encode("utf-8"))


def path_name_problem(names: tuple[str | None, ...], path: str) -> str | None:
    """Say why a discovery path cannot name one record of its own, or ``None`` when it can.

    Dynamo joins the names with ``/``, so a name holding ``/`` makes two different keys one
    path (one registration, one view file); and the file store cannot hold a path whose file
    name passes :data:`STORE_NAME_MAX` bytes, so such a worker could never be routed to.
    """
    for name in names:
        if name is not None and "/" in name:
            return f"the name {_brief(name)} holds '/', the separator of Dynamo's discovery paths"
    # A byte of the path is at most three of the file name (a character at most twelve):
    # only a path that could pass the limit is measured.
    if len(path) * (3 if path.isascii() else 12) > STORE_NAME_MAX:
        size = len(store_file_name(path))
        if size > STORE_NAME_MAX:
            return (
                f"its discovery path's file name would be {size} bytes, over the "
                f"{STORE_NAME_MAX} a file system takes"
            )
    return None


def _brief(name: str, limit: int = 64) -> str:
    return repr(name) if len(name) <= limit else f"{name[:limit]!r}… ({len(name)} characters)"


@dataclass(frozen=True, slots=True, order=True)
class GroupKey:
    """A WorkerSet plus the model it serves: the unit of admission.

    ``worker_set`` is Dynamo's WorkerSet key, the compact JSON string of
    ``[namespace, component, endpoint, "<model types joined by |>", "<effective worker type>"]``.
    """

    model: str
    worker_set: str

    @property
    def id(self) -> str:
        """Dynamo's group id: compact JSON of ``[model, worker_set]``."""
        return compact_json([self.model, self.worker_set])

    @classmethod
    def build(
        cls,
        model: str,
        endpoint: EndpointId,
        model_types: str,
        effective_worker_type: WorkerType,
    ) -> GroupKey:
        worker_set = compact_json(
            [
                endpoint.namespace,
                endpoint.component,
                endpoint.endpoint,
                model_types,
                effective_worker_type.value,
            ]
        )
        return cls(model=model, worker_set=worker_set)

    @classmethod
    def from_id(cls, group_id: str) -> GroupKey:
        model, worker_set = json.loads(group_id)
        return cls(model=str(model), worker_set=str(worker_set))

    @property
    def endpoint(self) -> EndpointId:
        ns, comp, ep, _types, _wt = json.loads(self.worker_set)
        return EndpointId(ns, comp, ep)

    @property
    def worker_type(self) -> WorkerType:
        return WorkerType(json.loads(self.worker_set)[4])


@dataclass(frozen=True, slots=True)
class AttemptId:
    """Which build attempt a result answers: the group, the checksum built, its generation.

    Build generations are never reused, so the three name one attempt for good; the core applies
    a result only when its ``AttemptId`` is the attempt in flight (a build) or the committed
    one (a commit). ``attempt`` elsewhere is a count: the attempt's number within a tenure.
    """

    group: GroupKey
    mdc_checksum: str
    generation: int


class CarriesAttempt:
    """Base of the inputs and effects that name a build attempt by its three fields."""

    __slots__ = ()
    group: GroupKey
    mdc_checksum: str
    generation: int

    @property
    def attempt_id(self) -> AttemptId:
        """The attempt this value names."""
        return AttemptId(self.group, self.mdc_checksum, self.generation)


def group_fields(group: GroupKey) -> dict[str, Any]:
    """Give a group's identity as plain JSON fields, with Dynamo's two id strings beside them.

    ``model_types`` lists the model-type names (``["chat", "completions"]``); ``worker_type``
    is the effective worker type the WorkerSet key names.
    """
    namespace, component, endpoint, model_types, worker_type = json.loads(group.worker_set)
    return {
        "model": group.model,
        "namespace": namespace,
        "component": component,
        "endpoint": endpoint,
        "model_types": model_types.split("|") if model_types else [],
        "worker_type": worker_type,
        "group_id": group.id,
        "worker_set_id": group.worker_set,
    }


@dataclass(frozen=True, slots=True)
class Registration:
    """One normalized, valid model registration, ready for the admission core.

    Built at the discovery boundary (``card.normalize``) from a KV key and value. ``card`` is
    the decoded, normalized card; the core treats it as opaque and only hands it on.
    ``group`` is the group this card would materialize; for a LoRA card (``model_suffix`` set)
    it is informational only, since adapters never create or keep a group.
    """

    key: str
    endpoint: EndpointId
    instance_id: int
    model_suffix: str | None
    group: GroupKey
    mdc_checksum: str
    lora_fingerprint: str
    worker_type: WorkerType | None
    needs: tuple[tuple[WorkerType, ...], ...]
    taints: tuple[str, ...] = ()
    card: Any = field(default=None, compare=False, repr=False)

    @property
    def is_lora(self) -> bool:
        return self.model_suffix is not None

    @property
    def effective_worker_type(self) -> WorkerType:
        return self.group.worker_type


@dataclass(frozen=True, slots=True)
class Drain:
    """An operator's word that one worker is about to stop: take it out of routing now.

    A worker is named by its namespace and instance id, and a drain covers every registration
    of that instance in that namespace (every model and endpoint it registered). ``by`` says who
    drained it and ``at`` when (Unix seconds, as written); neither takes part in a decision.
    """

    namespace: str
    instance_id: int
    by: str = ""
    at: float | None = None

    @property
    def worker(self) -> tuple[str, int]:
        """The worker the drain names: (namespace, instance id)."""
        return (self.namespace, self.instance_id)


# --------------------------------------------------------------------------- id spellings
# Instance ids as the command line reads and writes them.
#
# Dynamo's instance ids are unsigned 64-bit integers. Keys and log lines spell them in lowercase
# hex without a prefix (``v1.mdc.ns.c.e.3c``, ``instance=ns/c/e/3c``); the command line's tables
# and JSON print them in decimal, the canonical spelling (Dynamo's own ``worker_id`` in a
# response is decimal too). Every command reads both decimal and ``0x`` hex.
#
# A JSON number above 2**53 loses digits in jq 1.6 and in JavaScript's ``JSON.parse`` (Dynamo
# masks the ids it writes as JSON numbers to 53 bits for that reason; a worker registered by
# another tool may use all 64). So beside every list of ids the JSON output carries the same ids
# as decimal strings, under the field's name with ``_str``: ``admitted`` and ``admitted_str``.

ID_LIST_FIELDS = frozenset({"admitted", "routable", "members", "hold_members", "last_known"})
"""The JSON fields that hold lists of instance ids."""


def parse_instance_id(text: str) -> int:
    """Read an instance id in decimal or ``0x`` hex; raise ``ValueError`` naming both forms."""
    spelled = text.strip()
    try:
        value = int(spelled, 16) if spelled.lower().startswith("0x") else int(spelled, 10)
    except ValueError:
        raise ValueError(f"{text!r} is not an instance id (decimal, or hex with 0x)") from None
    if not 0 <= value < 2**64:
        raise ValueError(f"{text!r} is not an instance id (an unsigned 64-bit integer)")
    return value


def with_id_strings(document: Any) -> Any:
    """Return ``document`` with an ``<field>_str`` list of decimal strings beside each id list."""
    if isinstance(document, list):
        return [with_id_strings(item) for item in document]
    if not isinstance(document, dict):
        return document
    out: dict[str, Any] = {}
    for key, value in document.items():
        out[key] = with_id_strings(value)
        if key in ID_LIST_FIELDS and _ids(value):
            out[f"{key}_str"] = [str(i) for i in value]
        elif key == "instance_id" and _ids([value]):
            out["instance_id_str"] = str(value)
    return out


def _ids(value: object) -> bool:
    return isinstance(value, list) and all(
        isinstance(i, int) and not isinstance(i, bool) for i in value
    )
