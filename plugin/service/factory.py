"""The entry-point factory: a running admission service wired to NATS from settings."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

from workerset_admission.ports import DiscoverySource
from workerset_admission.service.accepted import AcceptedRecordsFeed
from workerset_admission.service.admission_service import AdmissionService, PipelineBuilder
from workerset_admission.service.ingest import CardRecordDecoder
from workerset_admission.settings import Settings, load_settings
from workerset_admission.telemetry import AdmissionTelemetry

if TYPE_CHECKING:
    from workerset_admission.adapters.dynamo.view import DirectoryFiles, ViewHook
    from workerset_admission.card import BoundarySettings

__all__ = ["boundary_settings", "create_service"]


def _view_hook(settings: Settings, files: DirectoryFiles | None) -> ViewHook | None:
    if files is None and settings.view_dir is None:
        return None
    from workerset_admission.adapters.dynamo.view import DirectoryFiles, ViewHook

    if files is not None:
        return ViewHook(files, owns_files=False)
    assert settings.view_dir is not None
    return ViewHook(DirectoryFiles.open(settings.view_dir), owns_files=True)


def boundary_settings(settings: Settings) -> BoundarySettings:
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


async def create_service(
    settings: Settings | None = None,
    *,
    servers: Sequence[str] | None = None,
    builder: PipelineBuilder | None = None,
    telemetry: AdmissionTelemetry | None = None,
    publish: bool = True,
    status: bool = True,
    view_files: DirectoryFiles | None = None,
    started_in_outage: bool = False,
) -> AdmissionService:
    """Connect to NATS, start an :class:`AdmissionService` and return it running.

    The service watches ``settings.discovery_bucket``, publishes its serving admissions to
    ``settings.admission_bucket`` and answers status requests on ``settings.status_subject``.
    ``await service.stop()`` withdraws the publications and closes every connection. This is
    the ``workerset_admission.plugins`` entry point, and what a host thread starts.

    With ``settings.view_dir`` (or an already locked ``view_files``) the service also writes
    the admitted discovery view for a Dynamo frontend on ``--discovery-backend file``; the
    directory is checked and locked before anything connects.

    ``started_in_outage`` says an earlier attempt could not reach NATS: the first listing then
    follows an outage, and the core treats it as a reconnect listing.
    """
    from workerset_admission.adapters.nats.admission_publisher import NatsAdmissionPublisher
    from workerset_admission.adapters.nats.buckets import BucketSpec
    from workerset_admission.adapters.nats.connect import connect, connect_options
    from workerset_admission.adapters.nats.source import JetStreamDiscoverySource

    settings = settings or load_settings()
    boundary = boundary_settings(settings)
    view = _view_hook(settings, view_files)
    options = connect_options(settings, servers)
    source: DiscoverySource = JetStreamDiscoverySource(
        options,
        bucket=settings.discovery_bucket,
        create_bucket=True,
        bucket_spec=BucketSpec(name=settings.discovery_bucket, replicas=settings.bucket_replicas),
        started_in_outage=started_in_outage,
    )
    if publish:
        from workerset_admission.adapters.nats.admission_reader import NatsRecordSource
        from workerset_admission.adapters.nats.peers import PeerAwareSource

        # Starts and resyncs observe first what the other live frontends already serve.
        peers = NatsRecordSource(options, settings.admission_bucket, timeout=2.0)
        source = PeerAwareSource(source, peers, settings.frontend_id)
    closers: list[Callable[[], Awaitable[None]]] = []
    if view is not None:
        # After the withdrawal of the serving records and before the connections close.
        closers.append(view.close)
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
            from workerset_admission.adapters.nats.status import NatsStatusResponder

            responder = NatsStatusResponder(nc, settings.status_subject, settings.frontend_id)
        service = AdmissionService(
            source,
            decoder=CardRecordDecoder(boundary),
            builder=builder,
            publisher=publisher,
            status=responder,
            telemetry=telemetry or AdmissionTelemetry(bucket=settings.discovery_bucket),
            settings=settings,
            closers=closers,
        )
        if view is not None:
            # The view files the raw records the service's boundary accepted, as it judged
            # them, before each core step.
            service.step.observers.append(AcceptedRecordsFeed(view.table))
            view.attach(service)
        await service.start()
    except BaseException:
        if view is not None:
            with contextlib.suppress(Exception):
                await view.close()
        if nc is not None:
            with contextlib.suppress(Exception):
                await nc.close()
        with contextlib.suppress(Exception):
            await source.close()
        raise
    return service
