"""What each Dynamo frontend line decides differently about a card the 1.6.1 rules accept.

The boundary decodes every card by 1.6.1's rules (the ``model`` and ``schema`` modules). A
frontend of a later line may refuse some of those cards; this module holds those extra
refusals, one function per line, applied after decoding, so the decoder itself and every cache
of decoded cards stay the same for every line. A card a line refuses here is refused as invalid
at the boundary, as that frontend would never serve it.

* ``1.6``: the 1.6.1 rules, nothing added (also the rules for the N-2 window before it).
* ``1.7``: the router's two time-to-live settings, ``router_ttl_secs`` and
  ``router_predicted_ttl_secs``, are read as durations: a float number of seconds becomes a
  duration only when its whole seconds fit an unsigned 64-bit count, so a value of 2**64 or
  more is refused ("not a valid duration"). Below that limit every value keeps its 1.6.1
  checksum (the largest double below 2**64, 2**64 - 2048, is accepted). Measured against the
  ``ai-dynamo-runtime==1.7.0.dev20261026`` build; the 1.7 tier of the suite holds it there.
"""

from __future__ import annotations

import re
from typing import Final

from workerset_admission.card.model import DecodedCard
from workerset_admission.errors import CardDecodeError, UsageError

__all__ = [
    "DEFAULT_LINE",
    "DURATION_LIMIT_SECS",
    "LINES",
    "check_line",
    "line_of_version",
]

LINES: Final = ("1.6", "1.7")
"""The frontend lines the boundary can judge for, oldest first."""

DEFAULT_LINE: Final = "1.6"

# A float number of seconds converts to a duration only below this (its whole seconds must
# fit a u64). Every double below it is at most 2**64 - 2048, so the comparison is exact.
DURATION_LIMIT_SECS: Final = float(2**64)

_RELEASE: Final = re.compile(r"(\d+)\.(\d+)")

_DURATION_FIELDS: Final = ("router_ttl_secs", "router_predicted_ttl_secs")


def check_line(card: DecodedCard, line: str) -> None:
    """Raise :class:`CardDecodeError` if a frontend of ``line`` refuses this decoded card."""
    if line == "1.6":
        return
    if line != "1.7":
        raise UsageError(f"unknown Dynamo line {line!r}; known: {', '.join(LINES)}")
    router = card.fields["router_config"]
    if router is None:
        return
    kv = router["kv_router_config"]
    for name in _DURATION_FIELDS:
        value = kv[name]
        if value is not None and value >= DURATION_LIMIT_SECS:
            raise CardDecodeError(
                "invalid_router_config",
                f"{name} is not a valid duration for a Dynamo 1.7 frontend: {value!r} seconds "
                "is 2**64 or more",
            )


def line_of_version(version: str) -> str:
    """Return the line whose rules a frontend of release ``version`` (``1.7.0rc1``) uses.

    Releases before 1.7 use the 1.6 rules; 1.7 releases, and any later release (whose own
    rules the boundary does not know yet), the 1.7 rules. Raises :class:`UsageError` for a
    version that does not start with a numeric major and minor.
    """
    found = _RELEASE.match(version.strip())
    if found is None:
        raise UsageError(f"cannot read a Dynamo release from {version!r}")
    major, minor = int(found[1]), int(found[2])
    return "1.6" if (major, minor) < (1, 7) else "1.7"
