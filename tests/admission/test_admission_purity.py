"""The core stays pure: no I/O libraries anywhere in what it imports, and misuse is loud."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest
from workerset_admission.admission import AdmissionCore
from workerset_admission.errors import UsageError

FORBIDDEN = {
    "asyncio",
    "nats",
    "opentelemetry",
    "logging",
    "pydantic",
    "socket",
    "threading",
    "time",
}


def _module_file(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return None
    return Path(spec.origin)


def _imports(path: Path, package: str) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                found.add(f"{base}.{node.module}" if node.module else base)
            elif node.module:
                found.add(node.module)
    return found


def _walk_project_imports(root: str) -> dict[str, set[str]]:
    """Follow every import inside the package, starting from the core, transitively."""
    seen: dict[str, set[str]] = {}
    todo = [root]
    core_dir = _module_file(root)
    assert core_dir is not None
    todo += [f"{root}.{p.stem}" for p in core_dir.parent.glob("*.py") if p.stem != "__init__"]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        path = _module_file(name)
        if path is None:
            seen[name] = set()
            continue
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        imports = _imports(path, package)
        seen[name] = imports
        todo += [i for i in imports if i.startswith("workerset_admission")]
    return seen


def test_the_core_imports_no_io_logging_or_validation_library_even_indirectly() -> None:
    graph = _walk_project_imports("workerset_admission.admission")
    assert "workerset_admission.admission.core" in graph
    offenders = {
        (module, imported)
        for module, imports in graph.items()
        for imported in imports
        if imported.split(".")[0] in FORBIDDEN
    }
    assert offenders == set()


def test_the_core_reaches_only_identity_errors_and_itself_inside_the_project() -> None:
    graph = _walk_project_imports("workerset_admission.admission")
    project = {m for m in graph if m.startswith("workerset_admission")}
    assert project <= {
        "workerset_admission",
        "workerset_admission.errors",
        "workerset_admission.identity",
    } | {m for m in project if m.startswith("workerset_admission.admission")}


def test_applying_something_that_is_not_an_input_is_a_usage_error() -> None:
    core = AdmissionCore()
    with pytest.raises(UsageError):
        core.apply("WorkerAdded")  # type: ignore[arg-type]
    with pytest.raises(UsageError):
        core.apply_many([object()])  # type: ignore[list-item]
