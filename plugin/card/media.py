"""The card's ``media_decoder`` and ``media_fetcher`` sections (multimodal inputs)."""

from __future__ import annotations

from typing import Any

from workerset_admission.card.schema import (
    BOOL,
    STR,
    U32,
    U64,
    Ctx,
    Field,
    Opt,
    Refused,
    Seq,
    Struct,
    const,
    none,
)

__all__ = ["DURATION", "IMAGE_DECODER", "IMAGE_LIMITS", "MEDIA_DECODER", "MEDIA_FETCHER"]

IMAGE_LIMITS = Struct(
    "ImageDecoderLimits",
    (
        Field("max_image_width", Opt(U32), default=none),
        Field("max_image_height", Opt(U32), default=none),
        Field("max_alloc", Opt(U64), default=const(134217728)),
    ),
    deny_unknown=True,
)
IMAGE_DECODER = Struct(
    "ImageDecoder",
    (Field("limits", IMAGE_LIMITS, default=lambda: IMAGE_LIMITS.decode({}, 0, Ctx())),),
    deny_unknown=True,
)
MEDIA_DECODER = Struct("MediaDecoder", (Field("image", Opt(IMAGE_DECODER), default=none),))


def _check_duration(value: dict[str, Any], ctx: Ctx) -> None:
    # serde carries whole seconds out of ``nanos`` into ``secs`` and refuses a u64 overflow.
    if value["secs"] + value["nanos"] // 1_000_000_000 > (1 << 64) - 1:
        raise Refused("out_of_range", "overflow deserializing Duration")


DURATION = Struct(
    "Duration",
    (Field("secs", U64), Field("nanos", U32)),
    deny_unknown=True,
    validate=_check_duration,
)
MEDIA_FETCHER = Struct(
    "MediaFetcher",
    (
        Field("user_agent", STR),
        Field("allow_direct_ip", BOOL),
        Field("allow_direct_port", BOOL),
        Field("allow_private_ips", BOOL),
        Field("allowed_media_domains", Opt(Seq(STR))),
        Field("timeout", Opt(DURATION)),
    ),
)
