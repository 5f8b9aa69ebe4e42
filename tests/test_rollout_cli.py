"""The ``rollout`` subcommand: its exit status is the gate, its output explains it."""

from __future__ import annotations

import argparse
import io
import json
from collections.abc import Sequence

import pytest
from workerset_admission.cli import build_parser
from workerset_admission.cli.exits import EXIT_NO, EXIT_OK, EXIT_UNREACHABLE
from workerset_admission.cli.rollout import (
    BucketRead,
    GateQuery,
    RawEntry,
    run_async,
    wait_for_gate,
)
from workerset_admission.errors import UsageError

MODEL = "llama"
NEW = "prod-v2"
OLD = "prod-v1"


def record(frontend: str, namespace: str, checksum: str = "c" * 64) -> RawEntry:
    members = [f"{namespace}/backend/generate/1"]
    value = {
        "protocol": "v1",
        "frontend": frontend,
        "namespace": namespace,
        "members": members,
        "groups": [
            {
                "model": MODEL,
                "worker_set": f'["{namespace}","backend","generate","chat","aggregated"]',
                "checksum": checksum,
                "generation": 3,
                "members": members,
            }
        ],
    }
    return RawEntry(f"v1.{frontend}.members.{namespace}", json.dumps(value).encode())


class ScriptedSource:
    """Answers each read with the next scripted result, repeating the last one."""

    def __init__(self, reads: Sequence[BucketRead]) -> None:
        self._reads = list(reads)
        self.calls = 0
        self.filters: list[tuple[str, ...] | None] = []

    async def read(self, filters: Sequence[str] | None = None) -> BucketRead:
        self.calls += 1
        self.filters.append(None if filters is None else tuple(filters))
        return self._reads[min(self.calls, len(self._reads)) - 1]


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["rollout", "--model", MODEL, "--namespace", NEW, *argv])


async def invoke(source: ScriptedSource, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = await run_async(parse(*argv), source, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


OPEN = BucketRead(entries=(record("fe-a", NEW), record("fe-b", NEW)))
CLOSED = BucketRead(entries=(record("fe-a", NEW), record("fe-b", OLD)))


async def test_an_open_gate_exits_zero_and_prints_the_table() -> None:
    code, out, _err = await invoke(ScriptedSource([OPEN]))
    assert code == EXIT_OK
    assert "gate: OPEN" in out
    assert "fe-a" in out
    assert "fe-b" in out


async def test_a_closed_gate_exits_one_and_says_who_is_missing() -> None:
    code, out, _err = await invoke(ScriptedSource([CLOSED]))
    assert code == EXIT_NO
    assert "gate: CLOSED" in out
    assert "fe-b" in out


async def test_json_output_carries_the_answer_for_machines() -> None:
    code, out, _err = await invoke(ScriptedSource([CLOSED]), "--json")
    answer = json.loads(out)
    assert code == EXIT_NO
    assert answer["open"] is False
    assert answer["missing"] == ["fe-b"]
    assert answer["serving"] == ["fe-a"]
    assert answer["previous"] == ["fe-b"]


async def test_an_unreadable_bucket_exits_two_with_the_reason() -> None:
    source = ScriptedSource([BucketRead(problem="cannot connect to nats://127.0.0.1:1")])
    code, out, err = await invoke(source, "--json")
    assert code == EXIT_UNREACHABLE
    assert json.loads(out) == {"open": False, "error": "cannot connect to nats://127.0.0.1:1"}
    assert "cannot connect" in err


async def test_a_garbage_record_is_reported_and_the_rest_still_decides() -> None:
    entries = (*OPEN.entries, RawEntry("junk", b"\x00not json"))
    code, out, _err = await invoke(ScriptedSource([BucketRead(entries=entries)]), "--json")
    assert code == EXIT_OK
    assert json.loads(out)["invalid"] == [{"key": "junk", "reason": "not_json"}]


async def test_an_empty_bucket_keeps_the_gate_closed() -> None:
    code, _out, _err = await invoke(ScriptedSource([BucketRead()]))
    assert code == EXIT_NO


async def test_waiting_stops_as_soon_as_the_gate_opens_and_reports_progress() -> None:
    time = FakeTime()
    source = ScriptedSource([CLOSED, CLOSED, OPEN])
    lines: list[str] = []
    check = await wait_for_gate(
        source,
        GateQuery(model=MODEL, namespace=NEW),
        timeout=60,
        interval=2,
        progress=lines.append,
        clock=time.clock,
        sleep=time.sleep,
    )
    assert check.open
    assert source.calls == 3
    assert time.sleeps == [2, 2]
    # The first look reads the bucket; the next ones only what the question names.
    first, *later = source.filters
    assert first is None
    assert later
    assert all(f is not None and f[:2] == ("v1.*.heartbeat", "v1.*.capability") for f in later)
    assert all(f is not None and f"v1.*.members.{NEW}" in f for f in later)
    # The unchanged second look is not repeated; the change to open is.
    assert len(lines) == 2
    assert "waiting for fe-b" in lines[0]
    assert "gate open" in lines[1]


async def test_waiting_gives_up_at_the_timeout_with_the_gate_closed() -> None:
    time = FakeTime()
    source = ScriptedSource([CLOSED])
    check = await wait_for_gate(
        source,
        GateQuery(model=MODEL, namespace=NEW),
        timeout=5,
        interval=2,
        progress=lambda _line: None,
        clock=time.clock,
        sleep=time.sleep,
    )
    assert not check.open
    assert time.sleeps == [2, 2, 1]
    assert source.calls == 4


async def test_wait_with_a_closed_gate_exits_one_and_says_it_timed_out() -> None:
    code, out, err = await invoke(ScriptedSource([CLOSED]), "--wait", "--timeout", "0")
    assert code == EXIT_NO
    assert "still closed" in err
    assert "gate: CLOSED" in out


async def test_wait_with_an_open_gate_exits_zero_at_once() -> None:
    source = ScriptedSource([OPEN])
    code, _out, err = await invoke(source, "--wait", "--timeout", "30")
    assert code == EXIT_OK
    assert source.calls == 1
    assert "gate open" in err


async def test_an_expected_checksum_is_passed_to_the_gate() -> None:
    code, _out, _err = await invoke(ScriptedSource([OPEN]), "--checksum", "d" * 64)
    assert code == EXIT_NO


async def test_a_checksum_prefix_opens_the_gate_when_it_is_unambiguous() -> None:
    full = "2e8fb64888e5" + "0" * 52
    served = BucketRead(entries=(record("fe-a", NEW, full), record("fe-b", NEW, full)))
    code, out, _err = await invoke(ScriptedSource([served]), "--checksum", full[:12], "--json")
    assert code == EXIT_OK
    assert json.loads(out)["expected_checksum"] == full


async def test_an_ambiguous_or_malformed_checksum_is_refused_with_the_full_forms() -> None:
    one, two = "2e8fb648" + "1" * 56, "2e8fb648" + "2" * 56
    both = BucketRead(entries=(record("fe-a", NEW, one), record("fe-b", NEW, two)))
    with pytest.raises(UsageError, match=f"it begins {one} and {two}"):
        await invoke(ScriptedSource([both]), "--checksum", "2e8fb648")
    with pytest.raises(UsageError, match="lowercase hex"):
        await invoke(ScriptedSource([both]), "--checksum", "2E8F-XYZ")


async def test_wait_says_what_it_waits_for_before_the_first_look() -> None:
    _code, _out, err = await invoke(ScriptedSource([OPEN]), "--wait", "--timeout", "30")
    assert err.splitlines()[0] == (
        f"waiting up to 30 s for every live frontend to serve {MODEL} from namespace {NEW} "
        "(a look every 2 s)"
    )


async def test_wait_with_nats_unreachable_from_the_first_look_says_so_at_once() -> None:
    unreachable = BucketRead(problem="cannot connect to nats://127.0.0.1:1: NoServersError()")
    source = ScriptedSource([unreachable, OPEN])
    code, _out, err = await invoke(source, "--wait", "--timeout", "600")
    assert code == EXIT_UNREACHABLE
    # One look, not ten minutes of them.
    assert source.calls == 1
    assert err.splitlines()[-1] == (
        "workerset-admission rollout: cannot connect to nats://127.0.0.1:1: NoServersError()"
    )
