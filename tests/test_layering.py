"""The package's shape: NATS stays inside adapters/nats, adapters never import one another, and
modules stay small enough to read."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("plugin", "adapters", "telemetry")
NATS_HOME = ROOT / "adapters" / "nats"
MAX_LINES = 600


def _modules() -> list[Path]:
    return sorted(p for top in PRODUCT for p in (ROOT / top).rglob("*.py"))


def _imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_the_walk_finds_the_product_modules() -> None:
    found = {p.relative_to(ROOT).as_posix() for p in _modules()}
    assert {"plugin/service.py", "adapters/nats/source.py", "plugin/ingest.py"} <= found


def test_no_module_outside_adapters_nats_imports_nats() -> None:
    offenders = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in _modules()
        if NATS_HOME not in path.parents
        for name in sorted(_imported(path))
        if name == "nats" or name.startswith("nats.")
    ]
    assert offenders == []


def test_the_import_walk_sees_an_import_of_nats(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from nats.errors import Error\n    import nats.js\n")
    assert {"nats.errors", "nats.js"} <= _imported(module)


def _foreign_adapters(path: Path, own: str) -> list[str]:
    prefix = "workerset_admission.adapters."
    return sorted(
        name
        for name in _imported(path)
        if name.startswith(prefix) and name[len(prefix) :].split(".")[0] != own
    )


def test_no_adapter_imports_another_adapter() -> None:
    # What two adapters share (the bridges' bucket writer port, Dynamo's store paths) lives in
    # the package's own modules, so each adapter can be read and replaced on its own.
    offenders = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in _modules()
        if path.relative_to(ROOT).parts[0] == "adapters" and len(path.relative_to(ROOT).parts) > 2
        for name in _foreign_adapters(path, path.relative_to(ROOT).parts[1])
    ]
    assert offenders == []


def test_the_adapter_walk_sees_an_import_of_another_adapter(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("from workerset_admission.adapters.dynamo.bridge import DiscoveryBridge\n")
    assert _foreign_adapters(module, "etcd") == ["workerset_admission.adapters.dynamo.bridge"]
    assert _foreign_adapters(module, "dynamo") == []


@pytest.mark.parametrize("path", _modules(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_product_module_stays_under_the_line_limit(path: Path) -> None:
    name = path.relative_to(ROOT).as_posix()
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{name} has {lines} lines"
