"""``drain`` and ``undrain`` against a store in memory: refusals write nothing, writes are whole."""

from __future__ import annotations

import argparse
import asyncio
import io
import json
from collections.abc import Sequence

import pytest
from support.drains import card, endpoint, served_entry, worker
from workerset_admission import cli
from workerset_admission.card.drain_record import BudgetRead
from workerset_admission.card.serving_record import BucketRead, RawEntry
from workerset_admission.cli.drain import run_drain, run_undrain
from workerset_admission.errors import CredentialsRefused, LastWorkerRefused, UsageError
from workerset_admission.keys import drain_kv_key, key_matches


class MemoryStore:
    """The discovery listing and serving records in memory; ``refuse`` names refused namespaces."""

    def __init__(
        self,
        listing: Sequence[tuple[str, bytes]],
        records: Sequence[RawEntry] = (),
        refuse: Sequence[str] = (),
    ) -> None:
        self.listing = list(listing)
        self.records = list(records)
        self.refuse = set(refuse)
        self.kv: dict[str, bytes] = {}
        self.writes: list[str] = []
        # What the frontends serve after the first read (the drain's own check), if it changes.
        self.later: list[RawEntry] | None = None
        self.reads = 0
        self.budgets: dict[str, tuple[int, bytes, float]] = {}
        # The server's clock: the only one a budget is judged on.
        self.now = 1000.0
        self.ttls: list[float | None] = []
        self.filtered: list[tuple[str, ...]] = []
        self.revision = 0

    async def open(self, deadline: float) -> None:
        del deadline

    async def close(self) -> None:
        pass

    async def workers_listing(self) -> list[tuple[str, bytes]]:
        return list(self.listing)

    async def drains(self) -> list[tuple[str, bytes]]:
        return sorted((k, v) for k, v in self.kv.items() if k.startswith("v1.drain."))

    async def serving(self, filters: Sequence[str] | None = None) -> BucketRead:
        self.reads += 1
        entries = self.later if self.later is not None and self.reads > 1 else self.records
        if filters is not None:
            self.filtered.append(tuple(filters))
            entries = [e for e in entries if key_matches(e.key, filters)]
        return BucketRead(entries=tuple(entries))

    async def put(self, key: str, value: bytes, ttl: float | None) -> None:
        del ttl
        if key.split(".")[2] in self.refuse:
            raise CredentialsRefused(f"NATS refused to store the drain record {key}")
        self.writes.append(key)
        self.kv[key] = value

    async def delete(self, key: str) -> bool:
        self.writes.append(f"-{key}")
        return self.kv.pop(key, None) is not None

    async def may_write(self, key: str) -> None:
        if key.startswith("v1.drain.") and key.split(".")[2] in self.refuse:
            raise CredentialsRefused(f"NATS refused this user the write of {key}")

    async def budget(self, key: str) -> BudgetRead:
        revision, value, stored_at = self.budgets.get(key, (None, None, None))
        return BudgetRead(revision, value, stored_at)

    async def swap_budget(
        self, key: str, value: bytes, revision: int | None, ttl: float | None
    ) -> bool:
        if self.budgets.get(key, (None, None, None))[0] != revision:
            return False
        self.revision += 1
        self.budgets[key] = (self.revision, value, self.now)
        self.ttls.append(ttl)
        return True

    async def server_time(self) -> float | None:
        return self.now


def parse(*argv: str) -> argparse.Namespace:
    return cli.build_parser().parse_args(list(argv))


def drain(store: MemoryStore, *argv: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    args = parse("drain", *argv)
    status = asyncio.run(run_drain(args, store, out, err, environ=env or {}))
    return status, out.getvalue() + err.getvalue()


def test_the_last_worker_is_refused_and_nothing_is_written_unless_allow_empty() -> None:
    store = MemoryStore(worker("dgd", 0xA1, "h1"), [served_entry("fe-1", "dgd", 0xA1)])
    with pytest.raises(LastWorkerRefused) as refused:
        drain(store, "0xa1")
    assert "model tiny would be left with no routable worker on frontend fe-1" in str(refused.value)
    assert "\n" not in str(refused.value)
    assert store.writes == []
    assert cli.exit_status(refused.value) == cli.EXIT_LAST_WORKER
    status, said = drain(store, "0xa1", "--allow-empty", "--by", "ops")
    assert status == cli.EXIT_OK
    assert "--allow-empty: model tiny" in said
    assert store.writes == [drain_kv_key("dgd", 0xA1)]


def test_a_namespace_drains_at_once_when_another_namespace_serves_the_model() -> None:
    listing = [*worker("old", 1, "h1"), *worker("old", 2, "h2"), *worker("new", 3, "h3")]
    records = [served_entry("fe-1", "old", 1, 2), served_entry("fe-1", "new", 3)]
    store = MemoryStore(listing, records)
    status, _ = drain(store, "--namespace", "old", "--all", "--json")
    assert status == cli.EXIT_OK
    assert store.writes == [drain_kv_key("old", 1), drain_kv_key("old", 2)]
    undone = io.StringIO()
    args = parse("undrain", "--namespace", "old", "--all", "--json")
    assert asyncio.run(run_undrain(args, store, undone, environ={})) == cli.EXIT_OK
    assert len(json.loads(undone.getvalue())["undrained"]) == 2
    assert store.kv == {}


def test_a_host_drain_is_prepared_then_committed_and_a_refusal_writes_nothing() -> None:
    listing = [
        *worker("ns-a", 1, "10.0.0.5"),
        *worker("ns-b", 2, "10.0.0.5"),
        *worker("ns-c", 3, "h"),
    ]
    both = [served_entry("fe-1", "ns-a", 1), served_entry("fe-1", "ns-b", 2, 4)]
    listing += [card("ns-b", 4), endpoint("ns-b", 4, {"tcp": "h:1/x"})]
    store = MemoryStore(listing, both, refuse=["ns-b"])
    with pytest.raises(CredentialsRefused) as refused:
        drain(store, "--host-from-env", "POD_IP", "--allow-empty", env={"POD_IP": "10.0.0.5"})
    assert "v1.drain.ns-b.2" in str(refused.value)
    # Refused before the first write: no drain record, no budget, nothing to withdraw.
    assert store.writes == []
    assert store.kv == {}
    assert store.budgets == {}
    # A drain already in force before the command is someone's earlier word: it stays.
    earlier = drain_kv_key("ns-a", 1)
    store.kv[earlier] = b"{}"
    with pytest.raises(CredentialsRefused) as refused:
        drain(store, "--host", "10.0.0.5", "--allow-empty")
    assert list(store.kv) == [earlier]
    assert store.writes == []
    # Limited to the namespaces named, the same host drains what this user may write.
    store.writes.clear()
    status, _ = drain(store, "--host", "10.0.0.5", "--namespace", "ns-a", "--allow-empty")
    assert status == cli.EXIT_OK
    assert store.writes == [drain_kv_key("ns-a", 1)]


def test_a_nats_plane_worker_is_named_by_host_through_the_servers_monitoring() -> None:
    listing = [card("ns", 7), endpoint("ns", 7, {"nats_tcp": "ns_backend.generate-7"})]
    store = MemoryStore(listing)
    with pytest.raises(UsageError, match="give --nats-monitor"):
        drain(store, "--host", "10.1.1.1", "--allow-empty")

    async def hosts(monitor: str, subjects: Sequence[str]) -> dict[str, str]:
        assert monitor == "http://nats:8222"
        return dict.fromkeys(subjects, "10.1.1.1")

    args = parse(
        "drain", "--host", "10.1.1.1", "--nats-monitor", "http://nats:8222", "--allow-empty"
    )
    status = asyncio.run(
        run_drain(args, store, io.StringIO(), io.StringIO(), environ={}, subject_hosts=hosts)
    )
    assert status == cli.EXIT_OK
    assert store.writes == [drain_kv_key("ns", 7)]


@pytest.mark.parametrize(
    "argv",
    [
        ["drain", "1", "--by", "x" * 300],
        ["drain", "1", "--by", "two\nlines"],
        ["drain", "1", "--ttl", "-5"],
        ["drain", "1", "--ttl", "inf"],
        ["drain", "1", "--grace", "-1"],
        ["drain", "1", "--timeout", "-1"],
        ["drain", "1", "--interval", "0"],
        ["rollout", "--model", "m", "--namespace", "n", "--timeout", "-1"],
        ["rollout", "--model", "m", "--namespace", "n", "--timeout", "1e12"],
    ],
)
def test_bad_durations_and_long_text_are_refused_on_one_line(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as ended:
        cli.main(argv)
    assert ended.value.code == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(f"workerset-admission {argv[0]}: ")


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["0x1a", "--host", "X"], "an instance id and --host conflict"),
        (["--host", "X", "--host-from-env", "POD_IP"], "--host and --host-from-env conflict"),
        (["--host-from-env", "POD_IP"], "POD_IP is not set"),
    ],
)
def test_conflicting_or_missing_selectors_are_refused_before_anything_is_read(
    argv: list[str], words: str
) -> None:
    store = MemoryStore(worker("dgd", 0x1A, "X"))
    with pytest.raises(UsageError, match=words):
        drain(store, *argv)
    assert store.writes == []


def test_undrain_help_speaks_of_no_wait(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["undrain", "--help"])
    assert "--wait" not in capsys.readouterr().out


def test_wait_reports_a_model_a_frontend_stopped_serving_while_it_waited() -> None:
    listing = [*worker("dgd", 1, "h1"), *worker("dgd", 2, "h2"), *worker("other", 3, "h3")]
    store = MemoryStore(listing, [served_entry("fe-1", "dgd", 1, 2)])
    # While the drain of worker 1 waits, worker 2 leaves too (stopped by someone else).
    store.later = [served_entry("fe-1", "dgd")]
    status, said = drain(store, "1", "--wait", "--json", "--interval", "0.05")
    assert status == cli.EXIT_OK
    assert "model tiny lost its last routable worker on frontend fe-1 while waiting" in said
    answer = json.loads(said[: said.index("\n}") + 2])
    assert answer["lost_models"] == [{"frontend": "fe-1", "model": "tiny"}]


def test_wait_reads_only_the_records_it_asks_about() -> None:
    listing = [*worker("dgd", 1, "h1"), *worker("dgd", 2, "h2"), *worker("other", 3, "h3")]
    records = [
        served_entry("fe-1", "dgd", 1, 2),
        served_entry("fe-1", "other", 3, model="another"),
    ]
    store = MemoryStore(listing, records)
    store.later = [served_entry("fe-1", "dgd", 2), records[1]]
    status, _said = drain(store, "1", "--wait", "--interval", "0.05", "--timeout", "5")
    assert status == cli.EXIT_OK
    # The check read every record once; each look of the wait read dgd's records alone.
    assert store.filtered
    assert set(store.filtered) == {("v1.*.heartbeat", "v1.*.capability", "v1.*.members.dgd")}


def test_a_frontend_gone_unconfirmed_is_status_7_unless_allowed() -> None:
    listing = [*worker("dgd", 1, "h1"), *worker("dgd", 2, "h2")]
    store = MemoryStore(listing, [served_entry("fe-1", "dgd", 1, 2)])
    store.later = []  # fe-1's records expired before it ever let worker 1 go
    status, said = drain(store, "1", "--wait", "--interval", "0.05", "--timeout", "5")
    assert status == cli.EXIT_UNCONFIRMED
    assert "unconfirmed: fe-1 went away without confirming" in said
    assert drain_kv_key("dgd", 1) in store.kv  # the drain stays in place
    again = MemoryStore(listing, [served_entry("fe-1", "dgd", 1, 2)])
    again.later = []
    status, said = drain(
        again, "1", "--wait", "--allow-unconfirmed", "--interval", "0.05", "--timeout", "5"
    )
    assert status == cli.EXIT_OK
    assert "safe to stop" in said


def test_a_drain_undone_right_after_it_was_written_counts_for_nothing_any_more() -> None:
    listing = [*worker("dgd", 1, "h1"), *worker("dgd", 2, "h2")]
    store = MemoryStore(listing, [served_entry("fe-1", "dgd", 1, 2)])
    assert drain(store, "1")[0] == cli.EXIT_OK
    undone = io.StringIO()
    asyncio.run(run_undrain(parse("undrain", "1"), store, undone, environ={}))
    # Its budget no longer holds worker 1: draining worker 2 is not refused.
    assert drain(store, "2")[0] == cli.EXIT_OK


def test_of_two_drains_that_read_the_same_budget_only_one_goes_on() -> None:
    listing = [*worker("dgd", 1, "h1"), *worker("dgd", 2, "h2")]
    store = MemoryStore(listing, [served_entry("fe-1", "dgd", 1, 2)])

    async def both() -> list[int | str]:
        async def one(instance: str) -> int | str:
            try:
                return await run_drain(
                    parse("drain", instance), store, io.StringIO(), io.StringIO(), environ={}
                )
            except LastWorkerRefused:
                return "refused"

        return list(await asyncio.gather(one("1"), one("2")))

    assert sorted(map(str, asyncio.run(both()))) == ["0", "refused"]
    assert len(store.kv) == 1


class PausedStore(MemoryStore):
    """A store whose drain record writes wait for ``go``: a drain stopped between swap and write."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.go = asyncio.Event()
        self.swapped = asyncio.Event()

    async def swap_budget(
        self, key: str, value: bytes, revision: int | None, ttl: float | None
    ) -> bool:
        done = await super().swap_budget(key, value, revision, ttl)
        self.swapped.set()
        return done

    async def put(self, key: str, value: bytes, ttl: float | None) -> None:
        await self.go.wait()
        await super().put(key, value, ttl)


@pytest.mark.parametrize("skew", [-120.0, 120.0, 365 * 86400.0])
def test_no_host_clock_lets_two_drains_of_the_last_two_workers_pass(skew: float) -> None:
    listing = [*worker("dgd", 1, "h1"), *worker("dgd", 2, "h2")]
    store = PausedStore(listing, [served_entry("fe-1", "dgd", 1, 2)])

    async def run() -> tuple[int, str]:
        # The first drain's host runs ``skew`` seconds off; it stops between swap and write.
        first = asyncio.ensure_future(
            run_drain(
                parse("drain", "1"), store, io.StringIO(), io.StringIO(), environ={},
                wall=lambda: 1_000_000.0 + skew,
            )
        )  # fmt: skip
        await store.swapped.wait()
        try:
            await run_drain(parse("drain", "2"), store, io.StringIO(), io.StringIO(), environ={})
            second = "passed"
        except LastWorkerRefused:
            second = "refused"
        store.go.set()
        return await first, second

    assert asyncio.run(run()) == (cli.EXIT_OK, "refused")
    # Every budget write asks the server to remove it after the window.
    assert set(store.ttls) == {60.0}


def test_a_budget_entry_lapses_after_the_window_by_the_servers_clock_alone() -> None:
    listing = [*worker("dgd", 1, "h1"), *worker("dgd", 2, "h2")]
    store = PausedStore(listing, [served_entry("fe-1", "dgd", 1, 2)])

    async def run() -> str:
        first = asyncio.ensure_future(
            run_drain(parse("drain", "1"), store, io.StringIO(), io.StringIO(), environ={})
        )
        await store.swapped.wait()
        # The first drain's command died between its swap and its write; the server's clock
        # passes the window (no host's clock is asked).
        first.cancel()
        store.now += 60.0
        store.go.set()
        await run_drain(parse("drain", "2"), store, io.StringIO(), io.StringIO(), environ={})
        return "passed"

    assert asyncio.run(run()) == "passed"
    assert list(store.kv) == [drain_kv_key("dgd", 2)]
