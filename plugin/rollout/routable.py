"""What the admission core admits and can route, for one listing of the discovery bucket.

Theory of operation
-------------------
A drain asks "would this model be left with no worker a frontend can route to?", and the
answer must be the one a frontend's own core would give, not a second rule beside it. For a
namespace no live frontend watches nobody can be asked, so the drain runs that same core here:
the service's own ingestion (the discovery boundary and its liveness index, ``service/ingest``)
and its own step (``service/step``), fed the bucket's listing as one initial listing, with
every build succeeding at once (as replay does for a recording without build results, see
``traces/replay.py``). What comes out is read with the one routing rule,
:func:`~workerset_admission.admission.admitted.routable_ids`: a member is routable when its
group's served tenure admits it and its endpoint record is live.

A card the boundary refuses never reaches the core, so it is never a successor; a card with no
endpoint record is admitted but not routable; a prefill or encode worker serves only through a
decode or aggregated worker of the model, so only the model's serving hop counts; a LoRA
adapter is a model to clients, served by every routable worker whose base card's group has
projected it. A drain is written into the core as the drain record it will be, so a handover
(a drained incumbent with a successor waiting) runs as it runs on a frontend: the successor is
committed and serves, and only what it serves is left.

:func:`core_over` runs the core once over a listing with some workers drained, and can then
drain more (:meth:`CoreAnswer.after`), so a check asks "before" and "after" of one run.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from workerset_admission.admission import (
    AdmissionCore,
    BuildFinished,
    CommitGroup,
    CoreSettings,
    Input,
    StartBuild,
)
from workerset_admission.card import BoundarySettings, encode_drain_record
from workerset_admission.card.entry import EntryDecoder
from workerset_admission.errors import RemoteDataError
from workerset_admission.identity import AttemptId, Drain, EndpointId
from workerset_admission.keys import drain_kv_key
from workerset_admission.ports import DiscoveryEntry, SourceListing, SourcePut
from workerset_admission.service.ingest import Ingestor
from workerset_admission.service.receivers import AdmissionChannels
from workerset_admission.service.step import AdmissionStep
from workerset_admission.telemetry import AdmissionTelemetry, UpdateScope

__all__ = ["CoreAnswer", "Place", "Served", "core_over"]

# Nothing the drain's own core decides is logged: a rejection here is the frontends' to report.
_QUIET = logging.getLogger("workerset_admission.rollout.routable.quiet")
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False

# (model, "namespace/component/endpoint"): where a model is served from.
Place = tuple[str, str]


class _AtOnce:
    """Builds that succeed at once: the drain's core has no pipeline to construct."""

    def __init__(self) -> None:
        self.ready: list[BuildFinished] = []

    def start(self, effect: StartBuild) -> None:
        self.ready.append(BuildFinished(effect.group, effect.mdc_checksum, effect.generation, True))

    def cancel(self, attempt: AttemptId) -> None:
        self.ready = [r for r in self.ready if r.attempt_id != attempt]

    def commit(self, effect: CommitGroup) -> Input | None:
        return None


@dataclass(frozen=True, slots=True)
class Served:
    """What one state of the core serves: per model and place, the routable workers."""

    # (model, place) -> (namespace, instance id) of every routable worker there, on the
    # model's serving hop; LoRA adapters are models here too.
    places: Mapping[Place, frozenset[tuple[str, int]]]
    # (group id, namespace, instance id) -> the adapter names that worker serves in that group.
    adapters: Mapping[tuple[str, str, int], tuple[str, ...]]

    def workers(self, model: str) -> frozenset[tuple[str, int]]:
        """Every routable worker of ``model``, wherever it is served from."""
        found: set[tuple[str, int]] = set()
        for (name, _place), held in self.places.items():
            if name == model:
                found |= held
        return frozenset(found)

    def models(self) -> set[str]:
        return {model for model, _place in self.places}


class CoreAnswer:
    """The core run over one listing: what it serves now, and after more drains."""

    def __init__(self, step: AdmissionStep, builds: _AtOnce) -> None:
        self._step = step
        self._builds = builds
        self._finish()
        self.now = self._served()

    def routable(self, endpoint: EndpointId, instance_id: int) -> bool:
        """Whether a frontend that admits this member can route to it: its record is live."""
        return bool(self._step.ingest.liveness.routable(endpoint, (instance_id,)))

    def _finish(self) -> None:
        ready = self._builds.ready
        while ready:
            self._step.build_finished(ready.pop(0))

    def after(self, drained: Iterable[tuple[str, int]]) -> Served:
        """Drain these workers too (as their drain records would) and say what is served then."""
        for namespace, instance_id in sorted(set(drained)):
            entry = _drain_entry(namespace, instance_id)
            self._step.handle_event(SourcePut(entry))
            self._finish()
        return self._served()

    def _served(self) -> Served:
        core = self._step.core
        liveness = self._step.ingest.liveness
        places: dict[Place, set[tuple[str, int]]] = {}
        adapters: dict[tuple[str, str, int], tuple[str, ...]] = {}
        for key, attempt in core.serving().items():
            view = core.group(key)
            if view is None:
                continue
            admitted: Iterable[int] = view.admitted
            handover = view.handover
            if handover is not None and handover.generation == attempt.generation:
                admitted = handover.members  # a drained tenure serves until its successor does
            endpoint = key.endpoint
            routable = liveness.routable(endpoint, admitted)
            namespace, place = endpoint.namespace, endpoint.path()
            if not key.worker_type.is_peer:
                places.setdefault((key.model, place), set()).update(
                    (namespace, i) for i in routable
                )
            for worker in view.lora:
                if worker.instance_id not in routable:
                    continue
                names = tuple(
                    sorted({_adapter_name(core, a.key, a.model_suffix) for a in worker.adapters})
                )
                adapters[(key.id, namespace, worker.instance_id)] = names
                if key.worker_type.is_peer:
                    continue
                for name in names:
                    places.setdefault((name, place), set()).add((namespace, worker.instance_id))
        return Served({p: frozenset(w) for p, w in places.items()}, adapters)


def _adapter_name(core: AdmissionCore, key: str, suffix: str) -> str:
    """Return the model name clients call an adapter by: its card's ``display_name``."""
    reg = core.registration(key)
    return reg.group.model if reg is not None else suffix


def _drain_entry(namespace: str, instance_id: int) -> DiscoveryEntry:
    drain = Drain(namespace, instance_id, "drain check", None)
    return DiscoveryEntry(drain_kv_key(namespace, instance_id), encode_drain_record(drain), 0)


def _refused(_key: str, _exc: RemoteDataError, _scope: UpdateScope | None) -> None:
    # A record the boundary refuses is not admitted; the frontends report it, not a drain.
    return


def core_over(
    entries: Iterable[tuple[str, bytes]],
    drained: Iterable[tuple[str, int]] = (),
    *,
    boundary: BoundarySettings | None = None,
    settings: CoreSettings | None = None,
) -> CoreAnswer:
    """Run the service's core over a listing of the discovery bucket, ``drained`` drained.

    ``entries`` are the model and endpoint records (drain records in it count too); the workers
    in ``drained`` are drained as if their drain records were listed.
    """
    listed: list[DiscoveryEntry] = [DiscoveryEntry(k, v, 0) for k, v in entries]
    listed.extend(_drain_entry(ns, i) for ns, i in sorted(set(drained)))
    core = AdmissionCore(settings or CoreSettings())
    builds = _AtOnce()
    step = AdmissionStep(
        core,
        Ingestor(EntryDecoder(boundary or BoundarySettings())),
        channels=AdmissionChannels(),
        builds=builds,
        clock=lambda: 0.0,
        telemetry=AdmissionTelemetry(trace_updates=False, rejection_logger=_QUIET, logger=_QUIET),
        refuse=_refused,
        schedule=lambda _deadline: None,
        log=_QUIET,
    )
    step.handle_event(SourceListing(_unique(listed)))
    return CoreAnswer(step, builds)


def _unique(entries: Sequence[DiscoveryEntry]) -> list[DiscoveryEntry]:
    # A listing names each key once: the last value given for a key is the one listed.
    by_key = {e.key: e for e in entries}
    return list(by_key.values())
