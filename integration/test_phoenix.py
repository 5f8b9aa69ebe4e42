"""The plugin's spans in a real tracing backend: a rolling update read back from Arize Phoenix.

``phoenix_scenario.py`` runs inside a private network namespace with only loopback (Phoenix's
gRPC listener binds every interface whatever it is told); it plays a rolling update with a
conflicting cohort against ``workerset-admission serve --telemetry`` and a real nats-server,
stops serve with SIGTERM and writes every span Phoenix then holds to a JSON file. These tests
read that file: what a backend user would see, checked against what the scenario published.

Skipped unless ``--run-phoenix`` or ``WORKERSET_ADMISSION_RUN_PHOENIX=1`` is given (see
``conftest.py``); Phoenix is installed in a virtual environment of its own (``PHOENIX_VENV``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]
import pytest
from phoenix_scenario import CONFLICTING, INCUMBENT, SUCCESSOR_IDS, WORKER_IDS
from phoenixfixture import (
    PhoenixVenvError,
    ensure_phoenix_venv,
    network_namespace_problem,
    run_in_own_session,
)
from workerset_admission.card import mdcsum
from workerset_admission.telemetry import names as n

INSTALL_TIMEOUT = 300.0
SCENARIO_TIMEOUT = 170.0
SCENARIO = Path(__file__).with_name("phoenix_scenario.py")

pytestmark = [
    pytest.mark.phoenix,
    pytest.mark.integration,
    # The first test also pays for installing Phoenix when no environment is ready.
    pytest.mark.timeout(INSTALL_TIMEOUT + SCENARIO_TIMEOUT + 30),
]

OLD = mdcsum(INCUMBENT)
NEW = mdcsum(CONFLICTING)

Span = dict[str, Any]


@pytest.fixture(scope="module")
def phoenix_executable() -> Iterator[Path]:
    problem = network_namespace_problem()
    if problem is not None:
        pytest.skip(problem)
    with tempfile.TemporaryDirectory(prefix="phoenix-venv-") as scratch:
        try:
            yield ensure_phoenix_venv(Path(scratch), timeout=INSTALL_TIMEOUT)
        except PhoenixVenvError as exc:
            pytest.fail(str(exc))


@pytest.fixture(scope="module")
def run(phoenix_executable: Path) -> Iterator[dict[str, Any]]:
    """Run the scenario once for the module; the result carries what was left behind."""
    with tempfile.TemporaryDirectory(prefix="phoenix-run-") as scratch_dir:
        scratch = Path(scratch_dir)
        home, tmp = scratch / "home", scratch / "tmp"
        home.mkdir()
        tmp.mkdir()
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("OTEL_", "WORKERSET_ADMISSION_", "PHOENIX_"))
        }
        env.update(HOME=str(home), TMPDIR=str(tmp), PYTHONUNBUFFERED="1")
        # The scenario imports the shared test support, which pytest finds through its
        # ``pythonpath`` setting: give the subprocess the same roots.
        roots = [str(SCENARIO.parents[1] / "tests"), str(SCENARIO.parent)]
        env["PYTHONPATH"] = os.pathsep.join([*roots, *filter(None, [env.get("PYTHONPATH")])])
        out = scratch / "result.json"
        unshare = shutil.which("unshare")
        assert unshare is not None
        command = [
            unshare,
            "--net",
            "--",
            sys.executable,
            str(SCENARIO),
            "--out",
            str(out),
            "--phoenix",
            str(phoenix_executable),
            "--project",
            f"workerset-admission-{uuid.uuid4().hex[:10]}",
        ]
        started = time.monotonic()
        returncode, output = run_in_own_session(command, env, SCENARIO_TIMEOUT)
        if returncode is None:
            pytest.fail(f"the scenario ran over {SCENARIO_TIMEOUT:.0f} s: {output[-4000:]}")
        elapsed = time.monotonic() - started
        assert out.is_file(), f"no result (exit {returncode}): {output[-4000:]}"
        result: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
        if result["error"] is not None or returncode != 0:
            pytest.fail(
                f"scenario failed (exit {returncode}): {result['error']}\n"
                + "\n".join(result.get("serve_output", []))
                + f"\n{result.get('phoenix_log_tail', '')}\n{output[-4000:]}"
            )
        result["left_in_home"] = sorted(str(p.relative_to(home)) for p in home.rglob("*"))
        result["left_in_tmp"] = sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*"))
        print(
            f"\n[phoenix] scenario {elapsed:.1f} s, timings {result['timings']}, "
            f"{len(result['spans'])} spans",
            file=sys.__stderr__,
        )
        yield result


def named(run: dict[str, Any], name: str) -> list[Span]:
    return [span for span in run["spans"] if span["name"] == name]


def by_id(run: dict[str, Any]) -> dict[str, Span]:
    return {span["context"]["span_id"]: span for span in run["spans"]}


def applied(run: dict[str, Any], key: str, operation: str) -> Span:
    (span,) = [
        span
        for span in named(run, n.SPAN_APPLY_UPDATE)
        if span["attributes"][n.ATTR_DISCOVERY_KEY] == key
        and span["attributes"][n.ATTR_DISCOVERY_OPERATION] == operation
    ]
    return span


def model_writes(run: dict[str, Any], operation: str, ids: tuple[int, ...]) -> list[str]:
    keys = [
        w["key"]
        for w in run["published"]["writes"]
        if w["kind"] == "model" and w["operation"] == operation
    ]
    return [key for key in keys if int(key.rsplit(".", 1)[-1], 16) in ids]


def group_id(run: dict[str, Any]) -> str:
    (group,) = run["status"]["succession"]["groups"]
    return str(group["group_id"])


def test_the_status_the_scenario_waited_for_shows_the_succession_between_the_two_cards(
    run: dict[str, Any],
) -> None:
    (before,) = run["status"]["incumbent"]["groups"]
    (after,) = run["status"]["succession"]["groups"]
    assert before["incumbent"] == OLD
    assert after["incumbent"] == NEW
    assert after["generation"] > before["generation"]
    assert after["admitted"] == list(SUCCESSOR_IDS)


def test_every_discovery_write_is_one_apply_span_with_its_key_revision_and_operation(
    run: dict[str, Any],
) -> None:
    seen = sorted(
        (
            s["attributes"][n.ATTR_DISCOVERY_KEY],
            s["attributes"][n.ATTR_DISCOVERY_OPERATION],
            s["attributes"][n.ATTR_DISCOVERY_REVISION],
        )
        for s in named(run, n.SPAN_APPLY_UPDATE)
    )
    written = sorted((w["key"], w["operation"], w["revision"]) for w in run["published"]["writes"])
    assert seen == written
    for span in named(run, n.SPAN_APPLY_UPDATE):
        attributes = span["attributes"]
        assert isinstance(attributes[n.ATTR_DISCOVERY_REVISION], int)
        assert attributes[n.ATTR_MESSAGING_SYSTEM] == "nats"
        assert attributes[n.ATTR_MESSAGING_DESTINATION] == "dynamo-discovery"
        # Each update starts a trace of its own (no worker sent trace context).
        assert span["parent_id"] is None


def test_model_card_apply_spans_name_the_group_and_the_decision_made(run: dict[str, Any]) -> None:
    expected = (
        [(key, "put", "admitted") for key in model_writes(run, "put", WORKER_IDS)]
        + [(key, "put", "rejected") for key in model_writes(run, "put", SUCCESSOR_IDS)]
        + [(key, "delete", "removed") for key in model_writes(run, "delete", WORKER_IDS)]
    )
    assert len(expected) == 2 * len(WORKER_IDS) + len(SUCCESSOR_IDS)
    for key, operation, decision in expected:
        attributes = applied(run, key, operation)["attributes"]
        assert attributes[n.ATTR_DECISION] == decision, key
        assert attributes[n.ATTR_GROUP] == group_id(run), key


def test_the_initial_listing_is_one_span_with_no_entries(run: dict[str, Any]) -> None:
    (snapshot,) = named(run, n.SPAN_APPLY_SNAPSHOT)
    assert snapshot["attributes"][n.ATTR_SNAPSHOT_ENTRIES] == 0
    assert snapshot["attributes"][n.ATTR_SNAPSHOT_REASON] == "initial"


def test_the_incumbents_build_and_commit_sit_in_the_trace_of_its_first_admission(
    run: dict[str, Any],
) -> None:
    first_key = model_writes(run, "put", WORKER_IDS)[0]
    first = applied(run, first_key, "put")
    builds = [s for s in named(run, n.SPAN_BUILD) if s["attributes"][n.ATTR_CHECKSUM] == OLD]
    commits = [s for s in named(run, n.SPAN_COMMIT) if s["attributes"][n.ATTR_CHECKSUM] == OLD]
    (build,) = builds
    (commit,) = commits
    (before,) = run["status"]["incumbent"]["groups"]
    for span in (build, commit):
        assert span["attributes"][n.ATTR_GROUP] == group_id(run)
        assert span["attributes"][n.ATTR_GENERATION] == before["generation"]
        assert span["parent_id"] == first["context"]["span_id"]
        assert span["context"]["trace_id"] == first["context"]["trace_id"]
    assert build["attributes"][n.ATTR_BUILD_OUTCOME] == "ok"
    assert build["attributes"][n.ATTR_BUILD_ATTEMPT] == 1
    assert build["start_time"] <= commit["start_time"]


def test_the_succession_span_carries_both_checksums_and_generations(run: dict[str, Any]) -> None:
    (before,) = run["status"]["incumbent"]["groups"]
    (after,) = run["status"]["succession"]["groups"]
    (succession,) = named(run, n.SPAN_SUCCEED)
    assert succession["attributes"] == {
        n.ATTR_GROUP: group_id(run),
        n.ATTR_OLD_CHECKSUM: OLD,
        n.ATTR_NEW_CHECKSUM: NEW,
        n.ATTR_OLD_GENERATION: before["generation"],
        n.ATTR_NEW_GENERATION: after["generation"],
        # The workers left: no drain, so no handover.
        n.ATTR_DRAINED: False,
    }
    # The incumbent empties when its last card is deleted: that update caused the succession.
    last_key = model_writes(run, "delete", WORKER_IDS)[-1]
    assert succession["parent_id"] == applied(run, last_key, "delete")["context"]["span_id"]
    (withdrawn,) = named(run, n.SPAN_WITHDRAW)
    assert withdrawn["attributes"][n.ATTR_CHECKSUM] == OLD
    (successor_commit,) = [
        s for s in named(run, n.SPAN_COMMIT) if s["attributes"][n.ATTR_CHECKSUM] == NEW
    ]
    assert successor_commit["attributes"][n.ATTR_GENERATION] == after["generation"]


def test_the_rejected_cohort_is_one_event_with_both_checksums_on_its_first_cards_update(
    run: dict[str, Any],
) -> None:
    events = [
        (span, event)
        for span in run["spans"]
        for event in span["events"]
        if event["name"] == n.EVENT_COHORT_REJECTED
    ]
    # The second card of the same rejected cohort is not reported again.
    ((span, event),) = events
    first_key = model_writes(run, "put", SUCCESSOR_IDS)[0]
    assert span["context"]["span_id"] == applied(run, first_key, "put")["context"]["span_id"]
    (group,) = run["status"]["conflict"]["groups"]
    assert event["attributes"] == {
        n.ATTR_INCUMBENT_CHECKSUM: OLD,
        n.ATTR_REJECTED_CHECKSUM: NEW,
        n.ATTR_MODEL: group["model"],
        n.ATTR_WORKER_SET: group["worker_set_id"],
        n.ATTR_INSTANCE: f"dgd/backend/generate/{SUCCESSOR_IDS[0]:x}",
        n.ATTR_DIFFERENCES: ["kv_cache_block_size 16 -> 32"],
    }


def test_no_span_reports_an_error(run: dict[str, Any]) -> None:
    assert run["spans"]
    assert {span["status_code"] for span in run["spans"]} <= {"UNSET", "OK"}


def test_serve_held_its_spans_until_sigterm_flushed_them_and_exited_cleanly(
    run: dict[str, Any],
) -> None:
    assert run["spans_before_sigterm"] == 0
    assert run["serve_exit"] == 0
    assert len(run["spans"]) == len({span["context"]["span_id"] for span in run["spans"]})


def test_the_scenario_ran_with_loopback_only_and_left_no_process_or_file_behind(
    run: dict[str, Any],
) -> None:
    assert run["interfaces"] == ["lo"]
    ours = {listener["owner"] for listener in run["listeners"]}
    assert {"nats-server", "phoenix"} <= ours
    assert {child["name"] for child in run["children"]} == {"nats-server", "phoenix", "serve"}
    for child in run["children"]:
        try:
            alive = psutil.Process(child["pid"]).create_time() == child["create_time"]
        except psutil.NoSuchProcess:
            alive = False
        assert not alive, child
    # Phoenix was asked to stop, not killed.
    assert run["phoenix_exit"] in (0, -signal.SIGTERM)
    assert run["left_in_home"] == []
    assert run["left_in_tmp"] == []
