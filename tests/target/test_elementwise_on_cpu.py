"""Elementwise (``grid-stride``) kernels: an f32 thread whose grid leaves it several
vectors loads its next one before it computes the current one (``kernel.prefetch``), and the
kernel run on the CPU (:mod:`cuda_on_cpu`) against the reference on a grid that leaves
some threads two vectors and the others one (a prefetch past the end loads the thread's
own vector again).

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
TOLERANCE = {"f32": 1e-5, "bf16": 3e-2}


def chain_job(element: str, rows: int, cols: int, opts: tuple[str, ...] = ()):  # type: ignore[no-untyped-def]
    sm = graph("elementwise_chain", None if element == "f32" else element)
    job = cuda_on_cpu.target_job(sm, {0: (rows, cols), 1: (1, cols)}, opts)
    (k,) = [op for op in job.module.body.ops if isinstance(op, KernelFuncOp)]
    return sm, job, k


@pytest.mark.parametrize("prefetch", [True, False])
def test_a_thread_loads_its_next_vector_before_it_computes(prefetch: bool) -> None:
    """At 8192 × 4096 (16384 blocks of 256 threads, two vectors a thread) the first
    vector's loads come before the loop, the next one's before the first arithmetic in
    it; without ``prefetch`` the loop loads, computes and stores one vector a step."""
    _, job, k = chain_job("f32", 8192, 4096, (f"kernel.prefetch={str(prefetch).lower()}",))
    assert (k.plan.items, k.plan.grid[0], k.plan.vector_width) == (2 if prefetch else 1,
                                                                    16384, 4)
    text = cuda_on_cpu.job_source(job)
    lines = cuda_on_cpu.kernel_text(text, k.sym_name).splitlines()
    loop = next(i for i, line in enumerate(lines) if line.lstrip().startswith("for ("))
    loads = [i for i, line in enumerate(lines) if "__ldg(" in line]
    math = [i for i, line in enumerate(lines) if line.lstrip().startswith("float t")]
    if prefetch:
        assert [i < loop for i in loads] == [True, True, False, False]
        assert max(loads) < min(math) and "    if (gn >= n) break;" in lines
    else:
        assert len(loads) == 2 and loop < min(loads) and "gn" not in "\n".join(lines)
    assert sum(line.lstrip().startswith("*reinterpret_cast<float4*>(out0 + i) =")
               for line in lines) == 1
    assert compile_cuda(text, "sm_90")[:4] == b"\x7fELF"


@needs_cxx
@pytest.mark.parametrize("element,cols,vec", [("f32", 14200, 4), ("bf16", 28400, 8),
                                              ("f32", 14199, 1)])
def test_a_ragged_pipelined_kernel_matches_the_reference_on_the_cpu(
        element: str, cols: int, vec: int) -> None:
    """37 rows in blocks of 32 threads: 131350 vectors (of 4 floats, of 8 halves with
    their ops packed) over 4096 blocks leave 278 threads two vectors and the others one;
    with ``kernel.prefetch`` on, the f32 kernel prefetches, the one over halves and the
    one at 14199 columns (no vectors) run the plain loop."""
    rows = 37
    sm, job, k = chain_job(element, rows, cols, ("kernel.block_size=32", "kernel.prefetch=true"))
    assert k.plan.vector_width == vec
    assert k.plan.items == (2 if vec > 1 and element == "f32" else 1)
    assert (k.plan.packed_ops != "") == (element != "f32" and vec > 1)
    threads = k.plan.grid[0] * k.plan.block[0]
    assert threads < rows * cols // vec < 2 * threads
    rng = np.random.default_rng(5)
    inputs = [rng.standard_normal((rows, cols)).astype(np.float32),
              rng.standard_normal((1, cols)).astype(np.float32)]
    assert cuda_on_cpu.job_error(job, sm, inputs) <= TOLERANCE[element]
