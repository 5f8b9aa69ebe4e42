"""deploy/prometheus/ checked by Prometheus' own promtool, and the plugin's page by its linter.

``promtool check rules`` parses every rule file as Prometheus will load it, ``promtool test
rules`` runs the unit tests beside them (``*_test.yml``), and ``promtool check metrics`` lints
the plugin's page as the OpenTelemetry Prometheus exporter renders it for a rolling update.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from promfixture import tool
from test_prometheus_names import plugin_page

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

RULES = Path(__file__).resolve().parents[1] / "deploy" / "prometheus"
RULE_FILES = sorted(p for p in RULES.glob("*.yml") if not p.name.endswith("_test.yml"))
TEST_FILES = sorted(RULES.glob("*_test.yml"))


def promtool(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tool("promtool"), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        cwd=RULES,
    )


def test_every_rule_file_has_a_unit_test_beside_it() -> None:
    assert [p.name for p in RULE_FILES] == ["alerts.yml", "upstream_names.yml"]
    assert [p.name for p in TEST_FILES] == [f"{p.stem}_test.yml" for p in RULE_FILES]


@pytest.mark.parametrize("rules", RULE_FILES, ids=lambda p: p.name)
def test_promtool_check_rules_accepts_the_rule_file(rules: Path) -> None:
    done = promtool("check", "rules", rules.name)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


@pytest.mark.parametrize("tests", TEST_FILES, ids=lambda p: p.name)
def test_promtool_test_rules_passes_the_unit_tests(tests: Path) -> None:
    done = promtool("test", "rules", tests.name)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout
    assert "FAILED" not in done.stdout


def test_promtool_check_metrics_finds_nothing_to_say_about_the_plugins_page() -> None:
    done = promtool("check", "metrics", stdin=plugin_page())
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == "", done.stdout
