"""The kernel stage's newer kernels against the reference interpreter, on a GPU.

Half precision (vector loads/stores, math in f32), with random shapes that
include ragged edges. Tolerances: ``max |out − ref| / max |ref|`` at most
``TOLERANCE[element]`` (f32: the float32 rounding test of ``test_fragments``;
f16: 4e-3 and bf16: 3e-2 — a few units in the last place of the element type,
since a reduction summed in another order can round one intermediate the other
way, and the ops after it see that ulp).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "preparation"))
from stage_programs import graph, matmul, with_element  # noqa: E402

from accy.dialects.kernel import KernelFuncOp  # noqa: E402
from accy.executable.cache import FragmentCompilerCache  # noqa: E402
from accy.executable.device import local_arch  # noqa: E402
from accy.pipeline import prepare_through  # noqa: E402
from accy.preparation.options import RunOptions  # noqa: E402
from accy.preparation.stages import PreparationRequest  # noqa: E402
from accy.reference import run_reference  # noqa: E402

TOLERANCE = {"f32": 2e-5, "f16": 4e-3, "bf16": 3e-2}

pytestmark = pytest.mark.gpu


def run_graph(name: str, element: str, dims: dict[str, int], options=(), seed: int = 0,  # type: ignore[no-untyped-def]
              target: str = "cuda"):
    """Run graph ``name`` in ``element`` on the GPU and the reference; the relative error.

    A leading ``?`` of an argument is ``dims["rows"]``, any other ``?`` is
    ``dims["cols"]`` (so ``?x?``, ``1x?`` and ``?`` line up as the graphs mean).
    """
    sm = graph(name, element if element != "f32" else None)
    rng = np.random.default_rng(seed)
    arrays, shapes = [], {}
    for i, t in enumerate(sm.entry().function_type.inputs):
        shape = tuple((dims["rows"] if j == 0 and len(t.shape) > 1 else dims["cols"])
                      if d is None else d for j, d in enumerate(t.shape))
        if not t.is_static:
            shapes[i] = shape
        a = rng.standard_normal(shape).astype(np.float32)
        arrays.append(a.astype(np.float16) if element == "f16" else a)
    update = FragmentCompilerCache().refresh_from_semantic_module(
        sm, PreparationRequest(options=RunOptions.parse(target, list(options)), shapes=shapes))
    got = update.fragment(*arrays)
    want = run_reference(sm.module, arrays)
    errs = []
    for g, w in zip(got, want):
        g = np.asarray(g, np.float64)
        w = np.asarray(w, np.float64)
        assert g.shape == w.shape
        assert np.array_equal(np.isnan(g), np.isnan(w))
        ok = ~np.isnan(w)
        scale = max(float(np.max(np.abs(w[ok]))) if ok.any() else 0.0, 1e-30)
        errs.append(float(np.max(np.abs(g[ok] - w[ok]))) / scale if ok.any() else 0.0)
    return max(errs)


ROWS = ["bias_gelu", "gelu_tanh", "layernorm", "rmsnorm", "softmax", "residual_norm",
        "elementwise_chain", "dynamic"]


@pytest.mark.parametrize("element", ["bf16", "f16"])
@pytest.mark.parametrize("name", ROWS)
@pytest.mark.parametrize("rows", [1, 17, 300])
def test_half_row_programs(name: str, element: str, rows: int) -> None:
    dims = {"rows": rows, "cols": 4096}
    assert run_graph(name, element, dims) <= TOLERANCE[element]


@pytest.mark.parametrize("element", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("name", ["elementwise_chain", "bias_gelu"])
@pytest.mark.parametrize("prefetch", [True, False])
def test_elementwise_kernels_that_prefetch(name: str, element: str, prefetch: bool) -> None:
    """More vectors than the 4096 blocks' threads (f32: 1100 rows, halves: 2100, of
    4104 columns, bias_gelu's 4096), so some threads prefetch a second vector and the
    others their own again (f32; the halves' kernels never prefetch, but run the same
    grid); with ``prefetch`` the registers capped at 32 too (``max_registers``)."""
    dims = {"rows": 1100 if element == "f32" else 2100,
            "cols": 4104 if name == "elementwise_chain" else 4096}
    options = ("kernel.prefetch=true", "kernel.max_registers=32") if prefetch else ()
    assert run_graph(name, element, dims, options) <= TOLERANCE[element]


@pytest.mark.parametrize("element", ["bf16", "f16"])
@pytest.mark.parametrize("cols", [8, 17, 1024, 2048, 4097])
def test_half_softmax_ragged_columns(element: str, cols: int) -> None:
    assert run_graph("softmax", element, {"rows": 33, "cols": cols}) <= TOLERANCE[element]


@pytest.mark.parametrize("element", ["bf16", "f16"])
@pytest.mark.parametrize("options", [("kernel.vector_width=2",), ("kernel.vector_width=1",),
                                     ("dispatch.fuse=false",), ("memory.reuse=false",)])
def test_half_variants(element: str, options) -> None:  # type: ignore[no-untyped-def]
    for name in ("layernorm", "bias_gelu", "elementwise_chain"):
        assert run_graph(name, element, {"rows": 19, "cols": 4096}, options) \
            <= TOLERANCE[element]


# ------------------------------------------------------------ tensor-core matmul


def run_module(sm, arrays, options=(), target: str = "cuda") -> float:  # type: ignore[no-untyped-def]
    """Run ``sm`` compiled for ``target`` and the reference; the relative error."""
    update = FragmentCompilerCache().refresh_from_semantic_module(
        sm, PreparationRequest(options=RunOptions.parse(target, list(options))))
    got = update.fragment(*arrays)
    want = run_reference(sm.module, arrays)
    errs = []
    for g, w in zip(got, want):
        g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
        assert g.shape == w.shape
        errs.append(float(np.max(np.abs(g - w))) / max(float(np.max(np.abs(w))), 1e-30))
    return max(errs)


@pytest.mark.parametrize("element", ["bf16", "f16"])
@pytest.mark.parametrize("m,n,k,batch", [(128, 128, 32, ()), (256, 384, 96, ()),
                                         (512, 256, 1024, ()), (128, 256, 64, (3,)),
                                         (256, 512, 192, ()), (384, 256, 128, (2,)),
                                         (1, 17, 4097, ()), (17, 4097, 64, ()),
                                         (129, 130, 33, ())])
@pytest.mark.parametrize("epilogue", [False, True])
def test_half_matmuls(element: str, m: int, n: int, k: int, batch, epilogue: bool) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(m * n + k)
    shapes = [batch + (m, k), batch + (k, n)] + ([(n,)] if epilogue else [])
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    if element == "f16":
        arrays = [a.astype(np.float16) for a in arrays]
    err = run_module(matmul(m, n, k, element, batch, epilogue), arrays)
    assert err <= TOLERANCE[element], err


@pytest.mark.parametrize("opts", [("kernel.stages=2",), ("kernel.stages=4", "kernel.mma_tile_n=64"),
                                  ("kernel.mma_tile_m=64", "kernel.mma_tile_n=64",
                                   "kernel.mma_tile_k=64")])
def test_tensor_core_variants(opts) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in [(256, 512), (512, 384), (384,)]]
    err = run_module(matmul(256, 384, 512, "bf16", (), True), arrays,
                     opts + ("kernel.wgmma=false",))  # the mma.sync tiles, also on sm_90
    assert err <= TOLERANCE["bf16"], err


@pytest.mark.parametrize("opts", [(), ("kernel.wgmma_tile_n=256",), ("kernel.wgmma_stages=2",),
                                  ("kernel.wgmma_raster=1",), ("kernel.wgmma_raster=3",),
                                  ("kernel.wgmma_raster=7",),
                                  ("kernel.wgmma_stages=6", "kernel.wgmma_tile_n=128"),
                                  ("kernel.wgmma_tile_m=256", "kernel.wgmma_stages=3"),
                                  ("kernel.wgmma_tile_n=256", "kernel.wgmma_stages=3")])
@pytest.mark.parametrize("element", ["bf16", "f16"])
def test_warpgroup_variants(element: str, opts) -> None:  # type: ignore[no-untyped-def]
    """The sm_90 warpgroup kernel at each tile width and pipeline depth, with a batch,
    a fused epilogue, and K from one stage (64) to more stages than the pipeline."""
    # (2560 × 1024: 20 × 8 tiles of 128, more than a wave, grouped by 16, 3 or 4 rows
    # of tiles with a last short group; 10 rows of 256-row tiles)
    for (m, n, k, batch) in ((256, 512, 640, ()), (256, 256, 64, (2,)), (768, 768, 128, ()),
                             (2560, 1024, 128, ())):
        rng = np.random.default_rng(m + n + k)
        arrays = [rng.standard_normal(s).astype(np.float32)
                  for s in [batch + (m, k), batch + (k, n), (n,)]]
        if element == "f16":
            arrays = [a.astype(np.float16) for a in arrays]
        sm = matmul(m, n, k, element, batch, True)
        job = prepare_through(sm, "kernel", RunOptions.parse("cuda", list(opts)), {}).product
        mappings = [op.plan.mapping for op in job.module.body.ops if isinstance(op, KernelFuncOp)]
        if local_arch() == "sm_90":
            assert mappings == ["wgmma-tiled"]
        err = run_module(sm, arrays, opts)
        assert err <= TOLERANCE[element], (m, n, k, err)


@pytest.mark.parametrize("element", ["bf16", "f16"])
def test_half_mlp_block(element: str) -> None:
    assert run_graph("mlp", element, {"rows": 256, "cols": 256}) <= TOLERANCE[element]


# ------------------------------------------------------------ f32 FFMA matmul


def matmul_plan(sm, options=()) -> dict:  # type: ignore[no-untyped-def]
    """The kernel stage's plan of ``sm``'s one matmul kernel (its attributes)."""
    from accy.dialects.kernel import KernelFuncOp
    from accy.pipeline import prepare_through

    job = prepare_through(sm, "kernel", RunOptions.parse("cuda", list(options)), {}).product
    (k,) = [op for op in job.module.body.ops if isinstance(op, KernelFuncOp)
            and op.plan.kind == "matmul"]
    return {"mapping": k.plan.mapping, "tile": k.plan.tile}


@pytest.mark.parametrize("m,n,k,batch,mapping", [
    (128, 128, 8, (), "ffma-tiled"), (256, 384, 64, (), "ffma-tiled"),
    (512, 512, 1024, (), "ffma-tiled"), (1024, 1024, 256, (), "ffma-tiled"),
    (128, 256, 64, (3,), "ffma-tiled"), (64, 192, 40, (2, 3), "ffma-tiled"),
    (1, 17, 4097, (), "tiled"), (17, 4097, 64, (), "tiled"), (129, 130, 33, (), "tiled"),
    (4097, 128, 64, (), "tiled"), (128, 128, 12, (2,), "tiled")])
@pytest.mark.parametrize("epilogue", [False, True])
def test_f32_matmuls(m: int, n: int, k: int, batch, mapping: str, epilogue: bool) -> None:  # type: ignore[no-untyped-def]
    """f32 matmuls on the register-blocked FFMA kernel where the shapes divide its tiles
    (plain stores or the fused bias + relu), the generic tiles where they do not."""
    sm = matmul(m, n, k, "f32", batch, epilogue)
    assert matmul_plan(sm)["mapping"] == mapping
    rng = np.random.default_rng(m * n + k)
    shapes = [batch + (m, k), batch + (k, n)] + ([(n,)] if epilogue else [])
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    err = run_module(sm, arrays)
    assert err <= TOLERANCE["f32"], err


@pytest.mark.parametrize("tiles", [(64, 64, 8), (64, 128, 8), (128, 64, 16), (128, 128, 16),
                                   (64, 64, 16), (128, 128, 8)])
@pytest.mark.parametrize("epilogue", [False, True])
def test_ffma_tile_variants(tiles, epilogue: bool) -> None:  # type: ignore[no-untyped-def]
    tm, tn, tk = tiles
    opts = [f"kernel.ffma_tile_m={tm}", f"kernel.ffma_tile_n={tn}", f"kernel.ffma_tile_k={tk}"]
    sm = matmul(256, 384, 512, "f32", (2,), epilogue)
    assert matmul_plan(sm, opts) == {"mapping": "ffma-tiled", "tile": tiles}
    rng = np.random.default_rng(5)
    shapes = [(2, 256, 512), (2, 512, 384)] + ([(384,)] if epilogue else [])
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    err = run_module(sm, arrays, opts)
    assert err <= TOLERANCE["f32"], err


@pytest.mark.parametrize("unroll", [1, 2, 4, 16])
def test_ffma_unroll_variants(unroll: int) -> None:
    opts = ["kernel.ffma_tile_k=16", f"kernel.ffma_unroll={unroll}"]
    sm = matmul(256, 384, 512, "f32", (2,), True)
    rng = np.random.default_rng(6)
    arrays = [rng.standard_normal(s).astype(np.float32)
              for s in ((2, 256, 512), (2, 512, 384), (384,))]
    assert run_module(sm, arrays, opts) <= TOLERANCE["f32"]


def test_f32_mlp_block_runs_both_matmuls_on_the_ffma_kernel() -> None:
    """The MLP block at 256 rows: x @ w1 (+ b1, gelu) reads an argument, the second
    matmul the first's result in the arena; both on ffma-tiled."""
    from accy.pipeline import prepare_through

    sm = graph("mlp")
    job = prepare_through(sm, "kernel", RunOptions.parse("cuda"), {0: (256, 256)}).product
    assert job.text().count('mapping = "ffma-tiled"') == 2
    assert run_graph("mlp", "f32", {"rows": 256, "cols": 256}) <= TOLERANCE["f32"]


def test_an_unaligned_arena_operand_runs_the_generic_tiles() -> None:
    """A matmul reading an intermediate at arena byte 12 (memory.alignment=4) runs the
    generic tiles, at byte 16 the FFMA kernel: both match the reference."""
    from stage_programs import offset_matmul

    sm = offset_matmul(128, 64, 128)
    rng = np.random.default_rng(7)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in [(3,), (128, 64), (64, 128)]]
    for alignment, mapping in ((4, "tiled"), (16, "ffma-tiled")):
        opts = ["dispatch.fuse=false", f"memory.alignment={alignment}"]
        assert matmul_plan(sm, opts)["mapping"] == mapping
        assert run_module(sm, arrays, opts) <= TOLERANCE["f32"]



@pytest.mark.parametrize("element", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("cols", [16384, 20001])
def test_column_softmax_runs_a_thread_per_column(element: str, cols: int) -> None:
    """softmax over axis 0 of 64 × many columns: the thread-per-row mapping (each thread
    walks one column; a warp reads 32 neighbouring addresses), ragged grids included."""
    from accy.pipeline import prepare_through

    sm = graph("softmax_axis0", element if element != "f32" else None)
    job = prepare_through(sm, "kernel", RunOptions.parse("cuda"), {0: (64, cols)}).product
    assert "thread-per-row" in job.text()
    assert run_graph("softmax_axis0", element, {"rows": 64, "cols": cols}) <= \
        TOLERANCE[element] * (1 if element != "f32" else 5)


@pytest.mark.parametrize("split", [1, 2, 4, 8])
@pytest.mark.parametrize("element", ["f32", "bf16", "f16"])
def test_column_softmax_split_over_threads(element: str, split: int) -> None:
    """``kernel.column_split``: 1, 2, 4 or 8 threads share a column of the softmax over
    axis 0, their max and sum combined through shared memory; 20001 columns leave the
    grid's last block ragged."""
    tol = TOLERANCE[element] * (1 if element != "f32" else 5)
    assert run_graph("softmax_axis0", element, {"rows": 64, "cols": 20001},
                     [f"kernel.column_split={split}"]) <= tol


@pytest.mark.parametrize("vec,split", [(2, 0), (4, 0), (8, 0), (8, 8), (4, 1)])
@pytest.mark.parametrize("element", ["f32", "bf16", "f16"])
def test_column_softmax_of_several_columns_a_thread(element: str, vec: int,
                                                     split: int) -> None:
    """``kernel.column_vector``: a thread owns 2, 4 or 8 neighbouring columns (at most 16
    bytes), one vector load and store a step; 20008 columns (2501 vectors of 8) leave the
    grid's last block ragged."""
    tol = TOLERANCE[element] * (1 if element != "f32" else 5)
    assert run_graph("softmax_axis0", element, {"rows": 64, "cols": 20008},
                     [f"kernel.column_vector={vec}", f"kernel.column_split={split}"]) <= tol


@pytest.mark.parametrize("element", ["f32", "bf16", "f16"])
def test_long_reductions_split_in_two_match_the_reference(element: str) -> None:
    """graphs/reductions.mlir at 8192 × 4096: the column max is split
    (split-reductions), the mean starts from the row sums (successive-reductions; in
    halves from f32 row sums of the cast input, in the row kernel); the reductions
    write the results (four launches); every output matches the reference."""
    from accy.preparation.products import SemanticModule

    text = (Path(__file__).resolve().parents[2] / "graphs" / "reductions.mlir").read_text()
    for old, new in (("64x128", "8192x4096"), ("tensor<64x", "tensor<8192x"),
                     ("1x128", "1x4096")):
        text = text.replace(old, new)
    text = with_element(text, element)
    sm = SemanticModule.from_text(text)
    x = np.random.default_rng(3).standard_normal((8192, 4096)).astype(np.float32)
    if element == "f16":
        x = x.astype(np.float16)
    update = FragmentCompilerCache().refresh_from_semantic_module(
        sm, PreparationRequest(options=RunOptions.parse("cuda")))
    assert len(update.fragment.plan.launches) == 4
    got = update.fragment(x)
    want = run_reference(SemanticModule.from_text(text).module, [x])
    ulp = 2.0 ** (-7 if element == "bf16" else -10)  # halves: an ulp of the largest result
    for g, w in zip(got, want, strict=True):
        if element == "f32":
            np.testing.assert_allclose(np.asarray(g), w, rtol=1e-4, atol=1e-4)
            continue
        w = np.asarray(w, np.float64)
        scale = max(1.0, float(np.max(np.abs(w))))
        assert float(np.max(np.abs(np.asarray(g, np.float64) - w))) <= ulp * scale


ERFC = '''"builtin.module"() ({
  "func.func"() <{function_type = (tensor<?xf32>) -> tensor<?xf32>, sym_name = "main"}> ({
  ^bb0(%x: tensor<?xf32>):
    %0 = "semantic.erfc"(%x) : (tensor<?xf32>) -> tensor<?xf32>
    "func.return"(%0) : (tensor<?xf32>) -> ()
  }) : () -> ()
}) : () -> ()'''


def test_erfc_on_the_device_is_within_six_ulp() -> None:
    """The device build of ``accy_erfcf`` (``rcp.approx`` and CUDA's ``expf``; the host
    build is ``tests/target/test_erfc_helper.py``) at every 97th f32 of [0, 10.06] and
    their negatives, against the float64 erfc of :mod:`accy.numerics`."""
    from accy.numerics import erfc
    from accy.preparation.products import SemanticModule

    a = np.arange(0, 0x4120F5C3, 97, dtype=np.uint32).view(np.float32)
    x = np.concatenate([a, -a])
    update = FragmentCompilerCache().refresh_from_semantic_module(
        SemanticModule.from_text(ERFC, "erfc.mlir"),
        PreparationRequest(options=RunOptions.parse("cuda", []), shapes={0: x.shape}))
    got = np.asarray(update.fragment(x)[0], np.float64)
    want = erfc(x.astype(np.float64))
    wf = want.astype(np.float32)
    ok = wf >= np.float32(1.2e-38)  # normal results (a denormal's ulp is another)
    ulp = np.spacing(wf[ok]).astype(np.float64)
    err = np.abs(got[ok] - want[ok]) / ulp
    assert err.max() <= 6.0, (float(err.max()), float(x[ok][np.argmax(err)]))
    assert np.all(got[~ok] <= 1.2e-38)


HALF_OP = '''"builtin.module"() ({
  "func.func"() <{function_type = (tensor<?xf32>) -> tensor<?xELEMENT>, sym_name = "main"}> ({
  ^bb0(%x: tensor<?xf32>):
    %0 = "semantic.OP"(%x) : (tensor<?xf32>) -> tensor<?xf32>
    %1 = "semantic.cast"(%0) : (tensor<?xf32>) -> tensor<?xELEMENT>
    "func.return"(%1) : (tensor<?xELEMENT>) -> ()
  }) : () -> ()
}) : () -> ()'''


@pytest.mark.parametrize("op", ["exp", "sigmoid", "erfc"])
@pytest.mark.parametrize("element", ["bf16", "f16"])
def test_half_precision_exp_sigmoid_and_erfc_on_the_device_round_to_a_neighbour(
        element: str, op: str) -> None:
    """``exp``, ``sigmoid`` and ``erfc`` stored in a half type are ``accy_exp_half``,
    ``accy_sigmoid_half`` and ``accy_erfcf_half`` (on the device ``exp2f``; and
    ``ex2.approx.ftz`` with ``rcp.approx.ftz``; the host builds are
    ``tests/target/test_half_quotients.py`` and ``test_erfc_helper.py``): at every 61st
    f32 of the range where the result is finite (sigmoid: where ``exp(-x)`` is; erfc:
    ``[-10.06, 10.06]``), the stored value is within half a unit of the type (its
    subnormal unit below its least normal) plus ``2^-16.6`` of the float64 value: the
    nearest value, or its neighbour where that lies so close to a midpoint."""
    from accy.numerics import erfc
    from accy.pipeline import prepare_through
    from accy.preparation.products import SemanticModule

    a = np.arange(0, 0x42D00000, 61, dtype=np.uint32).view(np.float32)  # [0, 104)
    if op == "exp":
        x = np.concatenate([a[a < (88.7 if element == "bf16" else 11.08)], -a])
    elif op == "sigmoid":
        x = np.concatenate([a, -a[a < 88.7]])
    else:
        x = np.concatenate([a[a <= 10.06], -a[a <= 10.06]])
    sm = SemanticModule.from_text(HALF_OP.replace("ELEMENT", element).replace("OP", op),
                                  f"{op}.mlir")
    job = prepare_through(sm, "target", RunOptions.parse("cuda"), {0: x.shape}).product
    helper = "accy_erfcf_half(" if op == "erfc" else f"accy_{op}_half("
    assert helper in job.source
    update = FragmentCompilerCache().refresh_from_semantic_module(
        sm, PreparationRequest(options=RunOptions.parse("cuda", []), shapes={0: x.shape}))
    got = np.asarray(update.fragment(x)[0], np.float64)
    x64 = x.astype(np.float64)
    want = {"exp": np.exp, "sigmoid": lambda v: 1.0 / (1.0 + np.exp(-v)), "erfc": erfc}[op](x64)
    bits, least = (7, 2.0 ** -133) if element == "bf16" else (10, 2.0 ** -24)
    normal = 2.0 ** (-126 if element == "bf16" else -14)
    unit = np.where(want >= normal, 2.0 ** (np.floor(np.log2(np.maximum(want, normal)))
                                             - bits), least)
    err = np.abs(got - want) - (0.5 * unit + want * 2.0 ** -16.6)
    assert err.max() <= 0, (float(err.max()), float(x[np.argmax(err)]))


def test_quotients_by_a_shared_divisor_are_ieee_division_on_the_device() -> None:
    """The device build of ``accy_fdiv_by`` (the reciprocal from ``rcp.approx``) over
    every ``a`` mantissa at every 4096th ``b`` mantissa, and at the ends of its short
    path's range and past them, bit for bit against ``__fdiv_rn`` and the float64
    quotient (``benchmarks/fdiv_check.py`` runs every pair)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import fdiv_check

    runs = [fdiv_check.check(0, 0, False, 4096)] + [fdiv_check.check(*c)
                                                     for c in fdiv_check.CASES]
    assert all(r["pairs"] >= 2048 << 23 and r["checked_f64"] > 0 for r in runs)
    assert [(r["ea"], r["eb"], r["mismatch_ieee"], r["mismatch_f64"]) for r in runs] == \
        [(r["ea"], r["eb"], 0, 0) for r in runs]
