"""The entry-point factory: a running admission service wired to NATS from settings."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Sequence

from workerset_admission.config import Settings, load_settings
from workerset_admission.service import (
    AdmissionService,
    CardRecordDecoder,
    NatsStatusResponder,
    PipelineBuilder,
    ServiceSettings,
)
from workerset_admission.telemetry import AdmissionTelemetry

__all__ = ["boundary_settings", "create_service", "service_settings"]


def boundary_settings(settings: Settings) -> object:
    """Translate the validated settings into the card boundary's settings."""
    from workerset_admission.card import BoundarySettings

    namespace = prefix = None
    if settings.namespace_filter_mode == "exact":
        namespace = settings.namespace_filter
    elif settings.namespace_filter_mode == "prefix":
        prefix = settings.namespace_filter
    return BoundarySettings(
        namespace=namespace,
        namespace_prefix=prefix,
        prefix_strict=settings.namespace_prefix_strict,
        tokenizer_backend=settings.tokenizer_backend,
        tokenizer_fallback_enabled=settings.tokenizer_fallback,
        max_value_size=settings.max_value_bytes,
    )


def service_settings(settings: Settings) -> ServiceSettings:
    return ServiceSettings(
        reconcile_interval=settings.reconcile_interval,
        max_concurrent_builds=settings.max_concurrent_builds,
        retry_delays=tuple(settings.retry_delays),
    )


async def create_service(
    settings: Settings | None = None,
    *,
    servers: Sequence[str] | None = None,
    builder: PipelineBuilder | None = None,
    telemetry: AdmissionTelemetry | None = None,
    handle_signals: bool = False,
    publish: bool = True,
    status: bool = True,
) -> AdmissionService:
    """Connect to NATS, start an :class:`AdmissionService` and return it running.

    The service watches ``settings.discovery_bucket``, publishes its serving admissions to
    ``settings.admission_bucket`` and answers status requests on ``settings.status_subject``.
    ``await service.stop()`` withdraws the publications and closes every connection. This is
    the ``workerset_admission.plugins`` entry point, and what a host thread starts.
    """
    from workerset_admission.adapters.nats.admission_publisher import NatsAdmissionPublisher
    from workerset_admission.adapters.nats.connect import connect
    from workerset_admission.adapters.nats.source import JetStreamDiscoverySource

    settings = settings or load_settings()
    options = settings.nats_connect_options(servers)
    from workerset_admission.adapters.nats.buckets import BucketSpec

    source = JetStreamDiscoverySource(
        options,
        bucket=settings.discovery_bucket,
        create_bucket=True,
        bucket_spec=BucketSpec(name=settings.discovery_bucket, replicas=settings.bucket_replicas),
    )
    closers: list[Callable[[], Awaitable[None]]] = []
    nc = None
    try:
        publisher = responder = None
        if publish or status:
            nc = await connect(options)
            closers.append(nc.close)
        if publish and nc is not None:
            publisher = NatsAdmissionPublisher(
                nc.jetstream(),
                settings.frontend_id,
                bucket=settings.admission_bucket,
                replicas=settings.bucket_replicas,
            )
            # Withdrawal happens first during shutdown; this only stops its writer.
            closers.insert(0, publisher.close)
        if status and nc is not None:
            responder = NatsStatusResponder(nc, settings.status_subject)
        service = AdmissionService(
            source,
            decoder=CardRecordDecoder(boundary_settings(settings)),
            builder=builder,
            publisher=publisher,
            status=responder,
            telemetry=telemetry or AdmissionTelemetry(bucket=settings.discovery_bucket),
            settings=service_settings(settings),
            handle_signals=handle_signals,
            closers=closers,
        )
        await service.start()
    except BaseException:
        if nc is not None:
            with contextlib.suppress(Exception):
                await nc.close()
        with contextlib.suppress(Exception):
            await source.close()
        raise
    return service
