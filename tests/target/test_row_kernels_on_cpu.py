"""Row kernels (reductions, softmax over any axis): how often each reads its input
from global memory, NVRTC compiling them for sm_90 (no GPU needed), and every kernel
of the program run on the CPU (:mod:`cuda_on_cpu`) against the reference.

On a GPU, ``tests/executable/test_kernels_gpu.py`` runs them for real.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "preparation"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import cuda_on_cpu  # noqa: E402
from stage_programs import graph  # noqa: E402

from accy.dialects.kernel import KernelFuncOp  # noqa: E402
from accy.dialects.memory import BufferSpec  # noqa: E402
from accy.executable.device import compile_cuda  # noqa: E402
from accy.pipeline import prepare_through  # noqa: E402
from accy.preparation.options import RunOptions  # noqa: E402
from accy.preparation.products import SemanticModule  # noqa: E402
from accy.reference import run_reference  # noqa: E402

CUDA = "cuda:sm_90"
needs_cxx = pytest.mark.skipif(not cuda_on_cpu.available(), reason="needs g++ (C++20)")


def cuda_job(sm, shapes=None, opts=()):  # type: ignore[no-untyped-def]
    return prepare_through(sm, "target", RunOptions.parse(CUDA, list(opts)),
                           shapes or {}).product


def source(job) -> str:  # type: ignore[no-untyped-def]
    return job.module.attributes["target.source"].value


def kernel_bodies(job) -> dict[str, str]:  # type: ignore[no-untyped-def]
    text = source(job)
    return {k.sym_name: cuda_on_cpu.kernel_text(text, k.sym_name)
            for k in job.module.body.ops if isinstance(k, KernelFuncOp)}


def global_reads(body: str, param: str = "in0") -> int:
    """Loads from ``param`` in a kernel's text (each inside an unrolled column loop
    is one read of the row)."""
    return len(re.findall(rf"\b{param}\[|\b{param} \+", body))


def run_on_cpu(job, inputs: list[np.ndarray]) -> list[np.ndarray]:  # type: ignore[no-untyped-def]
    """Every launch of the job's table on the CPU over float32 buffers (arena views
    included), in order; the results."""
    attrs = job.module.attributes
    specs = [BufferSpec.from_attr(a) for a in attrs["target.buffers"].values]
    arena = np.full(max(1, attrs["target.arena_bytes"].value // 4 + 1), np.nan, np.float32)
    by_id = {s.id: s for s in specs}
    arrays: dict[int, np.ndarray] = {}
    results: dict[int, np.ndarray] = {}

    def array(i: int) -> np.ndarray:
        if i in arrays:
            return arrays[i]
        s = by_id[i]
        assert s.dtype == "f32", s.dtype
        n = s.bytes // 4
        if s.kind == "arg":
            a = np.ascontiguousarray(inputs[s.index], np.float32).reshape(-1)
        elif s.kind == "arena":
            assert s.offset % 4 == 0
            a = arena[s.offset // 4:s.offset // 4 + n]
        elif s.kind == "alias":
            a = array(s.alias_of)[:n]
        else:
            a = array(s.inplace_of)[:n] if s.inplace_of >= 0 else np.full(n, np.nan, np.float32)
            results[s.index] = a.reshape(s.shape)
        arrays[i] = a
        return a

    for s in specs:
        array(s.id)
    text = source(job)
    for launch in attrs["target.launches"].values:
        e = dict(launch.entries)
        assert tuple(e["block"].values)[1:] == (1, 1)
        cuda_on_cpu.run(text, e["kernel"].value, tuple(e["grid"].values), e["block"].values[0],
                        [array(i) for i in e["buffers"].values])
    return [results[i] for i in sorted(results)]


def max_error(job, sm, inputs: list[np.ndarray]) -> float:  # type: ignore[no-untyped-def]
    got = run_on_cpu(job, inputs)
    want = run_reference(sm.module, inputs)
    err = 0.0
    for g, w in zip(got, want, strict=True):
        w = np.asarray(w, np.float64)
        assert g.shape == w.shape and not np.isnan(g).any()
        err = max(err, float(np.max(np.abs(g - w)) / max(1.0, float(np.max(np.abs(w))))))
    return err


# ------------------------------------------------------ softmax over axis 0


@pytest.mark.parametrize("cols", [16384, 16384 + 77])
def test_a_column_softmax_reads_each_column_once(cols: int) -> None:
    """64 × many: a thread per column holds its 64 values in registers after one
    read (through the transpose), so the max, the sum and the output read them there."""
    sm = graph("softmax_axis0")
    job = cuda_job(sm, {0: (64, cols)})
    (k,) = [op for op in job.module.body.ops if isinstance(op, KernelFuncOp)]
    assert k.plan.mapping == "thread-per-row" and k.plan.cached_inputs == (0,)
    (body,) = kernel_bodies(job).values()
    assert global_reads(body) == 1
    assert compile_cuda(source(job), "sm_90")[:4] == b"\x7fELF"


@needs_cxx
def test_a_column_softmax_matches_the_reference_on_the_cpu() -> None:
    sm = graph("softmax_axis0")
    x = np.random.default_rng(0).standard_normal((64, 16384 + 77)).astype(np.float32) * 4
    assert max_error(cuda_job(sm, {0: x.shape}), sm, [x]) <= 1e-5


# ------------------------------------------- reductions over one or both axes


def reductions(rows: int, cols: int) -> SemanticModule:
    """graphs/reductions.mlir at rows × cols: sum over axis 1, max over axis 0 (kept),
    min over axis 1, mean over both."""
    text = (Path(__file__).resolve().parents[2] / "graphs" / "reductions.mlir").read_text()
    text = text.replace("64x128", f"{rows}x{cols}").replace(
        "tensor<64xf32>", f"tensor<{rows}xf32>").replace("1x128xf32", f"1x{cols}xf32")
    return SemanticModule.from_text(text)


def input_reads(job) -> int:  # type: ignore[no-untyped-def]
    """Launches that read argument 0 (through any view of it)."""
    specs = {s.id: s for s in (BufferSpec.from_attr(a)
                               for a in job.module.attributes["target.buffers"].values)}

    def root(i: int) -> BufferSpec:
        while specs[i].kind == "alias":
            i = specs[i].alias_of
        return specs[i]

    return sum(any(root(i).kind == "arg" for i in dict(launch.entries)["buffers"].values)
               for launch in job.module.attributes["target.launches"].values)


def launches(job) -> list[str]:  # type: ignore[no-untyped-def]
    return [dict(launch.entries)["kernel"].value
            for launch in job.module.attributes["target.launches"].values]


def test_sibling_row_reductions_are_one_kernel() -> None:
    """The row sum and the row min of x read it in one launch with two outputs."""
    job = cuda_job(reductions(8192, 4096))
    bodies = kernel_bodies(job)
    two = [name for name, body in bodies.items() if "out1[row]" in body]
    assert len(two) >= 1
    assert global_reads(bodies[two[0]]) == 1
    assert input_reads(job) == 2  # was 4: sum, min, the column max and the mean
    assert compile_cuda(source(job), "sm_90")[:4] == b"\x7fELF"


def test_a_mean_over_both_axes_starts_from_the_row_sum() -> None:
    """successive-reductions: the mean's first level is the row sum already computed
    (one prim.reduce of x over its rows after CSE, not a flat reshape read again)."""
    from accy.pipeline import prepare_through as through

    tensor = through(reductions(8192, 4096), "tensor", RunOptions.parse(CUDA), {}).product
    text = tensor.text()
    assert text.count('"prim.reduce"(%arg0) {kind = "sum"}') == 1
    assert "tensor<4096x8192xf32>" not in text  # no flat view of x


@needs_cxx
@pytest.mark.parametrize("shape", [(64, 128), (256, 1024)])
def test_reductions_match_the_reference_on_the_cpu(shape: tuple[int, int]) -> None:
    sm = reductions(*shape)
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    assert max_error(cuda_job(sm), sm, [x]) <= 1e-5
