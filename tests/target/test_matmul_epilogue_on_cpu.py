"""The FFMA matmul's fused epilogue, run on the CPU (:mod:`cuda_on_cpu`) against the
reference: the epilogue takes a thread's four adjacent columns together (float4 loads
of the inputs it reads along n, one float4 store an output), an output that is the
matmul's own value stores the accumulators as they are.

The tensor-core kernels (``mma.sync``, ``wgmma``) cannot run here; their epilogue's
spelling is checked in ``test_cuda_kernels.py`` and what it computes on a GPU
(``tests/executable/test_kernels_gpu.py``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "preparation"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import cuda_on_cpu  # noqa: E402
from stage_programs import graph, program  # noqa: E402

from accy.dialects.kernel import KernelFuncOp  # noqa: E402

needs_cxx = pytest.mark.skipif(not cuda_on_cpu.available(), reason="needs g++ (C++20)")


def fused(batch: tuple[int, ...], m: int, n: int, k: int):  # type: ignore[no-untyped-def]
    """``(a·b, tanh((a·b + r) · s))``: a residual read along n, a row scale (``[…, M, 1]``,
    one value for the four columns), and the matmul's value itself a second output."""
    pre = "".join(f"{d}x" for d in batch)
    a, b, c = (f"tensor<{pre}{m}x{k}xf32>", f"tensor<{pre}{k}x{n}xf32>",
               f"tensor<{pre}{m}x{n}xf32>")
    s = f"tensor<{pre}{m}x1xf32>"
    return program([a, b, c, s], [c, c], f"""\
    %0 = "semantic.matmul"(%a0, %a1) : ({a}, {b}) -> {c}
    %1 = "semantic.add"(%0, %a2) : ({c}, {c}) -> {c}
    %2 = "semantic.mul"(%1, %a3) : ({c}, {s}) -> {c}
    %3 = "semantic.tanh"(%2) : ({c}) -> {c}
    "func.return"(%0, %3) : ({c}, {c}) -> ()""")


def inputs(sm, seed: int = 0) -> list[np.ndarray]:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(tuple(t.shape)) * 0.5).astype(np.float32)
            for t in sm.entry().function_type.inputs]


def mappings(job) -> list[str]:  # type: ignore[no-untyped-def]
    return [k.plan.mapping for k in job.module.body.ops if isinstance(k, KernelFuncOp)]


@needs_cxx
def test_the_mlp_block_matches_the_reference_on_the_cpu() -> None:
    """Bias and tanh-gelu after the first matmul, bias after the second."""
    sm = graph("mlp")
    job = cuda_on_cpu.target_job(sm, {0: (128, 256)})
    assert mappings(job) == ["ffma-tiled", "ffma-tiled"]
    assert cuda_on_cpu.job_source(job).count("__ldg(reinterpret_cast<const float4*>(in2 + (n)))") == 2
    # gelu's erfcf inlined once per rolled sub-tile, not per accumulator (NVRTC's time)
    assert cuda_on_cpu.job_source(job).count("for (int p = 0; p < 4; ++p)") == 1
    rng = np.random.default_rng(1)
    shapes = [(128, 256), (256, 1024), (1024,), (1024, 256), (256,)]
    xs = [(rng.standard_normal(s) * 0.1).astype(np.float32) for s in shapes]
    assert cuda_on_cpu.job_error(job, sm, xs) <= 1e-5


@needs_cxx
@pytest.mark.parametrize("batch", [(), (2,)])
def test_a_fused_epilogue_with_two_outputs_matches_the_reference(batch) -> None:  # type: ignore[no-untyped-def]
    sm = fused(batch, 64, 128, 24)
    job = cuda_on_cpu.target_job(sm)
    assert mappings(job) == ["ffma-tiled"]
    (body,) = [cuda_on_cpu.kernel_text(cuda_on_cpu.job_source(job), k.sym_name)
               for k in job.module.body.ops if isinstance(k, KernelFuncOp)]
    assert body.count("*reinterpret_cast<float4*>(out") == 2  # one store an output
    # tanh keeps the epilogue rolled: the matmul's own value picked from its sub-tile
    assert "make_float4((p == 0 ? acc[0 + r][0] : (p == 1 ? acc[0 + r][4]" in body
    assert cuda_on_cpu.job_error(job, sm, inputs(sm)) <= 1e-5
