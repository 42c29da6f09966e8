"""``benchmarks/wire_encode.py``: the time of encoding a stage product for the store."""

from __future__ import annotations


def test_it_times_every_stage_product_of_its_programs(benchmark_script, capsys):  # type: ignore[no-untyped-def]
    bench = benchmark_script("wire_encode")
    out = bench.main(["--seconds", "0", "--repeats", "2"])
    assert out["products"] == len(bench.PROGRAMS) * len(bench.STAGES) == 18
    lo, mid, hi = out["encode_us"]
    assert 0 < lo <= mid <= hi
    assert '"encode_us"' in capsys.readouterr().out  # printed as JSON
