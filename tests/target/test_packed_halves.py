"""Packed half ops (:mod:`accy.target.packed`): what the kernel stage plans, what the CUDA
renderer spells for it, NVRTC compiling it, and its results on the CPU shim bit for bit
those of the same kernel rendered without the plan's ``packed_ops`` (every op in f32,
a lane at a time), on inputs that hold every kind of half: NaNs of both signs and
several payloads, infinities, signed zeros, subnormals.

Row kernels (block and warp per row) pack the same ops in their column loops: a cached
input is held as its loaded words, a reduction reads a paired value's lanes unpacked; :func:`test_packed_row_kernels_are_bit_identical_to_the_f32_path` checks them
the same way.

On a GPU, :func:`test_packed_kernels_match_the_f32_path_on_the_gpu` runs both builds."""

from __future__ import annotations

import math
import re
import shutil
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "preparation"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import cuda_on_cpu  # noqa: E402
from stage_programs import GRAPHS, graph, graph_shapes, program  # noqa: E402

from accy.dialects.kernel import KernelFuncOp  # noqa: E402
from accy.dialects.memory import BufferSpec  # noqa: E402
from accy.executable.device import compile_cuda  # noqa: E402
from accy.pipeline import prepare_through  # noqa: E402
from accy.preparation.options import RunOptions  # noqa: E402
from accy.preparation.products import SemanticModule  # noqa: E402
from accy.target import cuda  # noqa: E402
from accy.target.packed import PACKED, helpers, packed_ops  # noqa: E402

needs_cxx = pytest.mark.skipif(not cuda_on_cpu.available(), reason="needs g++ (C++20)")
CHAIN_SHAPES = {0: (8, 4096), 1: (1, 4096)}


def specials(el: str) -> SemanticModule:
    """Every packed op on raw inputs (their NaNs, zeros and subnormals reach it as
    they are): max/min with the operands both ways round, relu, a row broadcast along
    the lanes, a column broadcast (the same in every lane), a constant, an f32 op
    between packed ones, and a stored value that another op reads too."""
    t, r, c = f"tensor<?x64x{el}>", f"tensor<64x{el}>", f"tensor<?x1x{el}>"
    k = f"tensor<{el}>"
    return program([t, t, r, c], [t, t, t, t], f"""\
    %m = "semantic.max"(%a0, %a1) : ({t}, {t}) -> {t}
    %n = "semantic.min"(%a1, %a0) : ({t}, {t}) -> {t}
    %r = "semantic.relu"(%a0) : ({t}) -> {t}
    %s = "semantic.sub"(%r, %a2) : ({t}, {r}) -> {t}
    %g = "semantic.neg"(%s) : ({t}) -> {t}
    %a = "semantic.abs"(%a1) : ({t}) -> {t}
    %p = "semantic.mul"(%a, %a3) : ({t}, {c}) -> {t}
    %q = "semantic.add"(%p, %g) : ({t}, {t}) -> {t}
    %h = "semantic.constant"() {{value = dense<5.000000e-01> : {k}}} : () -> {k}
    %w = "semantic.add"(%q, %h) : ({t}, {k}) -> {t}
    %e = "semantic.sigmoid"(%w) : ({t}) -> {t}
    %z = "semantic.max"(%e, %g) : ({t}, {t}) -> {t}
    %y = "semantic.min"(%z, %n) : ({t}, {t}) -> {t}
    "func.return"(%m, %n, %y, %q) : ({t}, {t}, {t}, {t}) -> ()""", f"specials_{el}.mlir")


def kernel_job(sm, target: str, shapes, opts=()):  # type: ignore[no-untyped-def]
    return prepare_through(sm, "kernel", RunOptions.parse(target, list(opts)), shapes).product


def target_source(sm, target: str, shapes, opts=()) -> str:  # type: ignore[no-untyped-def]
    return cuda_on_cpu.job_source(cuda_on_cpu.target_job(sm, shapes, opts, target))


def both_builds(sm, target: str, shapes, opts=()):  # type: ignore[no-untyped-def]
    """The kernels of ``sm`` and the CUDA source rendered as planned and with every
    ``packed_ops`` dropped from the plans (the f32 path)."""
    module = kernel_job(sm, target, shapes, opts).clone_module()
    kernels = [op for op in module.body.ops if isinstance(op, KernelFuncOp)]
    packed = cuda.emit_kernels(kernels)
    for k in kernels:
        k.attributes.pop("packed_ops", None)
    return module, kernels, packed, cuda.emit_kernels(kernels)


# -------------------------------------------------------------- the plan and the spelling


def test_the_arch_decides_which_ops_run_packed() -> None:
    assert packed_ops("bf16", 90) == ("abs", "add", "max", "min", "mul", "neg", "relu", "sub")
    assert packed_ops("bf16", 80) == ("abs", "add", "mul", "neg", "sub")  # no set.u32.bf16x2
    assert packed_ops("f16", 80) == packed_ops("bf16", 90)
    assert packed_ops("f32", 90) == ()


@pytest.mark.parametrize("target,want", [
    ("cuda:sm_90", "bf16.abs bf16.add bf16.max bf16.min bf16.mul bf16.neg bf16.relu"
                   " bf16.sub"),
    ("cuda:sm_80", "bf16.abs bf16.add bf16.mul bf16.neg bf16.sub"),
])
def test_the_kernel_stage_plans_the_packed_ops(target: str, want: str) -> None:
    module = kernel_job(graph("elementwise_chain", "bf16"), target, CHAIN_SHAPES).module
    [k] = [op for op in module.body.ops if isinstance(op, KernelFuncOp)]
    assert k.plan.packed_ops == want and k.plan.vector_width == 8


def test_f32_and_unvectorized_kernels_plan_no_packed_ops() -> None:
    for sm, opts in ((graph("elementwise_chain"), ()),
                     (graph("elementwise_chain", "bf16"), ("kernel.vector_width=1",))):
        module = kernel_job(sm, "cuda:sm_90", CHAIN_SHAPES, opts).module
        [k] = [op for op in module.body.ops if isinstance(op, KernelFuncOp)]
        assert k.plan.packed_ops == "" and "packed_ops" not in k.attributes


@pytest.mark.parametrize("el,sfx", [("bf16", "bf2"), ("f16", "h2")])
def test_a_half_chain_runs_its_exact_ops_packed_on_sm_90(el: str, sfx: str) -> None:
    """elementwise_chain: its mul, add, sub, mul, neg, abs, max, relu and min run on
    words of two halves (four words a vector of eight); its five f32 ops (tanh, exp,
    sqrt, sigmoid, sin) unpack their operand's word and round their two results with
    one conversion, so no lane is rounded alone."""
    text = target_source(graph("elementwise_chain", el), "cuda:sm_90", CHAIN_SHAPES)
    body = text[text.index("__global__"):]
    for op in ("mul", "add", "sub", "neg", "abs", "max", "relu", "min"):
        want = 8 if op == "mul" else 4
        assert body.count(f"accy_{op}_{sfx}(") == want, op
    assert body.count(f"accy_pack_{sfx}(") == 5 * 4
    assert "accy_f2bf(" not in body and "accy_f2h(" not in body
    assert "tanhf(" in body and "sinf(" in body
    ptx = "fma.rn.bf16x2" if el == "bf16" else "add.rn.f16x2"
    assert ptx in text and f"set.gt.u32.{el}x2" in text  # the helpers it calls


def test_bf16_on_sm_80_packs_what_sm_80_has() -> None:
    """No ``set.*.u32.bf16x2`` before sm_90: max, relu and min select in f32."""
    text = target_source(graph("elementwise_chain", "bf16"), "cuda:sm_80", CHAIN_SHAPES)
    body = text[text.index("__global__"):]
    assert body.count("accy_add_bf2(") == 4 and "accy_max_bf2(" not in body
    assert "fma.rn.bf16x2" in text and "set.gt.u32.bf16x2" not in text
    assert re.search(r"\b(t\d+) != \1\b", body)  # max's NaN test, a lane at a time


@pytest.mark.parametrize("el", ["bf16", "f16"])
def test_the_host_target_and_f32_keep_the_scalar_path(el: str) -> None:
    host = target_source(graph("elementwise_chain", el), "host", CHAIN_SHAPES)
    f32 = target_source(graph("elementwise_chain"), "cuda:sm_90", CHAIN_SHAPES)
    for name in helpers():
        assert name not in host and name not in f32
    assert "accy_bf2f(accy_f2bf(" in host or "accy_h2f(accy_f2h(" in host


def test_every_packed_op_has_a_helper_and_a_cpu_emulation() -> None:
    shim = cuda_on_cpu.packed_shim()
    for name in helpers():
        assert f" {name}(" in shim, name
    assert set(op for _, op in PACKED) == {"add", "sub", "mul", "neg", "abs", "max", "min",
                                           "relu"}


# ---------------------------------------------------------------------------- NVRTC


@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
@pytest.mark.parametrize("el", ["bf16", "f16"])
@pytest.mark.parametrize("name", ["elementwise_chain", "specials"])
def test_packed_kernels_compile(name: str, el: str, arch: str) -> None:
    sm = specials(el) if name == "specials" else graph(name, el)
    shapes = {0: (16, 64), 1: (16, 64), 2: (64,), 3: (16, 1)} if name == "specials" \
        else CHAIN_SHAPES
    text = target_source(sm, f"cuda:{arch}", shapes)
    assert f"accy_add_{'bf2' if el == 'bf16' else 'h2'}(" in text
    for fast in ((), ("-use_fast_math",)):
        assert compile_cuda(text, arch, options=["--fmad=false", *fast])[:4] == b"\x7fELF"


# ------------------------------------------------------------------- numerics (CPU)


def half_bits(el: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Bit patterns of ``el`` halves: a third any 16 bits (NaNs, infinities,
    subnormals), the rest normal-ish values, then ±0, ±inf, NaNs of both signs and
    payloads, and the least subnormals, a few of each."""
    n = int(np.prod(shape))
    x = rng.standard_normal(n).astype(np.float32) * 4
    bits = (x.view(np.uint32) >> 16).astype(np.uint16) if el == "bf16" else \
        x.astype(np.float16).view(np.uint16)
    wild = rng.random(n) < 1 / 3
    bits[wild] = rng.integers(0, 1 << 16, int(wild.sum()), dtype=np.uint16)
    if el == "bf16":
        special = [0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0xffc0, 0x7f81, 0xffc1, 0x0001,
                   0x8001, 0x007f, 0x3f80, 0xbf80]
    else:
        special = [0x0000, 0x8000, 0x7c00, 0xfc00, 0x7e00, 0xfe00, 0x7c01, 0xfe01, 0x0001,
                   0x8001, 0x03ff, 0x3c00, 0xbc00]
    at = rng.choice(n, size=min(n, 20 * len(special)), replace=False)
    bits[at] = np.resize(np.array(special, np.uint16), at.size)
    return bits.reshape(shape)


def run_kernels(module, kernels, text: str, inputs: list[np.ndarray]) -> list[np.ndarray]:  # type: ignore[no-untyped-def]
    """Run the (one-launch) program's kernel on the shim: its results' bits."""
    [k] = kernels
    specs = [BufferSpec.from_attr(a) for a in module.entry().attr("memory.buffers").values]
    outs = [np.zeros(s.shape, np.uint16) for s in specs if s.kind == "result"]
    assert len(outs) + len(inputs) == len(specs)
    plan = k.plan
    cuda_on_cpu.run(text, k.sym_name, plan.grid[0], plan.block[0],
                    [np.ascontiguousarray(x) for x in inputs] + outs,
                    scalars=cuda.launch_scalars(k))
    return outs


def assert_bit_identical(el: str, got: list[np.ndarray], want: list[np.ndarray]) -> None:
    """Every result the same bits, but a NaN's: a NaN where the f32 path has one. (On
    the host a NaN's sign and payload follow the compiler: g++ folds ``a + (-b)`` into
    ``a - b`` and an f16 → f32 → f16 round trip into nothing; on the device every
    stored NaN is the canonical one, in both builds.)"""
    for i, (g, w) in enumerate(zip(got, want)):
        g, w = g.reshape(-1), w.reshape(-1)
        nan = np.isnan(_as_float(el, w))
        assert np.isnan(_as_float(el, g))[nan].all(), f"result {i}: a NaN lost"
        differ = np.flatnonzero((g != w) & ~nan)
        assert differ.size == 0, (f"result {i}: {differ.size} of {g.size} differ, first at "
                                  f"{differ[0]}: {g[differ[0]]:#06x} packed, "
                                  f"{w[differ[0]]:#06x} in f32")


@needs_cxx
@pytest.mark.parametrize("target", ["cuda:sm_90", "cuda:sm_80"])
@pytest.mark.parametrize("el", ["bf16", "f16"])
def test_packed_specials_are_bit_identical_to_the_f32_path(el: str, target: str) -> None:
    rows = 24
    module, kernels, packed, scalar = both_builds(
        specials(el), target, {0: (rows, 64), 1: (rows, 64), 2: (64,), 3: (rows, 1)},
        ("kernel.block_size=64",))
    assert "packed_ops" not in kernels[0].attributes and packed != scalar
    rng = np.random.default_rng(11)
    x, y = half_bits(el, (rows, 64), rng), half_bits(el, (rows, 64), rng)
    # max/min ties: +0 against -0 both ways round, NaN against NaN, NaN against a number
    # both ways round, equal numbers
    zero, nz, nan, mnan, one = (0x0000, 0x8000, 0x7fc1, 0xffc0, 0x3f80) if el == "bf16" \
        else (0x0000, 0x8000, 0x7e01, 0xfe00, 0x3c00)
    x[0, :8] = (zero, nz, nan, mnan, nan, one, one, nz)
    y[0, :8] = (nz, zero, mnan, nan, one, mnan, one, nz)
    inputs = [x, y, half_bits(el, (64,), rng), half_bits(el, (rows, 1), rng)]
    got = run_kernels(module, kernels, packed, inputs)
    want = run_kernels(module, kernels, scalar, inputs)
    assert_bit_identical(el, got, want)
    assert any(np.isnan(_as_float(el, w)).any() for w in want)  # the NaNs got through


@needs_cxx
@pytest.mark.parametrize("el", ["bf16", "f16"])
def test_packed_chain_is_bit_identical_to_the_f32_path(el: str) -> None:
    shapes = {0: (4, 4096), 1: (1, 4096)}
    module, kernels, packed, scalar = both_builds(graph("elementwise_chain", el),
                                                  "cuda:sm_90", shapes,
                                                  ("kernel.block_size=64",))
    rng = np.random.default_rng(12)
    inputs = [half_bits(el, shapes[0], rng), half_bits(el, shapes[1], rng)]
    assert_bit_identical(el, run_kernels(module, kernels, packed, inputs),
                         run_kernels(module, kernels, scalar, inputs))


ROW_CASES = [("dynamic", {0: (12, 4096), 1: (4096,)}, "block-per-row"),
             ("dynamic", {0: (12, 256), 1: (256,)}, "warp-per-row"),
             ("residual_norm", {0: (12, 1024), 1: (12, 1024), 2: (1024,), 3: (1024,)},
              "warp-per-row")]
"""Row programs with half ops the plan packs (dynamic's centring, its magnitude and
its bias; residual_norm's residual add), under both row mappings."""


def row_bits(el: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Half bit patterns for a row kernel: numbers of any sign and size (a NaN or an
    infinity makes its whole row one), and in the first rows the specials a row can
    carry without that — signed zeros, subnormals, huge values — then a row with a NaN
    and one with an infinity."""
    n = int(np.prod(shape))
    x = (rng.standard_normal(n) * np.exp2(rng.integers(-12, 12, n))).astype(np.float32)
    bits = (x.view(np.uint32) >> 16).astype(np.uint16) if el == "bf16" else \
        x.astype(np.float16).view(np.uint16)
    bits = bits.reshape(shape)
    if len(shape) > 1 and shape[0] >= 4:
        tiny, big, nan, inf = (0x0001, 0x7f7f, 0x7fc1, 0xff80) if el == "bf16" else \
            (0x0001, 0x7bff, 0x7e01, 0xfc00)
        bits[0, :6] = (0x0000, 0x8000, tiny, tiny | 0x8000, big, big | 0x8000)
        bits[1, :4] = (tiny, 0x8000, tiny, 0x0000)
        bits[2, 5], bits[3, 7] = nan, inf
    return bits


@pytest.mark.parametrize("name,shapes,mapping", ROW_CASES)
def test_half_row_kernels_plan_their_packed_ops(name: str, shapes, mapping: str) -> None:  # type: ignore[no-untyped-def]
    module = kernel_job(graph(name, "bf16"), "cuda:sm_90", shapes).module
    [k] = [op for op in module.body.ops if isinstance(op, KernelFuncOp)]
    want = {"dynamic": "bf16.abs bf16.add bf16.sub", "residual_norm": "bf16.add"}[name]
    assert (k.plan.mapping, k.plan.packed_ops) == (mapping, want)
    f32 = kernel_job(graph(name), "cuda:sm_90", shapes).module
    assert all(op.plan.packed_ops == "" for op in f32.body.ops if isinstance(op, KernelFuncOp))


@pytest.mark.parametrize("el,sfx", [("bf16", "bf2"), ("f16", "h2")])
def test_a_half_row_kernel_runs_its_exact_ops_packed(el: str, sfx: str) -> None:
    """dynamic over rows of 4096: its centring and its bias add a word of two lanes an
    instruction (four words a vector of eight, in both column loops that compute the
    centring), its quotient's two lanes rounded by one conversion, the output stored as
    the words (no lane rounded alone). The cached row is held as the words it was
    loaded in, which the packed ops read as they are."""
    text = target_source(graph("dynamic", el), "cuda:sm_90", ROW_CASES[0][1])
    body = text[text.index("__global__"):]
    assert body.count(f"accy_sub_{sfx}(") == 2 * 4 and body.count(f"accy_add_{sfx}(") == 4
    # f16 packs the row's mean (a float, an exact half) by the same conversion
    assert body.count(f"accy_pack_{sfx}(") == (4 if el == "bf16" else 4 + 2 * 4)
    assert "unsigned int reg0[4][4];" in body  # the cached row: its loaded words
    lone = "accy_f2bf(" if el == "bf16" else "accy_f2h("
    rounded = [line for line in body.splitlines() if lone in line]
    assert rounded and not any("[j]" in line for line in rounded)  # a row's values only
    assert compile_cuda(text, "sm_90")[:4] == b"\x7fELF"


@needs_cxx
@pytest.mark.parametrize("el", ["bf16", "f16"])
@pytest.mark.parametrize("name,shapes,mapping", ROW_CASES)
def test_packed_row_kernels_are_bit_identical_to_the_f32_path(name: str, shapes,  # type: ignore[no-untyped-def]
                                                              mapping: str, el: str) -> None:
    module, kernels, packed, scalar = both_builds(graph(name, el), "cuda:sm_90", shapes)
    assert kernels[0].plan.mapping == mapping and packed != scalar
    rng = np.random.default_rng(15)
    inputs = [row_bits(el, shapes[i], rng) for i in sorted(shapes)]
    got = run_kernels(module, kernels, packed, inputs)
    want = run_kernels(module, kernels, scalar, inputs)
    assert_bit_identical(el, got, want)
    finite = [np.isfinite(_as_float(el, w)) for w in want]
    assert all(f[4:].all() for f in finite if f.ndim > 1 and f.shape[0] > 4)  # rows that count


def _as_float(el: str, bits: np.ndarray) -> np.ndarray:
    if el == "bf16":
        return (bits.astype(np.uint32) << 16).view(np.float32)
    return bits.view(np.float16).astype(np.float32)


# ------------------------------------------------- the double-rounding argument, checked


@pytest.mark.parametrize("el", ["bf16", "f16"])
@pytest.mark.parametrize("op", ["add", "sub", "mul"])
def test_rounding_an_f32_result_is_rounding_the_exact_one(el: str, op: str) -> None:
    """What lets a packed add/sub/mul (one rounding) stand for the f32 path's (the f32
    op rounded, then the half rounding): on a sample of every pair of halves, subnormal
    and huge ones included, rounding the f32 result to the half type gives what rounding
    the float64 result does (a product of halves is exact in float64, a sum rounded at
    53 bits, which rounding again to a half cannot tell from the exact sum)."""
    rng = np.random.default_rng(13)
    n = 1 << 18
    a, b = (half_bits(el, (n,), rng) for _ in range(2))
    with np.errstate(all="ignore"):  # signalling NaNs among the inputs
        fa, fb = (_as_float(el, v).astype(np.float64) for v in (a, b))
        exact = {"add": fa + fb, "sub": fa - fb, "mul": fa * fb}[op]
        f32 = exact.astype(np.float32)  # the f32 op: exact result rounded once to f32
        ok = ~np.isnan(exact)
        assert np.array_equal(_round_half(el, f32.astype(np.float64))[ok],
                              _round_half(el, exact)[ok])


def _round_half(el: str, x: np.ndarray) -> np.ndarray:
    """``x`` (float64) rounded to nearest even ``el``, as bit patterns."""
    if el == "f16":
        return x.astype(np.float16).view(np.uint16)  # NumPy rounds float64 -> f16 once
    out = np.empty(x.shape, np.uint16)
    for i, v in enumerate(x):
        out[i] = _bf16_of(float(v))
    return out


def _bf16_of(v: float) -> int:
    """The bf16 nearest ``v`` (ties to even), exactly: by its float64 bits."""
    if v != v:
        return 0x7fc0
    sign = 0x8000 if struct.pack(">d", v)[0] & 0x80 else 0
    m = abs(v)
    if m == 0 or m == math.inf:
        return sign | (0x7f80 if m else 0)
    # bf16: 8 bits of significand, exponents down to -126, subnormal quantum 2^-133
    e = max(math.frexp(m)[1] - 1, -126)
    q = math.ldexp(1.0, e - 7)
    k = m / q  # exact: a power-of-two scaling of a float64
    r = math.floor(k)
    if k - r > 0.5 or (k - r == 0.5 and r % 2 == 1):
        r += 1
    val = r * q
    if val >= math.ldexp(1.0, 128):
        return sign | 0x7f80
    bits = struct.unpack(">I", struct.pack(">f", val))[0]
    return sign | (bits >> 16)


# ------------------------------------------------------------------- numerics (GPU)


@pytest.mark.gpu
@pytest.mark.parametrize("el", ["bf16", "f16"])
@pytest.mark.parametrize("name", ["elementwise_chain", "specials", "dynamic", "residual_norm"])
def test_packed_kernels_match_the_f32_path_on_the_gpu(name: str, el: str) -> None:
    """Both builds on the device, every bit alike: NaNs included, as every NaN a half
    store writes is the canonical one in both (the conversion's, the packed ops' and
    ``accy_canon_*``'s)."""
    import cupy

    from accy.executable.device import CudaModule, local_arch
    from accy.target.backend import target_arch

    arch = target_arch(local_arch() or "sm_90")
    rows = 24
    bits = half_bits
    if name == "specials":
        sm = specials(el)
        shapes = {0: (rows, 64), 1: (rows, 64), 2: (64,), 3: (rows, 1)}
    elif name == "elementwise_chain":
        sm, shapes = graph(name, el), {0: (rows, 4096), 1: (1, 4096)}
    else:  # a row kernel of ROW_CASES (its first: dynamic's is a block per row)
        sm, bits = graph(name, el), row_bits
        shapes = next(shapes for case, shapes, _ in ROW_CASES if case == name)
    module, kernels, packed, scalar = both_builds(sm, f"cuda:{arch}", shapes)
    [k] = kernels
    rng = np.random.default_rng(14)
    inputs = [bits(el, shapes[i], rng) for i in sorted(shapes)]
    specs = [BufferSpec.from_attr(a) for a in module.entry().attr("memory.buffers").values]
    results = []
    for text in (packed, scalar):
        mod = CudaModule(compile_cuda(text, arch, options=["--fmad=false"]))
        outs = [cupy.zeros(s.shape, cupy.uint16) for s in specs if s.kind == "result"]
        args = [cupy.asarray(x) for x in inputs] + outs + \
            [np.int64(v) for v in cuda.launch_scalars(k)]
        mod.launch(k.sym_name, k.plan.grid, k.plan.block, args)
        results.append([cupy.asnumpy(o) for o in outs])
    for i, (g, w) in enumerate(zip(*results)):
        assert np.array_equal(g, w), f"result {i}"


# ------------------------------------------------------------ before sm_80 (Turing)


@pytest.mark.parametrize("el", ["bf16", "f16"])
def test_every_half_graph_compiles_for_sm_75(el: str) -> None:
    """The paired conversions (``cvt.rn.bf16x2.f32``, ``cvt.rn.f16x2.f32``) are sm_80's:
    before it the rounding helpers convert a lane at a time (bf16: to nearest even by
    its bits, NaN the canonical 0x7fff), so every graph of halves compiles for a T4."""
    for path in GRAPHS:
        sm = graph(path.stem, el)
        text = target_source(sm, "cuda:sm_75", graph_shapes(sm, 64))
        assert compile_cuda(text, "sm_75")[:4] == b"\x7fELF", path.stem


F2BF_PROGRAM = r"""
#include <stdio.h>
#include <string.h>
static inline unsigned int __float_as_uint(float f) { unsigned int u; memcpy(&u, &f, 4); return u; }
@HELPER@
int main(void) {
  for (unsigned long long u = 0; u < (1ull << 32); u += 24929) {  /* 97 * 257 */
    float f; unsigned int b = (unsigned int)u; memcpy(&f, &b, 4);
    printf("%x %x\n", b, accy_f2bf(f));
  }
  return 0;
}
"""


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_the_bf16_rounding_before_sm_80_is_round_to_nearest_even(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The pre-sm_80 branch of the device's ``accy_f2bf`` (its text from the CUDA
    prelude, built by the host C compiler, where ``__CUDA_ARCH__`` is not defined)
    against rounding to nearest even by float64 arithmetic (:func:`_round_half`), on
    every 24929th f32 bit pattern; every NaN becomes the canonical 0x7fff."""
    start = cuda.PRELUDE.index("__device__ __forceinline__ unsigned short accy_f2bf")
    helper = cuda.PRELUDE[start:cuda.PRELUDE.index("\n}\n", start) + 3]
    assert "#else" in helper
    out = cuda_on_cpu.sweep(tmp_path, F2BF_PROGRAM,
                            helper.replace("__device__ __forceinline__", "static inline"))
    pairs = np.array([[int(w, 16) for w in line.split()] for line in out.splitlines()],
                     np.uint64)
    bits, got = pairs[:, 0].astype(np.uint32), pairs[:, 1]
    with np.errstate(all="ignore"):  # signalling NaNs among the patterns
        f = bits.view(np.float32).astype(np.float64)
    nan = np.isnan(f)
    assert (got[nan] == 0x7fff).all() and nan.any()
    assert np.array_equal(got[~nan], _round_half("bf16", f[~nan]))
