"""The package's shape: NATS stays inside adapters/nats, the card's speed code stays in card/fast.

Modules also stay small enough to read, and nothing in the product disguises how it builds an
object (no ``__class__`` assignment, no slot written through its descriptor).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("plugin", "adapters", "telemetry")
NATS_HOME = ROOT / "adapters" / "nats"
MAX_LINES = 600
FAST_HOME = ROOT / "plugin" / "card" / "fast"
FAST_PACKAGE = "workerset_admission.card.fast"
# The one module that may try the fast paths: the boundary's entry point, decode_model_record.
FAST_ENTRY = ROOT / "plugin" / "card" / "boundary.py"
# Where each top folder is installed (pyproject's package-dir).
PACKAGE_OF = {
    "plugin": "workerset_admission",
    "adapters": "workerset_admission.adapters",
    "telemetry": "workerset_admission.telemetry",
}


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


def _package(path: Path) -> str:
    """The dotted package a product module sits in."""
    top, *folders = path.relative_to(ROOT).parent.parts
    return ".".join([PACKAGE_OF[top], *folders])


def _imported_modules(path: Path) -> set[str]:
    """Every module a file imports, relative imports resolved, ``from m import x`` as m and m.x."""
    package = _package(path).split(".")
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *(node.module.split(".") if node.module else [])])
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
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


@pytest.mark.parametrize("path", _modules(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_product_module_stays_under_the_line_limit(path: Path) -> None:
    name = path.relative_to(ROOT).as_posix()
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{name} has {lines} lines"


def test_no_module_outside_card_fast_imports_it_but_the_boundary_entry_point() -> None:
    offenders = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in _modules()
        if FAST_HOME not in path.parents and path != FAST_ENTRY
        for name in sorted(_imported_modules(path))
        if name == FAST_PACKAGE or name.startswith(FAST_PACKAGE + ".")
    ]
    assert offenders == []
    assert any(name.startswith(FAST_PACKAGE) for name in _imported_modules(FAST_ENTRY))


def test_the_import_walk_resolves_relative_imports_of_card_fast() -> None:
    card = ROOT / "plugin" / "card"
    assert _package(card / "envelope.py") == "workerset_admission.card"
    assert FAST_PACKAGE in _imported_modules(FAST_ENTRY)
    assert "workerset_admission.card.card_facts" in _imported_modules(FAST_HOME / "memo.py")
    assert "workerset_admission.identity" in _imported_modules(FAST_HOME / "memo.py")


_CLASS_ASSIGNMENT = re.compile(r"__class__\s*=(?!=)")
_SLOT_WRITE = re.compile(r"\.__set__\b")


@pytest.mark.parametrize("path", _modules(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_product_module_assigns_a_class_or_writes_a_slot_through_its_descriptor(
    path: Path,
) -> None:
    text = path.read_text(encoding="utf-8")
    assert not _CLASS_ASSIGNMENT.search(text)
    assert not _SLOT_WRITE.search(text)


def test_the_construction_check_sees_a_class_assignment_and_a_slot_write() -> None:
    assert _CLASS_ASSIGNMENT.search("effect.__class__ = Placed")
    assert not _CLASS_ASSIGNMENT.search("if value.__class__ == Placed:")
    assert _SLOT_WRITE.search("vars(cls)[name].__set__(made, value)")
