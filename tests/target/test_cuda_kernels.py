"""The CUDA renderer's kernels for the kernel stage's newer plans: half-precision
vectors, and every such kernel compiled to a cubin by NVRTC (no GPU needed).

What the kernels compute is checked on a GPU (``tests/executable/test_kernels_gpu.py``);
here: the spelling the plan asks for, and that NVRTC accepts it for ``sm_90``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "preparation"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import cuda_on_cpu  # noqa: E402
from cuda_on_cpu import HOPPER, MMA_SYNC  # noqa: E402
from stage_programs import graph, matmul  # noqa: E402

from accy.dialects.kernel import KernelFuncOp  # noqa: E402
from accy.executable.device import compile_cuda  # noqa: E402
from accy.pipeline import prepare_through  # noqa: E402
from accy.preparation.options import RunOptions  # noqa: E402

CUDA = "cuda:sm_90"


def source(sm, shapes, opts=()) -> str:  # type: ignore[no-untyped-def]
    return cuda_on_cpu.job_source(cuda_on_cpu.target_job(sm, shapes, opts, CUDA))


def cubin(text: str) -> bytes:
    binary = compile_cuda(text, "sm_90")
    assert binary[:4] == b"\x7fELF"
    return binary


# ------------------------------------------------------------------ half vectors


@pytest.mark.parametrize("element,pack", [("bf16", "accy_pack_bf2"), ("f16", "accy_pack_h2")])
def test_half_elementwise_moves_sixteen_bytes_an_access(element: str, pack: str) -> None:
    text = source(graph("bias_gelu", element), {0: (8, 4096)})
    assert "reinterpret_cast<const uint4*>(in0" in text
    assert "*reinterpret_cast<uint4*>(out0 + i) = make_uint4(w" in text  # four words
    assert text.count(f"= {pack}(") == 4  # gelu's two lanes rounded into one word
    assert f"unsigned int {pack}(float lo, float hi)" in text  # the helper it calls
    cubin(text)


def test_bf16_rounds_in_one_instruction() -> None:
    """A bf16 rounding is the packed conversion (one F2FP on sm_90, an ALU op), not
    ``cvt.rn.bf16.f32`` (an F2F, on the pipe the MUFU ops share) nor bit arithmetic,
    which only a target before sm_80 (no bf16 conversion) compiles."""
    text = source(graph("gelu_tanh", "bf16"), {0: (4, 4096)})
    [helper] = re.findall(r"unsigned short accy_f2bf\(float f\) \{(.*?)\n\}", text, re.S)
    sm80, _, before = helper.partition("#else")
    assert sm80.lstrip().startswith("#if __CUDA_ARCH__ >= 800")
    assert 'cvt.rn.bf16x2.f32' in sm80 and "0x7fffu" not in sm80 and "0x7fffu" in before
    assert "cvt.rn.bf16.f32" not in text
    cubin(text)


@pytest.mark.parametrize("element,rounding", [("bf16", "accy_f2bf("), ("f16", "accy_f2h(")])
def test_half_ops_that_pick_an_operand_are_not_rounded(element: str, rounding: str) -> None:
    """elementwise_chain in f32 a lane at a time (its plan's ``packed_ops`` dropped: the
    packed path is ``test_packed_halves``): of its 14 ops neg, abs, max, relu and min
    return an operand that is already a half number, so only the other 9 round, and the
    last of those, sin, only through its store: 8 per lane, 8 lanes (the 4 packed stores
    round through the pack helper)."""
    from accy.target.cuda import emit_kernels

    module = prepare_through(graph("elementwise_chain", element), "kernel",
                             RunOptions.parse(CUDA, []), {0: (8, 4096), 1: (1, 4096)}
                             ).product.clone_module()
    kernels = [op for op in module.body.ops if isinstance(op, KernelFuncOp)]
    for k in kernels:
        k.attributes.pop("packed_ops")
    text = emit_kernels(kernels)
    body = text[text.index("__global__"):]
    assert body.count(rounding) == 8 * 8
    assert "(-t" in body and "fabsf(t" in body
    cubin(text)


TWO_RESULTS = """"builtin.module"() ({
  "func.func"() <{function_type = (tensor<?x64xbf16>, tensor<64xbf16>) ->
      (tensor<?x64xbf16>, tensor<?x64xbf16>), sym_name = "main"}> ({
  ^bb0(%x: tensor<?x64xbf16>, %b: tensor<64xbf16>):
    %0 = "semantic.add"(%x, %b) : (tensor<?x64xbf16>, tensor<64xbf16>) -> tensor<?x64xbf16>
    %1 = "semantic.mul"(%0, %0) : (tensor<?x64xbf16>, tensor<?x64xbf16>) -> tensor<?x64xbf16>
    "func.return"(%0, %1) : (tensor<?x64xbf16>, tensor<?x64xbf16>) -> ()
  }) : () -> ()
}) : () -> ()
"""

EXPM1_SUM = """"builtin.module"() ({
  "func.func"() <{function_type = (tensor<?x?xf32>) -> tensor<?x?xbf16>, sym_name = "main"}> ({
  ^bb0(%x: tensor<?x?xf32>):
    %e = "semantic.exp"(%x) : (tensor<?x?xf32>) -> tensor<?x?xf32>
    %one = "semantic.constant"() {value = dense<1.000000e+00> : tensor<f32>} : () -> tensor<f32>
    %d = "semantic.sub"(%e, %one) : (tensor<?x?xf32>, tensor<f32>) -> tensor<?x?xf32>
    %s = "semantic.reduce_sum"(%d) {axes = array<i64: 1>, keepdims = true} : (tensor<?x?xf32>) -> tensor<?x1xf32>
    %y = "semantic.div"(%e, %s) : (tensor<?x?xf32>, tensor<?x1xf32>) -> tensor<?x?xf32>
    %h = "semantic.cast"(%y) : (tensor<?x?xf32>) -> tensor<?x?xbf16>
    "func.return"(%h) : (tensor<?x?xbf16>) -> ()
  }) : () -> ()
}) : () -> ()
"""


def test_a_stored_value_another_op_reads_is_rounded_first() -> None:
    """``x + b`` is stored and squared: it rounds before both (the square reads the bf16
    value); the square is only stored, so only its store rounds it."""
    from accy.preparation.products import SemanticModule

    sm = SemanticModule.from_text(TWO_RESULTS, "two.mlir")
    text = source(sm, {0: (4, 64)}, ("kernel.vector_width=1",))
    body = text[text.index("__global__"):]
    assert body.count("accy_bf2f(accy_f2bf(") == 1
    [line] = [ln for ln in body.splitlines() if "accy_bf2f(accy_f2bf(" in ln]
    assert " + " in line and " * " not in line
    cubin(text)


def test_gelu_calls_accys_erfc() -> None:
    text = source(graph("bias_gelu"), {0: (8, 4096)})
    assert "accy_erfcf(t" in text and "float accy_erfcf(float x)" in text
    assert " erfcf(" not in text
    cubin(text)


@pytest.mark.parametrize("element,half", [("f32", False), ("bf16", True), ("f16", True)])
def test_gelu_on_half_inputs_calls_the_half_precision_erfc(element: str, half: bool) -> None:
    """gelu's erfc reaches the store through products and a cast to a half type: it
    needs only half precision (:func:`accy.target.cuda.erfc_half_helper`); in f32 it
    is the full erfc."""
    text = source(graph("bias_gelu", None if element == "f32" else element), {0: (8, 4096)})
    body = text[text.index("__global__"):]
    assert ("accy_erfcf_half(" in body) == half
    assert ("accy_erfcf(" in body) == (not half)
    assert ("float accy_erfcf_half(float x)" in text) == half  # the helper, only if called
    cubin(text)


@pytest.mark.parametrize("element,half", [("f32", False), ("bf16", True), ("f16", True)])
def test_gelu_tanh_on_half_inputs_calls_the_half_precision_sigmoid(element: str,
                                                                    half: bool) -> None:
    """gelu's tanh form is ``x·sigmoid(…)``: in halves its sigmoid is an op of the half
    type (rounded at once), so ``accy_sigmoid_half``; in f32 the full ``1 / (1 + expf)``."""
    text = source(graph("gelu_tanh", None if element == "f32" else element), {0: (8, 4096)})
    body = text[text.index("__global__"):]
    assert ("accy_sigmoid_half(" in body) == half and ("expf(" in body) == (not half)
    assert ("rcp.approx.ftz.f32" in text) == half and ("ex2.approx.ftz" in text) == half
    cubin(text)


@pytest.mark.parametrize("name,element,shapes,quotients", [
    ("softmax", "f32", {0: (8, 4096)}, 1),  # exp(x - max) / sum
    ("dynamic", "f32", {0: (8, 4096), 1: (4096,)}, 1),  # (x - mean) / (max|x - mean| + 1)
])
def test_quotients_by_a_row_value_share_its_reciprocal(element: str, name: str, shapes,
                                                        quotients: int) -> None:  # type: ignore[no-untyped-def]
    """A division by a row's statistic makes the divisor's reciprocal once, before the
    column loop, and each quotient is ``accy_fdiv_by`` (IEEE division, bit for bit:
    ``accy.target.cuda.fdiv_helpers``) where it needs f32's accuracy; the row's max is
    one ``accy_fmaxf``."""
    text = source(graph(name, None if element == "f32" else element), shapes)
    body = text[text.index("__global__"):]
    assert " / " not in body
    assert body.count("= accy_fdiv_rcp(") == quotients
    rcp = body.index("accy_fdiv_rcp(")
    assert body.rindex("for (int j", 0, rcp) < body.rindex("}", 0, rcp)  # outside a loop
    assert "accy_fdiv_by(" in body[rcp:] and "float accy_fdiv_by(" in text
    assert "accy_fmaxf(" in body and "max.NaN.f32" in text and "!= acc" not in body
    cubin(text)


@pytest.mark.parametrize("name,shapes", [("softmax", {0: (8, 4096)}),
                                         ("softmax_axis0", {0: (64, 32768)})])
@pytest.mark.parametrize("element", ["f32", "bf16", "f16"])
def test_a_softmax_stored_in_halves_takes_half_precision_exp_and_quotients(
        element: str, name: str, shapes) -> None:  # type: ignore[no-untyped-def]
    """Stored in f16 or bf16, a softmax's exp (its values reach the store through their
    row sum, a sum of values never negative, and quotients) and its quotients need only
    half precision: ``accy_exp_half`` and two products by a scale and a reciprocal made
    once a row, before the column loop — by a block per row and by a thread per row
    alike. In f32 they are ``expf`` and correctly rounded quotients."""
    text = source(graph(name, None if element == "f32" else element), shapes)
    body = text[text.index("__global__"):]
    half = element != "f32"
    assert ("accy_exp_half(" in body) == half and ("expf(" in body) == (not half)
    assert ("float accy_exp_half(float x)" in text) == half
    assert ("= accy_hscale(" in body) == half
    if half:
        assert "accy_fdiv" not in text
        # the reciprocal, once a row (a thread per row makes one for each of its
        # kernel.column_vector rows)
        divides = [ln for ln in body.splitlines() if "1.0f / " in ln]
        assert len(divides) == (2 if name == "softmax_axis0" else 1)
        assert all(d.strip().startswith("const float hr") for d in divides)
        assert " / acc" not in body
        scale = body.index("accy_hscale(")
        assert body.rindex("for (int j", 0, scale) < body.rindex("}", 0, scale)
        quotients = body.count(") * hs")  # ((a) * hs) * hr: one a stored value
        assert quotients == body.count("accy_exp_half(") // 2 or name == "softmax_axis0"
        assert quotients > 0
        if name == "softmax_axis0":  # a transposed store rounds once: its two rows packed
            pack = "accy_pack_bf2" if element == "bf16" else "accy_pack_h2"
            assert body.count(f"{pack}(") == 1 and "accy_f2" not in body
    cubin(text)


@pytest.mark.parametrize("element", ["bf16", "f16"])
def test_a_half_ops_quotient_by_a_row_value_is_two_products(element: str) -> None:
    """dynamic in halves: ``(x - mean) / (max|x - mean| + 1)`` is an op of the half type,
    rounded to it at once, so its quotient need only be right to half precision (then
    ``+ b``, which could cancel, reads the rounded quotient)."""
    text = source(graph("dynamic", element), {0: (8, 4096), 1: (4096,)})
    body = text[text.index("__global__"):]
    assert "accy_fdiv" not in text and body.count("= accy_hscale(") == 1
    assert body.count(") * hs") == 8  # one a lane of the column loop
    cubin(text)


def test_a_sum_of_values_of_either_sign_keeps_f32s_exp() -> None:
    """``exp(x) - 1`` summed over a row in bf16: the sum can cancel, so its exp needs
    f32's accuracy even though the result is stored in a half type."""
    from accy.preparation.products import SemanticModule

    sm = SemanticModule.from_text(EXPM1_SUM, "expm1_sum.mlir")
    text = source(sm, {0: (8, 4096)})
    body = text[text.index("__global__"):]
    assert "expf(" in body and "accy_exp_half(" not in body
    cubin(text)


def test_fast_math_and_elementwise_quotients_keep_the_division() -> None:
    """Under fast math a quotient is CUDA's own; a divisor that changes along the row
    (and any elementwise kernel's) is divided as it is."""
    text = source(graph("softmax"), {0: (8, 4096)}, ["target.fast_math=true"])
    assert "accy_fdiv" not in text
    text = source(graph("gelu_tanh"), {0: (8, 4096)})
    assert "accy_fdiv" not in text


def test_f32_programs_carry_no_half_helpers() -> None:
    text = source(graph("bias_gelu"), {0: (8, 4096)})
    assert "accy_pack_" not in text and "make_float4(" in text


@pytest.mark.parametrize("element", ["bf16", "f16"])
@pytest.mark.parametrize("name,shape", [("softmax", (8, 4096)), ("layernorm", (8, 4096)),
                                        ("rmsnorm", (3, 4096)), ("softmax", (5, 1024))])
def test_half_rows_cache_floats_and_store_packed(element: str, name: str, shape) -> None:  # type: ignore[no-untyped-def]
    text = source(graph(name, element), {0: shape})
    assert "reg0[j][0] = w" in text  # the row held as floats, unpacked once
    assert "*reinterpret_cast<uint" in text
    cubin(text)


@pytest.mark.parametrize("element", ["bf16", "f16"])
@pytest.mark.parametrize("name", ["all_ops", "bias_gelu", "dynamic", "elementwise_chain",
                                  "gelu_tanh", "layernorm", "reductions", "residual_norm",
                                  "rmsnorm", "softmax", "softmax_axis0", "mlp", "attention"])
def test_every_graph_in_half_precision_compiles(element: str, name: str) -> None:
    sm = graph(name, element)
    shapes = {i: tuple(17 if d is None else d for d in t.shape)
              for i, t in enumerate(sm.entry().function_type.inputs)}
    cubin(source(sm, shapes))


# ------------------------------------------------------------ tensor-core matmul


@pytest.mark.parametrize("element", ["bf16", "f16"])
def test_tensor_core_matmul_spells_its_plan(element: str) -> None:
    text = source(matmul(256, 256, 128, element), {}, MMA_SYNC)
    assert f"mma.sync.aligned.m16n8k16.row.col.f32.{element}.{element}.f32" in text
    assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in text
    assert "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in text
    assert "cp.async.cg.shared.global" in text and "cp.async.wait_group 1;" in text
    assert "unsigned short As[3][4096]" in text and "unsigned short Bs[3][4096]" in text
    cubin(text)


@pytest.mark.parametrize("opts", [
    (), ("kernel.stages=2",), ("kernel.stages=4", "kernel.mma_tile_n=64"),
    ("kernel.mma_tile_m=64", "kernel.mma_tile_n=64", "kernel.mma_tile_k=64"),
    ("kernel.mma_tile_m=64",),
    ("kernel.mma_tile_n=64", "kernel.mma_tile_k=64", "kernel.stages=2")])
@pytest.mark.parametrize("element", ["bf16", "f16"])
def test_tensor_core_variants_compile(element: str, opts) -> None:  # type: ignore[no-untyped-def]
    text = source(matmul(128, 256, 192, element, (2,), epilogue=True), {}, opts + MMA_SYNC)
    assert "mma.sync" in text
    cubin(text)


def test_the_mlp_block_in_bf16_runs_both_matmuls_on_tensor_cores() -> None:
    text = source(graph("mlp", "bf16"), {0: (4096, 256)}, MMA_SYNC)
    assert text.count("mma.sync.aligned") == 2
    cubin(text)


# ------------------------------------------------------ Hopper warpgroup matmuls


def target_job(sm, shapes, opts=(), target=HOPPER):  # type: ignore[no-untyped-def]
    """:func:`cuda_on_cpu.target_job` for Hopper unless told."""
    return cuda_on_cpu.target_job(sm, shapes, opts, target)


def hopper_source(sm, shapes, opts=()) -> str:  # type: ignore[no-untyped-def]
    return cuda_on_cpu.job_source(target_job(sm, shapes, opts))


@pytest.mark.parametrize("element", ["bf16", "f16"])
def test_warpgroup_matmul_spells_its_plan(element: str) -> None:
    job = target_job(matmul(256, 256, 128, element), {})
    text = job.source
    assert f"wgmma.mma_async.sync.aligned.m64n128k16.f32.{element}.{element}" in text
    assert "mma.sync" not in text and "ldmatrix" not in text
    assert "extern __shared__ unsigned char smem_raw[];" in text
    for j in range(4):  # B: 64-column slabs, the k-steps of a stage spelled unrolled
        assert f"accy_wgmma_desc(b + {j * 2048}, 8192, 1024)" in text
    # the accumulators are PTX registers of the kernel's own, declared before any branch
    # and never zeroed: a stage's first k-step overwrites them in the first stage (its
    # scale operand is kt), the others add; named in each wgmma (whose only operands are
    # the descriptors and the scale)
    head = text[:text.index("if (tid == 0)")]
    assert ".reg .f32 accy_d0_<64>;" in head and "mov.b32 accy_d0_" not in text
    assert "accy_d0_0, accy_d0_1, " in text and "accy_d0_63}, %0, %1, p" in text
    assert text.count('"l"(da0), "l"(db), "r"(kt) : "memory");') == 1
    assert text.count('"l"(da0), "l"(db), "r"(1) : "memory");') == 3
    assert '"+f"' not in text
    # the matmul's own value, its only output: rounded, packed and stored from the
    # registers in one statement after the last wait (no array, no moves): the pair
    # (0, 1) at the thread's first element, (62, 63) 8 rows and 15 column pairs on
    tail = text[text.index("wgmma.wait_group.sync.aligned 0;"):]
    assert "mov.b32 %" not in tail and "float d[" not in tail
    assert tail.count(".reg .b32 w;") == 1 and tail.count("st.global.b32") == 32
    assert f"cvt.rn.{element}x2.f32 w, accy_d0_1, accy_d0_0;\\nst.global.b32 [%0+0], w;" in tail
    assert (f"cvt.rn.{element}x2.f32 w, accy_d0_63, accy_d0_62;\\n"
            f"st.global.b32 [%0+{8 * 256 * 2 + 15 * 8 * 2}], w;") in tail
    assert "wgmma.wait_group.sync.aligned 1;" in text
    assert text.count("cp.async.bulk.tensor.2d.shared::cluster.global.tile") == 2  # A, B slabs
    assert "mbarrier.try_wait.parity.shared::cta.b64" in text
    # the launch passes its shared memory and names the tensor maps the loader makes:
    # A as 256×128 in 128×64 boxes, B as 128×256 in 64×64
    launch = dict(job.module.attributes["target.launches"].values[0].entries)
    assert launch["dynamic_shared"].value == 4 * (128 + 128) * 64 * 2 + 1024 + 16 * 4
    assert [t.values for t in launch["tensor_maps"].values] == [(0, 256, 128, 128, 64),
                                                                (1, 128, 256, 64, 64)]
    assert compile_cuda(text, "sm_90a")[:4] == b"\x7fELF"
    with pytest.raises(Exception, match="wgmma"):
        compile_cuda(text, "sm_90")  # what sm_90a is for
    # the plain sm_90 target keeps its contract: a unit that -arch=sm_90 compiles
    plain = source(matmul(256, 256, 128, element), {})
    assert "wgmma" not in plain and "mma.sync" in plain
    cubin(plain)


@pytest.mark.parametrize("opts", [
    (), ("kernel.wgmma_tile_n=256",), ("kernel.wgmma_stages=2",),
    ("kernel.wgmma_tile_m=256", "kernel.wgmma_stages=4"),
    ("kernel.wgmma_stages=6", "kernel.wgmma_tile_n=128")])
@pytest.mark.parametrize("element", ["bf16", "f16"])
def test_warpgroup_variants_compile(element: str, opts) -> None:  # type: ignore[no-untyped-def]
    job = target_job(matmul(256, 256, 192, element, (2,), epilogue=True), {}, opts)
    text = job.source
    n = 256 if "kernel.wgmma_tile_n=256" in opts else 128
    per = 2 if "kernel.wgmma_tile_m=256" in opts else 1
    assert f"m64n{n}k16" in text and text.count(f"m64n{n}k16") == 4 * per  # k-steps × slices
    for mt in range(per):  # each 64-row slice: n/2 accumulator registers a thread
        assert f".reg .f32 accy_d{mt}_<{n // 2}>;" in text
        assert f"accy_d{mt}_{n // 2 - 1}}}, %0, %1, p" in text
    assert f"accy_d{per}_" not in text
    assert "setmaxnreg" not in text  # wrong f16 results on the H200 with unrolled K loops
    assert "(int)bz * 256 + m0" in text and "(int)bz * 192 + kt * 64" in text  # batch 2
    launch = dict(job.module.attributes["target.launches"].values[0].entries)
    assert launch["tensor_maps"].values[0].values == (0, 512, 192, 128 * per, 64)
    assert compile_cuda(text, "sm_90a")[:4] == b"\x7fELF"


RASTER_PROGRAM = r"""
#include <stdio.h>
static int min(int a, int b) { return a < b ? a : b; }
struct { int x, y; } blockIdx, gridDim;
static char seen[64][64];
int main(void) {
  int bad = 0;
  for (gridDim.x = 1; gridDim.x <= 9; ++gridDim.x)
    for (gridDim.y = 1; gridDim.y <= 40; ++gridDim.y) {
      for (int i = 0; i < 64; ++i) for (int j = 0; j < 64; ++j) seen[i][j] = 0;
      for (blockIdx.y = 0; blockIdx.y < gridDim.y; ++blockIdx.y)
        for (blockIdx.x = 0; blockIdx.x < gridDim.x; ++blockIdx.x) {
@ORIGIN@
          if (m0 % 128 || n0 % 256 || m0 / 128 >= gridDim.y || n0 / 256 >= gridDim.x
              || m0 < 0 || n0 < 0 || seen[m0 / 128][n0 / 256]++) bad++;
        }
    }
  printf("%d\n", bad);
  return 0;
}
"""


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
@pytest.mark.parametrize("raster", [1, 2, 4, 16])
def test_a_rastered_grid_visits_every_tile_once(tmp_path, raster: int) -> None:  # type: ignore[no-untyped-def]
    """The grouped block order (``KernelPlan.raster``) maps a grid's blocks one to one
    onto its tiles, whatever its shape (a last group of fewer rows included)."""
    from accy.target.cuda import _raster_origin

    src, exe = tmp_path / "raster.c", tmp_path / "raster"
    src.write_text(RASTER_PROGRAM.replace("@ORIGIN@", "\n".join(
        "        " + line for line in _raster_origin(raster, 128, 256))))
    subprocess.run(["cc", "-O1", str(src), "-o", str(exe)], check=True)
    assert subprocess.run([str(exe)], check=True, capture_output=True,
                          text=True).stdout.strip() == "0"


@pytest.mark.parametrize("m,opts,raster", [
    (4096, (), 16), (4096, ("kernel.wgmma_raster=1",), 1),
    (4096, ("kernel.wgmma_raster=4",), 4),
    (2560, (), 16),  # 20 × 8 = 160 blocks: more than a wave
    (2048, (), 1),   # 16 × 8 = 128 blocks: one wave, row-major (WGMMA_WAVE)
    (17 * 128, ("kernel.wgmma_raster=64",), 17)])  # at most the rows of tiles there are
def test_warpgroup_blocks_sweep_rows_of_tiles_together(m: int, opts, raster: int) -> None:  # type: ignore[no-untyped-def]
    """The wgmma plan carries its block order (``kernel.wgmma_raster``, at most the rows
    of tiles there are, and row-major for a grid of one wave) and the kernel spells it."""
    from accy.dialects.kernel import KernelFuncOp

    job = target_job(matmul(m, 1024, 256, "bf16"), {}, opts)
    (k,) = [op for op in job.module.body.ops if isinstance(op, KernelFuncOp)]
    assert k.plan.mapping == "wgmma-tiled" and k.plan.raster == raster
    text = job.source
    assert (f"accy_span = {raster} * gridDim.x" in text) == (raster > 1)
    assert ("const int m0 = blockIdx.y * 128" in text) == (raster == 1)
    assert compile_cuda(text, "sm_90a")[:4] == b"\x7fELF"
def test_warpgroup_tile_width_follows_the_shape() -> None:
    """``wgmma_tile_n`` 0: 256 columns where K is long and the grid keeps a wave of 128
    blocks."""
    from accy.preparation.options import wgmma_tiles

    assert wgmma_tiles(128, 0, 4096, 4096, 4096, 1) == (128, 256)  # 32 × 16 blocks
    assert wgmma_tiles(128, 0, 2048, 2048, 2048, 1) == (128, 256)  # 16 × 8: still a wave
    assert wgmma_tiles(128, 0, 2048, 1024, 2048, 1) == (128, 128)  # 16 × 4: too few
    assert wgmma_tiles(128, 0, 2048, 1024, 2048, 2) == (128, 256)
    assert wgmma_tiles(128, 0, 4096, 4096, 1024, 1) == (128, 128)  # too shallow
    assert wgmma_tiles(256, 0, 4096, 4096, 4096, 1) == (256, 128)
    assert wgmma_tiles(128, 128, 4096, 4096, 4096, 1) == (128, 128)
    assert wgmma_tiles(128, 256, 4096, 4096, 64, 1) == (128, 256)  # asked for


def test_shapes_off_the_warpgroup_tiles_fall_back_to_mma_sync() -> None:
    # 64 rows: not a multiple of the warpgroup block's 128; K = 32: not of 64
    for m, k in ((64, 128), (128, 32)):
        text = hopper_source(matmul(m, 128, k, "bf16"), {}, ("kernel.mma_tile_m=64",))
        assert "mma.sync" in text and "wgmma" not in text
        cubin(text)  # no arch-specific instruction: -arch=sm_90 compiles it too
    # and before Hopper there is no warpgroup kernel at all
    job = target_job(matmul(256, 256, 128, "bf16"), {}, target="cuda:sm_80")
    assert "wgmma" not in job.source


def test_warpgroup_shared_memory_is_checked_against_the_target() -> None:
    from accy.errors import OptionError

    with pytest.raises(OptionError, match="kernel.wgmma_stages=5 of 128×256×64"):
        RunOptions.parse(HOPPER, ["kernel.wgmma_tile_n=256", "kernel.wgmma_stages=5"])
    RunOptions.parse(CUDA, ["kernel.wgmma_tile_n=256", "kernel.wgmma_stages=5"])  # no wgmma
    with pytest.raises(OptionError, match="kernel.wgmma_tile_n must be 0 .by shape., 128 or 256"):
        RunOptions.parse(HOPPER, ["kernel.wgmma_tile_n=64"])


def test_the_mlp_block_in_bf16_runs_both_matmuls_on_warpgroups() -> None:
    text = hopper_source(graph("mlp", "bf16"), {0: (4096, 256)})
    # 4096×1024 (K 256) and 4096×256 (K 1024) in 128×128 blocks: too shallow for 256
    # columns; one wgmma a k-step of 16, four a 64-deep stage, each spelled out
    assert text.count("wgmma.mma_async.sync.aligned.m64n256k16") == 0
    assert text.count("wgmma.mma_async.sync.aligned.m64n128k16") == 8
    wide = hopper_source(graph("mlp", "bf16"), {0: (4096, 256)}, ("kernel.wgmma_tile_n=256",))
    assert wide.count("wgmma.mma_async.sync.aligned.m64n256k16") == 8
    assert compile_cuda(text, "sm_90a")[:4] == b"\x7fELF"



@pytest.mark.parametrize("element", ["f32", "bf16"])
def test_a_unit_of_two_kernels_splits_into_programs_that_compile_alone(element: str) -> None:
    """What a refresh compiles at once: the head (helpers, tables) and one part a kernel,
    each ``head + part`` a unit NVRTC compiles to that kernel alone."""
    from accy.executable.device import compile_cuda_parts, cubins
    from accy.target.common import kernel_parts

    text = hopper_source(graph("mlp", element), {0: (4096, 256)})
    head, parts = kernel_parts(text)
    assert head + "".join(parts) == text and len(parts) == 2
    assert "__global__" not in head
    for name, part in zip(("k0_matmul", "k1_matmul"), parts):
        assert part.count("__global__") == 1 and f" {name}(" in part
    found = cubins(compile_cuda_parts(head, parts, "sm_90a"))
    assert len(found) == 2
    assert found[1] == compile_cuda(head + parts[1], "sm_90a")


# ------------------------------------------------------------ f32 FFMA matmul


def kernel_text(text: str, name: str) -> str:
    """The text of kernel ``name`` in a translation unit."""
    body = text[text.index(f" {name}("):]
    return body[:body.index("\n}\n") + 3]


def test_ffma_matmul_spells_its_plan() -> None:
    text = source(matmul(4096, 4096, 4096, "f32"), {})
    k = kernel_text(text, "k0_matmul")
    assert "__launch_bounds__(256, 2) k0_matmul(" in text
    assert "__shared__ __align__(16) float As[2][8][132];" in k  # A transposed, padded
    assert "__shared__ __align__(16) float Bs[2][8][128];" in k
    assert "la[0] = *reinterpret_cast<const float4*>(ap0 + (kt + 1) * 8);" in k
    assert "As[s ^ 1][ac0 * 4 + 3][ar0] = la[0].w;" in k
    assert "*reinterpret_cast<float4*>(&Bs[s ^ 1][br0][bc0 * 4]) = lb[0];" in k
    assert "&As[s][q][64 + ty * 4]" in k and "&Bs[s][q][64 + tx * 4]" in k
    assert "acc[i][j] = fmaf(ra[i], rb[j], acc[i][j]);" in k
    assert k.count("__syncthreads();") == 2  # the first tile's, then one a k-tile
    assert "*reinterpret_cast<float4*>(Cr + 64) = make_float4(" in k  # no epilogue
    assert "accv" not in k
    cubin(text)


@pytest.mark.parametrize("tiles", [(tm, tn, tk) for tm in (64, 128) for tn in (64, 128)
                                   for tk in (8, 16)])
@pytest.mark.parametrize("epilogue", [False, True])
def test_ffma_variants_compile(tiles, epilogue: bool) -> None:  # type: ignore[no-untyped-def]
    tm, tn, tk = tiles
    opts = (f"kernel.ffma_tile_m={tm}", f"kernel.ffma_tile_n={tn}", f"kernel.ffma_tile_k={tk}")
    text = source(matmul(256, 384, 512, "f32", (2,), epilogue), {}, opts)
    k = kernel_text(text, "k0_matmul")
    assert f"__launch_bounds__({tm * tn // 64}, " in text
    assert f"float As[2][{tk}][{tm + 4}];" in k and f"float Bs[2][{tk}][{tn}];" in k
    # the epilogue takes a sub-tile row's four adjacent columns together: a float4 load
    # of the bias, one float4 store
    assert ("const float accv0 = acc[i][u * 4 + 0];" in k) == epilogue
    assert ("__ldg(reinterpret_cast<const float4*>(in2 + (n)))" in k) == epilogue
    assert ("*reinterpret_cast<float4*>(Cr + " in k) != epilogue
    assert "make_float4(" in k
    cubin(text)


@pytest.mark.parametrize("unroll,pragma", [(1, "#pragma unroll 1"), (4, "#pragma unroll 4"),
                                           (8, "#pragma unroll")])
def test_ffma_unroll_is_the_k_loop_pragma(unroll: int, pragma: str) -> None:
    text = source(matmul(256, 384, 512, "f32", (2,), True), {},
                  (f"kernel.ffma_unroll={unroll}",))
    k = kernel_text(text, "k0_matmul")
    assert f"    {pragma}\n    for (int q = 0; q < 8; ++q) {{" in k
    cubin(text)


def test_ragged_f32_matmuls_keep_the_generic_kernel() -> None:
    text = source(matmul(129, 130, 33, "f32", (2,), epilogue=True), {})
    assert "__shared__ float As[16][65];" in text and "fmaf(ra[i], rb[jj], acc[i][jj])" in text
    assert "float4" not in kernel_text(text, "k0_matmul")
    cubin(text)


# ------------------------------------------------- empty tensors (found on the H200)

EMPTY = '''"builtin.module"() ({
  "func.func"() <{function_type = (tensor<5x0xbf16>, tensor<0x7xf32>) -> (tensor<1x1xbf16>, tensor<5x0xbf16>, tensor<0xf32>, tensor<0x7xf32>), sym_name = "main"}> ({
  ^bb0(%a: tensor<5x0xbf16>, %b: tensor<0x7xf32>):
    %0 = "semantic.rmsnorm"(%a, %a) {axis = 0 : i64, epsilon = 1.0e-05 : f32} : (tensor<5x0xbf16>, tensor<5x0xbf16>) -> tensor<5x0xbf16>
    %1 = "semantic.reduce_max"(%0) {axes = array<i64: 0, 1>, keepdims = true} : (tensor<5x0xbf16>) -> tensor<1x1xbf16>
    %2 = "semantic.softmax"(%a) {axis = -1 : i64} : (tensor<5x0xbf16>) -> tensor<5x0xbf16>
    %3 = "semantic.reduce_sum"(%b) {axes = array<i64: 1>, keepdims = false} : (tensor<0x7xf32>) -> tensor<0xf32>
    %4 = "semantic.softmax"(%b) {axis = 1 : i64} : (tensor<0x7xf32>) -> tensor<0x7xf32>
    "func.return"(%1, %2, %3, %4) : (tensor<1x1xbf16>, tensor<5x0xbf16>, tensor<0xf32>, tensor<0x7xf32>) -> ()
  }) : () -> ()
}) : () -> ()'''


def test_kernels_over_empty_tensors_compile_and_run_with_their_identities() -> None:
    """No rows or no columns: one block that returns (never a grid of 0), a column
    loop that reads nothing (never a register array of 0), reductions that give
    their identities. The CUDA compiles; the host computes what the reference does."""
    import numpy as np

    from accy.executable.cache import FragmentCompilerCache
    from accy.preparation.products import SemanticModule
    from accy.preparation.stages import PreparationRequest
    from accy.reference import run_reference

    sm = SemanticModule.from_text(EMPTY)
    cubin(source(sm, {}))
    xs = [np.zeros((5, 0), np.float32), np.zeros((0, 7), np.float32)]
    got = FragmentCompilerCache().refresh_from_semantic_module(
        sm, PreparationRequest()).fragment(*xs)
    want = run_reference(sm.module, xs)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g, dtype=np.float32),
                                      np.asarray(w, dtype=np.float32))


def test_a_matmul_over_an_empty_batch_touches_no_memory() -> None:
    """Batch 0 (0x4x2 @ 2x3): the launch's one block returns before any load or store
    (it read and wrote batch 0 of empty buffers on the H200: an illegal address)."""
    from accy.preparation.products import SemanticModule

    sm = SemanticModule.from_text('''"builtin.module"() ({
  "func.func"() <{function_type = (tensor<0x4x2xf16>, tensor<2x3xf16>) -> tensor<0x4x3xf16>, sym_name = "main"}> ({
  ^bb0(%a: tensor<0x4x2xf16>, %b: tensor<2x3xf16>):
    %0 = "semantic.matmul"(%a, %b) : (tensor<0x4x2xf16>, tensor<2x3xf16>) -> tensor<0x4x3xf16>
    "func.return"(%0) : (tensor<0x4x3xf16>) -> ()
  }) : () -> ()
}) : () -> ()''')
    text = source(sm, {})
    body = text[text.index("const long long bz = blockIdx.z;"):]
    assert body.index("if (bz >= 0) return;") < body.index("As[")  # before any access
    cubin(text)
