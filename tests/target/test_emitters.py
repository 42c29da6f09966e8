"""Unit tests of :mod:`accy.target.common`: index maps, literals, casts, f16/bf16 helpers.

The C that the helpers produce is compiled with the host compiler
(:func:`accy.executable.device.compile_host`) into one small harness library
and called through :meth:`HostLibrary.call_with_buffers`; its answers are
compared bit for bit with NumPy.
"""

from __future__ import annotations

import math
import os
import struct

import numpy as np
import pytest

from accy.choir.parser import parse_module
from accy.executable.device import HostLibrary, compile_host
from accy.target.common import (
    PRELUDE_C,
    ExprBuilder,
    Scope,
    c_float,
    decompose,
    literal,
    load_convert,
    round_compute,
    store_convert,
)

N = 10_000
RNG = np.random.default_rng(20240611)


def module(args: list[str], body: str):
    params = ", ".join(f"%a{i}: {t}" for i, t in enumerate(args))
    return parse_module(
        f'"builtin.module"() ({{\n'
        f'  "func.func"() <{{function_type = ({", ".join(args)}) -> (), sym_name = "f"}}> ({{\n'
        f'  ^bb0({params}):\n{body}\n'
        f'    "func.return"() : () -> ()\n'
        f'  }}) : () -> ()\n'
        f'}}) : () -> ()\n')


# ------------------------------------------------------------------ index maps

INDEX = module(["tensor<4x8xf32>", "tensor<8xf32>", "tensor<8x4xf32>", "tensor<4x1xf32>",
                "tensor<f32>", "tensor<2x3x4xf32>"], """\
    %0 = "prim.broadcast"(%a1) {dims = array<i64: 1>} : (tensor<8xf32>) -> tensor<4x8xf32>
    %1 = "prim.transpose"(%a2) {permutation = array<i64: 1, 0>} : (tensor<8x4xf32>) -> tensor<4x8xf32>
    %2 = "prim.broadcast"(%a3) {dims = array<i64: 0, 1>} : (tensor<4x1xf32>) -> tensor<4x8xf32>
    %3 = "prim.broadcast"(%a4) {dims = array<i64>} : (tensor<f32>) -> tensor<4x8xf32>
    %4 = "prim.transpose"(%a5) {permutation = array<i64: 2, 0, 1>} : (tensor<2x3x4xf32>) -> tensor<4x2x3xf32>
    %5 = "prim.mul"(%a0, %0) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %6 = "prim.add"(%5, %1) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %7 = "prim.sub"(%6, %2) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %8 = "prim.div"(%7, %3) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>""")
IOPS = list(INDEX.entry().body.ops)
assert IOPS[8].op_name == "prim.div"


@pytest.mark.parametrize("op_index,idx,want", [
    (0, ("i", "j"), ("j",)),            # a row vector: the column index
    (1, ("i", "j"), ("j", "i")),        # a transpose swaps the indices back
    (2, ("i", "j"), ("i", "0")),        # a row statistic: a unit dim reads element 0
    (3, ("i", "j"), ()),                # a scalar reads no index
    (4, ("a", "b", "c"), ("b", "c", "a")),
])
def test_operand_index_of_broadcast_and_transpose(op_index, idx, want):
    assert ExprBuilder.operand_index(IOPS[op_index], idx) == want


def test_offset_is_row_major_and_skips_unit_dims():
    b = ExprBuilder(["x"], cuda=False)
    assert b.offset((4, 8), ("i", "j"), 0) == "(i)*8 + j"
    assert b.offset((4, 1), ("i", "0"), 0) == "i"
    assert b.offset((1, 8), ("i", "j"), 0) == "j"
    assert b.offset((2, 3, 4), ("a", "b", "c"), 0) == "(a)*12 + (b)*4 + c"
    assert b.offset((), (), 0) == "0"
    assert b.offset((4, 8), ("i", "j+@L"), 3) == "(i)*8 + j+3"


def load(b: ExprBuilder, v, idx: tuple[str, ...]) -> str:
    """The C load ``b`` emits for ``v`` at ``idx`` (through its temporary, if any)."""
    scope = Scope([])
    name = b.expr(v, idx, scope)
    if not scope.lines:
        return name
    (line,) = scope.lines
    decl, text = line.rstrip(";").split(" = ", 1)
    assert decl.split()[-1] == name
    return text


def test_broadcast_and_transpose_become_loads_at_remapped_indices():
    b = ExprBuilder(["x", "row", "w", "stat", "s", "t"], cuda=False)
    assert load(b, IOPS[0].results[0], ("i", "j")) == "row[j]"
    assert load(b, IOPS[1].results[0], ("i", "j")) == "w[(j)*4 + i]"
    assert load(b, IOPS[2].results[0], ("i", "j")) == "stat[i]"
    assert load(b, IOPS[3].results[0], ("i", "j")) == "s[0]"
    assert load(b, IOPS[4].results[0], ("a", "b", "c")) == "t[(b)*12 + (c)*4 + a]"


def test_cuda_loads_go_through_the_read_only_cache():
    b = ExprBuilder(["x", "row", "w", "stat", "s", "t"], cuda=True)
    assert load(b, IOPS[0].results[0], ("i", "j")) == "__ldg(&row[j])"


def test_an_expression_reuses_what_its_scope_computed():
    b = ExprBuilder(["x", "row", "w", "stat", "s", "t"], cuda=False)
    scope = Scope([])
    name = b.expr(IOPS[8].results[0], ("i", "j"), scope)
    n = len(scope.lines)
    assert scope.lines[-1].startswith(f"float {name} = (") and n >= 4
    assert b.expr(IOPS[8].results[0], ("i", "j"), scope) == name and len(scope.lines) == n
    inner = Scope([], parent=scope)
    assert b.expr(IOPS[8].results[0], ("i", "j"), inner) == name and inner.lines == []
    assert b.expr(IOPS[8].results[0], ("j", "i"), inner) != name  # another index
    assert inner.lines


def test_index_maps_compute_the_right_elements(tmp_path):
    """Compile the expression of ``((x*row + wᵀ) - stat) / s`` and compare with NumPy."""
    b = ExprBuilder(["x", "row", "w", "stat", "s", "t"], cuda=False)
    scope = Scope([])
    val = b.expr(IOPS[8].results[0], ("i", "j"), scope)
    body = "\n".join("      " + ln for ln in scope.lines)
    src = (f"void f(void** b) {{\n"
           f"  const float *x = b[0], *row = b[1], *w = b[2], *stat = b[3], *s = b[4];\n"
           f"  float* out = b[6];\n"
           f"  for (long long i = 0; i < 4; ++i)\n"
           f"    for (long long j = 0; j < 8; ++j) {{\n{body}\n"
           f"      out[i * 8 + j] = {val};\n    }}\n}}\n")
    lib = HostLibrary(compile_host(src, str(tmp_path)))
    rng = np.random.default_rng(0)
    x, row, w, stat = (rng.standard_normal(s).astype(np.float32)
                       for s in ((4, 8), (8,), (8, 4), (4, 1)))
    s = np.array(3.0, np.float32)
    t = np.zeros((2, 3, 4), np.float32)
    out = np.empty((4, 8), np.float32)
    lib.call_with_buffers("f", [x, row, w, stat, s, t, out])
    np.testing.assert_allclose(out, ((x * row + w.T) - stat) / s, rtol=1e-6)


def test_decompose_splits_a_linear_index():
    lines, names = decompose("i", (2, 3, 4), "d")
    assert names == ("d0", "d1", "d2")
    env: dict[str, int] = {}
    for linear in range(24):
        env = {"i": linear}
        for ln in lines:
            lhs, rhs = ln.removeprefix("const long long ").rstrip(";").split(" = ")
            env[lhs] = eval(rhs.replace("/", "//"), {}, env)
        assert (env["d0"], env["d1"], env["d2"]) == np.unravel_index(linear, (2, 3, 4))


# ------------------------------------------------------------------- literals


def test_literal_spellings():
    assert c_float(3.0, "float") == "3.0f" and c_float(-2.0, "float") == "-2.0f"
    assert c_float(0.5, "float") == "0x1.0000000000000p-1f"  # fractions: hex, exact
    assert c_float(0.1, "float") == "0x1.99999a0000000p-4f"  # the float32 nearest 0.1
    assert c_float(float("inf"), "float") == "INFINITY"
    assert c_float(float("-inf"), "float") == "-INFINITY"
    assert c_float(float("nan"), "float") == "NAN"
    assert c_float(0.1, "double") == (0.1).hex() and c_float(2.0, "double") == "2.0"
    assert literal(True, "i1") == "1" and literal(0, "i1") == "0"
    assert literal(-7, "i32") == "-7" and literal(1 << 40, "i64") == f"{1 << 40}LL"
    assert literal(2, "f16") == "2.0f" and literal(2, "bf16") == "2.0f"
    assert literal(0.5, "f64") == "0x1.0000000000000p-1" and literal(2, "f64") == "2.0"


def test_conversion_spellings():
    assert load_convert("p[i]", "f16") == "accy_h2f(p[i])"
    assert load_convert("p[i]", "bf16") == "accy_bf2f(p[i])"
    assert load_convert("p[i]", "f32") == "p[i]"
    assert store_convert("v", "f16") == "accy_f2h(v)"
    assert store_convert("v", "i1") == "(unsigned char)((v) != 0)"
    assert store_convert("v", "i8") == "(signed char)(v)"
    assert round_compute("v", "f16") == "accy_h2f(accy_f2h(v))"
    assert round_compute("v", "f32") == "v"


def _float32_values() -> np.ndarray:
    """Random bit patterns (every exponent), the edges, and values past 1e7."""
    bits = RNG.integers(0, 1 << 32, N, dtype=np.uint64).astype(np.uint32)
    special = np.array([0.0, -0.0, 1.0, -1.0, 0.1, 1e7, 1e7 + 1, 16777217.0, 3.4028235e38,
                        -3.4028235e38, 1.17549435e-38, 1.4e-45, -1.4e-45, 123456789.0,
                        2.0 ** 60, 2.0 ** -130], dtype=np.float32)
    x = np.concatenate([bits.view(np.float32), special])
    return x[np.isfinite(x)]


def _float64_values() -> np.ndarray:
    bits = RNG.integers(0, 1 << 63, 2000, dtype=np.int64).view(np.uint64) * np.uint64(2)
    x = bits.view(np.float64)
    special = np.array([0.0, -0.0, 0.1, 1e15, 1e15 + 1, 2.0 ** 70, 5e-324, 1.7976931348623157e308])
    x = np.concatenate([x, special])
    return x[np.isfinite(x)]


FLOATS = _float32_values()
DOUBLES = _float64_values()
INFNAN = np.array([np.inf, -np.inf, np.nan], dtype=np.float32)


# -------------------------------------------------------------- the C harness


def _cast_fn(name: str, src_el: str, dst_el: str, dst_c: str, src_c: str) -> str:
    expr = ExprBuilder([], cuda=False).cast("v", src_el, dst_el)
    return (f"void {name}(void** b, long long n) {{\n"
            f"  const {src_c}* x = b[0]; {dst_c}* y = b[1];\n"
            f"  for (long long i = 0; i < n; ++i) {{ const {src_c} v = x[i]; "
            f"y[i] = ({dst_c})({expr}); }}\n}}\n")


CASTS = {  # name: (source element, destination element, numpy destination)
    "f32_to_i8": ("f32", "i8", np.int8), "f32_to_i16": ("f32", "i16", np.int16),
    "f32_to_i32": ("f32", "i32", np.int32), "f32_to_i64": ("f32", "i64", np.int64),
    "f64_to_i32": ("f64", "i32", np.int32), "f64_to_i64": ("f64", "i64", np.int64),
}
C_TYPES = {"f32": "float", "f64": "double", "i8": "signed char", "i16": "short",
           "i32": "int", "i64": "long long"}


def _harness_source() -> str:
    parts = ["#include <math.h>", "#include <string.h>", PRELUDE_C]
    table = ", ".join(c_float(float(v), "float") for v in np.concatenate([FLOATS, INFNAN]))
    parts.append(f"static const float float_table[] = {{{table}}};")
    table = ", ".join(c_float(float(v), "double") for v in DOUBLES)
    parts.append(f"static const double double_table[] = {{{table}}};")
    parts.append("void floats(void** b) { memcpy(b[0], float_table, sizeof float_table); }")
    parts.append("void doubles(void** b) { memcpy(b[0], double_table, sizeof double_table); }")
    parts.append("""
void f2h(void** b, long long n) {
  const float* x = b[0]; unsigned short* y = b[1];
  for (long long i = 0; i < n; ++i) y[i] = accy_f2h(x[i]);
}
void h2f(void** b, long long n) {
  const unsigned short* x = b[0]; float* y = b[1];
  for (long long i = 0; i < n; ++i) y[i] = accy_h2f(x[i]);
}
void f2bf(void** b, long long n) {
  const float* x = b[0]; unsigned short* y = b[1];
  for (long long i = 0; i < n; ++i) y[i] = accy_f2bf(x[i]);
}
void bf2f(void** b, long long n) {
  const unsigned short* x = b[0]; float* y = b[1];
  for (long long i = 0; i < n; ++i) y[i] = accy_bf2f(x[i]);
}""")
    for name, (src, dst, _) in CASTS.items():
        parts.append(_cast_fn(name, src, dst, C_TYPES[dst], C_TYPES[src]))
    to_half = ExprBuilder([], cuda=False).cast("v", "f64", "f16")
    parts.append("void f64_to_f16(void** b, long long n) {\n"
                 "  const double* x = b[0]; unsigned short* y = b[1];\n"
                 "  for (long long i = 0; i < n; ++i) { const double v = x[i]; "
                 f"y[i] = accy_f2h({to_half}); }}\n}}")
    return "\n".join(parts) + "\n"


@pytest.fixture(scope="module")
def lib(tmp_path_factory) -> HostLibrary:
    return HostLibrary(compile_host(_harness_source(), str(tmp_path_factory.mktemp("harness")),
                                    name="harness"))


def test_float_literals_are_exact(lib):
    got = np.empty(len(FLOATS) + 3, np.float32)
    lib.call_with_buffers("floats", [got])
    np.testing.assert_array_equal(got[:len(FLOATS)].view(np.uint32), FLOATS.view(np.uint32))
    assert got[-3] == np.inf and got[-2] == -np.inf and np.isnan(got[-1])


def test_double_literals_are_exact(lib):
    got = np.empty(len(DOUBLES), np.float64)
    lib.call_with_buffers("doubles", [got])
    np.testing.assert_array_equal(got.view(np.uint64), DOUBLES.view(np.uint64))


def test_a_float_literal_of_a_double_rounds_to_float32_first():
    x = 0.1  # not a float32: the literal is the float32 nearest it
    assert float.fromhex(c_float(x, "float")[:-1]) == struct.unpack("<f", struct.pack("<f", x))[0]


# ------------------------------------------------------------------- casts


def _expected_cast(x: np.ndarray, dtype) -> np.ndarray:
    """Truncate toward zero, saturate at the type's range, NaN → 0 (the reference's rule)."""
    info = np.iinfo(dtype)
    out = np.zeros(x.shape, dtype)
    for i, v in enumerate(x.astype(np.float64)):
        if math.isnan(v):
            out[i] = 0
        elif v >= info.max:
            out[i] = info.max
        elif v <= info.min:
            out[i] = info.min
        else:
            out[i] = int(math.trunc(v))
    return out


CAST_INPUTS = np.concatenate([
    RNG.standard_normal(2000) * 10.0 ** RNG.integers(0, 20, 2000),
    [0.0, -0.0, 0.5, -0.5, 0.999, -0.999, 127.5, 128.0, -128.5, -129.0, 255.0, 32767.9,
     32768.0, -32769.0, 2147483520.0, 2147483648.0, -2147483648.0, -2147483904.0,
     9.2233715e18, 9.2233725e18, -9.2233725e18, -1e19, 1e30, -1e30,
     np.inf, -np.inf, np.nan, -np.nan]])


@pytest.mark.parametrize("name", sorted(CASTS))
def test_float_to_integer_casts_truncate_and_saturate(lib, name):
    src, _, dtype = CASTS[name]
    x = CAST_INPUTS.astype(np.float32 if src == "f32" else np.float64)
    got = np.zeros(len(x), dtype)
    lib.call_with_buffers(name, [x, got], len(x))
    want = _expected_cast(x, dtype)
    bad = np.nonzero(got != want)[0]
    assert bad.size == 0, [(x[i], got[i], want[i]) for i in bad[:5]]


def test_the_cast_rule_matches_the_reference_interpreter(lib):
    from accy.reference import run_reference

    m = parse_module('''"builtin.module"() ({
  "func.func"() <{function_type = (tensor<?xf32>) -> (tensor<?xi8>, tensor<?xi64>), sym_name = "main"}> ({
  ^bb0(%x: tensor<?xf32>):
    %0 = "semantic.cast"(%x) : (tensor<?xf32>) -> tensor<?xi8>
    %1 = "semantic.cast"(%x) : (tensor<?xf32>) -> tensor<?xi64>
    "func.return"(%0, %1) : (tensor<?xi8>, tensor<?xi64>) -> ()
  }) : () -> ()
}) : () -> ()''')
    x = CAST_INPUTS.astype(np.float32)
    with np.errstate(invalid="ignore"):
        want8, want64 = run_reference(m, [x])
    np.testing.assert_array_equal(want8, _expected_cast(x, np.int8))
    np.testing.assert_array_equal(want64, _expected_cast(x, np.int64))


# ---------------------------------------------------------- f16 and bf16 helpers


def _halfish_floats() -> np.ndarray:
    """Values around the f16 range: normals, subnormals, overflow, and exact ties."""
    parts = [
        RNG.standard_normal(3000).astype(np.float32) * np.float32(100),
        (RNG.uniform(-1, 1, 2000) * 2.0 ** RNG.integers(-30, 18, 2000)).astype(np.float32),
        RNG.integers(0, 1 << 32, 3000, dtype=np.uint64).astype(np.uint32).view(np.float32),
    ]
    # exact halfway points between neighbouring halves (ties: round to even)
    h = RNG.integers(0, 0x7BFF, 2000, dtype=np.uint16)
    lo = h.view(np.float16).astype(np.float64)
    hi = (h + 1).view(np.float16).astype(np.float64)
    parts.append(((lo + hi) / 2).astype(np.float32))
    parts.append(np.array([65504.0, 65519.996, 65520.0, 1e5, -65520.0, 6.1e-5, 5.96e-8,
                           2.98e-8, 2.9802322e-08, 2.9802326e-08, 1e-9, -0.0, 0.0, np.inf,
                           -np.inf, np.nan], dtype=np.float32))
    return np.concatenate(parts)


def test_f32_to_f16_rounds_like_numpy(lib):
    x = _halfish_floats()
    assert len(x) >= N
    got = np.empty(len(x), np.uint16)
    lib.call_with_buffers("f2h", [x, got], len(x))
    with np.errstate(over="ignore"):
        want = x.astype(np.float16)
    nan = np.isnan(x)
    assert np.all(np.isnan(got[nan].view(np.float16)))
    bad = np.nonzero(got[~nan] != want[~nan].view(np.uint16))[0]
    assert bad.size == 0, [(x[~nan][i], hex(got[~nan][i])) for i in bad[:5]]


def test_f16_to_f32_is_exact_for_every_half(lib):
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    got = np.empty(len(h), np.float32)
    lib.call_with_buffers("h2f", [h, got], len(h))
    want = h.view(np.float16).astype(np.float32)
    nan = np.isnan(want)
    np.testing.assert_array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))
    assert np.all(np.isnan(got[nan]))


def _bf16_nearest(x: np.ndarray) -> np.ndarray:
    """Round float32 to bfloat16 by comparing the two neighbours (ties to even)."""
    bits = x.view(np.uint32).astype(np.uint64)
    down = bits & 0xFFFF0000
    up = down + 0x10000
    out = np.empty(len(x), np.uint16)
    for i, v in enumerate(x.astype(np.float64)):
        d = int(down[i])
        if bits[i] == d:
            out[i] = d >> 16
            continue
        a = abs(np.uint32(d).view(np.float32).astype(np.float64))
        u = int(up[i])
        b = 2.0 ** 128 if (u & 0x7FFFFFFF) == 0x7F800000 else \
            abs(np.uint32(u).view(np.float32).astype(np.float64))
        m = abs(v)
        if m - a < b - m or (m - a == b - m and not (d >> 16) & 1):
            out[i] = d >> 16
        else:
            out[i] = u >> 16
    return out


def test_f32_to_bf16_rounds_to_nearest_even(lib):
    x = np.concatenate([
        RNG.standard_normal(4000).astype(np.float32),
        RNG.integers(0, 1 << 32, 4000, dtype=np.uint64).astype(np.uint32).view(np.float32),
        # exact ties: the dropped half-word is 0x8000
        ((RNG.integers(0, 0x7F7F, 2000, dtype=np.uint32) << 16) | 0x8000).view(np.float32),
        np.array([3.3895314e38, 3.4028235e38, -3.4028235e38, 1e-40, -0.0, np.inf, -np.inf,
                  np.nan], dtype=np.float32),
    ])
    got = np.empty(len(x), np.uint16)
    lib.call_with_buffers("f2bf", [x, got], len(x))
    nan = np.isnan(x)
    as_f32 = (got.astype(np.uint32) << 16).view(np.float32)
    assert np.all(np.isnan(as_f32[nan]))
    want = _bf16_nearest(x[~nan])
    bad = np.nonzero(got[~nan] != want)[0]
    assert bad.size == 0, [(x[~nan][i], hex(got[~nan][i]), hex(want[i])) for i in bad[:5]]
    # the reference interpreter rounds the same way
    from accy.reference import round_bf16_array

    np.testing.assert_array_equal(round_bf16_array(x[~nan]), as_f32[~nan])


def test_bf16_to_f32_is_the_high_half(lib):
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    got = np.empty(len(h), np.float32)
    lib.call_with_buffers("bf2f", [h, got], len(h))
    np.testing.assert_array_equal(got.view(np.uint32), h.astype(np.uint32) << 16)


def test_f64_to_f16_rounds_once(lib):
    """Not through float rounded to nearest: a value just past a tie must round up."""
    h = RNG.integers(0, 0x7BFF, 5000, dtype=np.uint16)
    lo = h.view(np.float16).astype(np.float64)
    hi = (h + 1).view(np.float16).astype(np.float64)
    mid = (lo + hi) / 2
    x = np.concatenate([
        mid, mid + np.abs(mid) * 2.0 ** -40, mid - np.abs(mid) * 2.0 ** -40,
        RNG.standard_normal(2000) * 10.0 ** RNG.integers(-9, 6, 2000),
        [65519.99999, 65520.0, 1e300, -1e300, 2.0 ** -25, 2.0 ** -25 + 2.0 ** -60, 0.0, -0.0,
         np.inf, -np.inf, np.nan]])
    assert len(x) >= N
    got = np.empty(len(x), np.uint16)
    lib.call_with_buffers("f64_to_f16", [x, got], len(x))
    with np.errstate(over="ignore"):
        want = x.astype(np.float16)
    nan = np.isnan(x)
    assert np.all(np.isnan(got[nan].view(np.float16)))
    bad = np.nonzero(got[~nan] != want[~nan].view(np.uint16))[0]
    assert bad.size == 0, [(x[~nan][i], got[~nan][i].view(np.float16)) for i in bad[:5]]


def test_pointers_that_share_memory_are_not_restrict() -> None:
    """An output written in place over its input: neither pointer is restrict."""
    import re

    from accy.pipeline import prepare_through
    from accy.preparation.options import RunOptions
    from accy.preparation.products import SemanticModule

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sm = SemanticModule.from_file(os.path.join(root, "graphs", "elementwise_chain.mlir"))
    for target in ("cuda:sm_90", "host"):
        job = prepare_through(sm, "target", RunOptions.parse(target, ["dispatch.fuse=false"]),
                              {0: (8, 64), 1: (1, 64)}).product
        source = job.source
        kernels = [op for op in job.module.body.ops if op.op_name == "kernel.func"]
        aliased = [k for k in kernels if k.plan.aliased_params]
        assert aliased, "expected an in-place kernel with fusion off"
        for k in aliased:
            n_in = len(k.body.args)
            for p in k.plan.aliased_params:
                name = f"in{p}" if p < n_in else f"out{p - n_in}"
                decl = re.search(rf"{k.sym_name}\(.*?\)" if target != "host" else
                                 rf"void {k.sym_name}\(void\*\* buffers\) {{.*?\n}}",
                                 source, re.S).group(0)
                line = next(x for x in decl.replace(",", "\n").splitlines()
                            if re.search(rf"\* *(?:__restrict__ |restrict )?{name}\b", x))
                assert "restrict" not in line, line
