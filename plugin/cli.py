"""The ``workerset-admission`` command line.

Each subcommand lives in the module that owns its behaviour; this file only wires them up, so
importing the CLI never pulls in NATS or OpenTelemetry for an offline ``replay``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

__all__ = ["main"]

# subcommand -> (module, one-line help). The module provides ``add_arguments(parser)`` and
# ``run(args) -> int``.
_COMMANDS: dict[str, tuple[str, str]] = {
    "replay": (
        "workerset_admission.replay_cli",
        "replay a discovery trace offline and print the state",
    ),
    "explain": ("workerset_admission.replay_cli", "explain why an instance is or is not admitted"),
    "serve": ("workerset_admission.service_cli", "run the admission service (the main job)"),
    "status": ("workerset_admission.service_cli", "ask a running service for its admission state"),
    "demo": ("workerset_admission.service_cli", "play a rolling update and show each decision"),
    "bridge": (
        "workerset_admission.bridge_cli",
        "mirror Dynamo's file discovery store into the NATS discovery bucket",
    ),
    "register": (
        "workerset_admission.nats_cli",
        "register a worker's model card in the discovery bucket (kept alive until stopped)",
    ),
    "deregister": (
        "workerset_admission.nats_cli",
        "remove a worker's registration from the discovery bucket",
    ),
    "record": (
        "workerset_admission.nats_cli",
        "record a replay trace from the live discovery bucket",
    ),
    "rollout": (
        "workerset_admission.rollout_cli",
        "gate a rolling update: is a worker namespace served by every live frontend",
    ),
}


def _load(name: str):  # type: ignore[no-untyped-def]
    module_name, _help = _COMMANDS[name]
    return importlib.import_module(module_name)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="workerset-admission",
        description="WorkerSet admission for the Dynamo frontend.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (_module, help_text) in _COMMANDS.items():
        command_parser = sub.add_parser(name, help=help_text, description=help_text)
        _load(name).add_arguments(name, command_parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = _load(args.command).run(args.command, args)
    return code


if __name__ == "__main__":
    sys.exit(main())
