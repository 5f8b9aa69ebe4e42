"""A listing read over a slow link, while a writer rewrites the bucket, holds every key.

What the cluster soak (seed 4902) stopped on: a frontend resyncing over a lossy link while the
bridge, just restarted, wrote every record again. The keys were rewritten after the source read
which keys the bucket held and before its consumer was created, so every value the consumer
had to deliver was newer than the stream's last sequence at that reading; the first of them
read as "the values at the start are all in", and the next pause of the link longer than half a
second (a retransmission) ended the listing with the rest of the keys left out: taken for keys
gone without a trace. A reconnect listing applied so removes every worker it left out (a
rejected cohort then came back a moment later as live puts and was reported twice; admitted
workers leave the view for as long). The real nats-server here, behind a relay that delivers
its bytes slowly.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
from nats.aio.client import Client as NatsClient
from natsfixture import NatsServer
from support.buckets import kv_bucket
from support.proxy import TcpProxy
from workerset_admission.adapters.nats.connect import NatsConnectOptions
from workerset_admission.adapters.nats.source import JetStreamDiscoverySource
from workerset_admission.adapters.nats.watch import Watch
from workerset_admission.ports import SourceListing

# Two listings over a paced relay, about 20 s each: the slower tier's.
pytestmark = [pytest.mark.integration, pytest.mark.rollout, pytest.mark.timeout(90)]

KEYS = [f"v1.mdc.ns.backend.generate.{i:x}" for i in range(14)]
VALUE = b'{"card":"' + b"x" * 60 + b'"}'


class RewrittenAtTheStart(JetStreamDiscoverySource):
    """A source whose bucket is rewritten between reading its keys and creating the consumer.

    That moment is the one a restarted writer hits on a slow link; the hook only chooses it.
    From the consumer's creation on the link is slow: 300 bytes a second.
    """

    def __init__(self, rewrite: Any, proxy: TcpProxy, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._rewrite = rewrite
        self._proxy = proxy

    async def _subscribe_raw(  # type: ignore[override]
        self, nc: NatsClient, watch: Watch, deliver_subject: str, broken: Any
    ) -> bool:
        if self._rewrite is not None:
            rewrite, self._rewrite = self._rewrite, None
            await rewrite()
            self._proxy.pace(300, 1.0)
        return await JetStreamDiscoverySource._subscribe_raw(nc, watch, deliver_subject, broken)


@pytest.mark.parametrize("how", ["watch", "list_all"])
async def test_a_listing_over_a_slow_link_while_every_key_is_rewritten_holds_every_key(
    nats_server: NatsServer, bucket_name: str, how: str
) -> None:
    proxy = TcpProxy(int(nats_server.url.rsplit(":", 1)[1]))
    url = await proxy.start()
    try:
        async with kv_bucket(nats_server.url, bucket_name) as kv:
            for key in KEYS:
                await kv.put(key, VALUE)

            async def rewrite() -> None:
                for key in KEYS:
                    await kv.put(key, VALUE)

            source = RewrittenAtTheStart(
                rewrite,
                proxy,
                options=NatsConnectOptions(servers=(url,), reconnect_wait=0.1),
                bucket=bucket_name,
                request_timeout=30.0,
                idle_heartbeat=2.0,
            )
            try:
                if how == "watch":
                    events = source.events()
                    listing = await asyncio.wait_for(events.__anext__(), 60)
                    with contextlib.suppress(Exception):
                        await events.aclose()
                else:
                    listing = await asyncio.wait_for(source.list_all(), 60)
            finally:
                proxy.pace(None)
                await source.close()
        assert isinstance(listing, SourceListing)
        assert sorted(e.key for e in listing.entries) == sorted(KEYS)
    finally:
        await proxy.close()
