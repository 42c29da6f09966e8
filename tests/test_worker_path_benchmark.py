"""``benchmarks/worker_path.py``: a worker's path beside a pool process, in one process."""

from __future__ import annotations

import json

import pytest


@pytest.fixture
def worker_path(benchmark_script):  # type: ignore[no-untyped-def]
    return benchmark_script("worker_path")


def test_both_sides_run_the_same_variants_and_say_where_the_time_went(worker_path, capsys):
    worker_path.main(["--target", "host", "--variants", "6", "--passes", "1", "--grain", "3"])
    out = json.loads(capsys.readouterr().out)
    (row,) = out["passes"]
    assert row["accy"]["stages"] > 0 and row["pool"]["stages"] > 0
    # accy writes every product to its store and keys every stage; the pool fingerprints
    assert row["accy"]["encode_for_store"] > 0 and row["accy"]["stage_keys"] > 0
    assert row["pool"]["fingerprints"] > 0 and "encode_for_store" not in row["pool"]
    assert out["ratio"] == round(out["median_ms"]["pool"] / out["median_ms"]["accy"], 3)
