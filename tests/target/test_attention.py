"""Attention kernels: the host loop against the reference, the CUDA flash kernel's
spelling, NVRTC compiling it for sm_90 (no GPU needed), and the flash kernel's
indexing and arithmetic run on the CPU (:mod:`cuda_on_cpu`).

On a GPU, ``tests/executable/test_attention_gpu.py`` runs it for real.
Tolerance: max |out − ref| / max |ref| ≤ 1e-5 (f32; the host loop sums in double
like the unfused host kernels, the flash kernel in float in another order).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "preparation"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import cuda_on_cpu  # noqa: E402
from stage_programs import attention, graph  # noqa: E402

from accy.dialects.kernel import KernelFuncOp  # noqa: E402
from accy.executable.cache import FragmentCompilerCache  # noqa: E402
from accy.executable.device import compile_cuda  # noqa: E402
from accy.pipeline import prepare_through  # noqa: E402
from accy.preparation.options import RunOptions  # noqa: E402
from accy.preparation.stages import PreparationRequest  # noqa: E402
from accy.reference import run_reference  # noqa: E402

TOLERANCE = 1e-5

# (batch, M, N, D, Dv, form)
CASES = [((1,), 1, 1, 64, 64, {}), ((2,), 17, 17, 64, 64, {}), ((1,), 128, 128, 64, 64, {}),
         ((3,), 5, 17, 3, 3, {}), ((2,), 33, 70, 16, 8, {"k_rows": False, "scale": "div"}),
         ((), 20, 9, 12, 4, {"scale": "none"}), ((2, 2), 7, 65, 64, 32, {"scale": "lmul"})]
IDS = [f"{'x'.join(map(str, b)) or 'nobatch'}-{m}x{n}x{d}x{dv}{'-' + '-'.join(map(str, f.values())) if f else ''}"
       for b, m, n, d, dv, f in CASES]


def arrays(sm, seed: int = 0) -> list[np.ndarray]:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(tuple(t.shape)).astype(np.float32)
            for t in sm.entry().function_type.inputs]


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    assert got.shape == want.shape and not np.isnan(got).any()
    return float(np.max(np.abs(got.astype(np.float64) - want)) / np.max(np.abs(want)))


def kernels(job) -> list[KernelFuncOp]:  # type: ignore[no-untyped-def]
    return [op for op in job.module.body.ops if isinstance(op, KernelFuncOp)]


# ----------------------------------------------------------------------- host


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_host_loop_computes_attention(case):
    batch, m, n, d, dv, form = case
    sm = attention(batch, m, n, d, dv, **form)
    options = RunOptions.parse("host")
    job = prepare_through(sm, "target", options, {}).product
    assert [k.plan.kind for k in kernels(job)] == ["attention"]
    xs = arrays(sm)
    update = FragmentCompilerCache().refresh_from_semantic_module(
        sm, PreparationRequest(options=options))
    got = update.fragment(*xs)[0]
    assert rel_err(got, run_reference(sm.module, xs)[0]) <= TOLERANCE


def test_fused_and_unfused_host_kernels_agree_on_the_graph():
    sm = graph("attention")
    shapes = {i: (2, 128, 64) for i in range(3)}
    xs = [a.reshape(2, 128, 64) for a in arrays(attention((2,), 128, 128, 64, 64))]
    outs = []
    for opts in ([], ["dispatch.fuse_attention=false"]):
        update = FragmentCompilerCache().refresh_from_semantic_module(
            sm, PreparationRequest(options=RunOptions.parse("host", opts), shapes=shapes))
        assert len(update.fragment.plan.launches) == (1 if not opts else 3)
        outs.append(update.fragment(*xs)[0])
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-6, atol=1e-7)


# ----------------------------------------------------------------------- CUDA


def test_the_flash_kernel_spells_its_plan():
    job = cuda_on_cpu.target_job(attention((512,), 128, 128, 64, 64))
    (k,) = kernels(job)
    text = cuda_on_cpu.job_source(job)
    assert "__launch_bounds__(256, 2) k0_attention(" in text
    assert "extern __shared__ __align__(16) float accy_smem[];" in text
    assert "float* Ps = Ks;" in text  # P reuses K's tile
    assert text.count("__shfl_xor_sync(0xffffffffu, mx, o)") == 1  # the row max, per tile
    assert "__shfl_xor_sync(0xffffffffu, l, o)" in text  # the row sums, once at the end
    assert "reinterpret_cast<const float4*>(Kg + " in text  # float4 loads
    assert "-INFINITY;" in text and "t_ = -INFINITY" not in text  # no ragged keys here
    assert "0x1.0000000000000p-3f" in text  # the scale, exactly
    assert "expf(m_run[r] - mx)" in text and "__expf" not in text
    # no guards where the tiles lie inside the operands (128 rows, 128 keys, 64 columns)
    assert "? __ldg" not in text and "live" not in text
    assert "max.NaN.f32" in text and "mx = accy_fmaxf(mx, o_)" in text
    assert "__device__ __noinline__ void k0_attention_out(" in text
    assert text.count("k0_attention_out(Og + ") == 1  # one call a group, in the row loop
    launches = job.module.attributes["target.launches"].values
    assert launches[0].get("dynamic_shared").value == k.plan.dynamic_shared > 48 * 1024
    binary = compile_cuda(text, "sm_90")
    assert binary[:4] == b"\x7fELF"


def test_ragged_keys_are_masked_and_fast_math_uses_the_intrinsic():
    job = cuda_on_cpu.target_job(attention((2,), 17, 4097, 64, 64), {},
                                 ["target.fast_math=true"])
    text = cuda_on_cpu.job_source(job)
    assert "if (n0 + tx + 16 * c >= 4097) t_ = -INFINITY;" in text
    assert "(n0 + ((tid + 0) / 16) < 4097) ? __ldg(" in text  # the last key tile is ragged
    assert "(i < 17) ? 4 : 0);" in text and "if (live <= 0) return;" in text  # and rows
    assert "__expf(s[r][c] - mx)" in text
    assert compile_cuda(text, "sm_90")[:4] == b"\x7fELF"


VARIANTS = [[], ["kernel.attention_tile_m=128"], ["kernel.attention_tile_n=32"],
            ["kernel.attention_tile_n=128"], ["kernel.attention_threads=128"],
            ["kernel.attention_threads=64", "kernel.attention_tile_m=32"],
            ["kernel.attention_prefetch=true", "kernel.attention_tile_m=64"]]


@pytest.mark.parametrize("opts", VARIANTS, ids=lambda o: ",".join(o) or "default")
def test_flash_variants_compile_for_sm_90(opts):
    text = cuda_on_cpu.job_source(
        cuda_on_cpu.target_job(attention((4,), 130, 129, 64, 64), {}, opts))
    assert compile_cuda(text, "sm_90")[:4] == b"\x7fELF"


@pytest.mark.parametrize("case", CASES + [((2,), 9, 40, 256, 256, {})],
                         ids=IDS + ["2-9x40x256x256"])
def test_flash_shapes_compile_for_sm_90(case):
    batch, m, n, d, dv, form = case
    job = cuda_on_cpu.target_job(attention(batch, m, n, d, dv, **form))
    assert [k.plan.mapping for k in kernels(job)] == ["flash"]
    assert compile_cuda(cuda_on_cpu.job_source(job), "sm_90")[:4] == b"\x7fELF"


# -------------------------------------------------- the flash kernel on the CPU

needs_cxx = pytest.mark.skipif(not cuda_on_cpu.available(), reason="needs g++ (C++20)")


def helpers(text: str, name: str) -> str:
    """The kernel's helper (``<name>_out``: between its comment and
    the kernel) as host C++."""
    start = text.index(f"// {name}'s helpers")
    return "#define __device__\n#define __noinline__\n#define __forceinline__ inline\n" + \
        text[start:text.index('extern "C"', start)]


def run_flash_on_cpu(sm, opts=()) -> float:  # type: ignore[no-untyped-def]
    job = cuda_on_cpu.target_job(sm, {}, opts)
    (k,) = kernels(job)
    xs = arrays(sm)
    out = np.full(tuple(job.entry().function_type.results[0].shape), np.nan, np.float32)
    text = cuda_on_cpu.job_source(job)
    cuda_on_cpu.run(text, k.sym_name, k.plan.grid[0], k.plan.block[0], xs + [out],
                    prelude=helpers(text, k.sym_name))
    return rel_err(out, run_reference(sm.module, xs)[0])


@needs_cxx
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_flash_kernel_computes_attention(case):
    batch, m, n, d, dv, form = case
    assert run_flash_on_cpu(attention(batch, m, n, d, dv, **form)) <= TOLERANCE


@needs_cxx
@pytest.mark.parametrize("opts", VARIANTS[1:], ids=lambda o: ",".join(o))
def test_every_flash_variant_computes_attention(opts):
    assert run_flash_on_cpu(attention((2,), 130, 129, 64, 64), opts) <= TOLERANCE


@needs_cxx
def test_the_flash_kernel_on_long_rows_and_wide_heads():
    assert run_flash_on_cpu(attention((1,), 3, 4097, 64, 64)) <= TOLERANCE
    assert run_flash_on_cpu(attention((1,), 5, 70, 256, 130)) <= TOLERANCE
