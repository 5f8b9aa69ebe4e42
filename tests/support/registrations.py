"""The one builder of core registrations (and group keys) for tests, without any card decoding."""

from __future__ import annotations

from typing import Any

from workerset_admission.identity import (
    EndpointId,
    GroupKey,
    Registration,
    WorkerType,
    instance_key,
)

__all__ = ["EP", "G", "group_key", "lora", "reg"]

EP = EndpointId("ns1", "workers", "generate")


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
    worker_type: WorkerType | None = None,
    card: Any = None,
) -> Registration:
    """A base worker's registration; the worker type defaults to its group's."""
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
        worker_type=group.worker_type if worker_type is None else worker_type,
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
    worker_type: WorkerType = WorkerType.DECODE,
) -> Registration:
    """A LoRA adapter's registration on worker ``instance_id`` of ``endpoint``."""
    return Registration(
        key=instance_key(endpoint, instance_id, suffix),
        endpoint=endpoint,
        instance_id=instance_id,
        model_suffix=suffix,
        group=GroupKey.build(suffix, endpoint, "chat|completions", worker_type),
        mdc_checksum=checksum,
        lora_fingerprint=fingerprint,
        worker_type=worker_type,
        needs=(),
    )
