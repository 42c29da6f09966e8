"""Elementwise (``grid-stride``) kernels: the vectors a thread loads together at each
step of its loop (``kernel.vectors_per_thread``), its loads ahead of its math, and the
kernel run on the CPU (:mod:`cuda_on_cpu`) against the reference where the grid's last
step is ragged (vectors past the end are loaded at the last one and not stored).

On a GPU, ``tests/executable/test_kernels_gpu.py`` runs them for real.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "preparation"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import cuda_on_cpu  # noqa: E402
from stage_programs import graph  # noqa: E402

from accy.dialects.kernel import KernelFuncOp  # noqa: E402
from accy.executable.device import compile_cuda  # noqa: E402

needs_cxx = pytest.mark.skipif(not cuda_on_cpu.available(), reason="needs g++ (C++20)")
TOLERANCE = {"f32": 1e-5, "bf16": 3e-2, "f16": 4e-3}


def chain_job(element: str, rows: int, cols: int, opts: tuple[str, ...] = ()):  # type: ignore[no-untyped-def]
    sm = graph("elementwise_chain", None if element == "f32" else element)
    job = cuda_on_cpu.target_job(sm, {0: (rows, cols), 1: (1, cols)}, opts)
    (k,) = [op for op in job.module.body.ops if isinstance(op, KernelFuncOp)]
    return sm, job, k


def chain_inputs(rows: int, cols: int) -> list[np.ndarray]:
    rng = np.random.default_rng(5)
    return [rng.standard_normal((rows, cols)).astype(np.float32),
            rng.standard_normal((1, cols)).astype(np.float32)]


@pytest.mark.parametrize("want,items,blocks", [(0, 2, 16384), (1, 1, 16384), (4, 4, 8192)])
def test_a_thread_loads_its_vectors_before_any_math(want: int, items: int, blocks: int) -> None:
    """At 8192 × 4096 the grid picks two vectors a thread (16384 blocks of 256 threads);
    every load of the thread's vectors comes before its first arithmetic, every vector
    but the first stored only when it is inside the tensor."""
    _, job, k = chain_job("f32", 8192, 4096, (f"kernel.vectors_per_thread={want}",))
    assert (k.plan.items, k.plan.grid[0], k.plan.vector_width) == (items, blocks, 4)
    text = cuda_on_cpu.job_source(job)
    body = cuda_on_cpu.kernel_text(text, k.sym_name)
    loads = [i for i, line in enumerate(body.splitlines()) if "__ldg(" in line]
    math = [i for i, line in enumerate(body.splitlines()) if line.lstrip().startswith("float t")]
    assert len(loads) == 2 * items and max(loads) < min(math)
    assert body.count("*reinterpret_cast<float4*>(out0 + ") == items
    assert body.count("< n) {") == items - 1
    assert compile_cuda(text, "sm_90")[:4] == b"\x7fELF"


@needs_cxx
@pytest.mark.parametrize("element", ["f32", "bf16"])
@pytest.mark.parametrize("want", [0, 2, 4])
@pytest.mark.parametrize("cols", [104, 37])
def test_a_ragged_grid_stride_kernel_matches_the_reference_on_the_cpu(
        element: str, want: int, cols: int) -> None:
    """37 rows: a grid of 1 to 4 blocks whose threads' later vectors run past the end
    (clamped loads, no stores there), in vectors of 4 floats (8 halves, their ops packed)
    at 104 columns and single elements at 37."""
    rows = 37
    sm, job, k = chain_job(element, rows, cols, (f"kernel.vectors_per_thread={want}",))
    vec = 1 if cols == 37 else 4 if element == "f32" else 8
    assert k.plan.items == (want or 1) and k.plan.vector_width == vec
    assert (k.plan.packed_ops != "") == (element != "f32" and vec > 1)
    vectors = rows * cols // vec
    assert k.plan.grid[0] * k.plan.block[0] * k.plan.items >= vectors
    err = cuda_on_cpu.job_error(job, sm, chain_inputs(rows, cols))
    assert err <= TOLERANCE[element]
