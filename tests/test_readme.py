"""The README as a first-hour document: its length, its order, and what it moved to docs/.

The README is read in the order an operator needs it; contributor material lives in docs/. These
checks hold it to that shape, keep the test command CI runs findable in it, and make sure that
what it says of the code and the files it names stays true.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support.docs import ROOT, blocks

README = ROOT / "README.md"
DOCS = ROOT / "docs"

# About 400 lines; a little room for a sentence patched in, none for a section moved back.
MAX_LINES = 420

SECTIONS = [
    "What it is, and why",
    "Two commands",
    "What a decision looks like",
    "Running inside the Dynamo frontend",
    "Deploying it",
    "Drains and the rollout gate",
    "Configuration",
    "Operating it",
    "Architecture",
    "Further reading",
]

# The command .ci/run calls "the README's test command" (it adds the lint extra and checks).
TEST_COMMAND = (
    'python3 -m venv .venv && .venv/bin/pip install -e ".[test,conformance,dynamo,etcd]" '
    "&& .venv/bin/pip install --no-deps ai-dynamo==1.6.1 && .venv/bin/python -m pytest"
)


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _sections(text: str) -> dict[str, str]:
    """Each top-level section's title and body, outside fenced blocks."""
    found: dict[str, list[str]] = {}
    current: list[str] | None = None
    fenced = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if not fenced and line.startswith("## "):
            current = found.setdefault(line[3:].strip(), [])
            continue
        if current is not None:
            current.append(line)
    return {title: "\n".join(body) for title, body in found.items()}


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = _text(path)
    return {_slug(h) for h in re.findall(r"^#+ (.+)$", text, flags=re.MULTILINE)}


def test_the_readme_is_at_most_about_400_lines() -> None:
    lines = _text(README).splitlines()
    assert len(lines) <= MAX_LINES, len(lines)


def test_the_readme_sections_come_in_the_order_an_operator_needs() -> None:
    assert list(_sections(_text(README))) == SECTIONS


def test_the_readme_keeps_the_test_command_ci_runs_in_two_commands() -> None:
    section = _sections(_text(README))["Two commands"]
    (block,) = [b for b in blocks(README) if b.text.strip() == TEST_COMMAND]
    assert block.marker == "not run here: it is the test suite itself"
    assert TEST_COMMAND in section
    ci = _text(ROOT / ".ci" / "run")
    assert "the README's test command" in ci
    # CI installs what the command installs, plus the lint extra, and runs the same pytest.
    install = re.search(r'python -m pip install --quiet -e "\.\[([a-z,]+)\]"', ci)
    assert install is not None
    assert set(install.group(1).split(",")) == {"test", "conformance", "dynamo", "etcd", "lint"}
    assert "--no-deps ai-dynamo==1.6.1" in ci


def test_every_link_of_the_readme_names_a_file_and_a_heading_that_exist() -> None:
    links = re.findall(r"\]\(([^)]+)\)", _text(README))
    local = [link for link in links if not link.startswith("http")]
    assert local
    for link in local:
        path, _, anchor = link.partition("#")
        target = ROOT / path
        assert target.exists(), link
        if anchor:
            assert anchor in _anchors(target), link


def test_the_contributor_material_lives_in_docs_and_the_readme_links_it() -> None:
    readme = _text(README)
    moved = {
        "testing.md": ".venv/bin/python -m pytest -m rollout integration",
        "conformance.md": ".venv/bin/python -m pytest tests/conformance -v",
        "architecture.md": "| to change | open |",
        "benchmarks.md": "### A worker change against fleet size, in short",
    }
    for page, text in moved.items():
        assert text in _text(DOCS / page), page
        assert text not in readme, page
        assert f"(docs/{page})" in readme, page
    for page in ("testing.md", "architecture.md", "conformance.md"):
        assert _text(DOCS / page).startswith("# "), page


@pytest.mark.parametrize(
    "page",
    [README, *(DOCS / p for p in ("architecture.md", "testing.md", "conformance.md", "drains.md",
                                  "bridges.md", "commands.md"))],
    ids=lambda p: p.name,
)  # fmt: skip
def test_every_file_the_readme_and_the_moved_pages_name_exists(page: Path) -> None:
    rooms = "plugin|adapters|telemetry|tests|integration|deploy|docs|examples"
    named = set(re.findall(rf"`((?:{rooms})/[\w./-]+)`", _text(page)))
    assert named
    assert sorted(p for p in named if not (ROOT / p).exists()) == []
    if page.name == "architecture.md":
        assert len(named) > 20  # the code map names the files it sends a reader to


def test_what_the_deploying_page_quotes_of_the_code_and_the_images_is_there() -> None:
    readme = " ".join(_text(README).split())
    deploying = " ".join(_text(DOCS / "deploying.md").split())
    serve = _text(ROOT / "plugin" / "cli" / "serve.py")
    frontend_image = _text(ROOT / "deploy" / "container" / "Containerfile.frontend")
    view = _text(ROOT / "adapters" / "dynamo" / "view_directory.py")
    # The README sends the reader to the two sections that say it.
    for section in ("Baked-in settings and a manifest", "a containerised serve's embedded NATS"):
        assert section in readme, section
        assert section in deploying, section
    # The embedded server's announcement line and the second writer's refusal.
    assert "embedded nats-server listening on ..." in deploying
    assert "embedded nats-server listening on {server.url}" in serve
    assert "is owned by another live writer" in deploying
    assert "is owned by another live writer" in view
    # The settings the page says the frontend image bakes in.
    for setting in (
        "DYN_FILE_KV=/view",
        "WORKERSET_ADMISSION_VIEW_DIR=/view",
        "DYN_FRONTEND_ROUTE_EXTENSIONS=workerset-admission",
    ):
        assert f"`{setting}`" in deploying, setting
        assert setting in frontend_image, setting
