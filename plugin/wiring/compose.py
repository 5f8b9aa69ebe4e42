"""The composition root: an admission service wired to its source, publishers, view and trace.

``serve`` and the Dynamo frontend's route extension both start the service through
:func:`create_service` (also the ``workerset_admission.plugins`` entry point). This is the one
module that sees both the service and the adapters it is plugged into: the service itself
imports no adapter and no part of ``traces/``; what happens in it, a part hears as a subscriber
of its steps.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from workerset_admission.card.entry import EntryDecoder
from workerset_admission.errors import (
    ConfigError,
    Unreachable,
    WorkersetAdmissionError,
    error_in_words,
)
from workerset_admission.ports import AdmissionPublisher, DiscoverySource
from workerset_admission.service.admission_service import AdmissionService, PipelineBuilder
from workerset_admission.settings import Settings, load_settings
from workerset_admission.telemetry import AdmissionTelemetry, TelemetryHandle
from workerset_admission.traces.format import settings_of
from workerset_admission.traces.writer import TraceWriter

if TYPE_CHECKING:
    from workerset_admission.adapters.dynamo.view import DirectoryFiles, ViewHook
    from workerset_admission.card import BoundarySettings

__all__ = ["admission_telemetry", "attach_trace_writer", "boundary_settings", "create_service"]

_log = logging.getLogger(__name__)
_T = TypeVar("_T")


def _view_hook(settings: Settings, files: DirectoryFiles | None) -> ViewHook | None:
    if files is None and settings.view_dir is None:
        return None
    from workerset_admission.adapters.dynamo.view import DirectoryFiles, Horizon, ViewHook

    horizon = Horizon(settings.view_horizon)
    if files is not None:
        return ViewHook(files, owns_files=False, horizon=horizon)
    assert settings.view_dir is not None
    return ViewHook(DirectoryFiles.open(settings.view_dir), owns_files=True, horizon=horizon)


def _view_outlives(settings: Settings) -> float:
    """How long the view outlives its writer's last touch: its horizon and one refresh."""
    from workerset_admission.adapters.dynamo.view import Horizon

    horizon = Horizon(settings.view_horizon)
    return horizon.seconds + horizon.refresh


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
        dynamo_line=settings.dynamo_version,
    )


def admission_telemetry(settings: Settings, handle: TelemetryHandle) -> AdmissionTelemetry:
    """Return the service's telemetry on the providers ``handle`` installed.

    ``serve`` and the frontend's route extension each install their exporters (as a process of
    its own, or beside the frontend's) and report through this one facade.
    """
    return AdmissionTelemetry(
        tracer_provider=handle.tracer_provider,
        meter_provider=handle.meter_provider,
        bucket=settings.discovery_bucket,
        prometheus_page=handle.prometheus_page,
    )


def attach_trace_writer(
    service: AdmissionService, boundary: BoundarySettings | None = None
) -> TraceWriter | None:
    """Record the service's steps to ``settings.trace_out``, if set; return the writer.

    The writer subscribes to the service's steps, and it closes its file once every task of the
    service has ended (``serve --trace-out``; ``replay`` checks what it wrote).
    """
    path = service.settings.trace_out
    if path is None:
        return None
    writer = TraceWriter.open(path, settings_of(service.settings.core_settings(), boundary))
    service.subscribe(writer)
    service.on_stopped(writer.close)
    return writer


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
    clock: Callable[[], float] | None = None,
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

    ``clock`` is the monotonic clock the service's deadlines read (retries, holds); a host
    whose clock can jump gives its own and calls ``service.wake_timers()`` after a jump.
    """
    from workerset_admission.adapters.nats.admission_publisher import NatsAdmissionPublisher
    from workerset_admission.adapters.nats.buckets import BucketSpec
    from workerset_admission.adapters.nats.connect import connect, connect_options
    from workerset_admission.adapters.nats.source import (
        DEFAULT_KEY_PREFIXES,
        JetStreamDiscoverySource,
        namespace_key_prefixes,
    )

    settings = settings or load_settings()
    if not (servers or settings.nats_servers):
        # Only serve (and demo) start an embedded server when none is named; a host process
        # such as the Dynamo frontend has nobody to start one for it.
        raise ConfigError(
            "no NATS server given: set WORKERSET_ADMISSION_NATS_SERVERS (or nats_servers in "
            "the settings file); only `workerset-admission serve` starts an embedded server "
            "when none is given, the plugin inside the Dynamo frontend does not"
        )
    boundary = boundary_settings(settings)
    view = _view_hook(settings, view_files)
    options = connect_options(settings, servers)
    # A frontend serving one namespace watches only that namespace's records.
    only = settings.namespace_filter if settings.namespace_filter_mode == "exact" else None
    source: DiscoverySource = JetStreamDiscoverySource(
        options,
        bucket=settings.discovery_bucket,
        key_prefixes=DEFAULT_KEY_PREFIXES if only is None else namespace_key_prefixes(only),
        create_bucket=True,
        bucket_spec=BucketSpec(name=settings.discovery_bucket, replicas=settings.bucket_replicas),
        started_in_outage=started_in_outage,
    )
    peers = None
    if publish:
        from workerset_admission.adapters.nats.admission_reader import NatsRecordSource
        from workerset_admission.adapters.nats.peers import PeerListings

        # Starts and resyncs observe first what the other live frontends already serve.
        reader = NatsRecordSource(options, settings.admission_bucket, timeout=2.0)
        peers = PeerListings(reader, settings.frontend_id)
        if view is not None:
            # The view's lease is bounded on the NATS server's clock too, once it is read.
            view.files.server_now = peers.server_now
    closers: list[Callable[[], Awaitable[None]]] = []
    if view is not None:
        # After the withdrawal of the serving records and before the connections close.
        closers.append(view.close)
    nc = None
    started = False
    try:
        publisher = responder = None
        if publish or status:
            nc = await connect(options)
            closers.append(nc.close)
        if publish and nc is not None:
            nats_publisher = NatsAdmissionPublisher(
                nc.jetstream(),
                settings.frontend_id,
                bucket=settings.admission_bucket,
                replicas=settings.bucket_replicas,
                # The frontend routes by the view this long after this process last touched it.
                view_outlives=None if view is None else _view_outlives(settings),
                client=nc,
            )
            # Withdrawal happens first during shutdown; this only stops its writer.
            closers.insert(0, nats_publisher.close)
            if view is not None:
                # The view lasts no longer than the lease its serving records state (docstring
                # of ``admission_publisher``): a writer cut off from NATS lets its view expire.
                view.files.lease_overdue = nats_publisher.lease_overdue
            publisher = _InWords(nats_publisher)
        if status and nc is not None:
            from workerset_admission.adapters.nats.status import NatsStatusResponder

            responder = NatsStatusResponder(nc, settings.status_subject, settings.frontend_id)
        service = AdmissionService(
            source,
            decoder=EntryDecoder(boundary),
            builder=builder,
            publisher=publisher,
            status=responder,
            telemetry=telemetry or AdmissionTelemetry(bucket=settings.discovery_bucket),
            settings=settings,
            closers=closers,
            clock=time.monotonic if clock is None else clock,
            peers=peers,
        )
        attach_trace_writer(service, boundary)
        if view is not None:
            # The view is a read model: every step's delta, with the records the core accepted.
            view.attach(service)
        await service.start()
        started = True
    finally:
        if not started:
            # The start's own error goes on up; a close that fails meanwhile is said here.
            if view is not None:
                await _close_after_failed_start("the view", view.close)
            if nc is not None:
                await _close_after_failed_start("the NATS connection", nc.close)
            await _close_after_failed_start("the discovery source", source.close)
    return service


def _transport_errors() -> tuple[type[Exception], ...]:
    """Return what a NATS or etcd round trip raises when the far side is away or refuses."""
    from workerset_admission.adapters.nats.errors import NatsError

    return (NatsError, OSError, asyncio.TimeoutError)


async def _close_after_failed_start(what: str, close: Callable[[], Awaitable[None]]) -> None:
    failures: tuple[type[Exception], ...] = (WorkersetAdmissionError, *_transport_errors())
    try:
        await close()
    except failures as exc:
        _log.warning(
            "could not close %s after a failed start (%s); the start's error follows",
            what,
            error_in_words(exc),
        )


class _InWords:
    """The serving-admission publisher, its NATS failures raised as ``Unreachable``.

    The service names no NATS error (it imports no adapter), so what it retries is told in
    the package's own terms: the client's errors become ``Unreachable`` with their words.
    """

    def __init__(self, publisher: AdmissionPublisher) -> None:
        self._publisher = publisher
        # The service names itself by the frontend its publisher writes for.
        self.frontend_id: str | None = getattr(publisher, "frontend_id", None)

    async def _call(self, call: Awaitable[_T]) -> _T:
        try:
            return await call
        except _transport_errors() as exc:
            raise Unreachable(
                f"the serving-admission store: {type(exc).__name__}: {error_in_words(exc)}"
            ) from exc

    async def publish_members(
        self,
        worker_namespace: str,
        members: Sequence[str],
        *,
        groups: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        await self._call(self._publisher.publish_members(worker_namespace, members, groups=groups))

    async def publish_capability(self, resynced_at: float | None = None) -> None:
        await self._call(self._publisher.publish_capability(resynced_at))

    async def republish(self) -> None:
        await self._call(self._publisher.republish())

    async def withdraw_all(self) -> None:
        await self._call(self._publisher.withdraw_all())

    async def settle(self) -> int:
        return await self._call(self._publisher.settle())
