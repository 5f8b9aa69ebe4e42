"""Create or bind the KV buckets idempotently; an existing bucket's settings are never changed."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from nats.js.api import KeyValueConfig, StorageType, StreamInfo
from nats.js.client import JetStreamContext
from nats.js.errors import (
    BadRequestError,
    KeyValueLimitMarkerTTLNotSupportedError,
    NotFoundError,
)
from nats.js.kv import KeyValue
from workerset_admission.adapters.nats.kv import stream_name

__all__ = [
    "BucketSpec",
    "BucketStatus",
    "ensure_bucket",
    "stream_name",
]

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class BucketSpec:
    """The settings this package creates a bucket with.

    ``limit_marker_ttl`` makes the server write a removal marker when a key ages out (server
    2.11+), so watchers see a crashed worker's registration disappear; it also enables per-key
    TTLs on puts. ``fallback_max_age`` is the bucket's max age instead, on a server without
    them: a bucket that relies on per-key TTLs to forget a writer must forget it somehow.
    """

    name: str
    history: int = 1
    limit_marker_ttl: float | None = 60.0
    max_value_size: int = -1
    max_age: float | None = None
    storage: StorageType = StorageType.FILE
    replicas: int = 1
    description: str | None = None
    fallback_max_age: float | None = None

    def config(self) -> KeyValueConfig:
        return KeyValueConfig(
            bucket=self.name,
            description=self.description,
            history=self.history,
            max_value_size=self.max_value_size,
            storage=self.storage,
            replicas=self.replicas,
            limit_marker_ttl=self.limit_marker_ttl,
            ttl=self.max_age,
        )


@dataclass(frozen=True, slots=True)
class BucketStatus:
    """What :func:`ensure_bucket` found: a fresh bucket, or an existing one and how it differs."""

    kv: KeyValue
    created: bool
    mismatches: tuple[str, ...] = ()
    # What the bucket does, whoever made it: per-key TTLs allowed, and its max age (seconds).
    per_key_ttl: bool = False
    max_age: float | None = None


def _mismatches(spec: BucketSpec, info: StreamInfo) -> tuple[str, ...]:
    config = info.config
    found: list[str] = []
    # Replicas first: on a cluster it is the difference an operator most needs to hear about.
    if config.num_replicas not in (None, spec.replicas):
        found.append(f"replicas is {config.num_replicas}, expected {spec.replicas}")
    if config.max_msgs_per_subject not in (None, spec.history):
        found.append(f"history is {config.max_msgs_per_subject}, expected {spec.history}")
    actual_age = config.max_age or None
    if (spec.max_age or None) != actual_age and not (
        spec.max_age and actual_age and abs(spec.max_age - actual_age) < 1e-3
    ):
        found.append(f"max age is {actual_age}, expected {spec.max_age}")
    wanted_marker = spec.limit_marker_ttl
    actual_marker = config.subject_delete_marker_ttl
    if (wanted_marker is None) != (actual_marker is None) or (
        wanted_marker is not None
        and actual_marker is not None
        and abs(wanted_marker - actual_marker) > 1e-3
    ):
        found.append(f"limit_marker_ttl is {actual_marker}, expected {wanted_marker}")
    if wanted_marker is not None and not config.allow_msg_ttl:
        found.append("per-key TTL is not allowed on this bucket")
    return tuple(found)


async def ensure_bucket(
    js: JetStreamContext, spec: BucketSpec, *, _race_retry: bool = True
) -> BucketStatus:
    """Bind the bucket, creating it when absent; report (never fix) differing settings."""
    try:
        info = await js.stream_info(stream_name(spec.name))
    except NotFoundError:
        info = None
    if info is None:
        try:
            kv = await js.create_key_value(spec.config())
        except KeyValueLimitMarkerTTLNotSupportedError:
            # A pre-2.11 server: removals by TTL go unseen, but the bucket still works.
            max_age = spec.fallback_max_age or spec.max_age
            older = replace(spec, limit_marker_ttl=None, max_age=max_age)
            kv = await js.create_key_value(older.config())
            return BucketStatus(
                kv=kv,
                created=True,
                mismatches=("server does not support limit markers",),
                max_age=max_age,
            )
        except BadRequestError:
            if not _race_retry:
                raise
            # Someone else created it in the meantime, with other settings: bind and compare.
            return await ensure_bucket(js, spec, _race_retry=False)
        return BucketStatus(
            kv=kv,
            created=True,
            per_key_ttl=spec.limit_marker_ttl is not None,
            max_age=spec.max_age,
        )
    kv = await js.key_value(spec.name)
    mismatches = _mismatches(spec, info)
    if mismatches:
        _log.warning(
            "bucket %s exists with other settings, left unchanged: %s",
            spec.name,
            "; ".join(mismatches),
        )
    return BucketStatus(
        kv=kv,
        created=False,
        mismatches=mismatches,
        per_key_ttl=bool(info.config.allow_msg_ttl),
        max_age=info.config.max_age or None,
    )
