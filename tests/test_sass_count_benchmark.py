"""``benchmarks/sass_count.py`` counts the SASS of the kernels accy renders, on a machine
without a GPU (NVRTC to a cubin, ``cuobjdump -sass``)."""

from __future__ import annotations

import doctest
import json

import pytest


@pytest.fixture
def sass(benchmark_script):  # type: ignore[no-untyped-def]
    return benchmark_script("sass_count")


@pytest.fixture
def tool(sass):  # type: ignore[no-untyped-def]
    found = sass.find_cuobjdump()
    if found is None:
        pytest.skip("no cuobjdump (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")
    return found


def test_the_parsers_doctests(sass):
    assert doctest.testmod(sass).failed == 0


def test_the_half_erfc_costs_a_half_element_fewer_instructions(capsys, sass, tool):
    """bias_gelu's f32 kernel evaluates the full f32 erfc, its half kernels the half
    erfc (README: ~20 instructions instead of 40); the counts must show it."""
    sass.main(["--only", "bias_gelu"])  # a prefix: the f32, bf16 and f16 cases
    out = json.loads(capsys.readouterr().out)
    assert list(out["cases"]) == ["bias_gelu", "bias_gelu_bf16", "bias_gelu_f16"]
    f32, bf16, f16 = (out["cases"][n]["kernels"]["k0_elementwise"] for n in out["cases"])
    for k in (f32, bf16, f16):
        assert sum(k["classes"].values()) == k["instructions"]
        assert 0 < k["loop"] < k["instructions"]
        assert k["per_element"] == round(k["loop"] / k["items"], 1)
        assert k["classes"]["special"] >= k["items"]  # at least one MUFU an element
        assert 8 <= k["registers"] <= 255
    assert (f32["items"], bf16["items"], f16["items"]) == (4, 8, 8)  # 16-byte vectors
    assert max(bf16["per_element"], f16["per_element"]) < 0.8 * f32["per_element"]


def test_row_kernels_have_counts_but_no_per_element_figure(capsys, sass, tool):
    """reductions is a unit of four row kernels, each compiled as an NVRTC program of
    its own as a refresh compiles it: every one is found in its own cubin."""
    sass.main(["--only", "softmax_axis0_bf16,reductions_bf16"])
    cases = json.loads(capsys.readouterr().out)["cases"]
    k = cases["softmax_axis0_bf16"]["kernels"]
    assert list(k) == ["k0_rows"]
    assert k["k0_rows"]["instructions"] > 100 and "per_element" not in k["k0_rows"]
    k = cases["reductions_bf16"]["kernels"]
    assert list(k) == ["k0_rows", "k1_rows", "k2_rows", "k3_rows"]
    assert all(v["instructions"] > 10 and "per_element" not in v for v in k.values())


def test_a_name_that_is_no_case_is_a_usage_error(capsys, sass, tool):
    with pytest.raises(SystemExit) as e:
        sass.main(["--only", "gemm"])
    assert e.value.code == 2
    assert "names no case" in capsys.readouterr().err
