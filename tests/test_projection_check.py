"""The incremental projection check gives ``projection_conflict``'s verdict at every step."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from workerset_admission.admission.effects import LoraAdapter, LoraWorker
from workerset_admission.admission.lora import AdapterLog
from workerset_admission.admission.projection import ProjectionConflicts, projection_conflict
from workerset_admission.identity import EndpointId, GroupKey, WorkerType

EP = EndpointId("ns", "backend", "generate")
GROUP = GroupKey.build("m", EP, "chat", WorkerType.AGGREGATED)

# A step: (worker, adapter key, adapter name, fingerprint) put, or fingerprint None to remove;
# or ("snapshot",) to project now; or ("receiver",) to start a new tenure.
_STEPS = st.lists(
    st.one_of(
        st.tuples(
            st.integers(1, 3),
            st.integers(0, 40),
            st.sampled_from("abc"),
            st.sampled_from(["f1", "f2", None]),
        ),
        st.just(("snapshot",)),
        st.just(("receiver",)),
    ),
    max_size=150,
)


@settings(max_examples=300, deadline=None)
@given(_STEPS)
def test_the_incremental_check_answers_as_the_plain_one_after_every_change(steps: list) -> None:
    logs: dict[int, AdapterLog] = {}
    check = ProjectionConflicts()
    receiver = 1
    for step in [*steps, ("snapshot",)]:
        if step == ("receiver",):
            receiver += 1
            continue
        if step != ("snapshot",):
            worker, key, name, fingerprint = step
            log = logs.setdefault(worker, AdapterLog())
            if fingerprint is None:
                log.remove(f"k{key}")
            else:
                log.put(LoraAdapter(f"k{key}", name, fingerprint))
        workers = tuple(
            LoraWorker(EP, worker, "base", log.adapters())
            for worker, log in sorted(logs.items())
            if len(log)
        )
        plain = projection_conflict(workers)
        fast = check.check(GROUP, receiver, workers)
        assert (plain is None) == (fast is None), (plain, fast)
        if fast is not None:
            named = fast.split("'")[1]
            fingerprints = {
                a.lora_fingerprint for w in workers for a in w.adapters if a.model_suffix == named
            }
            assert len(fingerprints) > 1


def test_the_adapters_handed_out_are_a_sorted_value_and_only_the_log_grows_per_change() -> None:
    log = AdapterLog()
    snapshots = []
    for n in range(200):
        log.put(LoraAdapter(f"k{n:03d}", f"a{n}", "f"))
        snapshots.append(log.adapters())
    log.remove("k000")
    last = log.adapters()
    assert [a.key for a in last] == [f"k{n:03d}" for n in range(1, 200)]
    # Every earlier snapshot still reads what it was when taken.
    assert [len(s) for s in snapshots] == list(range(1, 201))
    assert snapshots[5] == tuple(LoraAdapter(f"k{n:03d}", f"a{n}", "f") for n in range(6))
    # The log is folded into a base once it outgrows it: it never holds every change.
    assert len(log.log) <= max(32, len(log.base)) + 1
