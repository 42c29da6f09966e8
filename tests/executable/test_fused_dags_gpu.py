"""On the GPU: fused elementwise DAGs run as one launch and keep the reference answer;
the kernel benchmark runs and checks its results."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

from accy.executable.cache import FragmentCompilerCache
from accy.preparation.options import RunOptions
from accy.preparation.products import SemanticModule
from accy.preparation.stages import PreparationRequest
from accy.reference import run_reference

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
T = "tensor<?x4096x{el}>"
DAG = """\
"builtin.module"() ({{
  "func.func"() <{{function_type = ({t}, {t}) -> ({t}, {t}), sym_name = "main"}}> ({{
  ^bb0(%a0: {t}, %a1: {t}):
    %0 = "semantic.exp"(%a0) : ({t}) -> {t}
    %1 = "semantic.neg"(%0) : ({t}) -> {t}
    %2 = "semantic.sin"(%a1) : ({t}) -> {t}
    %3 = "semantic.mul"(%0, %2) : ({t}, {t}) -> {t}
    %4 = "semantic.add"(%1, %3) : ({t}, {t}) -> {t}
    %5 = "semantic.tanh"(%a0) : ({t}) -> {t}
    %6 = "semantic.mul"(%4, %5) : ({t}, {t}) -> {t}
    "func.return"(%6, %0) : ({t}, {t}) -> ()
  }}) : () -> ()
}}) : () -> ()
"""


def _cuda_run(sm: SemanticModule, rows: int, tol: float) -> int:
    """Run ``sm`` on the GPU with ``?`` = ``rows``; check it; the number of launches."""
    rng = np.random.default_rng(7)
    inputs = sm.entry().function_type.inputs
    xs = []
    for t in inputs:
        x = rng.standard_normal((rows, *t.shape[1:])).astype(np.float32)
        xs.append(x.astype(np.float16) if t.element.name == "f16" else x)
    update = FragmentCompilerCache().refresh_from_semantic_module(
        sm, PreparationRequest(options=RunOptions.parse("cuda"),
                               shapes={i: x.shape for i, x in enumerate(xs)}))
    assert update.fragment is not None
    got = update.fragment(*xs)
    want = run_reference(sm.module, xs)
    for g, w in zip(got, want):
        w64 = w.astype(np.float64)
        np.testing.assert_allclose(np.asarray(g, np.float64), w64, rtol=tol,
                                   atol=tol * float(np.max(np.abs(w64))))
    return len(update.fragment.plan.launches)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 37, 1024])
def test_gelu_tanh_is_one_launch_on_the_gpu(rows: int) -> None:
    sm = SemanticModule.from_file(os.path.join(ROOT, "graphs", "gelu_tanh.mlir"))
    assert _cuda_run(sm, rows, 2e-6) == 1


@pytest.mark.gpu
@pytest.mark.parametrize("el,tol", [("f32", 2e-6), ("f16", 2e-3), ("bf16", 1.6e-2)])
def test_a_fan_out_fan_in_dag_is_one_launch_on_the_gpu(el: str, tol: float) -> None:
    sm = SemanticModule.from_text(DAG.format(t=T.format(el=el)), "dag.mlir")
    assert _cuda_run(sm, 129, tol) == 1


@pytest.mark.gpu
def test_the_kernel_benchmark_runs_and_its_results_pass() -> None:
    pytest.importorskip("torch")
    spec = importlib.util.spec_from_file_location(
        "kernels_bench", os.path.join(ROOT, "benchmarks", "kernels.py"))
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = bench.main(["--quick", "--no-torch-compile", "--only",
                      "gelu_tanh,layernorm_bf16,matmul1024_f16"])
    progs = out["programs"]
    assert set(progs) == {"gelu_tanh", "gelu_tanh_bf16", "gelu_tanh_f16", "layernorm_bf16",
                          "matmul1024_f16"}
    for name, e in progs.items():
        assert "error" not in e, (name, e.get("error"))
        assert e["pass"], (name, e["err"])
        assert e["accy"]["median_s"] > 0 and e["accy"]["calls"] == 10
        assert e["torch_eager"]["gbs"] > 0
    assert len(progs["gelu_tanh"]["launches"]) == 1
    assert progs["matmul1024_f16"]["cublas"]["tflops"] > 0
