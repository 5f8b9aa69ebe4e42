"""The view frontend opens as many zmq event streams as Dynamo alone: one run, as a script.

Run as ``unshare --net -- python integration/eventplane_scenario.py --out result.json``: in a
network namespace of its own (only loopback, brought up here), since Dynamo's zmq publishers
bind every interface. It starts a side-by-side deployment (``sidebyside``) on Dynamo's default
event plane, zmq, with the KV router on both frontends and three ``dynamo.mocker`` workers,
waits until both frontends have connected their event streams, sends KV-routed requests to
each, then adds a worker the plugin rejects and does both again. It writes what it saw as
JSON: per frontend the streams connected (the ``ZMQ single-consumer stream connected`` lines
of its log), by topic, and the workers served.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from dynamoview import wait_for
from phoenix_scenario import bring_up_loopback
from sidebyside import side_by_side
from workerset_admission.adapters.nats.embedded import EmbeddedNatsServer

STREAM_LINE = "ZMQ single-consumer stream connected"
_TOPIC = re.compile(r"topic[=:\s\"]+([A-Za-z_-]+)")


def streams(log: Path) -> Counter[str]:
    """The event streams a frontend's log says it connected, counted by topic when named."""
    found: Counter[str] = Counter()
    text = re.sub(r"\x1b\[[0-9;]*m", "", log.read_text(errors="replace"))
    for line in text.splitlines():
        if STREAM_LINE in line:
            named = _TOPIC.search(line.split(STREAM_LINE, 1)[1])
            found[named.group(1) if named else "unnamed"] += 1
    return found


def settled_streams(logs: Path, settle: float) -> dict[str, dict[str, int]]:
    """Each frontend's streams by topic, once neither has connected another for 2 s."""
    # Streams are connected as channel records are discovered.
    deadline = time.monotonic() + settle
    last: dict[str, dict[str, int]] = {}
    while True:
        now = {n: dict(streams(logs / f"frontend-{n}.log")) for n in ("direct", "view")}
        if (now == last and all(now.values())) or time.monotonic() > deadline:
            return now
        last = now
        time.sleep(2.0)


def run(root: Path, workers: int, settle: float) -> dict[str, Any]:
    plugin_nats = EmbeddedNatsServer(root / "plugin-nats")
    plugin_nats.start()
    try:
        with side_by_side(root / "deployment", plugin_nats, event_plane="zmq") as running:
            # Info level: the stream lines are logged there.
            running.start("--router-mode", "kv", frontend_env={"DYN_LOG": "info"})
            running.serve(workers)
            logs = running.deployment.logs
            counted = settled_streams(logs, settle)
            served = {
                name: sorted({f"{frontend.ask().decode or 0:x}" for _ in range(12)})
                for name, frontend in running.frontends.items()
            }
            # A rejected worker: the view carries its load channels (they name no worker),
            # never its KV events, and KV routing must still reach admitted workers only.
            rival = running.add_worker(32)
            wait_for(lambda: rival in running.deployment.rejected(), 30, "the rival is rejected")
            with_rival = settled_streams(logs, settle)
            served_with_rival = {
                name: sorted({f"{frontend.ask().decode or 0:x}" for _ in range(20)})
                for name, frontend in running.frontends.items()
            }
            return {
                "workers": sorted(f"{w:x}" for w in running.incumbent),
                "rival": f"{rival:x}",
                "streams": counted,
                "streams_with_rival": with_rival,
                "served": served,
                "served_with_rival": served_with_rival,
                "view_channels": sorted(
                    p.name
                    for p in (running.deployment.view / "v1" / "event_channels").iterdir()
                    if not p.name.startswith(".")
                ),
            }
    finally:
        plugin_nats.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--settle", type=float, default=30.0)
    parser.add_argument("--root", type=Path, default=None)
    args = parser.parse_args(argv)
    bring_up_loopback()
    root = args.root or Path(tempfile.mkdtemp(prefix="eventplane-"))
    result = run(root, args.workers, args.settle)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result["streams"]), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
