"""The Dynamo 1.7 line for tests: its newest build on PyPI in a virtual environment of its own.

The project's environment holds Dynamo 1.6.1; the 1.7 tier (``-m dynamo17``) compares against
the newest 1.7 build PyPI serves, ``ai-dynamo-runtime`` and ``ai-dynamo`` at
:data:`DYNAMO17_RELEASE`, installed beside it, never into it. ``DYNAMO17_VENV`` names that
environment (``.ci/run`` uses ``.venv-dynamo17``); when it already holds the release it is
reused as it is, otherwise it is made there (or in the caller's scratch directory) with a
bounded install: the runtime with ``msgspec``, ``packaging`` and ``pyyaml``, then ``ai-dynamo``
without its dependencies (as for 1.6.1, its pins name packages the frontend and mocker never
import). Everything runs there through a subprocess: :func:`run_oracle` asks the 1.7 runtime
for its verdict on cards, ``dynamo17_writer.py`` registers models with its workers, and
:func:`plugin_environment` lets its frontend run this checkout's plugin (the plugin's own
dependencies are added to that environment, never the plugin or Dynamo 1.6.1).
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = [
    "DYNAMO17_RELEASE",
    "DYNAMO17_VENV_ENV",
    "Dynamo17VenvError",
    "ensure_dynamo17_venv",
    "plugin_environment",
    "release_in",
    "run_oracle",
]

DYNAMO17_RELEASE = "1.7.0.dev20261026"
DYNAMO17_VENV_ENV = "DYNAMO17_VENV"

_HERE = Path(__file__).resolve().parent
ORACLE = _HERE / "dynamo17_oracle.py"
WRITER = _HERE / "dynamo17_writer.py"


class Dynamo17VenvError(RuntimeError):
    """The 1.7 environment could not be found or made."""


def release_in(python: Path) -> str | None:
    """Return the ai-dynamo-runtime release the interpreter ``python`` imports, or None."""
    if not python.is_file():
        return None
    probe = subprocess.run(
        [
            str(python),
            "-c",
            "import importlib.metadata as m, dynamo._core; print(m.version('ai-dynamo-runtime'))",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return probe.stdout.strip() if probe.returncode == 0 else None


def ensure_dynamo17_venv(scratch: Path, *, timeout: float = 300.0) -> Path:
    """Return the 1.7 environment's ``python``, installing the release first when needed.

    ``$DYNAMO17_VENV`` is used when it already holds the release; otherwise the release is
    installed there (a re-run then reuses it), or under ``scratch`` when the variable is unset.
    An existing directory that is neither empty nor a virtual environment is left untouched.
    """
    chosen = os.environ.get(DYNAMO17_VENV_ENV, "").strip()
    venv = Path(chosen).absolute() if chosen else scratch / "venv-dynamo17"
    python = venv / "bin" / "python"
    if release_in(python) == DYNAMO17_RELEASE:
        return python
    if venv.exists() and any(venv.iterdir()) and not (venv / "pyvenv.cfg").is_file():
        raise Dynamo17VenvError(f"{venv} exists and is not a virtual environment; not touching it")
    pip = [str(python), "-m", "pip", "install", "--quiet", "--pre"]
    steps = [
        [sys.executable, "-m", "venv", str(venv)],
        [*pip, f"ai-dynamo-runtime=={DYNAMO17_RELEASE}", "msgspec", "packaging", "pyyaml"],
        [*pip, "--no-deps", f"ai-dynamo=={DYNAMO17_RELEASE}"],
    ]
    deadline = time.monotonic() + timeout
    for step in steps:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise Dynamo17VenvError(
                f"installing Dynamo {DYNAMO17_RELEASE} took over {timeout:.0f} s"
            )
        try:
            done = subprocess.run(
                step, capture_output=True, text=True, timeout=remaining, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise Dynamo17VenvError(
                f"installing Dynamo {DYNAMO17_RELEASE} took over {timeout:.0f} s"
            ) from exc
        if done.returncode != 0:
            raise Dynamo17VenvError(
                f"{' '.join(step)} failed ({done.returncode}): {done.stderr.strip()[-2000:]}"
            )
    found = release_in(python)
    if found != DYNAMO17_RELEASE:
        raise Dynamo17VenvError(f"{venv} holds ai-dynamo-runtime {found}, not {DYNAMO17_RELEASE}")
    return python


def run_oracle(
    python: Path, cards: Sequence[str], scratch: Path, *, timeout: float = 120.0
) -> list[dict[str, str | None]]:
    """The 1.7 runtime's verdict on each card text: ``{"checksum", "error"}``, in order.

    ``checksum`` is the name of the card's ``local_dir()`` (its ``mdcsum``) when the runtime
    accepts the card, else None with the runtime's ``error``.
    """
    given = scratch / "oracle-cards.jsonl"
    given.write_text("".join(json.dumps(text) + "\n" for text in cards), encoding="utf-8")
    done = subprocess.run(
        [str(python), str(ORACLE), str(given)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=_quiet_env(scratch),
    )
    if done.returncode != 0:
        raise AssertionError(f"the 1.7 oracle failed ({done.returncode}): {done.stderr[-2000:]}")
    verdicts = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    assert len(verdicts) == len(cards), (len(verdicts), len(cards), done.stderr[-2000:])
    return verdicts


def _quiet_env(scratch: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    tmp = scratch / "tmp"
    tmp.mkdir(exist_ok=True)
    return {**os.environ, "TMPDIR": str(tmp), "HOME": str(scratch), **(extra or {})}


def worker_env(scratch: Path, store: Path) -> dict[str, str]:
    """The environment for 1.7 workers on the file store ``store``, every socket on loopback."""
    return _quiet_env(
        scratch,
        {
            "DYN_FILE_KV": str(store),
            "DYN_TCP_RPC_HOST": "127.0.0.1",
            "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1",
        },
    )


ROOT = _HERE.parent
# What the plugin imports, checked before its dependencies are installed into the 1.7 env.
_PLUGIN_IMPORTS = "import nats, pydantic, opentelemetry.sdk, blake3, nkeys, yaml"


def plugin_environment(python: Path, *, timeout: float = 300.0) -> dict[str, str]:
    """Make the plugin importable by the 1.7 environment's Python; return what to add to env.

    The plugin's own dependencies (``pyproject.toml``, no extra: no Dynamo) are installed into
    that environment when missing; the plugin itself is not installed there: ``PYTHONPATH``
    names this checkout's editable link tree, so the 1.7 frontend runs the code under test. A
    frontend names the extension as ``module:function`` (no distribution metadata there).
    """
    import workerset_admission

    tree = str(Path(next(iter(workerset_admission.__path__))).parent)
    probe = subprocess.run(
        [str(python), "-c", _PLUGIN_IMPORTS], capture_output=True, timeout=60, check=False
    )
    if probe.returncode != 0:
        toml = importlib.import_module("tomllib" if sys.version_info >= (3, 11) else "tomli")
        project = toml.loads((ROOT / "pyproject.toml").read_text())["project"]
        wanted = [d for d in project["dependencies"] if "python_version" not in d]
        try:
            done = subprocess.run(
                [str(python), "-m", "pip", "install", "--quiet", *wanted],
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise Dynamo17VenvError(
                f"installing the plugin's dependencies took over {timeout:.0f} s"
            ) from exc
        if done.returncode != 0:
            raise Dynamo17VenvError(f"installing the plugin's dependencies: {done.stderr[-2000:]}")
    return {"PYTHONPATH": tree}
