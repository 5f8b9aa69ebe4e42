"""The command examples of the README and docs/, read from the Markdown as it is written.

Every fenced block that holds commands (``sh``, ``bash``, or a bare block whose first line is a
``workerset-admission`` command) carries a marker on the line before it, an HTML comment that
says how the test suite runs it:

* ``<!-- example: runs offline -->`` (``, exit N`` when its last command answers N): run by
  ``bash`` from the root of the checkout; lines starting ``$ `` are commands and the lines after
  them their exact output;
* ``<!-- example: runs beside a local serve -->``: run in a scratch folder while a ``serve``
  with an embedded nats-server and one registered worker runs;
* ``<!-- example: runs as the walkthrough, with real Dynamo -->``: the README's walkthrough;
* ``<!-- example: not run here: REASON -->``: not run, for the reason given.

A block of output the docs show is marked ``<!-- example: output of ... -->`` (checked against
what the command prints) or ``<!-- example: output not checked here: REASON -->``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DOCS", "ROOT", "Block", "blocks", "command_blocks", "marked"]

ROOT = Path(__file__).resolve().parents[2]
# docs/security.md holds configuration, not commands.
DOCS = (
    ROOT / "README.md",
    ROOT / "docs" / "operations.md",
    ROOT / "docs" / "deploying.md",
    ROOT / "docs" / "runbook.md",
    ROOT / "docs" / "benchmarks.md",
    ROOT / "docs" / "faults.md",
    ROOT / "docs" / "security.md",
    ROOT / "docs" / "sources.md",
    ROOT / "docs" / "architecture.md",
    ROOT / "docs" / "bridges.md",
    ROOT / "docs" / "commands.md",
    ROOT / "docs" / "conformance.md",
    ROOT / "docs" / "drains.md",
    ROOT / "docs" / "testing.md",
)
_FENCE = re.compile(r"^(\s*)```(\w*)\s*$")
_MARKER = re.compile(r"^\s*<!-- example: (.*?) -->\s*$")


@dataclass(frozen=True, slots=True)
class Block:
    """One fenced block: where it is, its language, its text and the marker before it."""

    path: Path
    line: int
    lang: str
    text: str
    marker: str | None

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def is_commands(self) -> bool:
        if self.lang in ("sh", "bash"):
            return True
        first = self.text.lstrip().split("\n", 1)[0]
        return self.lang == "" and first.startswith(("workerset-admission ", "$ "))

    def expected_status(self) -> int:
        found = re.search(r", exit (\d+)$", self.marker or "")
        return int(found.group(1)) if found else 0


def blocks(path: Path) -> list[Block]:
    """Every fenced block of one Markdown file, indentation removed."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, lang = opening.group(1), opening.group(2)
        end = i + 1
        while not re.match(r"^\s*```\s*$", lines[end]):
            end += 1
        body = [
            line[len(indent) :] if line.startswith(indent) else line for line in lines[i + 1 : end]
        ]
        before = _MARKER.match(lines[i - 1]) if i > 0 else None
        found.append(
            Block(path, i + 1, lang, "\n".join(body) + "\n", before.group(1) if before else None)
        )
        i = end + 1
    return found


def command_blocks() -> list[Block]:
    """Every block of commands in the README and docs/."""
    return [b for path in DOCS for b in blocks(path) if b.is_commands]


def marked(prefix: str) -> list[Block]:
    """Every block (of commands or output) whose marker starts with ``prefix``."""
    return [b for path in DOCS for b in blocks(path) if (b.marker or "").startswith(prefix)]
