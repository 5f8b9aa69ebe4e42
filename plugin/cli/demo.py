"""``demo``: a rolling update on an embedded server, with every admission decision as it is made."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from workerset_admission.card.differences import differences_of, summarize
from workerset_admission.cli import EXIT_FAILED, EXIT_OK, positive_seconds
from workerset_admission.cli.serve import (
    brief,
    id_list,
    render_status_table,
    say,
    with_progress,
)
from workerset_admission.errors import WorkersetAdmissionError
from workerset_admission.service.step import EffectReader
from workerset_admission.settings import Settings

__all__ = ["arguments", "demo_card", "main", "play_demo"]


def arguments(name: str, parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--timeout",
        type=positive_seconds,
        default=60.0,
        help="seconds each step may take at most",
    )


async def main(name: str, args: argparse.Namespace, stop: asyncio.Event) -> int:
    from workerset_admission.settings import load_settings

    # The demo brings its own embedded server: no settings from the environment apply.
    return await play_demo(load_settings(env={}), timeout=args.timeout, stream=sys.stdout)


async def _drain(settings: Settings, instance_id: int, timeout: float, stream: TextIO) -> int:
    """Run ``workerset-admission drain <id> --wait`` against the demo's server."""
    from workerset_admission.adapters.nats.connect import NatsConnectOptions
    from workerset_admission.adapters.nats.drain_store import NatsDrainStore
    from workerset_admission.cli import build_parser
    from workerset_admission.cli.drain import run_drain

    argv = ["drain", f"{instance_id:#x}", "--wait", "--timeout", f"{timeout:g}", "--by", "demo"]
    say(f"   $ workerset-admission {' '.join(argv)}", stream)
    args = build_parser().parse_args(argv)
    store = NatsDrainStore(
        NatsConnectOptions(servers=settings.nats_servers),
        settings.discovery_bucket,
        settings.admission_bucket,
    )
    return await run_drain(args, store, stream, stream, environ={})


def demo_card(block_size: int = 16) -> dict[str, Any]:
    """Return a small Dynamo 1.6.1 card; the block size tells configurations apart."""
    return {
        "display_name": "Qwen/Qwen3-0.6B",
        "slug": "qwen_qwen3-0_6b",
        "source_path": "Qwen/Qwen3-0.6B",
        "model_info": None,
        "tokenizer": None,
        "context_length": 4096,
        "kv_cache_block_size": block_size,
        "migration_limit": 0,
        "model_type": "Chat | Completions",
        "model_input": "Tokens",
        "worker_type": "aggregated",
        "needs": [],
    }


class _DecisionPrinter:
    """Prints each admission effect as one line, as it happens."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def __call__(self, effects: Sequence[object]) -> None:
        for effect in effects:
            line = self._line(effect)
            if line:
                say(f"  -> {line}", self._stream)

    @staticmethod
    def _line(effect: Any) -> str | None:
        kind = type(effect).__name__
        if kind == "WorkerPlaced":
            verdict = "admitted" if effect.admitted else "NOT admitted (rejected cohort)"
            return f"{effect.key} joins cohort {brief(effect.mdc_checksum)}: {verdict}"
        if kind == "WorkerDeparted":
            return f"{effect.key} left cohort {brief(effect.mdc_checksum)}"
        if kind == "OpenReceiver":
            return (
                f"receiver #{effect.receiver} opened for incumbent "
                f"{brief(effect.mdc_checksum)} (generation {effect.generation})"
            )
        if kind == "StartBuild":
            return f"building the pipeline, generation {effect.generation}"
        if kind == "CommitGroup":
            serving = id_list(sorted(effect.admitted))
            return f"committed generation {effect.generation}: serving {serving}"
        if kind == "PublishAdmissions":
            return f"receiver #{effect.receiver} admits {id_list(sorted(effect.admitted))}"
        if kind == "RejectionReported":
            differences = differences_of(effect.incumbent_card, effect.rejected_card)
            return (
                f"REJECTED cohort {brief(effect.rejected_checksum)} "
                f"(incumbent {brief(effect.incumbent_checksum)}), e.g. {effect.instance}"
                + (f"; differs in: {summarize(differences)}" if differences else "")
            )
        if kind == "WithdrawGroup":
            return f"withdrew committed generation {effect.generation}"
        if kind == "RetireReceiver":
            return f"receiver #{effect.receiver} retired"
        if kind == "Succession":
            if effect.new_checksum is None:
                return "the incumbent drained and no cohort is left"
            return (
                f"succession: {brief(effect.old_checksum)} -> {brief(effect.new_checksum)}, "
                f"generation {effect.new_generation}"
            )
        return None


async def play_demo(settings: Settings, *, timeout: float, stream: TextIO) -> int:
    """Play the rolling-update demo against an embedded server; return the exit status."""
    from workerset_admission.adapters.nats.connect import NatsConnectOptions, connect
    from workerset_admission.adapters.nats.embedded import EmbeddedNatsServer
    from workerset_admission.adapters.nats.registrar import WorkerRegistrar
    from workerset_admission.errors import ReceiverRetired
    from workerset_admission.identity import EndpointId
    from workerset_admission.telemetry import configure_logging
    from workerset_admission.wiring.compose import create_service

    configure_logging("plain", "ERROR", stream=stream)
    endpoint = EndpointId("dgd", "backend", "generate")
    old, new = demo_card(16), demo_card(32)

    async def wait(condition: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + timeout
        next_note = time.monotonic() + 2.0
        while not condition():
            if time.monotonic() > deadline:
                raise WorkersetAdmissionError(f"timed out waiting until {what}")
            if time.monotonic() > next_note:
                say(f"  ... still waiting until {what}", stream)
                next_note = time.monotonic() + 2.0
            await asyncio.sleep(0.02)

    async with contextlib.AsyncExitStack() as stack:
        server = await EmbeddedNatsServer(die_with_owner=True).astart()
        stack.push_async_callback(server.aclose)
        say(f"embedded nats-server on {server.url}", stream)
        demo_settings = settings.model_copy(
            update={"nats_servers": (server.url,), "frontend_id": "demo-frontend"}
        )
        service = await create_service(demo_settings)
        stack.push_async_callback(service.stop)
        service.subscribe(EffectReader(_DecisionPrinter(stream)))
        nc = await connect(NatsConnectOptions(servers=(server.url,)))
        stack.push_async_callback(nc.close)
        workers = WorkerRegistrar(nc.jetstream(), bucket=settings.discovery_bucket, ttl=None)
        await with_progress(service.wait_synced(), "waiting for the first snapshot")

        def group() -> Any:
            groups = service.status().groups
            return groups[0] if groups else None

        say("\n== 1. the v1 workers register (kv_cache_block_size 16)", stream)
        for instance_id in (0x1A, 0x2B):
            await workers.register_endpoint(endpoint, instance_id)
            await workers.register(endpoint, instance_id, old)
        await wait(
            lambda: (
                (g := group()) is not None and g.status == "ready" and g.admitted == (0x1A, 0x2B)
            ),
            "v1 is served",
        )
        g1 = group()
        v1_receiver = service.receiver_for(g1.group)
        assert v1_receiver is not None
        say(f"   serving {id_list(list(g1.admitted))} with generation {g1.generation}", stream)

        say("\n== 2. v2 workers arrive with a different configuration (block size 32)", stream)
        for instance_id in (0x3C, 0x4D):
            await workers.register_endpoint(endpoint, instance_id)
            await workers.register(endpoint, instance_id, new)
        await wait(
            lambda: len(group().cohorts) == 2 and group().cohorts[1].members == (0x3C, 0x4D),
            "the v2 cohort is tracked",
        )
        say(
            f"   still serving {id_list(list(group().admitted))}: the incumbent keeps the set",
            stream,
        )

        say("\n== 3. the v1 workers drain, then stop", stream)
        for instance_id in (0x1A, 0x2B):
            # The real command, as a preStop hook runs it: the last v1 worker hands over to
            # the waiting v2 cohort, and --wait answers once the frontend serves v2.
            status = await _drain(demo_settings, instance_id, timeout, stream)
            if status != EXIT_OK:
                raise WorkersetAdmissionError(f"drain {instance_id:#x} ended with status {status}")
        for instance_id in (0x1A, 0x2B):
            await workers.deregister(endpoint, instance_id, endpoint_record=True)
        await wait(
            lambda: (
                group().status == "ready"
                and group().admitted == (0x3C, 0x4D)
                and service.status().live_instances == 2
            ),
            "v2 is served",
        )
        g2 = group()
        say(f"   serving {id_list(list(g2.admitted))} with generation {g2.generation}", stream)
        try:
            v1_receiver.current()
            retired = False
        except ReceiverRetired:
            retired = True
        say(f"   the v1 receiver is retired: {retired}; it never shows v2 ids", stream)
        say("\n== final status", stream)
        say(render_status_table(service.status().to_json()), stream)
        ok = retired and g2.generation is not None and g2.generation > (g1.generation or 0)
    say("\ndemo complete" if ok else "\ndemo finished with unexpected state", stream)
    return EXIT_OK if ok else EXIT_FAILED
