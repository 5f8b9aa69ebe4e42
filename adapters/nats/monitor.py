"""The NATS server's monitoring (``/connz``): which host subscribes to a request-plane subject.

A worker on Dynamo's NATS request plane records only a subject in its endpoint record
(``transport.nats_tcp``), no host. The server it subscribed through knows the connection's
address: ``GET /connz?subs=detail`` lists every client with its IP and its subscriptions. This
reads that listing and hands back subject -> host for the subjects asked about; matching a
host to workers is ``rollout/drain.py``'s. Read-only, no credentials: the monitoring port of
the request plane's nats-server (8222 in the NATS Helm chart).
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from workerset_admission.errors import Unreachable, UsageError, error_in_words

__all__ = ["connz_hosts", "subject_hosts"]

# One page of /connz; the server's own limit is 1024 unless told.
_PAGE = 1024
_TIMEOUT = 5.0


def connz_hosts(pages: Sequence[Mapping[str, Any]], subjects: Sequence[str]) -> dict[str, str]:
    """Map subject -> IP of the connection subscribed to it, from ``/connz?subs=detail`` pages."""
    wanted = set(subjects)
    found: dict[str, str] = {}
    for page in pages:
        for connection in page.get("connections") or ():
            ip = connection.get("ip")
            if not isinstance(ip, str):
                continue
            for sub in connection.get("subscriptions_list_detail") or ():
                subject = sub.get("subject") if isinstance(sub, dict) else None
                if subject in wanted:
                    found[subject] = ip
            for subject in connection.get("subscriptions_list") or ():
                if subject in wanted:
                    found[subject] = ip
    return found


def _get(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=_TIMEOUT) as answer:
        data: dict[str, Any] = json.loads(answer.read())
        return data


async def subject_hosts(monitor: str, subjects: Sequence[str]) -> dict[str, str]:
    """Read every page of ``{monitor}/connz?subs=detail`` and map ``subjects`` to hosts."""
    if urlsplit(monitor).scheme not in ("http", "https"):
        raise UsageError(f"--nats-monitor must be an http:// or https:// address, not {monitor!r}")
    base = monitor.rstrip("/")
    pages: list[dict[str, Any]] = []
    offset = 0
    while True:
        url = f"{base}/connz?subs=detail&limit={_PAGE}&offset={offset}"
        try:
            page = await asyncio.to_thread(_get, url)
        except (OSError, ValueError) as error:
            words = error_in_words(error)
            raise Unreachable(f"cannot read the NATS monitoring at {base}: {words}") from None
        pages.append(page)
        count = len(page.get("connections") or ())
        offset += count
        if count == 0 or offset >= int(page.get("total", 0)):
            return connz_hosts(pages, subjects)
