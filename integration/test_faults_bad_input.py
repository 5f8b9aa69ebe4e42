"""The bad-input corpus sent through a real bucket: refused, counted, and the service runs on.

Values go in as a worker would write them; keys that nats-py's KV client refuses to write
(``*``, ``:``, non-ASCII) are published on the bucket's subjects directly, as a client with key
validation turned off would. Keys that cannot be subjects at all (empty, empty tokens, spaces)
are left out.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

from natsfixture import NatsServer
from support.fleet import (
    DISCOVERY,
    OLD,
    admin,
    all_ready,
    assert_replays_bucket,
    endpoint,
    fresh_buckets,
    group_of,
    live_groups,
    running,
    until,
)

CORPUS = Path(__file__).resolve().parents[1] / "tests" / "corpus" / "bad_records.jsonl"


def corpus() -> list[tuple[str, bytes]]:
    cases = []
    for line in CORPUS.read_text().splitlines():
        item = json.loads(line)
        if "value_b64" in item:
            value = base64.b64decode(item["value_b64"])
        else:
            value = item["value"].encode("utf-8", "surrogatepass")
        cases.append((item["key"], value))
    return cases


def publishable(key: str) -> bool:
    # A NATS subject has no empty tokens and no whitespace.
    return bool(key) and "" not in key.split(".") and not any(c.isspace() for c in key)


async def test_the_corpus_through_a_real_bucket_is_refused_and_the_service_runs_on(
    nats_server_fn: NatsServer,
) -> None:
    ep = endpoint()
    cases = [(k, v) for k, v in corpus() if publishable(k)]
    # Keys outside v1.mdc.> and v1.instances.> never reach the service: it watches only those.
    watched = [k for k, _ in cases if k.startswith(("v1.mdc.", "v1.instances."))]
    assert len(watched) > 80
    async with admin(nats_server_fn.url) as nc:
        fleet = await fresh_buckets(nc)
        await fleet.register(ep, range(1, 4), OLD)
        # No periodic re-listing during the test, so each refusal is counted exactly once.
        async with running(nats_server_fn.url, reconcile_interval=600) as (service, watchdog):
            await all_ready(service)
            before = live_groups(service)[group_of(ep).id]
            js = nc.jetstream()
            for key, value in cases:
                await js.publish(f"$KV.{DISCOVERY}.{key}", value)
            # Many cases share one key; a watcher may see only the last of quick overwrites of
            # a key (the bucket keeps one revision), so every key must be refused at least once.
            keys = set(watched)

            def refused_keys() -> set[str]:
                return {r.key for r in service.status().recent_invalid}

            await until(lambda: keys <= refused_keys(), 30, "every key refused")

            assert service.running
            snapshot = service.status()
            assert snapshot.health == "healthy"
            assert len(keys) <= snapshot.invalid_total <= len(watched)
            assert live_groups(service)[group_of(ep).id] == before
            # Still serving: a new worker is admitted after all of that.
            await fleet.register(ep, [4], OLD)
            await until(lambda: 4 in live_groups(service)[group_of(ep).id].admitted)
            # A snapshot of the same bucket (bad records included) gives the same state.
            await assert_replays_bucket(service, nats_server_fn.url)
            watchdog.assert_clean()
