"""The ``workerset-admission`` command line: one runner for every subcommand.

Each subcommand lives in the module that owns its behaviour and declares two things:
``arguments(name, parser)`` adds its own flags, and ``async main(name, args, stop)`` does the
work and returns an exit status. This runner does the rest, the same way for every command:

* the parser, ``--version``, a validated ``--log-level``, the NATS connection flags on the
  commands that connect (and only those), and on each the flags of the settings it reads (its
  :class:`CommandSpec` lists them); settings are loaded and checked before anything starts;
* the event loop and the signals: the first SIGINT or SIGTERM sets ``stop`` (commands that run
  until stopped finish cleanly on it), and cancels a command that does not wait for it; a second
  signal cancels whatever is left;
* one table from errors to exit statuses (:data:`EXIT_STATUSES`), and one message format:
  ``workerset-admission <command>: <what went wrong>`` on standard error, no traceback.
* a standard output whose reader went away (``status | head -1``) ends the command quietly
  with status 0, as for any Unix filter; a broken pipe elsewhere (a NATS connection) is an
  error like any other.

Importing this module pulls in neither NATS nor OpenTelemetry, so an offline ``replay`` stays
light.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import logging
import math
import os
import select
import signal
import sys
import typing
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

from workerset_admission.aio import cancel_and_wait
from workerset_admission.cli.exits import (
    EXIT_CREDENTIALS,
    EXIT_FAILED,
    EXIT_LAST_WORKER,
    EXIT_NO,
    EXIT_OK,
    EXIT_STATUSES,
    EXIT_UNCONFIRMED,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    exit_status,
    transport_errors,
)
from workerset_admission.errors import (
    StoreUnavailable,
    Unreachable,
    WorkersetAdmissionError,
    error_in_words,
    wire_text,
)

__all__ = [
    "COMMANDS",
    "EXIT_CREDENTIALS",
    "EXIT_FAILED",
    "EXIT_LAST_WORKER",
    "EXIT_NO",
    "EXIT_OK",
    "EXIT_STATUSES",
    "EXIT_UNCONFIRMED",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
    "build_parser",
    "exit_status",
    "main",
    "positive_seconds",
    "seconds_within",
    "text_within",
]


@dataclass(frozen=True, slots=True)
class CommandSpec:
    """Where a subcommand lives, its one-line help, and whether it connects to NATS.

    ``settings`` names the settings, besides the NATS connection, that the command reads: it
    shows a flag for each of them and for no other. ``runs_until_stopped`` and
    ``interrupted_status`` say what a signal does to it.
    """

    module: str
    help: str
    connects: bool
    settings: tuple[str, ...] = ()
    # Runs until SIGINT or SIGTERM asks it to stop (then finishes cleanly and exits 0);
    # any other command is simply cancelled by a signal.
    runs_until_stopped: bool = False
    # The status a command ends with when a signal interrupts it.
    interrupted_status: int = EXIT_OK


# What the service reads: everything from the buckets to the limits and the view it writes.
_SERVE_SETTINGS = (
    "discovery_bucket",
    "admission_bucket",
    "bucket_replicas",
    "frontend_id",
    "status_subject",
    "namespace_filter_mode",
    "namespace_filter",
    "tokenizer_backend",
    "dynamo_version",
    "reconcile_interval",
    "max_value_bytes",
    "max_concurrent_builds",
    "registration_ttl",
    "tenure_hold",
    "prometheus_port",
    "prometheus_host",
    "view_dir",
    "view_horizon",
    "health_port",
    "health_host",
    "trace_out",
)
# register judges the card as the service would before writing it: the same boundary settings.
_REGISTER_SETTINGS = (
    "discovery_bucket",
    # A bucket lost with its server is created again as configured.
    "bucket_replicas",
    "namespace_filter_mode",
    "namespace_filter",
    "tokenizer_backend",
    "dynamo_version",
    "max_value_bytes",
)
_ETCD_SETTINGS = (
    "etcd_endpoints",
    "etcd_user",
    "etcd_password",
    "etcd_tls_ca_file",
    "etcd_tls_cert_file",
    "etcd_tls_key_file",
)


COMMANDS: dict[str, CommandSpec] = {
    "replay": CommandSpec(
        "workerset_admission.cli.traces",
        "replay a discovery trace offline and print the state",
        connects=False,
    ),
    "explain": CommandSpec(
        "workerset_admission.cli.traces",
        "explain why an instance is or is not admitted (exit 1 when it is not)",
        connects=False,
    ),
    "diff": CommandSpec(
        "workerset_admission.cli.diff",
        "compare two cards: both checksums and what differs (exit 1 when they differ)",
        connects=False,
    ),
    "serve": CommandSpec(
        "workerset_admission.cli.serve",
        "run the admission service (the main job)",
        connects=True,
        settings=_SERVE_SETTINGS,
        runs_until_stopped=True,
    ),
    "status": CommandSpec(
        "workerset_admission.cli.serve",
        "ask a running service for its admission state (or, with --card, its served card)",
        connects=True,
        # The admission bucket: where the other frontends say what they serve.
        settings=("status_subject", "discovery_bucket", "admission_bucket"),
    ),
    "demo": CommandSpec(
        "workerset_admission.cli.demo",
        "play a rolling update on an embedded server and show each decision",
        connects=False,
    ),
    "bridge": CommandSpec(
        "workerset_admission.cli.bridge",
        "mirror Dynamo's discovery store (its file store, or etcd with --etcd) into the NATS "
        "discovery bucket",
        connects=True,
        settings=(
            "discovery_bucket",
            "bucket_replicas",
            "max_value_bytes",
            # Its supervisors' endpoints: liveness, readiness and its lag, as serve's.
            "health_port",
            "health_host",
            "prometheus_port",
            "prometheus_host",
            *_ETCD_SETTINGS,
        ),
        runs_until_stopped=True,
    ),
    "register": CommandSpec(
        "workerset_admission.cli.workers",
        "register a worker's model card in the discovery bucket (kept alive until stopped)",
        connects=True,
        settings=_REGISTER_SETTINGS,
        runs_until_stopped=True,
    ),
    "deregister": CommandSpec(
        "workerset_admission.cli.workers",
        "remove a worker's registration from the discovery bucket",
        connects=True,
        settings=("discovery_bucket",),
    ),
    "record": CommandSpec(
        "workerset_admission.cli.traces",
        "record a replay trace from the discovery bucket, as a second watch beside the "
        "frontends (for what one frontend itself observed, run it with --trace-out)",
        connects=True,
        settings=("discovery_bucket", "admission_bucket", "status_subject"),
        runs_until_stopped=True,
    ),
    "drain": CommandSpec(
        "workerset_admission.cli.drain",
        "take workers out of routing on every frontend (exit 6, nothing written, when a "
        "model would be left with no routable worker); with --wait, answer when they are "
        "safe to stop (exit 1 when the timeout passes first)",
        connects=True,
        settings=("discovery_bucket", "admission_bucket"),
        # drain --wait stopped by a signal: safe to stop was not seen; the drain stays.
        interrupted_status=EXIT_NO,
    ),
    "undrain": CommandSpec(
        "workerset_admission.cli.drain",
        "withdraw the drains of the workers named (as drain names them): they rejoin as "
        "returning cohort members",
        connects=True,
        settings=("discovery_bucket",),
    ),
    "rollout": CommandSpec(
        "workerset_admission.cli.rollout",
        "gate a rolling update: is a worker namespace served by every live frontend",
        connects=True,
        settings=("admission_bucket",),
        # rollout --wait stopped by a signal: the gate was not seen open.
        interrupted_status=EXIT_NO,
    ),
}


class CommandModule(Protocol):
    """What the runner needs from a command module."""

    def arguments(self, name: str, parser: argparse.ArgumentParser) -> None: ...

    def main(self, name: str, args: argparse.Namespace, stop: asyncio.Event) -> Awaitable[int]: ...


def positive_seconds(text: str) -> float:
    """Parse a positive number of seconds (an argparse ``type`` shared by the commands)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("expected a number of seconds") from None
    if value <= 0:
        raise argparse.ArgumentTypeError("expected a positive number of seconds")
    return value


def seconds_within(most: float, *, zero: bool = False) -> Callable[[str], float]:
    """Make an argparse ``type``: finite seconds above 0 (or 0 too), at most ``most``.

    A negative, infinite or absurd duration is refused on one line instead of being read as
    "no limit" or "keep forever".
    """
    most_text = f"{most:.0f}" if most == int(most) else f"{most:g}"
    allowed = f"from 0 to {most_text}" if zero else f"more than 0 and at most {most_text}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a number of seconds, not {text!r}"
            ) from None
        if not math.isfinite(value) or value < 0 or (value == 0 and not zero) or value > most:
            raise argparse.ArgumentTypeError(
                f"expected a number of seconds {allowed}, not {text!r}"
            )
        return value

    return parse


def text_within(most: int) -> Callable[[str], str]:
    """Make an argparse ``type``: one line of text of at most ``most`` characters."""

    def parse(text: str) -> str:
        if len(text) > most:
            raise argparse.ArgumentTypeError(f"at most {most} characters, not {len(text)}")
        if any(ord(c) < 32 or ord(c) == 127 for c in text):
            raise argparse.ArgumentTypeError("one line of text, without control characters")
        return text

    return parse


_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


# ``serve`` tells what it decides as it goes; ``replay`` and ``explain`` run the live step code,
# whose warnings (a hold, a succession) are already in the answer they print.
_DEFAULT_LOG_LEVELS = {"serve": "INFO", "replay": "ERROR", "explain": "ERROR"}


def _log_level(text: str) -> str:
    level = text.upper()
    if level not in _LEVELS:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(_LEVELS)}, not {text!r}")
    return level


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("dynamo-workerset-admission")
    except PackageNotFoundError:  # pragma: no cover - running from an uninstalled tree
        return "unknown"


def _load(name: str) -> CommandModule:
    return cast(CommandModule, importlib.import_module(COMMANDS[name].module))


class _Parser(argparse.ArgumentParser):
    """A parser whose errors are one line, ``<prog>: <what went wrong>``, and exit 2.

    A subcommand's parser is named ``workerset-admission <command>``, so an argument error
    names the command as every other error does; ``--help`` shows the usage.
    """

    def error(self, message: str) -> typing.NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="workerset-admission",
        description="WorkerSet admission for the Dynamo frontend.",
        epilog="Exit statuses: "
        + "; ".join(f"{code} {text}" for code, text in EXIT_STATUSES.items()),
    )
    version = f"workerset-admission {_version()}"
    parser.add_argument("--version", action="version", version=version)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, spec in COMMANDS.items():
        command = sub.add_parser(name, help=spec.help, description=spec.help)
        command.add_argument("--version", action="version", version=version)
        _load(name).arguments(name, command)
        command.add_argument(
            "--log-level",
            type=_log_level,
            default=_DEFAULT_LOG_LEVELS.get(name, "WARNING"),
            help="log level: DEBUG, INFO, WARNING, ERROR or CRITICAL",
        )
        if spec.connects:
            from workerset_admission.settings import add_settings_arguments

            add_settings_arguments(command, spec.settings)
    return parser


def _settings(args: argparse.Namespace) -> Any:
    from workerset_admission.settings import flags_from_args, load_settings

    return load_settings(flags=flags_from_args(args), config_file=args.config_file)


async def _run(
    main: Callable[[], Awaitable[int]], stop: asyncio.Event, waits: bool, interrupted: int
) -> int:
    """Run ``main`` with the signal handlers installed; see the module docstring."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(main())
    signalled = 0

    def on_signal() -> None:
        nonlocal signalled
        signalled += 1
        stop.set()
        if signalled > 1 or not waits:
            task.cancel()

    installed = []
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signum, on_signal)
            installed.append(signum)
    try:
        return await task
    except asyncio.CancelledError:
        if not signalled:
            raise
        return interrupted
    finally:
        for signum in installed:
            loop.remove_signal_handler(signum)
        # The command's task ends with this function, whichever way it leaves.
        await cancel_and_wait([task])


def run_command(name: str, args: argparse.Namespace) -> int:
    """Run one parsed command and return its exit status; errors become the table's status."""
    module = _load(name)
    # Only a refusal this command heard explains its failure (a process may run several).
    since = _refusals_heard()
    try:
        if COMMANDS[name].connects:
            args.settings = _settings(args)
        stop = asyncio.Event()
        spec = COMMANDS[name]
        waits, interrupted = spec.runs_until_stopped, spec.interrupted_status
        return asyncio.run(_run(lambda: module.main(name, args, stop), stop, waits, interrupted))
    except KeyboardInterrupt:
        return COMMANDS[name].interrupted_status
    except BrokenPipeError as error:
        if not _stdout_closed():
            return _failed(name, error, since)
        if COMMANDS[name].runs_until_stopped:
            # A service whose output went away (a log collector restarted) has failed, not
            # finished: a status its supervisor restarts (4), never the 0 of a filter's end.
            _quiet_on_closed_stdout()
            logging.getLogger(__name__).warning(
                "%s: standard output was closed; stopping to be restarted", name
            )
            return EXIT_FAILED
        return _quiet_on_closed_stdout()
    except Exception as error:  # the top level: any error becomes words and an exit status
        if not isinstance(error, (WorkersetAdmissionError, *transport_errors())):
            # Not one of the package's errors nor a transport's: a defect, shown whole.
            logging.getLogger(__name__).exception(
                "%s stopped on an unexpected %s", name, type(error).__name__
            )
        return _failed(name, error, since)


def _failed(name: str, error: Exception, since: int = 0) -> int:
    """Say on one line what ended a command, and return its status from the table."""
    error = _refusal_behind(error, since)
    status = exit_status(error)
    text = _in_words(error)
    if status == EXIT_UNREACHABLE and not isinstance(error, (Unreachable, StoreUnavailable)):
        text = f"cannot reach NATS: {text}"
    # One line, whatever the error quotes from the wire (a host, a key, a model name).
    print(f"workerset-admission {name}: {wire_text(text, _LINE_LIMIT)}", file=sys.stderr)
    if status == EXIT_FAILED:
        logging.getLogger(__name__).debug("%s failed", name, exc_info=error)
    return status


def _in_words(error: Exception) -> str:
    """Say an error in words: its own message, or for a bare library error what it means."""
    if isinstance(error, WorkersetAdmissionError):
        return str(error) or error_in_words(error)
    return error_in_words(error)


def _stdout_closed() -> bool:
    """Whether standard output is a pipe whose reader has gone (``| head -1``).

    A broken pipe can also be a NATS connection the server closed: only a standard output
    the poll reports in error is the reader that went away.
    """
    try:
        fd = sys.stdout.fileno()
        poller = select.poll()
    except (AttributeError, OSError, ValueError):  # no real descriptor, or no poll here
        return False
    poller.register(fd, select.POLLOUT)
    return any(events & select.POLLERR for _fd, events in poller.poll(0))


def _quiet_on_closed_stdout() -> int:
    """End a command whose reader closed standard output: quietly, with status 0.

    What the reader wanted it read (``head -1`` took its line); the rest has nowhere to go.
    Standard output is pointed at /dev/null so the interpreter's last flush at exit does not
    fail too (what the Python documentation advises for SIGPIPE).
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)
    return EXIT_OK


# The longest error line a command prints (what it quotes from the wire is escaped and cut).
_LINE_LIMIT = 2000


def _refusals_heard() -> int:
    """How many permission refusals this process heard before now (none if NATS never loaded)."""
    connect = sys.modules.get("workerset_admission.adapters.nats.connect")
    return 0 if connect is None else int(connect.refusal_mark())


def _refusal_behind(error: Exception, since: int = 0) -> Exception:
    """Say a failure behind which the server refused a permission as that refusal.

    The server never answers a publish or a subscription it refuses; the command then fails on
    a timeout (or a listing that never ends), which would read as a network failure.
    """
    if exit_status(error) not in (EXIT_UNREACHABLE, EXIT_FAILED):
        return error
    connect = sys.modules.get("workerset_admission.adapters.nats.connect")
    refusal = connect.permission_refusal(since) if connect is not None else None
    return error if refusal is None else refusal


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        # The top-level parser collects what a subcommand did not know: say which command.
        parser.exit(
            EXIT_USAGE,
            f"workerset-admission {args.command}: unrecognized arguments: {' '.join(unknown)} "
            f"(see workerset-admission {args.command} --help)\n",
        )
    logging.basicConfig(level=args.log_level, format="%(levelname)s %(name)s: %(message)s")
    status = run_command(args.command, args)
    try:
        # What is still buffered goes now, where a closed pipe can be told apart.
        sys.stdout.flush()
    except BrokenPipeError:
        return _quiet_on_closed_stdout()
    return status


if __name__ == "__main__":
    sys.exit(main())
