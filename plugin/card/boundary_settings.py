"""The discovery boundary's frontend-side settings: namespaces, tokenizer, size, Dynamo line."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from workerset_admission.card.lines import DEFAULT_LINE, LINES
from workerset_admission.errors import UsageError

__all__ = ["DEFAULT_MAX_VALUE_SIZE", "BoundarySettings", "FactsKey", "NamespaceFilter"]

DEFAULT_MAX_VALUE_SIZE = 1 << 20


class NamespaceFilter(str, enum.Enum):
    """How the frontend's namespace setting selects worker namespaces (1.6.1 rules)."""

    GLOBAL = "global"
    EXACT = "exact"
    PREFIX = "prefix"


@dataclass(frozen=True, slots=True)
class BoundarySettings:
    """Frontend-side settings that shape normalization.

    ``namespace``: absent, empty or ``"dynamo"`` means every namespace (Dynamo's global
    filter). ``namespace_prefix``: a literal prefix match instead; with ``prefix_strict`` only
    the prefix itself or ``<prefix>-*`` match (worker generations). The tokenizer overrides
    are written into ``runtime_config`` as 1.6.1's ``--tokenizer-backend`` /
    ``--tokenizer-fallback`` do; they are not part of the checksum. ``dynamo_line``: the
    Dynamo line (``"1.6"`` or ``"1.7"``) of the frontend these records feed; a card that
    frontend would refuse is refused here (see ``lines``).
    """

    namespace: str | None = None
    namespace_prefix: str | None = None
    prefix_strict: bool = False
    tokenizer_backend: str | None = None
    tokenizer_fallback_enabled: bool | None = None
    max_value_size: int = DEFAULT_MAX_VALUE_SIZE
    dynamo_line: str = DEFAULT_LINE

    def __post_init__(self) -> None:
        if self.dynamo_line not in LINES:
            raise UsageError(f"unknown Dynamo line {self.dynamo_line!r}; known: {', '.join(LINES)}")
        if self.tokenizer_backend not in (None, "default", "fastokens", "basetenkenizer"):
            raise UsageError(f"unknown tokenizer backend {self.tokenizer_backend!r}")
        if self.max_value_size <= 0:
            raise UsageError("max_value_size must be positive")

    @property
    def filter_kind(self) -> NamespaceFilter:
        if self.namespace_prefix is not None:
            return NamespaceFilter.PREFIX
        if self.namespace in (None, "", "dynamo"):
            return NamespaceFilter.GLOBAL
        return NamespaceFilter.EXACT

    def namespace_matches(self, namespace: str) -> bool:
        if self.namespace_prefix is None and self.namespace in (None, "", "dynamo"):
            return True  # the global filter, the common case: checked without the property
        kind = self.filter_kind
        if kind is NamespaceFilter.GLOBAL:
            return True
        if kind is NamespaceFilter.EXACT:
            return namespace == self.namespace
        prefix = self.namespace_prefix or ""
        if self.prefix_strict:
            return namespace == prefix or namespace.startswith(prefix + "-")
        return namespace.startswith(prefix)

    @property
    def overrides(self) -> tuple[str | None, bool | None]:
        return (self.tokenizer_backend, self.tokenizer_fallback_enabled)

    @property
    def facts_key(self) -> FactsKey:
        """Every setting a card's facts depend on: what a cache of them is keyed by."""
        return (self.tokenizer_backend, self.tokenizer_fallback_enabled, self.dynamo_line)


FactsKey = tuple[str | None, bool | None, str]
"""The settings a card's facts depend on (:attr:`BoundarySettings.facts_key`)."""
