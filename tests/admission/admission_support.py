"""Builders for admission-core tests: registrations, groups and effect filters."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

# The registration builders are the shared ones; this module adds the effect helpers.
from support.registrations import EP, G, group_key, lora, reg
from workerset_admission.admission import AdmissionCore, BuildFinished, Effect, StartBuild

__all__ = ["EP", "G", "finish", "group_key", "lora", "of", "one", "reg"]

T = TypeVar("T")


def of(effects: Iterable[Effect], kind: type[T]) -> list[T]:
    return [e for e in effects if isinstance(e, kind)]


def one(effects: Iterable[Effect], kind: type[T]) -> T:
    found = of(effects, kind)
    assert len(found) == 1, f"expected one {kind.__name__}, got {found}"
    return found[0]


def finish(core: AdmissionCore, effects: Iterable[Effect], ok: bool = True) -> list[Effect]:
    """Answer the single StartBuild in ``effects``."""
    start = one(effects, StartBuild)
    return core.apply(BuildFinished(start.group, start.mdc_checksum, start.generation, ok))
