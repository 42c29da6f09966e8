"""Two adjacent f16/bf16 lanes as one 32-bit word: packed ops for vector kernels.

A vectorized CUDA kernel over halves (a grid-stride kernel, or the column loops of a
block- or warp-per-row kernel) loads eight of them a ``uint4``. Its f32
path unpacks each lane to a float, computes, and rounds every op's result back to
the half type (``accy_bf2f(accy_f2bf(x))``, two instructions a lane). Where two
lanes' op has an exact packed equivalent, :class:`accy.target.pairs.PairBuilder` keeps the pair in
the word it was loaded in and runs the op as one instruction on both
(:data:`PACKED`); the pair is unpacked only for an op that needs f32 (a
transcendental), whose two results are rounded by one packed conversion
(``cvt.rn.bf16x2.f32``: ``accy_pack_bf2``) rather than one a lane.

The results are the f32 path's, bit for bit, NaNs included:

* ``add``/``sub``/``mul`` round once, where the f32 path rounds the f32 result to
  the half type: the same value, as f32 carries more than twice a half's precision
  plus two bits (double rounding is innocuous), and in the subnormal range an f32
  sum or product of two halves is exact or below half the least half subnormal.
  bf16 spells them as ``fma.rn.bf16x2`` with a constant (``a·1 + b``, ``b·-1 + a``,
  ``a·b + -0``: one rounding, zeros signed as IEEE adds and multiplies sign them).
* ``max``/``min``/``relu`` select an operand's bits by a per-half mask from
  ``set.gt|lt.u32``, as the f32 path's ``(a > b || a != a) ? a : b`` does (NaN
  propagates, ``max(+0, -0)`` is ``-0``), not ``max.bf16x2``, which makes ``+0``
  of both and canonicalizes NaNs; ``neg``/``abs`` are sign-bit operations.
* A word stored as it is (a select's result, a loaded input) passes NaNs through
  a multiply by one (``accy_canon_*``), which makes them the canonical NaN the f32
  path's store conversion makes.

Subnormals: the packed instructions keep them, as the f32 path does without
``-use_fast_math``; with it, f32 flushes bf16 subnormals to zero and the packed
bf16 ops do not (fast math promises no bit pattern; f16 subnormals are f32 normals).
"""

from __future__ import annotations

from dataclasses import dataclass

HALVES = ("f16", "bf16")
SUFFIX = {"f16": "h2", "bf16": "bf2"}
"""The suffix of a half type's packed helpers (``accy_add_bf2``, ``accy_pack_h2``)."""
PTX_TYPE = {"f16": "f16x2", "bf16": "bf16x2"}
ONE = {"f16": "0x3c003c00u", "bf16": "0x3f803f80u"}
"""1.0 in both halves of a word."""
NEG_ONE = {"f16": "0xbc00bc00u", "bf16": "0xbf80bf80u"}
NEG_ZERO = "0x80008000u"


def _fma(a: str, b: str, c: str, el: str) -> str:
    return (f'unsigned int r; asm("fma.rn.{PTX_TYPE[el]} %0, %1, %2, %3;" : "=r"(r) : '
            f'"r"({a}), "r"({b}), "r"({c})); return r;')


def _arith(op: str, el: str) -> str:
    if el == "f16":
        return (f'unsigned int r; asm("{op}.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), '
                f'"r"(b)); return r;')
    return {"add": _fma("a", ONE[el], "b", el), "sub": _fma("b", NEG_ONE[el], "a", el),
            "mul": _fma("a", "b", NEG_ZERO, el)}[op]


def _select(cmp: str, el: str) -> str:
    """``(a CMP b || a != a) ? a : b`` a half at a time, on the bits."""
    t = PTX_TYPE[el]
    return (f'unsigned int m, n; asm("set.{cmp}.u32.{t} %0, %1, %2;" : "=r"(m) : "r"(a), '
            f'"r"(b)); asm("set.nan.u32.{t} %0, %1, %1;" : "=r"(n) : "r"(a)); m |= n; '
            f'return (a & m) | (b & ~m);')


def _relu(el: str) -> str:
    """``(a > 0 || a != a) ? a : 0``: ``gtu`` is "greater or unordered", and 0 is no NaN."""
    return (f'unsigned int m; asm("set.gtu.u32.{PTX_TYPE[el]} %0, %1, %2;" : "=r"(m) : '
            f'"r"(a), "r"(0u)); return a & m;')


@dataclass(frozen=True)
class PackedOp:
    """One op on a word of two halves: the compute capability its spelling needs and
    the helper's body (C statements on ``a``, and ``b`` when binary)."""

    sm: int
    arity: int
    body: str


def _table() -> dict[tuple[str, str], PackedOp]:
    out = {}
    for el in HALVES:
        arith = 53 if el == "f16" else 80  # add.rn.f16x2; fma.rn.bf16x2
        select = 53 if el == "f16" else 90  # set.*.u32.f16x2; set.*.u32.bf16x2
        out.update({
            (el, "add"): PackedOp(arith, 2, _arith("add", el)),
            (el, "sub"): PackedOp(arith, 2, _arith("sub", el)),
            (el, "mul"): PackedOp(arith, 2, _arith("mul", el)),
            (el, "max"): PackedOp(select, 2, _select("gt", el)),
            (el, "min"): PackedOp(select, 2, _select("lt", el)),
            (el, "relu"): PackedOp(select, 1, _relu(el)),
            (el, "neg"): PackedOp(0, 1, "return a ^ 0x80008000u;"),
            (el, "abs"): PackedOp(0, 1, "return a & 0x7fff7fffu;"),
        })
    return out


PACKED: dict[tuple[str, str], PackedOp] = _table()
"""``(element, op)`` → its packed form: the ops whose packed result is the f32 op's
rounded to the half type (module docstring)."""
ROUNDING = frozenset({"add", "sub", "mul"})
"""Packed ops whose NaN results are the canonical NaN (they round, as a conversion
does); the others pass an operand's NaN through."""


def packed_ops(element: str, sm: int) -> tuple[str, ...]:
    """The ops of ``element`` that run packed on compute capability ``sm``.

    >>> packed_ops("bf16", 80)
    ('abs', 'add', 'mul', 'neg', 'sub')
    >>> len(packed_ops("bf16", 90)), packed_ops("f32", 90)
    (8, ())
    """
    return tuple(sorted(op for (el, op), p in PACKED.items() if el == element and sm >= p.sm))


def helper_name(op: str, el: str) -> str:
    return f"accy_{op}_{SUFFIX[el]}"


def helpers(qualifier: str = "__device__ __forceinline__") -> dict[str, str]:
    """Every packed helper's C text by name (``accy_add_bf2`` …, ``accy_canon_h2``,
    ``accy_bits_bf2``)."""
    out = {}
    for (el, op), p in PACKED.items():
        params = "unsigned int a, unsigned int b" if p.arity == 2 else "unsigned int a"
        out[helper_name(op, el)] = (f"{qualifier} unsigned int {helper_name(op, el)}({params}) "
                                    f"{{\n  {p.body}\n}}")
    for el in HALVES:
        out[helper_name("canon", el)] = (f"{qualifier} unsigned int "
                                         f"{helper_name('canon', el)}(unsigned int a) {{\n  "
                                         f"{_fma('a', ONE[el], NEG_ZERO, el)}\n}}")
    out["accy_bits_bf2"] = (f"{qualifier} unsigned int accy_bits_bf2(float lo, float hi) {{\n"
                            "  return __byte_perm(__float_as_uint(lo), __float_as_uint(hi), "
                            "0x7632);\n}")
    return out


def half_lanes(word: str, el: str) -> tuple[str, str]:
    """The two floats of ``word`` (a 32-bit word of two ``el`` halves), low half first."""
    if el == "bf16":  # a bf16 is the top half of its float
        return f"__uint_as_float({word} << 16)", f"__uint_as_float({word} & 0xffff0000u)"
    return f"accy_h2f((unsigned short){word})", f"accy_h2f((unsigned short)({word} >> 16))"


def round_pack(el: str) -> str:
    """The helper that rounds two floats to ``el`` into one word (low lane first)."""
    return f"accy_pack_{SUFFIX[el]}"


__all__ = ["HALVES", "PACKED", "ROUNDING", "PackedOp", "half_lanes", "helper_name",
           "helpers", "packed_ops", "round_pack"]
