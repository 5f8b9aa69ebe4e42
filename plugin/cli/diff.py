"""The ``diff`` subcommand: whether two cards would join one cohort, and if not, what differs.

The pre-flight for a rollout: given the card the fleet serves now and a new worker's card, it
prints both checksums and the checksum inputs that differ. Each card is judged by the service's
own discovery boundary (a bare card as if a worker had registered it), so a card the service
would refuse is refused here with the same reason.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from workerset_admission.card import BoundarySettings, card_differences, model_kv_key
from workerset_admission.card.entry import EntryDecoder
from workerset_admission.cli.exits import EXIT_NO, EXIT_OK
from workerset_admission.errors import RemoteDataError, UsageError
from workerset_admission.identity import EndpointId, Registration

__all__ = ["arguments", "judge", "main"]


# Where a bare card is registered for judging: any endpoint the default filter accepts.
_PLACE = EndpointId("diff", "diff", "diff")


def arguments(name: str, parser: argparse.ArgumentParser) -> None:
    del name
    for which, role in (("card_a", "the card served now"), ("card_b", "the new worker's card")):
        parser.add_argument(
            which,
            metavar=which.upper(),
            help=f"{role}: a card JSON file, a discovery Model record, or '-' for stdin",
        )
    parser.add_argument("--json", action="store_true", help="print the answer as JSON")


def _read(source: str) -> bytes:
    if source == "-":
        return sys.stdin.buffer.read()
    try:
        return Path(source).read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read {source}: {exc.strerror or exc}") from None


def _record(text: bytes, source: str) -> tuple[str, bytes]:
    """Return the key and record to judge: the record given, or a bare card wrapped in one."""
    try:
        value: Any = json.loads(text)
    except ValueError:
        value = None  # the boundary says what is wrong with it, as it would live
    if isinstance(value, dict) and value.get("type") == "Model":
        try:
            endpoint = EndpointId(value["namespace"], value["component"], value["endpoint"])
            key = model_kv_key(endpoint, value["instance_id"], value.get("model_suffix"))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise UsageError(f"{source}: not a complete Model record ({exc})") from None
        return key, text
    # The card's own bytes go inside the record, so it is read exactly as it is spelled.
    suffix = "diff" if isinstance(value, dict) and value.get("lora") is not None else None
    head = {"type": "Model", "namespace": "diff", "component": "diff", "endpoint": "diff"}
    envelope = json.dumps({**head, "instance_id": 1}, separators=(",", ":"))[:-1]
    tail = "" if suffix is None else f',"model_suffix":"{suffix}"'
    record = f'{envelope},"card_json":'.encode() + text + f"{tail}}}".encode()
    return model_kv_key(_PLACE, 1, suffix), record


def judge(source: str, text: bytes) -> Registration:
    """Judge one card or record as the service would; refuse it with the service's reason."""
    key, record = _record(text, source)
    try:
        registration = EntryDecoder(BoundarySettings()).decode(key, record)
    except RemoteDataError as exc:
        raise UsageError(f"{source}: the service would refuse it: {exc}") from None
    if not isinstance(registration, Registration):
        raise UsageError(f"{source}: not a model card or Model record")
    return registration


async def main(name: str, args: argparse.Namespace, stop: asyncio.Event) -> int:
    del name, stop  # offline and short: a signal simply cancels it
    if args.card_a == "-" and args.card_b == "-":
        raise UsageError("only one of the two cards can be read from standard input")
    a = judge(args.card_a, _read(args.card_a))
    b = judge(args.card_b, _read(args.card_b))
    differences = card_differences(a.card, b.card)
    equal = a.mdc_checksum == b.mdc_checksum
    if args.json:
        answer = {
            "card_a": {"source": args.card_a, "mdc_checksum": a.mdc_checksum},
            "card_b": {"source": args.card_b, "mdc_checksum": b.mdc_checksum},
            "equal": equal,
            "differences": [d.to_json() for d in differences],
        }
        print(json.dumps(answer, indent=2, ensure_ascii=False))
    else:
        print(f"card A {a.mdc_checksum}  {args.card_a}")
        print(f"card B {b.mdc_checksum}  {args.card_b}")
        if equal:
            print("equal checksums: these workers would join one cohort")
        else:
            print(f"different checksums; B differs from A in {len(differences)} input(s):")
            for difference in differences:
                print(f"  {difference.field}: {difference.incumbent} -> {difference.rejected}")
    return EXIT_OK if equal else EXIT_NO
