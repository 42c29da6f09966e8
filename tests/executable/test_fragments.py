"""Compiled fragments against the reference interpreter: host in CI, CUDA on a GPU."""

from __future__ import annotations

import glob
import os

import numpy as np
import pytest

from accy.errors import FragmentCompileError
from accy.executable.cache import FragmentCompilerCache
from accy.executable.compile import compile_fragment
from accy.executable.device import cubins
from accy.pipeline import prepare_through
from accy.preparation.options import RunOptions
from accy.preparation.products import SemanticModule
from accy.preparation.stages import PreparationRequest
from accy.reference import run_reference

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GRAPHS = sorted(glob.glob(os.path.join(ROOT, "graphs", "*.mlir")))


def _inputs(sm: SemanticModule, dyn: int, seed: int = 0) \
        -> tuple[list[np.ndarray], dict[int, tuple[int, ...]]]:
    rng = np.random.default_rng(seed)
    arrays, shapes = [], {}
    for i, t in enumerate(sm.entry().function_type.inputs):
        shape = tuple(dyn if d is None else d for d in t.shape)
        if not t.is_static:
            shapes[i] = shape
        arrays.append(rng.standard_normal(shape).astype(np.float32))
    return arrays, shapes


def _check(out: list[np.ndarray], ref: list[np.ndarray], rtol: float = 2e-5,
           atol: float = 2e-5) -> None:
    """Equal to the float64 reference within float32 rounding.

    The absolute tolerance scales with the result's magnitude: a float32
    accumulation over K terms (a matmul) errs relative to the size of its
    terms, not of the (possibly cancelling) sum.
    """
    assert len(out) == len(ref)
    for o, r in zip(out, ref):
        o = np.asarray(o)
        assert o.shape == r.shape and o.dtype == r.dtype
        r64 = r.astype(np.float64)
        scale = float(np.max(np.abs(r64))) if r64.size else 0.0
        np.testing.assert_allclose(o.astype(np.float64), r64, rtol=rtol,
                                   atol=max(atol, 4e-6 * scale))


def _run(path: str, target: str, dyn: int, options: tuple[str, ...] = ()) -> None:
    sm = SemanticModule.from_file(path)
    arrays, shapes = _inputs(sm, dyn)
    cache = FragmentCompilerCache()
    update = cache.refresh_from_semantic_module(
        sm, PreparationRequest(source=path, options=RunOptions.parse(target, options),
                               shapes=shapes))
    assert update.fragment is not None
    out = update.fragment(*arrays)
    _check([np.asarray(o) for o in out], run_reference(sm.module, arrays))


@pytest.mark.parametrize("path", GRAPHS, ids=lambda p: os.path.basename(p))
def test_host_fragment_matches_reference(path: str) -> None:
    _run(path, "host", 37)


@pytest.mark.parametrize("name,dyn", [("dynamic.mlir", 1), ("elementwise_chain.mlir", 1),
                                      ("softmax.mlir", 1), ("elementwise_chain.mlir", 1027),
                                      ("dynamic.mlir", 129)])
def test_host_edge_shapes(name: str, dyn: int) -> None:
    _run(os.path.join(ROOT, "graphs", name), "host", dyn)


@pytest.mark.parametrize("element", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("rows,cols", [(1, 1), (1, 4097), (17, 17), (4097, 1), (17, 4097),
                                       (4097, 17), (256, 1024)])
def test_host_reductions_in_every_element_type_match_the_reference(element: str, rows: int,
                                                                   cols: int) -> None:
    """graphs/reductions.mlir (the results written by the reductions, the half mean from
    f32 row sums) on ragged shapes: f32 within float32 rounding, halves within an ulp."""
    import re

    with open(os.path.join(ROOT, "graphs", "reductions.mlir")) as f:
        text = f.read().replace("64x128", f"{rows}x{cols}").replace(
            "tensor<64x", f"tensor<{rows}x").replace("1x128", f"1x{cols}")
    sm = SemanticModule.from_text(re.sub(r"(tensor<(?:[0-9?]+x)*)f32>", rf"\g<1>{element}>",
                                         text))
    x = np.random.default_rng(rows + cols).standard_normal((rows, cols)).astype(np.float32)
    if element == "f16":
        x = x.astype(np.float16)
    got = FragmentCompilerCache().refresh_from_semantic_module(
        sm, PreparationRequest(options=RunOptions.parse("host"))).fragment(x)
    want = run_reference(sm.module, [x])
    if element == "f32":
        _check([np.asarray(g) for g in got], want)
        return
    ulp = 2.0 ** (-7 if element == "bf16" else -10)
    for g, w in zip(got, want, strict=True):
        g64, w64 = np.asarray(g, np.float64), w.astype(np.float64)
        assert g64.shape == w64.shape
        np.testing.assert_allclose(g64, w64, rtol=ulp, atol=ulp)


@pytest.mark.parametrize("path", GRAPHS, ids=lambda p: os.path.basename(p))
def test_every_graph_compiles_to_a_cubin(path: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    sm = SemanticModule.from_file(path)
    _, shapes = _inputs(sm, 64)
    job = prepare_through(sm, "target", RunOptions.parse("cuda:sm_90"), shapes).product
    compiled = compile_fragment(job, str(tmp_path))  # type: ignore[arg-type]
    # one cubin a kernel: a refresh compiles a unit's kernels as programs of their own
    kernels = {launch.kernel for launch in compiled.plan.launches}
    found = cubins(compiled.binary)
    assert len(found) == len(kernels) and all(c[:4] == b"\x7fELF" for c in found)
    assert (compiled.binary[:4] == b"\x7fELF") == (len(kernels) == 1)
    assert compiled.plan.language == "cuda" and compiled.plan.launches


def test_compile_error_carries_the_log(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from accy.choir.attributes import StringAttr

    sm = SemanticModule.from_file(os.path.join(ROOT, "graphs", "softmax.mlir"))
    job = prepare_through(sm, "target", RunOptions.parse("cuda:sm_90"), {0: (4, 4096)}).product
    job.module.attributes["target.source"] = StringAttr("this is not CUDA")
    with pytest.raises(FragmentCompileError) as info:
        compile_fragment(job, str(tmp_path))  # type: ignore[arg-type]
    assert "error" in info.value.log
    assert info.value.source_path and os.path.exists(info.value.source_path)


def test_failed_compile_leaves_the_old_fragment_current(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import accy.executable.cache as cache_mod

    path = os.path.join(ROOT, "graphs", "softmax.mlir")
    sm = SemanticModule.from_file(path)
    cache = FragmentCompilerCache()
    first = cache.refresh_from_semantic_module(sm, PreparationRequest(shapes={0: (3, 4096)}))
    old_prepared, old_fragment = cache.current_prepared(), cache.current_fragment()
    assert old_fragment is first.fragment is not None

    def broken(*a, **k):  # type: ignore[no-untyped-def]
        raise FragmentCompileError("injected", log="error: injected")

    monkeypatch.setattr(cache_mod, "compile_fragment", broken)
    with pytest.raises(FragmentCompileError):
        cache.refresh_from_semantic_module(sm, PreparationRequest(shapes={0: (5, 4096)}))
    assert cache.current_prepared() is old_prepared
    assert cache.current_fragment() is old_fragment
    x = np.random.default_rng(1).standard_normal((3, 4096)).astype(np.float32)
    _check(old_fragment(x), run_reference(sm.module, [x]))


def test_load_is_reused_while_the_compile_key_is_unchanged() -> None:
    sm = SemanticModule.from_file(os.path.join(ROOT, "graphs", "bias_gelu.mlir"))
    req = PreparationRequest(shapes={0: (2, 4096)})
    a = FragmentCompilerCache().refresh_from_semantic_module(sm, req)
    b = FragmentCompilerCache().refresh_from_semantic_module(sm, req)
    assert a.fragment is b.fragment
    assert [r.reused for r in b.report if r.stage == "load"] == [True]


# ----------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("path", GRAPHS, ids=lambda p: os.path.basename(p))
def test_cuda_fragment_matches_reference(path: str) -> None:
    _run(path, "cuda", 37)


@pytest.mark.gpu
@pytest.mark.parametrize("options", [("kernel.block_size=128",), ("kernel.vector_width=1",),
                                     ("kernel.vector_width=2", "kernel.block_size=512"),
                                     ("kernel.tile_m=32", "kernel.tile_n=32", "kernel.tile_k=8"),
                                     ("dispatch.fuse=false",), ("memory.reuse=false",)])
@pytest.mark.parametrize("name", ["softmax.mlir", "layernorm.mlir", "mlp.mlir",
                                  "attention.mlir", "all_ops.mlir", "dynamic.mlir"])
def test_cuda_variants_match_reference(name: str, options: tuple[str, ...]) -> None:
    _run(os.path.join(ROOT, "graphs", name), "cuda", 45, options)


@pytest.mark.gpu
@pytest.mark.parametrize("name,dyn", [("dynamic.mlir", 1), ("elementwise_chain.mlir", 1),
                                      ("softmax.mlir", 1), ("elementwise_chain.mlir", 1027),
                                      ("softmax.mlir", 2049), ("rmsnorm.mlir", 300)])
def test_cuda_edge_shapes(name: str, dyn: int) -> None:
    _run(os.path.join(ROOT, "graphs", name), "cuda", dyn)


@pytest.mark.parametrize("options", [("kernel.vector_width=1",), ("kernel.vector_width=2",),
                                     ("kernel.block_size=1024",), ("kernel.block_size=32",),
                                     ("kernel.tile_m=128", "kernel.tile_n=128",
                                      "kernel.tile_k=32"),
                                     ("kernel.rows_per_block=4",), ("target.fast_math=true",)])
@pytest.mark.parametrize("name", ["softmax.mlir", "mlp.mlir", "all_ops.mlir"])
def test_option_variants_compile_to_cubins(name: str, options: tuple[str, ...],
                                           tmp_path) -> None:  # type: ignore[no-untyped-def]
    sm = SemanticModule.from_file(os.path.join(ROOT, "graphs", name))
    _, shapes = _inputs(sm, 48)
    job = prepare_through(sm, "target", RunOptions.parse("cuda:sm_90", options), shapes).product
    binary = compile_fragment(job, str(tmp_path)).binary  # type: ignore[arg-type]
    assert all(c[:4] == b"\x7fELF" for c in cubins(binary))


@pytest.mark.parametrize("target", ["host", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("element", ["bf16", "f16"])
def test_half_precision_inputs_and_outputs(element: str, target: str) -> None:
    from accy.builder import Program

    p = Program()
    x = p.arg(f"4x33x{element}")
    y = p.cast(p.exp(p.cast(x, "f32")), element)
    p.ret(y, p.reduce_sum(p.cast(x, "f32"), [1]))
    sm = p.build()
    x0 = np.random.default_rng(5).standard_normal((4, 33)).astype(np.float32)
    if element == "f16":
        x0 = x0.astype(np.float16)
    update = FragmentCompilerCache().refresh_from_semantic_module(
        sm, PreparationRequest(options=RunOptions.parse(target)))
    got = update.fragment(x0)
    want = run_reference(sm.module, [x0])
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        np.testing.assert_allclose(np.asarray(g, np.float64), w.astype(np.float64), rtol=1e-6,
                                   atol=1e-6)
