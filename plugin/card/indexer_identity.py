"""The card's ``indexer_identity`` section: explicit identity maps and 1.6.1's bounds on them."""

from __future__ import annotations

from typing import Any

from workerset_admission.card import jsonio
from workerset_admission.card.schema import STR, Ctx, Field, Opt, Refused, Struct, Type, none

__all__ = ["INDEXER_IDENTITY"]


class _IdentityMap(Type):
    expected = "a non-empty map of unique identity keys to strings"

    def decode(self, value: Any, level: int, ctx: Ctx) -> Any:
        if not isinstance(value, dict):
            raise Refused("invalid_type", f"invalid type, expected {self.expected}")
        if not value:
            raise Refused(
                "invalid_indexer_identity", "explicit identity map must contain at least one entry"
            )
        if any(not key for key in value):
            raise Refused("invalid_indexer_identity", "identity key must not be empty")
        if ctx.strict_dups and isinstance(value, jsonio.DupDict):
            raise Refused("invalid_indexer_identity", "identity keys must be unique")
        if len(value) > _IDENTITY_MAX_ENTRIES:
            raise Refused(
                "invalid_indexer_identity",
                f"explicit identity map contains more than {_IDENTITY_MAX_ENTRIES} entries",
            )
        out = {key: STR.decode(item, level + 1, ctx) for key, item in value.items()}
        for key, item in out.items():
            if not item:
                raise Refused("invalid_indexer_identity", "identity value must not be empty")
            if _utf8_len(key) > _IDENTITY_MAX_KEY_BYTES:
                raise Refused(
                    "invalid_indexer_identity",
                    f"identity key exceeds {_IDENTITY_MAX_KEY_BYTES} UTF-8 bytes",
                )
            if _utf8_len(item) > _IDENTITY_MAX_VALUE_BYTES:
                raise Refused(
                    "invalid_indexer_identity",
                    f"identity value exceeds {_IDENTITY_MAX_VALUE_BYTES} UTF-8 bytes",
                )
        return out


# 1.6.1's bounds on an explicit identity map; lengths count UTF-8 bytes, not characters.
_IDENTITY_MAX_ENTRIES = 32
_IDENTITY_MAX_KEY_BYTES = 128
_IDENTITY_MAX_VALUE_BYTES = 1024


def _utf8_len(text: str) -> int:
    # Lone surrogates (accepted only where 1.6.1 accepts them) count as the 3 bytes of WTF-8.
    return len(text.encode("utf-8", "surrogatepass"))


INDEXER_IDENTITY = Struct(
    "IndexerIdentitySpec",
    (
        Field("semantics", Opt(_IdentityMap()), default=none),
        Field("routing_scope", Opt(_IdentityMap()), default=none),
    ),
)
