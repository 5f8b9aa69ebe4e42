"""Discovery KV keys: ``v1.mdc.*``, ``v1.instances.*`` and ``v1.drain.*``, and their escaping.

One codec for every reader and writer of the discovery bucket: the card boundary parses keys
with it, the NATS publishers build keys with it, the ingestion path reads removals with it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from workerset_admission.errors import InvalidRecordError, UsageError
from workerset_admission.identity import EndpointId, instance_key, path_name_problem

__all__ = [
    "ADMISSION_BUCKET",
    "DISCOVERY_BUCKET",
    "DRAIN_PREFIX",
    "ENDPOINT_PREFIX",
    "MODEL_PREFIX",
    "STATUS_SUBJECT",
    "ParsedKey",
    "check_instance_id",
    "drain_kv_key",
    "endpoint_kv_key",
    "escape_token",
    "key_matches",
    "model_kv_key",
    "parse_drain_key",
    "parse_key",
    "plain_model_key",
    "unescape_token",
]

# The default names of what the plugin reads and writes on NATS, spelled here once.
DISCOVERY_BUCKET = "dynamo-discovery"
"""The discovery bucket: the workers' records, mirrored from Dynamo's store."""
ADMISSION_BUCKET = "frontend-model-admission"
"""The serving-admission bucket: what each frontend serves, read by the rollout gate."""
STATUS_SUBJECT = "workerset-admission.status"
"""The subject a running service answers status requests on."""

# Parsed endpoints are interned up to this many (a fleet has few endpoints).
_ENDPOINT_CACHE_LIMIT = 1024
MODEL_PREFIX = "v1.mdc."
ENDPOINT_PREFIX = "v1.instances."
DRAIN_PREFIX = "v1.drain."
"""Drain records: ``v1.drain.<namespace>.<instance id hex>``, written by the drain tools only."""

_PLAIN = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_TOKEN_RE = re.compile(r"(?:[A-Za-z0-9_-]|=[0-9A-F]{2})+")
_HEX_ID_RE = re.compile(r"(?:0|[1-9a-f][0-9a-f]{0,15})")
# A plain key no longer than this has a plain path short enough for any file name (each of
# the path's bytes is at most three of the name), so the fast path skips measuring it.
_SHORT_KEY = 80
_PLAIN_KEY_RE = re.compile(
    r"v1\.(mdc|instances)\.([A-Za-z0-9_-]+)\.([A-Za-z0-9_-]+)\.([A-Za-z0-9_-]+)"
    r"\.(0|[1-9a-f][0-9a-f]{0,15})(?:\.([A-Za-z0-9_-]+))?"
)


def escape_token(text: str) -> str:
    """Escape one key token: bytes outside ``[A-Za-z0-9_-]`` become ``=XX``."""
    if not text:
        raise UsageError("a key token cannot be empty")
    if text.isascii() and all(ord(c) in _PLAIN for c in text):
        return text
    return "".join(chr(b) if b in _PLAIN else f"={b:02X}" for b in text.encode("utf-8"))


def unescape_token(token: str) -> str:
    """Undo :func:`escape_token`; raise :class:`InvalidRecordError` unless canonical."""
    if not _TOKEN_RE.fullmatch(token):
        raise InvalidRecordError("bad_key", f"malformed key token {token!r}")
    if "=" not in token:
        return token
    raw = bytearray()
    pos = 0
    while pos < len(token):
        if token[pos] == "=":
            raw.append(int(token[pos + 1 : pos + 3], 16))
            pos += 3
        else:
            raw.append(ord(token[pos]))
            pos += 1
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidRecordError("bad_key", f"key token {token!r} is not UTF-8") from None
    if escape_token(text) != token:
        raise InvalidRecordError("bad_key", f"key token {token!r} is not canonically escaped")
    return text


def check_instance_id(instance_id: int) -> None:
    if isinstance(instance_id, bool) or not isinstance(instance_id, int):
        raise UsageError("instance_id must be an int")
    if not 0 <= instance_id < 1 << 64:
        raise UsageError("instance_id must fit in u64")


def model_kv_key(endpoint: EndpointId, instance_id: int, suffix: str | None = None) -> str:
    """KV key of a model card record (with the LoRA suffix for an adapter card)."""
    check_instance_id(instance_id)
    parts = [
        "v1",
        "mdc",
        escape_token(endpoint.namespace),
        escape_token(endpoint.component),
        escape_token(endpoint.endpoint),
        f"{instance_id:x}",
    ]
    if suffix:
        parts.append(escape_token(suffix))
    return ".".join(parts)


def endpoint_kv_key(endpoint: EndpointId, instance_id: int) -> str:
    """KV key of an endpoint liveness record."""
    check_instance_id(instance_id)
    return ".".join(
        [
            "v1",
            "instances",
            escape_token(endpoint.namespace),
            escape_token(endpoint.component),
            escape_token(endpoint.endpoint),
            f"{instance_id:x}",
        ]
    )


def drain_kv_key(namespace: str, instance_id: int) -> str:
    """KV key of the drain record of one worker (its namespace and instance id)."""
    check_instance_id(instance_id)
    return f"{DRAIN_PREFIX}{escape_token(namespace)}.{instance_id:x}"


def parse_drain_key(kv_key: str) -> tuple[str, int]:
    """Return the (namespace, instance id) a drain key names, or raise ``InvalidRecordError``."""
    parts = kv_key.split(".")
    if len(parts) != 4 or parts[:2] != ["v1", "drain"]:
        raise InvalidRecordError("bad_key", f"not a drain key: {kv_key!r}", key=kv_key)
    try:
        namespace = unescape_token(parts[2])
    except InvalidRecordError as exc:
        raise InvalidRecordError(exc.reason, exc.detail, key=kv_key) from None
    if not _HEX_ID_RE.fullmatch(parts[3]):
        raise InvalidRecordError(
            "bad_key", f"instance id {parts[3]!r} is not canonical lowercase hex", key=kv_key
        )
    # A namespace no worker key may have names no worker: refused as theirs are.
    problem = path_name_problem((namespace,), f"{namespace}/{parts[3]}")
    if problem is not None:
        raise InvalidRecordError("bad_key", problem, key=kv_key)
    return namespace, int(parts[3], 16)


@dataclass(frozen=True, slots=True)
class ParsedKey:
    """A decoded discovery KV key."""

    kind: Literal["model", "endpoint"]
    endpoint: EndpointId
    instance_id: int
    model_suffix: str | None = None
    key: str = field(default="", compare=False)

    @property
    def instance_key(self) -> str:
        """Dynamo's instance path ``ns/comp/ep/<hex>[/suffix]``."""
        return instance_key(self.endpoint, self.instance_id, self.model_suffix)


_ENDPOINTS: dict[tuple[str, str, str], EndpointId] = {}


def _intern_endpoint(ns: str, comp: str, ep: str) -> EndpointId:
    # A fleet has few endpoints and many workers: one EndpointId (and one copy of its names)
    # serves every worker's registration.
    if len(_ENDPOINTS) >= _ENDPOINT_CACHE_LIMIT:
        _ENDPOINTS.clear()
    endpoint = _ENDPOINTS[(ns, comp, ep)] = EndpointId(ns, comp, ep)
    return endpoint


def plain_model_key(kv_key: str) -> tuple[EndpointId, int] | None:
    """Return the endpoint and instance id of a plain base model card key (no unescaping).

    ``None`` for any other key (an adapter's, an instance record's, a long, escaped or malformed
    one): :func:`parse_key` says what those are. For the keys it answers, the answer is what
    :func:`parse_key` gives, without building a :class:`ParsedKey`.
    """
    plain = _PLAIN_KEY_RE.fullmatch(kv_key)
    if plain is None or len(kv_key) > _SHORT_KEY:
        return None  # a long key may name no file: parse_key measures it
    kind_token, ns, comp, ep, hex_id, suffix_token = plain.groups()
    if kind_token != "mdc" or suffix_token is not None:
        return None
    endpoint = _ENDPOINTS.get((ns, comp, ep)) or _intern_endpoint(ns, comp, ep)
    return endpoint, int(hex_id, 16)


def parse_key(kv_key: str) -> ParsedKey:
    """Parse a discovery KV key, or raise :class:`InvalidRecordError` (reason ``bad_key``)."""
    plain = _PLAIN_KEY_RE.fullmatch(kv_key) if isinstance(kv_key, str) else None
    if plain is not None:
        # The common case: no escapes anywhere, so the tokens are the names.
        kind_token, ns, comp, ep, hex_id, suffix_token = plain.groups()
        if kind_token == "instances" and suffix_token is not None:
            raise InvalidRecordError(
                "bad_key", f"wrong number of key tokens in {kv_key!r}", key=kv_key
            )
        endpoint = _ENDPOINTS.get((ns, comp, ep)) or _intern_endpoint(ns, comp, ep)
        plain_kind: Literal["model", "endpoint"] = "model" if kind_token == "mdc" else "endpoint"
        parsed = ParsedKey(plain_kind, endpoint, int(hex_id, 16), suffix_token, kv_key)
        if len(kv_key) > _SHORT_KEY:
            _check_path(parsed)
        return parsed
    if not isinstance(kv_key, str):
        raise InvalidRecordError("bad_key", "a KV key must be a string")
    parts = kv_key.split(".")
    if len(parts) < 2 or parts[0] != "v1" or parts[1] not in ("mdc", "instances"):
        raise InvalidRecordError("bad_key", f"not a discovery key: {kv_key!r}", key=kv_key)
    kind: Literal["model", "endpoint"] = "model" if parts[1] == "mdc" else "endpoint"
    allowed = (6, 7) if kind == "model" else (6,)
    if len(parts) not in allowed:
        raise InvalidRecordError("bad_key", f"wrong number of key tokens in {kv_key!r}", key=kv_key)
    try:
        ns, comp, ep = (unescape_token(p) for p in parts[2:5])
        suffix = unescape_token(parts[6]) if len(parts) == 7 else None
    except InvalidRecordError as exc:
        raise InvalidRecordError(exc.reason, exc.detail, key=kv_key) from None
    if not _HEX_ID_RE.fullmatch(parts[5]):
        raise InvalidRecordError(
            "bad_key", f"instance id {parts[5]!r} is not canonical lowercase hex", key=kv_key
        )
    parsed = ParsedKey(kind, EndpointId(ns, comp, ep), int(parts[5], 16), suffix, kv_key)
    _check_path(parsed)
    return parsed


def _check_path(parsed: ParsedKey) -> None:
    """Refuse a key whose Dynamo path is not its own: one key, one registration, one file."""
    endpoint = parsed.endpoint
    names = (endpoint.namespace, endpoint.component, endpoint.endpoint, parsed.model_suffix)
    problem = path_name_problem(names, parsed.instance_key)
    if problem is not None:
        raise InvalidRecordError("bad_key", problem, key=parsed.key)


def key_matches(key: str, filters: Sequence[str]) -> bool:
    """Tell whether a key matches a NATS subject filter (``*`` one token, ``>`` the rest)."""
    tokens = key.split(".")
    for pattern in filters:
        parts = pattern.split(".")
        for index, part in enumerate(parts):
            if part == ">":
                if index < len(tokens):
                    return True
                break
            if index >= len(tokens) or (part != "*" and part != tokens[index]):
                break
        else:
            if len(parts) == len(tokens):
                return True
    return False
