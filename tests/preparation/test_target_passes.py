"""Target stage: check-target-support and emit-source (CUDA C and host C).

Inputs come from the real pipelines (contract … target). Every emitted CUDA
source is compiled with NVRTC for sm_90 (no GPU needed) and every host source
with the C compiler; a few host fragments run against the reference.
"""

from __future__ import annotations

import functools
import re
import tempfile
from pathlib import Path

import numpy as np
import pytest

from accy.choir.attributes import ArrayAttr, DictAttr, TensorType
from accy.dialects.kernel import KernelFuncOp, LaunchOp
from accy.errors import PassFailedError, VerifyError
from accy.executable import device
from accy.executable.compile import compile_fragment
from accy.executable.fragment import LoadedFragment
from accy.preparation.options import RunOptions
from accy.preparation.passes import target as target_passes
from accy.preparation.passes.target import launch_table_comment
from accy.preparation.products import SemanticModule
from accy.preparation.stages import prepare_through
from accy.reference import run_reference

GRAPHS = sorted((Path(__file__).resolve().parents[2] / "graphs").glob("*.mlir"))
CUDA = "cuda:sm_90"


def program(args: list[str], results: list[str], body: str) -> SemanticModule:
    """A semantic module whose ``main`` takes ``args`` as ``%a0, %a1, …``."""
    sig = f"({', '.join(args)}) -> " + (results[0] if len(results) == 1
                                       else f"({', '.join(results)})")
    params = ", ".join(f"%a{i}: {t}" for i, t in enumerate(args))
    return SemanticModule.from_text(
        f'"builtin.module"() ({{\n'
        f'  "func.func"() <{{function_type = {sig}, sym_name = "main"}}> ({{\n'
        f'  ^bb0({params}):\n'
        f'{body}\n'
        f'  }}) : () -> ()\n'
        f'}}) : () -> ()\n', "t.mlir")


def graph(name: str) -> SemanticModule:
    return SemanticModule.from_file(str(GRAPHS[0].parent / f"{name}.mlir"))


def graph_shapes(sm: SemanticModule, size: int = 8) -> dict[int, tuple[int, ...]]:
    out = {}
    for i, t in enumerate(sm.entry().function_type.inputs):
        assert isinstance(t, TensorType)
        out[i] = tuple(size if d is None else d for d in t.shape)
    return out


def emit(sm: SemanticModule, shapes=None, opts=(), target: str = CUDA):
    return prepare_through(sm, "target", RunOptions.parse(target, list(opts)), shapes or {})


def source(result) -> str:
    return result.product.module.attributes["target.source"].value


def plain(a):
    if isinstance(a, DictAttr):
        return {k: plain(v) for k, v in a.entries}
    if isinstance(a, ArrayAttr):
        return [plain(v) for v in a.values]
    return getattr(a, "value", getattr(a, "values", a))


@functools.cache
def nvrtc(src: str, fast_math: bool = False) -> bytes:
    return device.compile_cuda(src, "sm_90", options=("-use_fast_math",) if fast_math else ())


@functools.cache
def cc(src: str) -> str:
    return device.compile_host(src, tempfile.mkdtemp(prefix="accy-test-target-"))


def run_host(sm: SemanticModule, xs, shapes=None, opts=()):
    job = emit(sm, shapes, opts, target="host").product
    return LoadedFragment(compile_fragment(job, tempfile.mkdtemp()))(*xs)


T = "tensor<4x8xf32>"
Q = "tensor<4x4xf32>"


# ---------------------------------------------------------------- the product


def test_the_product_carries_source_launches_and_buffers():
    r = emit(graph("attention"), {i: (2, 128, 64) for i in range(3)})
    attrs = r.product.module.attributes
    for key in ("target.source", "target.launches", "target.buffers", "target.arena_bytes",
                "target.target", "target.language", "target.entry", "target.fast_math"):
        assert key in attrs, key
    assert plain(attrs["target.target"]) == CUDA and plain(attrs["target.language"]) == "cuda"
    assert plain(attrs["target.entry"]) == "main"
    kernels = [op for op in r.product.module.body.ops if isinstance(op, KernelFuncOp)]
    launch_ops = [op for op in r.product.entry().body.ops if isinstance(op, LaunchOp)]
    launches = plain(attrs["target.launches"])
    assert [entry["kernel"] for entry in launches] == [op.kernel for op in launch_ops] == \
        [k.sym_name for k in kernels] == ["k0_matmul", "k1_rows", "k2_matmul"]
    for entry, op, k in zip(launches, launch_ops, kernels):
        assert entry["buffers"] == op.attr("memory.inputs").values + \
            op.attr("memory.outputs").values
        assert entry["grid"] == k.ints_attr("grid") and entry["block"] == k.ints_attr("block")
        assert entry["shared_bytes"] == k.int_attr("shared_bytes")
        assert f"void __launch_bounds__({int(np.prod(entry['block']))}) {k.sym_name}(" in \
            source(r)
    buffers = plain(attrs["target.buffers"])
    assert buffers == plain(r.product.entry().attr("memory.buffers"))
    assert plain(attrs["target.arena_bytes"]) == plain(
        r.product.entry().attr("memory.arena_bytes"))
    # the last launch writes the result buffer
    result = [b["id"] for b in buffers if b["kind"] == "result"]
    assert list(launches[-1]["buffers"][-1:]) == result
    assert r.pass_stats["emit-source"]["launches"] == 3
    assert r.pass_stats["check-target-support"]["kernels"] == 3


def test_the_host_product_is_c():
    r = emit(graph("softmax"), {0: (8, 64)}, target="host")
    attrs = r.product.module.attributes
    assert plain(attrs["target.language"]) == "c" and plain(attrs["target.target"]) == "host"
    src = source(r)
    assert src.startswith("// generated by accy: host C") and "__global__" not in src
    assert "void k0_rows(void** buffers) {" in src


def test_launch_buffers_are_inputs_then_outputs():
    sm = program([T], [T, "tensor<4x1xf32>"], f"""\
    %0 = "semantic.exp"(%a0) : ({T}) -> {T}
    %1 = "semantic.reduce_sum"(%0) {{axes = array<i64: 1>, keepdims = true}} : ({T}) -> tensor<4x1xf32>
    "func.return"(%0, %1) : ({T}, tensor<4x1xf32>) -> ()""")
    r = emit(sm, opts=["dispatch.fuse=false"])
    launches = plain(r.product.module.attributes["target.launches"])
    kinds = {b["id"]: (b["kind"], b.get("index")) for b in
             plain(r.product.module.attributes["target.buffers"])}
    assert [[kinds[i] for i in entry["buffers"]] for entry in launches] == [
        [("arg", 0), ("result", 0)], [("result", 0), ("result", 1)]]


def test_the_launch_table_comment_lists_every_launch_and_buffer():
    r = emit(graph("mlp"), {0: (8, 256)})
    comment = launch_table_comment(r.product.module)
    lines = comment.splitlines()
    assert lines[0].startswith("// launch table")
    launches = plain(r.product.module.attributes["target.launches"])
    buffers = plain(r.product.module.attributes["target.buffers"])
    launch_lines = [ln for ln in lines if 'kernel = "' in ln]
    assert len(launch_lines) == len(launches) == 2
    for ln, entry in zip(launch_lines, launches):
        assert f'kernel = "{entry["kernel"]}"' in ln
        assert "grid = array<i64: " + ", ".join(map(str, entry["grid"])) + ">" in ln
    assert sum('kind = "' in ln for ln in lines) == len(buffers)
    arena = plain(r.product.module.attributes["target.arena_bytes"])
    assert f"(arena bytes: {arena} : i64)" in comment
    assert all(ln.startswith("//") for ln in lines)


# ---------------------------------------------------------------- compiling


@pytest.mark.parametrize("path", GRAPHS, ids=[p.stem for p in GRAPHS])
def test_every_graph_compiles_for_cuda_and_host(path):
    sm = SemanticModule.from_file(str(path))
    shapes = graph_shapes(sm)
    assert nvrtc(source(emit(sm, shapes)))[:4] == b"\x7fELF"
    lib = device.HostLibrary(cc(source(emit(sm, shapes, target="host"))))
    for entry in plain(emit(sm, shapes, target="host").product.module.attributes[
            "target.launches"]):
        lib._function(entry["kernel"])  # every launched kernel is exported


VARIANTS = [
    ("softmax", ["dispatch.fuse=false"]),
    ("layernorm", ["kernel.rows_per_block=2"]),
    ("layernorm", ["memory.alignment=4", "dispatch.fuse=false"]),
    ("attention", ["dispatch.max_region_ops=2"]),
    ("dynamic", ["kernel.vector_width=2", "kernel.block_size=64"]),
    ("mlp", ["kernel.tile_m=16", "kernel.tile_n=128", "kernel.tile_k=4"]),
    ("softmax_axis0", ["tensor.innermost_reductions=false"]),
    ("residual_norm", ["memory.inplace=false", "memory.reuse=false"]),
]


@pytest.mark.parametrize("name,opts", VARIANTS, ids=[f"{n}-{'-'.join(o)}" for n, o in VARIANTS])
def test_option_variants_compile(name, opts):
    sm = graph(name)
    shapes = graph_shapes(sm, 6)
    assert nvrtc(source(emit(sm, shapes, opts)))[:4] == b"\x7fELF"


@pytest.mark.parametrize("rows,cols", [(3, 4095), (5, 100), (2, 8200), (33, 32)])
def test_row_kernels_of_odd_shapes_compile(rows, cols):
    r = emit(graph("softmax"), {0: (rows, cols)})
    assert nvrtc(source(r))[:4] == b"\x7fELF"


DTYPES = f"""\
    %0 = "semantic.cast"(%a0) : ({T}) -> tensor<4x8xf16>
    %1 = "semantic.mul"(%0, %0) : (tensor<4x8xf16>, tensor<4x8xf16>) -> tensor<4x8xf16>
    %2 = "semantic.cast"(%a0) : ({T}) -> tensor<4x8xbf16>
    %3 = "semantic.add"(%2, %2) : (tensor<4x8xbf16>, tensor<4x8xbf16>) -> tensor<4x8xbf16>
    %4 = "semantic.cast"(%a0) : ({T}) -> tensor<4x8xf64>
    %5 = "semantic.exp"(%4) : (tensor<4x8xf64>) -> tensor<4x8xf64>
    %6 = "semantic.cast"(%a0) : ({T}) -> tensor<4x8xi32>
    %7 = "semantic.abs"(%6) : (tensor<4x8xi32>) -> tensor<4x8xi32>
    %8 = "semantic.cast"(%a0) : ({T}) -> tensor<4x8xi8>
    %9 = "semantic.neg"(%8) : (tensor<4x8xi8>) -> tensor<4x8xi8>
    %10 = "semantic.cast"(%a0) : ({T}) -> tensor<4x8xi64>
    %11 = "semantic.reduce_sum"(%10) {{axes = array<i64: 1>, keepdims = true}} : (tensor<4x8xi64>) -> tensor<4x1xi64>
    %12 = "semantic.cmp"(%a0, %a0) {{predicate = "ge"}} : ({T}, {T}) -> tensor<4x8xi1>
    "func.return"(%1, %3, %5, %7, %9, %11, %12) : (tensor<4x8xf16>, tensor<4x8xbf16>, tensor<4x8xf64>, tensor<4x8xi32>, tensor<4x8xi8>, tensor<4x1xi64>, tensor<4x8xi1>) -> ()"""
DTYPE_RESULTS = ["tensor<4x8xf16>", "tensor<4x8xbf16>", "tensor<4x8xf64>", "tensor<4x8xi32>",
                 "tensor<4x8xi8>", "tensor<4x1xi64>", "tensor<4x8xi1>"]


def test_every_element_type_compiles_and_the_host_runs_it():
    sm = program([T], DTYPE_RESULTS, DTYPES)
    assert nvrtc(source(emit(sm)))[:4] == b"\x7fELF"
    x = (np.random.default_rng(3).standard_normal((4, 8)) * 50).astype(np.float32)
    got = run_host(sm, [x])
    want = run_reference(sm.module, [x])
    for g, w in zip(got, want):
        g = np.asarray(g)
        assert g.shape == w.shape
        if w.dtype == np.float64:  # libm's exp may differ from NumPy's in the last bit
            np.testing.assert_allclose(g, w, rtol=1e-15)
        else:
            np.testing.assert_array_equal(g.astype(np.float64), w.astype(np.float64))


# ---------------------------------------------------------------- fast math


def test_fast_math_uses_the_intrinsics():
    sm = graph("softmax")
    precise = emit(sm, {0: (8, 256)})
    fast = emit(sm, {0: (8, 256)}, ["target.fast_math=true"])
    assert "__expf(" in source(fast) and "__expf(" not in source(precise)
    assert "expf(" in source(precise)
    assert plain(fast.product.module.attributes["target.fast_math"]) is True
    assert plain(precise.product.module.attributes["target.fast_math"]) is False
    assert fast.key != precise.key
    assert nvrtc(source(fast), True)[:4] == b"\x7fELF"


def test_fast_math_changes_nothing_on_the_host():
    sm = graph("softmax")
    a = emit(sm, {0: (8, 256)}, target="host")
    b = emit(sm, {0: (8, 256)}, ["target.fast_math=true"], target="host")
    assert source(a) == source(b) and "__expf" not in source(b)


# ---------------------------------------------------------- target support


def test_an_unsupported_element_type_is_a_verify_error(monkeypatch):
    sm = program([T], ["tensor<4x8xf64>"], f"""\
    %0 = "semantic.cast"(%a0) : ({T}) -> tensor<4x8xf64>
    "func.return"(%0) : (tensor<4x8xf64>) -> ()""")
    emit(sm)  # f64 is supported as is
    narrowed = {k: v - {"f64"} for k, v in target_passes.SUPPORTED.items()}
    monkeypatch.setattr(target_passes, "SUPPORTED", narrowed)
    with pytest.raises(PassFailedError) as info:
        emit(sm)
    assert isinstance(info.value.__cause__, VerifyError)
    assert "element type f64 is not supported on cuda:sm_90" in str(info.value)
    assert "check-target-support" in str(info.value)


# ------------------------------------------------ in place, end to end (host)


def test_in_place_outputs_run_correctly_on_the_host():
    sm = program([Q], [Q], f"""\
    %0 = "semantic.neg"(%a0) : ({Q}) -> {Q}
    %1 = "semantic.abs"(%0) : ({Q}) -> {Q}
    %2 = "semantic.exp"(%1) : ({Q}) -> {Q}
    %3 = "semantic.transpose"(%2) {{permutation = array<i64: 1, 0>}} : ({Q}) -> {Q}
    %4 = "semantic.sub"(%2, %3) : ({Q}, {Q}) -> {Q}
    %5 = "semantic.neg"(%4) : ({Q}) -> {Q}
    %6 = "semantic.tanh"(%5) : ({Q}) -> {Q}
    "func.return"(%6) : ({Q}) -> ()""")
    x = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)
    want = run_reference(sm.module, [x])[0]
    for opts in ([], ["dispatch.max_region_ops=2"], ["dispatch.fuse=false"]):
        got = run_host(sm, [x], opts=opts)[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=str(opts))


def test_an_input_and_its_reshaped_view_run_correctly_on_the_host():
    R = "tensor<8x4xf32>"
    sm = program([T, R], [Q], f"""\
    %0 = "semantic.exp"(%a0) : ({T}) -> {T}
    %1 = "semantic.reshape"(%0) : ({T}) -> {R}
    %2 = "semantic.transpose"(%1) {{permutation = array<i64: 1, 0>}} : ({R}) -> {T}
    %3 = "semantic.add"(%0, %2) : ({T}, {T}) -> {T}
    %4 = "semantic.matmul"(%3, %a1) : ({T}, {R}) -> {Q}
    "func.return"(%4) : ({Q}) -> ()""")
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((4, 8)).astype(np.float32),
          rng.standard_normal((8, 4)).astype(np.float32)]
    np.testing.assert_allclose(run_host(sm, xs)[0], run_reference(sm.module, xs)[0],
                               rtol=1e-5, atol=1e-5)


def _write_loop(src: str, name: str) -> str:
    """The body of the last column loop of CUDA kernel ``name`` (its write pass)."""
    start = src.index(f" {name}(")
    end = src.find('extern "C"', start)
    kernel = src[start:end if end >= 0 else len(src)]
    return kernel[kernel.rindex("for (int j = 0;"):]


def test_a_cuda_row_kernel_loads_everything_before_it_stores():
    # two outputs of one rows region are written in place over its two inputs; the
    # second output reads the first output's donor, so every load must come first
    N = 16384  # too long a row to cache in registers
    X, W, A = "tensor<8x16xf32>", f"tensor<16x{N}xf32>", f"tensor<8x{N}xf32>"
    S, W3 = "tensor<8x1xf32>", f"tensor<{N}x4xf32>"
    sm = program([X, W, W, W3], ["tensor<8x4xf32>", "tensor<8x4xf32>"], f"""\
    %0 = "semantic.matmul"(%a0, %a1) : ({X}, {W}) -> {A}
    %1 = "semantic.matmul"(%a0, %a2) : ({X}, {W}) -> {A}
    %2 = "semantic.reduce_sum"(%0) {{axes = array<i64: 1>, keepdims = true}} : ({A}) -> {S}
    %3 = "semantic.mul"(%2, %1) : ({S}, {A}) -> {A}
    %4 = "semantic.mul"(%2, %0) : ({S}, {A}) -> {A}
    %5 = "semantic.matmul"(%3, %a3) : ({A}, {W3}) -> tensor<8x4xf32>
    %6 = "semantic.matmul"(%4, %a3) : ({A}, {W3}) -> tensor<8x4xf32>
    "func.return"(%5, %6) : (tensor<8x4xf32>, tensor<8x4xf32>) -> ()""")
    r = emit(sm)
    buffers = plain(r.product.module.attributes["target.buffers"])
    assert sum("inplace_of" in b for b in buffers) == 2
    (rows,) = [k for k in r.product.module.body.ops
               if isinstance(k, KernelFuncOp) and k.str_attr("kind") == "rows"]
    assert rows.ints_attr("cached_inputs") == ()
    loop = _write_loop(source(r), rows.sym_name)
    loads = [m.start() for m in re.finditer(r"__ldg\(", loop)]
    stores = [m.start() for m in re.finditer(r"\*reinterpret_cast<float4\*>\(out|out\d\[", loop)]
    assert len(loads) == 2 and len(stores) == 2
    assert max(loads) < min(stores), loop
    assert nvrtc(source(r))[:4] == b"\x7fELF"


def test_integer_extremes_survive_reductions_and_casts_on_the_host():
    lo = np.iinfo(np.int64).min
    sm = program(["tensor<2x4xi64>", "tensor<2x4xf32>"], ["tensor<2x1xi64>", "tensor<2x4xi64>"],
                 """\
    %0 = "semantic.reduce_max"(%a0) {axes = array<i64: 1>, keepdims = true} : (tensor<2x4xi64>) -> tensor<2x1xi64>
    %1 = "semantic.cast"(%a1) : (tensor<2x4xf32>) -> tensor<2x4xi64>
    "func.return"(%0, %1) : (tensor<2x1xi64>, tensor<2x4xi64>) -> ()""")
    ints = np.full((2, 4), lo, np.int64)
    floats = np.array([[-1e19, -9.3e18, 1e19, np.nan], [-np.inf, np.inf, -2.5, 7.9]], np.float32)
    want = run_reference(sm.module, [ints, floats])
    got = run_host(sm, [ints, floats])
    assert want[0].ravel().tolist() == [lo, lo]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    assert nvrtc(source(emit(sm)))[:4] == b"\x7fELF"
