"""CUDA C for ``cuda:sm_XX``: one self-contained translation unit.

NVRTC compiles it with nothing but ``-arch=sm_XX``: no includes (the few
helpers it needs are defined here; math functions and vector types are
NVRTC built-ins). The launch table travels in a comment at the end.

Kernels follow the kernel stage's plan: grid-stride elementwise loops with
16-byte vector loads and stores (two adjacent halves a 32-bit word through the
ops the plan packs: :mod:`accy.target.packed`); one block (or warp) per row with inputs
cached in registers and warp-shuffle reduction trees; shared-memory tiled
matmul with the epilogue applied in registers; flash attention
(:mod:`accy.target.attention`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from accy.choir.ir import Operation, Value
from accy.dialects.kernel import FFMA_A_PAD, ROW_PARTIAL_SETS, KernelFuncOp, KernelPlan
from accy.target.attention import emit_attention_cuda
from accy.target.common import (
    COMPUTE,
    LANE,
    STORAGE,
    ExprBuilder,
    MatmulDims,
    Scope,
    combine,
    decompose,
    elem_of,
    load_convert,
    reduce_init,
    round_compute,
    shape_of,
    split_yields,
    store_convert,
    stored_only,
    strides_of,
    translation_unit,
)
from accy.target.packed import half_lanes, round_pack
from accy.target.packed import helpers as packed_helpers
from accy.target.pairs import PairBuilder

PRELUDE = r"""
#define INFINITY __int_as_float(0x7f800000)
#define NAN __int_as_float(0x7fffffff)
__device__ __forceinline__ float accy_h2f(unsigned short h) {
  float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
}
__device__ __forceinline__ unsigned short accy_f2h(float f) {
  unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
}
__device__ __forceinline__ float accy_d2f_odd(double x) {
  float f = __double2float_rz(x);
  return ((double)f != x && x == x) ? __uint_as_float(__float_as_uint(f) | 1u) : f;
}
__device__ __forceinline__ float accy_bf2f(unsigned short h) {
  return __uint_as_float(((unsigned int)h) << 16);
}
__device__ __forceinline__ unsigned short accy_f2bf(float f) {
#if __CUDA_ARCH__ >= 800
  unsigned int r; asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(f), "f"(0.0f));
  return (unsigned short)(r >> 16);
#else  // no bf16 conversion before sm_80: to nearest, ties to even, NaN the canonical one
  const unsigned int u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff;
  return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
#endif
}
__device__ __forceinline__ int accy_idiv_int(int a, int b) { return b == 0 ? 0 : a / b; }
__device__ __forceinline__ long long accy_idiv_ll(long long a, long long b) {
  return b == 0 ? 0 : a / b;
}
__device__ __forceinline__ unsigned long long accy_idiv_ull(unsigned long long a,
                                                            unsigned long long b) {
  return b == 0 ? 0 : a / b;
}
__device__ __forceinline__ unsigned long long accy_ipow_ull(unsigned long long a,
                                                            unsigned long long b) {
  unsigned long long r = 1; while (b) { if (b & 1) r *= a; a *= a; b >>= 1; } return r;
}
__device__ __forceinline__ int accy_ipow_int(int a, int b) {
  if (b < 0) return (a == 1) ? 1 : (a == -1 ? ((b & 1) ? -1 : 1) : 0);
  int r = 1; while (b) { if (b & 1) r *= a; a *= a; b >>= 1; } return r;
}
__device__ __forceinline__ long long accy_ipow_ll(long long a, long long b) {
  if (b < 0) return (a == 1) ? 1 : (a == -1 ? ((b & 1) ? -1 : 1) : 0);
  long long r = 1; while (b) { if (b & 1) r *= a; a *= a; b >>= 1; } return r;
}
"""

ERFC_COEFFICIENTS = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806,
                     0.27886807, -1.13520398, 1.48851587, -0.82215223, 0.17087277)
"""``c_k`` of ``erfc(a) = t·exp(Σ c_k t^k - a²)``, ``t = 1/(1 + a/2)``, ``a ≥ 0``: the
Chebyshev fit of Numerical Recipes' ``erfcc`` (relative error below 1.2e-7 in exact
arithmetic)."""


def _erfc_w_coefficients() -> tuple[float, ...]:
    """The same polynomial in ``w = a·t = 2(1 - t)``, constant term first:
    ``Σ c_k t^k = Σ e_k w^k``. It is small where erfc is near 1 (``w → 0``), so f32
    Horner does not lose its low bits to cancelling ``c_0 + c_1 + …`` there.

    >>> e = _erfc_w_coefficients(); abs(e[0]) < 1e-7   # erfc(0) = exp(e_0) = 1
    True
    """
    n = len(ERFC_COEFFICIENTS)
    return tuple(sum(ERFC_COEFFICIENTS[j] * math.comb(j, k) for j in range(k, n)) * (-0.5) ** k
                 for k in range(n))


def _horner(coefficients: tuple[float, ...], var: str) -> str:
    """``Σ c_k var^k`` (``coefficients`` constant term first) as nested ``fmaf``s."""
    poly = f"{coefficients[-1]!r}f"
    for c in reversed(coefficients[:-1]):
        poly = f"fmaf({poly}, {var}, {c!r}f)"
    return poly


def _erfc_poly() -> str:
    """The erfc polynomial in ``w`` (:func:`_erfc_w_coefficients`) as nested ``fmaf``s."""
    return _horner(_erfc_w_coefficients(), "w")


HALF_ERFC_K = 0.375
"""``k`` of the half-precision erfc's ``t = 1/(1 + k·a)``: of every ``k = j/32`` in
[1/4, 3/4], the one whose degree-6 fit (:data:`HALF_ERFC_COEFFICIENTS`) is closest
(2^-19 against 2^-17.1 for Numerical Recipes' ``k = 1/2``)."""

HALF_ERFC_COEFFICIENTS = (4.845389800500755e-07, -1.0869418578344912, 0.015788705602846703,
                          0.03891532619634568, 0.007994538491937937, -0.007436568340817821,
                          0.0011352152076209239)
"""``e_k`` of ``erfc(a) = t·2^(Σ e_k w^k - a²·log2 e)`` with ``t = 1/(1 + k·a)``, ``w =
a·t`` and ``k`` = :data:`HALF_ERFC_K`, constant term first: the Chebyshev least-squares
fit, degree 6, of ``log2(erfc(a)·(1 + k·a)) + a²·log2 e`` over ``w`` in
``[0, w(10.06)]`` at 4000 Chebyshev nodes (``accy.numerics.erfc``; the fit is redone in
``tests/target/test_erfc_helper.py``): 2^-18.5 in the exponent, a relative error of
2^-19 in exact arithmetic."""

HALF_ERFC_SCALE = 32
"""The power of two the half-precision erfc's exponent is raised by, and ``t`` lowered
by, so that ``exp2`` never returns a subnormal for ``a ≤ 10.55`` (its argument stays
above -126) and may flush (``ex2.approx.ftz``, one instruction where the subnormal-safe
form takes four): ``t·2^-32`` times ``2^(s + 32)`` rounds to the same subnormal
``t·2^s``."""


def _erfc_head(qualifier: str, name: str, reciprocal: str, k: float = 0.5,
               scale: float = 1.0) -> str:
    """An erfc helper's signature and first statements: ``a = |x|``, ``u = (1 + k·a)·scale``
    and ``t`` ≈ ``1/u`` (``reciprocal``)."""
    return (f"{qualifier} float {name}(float x) {{\n"
            f"  const float a = fabsf(x), u = fmaf({k * scale!r}f, a, {scale!r}f);\n"
            f"  float t;\n  {reciprocal}\n")


def erfc_helper(qualifier: str, reciprocal: str, square: str = "a * a") -> str:
    """C text of ``float accy_erfcf(float x)``: erfc in ~40 f32 instructions and two
    special-function ops where CUDA's ``erfcf`` takes ~55 and three (its rational
    approximation needs two reciprocals): the bias_gelu kernel is 208 SASS instructions
    with it, 248 with ``erfcf`` (it is issue-bound either way on the H200: RESULTS.md,
    Kernels, seventh session).

    ``t`` is refined by one Newton step from ``reciprocal`` (statements that set ``t``
    to about ``1/u``; ``square`` is ``a²`` rounded, an expression the compiler must not
    contract into an FMA),
    and ``exp`` gets the sum ``P(t) - a²`` with its rounding error and that of ``a²``
    (TwoSum and an FMA) folded back in first order: without them the exponent's
    rounding alone costs up to 67 ulp near ``a = 9``. Against a float64 erfc at every
    97th f32 in [0, 10.06]: at most 4.6 ulp built by the host compiler
    (``tests/target/test_erfc_helper.py``), and the device build is held to 6
    (``tests/executable/test_kernels_gpu.py``); CUDA
    documents 4 for ``erfcf``. ``erfc(-a) = 2 - erfc(a)``; NaN stays NaN; past 10.06 the
    result is 0 (the f32 value of erfc there).
    """
    return (_erfc_head(qualifier, "accy_erfcf", reciprocal) +
            f"  t = fmaf(t, fmaf(-u, t, 1.0f), t);\n"
            f"  const float w = a * t, p = {_erfc_poly()};\n"
            f"  const float aa = {square}, lo = fmaf(a, a, -aa);\n"
            f"  const float s = p - aa, bb = s - p, e = (p - (s - bb)) + (-aa - bb);\n"
            f"  float r = t * expf(s);\n"
            f"  r = fmaf(r, e - lo, r);\n"
            f"  r = a > 10.06f ? 0.0f : r;\n"
            f"  return x < 0.0f ? 2.0f - r : r;\n"
            f"}}")


def erfc_half_helper(qualifier: str, reciprocal: str, exp2: str) -> str:
    """C text of ``float accy_erfcf_half(float x)``: erfc for a value that only needs to
    be right to a small fraction of a half-precision ulp (an erfc whose every use reaches
    a store through products and ends in a cast to f16 or bf16:
    :meth:`accy.target.common.ExprBuilder.half_demand`, as in gelu on half inputs).

    ``erfc(|x|) = t·2^(P(w) - a²·log2 e)`` with its own degree-6 fit
    (:data:`HALF_ERFC_COEFFICIENTS`), ``t ≈ 1/(1 + k·a)`` by ``reciprocal`` (statements
    that set ``t`` from ``u``; on CUDA one ``rcp.approx.ftz``) and ``exp2`` (on CUDA one
    ``ex2.approx.ftz.f32``: :data:`HALF_ERFC_SCALE` keeps its results normal, so ``u``
    and ``t`` carry that scale). ``w`` is ``(1 - t/t(0))/k``, not ``a·t``: ``1/k``
    where ``a`` is infinite (``t = 0``), so the result there is ``0·2^-∞ = 0`` with no
    clamp (past ``a = 10.55`` the exponent flushes to 0); NaN stays NaN;
    ``erfc(-a) = 2 - erfc(a)``. About 16 instructions where :func:`erfc_helper`'s f32
    erfc takes 40. Relative error at most 2^-16 (``tests/target/test_erfc_helper.py``:
    2^-17.1 on the host), against a bf16 ulp of 2^-8 and an f16 one of 2^-11."""
    k, scale = HALF_ERFC_K, float(2 ** HALF_ERFC_SCALE)
    e = (HALF_ERFC_COEFFICIENTS[0] + HALF_ERFC_SCALE,) + HALF_ERFC_COEFFICIENTS[1:]
    return (_erfc_head(qualifier, "accy_erfcf_half", reciprocal, k, scale) +
            f"  const float w = fmaf({-scale / k!r}f, t, {1 / k!r}f);\n"
            f"  const float r = t * {exp2}(fmaf(-a, a * 1.44269504f, {_horner(e, 'w')}));\n"
            f"  return x < 0.0f ? 2.0f - r : r;\n"
            f"}}")


def exp_half_helper(qualifier: str, exp2: str) -> str:
    """C text of ``float accy_exp_half(float x)``: ``exp(x)`` for a value that need only
    be right to a small fraction of a half-precision ulp
    (:meth:`accy.target.common.ExprBuilder.half_demand`: a softmax's numerators and
    their row sum, when the softmax is stored in f16 or bf16): ``exp2`` of ``x · log2
    e``. On CUDA that is ``exp2f``: one ``MUFU.EX2`` (``ex2.approx``, 2 ulp), with a
    predicated halving and squaring that keep subnormal results — five instructions
    where ``expf`` takes eight to ten — and a function the compiler knows to be pure,
    so the two column loops of a softmax share one ``exp`` a value (``ex2.approx`` in
    inline asm is not shared: 64 ``MUFU.EX2`` for 32 values). Rounding ``x · log2 e``
    costs a relative error of at most ``|x| · 2^-24`` in the result: over the whole
    range of finite results (``|x| < 104``) at most 2^-16.7 with ``exp2``'s own
    (``tests/target/test_half_quotients.py``), against a bf16 ulp of 2^-8 and an f16
    one of 2^-11."""
    return f"{qualifier} float accy_exp_half(float x) {{ return {exp2}(x * 1.44269504f); }}"


def sigmoid_half_helper(qualifier: str, exp2: str, reciprocal: str) -> str:
    """C text of ``float accy_sigmoid_half(float x)``: ``1 / (1 + exp(-x))`` for a value
    that need only be right to a small fraction of a half ulp (gelu's tanh form on half
    inputs): ``exp2`` of ``-x · log2 e``, whose relative error ``1 + e`` only shrinks
    (``e ≥ 0``), and ``reciprocal`` (statements that set ``r`` from ``y``) for IEEE
    division. On CUDA both flush (``ex2.approx.ftz``, ``rcp.approx.ftz``: one
    instruction each where the subnormal-safe forms take four and seven, 1 ulp): an
    ``exp`` below 2^-126 adds nothing to 1, and ``y = (1 + e)·2^-64`` (exact: a power
    of two) keeps the reciprocal normal until ``e`` passes 2^190, so that ``r·2^-64``
    rounds a subnormal sigmoid as IEEE division would. About 6 instructions where the
    f32 spelling takes about 20. Relative error at most 2^-16.6
    (``tests/target/test_half_quotients.py``). Where ``exp(-x)`` overflows
    (``x < -88.7``) the result is 0, as in f32."""
    return (f"{qualifier} float accy_sigmoid_half(float x) {{\n"
            f"  const float y = fmaf({exp2}(x * -1.44269504f), 0x1p-64f, 0x1p-64f);\n"
            f"  float r; {reciprocal}\n  return r * 0x1p-64f;\n}}")


HSCALE = 64
"""``accy_hscale(b)``'s power of two: ``2^-64`` for ``|b| > 2^64``, ``2^64`` for
``|b| < 2^-64``, else 1."""


def hscale_helper(qualifier: str) -> str:
    """C text of ``float accy_hscale(float b)``: the power of two ``s`` that brings a
    row's divisor ``b`` into ``[2^-64, 2^64]`` (:data:`HSCALE`), so that ``r = 1 / (b·s)``,
    made once a row by IEEE division, is a normal number. A quotient that need only be
    right to half precision (:meth:`accy.target.common.ExprBuilder.row_quotient`) is
    then ``(a·s)·r``: two products, not the ten instructions of a division. ``a·s`` is
    exact, or overflows only where ``a / b`` does, or is subnormal only where ``a / b``
    is below 2^-126 (then off by at most 2^-150); ``r`` is correctly rounded, so the
    quotient is within 2^-23 of ``a / b`` (``tests/target/test_half_quotients.py``). Zero,
    infinite and NaN divisors give IEEE's zero, infinity or NaN quotients."""
    return (f"{qualifier} float accy_hscale(float b) {{\n"
            f"  const float m = fabsf(b);\n"
            f"  return m > 0x1p{HSCALE}f ? 0x1p-{HSCALE}f : (m < 0x1p-{HSCALE}f ? "
            f"0x1p{HSCALE}f : 1.0f);\n}}")


FDIV_SHORT_A = (-62, 62)
"""Binary exponents bounding ``|a|`` for :func:`fdiv_helpers`' short path (and ``|b|`` in
two less on each side): inside them no intermediate of the short path is subnormal,
zero, infinite or NaN, and every step is exact or rounded once as IEEE division's own
short path has it."""


def fdiv_helpers(qualifier: str, reciprocal: str, long_qualifier: str | None = None) -> str:
    """C text of ``accy_fdiv_rcp(b)``, ``accy_fdiv_lo(b)`` and ``accy_fdiv_by(a, b, r,
    lo)``: ``a / b`` correctly rounded, for a divisor ``b`` many quotients share (a row's
    sum or maximum), with the work that depends on ``b`` alone done once.

    IEEE division (``div.rn.f32``) is, in the SASS ptxas writes for it, a reciprocal
    (``MUFU.RCP``) refined by one Newton step, the quotient ``q = a·r`` corrected once
    (``q + r·(a − b·q)``, the residual exact in an FMA), and an ``FCHK`` that sends
    operands of extreme range to a long path: ten instructions a quotient, the
    reciprocal among them. Here the reciprocal (``reciprocal``: statements setting ``r``
    to about ``1/b``, then the same Newton step) is made once per divisor; a quotient
    is the same correction when ``|a|`` and ``|b|`` lie well inside the normal range
    (:data:`FDIV_SHORT_A`: ``2^-62 ≤ |a| ≤ 2^62``, ``2^-60 ≤ |b| ≤ 2^60``, so no
    intermediate leaves it), and ``a / b`` itself otherwise, in a function of its own
    (``long_qualifier``; ``__noinline__`` on the device keeps one copy of it, not one a
    quotient): zeros, subnormals, infinities and NaN all take IEEE division. On sm_90
    softmax's quotient is then eight instructions, not ten, and its kernel 1024
    instead of 1160. ``accy_fdiv_lo(b)`` is the least ``|a|`` on the short path, or
    ``+inf`` where ``b`` is out of range (every quotient by it takes the long path).
    Inside the range every step scales exactly with the operands' exponents, so the
    pairs of mantissas at one pair of exponents stand for all of it:
    ``benchmarks/fdiv_check.py`` runs every such pair on the GPU against a float64
    quotient rounded once (exact: 53 ≥ 2·24 + 2 bits).
    """
    lo_a, hi_a = FDIV_SHORT_A
    return (f"{long_qualifier or qualifier} float accy_fdiv_long(float a, float b) {{ "
            "return a / b; }\n"
            f"{qualifier} float accy_fdiv_rcp(float b) {{\n"
            f"  float r; {reciprocal}\n"
            f"  return fmaf(r, fmaf(-b, r, 1.0f), r);\n}}\n"
            f"{qualifier} float accy_fdiv_lo(float b) {{\n"
            f"  const float m = fabsf(b);\n"
            f"  return (m >= 0x1p{lo_a + 2}f && m <= 0x1p{hi_a - 2}f) ? 0x1p{lo_a}f : "
            "INFINITY;\n}\n"
            f"{qualifier} float accy_fdiv_by(float a, float b, float r, float lo) {{\n"
            f"  const float m = fabsf(a);\n"
            f"  float q = a * r;\n"
            f"  q = fmaf(r, fmaf(-b, q, a), q);\n"
            f"  if (!(m >= lo && m <= 0x1p{hi_a}f)) q = accy_fdiv_long(a, b);\n"
            f"  return q;\n}}")


def fminmax_helpers(qualifier: str, native: bool) -> dict[str, str]:
    """C text of ``accy_fmaxf`` and ``accy_fminf``, by name: accy's NaN-propagating max
    and min (:func:`accy.target.common.combine`), one ``max.NaN`` / ``min.NaN`` from sm_80
    on (``native``; a compare and a select else). The two spellings differ only in the
    sign of a zero result and in a NaN's payload; a reduction's order already decides
    the former (``max(-0, +0)`` is whichever came first), so reductions use these."""
    out = {}
    for kind, cmp in (("max", ">"), ("min", "<")):
        plain = f"return (a {cmp} b || a != a) ? a : b;"
        lines = [f"{qualifier} float accy_f{kind}f(float a, float b) {{"]
        if native:
            lines += ["#if __CUDA_ARCH__ >= 800",
                      f'  float r; asm("{kind}.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), '
                      '"f"(b)); return r;', "#else", f"  {plain}", "#endif"]
        else:
            lines.append(f"  {plain}")
        out[f"accy_f{kind}f"] = "\n".join(lines + ["}"])
    return out


HELPERS = {
    "accy_erfcf": erfc_helper(
        "__device__ __forceinline__",
        'asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(t) : "f"(u));', "__fmul_rn(a, a)"),
    "accy_ex2f_ftz": r"""__device__ __forceinline__ float accy_ex2f_ftz(float x) {
  float r; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x)); return r;
}""",
    "accy_erfcf_half": erfc_half_helper(
        "__device__ __forceinline__", 'asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(t) : "f"(u));',
        "accy_ex2f_ftz"),
    "accy_exp_half": exp_half_helper("__device__ __forceinline__", "exp2f"),
    "accy_sigmoid_half": sigmoid_half_helper(
        "__device__ __forceinline__", "accy_ex2f_ftz",
        'asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(y));'),
    "accy_hscale": hscale_helper("__device__ __forceinline__"),
    # the paired conversions are sm_80's; before it, one lane at a time
    "accy_pack_h2": r"""__device__ __forceinline__ unsigned int accy_pack_h2(float lo, float hi) {
#if __CUDA_ARCH__ >= 800
  unsigned int r; asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r;
#else
  return accy_f2h(lo) | ((unsigned int)accy_f2h(hi) << 16);
#endif
}""",
    "accy_pack_bf2": r"""__device__ __forceinline__ unsigned int accy_pack_bf2(float lo, float hi) {
#if __CUDA_ARCH__ >= 800
  unsigned int r; asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo)); return r;
#else
  return accy_f2bf(lo) | ((unsigned int)accy_f2bf(hi) << 16);
#endif
}""",
    "accy_fdiv_by": fdiv_helpers("__device__ __forceinline__",
                                 'asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(b));',
                                 "__device__ __noinline__"),
    **fminmax_helpers("__device__ __forceinline__", native=True),
    **packed_helpers(),
    # a TMA tensor map as the loader encodes it (CUtensorMap: 128 opaque bytes), and a
    # wait on an mbarrier's phase of the given parity
    "accy_mbar_wait": r"""struct __align__(64) accy_tmap { unsigned long long w[16]; };
__device__ __forceinline__ void accy_mbar_wait(unsigned bar, unsigned parity) {
  unsigned done = 0;
  while (!done)
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                 "selp.u32 %0, 1, 0, p;\n}\n" : "=r"(done) : "r"(bar), "r"(parity) : "memory");
}""",
    # a wgmma shared-memory matrix descriptor, 128-byte swizzle: start address, leading
    # and stride byte offsets, each in 16-byte units (PTX ISA, "Matrix Descriptor Format")
    "accy_wgmma_desc": r"""__device__ __forceinline__ unsigned long long accy_wgmma_desc(
    unsigned addr, unsigned lead, unsigned stride) {
  return (unsigned long long)((addr & 0x3FFFF) >> 4) | ((unsigned long long)(lead >> 4) << 16)
       | ((unsigned long long)(stride >> 4) << 32) | (1ull << 62);
}""",
}
"""Helpers defined only in a translation unit that calls them (by name), or whose helper
does (:func:`used_helpers`): each before the helpers that call it."""


def used_helpers(text: str) -> list[str]:
    """The :data:`HELPERS` that ``text`` calls, and those that they call, in order.

    >>> [h.split("(")[0].split()[-1] for h in used_helpers("accy_erfcf_half(x)")]
    ['accy_ex2f_ftz', 'accy_erfcf_half']
    """
    used: set[str] = set()
    pending = [text]
    while pending:
        body = pending.pop()
        for name, helper in HELPERS.items():
            if name not in used and name + "(" in body:
                used.add(name)
                pending.append(helper)
    return [h for name, h in HELPERS.items() if name in used]

LANES = "xyzw"


def launch_scalars(k: KernelFuncOp) -> tuple[int, ...]:
    """The 64-bit values kernel ``k`` takes at launch, after its buffers and tensor maps:
    the extents that follow a program's leading (usually dynamic) dim — an elementwise
    kernel's count of vectors, the row count that a row kernel of several rows a block
    checks. They are parameters, not literals, so variants that differ only in that
    extent render one source and one compile serves them all
    (:func:`accy.executable.compile.compile_fragments` compiles each source once).

    >>> from accy.dialects.kernel import KernelPlan
    >>> class K: plan = KernelPlan(kind="elementwise", mapping="grid-stride",
    ...                            block=(256, 1, 1), grid=(64, 1, 1), iteration=(16, 4096),
    ...                            vector_width=4)
    >>> launch_scalars(K())  # type: ignore[arg-type]
    (16384,)
    """
    plan = k.plan
    if plan.kind == "elementwise":
        return (math.prod(plan.iteration) // plan.vector_width,)
    if plan.kind == "rows" and plan.mapping in ("warp-per-row", "thread-per-row"):
        return (plan.rows,)
    return ()


SCALAR_NAMES = {"elementwise": "accy_n", "rows": "accy_rows"}
"""The parameter name of a kind's :func:`launch_scalars` value in its kernel."""


def _params(k: KernelFuncOp) -> tuple[list[str], list[str], list[str]]:
    ins = [f"in{i}" for i in range(len(k.body.args))]
    outs = [f"out{i}" for i in range(len(k.body.terminator.operands))]  # type: ignore[union-attr]
    aliased = set(k.plan.aliased_params)

    def qual(i: int) -> str:  # pointers that share memory are not restrict
        return "" if i in aliased else " __restrict__"

    params = [f"const {STORAGE[elem_of(a)]}*{qual(i)} {n}"
              for i, (a, n) in enumerate(zip(k.body.args, ins))]
    params += [f"{STORAGE[elem_of(v)]}*{qual(len(ins) + i)} {n}"
               for i, (v, n) in enumerate(zip(k.body.terminator.operands, outs))]  # type: ignore[union-attr]
    if launch_scalars(k):
        params.append(f"const long long {SCALAR_NAMES[k.plan.kind]}")
    return ins, outs, params


HALF_WORDS = {2: "unsigned int", 4: "uint2", 8: "uint4"}
"""The vector type that holds ``vec`` halves (f16/bf16), by ``vec``."""


def _word(name: str, vec: int, w: int) -> str:
    return name if vec == 2 else f"{name}.{LANES[w]}"


def half_words(name: str, pointer: str, vec: int) -> str:
    """One ``vec``-half vector load at ``pointer`` (``__ldg``) into ``name``, its words
    as loaded (:func:`_word` names them)."""
    vt = HALF_WORDS[vec]
    return f"const {vt} {name} = {vector_load(vt, pointer)};"


def half_load(name: str, pointer: str, vec: int, el: str) -> list[str]:
    """:func:`half_words`, unpacked to floats ``name_0…``."""
    lines = [half_words(name, pointer, vec)]
    for lane in range(vec):
        value = half_lanes(_word(name, vec, lane // 2), el)[lane % 2]
        lines.append(f"const float {name}_{lane} = {value};")
    return lines


def half_store(pointer: str, values: list[str], el: str) -> str:
    """Store floats ``values`` (rounded to ``el``) as one vector at ``pointer``."""
    pack = round_pack(el)
    return half_store_words(pointer, [f"{pack}({values[2 * w]}, {values[2 * w + 1]})"
                                      for w in range(len(values) // 2)])


def half_store_words(pointer: str, words: list[str]) -> str:
    """Store ``words`` (two halves each, low lane first) as one vector at ``pointer``."""
    vt = HALF_WORDS[2 * len(words)]
    value = words[0] if len(words) == 1 else f"make_{vt}({', '.join(words)})"
    return vector_store(vt, pointer, value)


def vector_load(vt: str, pointer: str) -> str:
    """A read-only load of one ``vt`` at ``pointer`` (``__ldg``).

    >>> vector_load("float2", "p")
    '__ldg(reinterpret_cast<const float2*>(p))'
    """
    return f"__ldg(reinterpret_cast<const {vt}*>({pointer}))"


def vector_store(vt: str, pointer: str, value: str) -> str:
    """``value`` (of vector type ``vt``) stored at ``pointer``.

    >>> vector_store("float2", "p", "v")
    '*reinterpret_cast<float2*>(p) = v;'
    """
    return f"*reinterpret_cast<{vt}*>({pointer}) = {value};"


class _Vectorizer:
    """Vector loads for inputs read along a unit stride (one per base offset)."""

    def __init__(self, builder_ref: list[ExprBuilder], vec: int, scope_ref: list[Scope]) -> None:
        self.b = builder_ref
        self.vec = vec
        self.scope_ref = scope_ref
        self.loaded: dict[tuple[int, str], str] = {}
        self.args: list[Value] = []
        self.raw: list[tuple[str, str, str]] | None = None
        """Where set, each f32 vector load goes here as its C type, name and expression,
        for the caller to place (a prefetch); halves load in the scope as ever."""

    def __call__(self, k: int, idx: tuple[str, ...], lane: int) -> str | None:
        name = self.load(k, idx)
        if name is None:
            return None
        if elem_of(self.args[k]) != "f32":
            return f"{name}_{lane}"
        return f"{name}.{LANES[lane]}"

    def word(self, k: int, idx: tuple[str, ...], pair: int) -> str | None:
        """The loaded word of halves holding lanes ``2·pair`` and ``2·pair + 1``
        (:data:`accy.target.packed.Words`), or None."""
        name = self.load(k, idx)
        if name is None or elem_of(self.args[k]) == "f32":
            return None
        return _word(name, self.vec, pair)

    def load(self, k: int, idx: tuple[str, ...]) -> str | None:
        """The name of input ``k``'s vector at ``idx`` (loaded at its first read), or
        None where it is not read as a vector."""
        if self.vec == 1 or not any(LANE in i for i in idx):
            return None
        arg = self.args[k]
        el = elem_of(arg)
        if el not in ("f32", "f16", "bf16"):
            return None
        shape = shape_of(arg)
        st = strides_of(shape)
        lane_stride = sum(s for s, i, n in zip(st, idx, shape) if LANE in i and n != 1)
        if lane_stride != 1:
            return None
        if any(s % self.vec for s, i, n in zip(st, idx, shape)
               if n != 1 and i != "0" and LANE not in i):
            return None
        b = self.b[0]
        base = b.offset(shape, tuple(i.replace("+" + LANE, "") for i in idx), 0)
        key = (k, base)
        if key not in self.loaded:
            name = b.fresh("v")
            pointer = f"{b.inputs[k]} + ({base})"
            if el != "f32":
                self.scope_ref[0].lines += half_load(name, pointer, self.vec, el)
            else:
                vt = f"float{self.vec}"
                load = f"__ldg(reinterpret_cast<const {vt}*>({pointer}))"
                if self.raw is not None:
                    self.raw.append((vt, name, load))
                else:
                    self.scope_ref[0].lines.append(f"const {vt} {name} = {load};")
            self.loaded[key] = name
        return self.loaded[key]


def launch_bounds(plan: KernelPlan) -> str:
    """An elementwise or row kernel's ``__launch_bounds__``: its threads, and the blocks
    an SM must hold where the plan asks (``min_blocks``)."""
    return f"__launch_bounds__({plan.block[0]}" + \
        (f", {plan.min_blocks})" if plan.min_blocks else ")")


def emit_elementwise(k: KernelFuncOp, fast_math: bool) -> tuple[str, list[str]]:
    """A ``grid-stride`` kernel. Where the plan has two ``items``, a thread's loop is
    pipelined: at each step it loads its next vector (its own again past the end) before
    it computes the one loaded at the step before."""
    ins, outs, params = _params(k)
    plan = k.plan
    vec = plan.vector_width
    b = ExprBuilder(ins, cuda=True, prefix=k.sym_name, fast_math=fast_math)
    b.stored_unrounded = stored_only(k.body.terminator)
    pipelined = plan.items > 1 and vec > 1

    def at(linear: str, prefix: str) -> tuple[list[str], list[tuple[str, str, str]], list[str]]:
        """The body at element ``linear`` (index names ``prefix…``): the index lines,
        the vector loads (where pipelined; else in the body), the body."""
        scope = Scope([])
        vz = _Vectorizer([b], vec, [scope])
        vz.args = list(k.body.args)
        vz.raw = [] if pipelined else None
        b.load_hook = vz
        # two adjacent half lanes a word where the plan packs ops (accy.target.packed)
        pairs = PairBuilder(b, list(k.body.ops), plan.packed_ops, vz.word) \
            if vec > 1 and plan.packed_ops else None
        pre, names = decompose(linear, plan.iteration, prefix) if plan.iteration else ([], ())
        idx = tuple(names[:-1]) + (f"{names[-1]}+{LANE}",) if vec > 1 else tuple(names)
        stores = [_elementwise_store(b, pairs, v, outs[oi], linear, idx, scope, vec)
                  for oi, v in enumerate(k.body.terminator.operands)]  # type: ignore[union-attr]
        b.value_hook = None
        return pre, vz.raw or [], scope.lines + stores

    head = [f"extern \"C\" __global__ void {launch_bounds(plan)} "
            f"{k.sym_name}({', '.join(params)}) {{",
            "  const long long n = accy_n;"]
    if not pipelined:
        pre, _, body = at("i", "d")
        text = "\n".join([
            *head,
            "  for (long long g = (long long)blockIdx.x * blockDim.x + threadIdx.x; g < n;"
            " g += (long long)gridDim.x * blockDim.x) {",
            f"    const long long i = g * {vec};",
            *("    " + line for line in pre + body),
            "  }",
            "}",
        ])
        return text, b.tables
    # the first vector's loads, the next one's, and the body at the current one, whose
    # loads are the registers the others filled (the same loads in the same order)
    first_pre, first, _ = at("qi", "q")
    next_pre, nxt, _ = at("ni", "nd")
    pre, current, body = at("i", "d")
    assert [t for t, _, _ in first] == [t for t, _, _ in nxt] == [t for t, _, _ in current]
    text = "\n".join([
        *head,
        "  const long long s = (long long)gridDim.x * blockDim.x;",
        "  long long g = (long long)blockIdx.x * blockDim.x + threadIdx.x;",
        "  if (g >= n) return;",
        f"  const long long qi = g * {vec};",
        *("  " + line for line in first_pre),
        *(f"  {t} {name} = {load};" for (t, _, load), (_, name, _) in zip(first, current)),
        "  for (;; g += s) {",
        "    const long long gn = g + s;",
        f"    const long long ni = (gn < n ? gn : g) * {vec};",
        *("    " + line for line in next_pre),
        *(f"    const {t} {name} = {load};" for t, name, load in nxt),
        f"    const long long i = g * {vec};",
        *("    " + line for line in pre + body),
        "    if (gn >= n) break;",
        *(f"    {name} = {ahead};" for (_, name, _), (_, ahead, _) in zip(current, nxt)),
        "  }",
        "}",
    ])
    return text, b.tables


def _elementwise_store(b: ExprBuilder, pairs: PairBuilder | None, v: Value, out: str,
                       linear: str, idx: tuple[str, ...], scope: Scope, vec: int) -> str:
    """The statement storing ``v``'s ``vec`` lanes at ``idx`` (element ``linear`` of
    output ``out``)."""
    el = elem_of(v)
    at = f"{out} + {linear}"
    if pairs is not None and el != "f32":
        return half_store_words(at, [pairs.store_word(v, idx, scope, w)
                                     for w in range(vec // 2)])
    lanes = [b.expr(v, idx, scope, lane) for lane in range(vec)]
    if vec > 1 and el != "f32":
        return half_store(at, lanes, el)
    if vec > 1:
        return f"*reinterpret_cast<float{vec}*>({at}) = make_float{vec}({', '.join(lanes)});"
    return f"{out}[{linear}] = {store_convert(lanes[0], el)};"


def _shuffle_tree(kind: str, acc: str, ct: str) -> str:
    """A warp's butterfly reduction of ``acc`` (every lane ends with the result)."""
    shfl = f"__shfl_xor_sync(0xffffffffu, {acc}, o)"
    if kind == "sum":
        return (f"for (int o = 16; o > 0; o >>= 1) "
                f"{acc} = {combine(kind, acc, shfl, ct, cuda=True)};")
    # max/min read their operand twice, and a shuffle under a ?: would run on only some
    # lanes: shuffle once on every lane, then combine
    return (f"for (int o = 16; o > 0; o >>= 1) {{ const {ct} s = {shfl}; "
            f"{acc} = {combine(kind, acc, 's', ct, cuda=True)}; }}")


def emit_rows(k: KernelFuncOp, fast_math: bool) -> tuple[str, list[str]]:
    """A row kernel: a block (or a warp) per row, the row's inputs cached in registers
    where the plan says, each reduction a column loop and a shuffle tree, then the
    full-width outputs and the per-row ones."""
    return _RowEmitter(k, fast_math).emit()


WIDE_SLOTS = ("long long", "unsigned long long")
"""Compute types whose reduction partials cross a row kernel's shared ``accy_sh`` (an
array of ``double``) as themselves: a double keeps 53 bits, so an i64 row sum of 8192
values near 2^45 came back 11 off; every other compute type (float, double, and the
32-bit integers) goes through ``double`` exactly."""


def _store_partial(ct: str, index: str, acc: str) -> str:
    """The statement that puts ``acc`` (of compute type ``ct``) in slot ``index`` of
    ``accy_sh``."""
    if ct in WIDE_SLOTS:
        return f"reinterpret_cast<{ct}*>(accy_sh)[{index}] = {acc};"
    return f"accy_sh[{index}] = (double){acc};"


def _load_partial(ct: str, index: str) -> str:
    """The partial in slot ``index`` of ``accy_sh``, as ``ct``."""
    if ct in WIDE_SLOTS:
        return f"reinterpret_cast<{ct}*>(accy_sh)[{index}]"
    return f"({ct})accy_sh[{index}]"


class _RowEmitter:
    """The pieces of one row kernel, emitted in order (:func:`emit_rows`)."""

    def __init__(self, k: KernelFuncOp, fast_math: bool) -> None:
        self.k = k
        self.ins, self.outs, params = _params(k)
        plan = k.plan
        self.shape = plan.iteration
        self.rows, self.cols = plan.rows, plan.cols
        self.items = plan.items
        self.warp = plan.mapping == "warp-per-row"
        self.alone = plan.mapping == "thread-per-row"
        """A thread per row (or ``split``), walking it alone: no shuffles."""
        self.vec = 1 if self.alone else plan.vector_width
        """Neighbouring elements of a row one access reads (a vector along the row)."""
        self.rvec = plan.vector_width if self.alone else 1
        """``thread-per-row``: neighbouring rows a thread owns (a vector across rows: the
        rows are columns in memory), its lanes ``0 … rvec-1``."""
        self.split = plan.block[0] // plan.rows_per_block if self.alone else 1
        """``thread-per-row``: threads sharing a row, every split-th element each, their
        reductions combined through shared memory."""
        self.tpr = 32 if self.warp else self.split if self.alone else plan.block[0]
        self.cached = set(plan.cached_inputs)
        self.lines: list[str] = []
        self.head = [f"extern \"C\" __global__ void {launch_bounds(plan)} "
                     f"{k.sym_name}({', '.join(params)}) {{"]
        times = f" * {self.rvec}" if self.rvec > 1 else ""
        tile = "(long long)blockIdx.x"
        if self.alone and plan.streams > 1:  # the blocks dealt into runs (stream_tile)
            n = plan.streams
            self.head += [f"  const unsigned accy_s = blockIdx.x % {n}u;",
                          f"  const long long accy_tile = (long long)accy_s * (gridDim.x / "
                          f"{n}u) + min(accy_s, gridDim.x % {n}u) + blockIdx.x / {n}u;"]
            tile = "accy_tile"
        if self.alone and self.split > 1:
            # every thread reaches the barriers: one past the last row reads the last
            # row again (accy_rows > 0: the plan's rows) and stores nothing
            rpb = plan.rows_per_block
            self.head += [f"  const int t = threadIdx.x / {rpb};",
                          f"  const long long accy_r = ({tile} * {rpb} + "
                          f"threadIdx.x % {rpb}){times};",
                          "  const bool accy_live = accy_r < accy_rows;",
                          "  const long long row = accy_live ? accy_r : accy_rows - "
                          f"{self.rvec};",
                          f"  __shared__ double accy_sh[{plan.block[0] * self.rvec}];"]
        elif self.alone:
            self.head += [f"  const long long row = ({tile} * {plan.block[0]}"
                          f" + threadIdx.x){times};",
                          "  const int t = 0;",
                          "  if (row >= accy_rows) return;"]
        elif self.warp:
            self.head += [f"  const long long row = (long long)blockIdx.x * "
                          f"{plan.rows_per_block} + (threadIdx.x >> 5);",
                          "  const int t = threadIdx.x & 31;",
                          "  if (row >= accy_rows) return;"]
        else:
            self.head += ["  const long long row = blockIdx.x;", "  const int t = threadIdx.x;",
                          f"  __shared__ double accy_sh[{plan.shared_bytes // 8}];"]
        col = f"c+{LANE}" if self.vec > 1 else "c"
        self.row_names = ["row"] + [f"row_{r}" for r in range(1, self.rvec)]
        """The (flat) row of each of this thread's row lanes."""
        self.lane_rnames: list[tuple[str, ...]] = []
        """The row's index names, a row lane each."""
        for r, name in enumerate(self.row_names):
            if r:  # the rows' innermost extent divides rvec: no lane crosses into the next
                self.head.append(f"  const long long {name} = row + {r};")
            pre, names = decompose(name, self.shape[:-1], f"l{r}r" if r else "r") \
                if len(self.shape) > 1 else ([], ())
            self.head += ["  " + p for p in pre]
            self.lane_rnames.append(tuple(names))
        self.idents = [names + (col,) for names in self.lane_rnames]
        """This thread's element index, a row lane each (``c`` the column loop's)."""
        self.ident = self.idents[0]
        self.lane_bound: dict[Value, list[str]] = {}
        """Values the kernel computed once a row (reductions), a name a row lane each:
        :meth:`_lane` binds the lane's."""
        self.regs: dict[int, str] = {}
        """Cached input → its register array."""
        self.reg_index: dict[int, list[tuple[str, ...]]] = {}
        """Cached input → the index of it each row lane's element reads (the element
        itself, or its place through the one ``prim.transpose`` that reads it)."""
        self.outer = Scope(self.lines)
        self.scope_ref = [self.outer]
        self.vz = _Vectorizer([], self.vec, self.scope_ref)
        self.b = ExprBuilder(self.ins, cuda=True, prefix=k.sym_name, load_hook=self._hook,
                             fast_math=fast_math)
        self.b.stored_unrounded = stored_only(k.body.terminator)
        self.b.column, self.b.hoist = "c", self.outer
        # correctly rounded quotients by a row's values share its reciprocal; not where a
        # thread holds a whole row (a column softmax's 64 values): there ptxas then kept
        # more of the row live, 80 → 128 registers, and the bf16 kernel ran 2.6 % slower
        # on an H100 (RESULTS.md, kernels, nineteenth session). Half-demand quotients
        # share it everywhere (two products a quotient)
        self.b.hoist_exact = not self.alone
        self.vz.b.append(self.b)
        self.vz.args = list(k.body.args)
        self.pairs = PairBuilder(self.b, list(k.body.ops), plan.packed_ops, self._words) \
            if self.vec > 1 and plan.packed_ops and not self.alone else None
        """Two adjacent half lanes a word where the plan packs ops (its value hook turns
        a paired value's lane into its word's half wherever a column loop reads it).
        With it, cached half inputs are held as their loaded words: the packed ops read
        them as they are, an f32 op unpacks the lane it reads."""

    def _words(self, kidx: int, idx: tuple[str, ...], pair: int) -> str | None:
        """The loaded word of an input's lanes (:data:`accy.target.pairs.Words`): a
        cached input's from its registers, which hold its words (:attr:`pairs`)."""
        if kidx in self.regs and idx in self.reg_index[kidx]:
            return f"{self.regs[kidx]}[j][{pair}]"
        return self.vz.word(kidx, idx, pair)

    def _hook(self, kidx: int, idx: tuple[str, ...], lane: int) -> str | None:
        """Loads of a cached input at this thread's element read its registers."""
        if kidx in self.regs and idx in self.reg_index[kidx]:
            name = self.regs[kidx]
            if self.rvec > 1:
                return f"{name}[j][{self.reg_index[kidx].index(idx)}]"
            el = elem_of(self.k.body.args[kidx])
            if self.vec > 1 and el != "f32" and self.pairs is not None:
                return half_lanes(f"{name}[j][{lane // 2}]", el)[lane % 2]
            if self.vec > 1 and el != "f32":
                return f"{name}[j][{lane}]"
            return f"{name}[j]" if self.vec == 1 else f"{name}[j].{LANES[lane]}"
        return self.vz(kidx, idx, lane)

    def _lane(self, r: int) -> None:
        """Bind the once-a-row values of row lane ``r``."""
        for v, names in self.lane_bound.items():
            self.b.bound[v] = names[r]

    def _rows_contiguous(self, idx: list[tuple[str, ...]]) -> bool:
        """Whether the row lanes' indices ``idx`` (of one buffer, in its own axes) are
        neighbouring addresses: they differ in the last axis only, there the lanes' own
        innermost row."""
        return all(i[:-1] == idx[0][:-1] and i[-1:] == names[-1:]
                   for i, names in zip(idx, self.lane_rnames))

    def emit(self) -> tuple[str, list[str]]:
        self.declare_registers()
        if self.regs:
            self.column_loop(self.load_registers)
        self.reductions()
        self.outputs()
        text = "\n".join(self.head + ["  " + line for line in self.lines] + ["}"])
        return text, self.b.tables

    def column_loop(self, emit_lanes: Callable[[Scope], None]) -> None:
        """``for j in items``: this thread's columns of the row (guarded when ragged)."""
        lines = self.lines
        inner = Scope([], parent=self.outer)
        self.scope_ref[0] = inner
        self.vz.loaded = {}
        emit_lanes(inner)  # may add lines before the loop (a divisor's reciprocal)
        self.scope_ref[0] = self.outer
        lines.append("#pragma unroll")
        lines.append(f"for (int j = 0; j < {self.items}; ++j) {{")
        lines.append(f"  const int c = (j * {self.tpr} + t) * {self.vec};")
        guard = self.cols == 0 or self.cols % (self.tpr * self.vec) != 0
        if guard:
            lines.append(f"  if (c < {self.cols}) {{")
        pad = "    " if guard else "  "
        lines.extend(pad + s for s in inner.lines)
        if guard:
            lines.append("  }")
        lines.append("}")

    def declare_registers(self) -> None:
        """One register array per cached input (halves held as floats)."""
        for kidx in sorted(self.cached):
            arg = self.k.body.args[kidx]
            name = f"reg{kidx}"
            self.regs[kidx] = name
            self.reg_index[kidx] = list(self.idents)
            if shape_of(arg) != tuple(self.shape):  # read through a transpose (thread per row)
                user = arg.uses[0][0]
                assert user.op_name == "prim.transpose" and self.vec == 1, user.op_name
                self.reg_index[kidx] = [ExprBuilder.operand_index(user, i)
                                        for i in self.idents]
            if self.rvec > 1:
                self.lines.append(f"float {name}[{self.items}][{self.rvec}];")
            elif self.vec > 1 and elem_of(arg) != "f32" and self.pairs is not None:
                self.lines.append(f"unsigned int {name}[{self.items}][{self.vec // 2}];")
            elif self.vec > 1 and elem_of(arg) != "f32":
                self.lines.append(f"float {name}[{self.items}][{self.vec}];")
            elif self.vec > 1:
                self.lines.append(f"float{self.vec} {name}[{self.items}];")
            else:
                self.lines.append(f"{COMPUTE[elem_of(arg)]} {name}[{self.items}];")

    def load_registers(self, inner: Scope) -> None:
        """The cached inputs' elements of this thread, read once: a vector a step along
        the row (``vec``) or across this thread's rows (``rvec``, where they are
        neighbours in memory: a column softmax's input; else a load a row lane)."""
        b, n = self.b, max(self.vec, self.rvec)  # one of the two is 1
        for kidx, name in self.regs.items():
            arg, src = self.k.body.args[kidx], self.ins[kidx]
            el = elem_of(arg)
            idx = self.reg_index[kidx]
            offs = [b.offset(shape_of(arg), tuple(i.replace(f"c+{LANE}", "c") for i in ix), 0)
                    for ix in idx]
            off = offs[0]
            if self.rvec > 1 and not self._rows_contiguous(idx):
                inner.lines.extend(f"{name}[j][{r}] = {load_convert(f'{src}[{o}]', el)};"
                                   for r, o in enumerate(offs))
            elif n > 1 and el != "f32" and self.pairs is not None:
                w = b.fresh("w")
                inner.lines.append(half_words(w, f"{src} + ({off})", n))
                inner.lines.extend(f"{name}[j][{p}] = {_word(w, n, p)};" for p in range(n // 2))
            elif n > 1 and el != "f32":
                w = b.fresh("w")
                inner.lines.extend(half_load(w, f"{src} + ({off})", n, el))
                inner.lines.extend(f"{name}[j][{lane}] = {w}_{lane};" for lane in range(n))
            elif self.rvec > 1:
                w = b.fresh("w")
                inner.lines.append(f"const float{n} {w} = "
                                   f"{vector_load(f'float{n}', f'{src} + ({off})')};")
                inner.lines.extend(f"{name}[j][{r}] = {w}.{LANES[r]};" for r in range(n))
            elif n > 1:
                inner.lines.append(f"{name}[j] = __ldg(reinterpret_cast<const float{n}*>"
                                   f"({src} + ({off})));")
            else:
                inner.lines.append(f"{name}[j] = {load_convert(f'{src}[{off}]', el)};")

    def reductions(self) -> None:
        """Each row reduction: a column loop into an accumulator, a warp shuffle tree,
        then (block per row) across warps through shared memory."""
        b, lines = self.b, self.lines
        slots = 0  # which set of slots (ROW_PARTIAL_SETS) the next block-wide step uses
        for op in self.k.body.ops:
            if op.op_name != "prim.reduce":
                continue
            kind = op.attr("kind").value  # type: ignore[union-attr]
            el = elem_of(op.results[0])
            ct = COMPUTE[el]
            accs = [b.fresh("acc") for _ in range(self.rvec)]
            lines.extend(f"{ct} {acc} = {reduce_init(kind, el)};" for acc in accs)
            acc = accs[0]

            def accumulate(inner: Scope, op: Any = op, accs: list[str] = accs,
                           kind: str = kind, ct: str = ct) -> None:
                for r, acc in enumerate(accs):
                    self._lane(r)
                    for lane in range(self.vec):
                        val = b.expr(op.operands[0], self.idents[r], inner, lane)
                        inner.lines.append(f"{acc} = {combine(kind, acc, val, ct, cuda=True)};")
            self.column_loop(accumulate)
            if self.split > 1:  # the row's threads' partials, in order, through shared memory
                rpb, bs = self.k.plan.rows_per_block, self.k.plan.block[0]
                at = [f"{r * bs} + " if r else "" for r in range(self.rvec)]
                lines += [_store_partial(ct, f"{a}threadIdx.x", acc) for a, acc in zip(at, accs)]
                lines.append("__syncthreads();")
                for a, acc in zip(at, accs):
                    lines.append(f"{acc} = {_load_partial(ct, f'{a}threadIdx.x % {rpb}')};")
                    lines += [f"{acc} = " + combine(kind, acc, _load_partial(
                        ct, f"{a}{i * rpb} + threadIdx.x % {rpb}"), ct, cuda=True) + ";"
                              for i in range(1, self.split)]
                lines.append("__syncthreads();")
            if not self.alone:
                lines.append(_shuffle_tree(kind, acc, ct))
            if not self.warp and not self.alone:
                # the warps' partials through one of two sets of slots, in turn: the
                # barrier of a step orders its writes after every read of the step
                # before, which used the other set, so no barrier is needed after reads
                nw = self.tpr // 32
                per_set = self.k.plan.shared_bytes // 8 // ROW_PARTIAL_SETS
                slot = f"{slots * per_set} + " if slots else ""
                lines += [f"if ((t & 31) == 0) {_store_partial(ct, f'{slot}(t >> 5)', acc)}",
                          "__syncthreads();",
                          f"{acc} = (t & 31) < {nw} ? {_load_partial(ct, f'{slot}(t & 31)')} : "
                          f"{reduce_init(kind, el)};",
                          _shuffle_tree(kind, acc, ct)]
                slots = (slots + 1) % ROW_PARTIAL_SETS
            if el in ("f16", "bf16"):  # rounded before the ops fused after it read it
                names = [b.fresh("red") for _ in accs]
                lines += [f"const {ct} {name} = {round_compute(a, el)};"
                          for name, a in zip(names, accs)]
            else:
                names = accs
            self.lane_bound[op.results[0]] = names
            b.bound[op.results[0]] = names[0]

    def outputs(self) -> None:
        """The full-width outputs (a column loop), then the per-row ones (thread 0)."""
        yields = self.k.body.terminator.operands  # type: ignore[union-attr]
        full, transposed, reduced = split_yields(yields, self.shape)
        if full or transposed:
            self.column_loop(lambda inner: self._write_full(inner, full, transposed))
        if reduced:
            red_scope = Scope([], parent=self.outer)
            stores = []
            for r, row in enumerate(self.row_names):
                self._lane(r)
                ridx = self.lane_rnames[r] + ("0",)
                for oi, v in reduced:
                    val = self.b.expr(v, ridx, red_scope, 0)
                    stores.append(f"{self.outs[oi]}[{row}] = {store_convert(val, elem_of(v))};")
            self.lines.append("if (t == 0 && accy_live) {" if self.split > 1 else "if (t == 0) {")
            self.lines.extend("  " + s for s in red_scope.lines + stores)
            self.lines.append("}")

    def _write_full(self, inner: Scope, full: list[tuple[int, Any]],
                    transposed: list[tuple[int, Any, tuple[int, ...]]]) -> None:
        # every value first, then the stores: an output may be written in place over
        # an input that a later output still reads at this element
        vec, cols, outs = self.vec, self.cols, self.outs
        if self.rvec > 1:
            self._write_row_lanes(inner, full, transposed)
            return
        computed = [(oi, v, self._full_values(v, inner)) for oi, v in full]
        # through the permutation, lane by lane (coalesced when a thread walks a row
        # that is a column of the output: thread-per-row)
        moved = [(oi, v, perm, [self.b.expr(v, self.ident, inner, lane) for lane in range(vec)])
                 for oi, v, perm in transposed]
        live = "if (accy_live) " if self.split > 1 else ""
        for oi, v, perm, vals in moved:
            for lane, val in enumerate(vals):
                off = self.b.transposed_offset(self.shape, self.ident, perm, lane)
                inner.lines.append(f"{live}{outs[oi]}[{off}] = "
                                   f"{store_convert(val, elem_of(v))};")
        for oi, v, vals in computed:
            el = elem_of(v)
            if vec > 1 and el != "f32":
                at = f"{outs[oi]} + row * {cols} + c"
                inner.lines.append(half_store_words(at, vals) if self.pairs is not None
                                   else half_store(at, vals, el))
            elif vec > 1:
                inner.lines.append(f"*reinterpret_cast<float{vec}*>({outs[oi]} + row * "
                                   f"{cols} + c) = make_float{vec}({', '.join(vals)});")
            else:
                inner.lines.append(f"{live}{outs[oi]}[row * {cols} + c] = "
                                   f"{store_convert(vals[0], el)};")

    def _full_values(self, v: Value, inner: Scope) -> list[str]:
        """A full-width output's values at this thread's element: a lane each, or, where
        the kernel packs half ops, a word each pair of lanes (rounded as stored)."""
        if self.pairs is not None and elem_of(v) != "f32":
            return [self.pairs.store_word(v, self.ident, inner, w) for w in range(self.vec // 2)]
        return [self.b.expr(v, self.ident, inner, lane) for lane in range(self.vec)]

    def _write_row_lanes(self, inner: Scope, full: list[tuple[int, Any]],
                         transposed: list[tuple[int, Any, tuple[int, ...]]]) -> None:
        """:meth:`_write_full` for a thread of several row lanes: every lane's values
        first, then each output's — one vector where the lanes are neighbours in its
        memory (a column softmax's output), else a store a lane."""
        b, outs, live = self.b, self.outs, "if (accy_live) " if self.split > 1 else ""
        vals: dict[int, list[str]] = {}
        for r in range(self.rvec):
            self._lane(r)
            for oi, v in full:
                vals.setdefault(oi, []).append(b.expr(v, self.idents[r], inner, 0))
            for oi, v, _ in transposed:
                vals.setdefault(oi, []).append(b.expr(v, self.idents[r], inner, 0))
        for oi, v, perm in transposed:
            el = elem_of(v)
            moved = [tuple(i[p] for p in perm) for i in self.idents]
            offs = [b.transposed_offset(self.shape, i, perm, 0) for i in self.idents]
            if self._rows_contiguous(moved):
                pointer = f"{outs[oi]} + ({offs[0]})"
                if el == "f32":
                    inner.lines.append(live + vector_store(
                        f"float{self.rvec}", pointer,
                        f"make_float{self.rvec}({', '.join(vals[oi])})"))
                else:
                    inner.lines.append(live + half_store(pointer, vals[oi], el))
                continue
            inner.lines.extend(f"{live}{outs[oi]}[{off}] = {store_convert(val, el)};"
                               for off, val in zip(offs, vals[oi]))
        for oi, v in full:
            inner.lines.extend(f"{live}{outs[oi]}[{row} * {self.cols} + c] = "
                               f"{store_convert(val, elem_of(v))};"
                               for row, val in zip(self.row_names, vals[oi]))


def _batch_prologue(batch_shape: tuple[int, ...]) -> tuple[list[str], tuple[str, ...]]:
    """The lines that start a matmul block on batch ``bz`` (``blockIdx.z``) — it returns at
    once when the batch is empty: the launch's one block has nothing to do — and the
    names of the batch indices they define."""
    lines = ["  if (bz >= 0) return;"] if 0 in batch_shape else []
    pre, names = decompose("bz", batch_shape, "b") if batch_shape else ([], ())
    return lines + ["  " + p for p in pre], tuple(names)


def _matmul_epilogue(k: KernelFuncOp, b: ExprBuilder, mm: Operation, outs: list[str],
                     bnames: tuple[str, ...]) -> tuple[Scope, list[str]]:
    """The fused epilogue at output element (batch…, m, n), the matmul's value bound to
    ``accv``: the scope of its ops and one store per kernel output (FFMA and mma)."""
    yields = k.body.terminator.operands  # type: ignore[union-attr]
    ep = Scope([])
    b.bound[mm.results[0]] = "accv"
    idx = bnames + ("m", "n")
    stores = []
    for oi, v in enumerate(yields):
        val = b.expr(v, idx, ep)
        off = b.offset(shape_of(v), idx, 0)
        stores.append(f"{outs[oi]}[{off}] = {store_convert(val, elem_of(v))};")
    return ep, stores


def _lane_epilogue(k: KernelFuncOp, b: ExprBuilder, mm: Operation, outs: list[str],
                   bnames: tuple[str, ...], raw: list[str], el: str) -> list[str]:
    """The fused epilogue at the ``len(raw)`` adjacent output elements (batch…, m, n + l)
    of one thread (n a multiple of their count), lane l's accumulator ``raw[l]``: each
    lane's value as :func:`_matmul_epilogue` computes it (the accumulator rounded to the
    matmul's element ``el``, then the fused ops), then one vector store per output (two
    halves packed to a word, float2, float4) — or a store per lane where the output is
    not of the matmul's shape. Inputs read along n are vector loads.

    An output that is the matmul's own value stores the accumulator unrounded: rounding
    to ``el`` twice rounds as once (the value is then exact in ``el``), so it skips the
    round trip (its conversions are inline asm the compiler cannot fold)."""
    vec = len(raw)
    assert vec in (2, 4)
    yields = list(k.body.terminator.operands)  # type: ignore[union-attr]
    value = mm.results[0]
    ep = Scope([])
    # inputs read along n: one vector load a lane group (the plan aligned every buffer)
    vz = _Vectorizer([b], vec, [ep])
    vz.args = list(k.body.args)
    b.load_hook = vz
    idx = bnames + ("m", f"n+{LANE}")
    fused = any(v is not value for v in yields)
    vals: list[list[str]] = [[] for _ in yields]
    for lane in range(vec):
        if fused:
            ep.lines.append(f"const float accv{lane} = {round_compute(raw[lane], el)};")
        b.bound[value] = f"accv{lane}"
        for oi, v in enumerate(yields):
            vals[oi].append(raw[lane] if v is value else b.expr(v, idx, ep, lane))
    b.load_hook = None
    out_shape = shape_of(value)
    stores = []
    for oi, v in enumerate(yields):
        ve = elem_of(v)
        off = b.offset(shape_of(v), bnames + ("m", "n"), 0)
        if shape_of(v) != out_shape or out_shape[-1] % vec or \
                ve not in ("f32", "f16", "bf16"):
            stores += [f"{outs[oi]}[{b.offset(shape_of(v), idx, lane)}] = "
                       f"{store_convert(vals[oi][lane], ve)};" for lane in range(vec)]
        elif ve == "f32":
            stores.append(f"*reinterpret_cast<float{vec}*>({outs[oi]} + {off}) = "
                          f"make_float{vec}({', '.join(vals[oi])});")
        else:
            stores.append(half_store(f"{outs[oi]} + {off}", vals[oi], ve))
    return ep.lines + stores


def _int_offsets(k: KernelFuncOp) -> bool:
    """Every buffer of the kernel has fewer than 2³¹ elements: an offset into any fits
    an ``int``."""
    values = [*k.body.args, *k.body.terminator.operands]  # type: ignore[union-attr]
    return all(math.prod(shape_of(v)) < 2 ** 31 for v in values)


def _only_output(k: KernelFuncOp, mm: Operation) -> bool:
    """The kernel's one output is the matmul's own value (no epilogue)."""
    return list(k.body.terminator.operands) == [mm.results[0]]  # type: ignore[union-attr]


def _plain_store(k: KernelFuncOp, mm: Operation) -> bool:
    """The kernel's one output is the matmul's own f32 value: float4 stores."""
    return _only_output(k, mm) and elem_of(mm.results[0]) == "f32"


def emit_ffma(k: KernelFuncOp, fast_math: bool) -> tuple[str, list[str]]:
    """The ``ffma-tiled`` plan: a register-blocked f32 matmul (the SGEMM recipe).

    A block computes ``tile`` m×n outputs; thread (ty, tx) owns ``micro_tile`` outputs
    as sub-tiles of ``vector_width``² (4×4) spaced ``gap`` apart (rows ``u·gap_m +
    4·ty + r``, columns ``u·gap_n + 4·tx + c``), so every shared read is one float4
    and a quarter-warp reads 8 distinct float4s (B) or one (A). Each k-tile of A
    (rows × ``tk``) and B (``tk`` × columns) is read with float4 global loads, A stored
    transposed (``As[k][m]``, rows padded by ``FFMA_A_PAD``), B as it is (``Bs[k][n]``);
    two shared buffers: the next k-tile's loads sit in registers while the current
    one is multiplied, one ``__syncthreads`` a k-tile. Explicit ``fmaf`` (the fragment
    compiles without implicit contraction). Shapes divide the tiles: no bounds checks.
    The epilogue takes a sub-tile row's four adjacent columns together
    (:func:`_lane_epilogue`: float4 loads and stores).
    """
    ins, outs, params = _params(k)
    plan = k.plan
    tm, tn, tk = plan.tile
    mt_m, mt_n = plan.micro_tile
    vw = plan.vector_width
    threads = plan.block[0]
    assert plan.stages == 2 and vw == 4 and tk % (2 * vw) == 0
    nx, ny = tn // mt_n, tm // mt_m            # threads along n and m
    gap_m, gap_n = ny * vw, nx * vw            # between a thread's sub-tiles
    lda = tm + FFMA_A_PAD
    dims = MatmulDims.of(k)
    mm, batch_shape, m_, n_, k_ = dims.op, dims.batch, dims.m, dims.n, dims.k
    a_in, b_in = (ins[v.index] for v in mm.operands)  # type: ignore[attr-defined]  # block arguments
    b = ExprBuilder(ins, cuda=True, prefix=k.sym_name, fast_math=fast_math)
    pa, pb = tm * tk // (vw * threads), tk * tn // (vw * threads)  # float4 loads a thread
    lanes = LANES[:vw]
    lines = [f"extern \"C\" __global__ void __launch_bounds__({threads}, "
             f"{max(1, 512 // threads)}) {k.sym_name}({', '.join(params)}) {{",
             f"  __shared__ __align__(16) float As[2][{tk}][{lda}];",
             f"  __shared__ __align__(16) float Bs[2][{tk}][{tn}];",
             f"  const int tid = threadIdx.x, tx = tid % {nx}, ty = tid / {nx};",
             f"  const long long m0 = (long long)blockIdx.y * {tm}, n0 = (long long)blockIdx.x"
             f" * {tn};",
             "  const long long bz = blockIdx.z;",
             f"  const float* Ag = {a_in} + bz * {m_ * k_}LL + m0 * {k_};",
             f"  const float* Bg = {b_in} + bz * {k_ * n_}LL + n0;"]
    # A float4 i: element e = tid + i·threads of the tile; pairs of k-chunks (32 bytes of
    # a row) on consecutive rows: row ((e >> 1) % tm), chunk 2·((e >> 1) / tm) + (e & 1)
    for i in range(pa):
        lines += [f"  const int ae{i} = tid + {i * threads}, ar{i} = (ae{i} >> 1) % {tm}, "
                  f"ac{i} = ((ae{i} >> 1) / {tm}) * 2 + (ae{i} & 1);",
                  f"  const float* ap{i} = Ag + (long long)ar{i} * {k_} + ac{i} * {vw};"]
    # B float4 i: row e / (tn / 4), chunk e % (tn / 4) of the k-tile
    for i in range(pb):
        lines += [f"  const int be{i} = tid + {i * threads}, br{i} = be{i} / {tn // vw}, "
                  f"bc{i} = be{i} % {tn // vw};",
                  f"  const float* bp{i} = Bg + (long long)br{i} * {n_} + bc{i} * {vw};"]

    def load(kt: str, ind: str) -> list[str]:
        return [*(f"{ind}la[{i}] = *reinterpret_cast<const float4*>(ap{i} + {kt} * {tk});"
                  for i in range(pa)),
                *(f"{ind}lb[{i}] = *reinterpret_cast<const float4*>(bp{i} + (long long)"
                  f"{kt} * {tk * n_});" for i in range(pb))]

    def store(s: str, ind: str) -> list[str]:
        return [*(f"{ind}As[{s}][ac{i} * {vw} + {c}][ar{i}] = la[{i}].{lane};"
                  for i in range(pa) for c, lane in enumerate(lanes)),
                *(f"{ind}*reinterpret_cast<float4*>(&Bs[{s}][br{i}][bc{i} * {vw}]) = lb[{i}];"
                  for i in range(pb))]

    def frags(name: str, tile: str, gap: int, t: str, count: int) -> list[str]:
        vals = [f"f{name}{u}.{lane}" for u in range(count) for lane in lanes]
        return [*(f"      const float4 f{name}{u} = *reinterpret_cast<const float4*>("
                  f"&{tile}[s][q][{u * gap} + {t} * {vw}]);" for u in range(count)),
                f"      const float r{name}[{len(vals)}] = {{{', '.join(vals)}}};"]

    kts = k_ // tk
    lines += [f"  float4 la[{pa}], lb[{pb}];",
              f"  float acc[{mt_m}][{mt_n}];",
              "  #pragma unroll",
              f"  for (int i = 0; i < {mt_m}; ++i) {{",
              "    #pragma unroll",
              f"    for (int j = 0; j < {mt_n}; ++j) acc[i][j] = 0.0f;",
              "  }",
              *load("0", "  "),
              *store("0", "  "),
              "  __syncthreads();",
              "  #pragma unroll 1",
              f"  for (int kt = 0; kt < {kts}; ++kt) {{",
              "    const int s = kt & 1;",
              f"    if (kt + 1 < {kts}) {{",
              *load("(kt + 1)", "      "),
              "    }",
              f"    #pragma unroll{'' if plan.unroll in (0, tk) else f' {plan.unroll}'}",
              f"    for (int q = 0; q < {tk}; ++q) {{",
              *frags("a", "As", gap_m, "ty", mt_m // vw),
              *frags("b", "Bs", gap_n, "tx", mt_n // vw),
              "      #pragma unroll",
              f"      for (int i = 0; i < {mt_m}; ++i) {{",
              "        #pragma unroll",
              f"        for (int j = 0; j < {mt_n}; ++j) acc[i][j] = fmaf(ra[i], rb[j], "
              "acc[i][j]);",
              "      }",
              "    }",
              f"    if (kt + 1 < {kts}) {{",
              *store("s ^ 1", "      "),
              "    }",
              "    __syncthreads();",
              "  }"]
    # accumulator (i, j) is output (m0 + row(i), n0 + (j / vw) * gap_n + tx * vw + j % vw)
    row = f"(i / {vw}) * {gap_m} + ty * {vw} + i % {vw}"
    if _plain_store(k, mm):
        lines += [f"  float* Cg = {outs[0]} + bz * {m_ * n_}LL + m0 * {n_} + n0;",
                  "  #pragma unroll",
                  f"  for (int i = 0; i < {mt_m}; ++i) {{",
                  f"    float* Cr = Cg + (long long)({row}) * {n_} + tx * {vw};",
                  *(f"    *reinterpret_cast<float4*>(Cr + {u * gap_n}) = make_float4("
                    f"{', '.join(f'acc[i][{u * vw + c}]' for c in range(vw))});"
                    for u in range(mt_n // vw)),
                  "  }",
                  "}"]
        return "\n".join(lines), b.tables
    pre, bnames = _batch_prologue(batch_shape)  # never an empty batch: the plan needs one
    lines += pre
    # a sub-tile row's vw columns are adjacent: the epilogue takes them together; its
    # offsets in 32 bits where every buffer allows (64-bit ones kept values across the
    # k loop that spilled at the 128 registers two blocks an SM allow)
    it = "int" if _int_offsets(k) else "long long"
    if not _heavy_epilogue(k):
        raw = [f"acc[i][u * {vw} + {c}]" for c in range(vw)]
        lines += ["  #pragma unroll",
                  f"  for (int i = 0; i < {mt_m}; ++i) {{",
                  f"    const {it} m = ({it})m0 + {row};",
                  "    #pragma unroll",
                  f"    for (int u = 0; u < {mt_n // vw}; ++u) {{",
                  f"      const {it} n = ({it})n0 + u * {gap_n} + tx * {vw};",
                  *("      " + s for s in _lane_epilogue(k, b, mm, outs, bnames, raw, "f32")),
                  "    }",
                  "  }",
                  "}"]
        return "\n".join(lines), b.tables
    # transcendental epilogue ops: the sub-tiles in a loop that stays rolled (NVRTC's
    # time grows with the copies of erfcf/expf inlined: 8×8 of them at the 8×8 micro
    # tile), each lane's accumulator picked from its sub-tile's by compile-time indices
    # (registers cannot be indexed at run time)
    nu = mt_n // vw
    quads = [(qi, qu) for qi in range(mt_m // vw) for qu in range(nu)]

    def pick(c: int) -> str:
        expr = f"acc[{quads[-1][0] * vw} + r][{quads[-1][1] * vw + c}]"
        for q in range(len(quads) - 2, -1, -1):
            expr = f"(p == {q} ? acc[{quads[q][0] * vw} + r][{quads[q][1] * vw + c}] : {expr})"
        return expr

    lines += ["  #pragma unroll 1",
              f"  for (int p = 0; p < {len(quads)}; ++p) {{",
              f"    const int ih = p / {nu}, u = p % {nu};",
              "    #pragma unroll",
              f"    for (int r = 0; r < {vw}; ++r) {{",
              f"      const {it} m = ({it})m0 + ih * {gap_m} + ty * {vw} + r;",
              f"      const {it} n = ({it})n0 + u * {gap_n} + tx * {vw};",
              *("      " + s for s in _lane_epilogue(k, b, mm, outs, bnames,
                                                     [pick(c) for c in range(vw)], "f32")),
              "    }",
              "  }",
              "}"]
    return "\n".join(lines), b.tables


HEAVY_OPS = frozenset({"exp", "log", "tanh", "erf", "erfc", "sigmoid", "sin", "cos", "pow",
                       "sqrt", "rsqrt", "div", "reciprocal"})
"""Epilogue ops whose inlined code is long (a libdevice function, a division)."""


WGMMA_STAGED_PAD = 4
"""Floats of padding after each staged accumulator row (:func:`emit_wgmma`): the row
pitch is then 16 bytes off a multiple of 128, so a warp's fragment stores (8 rows × 4
column pairs) spread over all banks, and a row's float4 reads stay aligned."""


def _heavy_epilogue(k: KernelFuncOp) -> bool:
    """Whether the kernel's fused ops include a :data:`HEAVY_OPS` one."""
    return any(op.op_name.split(".", 1)[-1] in HEAVY_OPS for op in k.body.ops)


def emit_matmul(k: KernelFuncOp, fast_math: bool) -> tuple[str, list[str]]:
    if k.plan.mapping == "ffma-tiled":
        return emit_ffma(k, fast_math)
    ins, outs, params = _params(k)
    plan = k.plan
    tm, tn, tk = plan.tile
    dims = MatmulDims.of(k)
    mm, batch_shape, m_, n_, k_ = dims.op, dims.batch, dims.m, dims.n, dims.k
    el = dims.element
    ct = COMPUTE[el]
    # an explicit fused multiply-add: the fragment is compiled without implicit contraction
    mac = {"float": "acc[i][jj] = fmaf(ra[i], rb[jj], acc[i][jj])",
           "double": "acc[i][jj] = fma(ra[i], rb[jj], acc[i][jj])"}.get(
        ct, "acc[i][jj] += ra[i] * rb[jj]")
    b = ExprBuilder(ins, cuda=True, prefix=k.sym_name, fast_math=fast_math)
    mt_m, mt_n = plan.micro_tile
    nx, ny = tn // mt_n, tm // mt_m
    lines = [f"extern \"C\" __global__ void __launch_bounds__({nx * ny}) "
             f"{k.sym_name}({', '.join(params)}) {{",
             f"  __shared__ {ct} As[{tk}][{tm + 1}];",
             f"  __shared__ {ct} Bs[{tk}][{tn + 4}];",
             "  const int tx = threadIdx.x, ty = threadIdx.y;",
             f"  const int tid = ty * {nx} + tx;",
             f"  const long long m0 = (long long)blockIdx.y * {tm}, n0 = (long long)blockIdx.x"
             f" * {tn};",
             "  const long long bz = blockIdx.z;"]
    pre, bnames = _batch_prologue(batch_shape)
    lines += pre
    lines += [f"  {ct} acc[{mt_m}][{mt_n}];",
              "  #pragma unroll",
              f"  for (int i = 0; i < {mt_m}; ++i) {{",
              "    #pragma unroll",
              f"    for (int jj = 0; jj < {mt_n}; ++jj) acc[i][jj] = 0;",
              "  }",
              f"  for (long long k0 = 0; k0 < {k_}; k0 += {tk}) {{"]
    sa = Scope([])
    a_val = b.expr(mm.operands[0], tuple(bnames) + ("m", "kk"), sa)
    sb = Scope([])
    b_val = b.expr(mm.operands[1], tuple(bnames) + ("kk", "n"), sb)
    lines += [f"    for (int e = tid; e < {tm * tk}; e += {nx * ny}) {{",
              f"      const int em = e / {tk}, ek = e % {tk};",
              "      const long long m = m0 + em, kk = k0 + ek;",
              f"      {ct} va = 0;",
              f"      if (m < {m_} && kk < {k_}) {{",
              *("        " + s for s in sa.lines),
              f"        va = {a_val};",
              "      }",
              "      As[ek][em] = va;",
              "    }",
              f"    for (int e = tid; e < {tk * tn}; e += {nx * ny}) {{",
              f"      const int ek = e / {tn}, en = e % {tn};",
              "      const long long kk = k0 + ek, n = n0 + en;",
              f"      {ct} vb = 0;",
              f"      if (kk < {k_} && n < {n_}) {{",
              *("        " + s for s in sb.lines),
              f"        vb = {b_val};",
              "      }",
              "      Bs[ek][en] = vb;",
              "    }",
              "    __syncthreads();",
              "    #pragma unroll",
              f"    for (int q = 0; q < {tk}; ++q) {{",
              f"      {ct} ra[{mt_m}], rb[{mt_n}];",
              "      #pragma unroll",
              f"      for (int i = 0; i < {mt_m}; ++i) ra[i] = As[q][ty + i * {ny}];",
              "      #pragma unroll",
              f"      for (int jj = 0; jj < {mt_n}; ++jj) rb[jj] = Bs[q][tx + jj * {nx}];",
              "      #pragma unroll",
              f"      for (int i = 0; i < {mt_m}; ++i) {{",
              "        #pragma unroll",
              f"        for (int jj = 0; jj < {mt_n}; ++jj) {mac};",
              "      }",
              "    }",
              "    __syncthreads();",
              "  }"]
    ep, stores = _matmul_epilogue(k, b, mm, outs, tuple(bnames))
    lines += ["  #pragma unroll",
              f"  for (int i = 0; i < {mt_m}; ++i) {{",
              "    #pragma unroll",
              f"    for (int jj = 0; jj < {mt_n}; ++jj) {{",
              f"      const long long m = m0 + ty + i * {ny}, n = n0 + tx + jj * {nx};",
              f"      if (m < {m_} && n < {n_}) {{",
              f"        const {ct} accv = {round_compute('acc[i][jj]', el)};",
              *("        " + s for s in ep.lines + stores),
              "      }",
              "    }",
              "  }",
              "}"]
    return "\n".join(lines), b.tables


def _fragment_epilogue(loops: list[tuple[str, int]], row: str, col: str,
                       acc: Callable[[str], str], epilogue: Callable[[list[str]], list[str]],
                       indent: str) -> list[str]:
    """The epilogue over accumulators in the tensor cores' m16n8 C-fragment layout
    (``mma.sync`` and ``wgmma`` alike): inside ``loops`` (index, count) over the 16×8
    tiles, a tile at block row ``row`` and column ``col`` holds in accumulator ``h`` the
    output row ``lane/4`` (+8 for h ≥ 2) and column ``2·(lane%4)`` (+1 for odd h);
    ``acc(h)`` is accumulator ``h`` of the tile. Each pair h, h + 1 is two adjacent
    columns (n, n + 1) of row m: ``epilogue`` (:func:`_lane_epilogue` of the two
    accumulators) says what is done with them."""
    out: list[str] = []
    pad = indent
    for name, count in loops:
        out += [f"{pad}#pragma unroll", f"{pad}for (int {name} = 0; {name} < {count}; ++{name}) {{"]
        pad += "  "
    out += [f"{pad}#pragma unroll", f"{pad}for (int h = 0; h < 4; h += 2) {{"]
    pad += "  "
    out += [f"{pad}const long long m = m0 + {row} + (lane >> 2) + (h >> 1) * 8;",
            f"{pad}const long long n = n0 + {col} + (lane & 3) * 2;",
            *(pad + line for line in epilogue([acc("h"), acc("h + 1")]))]
    for _ in range(len(loops) + 1):
        pad = pad[:-2]
        out.append(f"{pad}}}")
    return out


def emit_mma(k: KernelFuncOp, fast_math: bool) -> tuple[str, list[str]]:
    """The ``mma-tiled`` plan: tensor-core tiles fed by a ``cp.async`` pipeline.

    Each block stages ``stages`` A and B tiles (``tile`` m×k and k×n halves,
    16-byte chunks XOR-swizzled by row as ``swizzle`` says) while its warps run
    ``mma.sync`` (``plan.mma``) on the oldest: A fragments by ``ldmatrix.x4``,
    B by ``ldmatrix.x4.trans``, f32 accumulators in registers, then the
    epilogue at every accumulator's (m, n), two adjacent columns together
    (:func:`_fragment_epilogue`).
    """
    ins, outs, params = _params(k)
    plan = k.plan
    tm, tn, tk = plan.tile
    wgm, wgn = plan.warps
    wtm, wtn = plan.warp_tile
    mt, nt = wtm // 16, wtn // 8
    st = plan.stages
    ash, amask, bsh, bmask = plan.swizzle
    threads = plan.block[0]
    dims = MatmulDims.of(k)
    mm, batch_shape, m_, n_, k_ = dims.op, dims.batch, dims.m, dims.n, dims.k
    el = dims.element
    a_in, b_in = (ins[v.index] for v in mm.operands)  # type: ignore[attr-defined]  # block arguments
    ac, bc = tk // 8, tn // 8  # 16-byte chunks a tile row
    b = ExprBuilder(ins, cuda=True, prefix=k.sym_name, fast_math=fast_math)

    def chunk(r: str, c: str, row: int, shift: int, mask: int) -> str:
        """Byte offset in a tile of row ``r``'s (swizzled) 16-byte chunk ``c``."""
        return f"(({r}) * {row * 2} + ((({c}) ^ ((({r}) >> {shift}) & {mask})) << 4))"

    def copies(tile: str, per: int, chunks: int, row: int, shift: int, mask: int,
               src: str) -> list[str]:
        return ["  #pragma unroll",
                f"  for (int q = 0; q < {per}; ++q) {{",
                f"    const int e = tid + q * {threads}, r = e / {chunks}, c = e % {chunks};",
                f"    const unsigned dst = {tile} + {chunk('r', 'c', row, shift, mask)};",
                f"    asm volatile(\"cp.async.cg.shared.global [%0], [%1], 16;\" :: \"r\"(dst), "
                f"\"l\"({src}));",
                "  }"]

    lines = [f"extern \"C\" __global__ void __launch_bounds__({threads}) "
             f"{k.sym_name}({', '.join(params)}) {{",
             f"  __shared__ __align__(128) unsigned short As[{st}][{tm * tk}];",
             f"  __shared__ __align__(128) unsigned short Bs[{st}][{tk * tn}];",
             "  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;",
             f"  const int wm = warp / {wgn}, wn = warp % {wgn};",
             f"  const long long m0 = (long long)blockIdx.y * {tm}, n0 = (long long)blockIdx.x"
             f" * {tn};",
             "  const long long bz = blockIdx.z;"]
    pre, bnames = _batch_prologue(batch_shape)
    lines += pre
    lines += [f"  const unsigned short* Ag = {a_in} + bz * {m_ * k_}LL + m0 * {k_};",
              f"  const unsigned short* Bg = {b_in} + bz * {k_ * n_}LL + n0;",
              "  const unsigned as0 = (unsigned)__cvta_generic_to_shared(&As[0][0]);",
              "  const unsigned bs0 = (unsigned)__cvta_generic_to_shared(&Bs[0][0]);",
              f"  float acc[{mt}][{nt}][4];",
              "  #pragma unroll",
              f"  for (int i = 0; i < {mt}; ++i)",
              "    #pragma unroll",
              f"    for (int j = 0; j < {nt}; ++j)",
              "      #pragma unroll",
              "      for (int h = 0; h < 4; ++h) acc[i][j][h] = 0.0f;",
              "  auto load_tile = [&](int s, int kt) {",
              f"    const unsigned at = as0 + s * {tm * tk * 2}, bt = bs0 + s * {tk * tn * 2};",
              *("  " + x for x in copies("at", tm * ac // threads, ac, tk, ash, amask,
                                         f"Ag + (long long)r * {k_} + (long long)kt * {tk} "
                                         f"+ c * 8")),
              *("  " + x for x in copies("bt", tk * bc // threads, bc, tn, bsh, bmask,
                                         f"Bg + ((long long)kt * {tk} + r) * {n_} + c * 8")),
              "  };",
              f"  const int kts = {k_ // tk};",
              "  #pragma unroll",
              f"  for (int s = 0; s < {st - 1}; ++s) {{",
              "    if (s < kts) load_tile(s, s);",
              "    asm volatile(\"cp.async.commit_group;\" ::);",
              "  }",
              "  for (int kt = 0; kt < kts; ++kt) {",
              f"    asm volatile(\"cp.async.wait_group {st - 2};\" ::);",
              "    __syncthreads();",
              f"    if (kt + {st - 1} < kts) load_tile((kt + {st - 1}) % {st}, kt + {st - 1});",
              "    asm volatile(\"cp.async.commit_group;\" ::);",
              f"    const unsigned at = as0 + (kt % {st}) * {tm * tk * 2}, "
              f"bt = bs0 + (kt % {st}) * {tk * tn * 2};",
              "    #pragma unroll",
              f"    for (int kk = 0; kk < {tk // 16}; ++kk) {{",
              f"      unsigned af[{mt}][4], bf[{nt}][2];",
              "      #pragma unroll",
              f"      for (int i = 0; i < {mt}; ++i) {{",
              f"        const int r = wm * {wtm} + i * 16 + (lane & 15), c = kk * 2 + (lane >> 4);",
              f"        const unsigned p = at + {chunk('r', 'c', tk, ash, amask)};",
              "        asm volatile(\"ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, "
              "[%4];\" : \"=r\"(af[i][0]), \"=r\"(af[i][1]), \"=r\"(af[i][2]), "
              "\"=r\"(af[i][3]) : \"r\"(p));",
              "      }",
              "      #pragma unroll",
              f"      for (int j = 0; j < {nt // 2}; ++j) {{",
              f"        const int r = kk * 16 + (lane & 15), c = (wn * {wtn} + j * 16) / 8 + "
              "(lane >> 4);",
              f"        const unsigned p = bt + {chunk('r', 'c', tn, bsh, bmask)};",
              "        asm volatile(\"ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 "
              "{%0,%1,%2,%3}, [%4];\" : \"=r\"(bf[2 * j][0]), \"=r\"(bf[2 * j][1]), "
              "\"=r\"(bf[2 * j + 1][0]), \"=r\"(bf[2 * j + 1][1]) : \"r\"(p));",
              "      }",
              "      #pragma unroll",
              f"      for (int i = 0; i < {mt}; ++i)",
              "        #pragma unroll",
              f"        for (int j = 0; j < {nt}; ++j)",
              f"          asm(\"mma.sync.aligned.{plan.mma} {{%0,%1,%2,%3}}, "
              "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\" : \"+f\"(acc[i][j][0]), "
              "\"+f\"(acc[i][j][1]), \"+f\"(acc[i][j][2]), \"+f\"(acc[i][j][3]) : "
              "\"r\"(af[i][0]), \"r\"(af[i][1]), \"r\"(af[i][2]), \"r\"(af[i][3]), "
              "\"r\"(bf[j][0]), \"r\"(bf[j][1]));",
              "    }",
              "  }",
              "  asm volatile(\"cp.async.wait_group 0;\" ::);"]
    lines += _fragment_epilogue([("i", mt), ("j", nt)], f"wm * {wtm} + i * 16",
                                f"wn * {wtn} + j * 8", lambda h: f"acc[i][j][{h}]",
                                lambda raw: _lane_epilogue(k, b, mm, outs, tuple(bnames), raw,
                                                           el), "  ")
    lines.append("}")
    return "\n".join(lines), b.tables


def _wgmma_call(instr: str, acc: str, n_acc: int, da: str, accumulate: str) -> str:
    """One ``wgmma.mma_async`` on descriptors ``da``/``db`` into the accumulators
    ``acc0 … acc<n_acc - 1>``: A K-major, B N-major (transposed: the ``[K, N]``
    row-major operand); it adds to them where the C expression ``accumulate`` is
    nonzero and overwrites them where it is 0 (the first k-step: the accumulators are
    never zeroed, :func:`_wgmma_registers`).

    The accumulators are PTX registers of the kernel's own (:func:`_wgmma_registers`),
    not operands: NVVM's time on an ``asm`` statement grows faster than its operand
    count, and 128 ``"+f"`` operands on each of a stage's four statements were most of a
    wgmma unit's compile time (RESULTS.md, Kernels, twelfth session)."""
    regs = ", ".join(f"{acc}{i}" for i in range(n_acc))
    return (f'asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %2, 0;\\n'
            f'wgmma.mma_async.sync.aligned.{instr} {{{regs}}}, %0, %1, '
            f'p, 1, 1, 0, 1;\\n}}\\n" :: "l"({da}), "l"(db), "r"({accumulate}) : "memory");')


def _wgmma_registers(acc: str, n_acc: int) -> str:
    """The statement that declares the f32 registers ``acc0 …`` at the kernel's top
    (before any branch, so the declaration precedes every use in the PTX); a name
    without ``%`` is a plain PTX identifier. Not zeroed: the first k-step's wgmma
    writes them without adding (:func:`_wgmma_call`; a wgmma plan has K ≥ 64), and 128
    moves a thread cost the unit's compile 5–10 % (RESULTS.md, Kernels, twenty-third
    session)."""
    return f'asm volatile(".reg .f32 {acc}<{n_acc}>;");'


def _wgmma_stores(acc: str, n_acc: int, pointer: str, row_bytes: int, store: str) -> str:
    """One statement that stores a thread's accumulators ``acc0 …`` straight from their
    registers in the m16n8 C-fragment layout (:func:`_fragment_epilogue`): the pair
    ``4j + h``, ``4j + h + 1`` (h = 0, 2) at byte offset ``(h / 2)·8·row_bytes +
    j·8·size`` from ``pointer`` (the pair's element of j = h = 0), ``store`` the
    instruction — ``"global.bf16"`` / ``"global.f16"`` (rounded and packed to one word),
    ``"shared.f32"`` (a float pair). For the matmul's own value only — the kernel's one
    output, or a heavy epilogue's staged tile (:func:`emit_wgmma`): C moves of the 128
    accumulators and a 64-bit address a pair were half the plain wgmma unit's compile
    time (RESULTS.md, Kernels, twenty-third session)."""
    space, kind = store.split(".")
    size = 4 if kind == "f32" else 2
    out = []
    for j in range(n_acc // 4):
        for h in (0, 2):
            lo, hi, off = f"{acc}{4 * j + h}", f"{acc}{4 * j + h + 1}", \
                (h // 2) * 8 * row_bytes + j * 8 * size
            if kind == "f32":
                out.append(f"st.{space}.v2.f32 [%0+{off}], {{{lo}, {hi}}};\\n")
            else:
                out.append(f"cvt.rn.{kind}x2.f32 w, {hi}, {lo};\\nst.{space}.b32 [%0+{off}], w;\\n")
    reg = "r" if space == "shared" else "l"
    return (f'asm volatile("{{\\n.reg .b32 w;\\n{"".join(out)}}}\\n" :: "{reg}"({pointer}) '
            ': "memory");')


def _wgmma_results(acc: str, n_acc: int, dest: str) -> list[str]:
    """``dest[i] = acc<i>`` for every accumulator (after ``wgmma.wait_group 0``), eight
    moves a statement (few operands a statement, as :func:`_wgmma_call` explains)."""
    out = []
    for lo in range(0, n_acc, 8):
        idx = range(lo, min(lo + 8, n_acc))
        moves = "".join(f"mov.b32 %{q}, {acc}{i};\\n" for q, i in enumerate(idx))
        outs = ", ".join(f'"=f"({dest}[{i}])' for i in idx)
        out.append(f'asm volatile("{moves}" : {outs});')
    return out


def _tma_load(dst: str, tmap: str, x: str, y: str) -> str:
    """The TMA copy of the box at column ``x``, row ``y`` of tensor map ``tmap`` to shared
    address ``dst``, counted in by the stage's ``full`` mbarrier."""
    return ('asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.'
            'mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" :: '
            f'"r"({dst}), "l"({tmap}), "r"({x}), "r"({y}), "r"(full) : "memory");')


def _raster_origin(raster: int, tm: int, tn: int) -> list[str]:
    """The lines that set a matmul block's tile origin ``m0, n0``: row-major from the
    block index (``raster`` 1), else the plan's grouped order (``KernelPlan.raster``:
    consecutive blocks sweep ``raster`` rows of tiles, then the next column).

    >>> print("\\n".join(_raster_origin(4, 128, 256)))
      const int accy_b = blockIdx.y * gridDim.x + blockIdx.x, accy_span = 4 * gridDim.x;
      const int accy_r0 = accy_b / accy_span * 4, accy_w = accy_b % accy_span;
      const int accy_rows = min((int)gridDim.y - accy_r0, 4);
      const int m0 = (accy_r0 + accy_w % accy_rows) * 128, n0 = accy_w / accy_rows * 256;
    """
    if raster <= 1:
        return [f"  const int m0 = blockIdx.y * {tm}, n0 = blockIdx.x * {tn};"]
    return [f"  const int accy_b = blockIdx.y * gridDim.x + blockIdx.x, "
            f"accy_span = {raster} * gridDim.x;",
            f"  const int accy_r0 = accy_b / accy_span * {raster}, accy_w = accy_b % accy_span;",
            f"  const int accy_rows = min((int)gridDim.y - accy_r0, {raster});",
            f"  const int m0 = (accy_r0 + accy_w % accy_rows) * {tm}, "
            f"n0 = accy_w / accy_rows * {tn};"]


def emit_wgmma(k: KernelFuncOp, fast_math: bool) -> tuple[str, list[str]]:
    """The ``wgmma-tiled`` plan: Hopper warpgroups, the operands brought by the TMA.

    A block is one producer warpgroup and ``warps[0]`` consumer warpgroups. The
    producer's first thread loads each 64-deep stage of A (``tile[0]`` rows × 64) and
    B (``tile[1]`` columns in 64-column slabs × 64 rows) with
    ``cp.async.bulk.tensor`` through the launch's tensor maps (``tensor_maps``: the
    loader encodes them, 128-byte swizzle), into one of ``stages`` shared buffers,
    and the stage's ``full`` mbarrier counts the bytes in. Each consumer waits on it,
    runs ``wgmma.mma_async`` (``plan.mma``: m64nNk16) on its ``warps[1]`` 64-row
    slices, and once ``wgmma.wait_group 1`` has retired the previous stage's reads it
    arrives on that stage's ``empty`` mbarrier, which the producer waits on before
    refilling it. Shared layout: A K-major (a 128-byte row of 64 halves a row of M,
    16-byte chunk ``c`` of row ``r`` at ``c ^ (r % 8)``: the TMA's 128-byte swizzle),
    B N-major (64 rows × 128 bytes a slab, the same swizzle). Then the epilogue at
    every accumulator's (m, n) (per 8 columns, the ``mma.sync`` C-fragment layout, two
    adjacent columns together: :func:`_fragment_epilogue`) — or, where its fused ops
    are :data:`HEAVY_OPS` and the tile fits the stage buffers, *staged*: once every
    consumer is past its last wgmma (named barrier 1), each writes its accumulators to
    the stage buffers (rows :data:`WGMMA_STAGED_PAD` floats apart) and runs the epilogue
    in one loop over its rows, four adjacent columns an iteration (coalesced loads and
    stores), unrolled twice. Unrolled over a thread's 64 accumulator pairs, a gelu
    epilogue was most of the bf16 MLP unit's NVRTC time; in the loop it is compiled
    twice (once, the kernel ran 3 % slower on the H200).
    """
    ins, outs, params = _params(k)
    plan = k.plan
    tm, tn, tk = plan.tile
    consumers, per = plan.warps
    st = plan.stages
    threads = plan.block[0]
    dims = MatmulDims.of(k)
    mm, batch_shape, m_, k_ = dims.op, dims.batch, dims.m, dims.k
    el = dims.element
    b = ExprBuilder(ins, cuda=True, prefix=k.sym_name, fast_math=fast_math)
    a_bytes, b_bytes = tm * tk * 2, tk * tn * 2
    stage = a_bytes + b_bytes
    n_acc = tn // 2
    acc = [f"accy_d{mt}_" for mt in range(per)]  # a thread's accumulators of each slice
    # No setmaxnreg: 128 accumulators a thread fit the 168 registers 384 threads allow, and
    # on the H200 moving registers to the consumers gave wrong f16 results whenever the K
    # loop was unrolled whole (K of 128 or 256: the diagnosis is in RESULTS.md)
    params = params + [f"const __grid_constant__ accy_tmap tmap{i}"
                       for i in range(len(plan.tensor_maps) // 5)]
    lines = [f"extern \"C\" __global__ void __launch_bounds__({threads}, 1) "
             f"{k.sym_name}({', '.join(params)}) {{",
             "  extern __shared__ unsigned char smem_raw[];",
             "  const unsigned base = ((unsigned)__cvta_generic_to_shared(smem_raw) + 1023u) "
             "& ~1023u;",
             f"  const unsigned bars = base + {st * stage};  // full[s], then empty[s]",
             "  const int tid = threadIdx.x, wg = tid >> 7, lane = tid & 31, "
             "wq = (tid >> 5) & 3;",
             *_raster_origin(plan.raster, tm, tn),
             "  const long long bz = blockIdx.z;"]
    pre, bnames = _batch_prologue(batch_shape)
    lines += pre
    lines += ["  " + _wgmma_registers(name, n_acc) for name in acc]
    lines += [f"  const int kts = {k_ // tk};",
              "  if (tid == 0) {",
              f"    for (int s = 0; s < {st}; ++s) {{",
              "      asm volatile(\"mbarrier.init.shared::cta.b64 [%0], 1;\" :: "
              "\"r\"(bars + 8 * s));",
              f"      asm volatile(\"mbarrier.init.shared::cta.b64 [%0], {consumers};\" :: "
              f"\"r\"(bars + 8 * ({st} + s)));",
              "    }",
              "    asm volatile(\"fence.mbarrier_init.release.cluster;\" ::: \"memory\");",
              "  }",
              "  __syncthreads();",
              "  if (wg == 0) {  // the producer",
              "    if (tid == 0) {",
              "      const unsigned long long ta = reinterpret_cast<unsigned long long>(&tmap0);",
              "      const unsigned long long tb = reinterpret_cast<unsigned long long>(&tmap1);",
              "      #pragma unroll 1",
              "      for (int kt = 0; kt < kts; ++kt) {",
              f"        const int s = kt % {st};",
              f"        const unsigned full = bars + 8 * s, empty = bars + 8 * ({st} + s);",
              f"        accy_mbar_wait(empty, ((kt / {st}) & 1) ^ 1);",
              "        asm volatile(\"mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], "
              f"{stage};\" :: \"r\"(full) : \"memory\");",
              f"        const unsigned a = base + s * {stage}, b = a + {a_bytes};",
              "        " + _tma_load("a", "ta", f"kt * {tk}", f"(int)bz * {m_} + m0"),
              "        #pragma unroll",
              f"        for (int nb = 0; nb < {tn // 64}; ++nb)",
              "          " + _tma_load(f"b + nb * {tk * 128}", "tb", "n0 + nb * 64",
                                        f"(int)bz * {k_} + kt * {tk}"),
              "      }",
              "    }",
              "  } else {  // a consumer",
              "    const int cw = wg - 1;"]
    # a stage's k-steps are spelled unrolled, each wgmma naming its accumulators as the
    # kernel's own PTX registers (declared and zeroed at its top: _wgmma_registers); the
    # k-tile loop is rolled: NVVM unrolled a short one whole (K of 256: 4 k-tiles, 16
    # wgmma statements), which doubled the unit's compile time for the same work
    lines += ["    #pragma unroll 1",
              "    for (int kt = 0; kt < kts; ++kt) {",
              f"      const int s = kt % {st};",
              f"      accy_mbar_wait(bars + 8 * s, (kt / {st}) & 1);",
              f"      const unsigned a = base + s * {stage}, b = a + {a_bytes};",
              "      asm volatile(\"wgmma.fence.sync.aligned;\" ::: \"memory\");"]
    for j in range(tk // 16):
        lines += ["      {",
                  f"        const unsigned long long db = accy_wgmma_desc(b + {j * 2048}, "
                  f"{tk * 128}, 1024);"]
        for mt in range(per):
            lines += [f"        const unsigned long long da{mt} = accy_wgmma_desc(a + (cw * {per} "
                      f"+ {mt}) * 8192 + {j * 32}, 16, 1024);",
                      "        " + _wgmma_call(plan.mma, acc[mt], n_acc, f"da{mt}",
                                               "kt" if j == 0 else "1")]
        lines.append("      }")
    lines += ["      asm volatile(\"wgmma.commit_group.sync.aligned;\" ::: \"memory\");",
              "      asm volatile(\"wgmma.wait_group.sync.aligned 1;\" ::: \"memory\");",
              "      if (kt > 0 && (tid & 127) == 0)  // the previous stage's reads are done",
              "        asm volatile(\"mbarrier.arrive.shared::cta.b64 _, [%0];\" :: "
              f"\"r\"(bars + 8 * ({st} + (kt - 1) % {st})) : \"memory\");",
              "    }",
              "    asm volatile(\"wgmma.wait_group.sync.aligned 0;\" ::: \"memory\");"]
    def rows(mt: int | str) -> str:  # warp wq of the consumer: rows 16·wq … of slice mt
        return f"(cw * {per} + {mt}) * 64 + wq * 16"

    def row(mt: int) -> str:  # a thread's first row of slice mt in the block tile
        return f"{rows(mt)} + (lane >> 2)"

    pitch = tn + WGMMA_STAGED_PAD
    if _heavy_epilogue(k) and tm * pitch * 4 <= st * stage:
        # staged: every consumer's tile to the (drained) stage buffers, then one loop
        # over it, four adjacent columns an iteration
        lines += [f"    asm volatile(\"bar.sync 1, {consumers * 128};\" ::: \"memory\");",
                  "    float* const tile = reinterpret_cast<float*>(smem_raw + (base - (unsigned)"
                  "__cvta_generic_to_shared(smem_raw)));"]
        lines += ["    " + _wgmma_stores(acc[mt], n_acc, f"base + ({row(mt)}) * {pitch * 4} + "
                                          "(lane & 3) * 8", pitch * 4, "shared.f32")
                  for mt in range(per)]
        lines += ["    asm volatile(\"bar.sync %0, 128;\" :: \"r\"(2 + cw) : \"memory\");",
                  "    #pragma unroll 2",
                  f"    for (int e = tid & 127; e < {per * 64 * tn // 4}; e += 128) {{",
                  f"      const int r = cw * {per * 64} + e / {tn // 4}, c = e % {tn // 4} * 4;",
                  "      const long long m = m0 + r, n = n0 + c;",
                  f"      const float4 q = *reinterpret_cast<const float4*>(tile + r * {pitch} "
                  "+ c);",
                  *("      " + x for x in _lane_epilogue(k, b, mm, outs, tuple(bnames),
                                                          ["q.x", "q.y", "q.z", "q.w"], el)),
                  "    }"]
    elif _only_output(k, mm):
        # the matmul's own value, its only output: rounded and stored from the registers
        value = mm.results[0]
        shape = shape_of(value)
        for mt in range(per):
            at = b.offset(shape, tuple(bnames) + (f"(long long)(m0 + {row(mt)})",
                                                  "(n0 + (lane & 3) * 2)"), 0)
            lines.append("    " + _wgmma_stores(acc[mt], n_acc, f"{outs[0]} + {at}",
                                                strides_of(shape)[-2] * 2,
                                                f"global.{elem_of(value)}"))
    else:
        # the accumulators to C variables for the epilogue, which loops over them as an
        # array (a loop, not its unrolled text: a fused epilogue spelled out for each pair
        # made the bf16 MLP's unit 8x longer and slower to compile)
        lines.append(f"    float d[{per}][{n_acc}];")
        for mt in range(per):
            lines += ["    " + x for x in _wgmma_results(acc[mt], n_acc, f"d[{mt}]")]
        lines += _fragment_epilogue([("mt", per), ("j", tn // 8)], rows("mt"), "j * 8",
                                    lambda h: f"d[mt][4 * j + {h}]",
                                    lambda raw: _lane_epilogue(k, b, mm, outs, tuple(bnames),
                                                               raw, el), "    ")
    lines += ["  }", "}"]
    return "\n".join(lines), b.tables


def emit_matmul_plan(k: KernelFuncOp, fast_math: bool) -> tuple[str, list[str]]:
    """A matmul kernel as its plan maps it (warpgroup or warp tensor cores, FFMA tiles)."""
    if k.plan.mapping == "wgmma-tiled":
        return emit_wgmma(k, fast_math)
    if k.plan.mapping == "mma-tiled":
        return emit_mma(k, fast_math)
    return emit_matmul(k, fast_math)


def emit_attention(k: KernelFuncOp, fast_math: bool) -> tuple[str, list[str]]:
    """The ``flash`` plan: one attention chain, an online softmax over key tiles."""
    ins, outs, params = _params(k)
    return emit_attention_cuda(k, ins, outs, params, fast_math)


EMITTERS = {"elementwise": emit_elementwise, "rows": emit_rows, "matmul": emit_matmul_plan,
            "attention": emit_attention}


def emit_kernels(kernels: list[KernelFuncOp], fast_math: bool = False) -> str:
    """The translation unit for ``kernels`` (without the launch-table comment)."""
    text = translation_unit(["// generated by accy: CUDA C, compile with -arch=sm_XX only",
                             PRELUDE, "@HELPERS@"], kernels,
                            lambda k: EMITTERS[k.plan.kind](k, fast_math))
    used = used_helpers(text)
    return text.replace("@HELPERS@\n", "".join(h + "\n" for h in used), 1)
