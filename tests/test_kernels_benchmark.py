"""``benchmarks/kernels.py``'s summary line and RESULTS table mark a dispatch-bound side
(†), and the summary line says a ratio against one is not a kernel ratio."""

from __future__ import annotations

import pytest


@pytest.fixture
def kernels(benchmark_script):  # type: ignore[no-untyped-def]
    return benchmark_script("kernels")


def entry(compile_bound: bool) -> dict:  # type: ignore[type-arg]
    side = {"gbs": 3000.0, "host_bound": False}
    return {"flops": 0, "accy": {"gbs": 3795.0, "host_bound": False}, "torch_eager": side,
            "torch_compile": {"gbs": 3692.0, "host_bound": compile_bound},
            "accy_over_torch_compile": 1.03, "err": 6e-8, "pass": True, "cold_compile_s": 0.1}


def test_a_dispatch_bound_peer_is_marked(kernels):
    line = kernels.summary_line("bias_gelu", entry(True))
    assert "3692.0†" in line and "accy/compile 1.03 (dispatch-bound)" in line


def test_a_kernel_ratio_is_plain(kernels):
    line = kernels.summary_line("bias_gelu", entry(False))
    assert "†" not in line and "dispatch-bound" not in line and "accy/compile 1.03" in line


def test_the_results_table_has_every_program_and_both_ratios(kernels):
    e = entry(True)
    e.update(accy={"gbs": 3795.0, "gbs_range": [3791.0, 3797.0], "host_bound": False},
             launches=[{}, {}], accy_graph=True, copy={"gbs": 4000.0})
    mm = {"flops": 1, "accy": {"tflops": 683.3, "tflops_range": [617.0, 698.1]},
          "cublas": {"tflops": 695.6, "host_bound": False}, "accy_over_torch_compile": 0.9,
          "accy_over_cublas": 0.982, "launches": [{}], "err": 2.5e-3, "pass": False}
    rows = kernels.markdown_table({"programs": {"bias_gelu": e, "mm": mm}}).splitlines()
    assert len(rows) == 4 and rows[1].count("---") == 13
    assert rows[2] == ("| bias_gelu | GB/s | 3795 | 3791–3797 | 3000 | 3692† | — | — | 1.03 "
                       "|  | 94.9 | 2 (graph) | 6.0e-08 pass |")
    assert rows[3] == ("| mm | TFLOP/s | 683 | 617–698 | — | — | — | 696 | 0.90 | 0.98 |  | "
                       "1 | 2.5e-03 FAIL |")


def test_the_share_of_the_copy_is_against_a_copy_of_the_same_bytes(kernels):
    e = entry(False)
    assert kernels.of_copy(e) is None  # no copy timed
    e["copy"] = {"gbs": 3900.0}
    assert kernels.of_copy(e) == pytest.approx(3795.0 / 3900.0)
    assert "97.3% of copy" in kernels.summary_line("bias_gelu", e)
    e["flops"] = 10  # a compute-bound case has no share of the copy
    assert kernels.of_copy(e) is None


def test_a_bad_option_is_a_usage_error_before_the_run(capsys, kernels):
    with pytest.raises(SystemExit) as e:
        kernels.main(["--option", "kernel.block_sise=128", "--list"])
    assert e.value.code == 2
    assert "unknown option 'kernel.block_sise'" in capsys.readouterr().err


def test_a_good_option_is_kept_for_every_fragment(capsys, kernels):
    kernels.main(["--option", "kernel.block_size=128", "--list", "--only", "attention"])
    assert capsys.readouterr().out.split() == ["attention"]
    assert kernels.OPTIONS == ["kernel.block_size=128"]
