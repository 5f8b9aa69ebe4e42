"""Builders for admission-core tests: registrations, groups and effect filters."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

from workerset_admission.admission import AdmissionCore, BuildFinished, Effect, StartBuild
from workerset_admission.identity import (
    EndpointId,
    GroupKey,
    Registration,
    WorkerType,
    instance_key,
)

EP = EndpointId("ns1", "workers", "generate")

T = TypeVar("T")


def group_key(
    model: str = "m",
    endpoint: EndpointId = EP,
    model_types: str = "chat|completions",
    worker_type: WorkerType = WorkerType.DECODE,
) -> GroupKey:
    return GroupKey.build(model, endpoint, model_types, worker_type)


G = group_key()


def reg(
    instance_id: int,
    checksum: str = "A",
    *,
    group: GroupKey | None = None,
    endpoint: EndpointId | None = None,
    fingerprint: str = "fp",
    taints: tuple[str, ...] = (),
    worker_type: WorkerType | None = WorkerType.DECODE,
    card: Any = None,
) -> Registration:
    group = group or G
    endpoint = endpoint or group.endpoint
    return Registration(
        key=instance_key(endpoint, instance_id),
        endpoint=endpoint,
        instance_id=instance_id,
        model_suffix=None,
        group=group,
        mdc_checksum=checksum,
        lora_fingerprint=fingerprint,
        worker_type=worker_type,
        needs=(),
        taints=taints,
        card=card if card is not None else {"checksum": checksum, "instance": instance_id},
    )


def lora(
    instance_id: int,
    suffix: str = "my-lora",
    *,
    fingerprint: str = "lfp",
    endpoint: EndpointId = EP,
    checksum: str = "L",
) -> Registration:
    return Registration(
        key=instance_key(endpoint, instance_id, suffix),
        endpoint=endpoint,
        instance_id=instance_id,
        model_suffix=suffix,
        group=GroupKey.build(suffix, endpoint, "chat|completions", WorkerType.DECODE),
        mdc_checksum=checksum,
        lora_fingerprint=fingerprint,
        worker_type=WorkerType.DECODE,
        needs=(),
    )


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
