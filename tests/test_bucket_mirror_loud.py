"""A bridge's bucket that cannot be read is said at WARNING once, and its memory is kept."""

from __future__ import annotations

import logging

import pytest
from support.fakebucket import FakeBucket
from workerset_admission.adapters.bucket_mirror import BucketMirror, MirrorStats

_log = logging.getLogger("tests.bucket_mirror")


async def test_unreadable_contents_are_said_once_the_memory_kept_and_the_return_said(
    caplog: pytest.LogCaptureFixture,
) -> None:
    bucket = FakeBucket({"v1.mdc.ns.c.e.1": b"card"})
    stats = MirrorStats()
    mirror = BucketMirror(bucket, stats, prune=True, log=_log)
    await mirror.start()
    remembered = dict(mirror.mirrored)
    bucket.unreadable = True
    with caplog.at_level(logging.DEBUG, logger=_log.name):
        assert not await mirror.reconcile({"v1.mdc.ns.c.e.1": b"card"})
        assert not await mirror.reconcile({"v1.mdc.ns.c.e.1": b"card"})
    levels = [r.levelno for r in caplog.records]
    assert levels == [logging.WARNING, logging.DEBUG]  # once per outage, then quietly
    assert caplog.records[0].getMessage() == (
        "discovery bridge cannot read the bucket's contents (bucket unreachable); what it "
        "wrote is kept as it remembers it, and read again at the next check"
    )
    assert mirror.mirrored == remembered
    assert stats.check_errors == 2
    assert stats.reconciles == 0
    bucket.unreadable = False
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger=_log.name):
        assert await mirror.reconcile({"v1.mdc.ns.c.e.1": b"card"})
        bucket.unreadable = True
        assert not await mirror.reconcile({"v1.mdc.ns.c.e.1": b"card"})
    # A new outage is said again.
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert stats.reconciles == 1
