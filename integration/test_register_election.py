"""``register`` started while the bucket's stream has no leader waits for the election."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

import pytest
from clusterfixture import NatsCluster, nats_cluster, quiet_client
from nats.js.errors import ServiceUnavailableError
from support.cards import base_card
from workerset_admission.adapters.nats.buckets import BucketSpec, ensure_bucket, stream_name

__all__ = ["nats_cluster"]

# A cluster, an outage of a majority held for several seconds: the slower tier.
pytestmark = [
    pytest.mark.integration,
    pytest.mark.cluster,
    pytest.mark.rollout,
    pytest.mark.timeout(180),
]

BUCKET = "election-discovery"


async def test_register_during_a_leader_election_writes_once_a_leader_is_elected(
    nats_cluster: NatsCluster, tmp_path: Path
) -> None:
    client = await quiet_client(nats_cluster.urls)
    try:
        await ensure_bucket(client.jetstream(timeout=5), BucketSpec(name=BUCKET, replicas=3))
    finally:
        await client.close()
    await nats_cluster.wait_current(stream_name(BUCKET))
    leader = await nats_cluster.leader_of(stream_name(BUCKET))
    others = [node.name for node in nats_cluster.nodes if node.name != leader]
    # The leader and one more go: the last node alone has no quorum, so no leader, until a
    # second node is back. A write in between is refused: the election a worker meets.
    nats_cluster.kill(leader)
    nats_cluster.kill(others[0])
    survivor = nats_cluster.node(others[1]).url
    card = tmp_path / "card.json"
    card.write_text(json.dumps(base_card(16)), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("WORKERSET_ADMISSION_")}
    register = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "workerset_admission.cli", "register", "--once"),
        *("--namespace", "ns", "--component", "backend", "--endpoint", "generate"),
        *("--instance-id", "0x1a", "--card", str(card)),
        *("--nats-server", survivor, "--discovery-bucket", BUCKET, "--bucket-replicas", "3"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    try:
        # Longer than one JetStream request's timeout (5 s): a register that does not retry
        # has failed by now.
        await asyncio.sleep(8)
        assert register.returncode is None, "register gave up during the election"
        await asyncio.to_thread(nats_cluster.restart, others[0])
        out, err = await asyncio.wait_for(register.communicate(), 90)
    finally:
        if register.returncode is None:
            register.kill()
            await register.wait()
    assert register.returncode == 0, err.decode()
    assert json.loads(out.splitlines()[0])["registered"] == [
        "v1.mdc.ns.backend.generate.1a",
        "v1.instances.ns.backend.generate.1a",
    ]
    assert "not accepted yet" in err.decode()
    client = await quiet_client([survivor])
    try:
        # The restarted node's return may set off another election: the read waits it out.
        deadline = time.monotonic() + 30
        while True:
            try:
                kv = await client.jetstream(timeout=5).key_value(BUCKET)
                entry = await kv.get("v1.mdc.ns.backend.generate.1a")
                break
            except ServiceUnavailableError:
                assert time.monotonic() < deadline, "JetStream never came back to answer"
                await asyncio.sleep(0.5)
        assert entry.value
    finally:
        await client.close()
