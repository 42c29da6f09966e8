"""Stage records: the transition hook, accy_record_batch, counts, rates, bounds, safety."""

from __future__ import annotations

import json
import logging

import dask.config
import pytest

from accy.dashboard.plugin import StageDashboardPlugin
from accy.dashboard.records import (
    DURATION_BUCKETS,
    MAX_FAILURES,
    SLOWEST,
    StageRecords,
    snapshot_from_variants,
    stage_of,
)


def finish(records, stage: str, hexkey: str, start: float, seconds: float,
           worker: str = "tcp://10.0.0.1:4000", finish_state: str = "memory",
           transfer: float = 0.0) -> None:
    spans = [{"action": "compute", "start": start, "stop": start + seconds}]
    if transfer:
        spans.insert(0, {"action": "transfer", "start": start - transfer, "stop": start})
    records.transition((f"accy_{stage}", hexkey), "processing", finish_state,
                       stimulus_id="test", worker=worker, thread=7, startstops=spans)


def variant(vid: str, stages: list[tuple[str, bool]], status: str = "ok",
            elapsed_ns: int = 1_000_000, **extra) -> dict:
    return {"id": vid, "program": vid.split("[")[0], "status": status, "elapsed_ns": elapsed_ns,
            "stages": [{"stage": s, "key": f"{i:02x}", "reused": reused, "elapsed_ns": 1000,
                        "plan_fingerprint": None, "pass_stats": {}}
                       for i, (s, reused) in enumerate(stages)], **extra}


def test_finished_accy_tasks_become_stage_runs():
    records = StageRecords(maxlen=100)
    runs = {"contract": 3, "kernel": 2, "compile": 1}
    t = 1000.0
    for stage, n in runs.items():
        for i in range(n):
            finish(records, stage, f"{stage}{i}", t, 0.01 * (i + 1), transfer=0.5)
            t += 1
    # Not stage runs: other keys, other transitions, string keys.
    records.transition(("inc", "abc"), "processing", "memory", worker="w", startstops=[])
    records.transition(("accy_contract", "x"), "waiting", "processing")
    records.transition("accy_contract-123", "processing", "memory", worker="w", startstops=[])
    finish(records, "kernel", "bad", t, 0.2, finish_state="erred")

    snap = records.snapshot()
    assert {s: snap["counts"][s]["tasks"] for s in runs} == runs
    assert snap["counts"]["kernel"]["task_errors"] == 1
    assert snap["stages"] == ["contract", "kernel", "compile"]  # pipeline order
    assert snap["durations"]["contract"]["samples"] == pytest.approx([0.01, 0.02, 0.03])
    assert snap["durations"]["contract"]["median"] == pytest.approx(0.02)
    assert snap["durations"]["kernel"]["n"] == 2  # the erred run has no duration sample
    first = snap["timeline"][0]
    assert (first["stage"], first["key"], first["worker"], first["thread"]) == \
        ("contract", "contract0", "tcp://10.0.0.1:4000", 7)
    assert (first["start"], first["stop"]) == (1000.0, pytest.approx(1000.01))
    assert first["transfers"] == [[999.5, 1000.0]]
    assert [r["status"] for r in snap["timeline"]][-1] == "erred"
    assert snap["duration_source"] == "tasks"
    assert json.loads(json.dumps(snap)) == snap


def test_histograms_are_cumulative_and_outlive_the_bound():
    records = StageRecords(maxlen=2)
    for i, seconds in enumerate([0.0005, 0.003, 0.003, 0.7, 500.0]):
        finish(records, "compile", str(i), 10.0 * i, seconds)
    assert len(records.runs) == 2 and records.totals["compile"]["tasks"] == 5
    hist = records.snapshot()["histograms"]["compile"]
    buckets = dict((str(b), n) for b, n in hist["buckets"])
    assert buckets["0.001"] == 1 and buckets["0.005"] == 3 and buckets["1.0"] == 4
    assert buckets["300.0"] == 4 and buckets["+Inf"] == hist["count"] == 5
    counts = [n for _, n in hist["buckets"]]
    assert counts == sorted(counts) and len(counts) == len(DURATION_BUCKETS) + 1
    assert hist["sum"] == pytest.approx(500.7065)


def test_record_batch_counts_rates_failures_and_slowest():
    records = StageRecords(maxlen=100)
    ok = [variant(f"softmax[target=host,arg0={n}]", [("contract", n % 2 == 0), ("kernel", False)],
                  elapsed_ns=n * 1000) for n in range(30)]
    skipped = variant("softmax[target=cuda:sm_90]", [("contract", True), ("load", False)],
                      elapsed_ns=1)
    skipped["stages"][1]["skipped"] = "no GPU"
    failed = variant("matmul[target=host]", [("contract", False), ("kernel", False)],
                     status="failed", elapsed_ns=10**9,
                     failure={"pipeline": "kernel", "pass": "tile-reductions",
                              "message": "block 96 does not divide 1000\nmore",
                              "reproducer": "/tmp/repro/ab.mlir"})
    assert records.record_batch([*ok, skipped]) == {"recorded": 31, "ignored": 0}
    assert records.record_batch([failed]) == {"recorded": 1, "ignored": 0}

    snap = records.snapshot()
    contract = snap["counts"]["contract"]
    assert (contract["ran"], contract["reused"], contract["receipts"]) == (16, 16, 32)
    assert contract["reuse_rate"] == contract["miss_rate"] == 0.5
    assert snap["counts"]["kernel"]["miss_rate"] == 1.0
    load = snap["counts"]["load"]
    assert (load["ran"], load["skipped"], load["skip_rate"]) == (0, 1, 1.0)
    assert snap["variants"] == {"ok": 31, "failed": 1}
    assert len(snap["slowest"]) == SLOWEST
    assert snap["slowest"][0]["id"] == "matmul[target=host]"
    assert [v["elapsed_ns"] for v in snap["slowest"][1:4]] == [29000, 28000, 27000]
    assert snap["slowest"][1]["stages_ran"] == 2 and snap["slowest"][2]["stages_reused"] == 1
    (failure,) = snap["failures"]
    assert failure["pipeline"] == "kernel" and failure["pass"] == "tile-reductions"
    assert failure["reproducer"] == "/tmp/repro/ab.mlir"
    assert failure["message"].startswith("block 96")
    # Receipts only: durations come from the receipts that ran.
    assert snap["duration_source"] == "receipts"
    assert snap["durations"]["kernel"]["n"] == 31
    assert json.loads(json.dumps(snap)) == snap


def test_stores_are_bounded():
    records = StageRecords(maxlen=5)
    for i in range(MAX_FAILURES + 10):
        records.record_batch([variant(f"v{i}", [("contract", False)], status="failed",
                                      failure={"pipeline": "contract", "pass": "verify",
                                               "message": "x" * 10_000, "reproducer": None})])
    for i in range(12):
        finish(records, "tensor", str(i), float(i), 0.001)
    assert len(records.variants) == 5 and len(records.runs) == 5
    assert len(records.failures) == MAX_FAILURES
    snap = records.snapshot()
    assert snap["counts"]["contract"]["ran"] == MAX_FAILURES + 10  # totals stay cumulative
    assert snap["counts"]["tensor"]["tasks"] == 12
    assert snap["failures"][0]["id"] == f"v{MAX_FAILURES + 9}"  # newest first
    assert len(snap["failures"][0]["message"]) <= 2000
    assert snap["retained"] == {"stage_runs": 5, "variants": 5, "limit": 5}
    assert len(records.snapshot(timeline_limit=3)["timeline"]) == 3


def test_the_bound_comes_from_dask_config():
    with dask.config.set({"accy.stage-records": 3}):
        assert StageRecords().maxlen == 3
        assert StageDashboardPlugin().records.maxlen == 3
    assert StageRecords().maxlen == 10000
    with pytest.raises(ValueError):
        StageRecords(maxlen=0)


@pytest.mark.parametrize("key, kwargs", [
    (("accy_contract", "ab"), {"startstops": "garbage"}),
    (("accy_contract", "ab"), {"startstops": [{"action": "compute"}]}),
    (("accy_contract", "ab"), {"startstops": [None]}),
    (("accy_contract", "ab"), {"startstops": [{"action": "compute", "start": "a", "stop": 1}]}),
])
def test_a_hook_fed_garbage_logs_a_warning_and_does_not_raise(key, kwargs, caplog):
    records = StageRecords(maxlen=10)
    with caplog.at_level(logging.WARNING, logger="accy.dashboard"):
        records.transition(key, "processing", "memory", **kwargs)
    assert "could not record the transition" in caplog.text
    assert not records.runs and not records.totals
    finish(records, "contract", "ok", 1.0, 0.5)  # still works afterwards
    assert records.totals["contract"]["tasks"] == 1


@pytest.mark.parametrize("key", [None, (), ("accy_",), (1, 2), ("accy_kernel",), object()])
def test_odd_keys_are_ignored_or_recorded_safely(key):
    records = StageRecords(maxlen=10)
    records.transition(key, "processing", "memory", worker=None)
    records.transition(key, "processing", "erred")
    assert records.snapshot()["timeline"] == []


def test_malformed_variants_are_ignored(caplog):
    records = StageRecords(maxlen=10)
    with caplog.at_level(logging.WARNING, logger="accy.dashboard"):
        reply = records.record_batch([
            {"status": "ok"},                                       # no id
            {"id": "v", "stages": [{"reused": False}]},             # a receipt without stage
            "not a dict",
            {"id": "w", "elapsed_ns": "soon"},
            variant("good[target=host]", [("contract", False)]),
        ])
    assert reply == {"recorded": 1, "ignored": 4}
    assert "malformed variant" in caplog.text
    assert records.snapshot()["counts"] == {"contract": {
        "tasks": 0, "task_errors": 0, "ran": 1, "reused": 0, "skipped": 0, "failed": 0, "receipts": 1,
        "reuse_rate": 0.0, "miss_rate": 1.0, "skip_rate": 0.0}}
    assert records.record_batch(None) == {"recorded": 0, "ignored": 0}


def test_stage_of():
    assert stage_of(("accy_compile", "ff")) == ("compile", "ff")
    assert stage_of(("accy_load", "ff", 2)) == ("load", "ff-2")
    assert stage_of(["accy_load", "ff"]) is None  # the scheduler's keys are tuples


def test_the_plugin_feeds_its_records():
    """The plugin's hook and handlers, called as the scheduler and a TCP client would."""
    plugin = StageDashboardPlugin(max_records=50)
    spans = [{"action": "compute", "start": 5.0, "stop": 5.25}]
    plugin.transition(("accy_kernel", "aa"), "processing", "memory", stimulus_id="s",
                      worker="tcp://w:1", startstops=spans)
    plugin.transition(("accy_kernel", "aa"), "processing", "memory", stimulus_id="s",
                      worker="tcp://w:1", startstops=("garbage",))  # logged, not raised
    # Over TCP, lists arrive as tuples.
    wire = {"id": "softmax[target=host]", "program": "softmax", "status": "ok",
            "elapsed_ns": 250_000_000,
            "stages": ({"stage": "kernel", "key": "aa", "reused": False,
                        "elapsed_ns": 250_000_000, "plan_fingerprint": "01",
                        "pass_stats": {"x": (1, 2)}},)}
    assert plugin.record_batch(variants=(wire,)) == {"recorded": 1, "ignored": 0}
    snap = plugin.stages()
    assert snap["counts"]["kernel"]["tasks"] == 1 and snap["counts"]["kernel"]["ran"] == 1
    assert snap["pinned_keys"] == 0 and snap["publishes"] == 0
    assert json.loads(json.dumps(snap)) == snap


def test_snapshot_from_variants_matches_the_records():
    variants = [variant("a[target=host]", [("contract", False), ("tensor", True)]),
                variant("b[target=host]", [("contract", True)], status="failed",
                        failure={"pipeline": "tensor", "pass": "p", "message": "m",
                                 "reproducer": "/r"})]
    snap = snapshot_from_variants(variants)
    assert snap["counts"]["contract"]["reuse_rate"] == 0.5
    assert snap["timeline"] == [] and snap["failures"][0]["pass"] == "p"
