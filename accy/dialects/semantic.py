"""The ``semantic`` dialect: the input language of accy (SEMANTIC.md).

Every op declares how its result type follows from its operands
(``infer``); ``verify_`` checks that the declared result type agrees with
the inferred one (``?`` dims are allowed on either side until a variant binds
them). The contract stage's shape specialization uses the same ``infer`` to
refine every ``?``.

Example
-------
>>> from accy.choir.parser import parse_module
>>> from accy.choir.verifier import verify
>>> m = parse_module('''"builtin.module"() ({
...   "func.func"() <{function_type = (tensor<?x4xf32>) -> tensor<?x4xf32>, sym_name = "main"}> ({
...   ^bb0(%x: tensor<?x4xf32>):
...     %0 = "semantic.exp"(%x) : (tensor<?x4xf32>) -> tensor<?x4xf32>
...     "func.return"(%0) : (tensor<?x4xf32>) -> ()
...   }) : () -> ()
... }) : () -> ()''')
>>> verify(m)
"""

from __future__ import annotations

from typing import ClassVar

from accy.choir.attributes import (
    I1,
    BoolAttr,
    DenseArrayAttr,
    DenseElementsAttr,
    FloatAttr,
    IntegerAttr,
    StringAttr,
    TensorType,
    Type,
)
from accy.choir.ir import Operation, declared_ops
from accy.dialects.shapes import (
    ShapeError,
    broadcast_shapes,
    can_broadcast_to,
    merge_types,
    normalize_axis,
)
from accy.errors import VerifyError


def _fmt(t: Type) -> str:
    return str(t)


class SemanticOp(Operation):
    """Base of every semantic op: tensor operands, one result, inferred type."""

    num_results: ClassVar[int | None] = 1
    traits = frozenset({"pure"})

    def tensor_operand(self, i: int) -> TensorType:
        t = self.operands[i].type
        if not isinstance(t, TensorType):
            raise VerifyError(f"operand {i} of '{self.op_name}' must be a tensor, got {t}",
                              self.loc)
        return t

    @property
    def declared(self) -> TensorType:
        t = self.results[0].type
        if not isinstance(t, TensorType):
            raise VerifyError(f"result of '{self.op_name}' must be a tensor, got {t}", self.loc)
        return t

    def infer(self) -> Type:
        """The result type implied by the operands and attributes."""
        raise NotImplementedError

    def fail(self, message: str) -> VerifyError:
        return VerifyError(f"'{self.op_name}' {message}", self.loc)

    def verify_(self) -> None:
        declared = self.declared
        inferred = self.infer()
        if merge_types(declared, inferred) is None:
            raise self.fail(f"result type {declared} disagrees with the inferred type {inferred}")

    # attribute helpers
    def int_attr(self, key: str, default: int | None = None) -> int:
        a = self.attr(key)
        if a is None and default is not None:
            return default
        if not isinstance(a, IntegerAttr):
            raise self.fail(f"needs an integer attribute '{key}'")
        return a.value

    def str_attr(self, key: str, choices: tuple[str, ...], default: str | None = None) -> str:
        a = self.attr(key)
        if a is None and default is not None:
            return default
        if not isinstance(a, StringAttr) or a.value not in choices:
            raise self.fail(f"attribute '{key}' must be one of "
                            f"{', '.join(repr(c) for c in choices)}")
        return a.value

    def bool_attr(self, key: str, default: bool) -> bool:
        a = self.attr(key)
        if a is None:
            return default
        if not isinstance(a, BoolAttr):
            raise self.fail(f"attribute '{key}' must be true or false")
        return a.value

    def float_attr(self, key: str, default: float) -> float:
        a = self.attr(key)
        if a is None:
            return default
        if not isinstance(a, FloatAttr):
            raise self.fail(f"attribute '{key}' must be a float (e.g. 1.0e-05 : f32)")
        return a.value

    def axes_attr(self, key: str, rank: int) -> tuple[int, ...]:
        a = self.attr(key)
        if not isinstance(a, DenseArrayAttr):
            raise self.fail(f"needs '{key} = array<i64: …>'")
        out = []
        for ax in a.values:
            n = normalize_axis(ax, rank)
            if n is None:
                raise self.fail(f"axis {ax} is out of range for rank {rank}")
            if n in out:
                raise self.fail(f"axis {ax} appears twice in '{key}'")
            out.append(n)
        return tuple(out)

    def axis_attr(self, rank: int) -> int:
        ax = self.int_attr("axis")
        n = normalize_axis(ax, rank)
        if n is None:
            raise self.fail(f"axis {ax} is out of range for rank {rank}")
        return n


# ------------------------------------------------------------------- elementwise


class UnaryOp(SemanticOp):
    num_operands = 1
    traits = frozenset({"pure", "elementwise"})
    float_only: ClassVar[bool] = True

    def infer(self) -> Type:
        t = self.tensor_operand(0)
        if self.float_only and not t.element.is_float:
            raise self.fail(f"needs a floating-point operand, got {t}")
        return t


class NegOp(UnaryOp):
    name = "semantic.neg"
    float_only = False


class AbsOp(UnaryOp):
    name = "semantic.abs"
    float_only = False


class ReluOp(UnaryOp):
    name = "semantic.relu"
    float_only = False


class ExpOp(UnaryOp):
    name = "semantic.exp"


class LogOp(UnaryOp):
    name = "semantic.log"


class SqrtOp(UnaryOp):
    name = "semantic.sqrt"


class RsqrtOp(UnaryOp):
    name = "semantic.rsqrt"


class TanhOp(UnaryOp):
    name = "semantic.tanh"


class SigmoidOp(UnaryOp):
    name = "semantic.sigmoid"


class ErfOp(UnaryOp):
    name = "semantic.erf"


class ErfcOp(UnaryOp):
    """``1 - erf(x)``, accurate where that difference cancels (x ≫ 0): gelu's tail."""

    name = "semantic.erfc"


class SinOp(UnaryOp):
    name = "semantic.sin"


class CosOp(UnaryOp):
    name = "semantic.cos"


class ReciprocalOp(UnaryOp):
    name = "semantic.reciprocal"


class FloorOp(UnaryOp):
    name = "semantic.floor"


class GeluOp(UnaryOp):
    name = "semantic.gelu"

    def infer(self) -> Type:
        self.str_attr("approximate", ("none", "tanh"), default="none")
        return super().infer()


class BinaryOp(SemanticOp):
    num_operands = 2
    traits = frozenset({"pure", "elementwise"})

    def infer(self) -> Type:
        a, b = self.tensor_operand(0), self.tensor_operand(1)
        if a.element != b.element:
            raise self.fail(f"operands have different element types: {a} and {b} "
                            f"(insert a 'semantic.cast')")
        try:
            shape = broadcast_shapes(a.shape, b.shape)
        except ShapeError:
            raise self.fail(f"operands do not broadcast: {a} and {b}") from None
        return self.result_element(TensorType(shape, a.element))

    def result_element(self, t: TensorType) -> TensorType:
        return t


class AddOp(BinaryOp):
    name = "semantic.add"
    traits = frozenset({"pure", "elementwise", "commutative"})


class SubOp(BinaryOp):
    name = "semantic.sub"


class MulOp(BinaryOp):
    name = "semantic.mul"
    traits = frozenset({"pure", "elementwise", "commutative"})


class DivOp(BinaryOp):
    name = "semantic.div"


class MaxOp(BinaryOp):
    name = "semantic.max"
    traits = frozenset({"pure", "elementwise", "commutative"})


class MinOp(BinaryOp):
    name = "semantic.min"
    traits = frozenset({"pure", "elementwise", "commutative"})


class PowOp(BinaryOp):
    name = "semantic.pow"


PREDICATES = ("lt", "le", "gt", "ge", "eq", "ne")


class CmpOp(BinaryOp):
    name = "semantic.cmp"

    def result_element(self, t: TensorType) -> TensorType:
        self.str_attr("predicate", PREDICATES)
        return t.with_element(I1)


class SelectOp(SemanticOp):
    name = "semantic.select"
    num_operands = 3
    traits = frozenset({"pure", "elementwise"})

    def infer(self) -> Type:
        c, a, b = (self.tensor_operand(i) for i in range(3))
        if c.element != I1:
            raise self.fail(f"condition must be an i1 tensor, got {c}")
        if a.element != b.element:
            raise self.fail(f"branches have different element types: {a} and {b}")
        try:
            shape = broadcast_shapes(c.shape, a.shape, b.shape)
        except ShapeError:
            raise self.fail(f"operands do not broadcast: {c}, {a} and {b}") from None
        return TensorType(shape, a.element)


class CastOp(SemanticOp):
    name = "semantic.cast"
    num_operands = 1
    traits = frozenset({"pure", "elementwise"})

    def infer(self) -> Type:
        return self.tensor_operand(0).with_element(self.declared.element)


class ConstantOp(SemanticOp):
    name = "semantic.constant"
    num_operands = 0

    @property
    def value(self) -> DenseElementsAttr:
        a = self.attr("value")
        if not isinstance(a, DenseElementsAttr):
            raise self.fail("needs a 'value = dense<…> : tensor<…>' attribute")
        return a

    def infer(self) -> Type:
        return self.value.type


# -------------------------------------------------------------------- reductions


class ReduceOp(SemanticOp):
    num_operands = 1
    kind: ClassVar[str] = ""

    def reduced(self) -> tuple[tuple[int, ...], bool]:
        t = self.tensor_operand(0)
        return self.axes_attr("axes", t.rank), self.bool_attr("keepdims", False)

    def infer(self) -> Type:
        t = self.tensor_operand(0)
        axes, keep = self.reduced()
        if keep:
            shape = tuple(1 if i in axes else d for i, d in enumerate(t.shape))
        else:
            shape = tuple(d for i, d in enumerate(t.shape) if i not in axes)
        return t.with_shape(shape)


class ReduceSumOp(ReduceOp):
    name = "semantic.reduce_sum"
    kind = "sum"


class ReduceMaxOp(ReduceOp):
    name = "semantic.reduce_max"
    kind = "max"


class ReduceMinOp(ReduceOp):
    name = "semantic.reduce_min"
    kind = "min"


class ReduceMeanOp(ReduceOp):
    name = "semantic.reduce_mean"
    kind = "mean"

    def infer(self) -> Type:
        if not self.tensor_operand(0).element.is_float:
            raise self.fail(f"of an integer tensor is an error ({self.tensor_operand(0)})")
        return super().infer()


# ------------------------------------------------------------------------ layout


class ReshapeOp(SemanticOp):
    name = "semantic.reshape"
    num_operands = 1

    def infer(self) -> Type:
        src, dst = self.tensor_operand(0), self.declared
        if src.element != dst.element:
            raise self.fail(f"cannot change the element type ({src} to {dst})")
        if src.is_static and dst.is_static and src.num_elements != dst.num_elements:
            raise self.fail(f"changes the element count: {src} has {src.num_elements}, "
                            f"{dst} has {dst.num_elements}")
        if src.is_static and sum(d is None for d in dst.shape) == 1:
            known = 1
            for d in dst.shape:
                known *= d if d is not None else 1
            if known == 0 or src.num_elements % known:
                raise self.fail(f"cannot reshape {src} to {dst}")
            return dst.with_shape(tuple(src.num_elements // known if d is None else d
                                        for d in dst.shape))
        return dst


class TransposeOp(SemanticOp):
    name = "semantic.transpose"
    num_operands = 1

    def permutation(self) -> tuple[int, ...]:
        t = self.tensor_operand(0)
        a = self.attr("permutation")
        if not isinstance(a, DenseArrayAttr):
            raise self.fail("needs 'permutation = array<i64: …>'")
        if sorted(a.values) != list(range(t.rank)):
            raise self.fail(f"permutation {list(a.values)} is not a permutation of "
                            f"rank {t.rank}")
        return a.values

    def infer(self) -> Type:
        t = self.tensor_operand(0)
        return t.with_shape(tuple(t.shape[p] for p in self.permutation()))


class BroadcastToOp(SemanticOp):
    name = "semantic.broadcast_to"
    num_operands = 1

    def infer(self) -> Type:
        src, dst = self.tensor_operand(0), self.declared
        if src.element != dst.element:
            raise self.fail(f"cannot change the element type ({src} to {dst})")
        if not can_broadcast_to(src.shape, dst.shape):
            raise self.fail(f"cannot broadcast {src} to {dst}")
        pad = dst.rank - src.rank
        dims = tuple(s if (d is None and s not in (1, None)) else d
                     for s, d in zip((1,) * pad + src.shape, dst.shape))
        return dst.with_shape(dims)


class MatmulOp(SemanticOp):
    name = "semantic.matmul"
    num_operands = 2

    def infer(self) -> Type:
        a, b = self.tensor_operand(0), self.tensor_operand(1)
        if a.rank < 2 or b.rank < 2:
            raise self.fail(f"needs operands of rank >= 2, got {a} and {b}")
        if a.element != b.element:
            raise self.fail(f"operands have different element types: {a} and {b}")
        m, k1 = a.shape[-2:]
        k2, n = b.shape[-2:]
        if k1 is not None and k2 is not None and k1 != k2:
            raise self.fail(f"contraction dims differ: {a} and {b} ({k1} vs {k2})")
        try:
            batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
        except ShapeError:
            raise self.fail(f"batch dims do not broadcast: {a} and {b}") from None
        return TensorType(batch + (m, n), a.element)


# ----------------------------------------------------------------- data movement


def _ints(op: SemanticOp, key: str, rank: int) -> tuple[int, ...]:
    a = op.attr(key)
    if not isinstance(a, DenseArrayAttr) or len(a.values) != rank:
        raise op.fail(f"needs '{key} = array<i64: …>' with one value per dim ({rank})")
    return a.values


class DataOp(SemanticOp):
    """Base of the data-movement ops: each result element is an operand element read
    at a remapped (or loaded) index — index maps inside a dispatch region, never a
    launch of their own."""

    traits = frozenset({"pure", "index_map"})


class SliceOp(DataOp):
    """``slice {starts, sizes, steps}``: ``y[i] = x[starts + i·steps]`` per dim.

    ``steps`` may be negative (a reversed slice); every element read must be in
    bounds (checked once the input's dims are known).
    """

    name = "semantic.slice"
    num_operands = 1

    def infer(self) -> Type:
        t = self.tensor_operand(0)
        starts, sizes, steps = (_ints(self, k, t.rank) for k in ("starts", "sizes", "steps"))
        for d, (n, st, sz, sp) in enumerate(zip(t.shape, starts, sizes, steps)):
            if sz < 0 or sp == 0:
                raise self.fail(f"dim {d}: size {sz} must be >= 0 and step {sp} nonzero")
            last = st + (sz - 1) * sp
            if sz and (st < 0 or last < 0 or (n is not None and max(st, last) >= n)):
                raise self.fail(f"dim {d}: reads {st}…{last} (step {sp}), outside "
                                f"{t} ")
        return t.with_shape(sizes)


class ConcatOp(DataOp):
    """``concat {axis}``: operands joined along ``axis``; every other dim equal."""

    name = "semantic.concat"
    num_operands = None

    def infer(self) -> Type:
        if not self.operands:
            raise self.fail("needs at least one operand")
        ts = [self.tensor_operand(i) for i in range(len(self.operands))]
        first = ts[0]
        axis = self.axis_attr(first.rank)
        total: int | None = 0
        dims = list(first.shape)
        for t in ts:
            if t.element != first.element or t.rank != first.rank:
                raise self.fail(f"operands differ in element type or rank: {first} and {t}")
            for d, (a, b) in enumerate(zip(dims, t.shape)):
                if d == axis:
                    continue
                if a is not None and b is not None and a != b:
                    raise self.fail(f"operands differ in dim {d}: {first} and {t}")
                dims[d] = a if a is not None else b
            n = t.shape[axis]
            total = None if total is None or n is None else total + n
        dims[axis] = total
        return first.with_shape(tuple(dims))


PAD_MODES = ("constant", "edge", "reflect", "wrap")


class PadOp(DataOp):
    """``pad(x, value) {low, high, mode}``: ``low[d]``/``high[d]`` elements before/after
    dim ``d`` (negative: cropped), filled with the rank-0 ``value`` (``constant``), the
    edge element (``edge``), a mirror without the edge (``reflect``) or the other end
    (``wrap``)."""

    name = "semantic.pad"
    num_operands = 2

    def infer(self) -> Type:
        t, v = self.tensor_operand(0), self.tensor_operand(1)
        if v.rank != 0 or v.element != t.element:
            raise self.fail(f"value must be a rank-0 tensor of {t.element}, got {v}")
        mode = self.str_attr("mode", PAD_MODES, default="constant")
        low, high = _ints(self, "low", t.rank), _ints(self, "high", t.rank)
        dims: list[int | None] = []
        for d, (n, lo, hi) in enumerate(zip(t.shape, low, high)):
            m = None if n is None else n + lo + hi
            if m is not None and m < 0:
                raise self.fail(f"dim {d}: pads {lo}, {hi} leave {m} elements of {n}")
            if n is not None and m and mode != "constant" and (
                    n == 0 or min(lo, hi) < -n or (mode == "reflect" and max(lo, hi) >= n
                                                   and n > 1)):
                raise self.fail(f"dim {d}: '{mode}' pads {lo}, {hi} do not fit {n} elements")
            dims.append(m)
        return t.with_shape(tuple(dims))


class GatherOp(DataOp):
    """``gather(data, indices) {axis}``: ``np.take(data, indices, axis)``; a negative
    index counts from the end, an index out of range is clamped."""

    name = "semantic.gather"
    num_operands = 2

    def infer(self) -> Type:
        d, i = self.tensor_operand(0), self.tensor_operand(1)
        if not i.element.is_int or i.element == I1:
            raise self.fail(f"indices must be an integer tensor, got {i}")
        axis = self.axis_attr(d.rank)
        return d.with_shape(d.shape[:axis] + i.shape + d.shape[axis + 1:])


class GatherElementsOp(DataOp):
    """``gather_elements(data, indices) {axis}``: ``np.take_along_axis``; indices of
    the data's rank, negative from the end, out of range clamped."""

    name = "semantic.gather_elements"
    num_operands = 2

    def infer(self) -> Type:
        d, i = self.tensor_operand(0), self.tensor_operand(1)
        if not i.element.is_int or i.element == I1:
            raise self.fail(f"indices must be an integer tensor, got {i}")
        if i.rank != d.rank:
            raise self.fail(f"indices must have the data's rank, got {d} and {i}")
        axis = self.axis_attr(d.rank)
        for k, (a, b) in enumerate(zip(d.shape, i.shape)):
            if k != axis and a is not None and b is not None and b > a:
                raise self.fail(f"indices dim {k} ({b}) exceeds the data's ({a})")
        return d.with_shape(i.shape)


# -------------------------------------------------------------------- composites


class SoftmaxOp(SemanticOp):
    name = "semantic.softmax"
    num_operands = 1

    def infer(self) -> Type:
        t = self.tensor_operand(0)
        if not t.element.is_float:
            raise self.fail(f"needs a floating-point operand, got {t}")
        self.axis_attr(t.rank)
        return t


class NormOp(SemanticOp):
    """layernorm / rmsnorm: normalize over ``axis`` … last, scale (and shift)."""

    def infer(self) -> Type:
        x = self.tensor_operand(0)
        if not x.element.is_float:
            raise self.fail(f"needs a floating-point operand, got {x}")
        axis = self.axis_attr(x.rank)
        eps = self.float_attr("epsilon", 1e-5)
        if eps < 0:
            raise self.fail(f"epsilon must be >= 0, got {eps}")
        norm_shape = x.shape[axis:]
        for i in range(1, len(self.operands)):
            p = self.tensor_operand(i)
            if p.element != x.element:
                raise self.fail(f"operand {i} has element type {p.element}, x has {x.element}")
            if p.rank != len(norm_shape) or merge_types(p, x.with_shape(norm_shape)) is None:
                raise self.fail(f"operand {i} must have shape {list(norm_shape)} "
                                f"(x.shape[axis:]), got {p}")
        return x


class LayernormOp(NormOp):
    name = "semantic.layernorm"
    num_operands = 3


class RmsnormOp(NormOp):
    name = "semantic.rmsnorm"
    num_operands = 2


UNARY_OPS = declared_ops("semantic", UnaryOp)
BINARY_OPS = tuple(n for n in declared_ops("semantic", BinaryOp) if n != "cmp")
"""The arithmetic binary ops (``cmp`` takes a predicate and makes ``i1``)."""
REDUCE_OPS = declared_ops("semantic", ReduceOp)
ALL_OPS = declared_ops("semantic")
"""Every op of the dialect, in declaration order (read off the declarations above)."""
