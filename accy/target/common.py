"""What the CUDA and host emitters share: types, scalar math, index maps, expressions.

A kernel body is ``prim`` ops over the kernel's inputs. :class:`ExprBuilder`
turns the value a kernel writes into C statements *at an index*: an
elementwise op is its operands' expressions combined; ``prim.broadcast`` and
``prim.transpose`` remap the index (so they cost no memory traffic); an input
is a load at the row-major offset of the index; a constant is a literal or a
static table; a reduction or a matmul result is a name the kernel bound
earlier (a row statistic, an accumulator). Index components may carry the
lane placeholder ``@L`` (vectorized kernels emit one scalar expression per
lane, and loads along a unit stride become one vector load).
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from accy.choir.attributes import (
    DenseArrayAttr,
    DenseElementsAttr,
    IntegerAttr,
    StringAttr,
    TensorType,
    round_to_type,
)
from accy.choir.ir import BlockArgument, Operation, OpResult, Value
from accy.dialects.prim import DATA_OPS
from accy.errors import AccyError

LANE = "@L"

STORAGE = {"f32": "float", "f16": "unsigned short", "bf16": "unsigned short", "f64": "double",
           "i1": "unsigned char", "i8": "signed char", "i16": "short", "i32": "int",
           "i64": "long long", "index": "long long", "ui8": "unsigned char",
           "ui16": "unsigned short", "ui32": "unsigned int", "ui64": "unsigned long long"}
COMPUTE = {"f32": "float", "f16": "float", "bf16": "float", "f64": "double", "i1": "int",
           "i8": "int", "i16": "int", "i32": "int", "i64": "long long", "index": "long long",
           "ui8": "int", "ui16": "int", "ui32": "long long", "ui64": "unsigned long long"}
"""ui8/ui16/ui32 compute in a wider signed type (every value fits) and wrap after each op;
ui64 computes in ``unsigned long long``."""

UNARY_F = {"neg": "(-{0})", "abs": "fabs{f}({0})", "exp": "exp{f}({0})", "log": "log{f}({0})",
           "sqrt": "sqrt{f}({0})", "tanh": "tanh{f}({0})", "erf": "erf{f}({0})",
           "erfc": "erfc{f}({0})",
           "sin": "sin{f}({0})", "cos": "cos{f}({0})", "floor": "floor{f}({0})",
           "relu": "(({0} > {zero} || {0} != {0}) ? {0} : {zero})", "reciprocal": "({one} / {0})",
           "sigmoid": "({one} / ({one} + exp{f}(-{0})))", "rsqrt": "({one} / sqrt{f}({0}))"}
BINARY_F = {"add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})",
            "div": "({0} / {1})", "max": "(({0} > {1} || {0} != {0}) ? {0} : {1})",
            "min": "(({0} < {1} || {0} != {0}) ? {0} : {1})", "pow": "pow{f}({0}, {1})"}
"""Float ``max``/``min``/``relu`` propagate NaN and pick like ``np.maximum``/``np.minimum``
(``fmaxf`` would drop a NaN operand)."""
BINARY_I = {"add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})",
            "div": "accy_idiv_{t}({0}, {1})", "max": "(({0}) > ({1}) ? ({0}) : ({1}))",
            "min": "(({0}) < ({1}) ? ({0}) : ({1}))", "pow": "accy_ipow_{t}({0}, {1})"}
UNARY_I = {"neg": "(-{0})", "abs": "(({0}) < 0 ? -({0}) : ({0}))",
           "relu": "(({0}) > 0 ? ({0}) : 0)"}
CMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
REDUCE_INIT = {"sum": "0", "max": "-INFINITY", "min": "INFINITY"}
REDUCE_INIT_I = {"sum": "0", "max": "{lo}", "min": "{hi}"}
EXACT_OPS = frozenset({"neg", "abs", "relu", "max", "min"})
"""Float ops whose result is one of their operands, negated or not: on f16/bf16
operands that are already numbers of the type, rounding the result changes nothing
(so it is not spelled: two instructions a value)."""
NEGATING = frozenset({"neg", "sigmoid"})
"""Ops whose spelling puts a ``-`` before an operand: a negative literal operand is
parenthesized there (``(--3.0f)`` is not C)."""

PRELUDE_C = r"""
static inline float accy_h2f(unsigned short h) {
  unsigned int s = (unsigned int)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, b;
  if (e == 0) {
    if (m == 0) { b = s; } else {
      e = 113; while (!(m & 0x400u)) { m <<= 1; e--; } m &= 0x3ffu;
      b = s | (e << 23) | (m << 13);
    }
  } else if (e == 31) { b = s | 0x7f800000u | (m << 13); }
  else { b = s | ((e + 112) << 23) | (m << 13); }
  float f; memcpy(&f, &b, 4); return f;
}
static inline unsigned short accy_f2h(float f) {
  unsigned int x; memcpy(&x, &f, 4);
  unsigned int s = (x >> 16) & 0x8000u; int e = (int)((x >> 23) & 0xffu) - 127 + 15;
  unsigned int m = x & 0x7fffffu;
  if (((x >> 23) & 0xffu) == 0xffu) return (unsigned short)(s | 0x7c00u | (m ? 0x200u : 0));
  if (e >= 31) return (unsigned short)(s | 0x7c00u);
  if (e <= 0) {
    if (e < -10) return (unsigned short)s;
    m |= 0x800000u; unsigned int shift = (unsigned int)(14 - e);
    unsigned int half = m >> shift, rem = m & ((1u << shift) - 1u), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) half++;
    return (unsigned short)(s | half);
  }
  unsigned int half = s | ((unsigned int)e << 10) | (m >> 13), rem = m & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) half++;
  return (unsigned short)half;
}
static inline float accy_d2f_odd(double x) {
  float f = (float)x; unsigned int u; memcpy(&u, &f, 4);
  if ((double)f != x && x == x && !(u & 1u)) f = nextafterf(f, (double)f > x ? -INFINITY : INFINITY);
  return f;
}
static inline float accy_bf2f(unsigned short h) {
  unsigned int b = (unsigned int)h << 16; float f; memcpy(&f, &b, 4); return f;
}
static inline unsigned short accy_f2bf(float f) {
  unsigned int x; memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u); return (unsigned short)(x >> 16);
}
static inline int accy_idiv_int(int a, int b) { return b == 0 ? 0 : a / b; }
static inline long long accy_idiv_ll(long long a, long long b) { return b == 0 ? 0 : a / b; }
static inline unsigned long long accy_idiv_ull(unsigned long long a, unsigned long long b) {
  return b == 0 ? 0 : a / b;
}
static inline unsigned long long accy_ipow_ull(unsigned long long a, unsigned long long b) {
  unsigned long long r = 1; while (b) { if (b & 1) r *= a; a *= a; b >>= 1; } return r;
}
static inline int accy_ipow_int(int a, int b) {
  if (b < 0) return (a == 1) ? 1 : (a == -1 ? ((b & 1) ? -1 : 1) : 0);
  int r = 1; while (b) { if (b & 1) r *= a; a *= a; b >>= 1; } return r;
}
static inline long long accy_ipow_ll(long long a, long long b) {
  if (b < 0) return (a == 1) ? 1 : (a == -1 ? ((b & 1) ? -1 : 1) : 0);
  long long r = 1; while (b) { if (b & 1) r *= a; a *= a; b >>= 1; } return r;
}
"""


def shape_of(v: Value) -> tuple[int, ...]:
    t = v.type
    assert isinstance(t, TensorType) and t.is_static
    return tuple(int(d) for d in t.shape)  # type: ignore[arg-type]


@dataclass(frozen=True)
class MatmulDims:
    """A matmul kernel's ``prim.matmul`` and its extents (every emitter's prologue)."""

    op: Operation
    batch: tuple[int, ...]
    m: int
    n: int
    k: int
    element: str

    @staticmethod
    def of(kernel: Any) -> MatmulDims:
        mm = next(op for op in kernel.body.ops if op.op_name == "prim.matmul")
        out = shape_of(mm.results[0])
        return MatmulDims(mm, out[:-2], out[-2], out[-1], shape_of(mm.operands[0])[-1],
                          elem_of(mm.results[0]))


def split_yields(yields: Sequence[Value], shape: tuple[int, ...]) \
        -> tuple[list[tuple[int, Value]], list[tuple[int, Value, tuple[int, ...]]],
                 list[tuple[int, Value]]]:
    """A row kernel's outputs: full-width (the iteration shape), transposed (a
    ``prim.transpose`` of a full-width value, stored through its permutation:
    ``(index, value transposed, permutation)``) and per-row (reduced)."""
    full, transposed, reduced = [], [], []
    for i, v in enumerate(yields):
        # first: a square transpose has the iteration shape too
        if isinstance(v, OpResult) and v.op.op_name == "prim.transpose" and \
                shape_of(v.op.operands[0]) == shape:
            perm = v.op.attr("permutation")
            assert isinstance(perm, DenseArrayAttr)
            transposed.append((i, v.op.operands[0], tuple(perm.values)))
        elif shape_of(v) == shape:
            full.append((i, v))
        else:
            reduced.append((i, v))
    return full, transposed, reduced


def elem_of(v: Value) -> str:
    t = v.type
    assert isinstance(t, TensorType)
    return t.element.name


def strides_of(shape: tuple[int, ...]) -> tuple[int, ...]:
    st = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        st[i] = st[i + 1] * shape[i + 1]
    return tuple(st)


def c_float(x: float, ctype: str) -> str:
    """A C literal of ``ctype`` for ``x`` (exact: hex float for finite values)."""
    if math.isnan(x):
        return "NAN" if ctype == "float" else "((double)NAN)"
    if math.isinf(x):
        return ("INFINITY" if x > 0 else "-INFINITY") if ctype == "float" else \
            ("((double)INFINITY)" if x > 0 else "(-(double)INFINITY)")
    if ctype == "float":
        x = struct.unpack("<f", struct.pack("<f", x))[0]
        return f"{x.hex()}f" if x != int(x) or abs(x) > 1e7 else f"{float(x)!r}f"
    return x.hex() if x != int(x) or abs(x) > 1e15 else repr(float(x))


def literal(value: object, el: str) -> str:
    ct = COMPUTE[el]
    if el in ("f32", "f16", "bf16"):
        return c_float(float(value), "float")  # type: ignore[arg-type]
    if el == "f64":
        return c_float(float(value), "double")  # type: ignore[arg-type]
    if el == "i1":
        return "1" if value else "0"
    v = int(value)  # type: ignore[call-overload]
    if ct == "unsigned long long":
        return f"{v % (1 << 64)}ULL"
    return f"{v}LL" if ct == "long long" else str(v)


def load_convert(raw: str, el: str) -> str:
    if el == "f16":
        return f"accy_h2f({raw})"
    if el == "bf16":
        return f"accy_bf2f({raw})"
    if el == "i1":
        return f"((int)({raw} != 0))"
    return raw


def store_convert(val: str, el: str) -> str:
    if el == "f16":
        return f"accy_f2h({val})"
    if el == "bf16":
        return f"accy_f2bf({val})"
    if el == "i1":
        return f"(unsigned char)(({val}) != 0)"
    return f"({STORAGE[el]})({val})"


def stored_only(terminator: Operation | None) -> set[Value]:
    """The f16/bf16 op results a kernel's ``terminator`` yields, directly or through a
    ``prim.transpose`` it stores (a column softmax's), that nothing else reads
    (:attr:`ExprBuilder.stored_unrounded`)."""
    if terminator is None:
        return set()
    out: set[Value] = set()
    for v in terminator.operands:
        reader = terminator
        if isinstance(v, OpResult) and v.op.op_name == "prim.transpose" and \
                all(op is terminator for op, _ in v.uses):  # stored through its permutation
            reader, v = v.op, v.op.operands[0]
        if isinstance(v, OpResult) and elem_of(v) in ("f16", "bf16") and \
                all(op is reader for op, _ in v.uses):
            out.add(v)
    return out


def round_compute(val: str, el: str) -> str:
    """Round a computed value to its element type: f16/bf16 store precision; i8/i16
    wrap (they compute in ``int``, as the reference wraps every narrow result)."""
    if el == "f16":
        return f"accy_h2f(accy_f2h({val}))"
    if el == "bf16":
        return f"accy_bf2f(accy_f2bf({val}))"
    if el in ("i8", "i16", "ui8", "ui16", "ui32"):
        return f"(({COMPUTE[el]})({STORAGE[el]})({val}))"
    return val


@dataclass
class Scope:
    """Statements of one loop body and the values already computed in it."""

    lines: list[str]
    memo: dict[tuple[object, ...], str] = field(default_factory=dict)
    parent: Scope | None = None

    def find(self, key: tuple[object, ...]) -> str | None:
        s: Scope | None = self
        while s is not None:
            if key in s.memo:
                return s.memo[key]
            s = s.parent
        return None


class ExprBuilder:
    """Emit a kernel body's values as C expressions at an index.

    Parameters
    ----------
    inputs
        C pointer names of the kernel's inputs (block arguments), in order.
    load_hook
        Called as ``load_hook(arg_index, idx, lane)`` before a default load;
        may return a C expression (a cached register, a vector lane) or None.
    cuda
        Emit CUDA spellings (``__restrict__``, ``rsqrtf``…).
    """

    def __init__(self, inputs: list[str], *, cuda: bool,
                 load_hook: Callable[[int, tuple[str, ...], int], str | None] | None = None,
                 fast_math: bool = False, prefix: str = "accy") -> None:
        self.inputs = inputs
        self.prefix = prefix
        self.cuda = cuda
        self.load_hook = load_hook
        self.value_hook: Callable[[Value, tuple[str, ...], Scope, int], str | None] | None = \
            None
        """Called as ``value_hook(value, idx, scope, lane)`` before an op result's own
        expression; may return a C expression for it (a lane of a packed pair:
        :class:`accy.target.packed.PairBuilder`) or None."""
        self.fast_math = fast_math
        self.bound: dict[Value, str] = {}
        """Values the kernel computed itself (row statistics, accumulators)."""
        self.tables: list[str] = []
        """File-scope constant tables."""
        self.table_of: dict[int, str] = {}
        self.counter = 0
        self.stored_unrounded: set[Value] = set()
        """f16/bf16 values whose one use is their kernel's store (:func:`stored_only`):
        their expression skips the rounding, as the store rounds to the same type
        (rounding twice to a type is rounding once)."""
        self.column: str | None = None
        """The name of the column a row kernel's column loop walks (``c``); with
        :attr:`hoist`, a float division by a value that reads no column is a quotient by
        a reciprocal made once a row (``accy.target.cuda.fdiv_helpers``)."""
        self.hoist: Scope | None = None
        """The scope around the column loops (a row's), where such a divisor's
        reciprocal is made."""
        self.hoist_exact = True
        """Whether a correctly rounded quotient by a value that reads no column uses a
        reciprocal made in :attr:`hoist` too (:meth:`row_quotient`), not only one that
        need only be right to half precision."""
        self.divisors: dict[tuple[Value, tuple[str, ...], bool], tuple[str, ...]] = {}
        """Hoisted divisors (:meth:`row_divisor`)."""
        self._half: dict[Value, bool] = {}

    def fresh(self, prefix: str = "t") -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    # ------------------------------------------------------------ index maps
    @staticmethod
    def operand_index(op: Operation, idx: tuple[str, ...]) -> tuple[str, ...]:
        """The index of ``op``'s operand read for result index ``idx``."""
        src = shape_of(op.operands[0])
        if op.op_name == "prim.broadcast":
            dims = op.attr("dims")
            assert isinstance(dims, DenseArrayAttr)
            return tuple("0" if src[i] == 1 else idx[d] for i, d in enumerate(dims.values))
        if op.op_name == "prim.transpose":
            perm = op.attr("permutation")
            assert isinstance(perm, DenseArrayAttr)
            out = [""] * len(src)
            for j, p in enumerate(perm.values):
                out[p] = idx[j]
            return tuple(out)
        raise AssertionError(op.op_name)

    def offset(self, shape: tuple[int, ...], idx: tuple[str, ...], lane: int) -> str:
        terms = []
        for st, ix, n in zip(strides_of(shape), idx, shape):
            if n == 1 or ix == "0":
                continue
            ix = ix.replace(LANE, str(lane))
            terms.append(ix if st == 1 else f"({ix})*{st}")
        return " + ".join(terms) or "0"

    def transposed_offset(self, shape: tuple[int, ...], idx: tuple[str, ...],
                          perm: tuple[int, ...], lane: int) -> str:
        """The offset of iteration point ``idx`` (of ``shape``) in the transpose by
        ``perm`` (output axis k is iteration axis ``perm[k]``): a stored transpose."""
        return self.offset(tuple(shape[p] for p in perm), tuple(idx[p] for p in perm), lane)

    # ----------------------------------------------------------- expressions
    def expr(self, v: Value, idx: tuple[str, ...], scope: Scope, lane: int = 0) -> str:
        """A C expression (usually a temporary's name) for ``v`` at ``idx``."""
        if v in self.bound:
            return self.bound[v]
        laned = any(LANE in i for i in idx)
        key = (id(v), idx, lane if laned else -1)
        found = scope.find(key)
        if found is not None:
            return found
        el = elem_of(v)
        ct = COMPUTE[el]
        if isinstance(v, BlockArgument):
            text = None
            if self.load_hook is not None:
                text = self.load_hook(v.index, idx, lane)
            if text is None:
                off = self.offset(shape_of(v), idx, lane)
                raw = f"{self.inputs[v.index]}[{off}]"
                if self.cuda and el in ("f32", "f64", "i32", "i64"):
                    raw = f"__ldg(&{raw})"
                text = load_convert(raw, el)
        else:
            assert isinstance(v, OpResult)
            text = None
            if self.value_hook is not None:
                text = self.value_hook(v, idx, scope, lane)
            if text is None:
                text = self.op_expr(v.op, idx, scope, lane)
        if text.isidentifier() or _is_literal(text) or _is_lane(text):
            scope.memo[key] = text
            return text
        name = self.fresh()
        scope.lines.append(f"{ct} {name} = {text};")
        scope.memo[key] = name
        return name

    def op_expr(self, op: Operation, idx: tuple[str, ...], scope: Scope, lane: int,
                rounded: bool = True) -> str:
        """``op``'s result at ``idx``; an f16/bf16 result not ``rounded`` is left in float
        for whatever rounds it (a store, a pack of two lanes)."""
        name = op.op_name.split(".", 1)[1]
        el = elem_of(op.results[0])
        if name in ("broadcast", "transpose"):
            return self.expr(op.operands[0], self.operand_index(op, idx), scope, lane)
        if name in DATA_OPS:
            return self.data_expr(op, tuple(i.replace(LANE, str(lane)) for i in idx), scope,
                                  lane)
        if name == "constant":
            return self.constant(op, idx, lane)
        if name in ("reduce", "matmul"):
            raise AccyError(f"internal: '{op.op_name}' value used before the kernel bound it")
        quotient = self.row_quotient(op, idx) if name == "div" else None
        if quotient == "half":
            a = self.expr(op.operands[0], idx, scope, lane)
            s, r = self.row_divisor(op.operands[1], idx, lane, half=True)
            return self.rounded(op, f"(({a}) * {s}) * {r}", rounded)
        if quotient == "exact":
            a = self.expr(op.operands[0], idx, scope, lane)
            b, r, lo = self.row_divisor(op.operands[1], idx, lane)
            return self.rounded(op, f"accy_fdiv_by({a}, {b}, {r}, {lo})", rounded)
        args = [self.expr(o, idx, scope, lane) for o in op.operands]
        if name in NEGATING:
            args = [f"({a})" if a.startswith("-") else a for a in args]
        if name == "cmp":
            pred = op.attr("predicate")
            assert isinstance(pred, StringAttr)
            return f"((int)({args[0]} {CMP[pred.value]} {args[1]}))"
        if name == "select":
            return f"(({args[0]}) ? ({args[1]}) : ({args[2]}))"
        if name == "cast":
            src = elem_of(op.operands[0])
            return self.cast(args[0], src, el,
                             rounded and op.results[0] not in self.stored_unrounded)
        in_el = elem_of(op.operands[0])
        if in_el in ("f32", "f16", "bf16", "f64"):
            return self.float_expr(op, args, rounded)
        t = {"long long": "ll", "unsigned long long": "ull"}.get(COMPUTE[in_el], "int")
        table = UNARY_I if len(args) == 1 else BINARY_I
        if name not in table:
            raise AccyError(f"'{op.op_name}' is not defined on integers")
        text = table[name].format(*args, t=t)
        if el == "i1":
            text = f"((int)(({text}) != 0))"
        return round_compute(text, el)

    def float_expr(self, op: Operation, args: list[str], rounded: bool = True) -> str:
        """A float elementwise op's expression on its operands' expressions ``args``,
        rounded to its element type where that changes anything (and ``rounded``)."""
        name = op.op_name.split(".", 1)[1]
        f = "f" if elem_of(op.operands[0]) != "f64" else ""
        one = "1.0f" if f else "1.0"
        zero = "0.0f" if f else "0.0"
        table = UNARY_F if len(args) == 1 else BINARY_F
        if name not in table:
            raise AccyError(f"no {('unary' if len(args) == 1 else 'binary')} '{name}' "
                            f"for floats")
        if self.cuda and name == "rsqrt":
            text = f"rsqrt{f}({args[0]})"
        elif self.cuda and f and name == "erfc":  # accy.target.cuda.erfc_helper
            half = self.half_demand(op.results[0])  # ... or erfc_half_helper
            text = f"accy_erfcf{'_half' if half else ''}({args[0]})"
        elif self.cuda and self.fast_math and f and name in ("exp", "log", "sin", "cos"):
            text = f"__{name}f({args[0]})"
        elif self.cuda and f and name in ("exp", "sigmoid") and \
                self.half_demand(op.results[0]):  # accy.target.cuda.exp_half_helper
            text = f"accy_{name}_half({args[0]})"
        else:
            text = table[name].format(*args, f=f, one=one, zero=zero)
        return self.rounded(op, text, rounded)

    def rounded(self, op: Operation, text: str, rounded: bool = True) -> str:
        """Float op ``op``'s expression ``text`` rounded to its element type where that
        changes anything (and ``rounded``)."""
        if self.picks_operand(op):
            return text  # picks or negates an operand already in its element type
        if not rounded or op.results[0] in self.stored_unrounded:
            return text  # the store (or a pack of two lanes) rounds it
        return round_compute(text, elem_of(op.results[0]))

    def row_quotient(self, op: Operation, idx: tuple[str, ...]) -> str | None:
        """How float division ``op`` at ``idx`` divides, where its divisor reads nothing
        the row's column loop changes (:attr:`column`) and so shares what
        :meth:`row_divisor` makes once a row: ``"half"`` where its quotient need only be
        right to a small fraction of a half ulp (:meth:`half_demand`: two products),
        ``"exact"`` where it must be correctly rounded (``accy.target.cuda.fdiv_helpers``,
        and only with :attr:`hoist_exact`), else None (IEEE division as it is). CUDA,
        f32 arithmetic, no fast math (whose division is approximate anyway)."""
        if not (self.cuda and self.hoist is not None and not self.fast_math
                and COMPUTE[elem_of(op.operands[0])] == "float"
                and self.column_free(op.operands[1], idx)):
            return None
        if self.half_demand(op.results[0]):
            return "half"
        return "exact" if self.hoist_exact else None

    def column_free(self, v: Value, idx: tuple[str, ...]) -> bool:
        """Whether ``v`` at ``idx`` reads nothing that depends on :attr:`column`."""
        if v in self.bound:
            return True
        if isinstance(v, BlockArgument):
            return not any(n != 1 and re.search(rf"\b{self.column}\b", ix)
                           for n, ix in zip(shape_of(v), idx))
        assert isinstance(v, OpResult)
        op = v.op
        name = op.op_name.split(".", 1)[1]
        if name in ("broadcast", "transpose"):
            return self.column_free(op.operands[0], self.operand_index(op, idx))
        if name == "constant":
            value = op.attr("value")
            return isinstance(value, DenseElementsAttr) and \
                (value.splat or value.type.num_elements == 1)
        if name in DATA_OPS or name in ("reduce", "matmul"):
            return False
        return all(self.column_free(o, idx) for o in op.operands)

    def row_divisor(self, d: Value, idx: tuple[str, ...], lane: int,
                    half: bool = False) -> tuple[str, ...]:
        """What the quotients by divisor ``d`` share, made once in :attr:`hoist` (before
        the column loop): ``accy_fdiv_by``'s last three arguments (``d``, its reciprocal
        and its short path's bound) for correctly rounded quotients, or (``half``) a
        power of two ``s`` and ``r = 1 / (d · s)``, the quotient then ``(a · s) · r``
        (``accy.target.cuda.hscale_helper``)."""
        assert self.hoist is not None
        key = (d, idx, half)
        if key not in self.divisors:
            b = self.expr(d, idx, self.hoist, lane)
            if half:
                s, r = self.fresh("hs"), self.fresh("hr")
                self.hoist.lines += [f"const float {s} = accy_hscale({b});",
                                     f"const float {r} = 1.0f / ({b} * {s});"]
                self.divisors[key] = (s, r)
            else:
                r, lo = self.fresh("rcp"), self.fresh("lo")
                self.hoist.lines += [f"const float {r} = accy_fdiv_rcp({b});",
                                     f"const float {lo} = accy_fdiv_lo({b});"]
                self.divisors[key] = (b, r, lo)
        return self.divisors[key]

    def picks_operand(self, op: Operation) -> bool:
        """Whether f16/bf16 float op ``op`` is one of :data:`EXACT_OPS` on operands
        that are already numbers of its type: its value needs no rounding."""
        el = elem_of(op.results[0])
        return op.op_name.split(".", 1)[1] in EXACT_OPS and el in ("f16", "bf16") and \
            all(self.representable(o, el) for o in op.operands)

    def half_demand(self, v: Value) -> bool:
        """Whether f32 ``v`` reaches the kernel's stores only through products,
        quotients, negations, broadcasts, row maxima and minima, and row sums of values
        that are never negative, ending in a cast to f16 or bf16: each passes its
        relative error through unchanged (a sum of terms ``a_i (1 + e_i)``, all ``a_i ≥
        0``, is its exact sum times ``1 + e`` with ``|e| ≤ max |e_i|``), so ``v`` need
        only be right to a small fraction of a half ulp (2^-8 bf16, 2^-11 f16), not to
        f32's. A sum of values of either sign can cancel, and does not pass it.

        A value of an f16 or bf16 op is rounded to its type before any use (its f32
        arithmetic is the op's own, :data:`COMPUTE`): it needs no more either."""
        if v not in self._half:
            self._half[v] = elem_of(v) in ("f16", "bf16") or (
                bool(v.uses) and all(self._half_use(v, op) for op, _ in v.uses))
        return self._half[v]

    def _half_use(self, v: Value, op: Operation) -> bool:
        """Whether use ``op`` of ``v`` passes :meth:`half_demand` on."""
        name = op.op_name.split(".", 1)[-1]
        if name == "cast":
            return elem_of(op.results[0]) in ("f16", "bf16")
        if name == "reduce":
            kind = op.attr("kind")
            assert isinstance(kind, StringAttr)
            if kind.value == "sum" and not self.non_negative(v):
                return False
        elif name not in ("mul", "div", "neg", "broadcast", "transpose"):
            return False  # any other use (the kernel's yield included) needs f32
        return self.half_demand(op.results[0])

    def non_negative(self, v: Value) -> bool:
        """Whether every value of ``v`` is at least zero or NaN, by its ops: ``exp``,
        ``abs``, ``sqrt``, ``sigmoid``, ``relu``, a square, sums, products, quotients and
        row reductions of such values, and constants.

        A NaN passes any sum unchanged, so it counts as neither sign here."""
        if not isinstance(v, OpResult):
            return False
        op = v.op
        name = op.op_name.split(".", 1)[-1]
        if name in ("exp", "abs", "sqrt", "sigmoid", "relu"):
            return True
        if name == "mul" and op.operands[0] is op.operands[1]:
            return True
        if name in ("mul", "div", "add", "min", "broadcast", "transpose", "reduce"):
            return all(self.non_negative(o) for o in op.operands)
        if name == "max":
            return any(self.non_negative(o) for o in op.operands)
        if name == "cast":
            return elem_of(op.operands[0]) in ("f32", "f16", "bf16", "f64") and \
                self.non_negative(op.operands[0])
        if name == "constant":
            value = op.attr("value")
            return isinstance(value, DenseElementsAttr) and \
                all(not float(x) < 0 for x in value.values)  # type: ignore[arg-type]
        return False

    def representable(self, v: Value, el: str) -> bool:
        """Whether every value of ``v`` is exactly an ``el`` (f16/bf16) number in its
        expression: a load of an ``el`` input, an op result rounded to ``el``
        (:func:`round_compute`), one of those broadcast, transposed or selected, or a
        constant whose values are ``el`` numbers. A value the kernel bound itself (a
        row statistic, an accumulator) is not known to be."""
        if v in self.bound or elem_of(v) != el:
            return False
        if isinstance(v, BlockArgument):
            return True
        assert isinstance(v, OpResult)
        name = v.op.op_name.split(".", 1)[1]
        if name in ("broadcast", "transpose"):
            return self.representable(v.op.operands[0], el)
        if name == "select":
            return all(self.representable(o, el) for o in v.op.operands[1:])
        if name == "constant":  # NaN counts: rounding keeps a NaN a NaN
            value = v.op.attr("value")
            return isinstance(value, DenseElementsAttr) and all(
                x != x or round_to_type(float(x), value.type.element) == x  # type: ignore[arg-type]
                for x in value.values)
        return name not in DATA_OPS and name not in ("reduce", "matmul", "cmp")

    def data_expr(self, op: Operation, idx: tuple[str, ...], scope: Scope, lane: int) -> str:
        """``prim.slice|concat|pad|gather|gather_elements`` at ``idx`` (lanes resolved:
        a remapped read is a scalar load). Every read is in bounds: an index that
        selects another operand, a pad, or a gathered index out of range is clamped,
        and the select picks the value."""
        name = op.op_name.split(".", 1)[1]
        spell = {"slice": self._slice, "gather": self._gather,
                 "gather_elements": self._gather, "concat": self._concat,
                 "pad": self._pad}[name]
        return spell(op, idx, scope, lane)

    def _slice(self, op: Operation, idx: tuple[str, ...], scope: Scope, lane: int) -> str:
        starts, steps = (_ints(op, k) for k in ("starts", "steps"))
        return self.expr(op.operands[0], tuple(
            _affine(i, sp, st) for i, st, sp in zip(idx, starts, steps)), scope, lane)

    def _gather(self, op: Operation, idx: tuple[str, ...], scope: Scope, lane: int) -> str:
        src = shape_of(op.operands[0])
        axis = _int(op, "axis") % len(src)
        ishape = shape_of(op.operands[1])
        if op.op_name.endswith(".gather"):
            at = idx[axis:axis + len(ishape)]
            rest = (idx[:axis], idx[axis + len(ishape):])
        else:
            at, rest = idx, (idx[:axis], idx[axis + 1:])
        raw = self.expr(op.operands[1], at, scope, lane)
        n = src[axis]
        k = self.fresh("ix")
        scope.lines.append(f"long long {k} = (long long)({raw});")
        scope.lines.append(f"{k} = {k} < 0 ? {k} + {n}LL : {k};")
        scope.lines.append(f"{k} = {_clamp(k, n)};")
        return self.expr(op.operands[0], rest[0] + (k,) + rest[1], scope, lane)

    def _concat(self, op: Operation, idx: tuple[str, ...], scope: Scope, lane: int) -> str:
        axis = _int(op, "axis") % len(shape_of(op.operands[0]))
        a = idx[axis]
        vals, bounds, off = [], [], 0
        for v in op.operands:
            n = shape_of(v)[axis]
            if n == 0:
                continue
            at = idx[:axis] + (_clamp(f"({a}) - {off}", n),) + idx[axis + 1:]
            vals.append(self.expr(v, at, scope, lane))
            off += n
            bounds.append(off)
        text = vals[-1]
        for val, bound in zip(reversed(vals[:-1]), reversed(bounds[:-1])):
            text = f"(({a}) < {bound} ? ({val}) : {text})"
        return text

    def _pad(self, op: Operation, idx: tuple[str, ...], scope: Scope, lane: int) -> str:
        src = shape_of(op.operands[0])
        low = _ints(op, "low")
        mode = op.attr("mode")
        mode_s = mode.value if isinstance(mode, StringAttr) else "constant"
        at_l: list[str] = []
        inside: list[str] = []
        for i, n, lo in zip(idx, src, low):
            j = f"({i}) - {lo}" if lo else i
            at_l.append(_pad_index(mode_s, j, n))
            if mode_s == "constant" and n == 0:
                inside.append("0")
            elif mode_s == "constant" and not (lo == 0 and i == "0"):
                inside.append(f"(({j}) >= 0 && ({j}) < {n})")
        if any(n == 0 for n in src):
            return self.expr(op.operands[1], (), scope, lane)
        val = self.expr(op.operands[0], tuple(at_l), scope, lane)
        if not inside:
            return val
        fill = self.expr(op.operands[1], (), scope, lane)
        return f"(({' && '.join(inside)}) ? ({val}) : ({fill}))"

    def cast(self, x: str, src: str, dst: str, rounded: bool = True) -> str:
        """``x`` (a ``src`` value) as a ``dst`` one; an f16/bf16 result not ``rounded``
        is left in float for a store that rounds it."""
        if src == dst:
            return x
        if dst == "i1":
            return f"((int)(({x}) != 0))"
        ct = COMPUTE[dst]
        keep = round_compute if rounded else (lambda v, _: v)
        if dst == "f16" and src == "f64":
            # through float rounded to odd: rounding twice to nearest could land on a tie
            return keep(f"accy_d2f_odd({x})", dst)
        if dst in ("f16", "bf16"):
            return keep(f"(float)({x})", dst)
        if src in ("f32", "f16", "bf16", "f64") and dst not in ("f32", "f64"):
            # float -> int: truncate, saturating, NaN -> 0 (the reference's rule)
            lo, hi = _int_range(dst)
            return (f"(({x}) != ({x}) ? ({ct})0 : (({x}) <= (double){lo} ? ({ct}){lo} : "
                    f"(({x}) >= (double){hi} ? ({ct}){hi} : ({ct})({x}))))")
        return round_compute(f"({ct})({x})", dst)

    def constant(self, op: Operation, idx: tuple[str, ...], lane: int) -> str:
        value = op.attr("value")
        assert isinstance(value, DenseElementsAttr)
        el = value.type.element.name
        if value.type.num_elements == 0:  # never read: the loop over it runs 0 times
            return f"(({COMPUTE[el]})0)"
        if value.splat or value.type.num_elements == 1:
            return literal(value.values[0], el)
        key = id(op)
        # CUDA's INFINITY/NAN are __int_as_float(...) calls, which a __device__ table's
        # initializer may not hold: a float table with one is stored as its bit patterns.
        as_bits = self.cuda and COMPUTE[el] in ("float", "double") and \
            not all(math.isfinite(float(v)) for v in value.values)
        if key not in self.table_of:
            name = f"{self.prefix}_const{len(self.table_of)}"
            ctype = COMPUTE[el]
            if as_bits:
                ctype, vals = _float_bits(value.values, COMPUTE[el])
            else:
                vals = ", ".join(literal(v, el) for v in value.values)
            qual = "__device__ const" if self.cuda else "static const"
            self.tables.append(f"{qual} {ctype} {name}[{len(value.values)}] = {{{vals}}};")
            self.table_of[key] = name
        read = f"{self.table_of[key]}[{self.offset(shape_of(op.results[0]), idx, lane)}]"
        if as_bits:
            return f"__uint_as_float({read})" if COMPUTE[el] == "float" else \
                f"__longlong_as_double((long long){read})"
        return read


def _float_bits(values: Sequence[object], ctype: str) -> tuple[str, str]:
    """A float table as (element type, initializer) of its IEEE bit patterns."""
    if ctype == "float":
        bits = [struct.unpack("<I", struct.pack("<f", float(v)))[0] for v in values]  # type: ignore[arg-type]
        return "unsigned int", ", ".join(f"0x{b:08x}u" for b in bits)
    bits = [struct.unpack("<Q", struct.pack("<d", float(v)))[0] for v in values]  # type: ignore[arg-type]
    return "unsigned long long", ", ".join(f"0x{b:016x}ULL" for b in bits)


def _ints(op: Operation, key: str) -> tuple[int, ...]:
    a = op.attr(key)
    assert isinstance(a, DenseArrayAttr), (op.op_name, key)
    return a.values


def _int(op: Operation, key: str) -> int:
    a = op.attr(key)
    assert isinstance(a, IntegerAttr), (op.op_name, key)
    return a.value


def _affine(i: str, scale: int, offset: int) -> str:
    """``offset + i·scale`` as a C index expression."""
    if i == "0":
        return str(offset)
    term = i if scale == 1 else f"({i})*{scale}" if scale != -1 else f"-({i})"
    return term if offset == 0 else f"({offset} + {term})"


def _pad_index(mode: str, j: str, n: int) -> str:
    """The source index a padded position ``j`` of a dim of ``n`` reads, per mode."""
    if mode in ("constant", "edge"):
        return _clamp(j, n)
    if mode == "wrap":
        return f"(((({j}) % {n}) + {n}) % {n})"
    p = 2 * (n - 1)  # reflect
    t = f"(((({j}) % {p}) + {p}) % {p})" if p else "0"
    return f"({t} >= {n} ? {p} - {t} : {t})" if p else "0"


def _clamp(j: str, n: int) -> str:
    """``j`` clamped into ``[0, n)`` (a read that stays in bounds whatever ``j`` is)."""
    if n <= 1:
        return "0"
    return f"(({j}) < 0 ? 0 : (({j}) > {n - 1} ? {n - 1} : ({j})))"


def _is_literal(text: str) -> bool:
    t = text.strip("()")
    try:
        if t.lstrip("-").startswith("0x"):
            float.fromhex(t.rstrip("f"))
        else:
            float(t.rstrip("fL").replace("LL", ""))
        return True
    except ValueError:
        return t in ("INFINITY", "-INFINITY", "NAN")


def _is_lane(text: str) -> bool:
    """A register or vector lane (``v3.x``, ``reg0[j].y``): no temporary needed."""
    import re

    return re.fullmatch(r"[A-Za-z_]\w*(\[j\])?(\[\d\])?(\.[xyzw])?", text) is not None


def _int_range(el: str) -> tuple[str, str]:
    return {"i8": ("-128", "127"), "i16": ("-32768", "32767"), "ui8": ("0", "255"),
            "ui16": ("0", "65535"), "ui32": ("0", "4294967295LL"),
            "ui64": ("0ULL", "18446744073709551615ULL"),
            "i32": ("-2147483648", "2147483647"),
            "i64": ("(-9223372036854775807LL - 1)", "9223372036854775807LL"),
            "index": ("(-9223372036854775807LL - 1)", "9223372036854775807LL")}[el]


def decompose(linear: str, shape: tuple[int, ...], prefix: str, ct: str = "long long") \
        -> tuple[list[str], tuple[str, ...]]:
    """Statements that split a row-major ``linear`` index over ``shape``; and the names."""
    lines: list[str] = []
    names: list[str] = []
    rest = linear
    for d in range(len(shape) - 1, -1, -1):
        n = f"{prefix}{d}"
        names.append(n)
        if d == 0:
            lines.append(f"const {ct} {n} = {rest};")
        else:
            lines.append(f"const {ct} {n} = ({rest}) % {shape[d]};")
            if d > 0:
                nxt = f"{prefix}q{d}"
                lines.append(f"const {ct} {nxt} = ({rest}) / {shape[d]};")
                rest = nxt
    return lines, tuple(reversed(names))


def combine(kind: str, a: str, b: str, ct: str, cuda: bool = False) -> str:
    """C for one step of a ``sum``/``max``/``min`` reduction in compute type ``ct``
    (``cuda``: a float max or min through ``accy.target.cuda.fminmax_helpers``)."""
    if kind == "sum":
        return f"({a} + {b})"
    if cuda and ct == "float":
        return f"accy_f{kind}f({a}, {b})"
    if ct in ("float", "double"):
        # NaN-propagating, like np.max / np.min (``b`` is read twice: pass a name)
        return BINARY_F[kind].format(a, b)
    return f"(({a}) > ({b}) ? ({a}) : ({b}))" if kind == "max" else \
        f"(({a}) < ({b}) ? ({a}) : ({b}))"


def reduce_init(kind: str, el: str) -> str:
    """The identity of a ``sum``/``max``/``min`` reduction over element type ``el``."""
    ct = COMPUTE[el]
    if ct in ("float", "double"):
        return REDUCE_INIT[kind] if ct == "float" else f"(double){REDUCE_INIT[kind]}"
    if el == "i1":  # false / true: an empty max is false, an empty min is true
        return {"sum": "0", "max": "0", "min": "1"}[kind]
    lo, hi = _int_range(el)
    return REDUCE_INIT_I[kind].format(lo=lo, hi=hi)


KERNEL_MARK = "// accy: a kernel from here to the next mark"
"""The line :func:`translation_unit` writes before each kernel's text."""


def translation_unit(head: list[str], kernels: list[Any],
                     emit: Callable[[Any], tuple[str, list[str]]]) -> str:
    """``head``, then every kernel's constant tables, then the kernels' text, each after a
    :data:`KERNEL_MARK` line: everything a kernel uses but its own text comes before the
    first mark, so each kernel compiles on its own after it (:func:`kernel_parts`)."""
    tables: list[str] = []
    texts = []
    for k in kernels:
        text, tabs = emit(k)
        tables.extend(tabs)
        texts.append(f"{KERNEL_MARK}\n{text}")
    return "\n".join([*head, *tables, *texts]) + "\n"


def kernel_parts(source: str) -> tuple[str, list[str]]:
    """A translation unit's shared head and its kernels' texts, split at the
    :data:`KERNEL_MARK` lines :func:`translation_unit` wrote: ``head + part`` compiles to
    that part's kernels alone, and ``head + "".join(parts) == source``. A unit without
    marks is all head.

    >>> head, parts = kernel_parts(f"h\\n{KERNEL_MARK}\\na\\n{KERNEL_MARK}\\nb\\n")
    >>> head, [p.split("\\n")[1] for p in parts]
    ('h\\n', ['a', 'b'])
    """
    mark = KERNEL_MARK + "\n"
    head, *rest = source.split("\n" + mark)
    if not rest:
        return source, []
    return head + "\n", [mark + part + "\n" for part in rest[:-1]] + [mark + rest[-1]]
