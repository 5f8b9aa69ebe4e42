"""Failures in product code are loud: few blanket handlers, and each says what failed.

A blanket handler catches whatever comes (``except Exception``, ``except BaseException``, a bare
``except:``, a tuple naming either, ``contextlib.suppress(Exception)``). Each one either raises
again, returns what it caught to its caller (one outcome per change, as a writer's batch reports
them), or logs at WARNING or above, in the handler itself, what failed; a ``suppress`` of
everything cannot say anything and is not allowed at all. The whole product holds at most
``BUDGET`` of them, each a place where the process must go on whatever a part it does not own
does (an observer, an exporter, Dynamo's own code).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("plugin", "adapters", "telemetry")
BUDGET = 15
_EVERYTHING = {"Exception", "BaseException"}
_LOUD = {"warning", "error", "exception", "critical"}


@dataclass(frozen=True)
class Blanket:
    path: str
    line: int
    kind: str  # "except" or "suppress"
    loud: bool

    def __str__(self) -> str:
        return f"{self.path}:{self.line} ({self.kind})"


def _names_everything(node: ast.expr | None) -> bool:
    if node is None:
        return True  # a bare except
    if isinstance(node, ast.Tuple):
        return any(_names_everything(element) for element in node.elts)
    if isinstance(node, ast.Name):
        return node.id in _EVERYTHING
    if isinstance(node, ast.Attribute):
        return node.attr in _EVERYTHING
    return False


def _says_what_failed(handler: ast.ExceptHandler) -> bool:
    """Whether the handler raises again, returns what it caught, or logs at WARNING or above."""
    for node in ast.walk(ast.Module(body=handler.body, type_ignores=[])):
        if isinstance(node, ast.Raise):
            return True
        if (
            isinstance(node, ast.Return)
            and isinstance(node.value, ast.Name)
            and node.value.id == handler.name
        ):
            return True
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in _LOUD:
                return True
            if node.func.attr == "log" and node.args:
                level = node.args[0]
                if isinstance(level, ast.Attribute) and level.attr in {
                    "WARNING",
                    "ERROR",
                    "CRITICAL",
                }:
                    return True
    return False


def _is_suppress_everything(node: ast.Call) -> bool:
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return name == "suppress" and any(_names_everything(arg) for arg in node.args)


def blankets(root: Path = ROOT) -> Iterator[Blanket]:
    for folder in PRODUCT:
        for path in sorted((root / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            shown = str(path.relative_to(root))
            for node in ast.walk(tree):
                if isinstance(node, ast.ExceptHandler) and _names_everything(node.type):
                    yield Blanket(shown, node.lineno, "except", _says_what_failed(node))
                elif isinstance(node, ast.Call) and _is_suppress_everything(node):
                    yield Blanket(shown, node.lineno, "suppress", False)


def test_the_scan_sees_every_kind_of_blanket_handler(tmp_path: Path) -> None:
    product = tmp_path / "plugin"
    product.mkdir()
    (product / "m.py").write_text(
        "import contextlib, logging\n"
        "log = logging.getLogger()\n"
        "try:\n    pass\nexcept Exception:\n    log.debug('quiet')\n"
        "try:\n    pass\nexcept (ValueError, BaseException):\n    log.warning('loud')\n"
        "try:\n    pass\nexcept:\n    raise\n"
        "try:\n    pass\nexcept ValueError:\n    pass\n"
        "def f():\n    try:\n        pass\n    except Exception as exc:\n        return exc\n"
        "def g():\n    try:\n        pass\n    except Exception as exc:\n        return None\n"
        "with contextlib.suppress(Exception):\n    pass\n"
        "with contextlib.suppress(OSError):\n    pass\n"
    )
    (tmp_path / "adapters").mkdir()
    (tmp_path / "telemetry").mkdir()
    found = sorted(blankets(tmp_path), key=lambda b: b.line)
    assert [(b.line, b.kind, b.loud) for b in found] == [
        (5, "except", False),
        (9, "except", True),
        (13, "except", True),
        (22, "except", True),
        (27, "except", False),
        (29, "suppress", False),
    ]


def test_every_blanket_handler_says_what_failed() -> None:
    quiet = [str(b) for b in blankets() if not b.loud]
    assert not quiet, "blanket handlers that hide what failed:\n" + "\n".join(quiet)


def test_the_product_holds_few_blanket_handlers() -> None:
    found = [str(b) for b in blankets()]
    assert len(found) <= BUDGET, f"{len(found)} blanket handlers:\n" + "\n".join(found)
