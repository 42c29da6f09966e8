"""``benchmarks/cold_compile.py`` says where it ran and times a fixed reference unit,
so that units compare across hosts (NVRTC's speed moves more between hosts than the
units did between sessions)."""

from __future__ import annotations

import json

import pytest


@pytest.fixture
def cold(benchmark_script):  # type: ignore[no-untyped-def]
    return benchmark_script("cold_compile")


def test_one_unit_with_the_host_and_the_reference(capsys, cold):
    cold.main(["--only", "layernorm", "--repeats", "2"])
    out = json.loads(capsys.readouterr().out)
    assert list(out["units"]) == ["layernorm 8192x4096"]
    host = out["host"]
    assert host["nvrtc"].count(".") == 1 and host["cpu"] and host["cores"] >= 1
    lo, mid, hi = out["reference_s"]
    assert 0 < lo <= mid <= hi
    unit = out["units"]["layernorm 8192x4096"]
    lo, mid, hi = unit["nvrtc_s"]
    assert 0 < lo <= mid <= hi
    assert unit["over_reference"] == pytest.approx(mid / out["reference_s"][1], rel=0.05,
                                                   abs=0.01)


def test_a_name_that_is_no_unit_is_a_usage_error(capsys, cold):
    with pytest.raises(SystemExit) as e:
        cold.main(["--only", "gemm"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "names no unit" in err and "layernorm 8192x4096" in err


def test_the_reference_is_a_fixed_source(cold):
    """Nothing of accy renders it: a change to accy cannot move the host's measure."""
    assert "accy" not in cold.REFERENCE_UNIT and "__global__" in cold.REFERENCE_UNIT
