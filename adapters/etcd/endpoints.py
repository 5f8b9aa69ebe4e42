"""etcd client URLs as Dynamo reads ``ETCD_ENDPOINTS``: ``http(s)://host:port``, comma-separated."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from workerset_admission.errors import ConfigError

__all__ = ["EtcdEndpoint", "parse_endpoints"]


@dataclass(frozen=True, slots=True)
class EtcdEndpoint:
    """One etcd client URL, split."""

    host: str
    port: int
    secure: bool

    def __str__(self) -> str:
        return f"{'https' if self.secure else 'http'}://{self.host}:{self.port}"


def parse_endpoints(urls: str | Sequence[str]) -> tuple[EtcdEndpoint, ...]:
    """Parse ``http(s)://host:port`` URLs (a comma-separated string or a list), as Dynamo does.

    A URL without a scheme is taken as ``http://``, like ``ETCD_ENDPOINTS``. Raises
    :class:`ConfigError` naming what is wrong, never echoing credentials embedded in a URL.
    """
    items = urls.split(",") if isinstance(urls, str) else list(urls)
    endpoints: list[EtcdEndpoint] = []
    for raw in (item.strip() for item in items):
        if not raw:
            continue
        split = urlsplit(raw if "://" in raw else f"http://{raw}")
        if split.scheme not in ("http", "https"):
            raise ConfigError("each etcd endpoint must be an http:// or https:// URL")
        if split.username or split.password:
            raise ConfigError("give etcd credentials as etcd_user/etcd_password, not in the URL")
        try:
            port = split.port or 2379
        except ValueError:
            raise ConfigError("an etcd endpoint has an invalid port") from None
        if not split.hostname or split.path not in ("", "/"):
            raise ConfigError("each etcd endpoint is scheme://host:port and nothing more")
        endpoints.append(EtcdEndpoint(split.hostname, port, split.scheme == "https"))
    if not endpoints:
        raise ConfigError("at least one etcd endpoint is required")
    return tuple(endpoints)
