"""The ``prim`` dialect: the tensor stage's product (primitive tensor ops).

Upstream MLIR already registers a ``tensor`` dialect, so ours is ``prim``.
Every prim op has fully static tensor types, and the operands of an
elementwise op have exactly the result's shape: broadcasting is explicit
(``prim.broadcast``, stablehlo ``broadcast_in_dim`` semantics), reductions
run over the last axis only and keep it (``prim.reduce``), and ``prim.matmul``
takes operands with equal batch dims.

Each op class reuses :class:`accy.dialects.semantic.SemanticOp`'s helpers
(attribute readers, ``fail``); ``infer`` gives the one result type the
operands allow, and ``verify_`` demands that the declared type *equals* it.
Note that prim ops are therefore ``SemanticOp`` instances too: passes that
mean the semantic dialect only should test ``op.op_name``.

Example
-------
>>> from accy.choir.parser import parse_module
>>> from accy.choir.verifier import verify
>>> m = parse_module('''"builtin.module"() ({
...   "func.func"() <{function_type = (tensor<8x4xf32>, tensor<4xf32>) -> tensor<8x1xf32>, sym_name = "main"}> ({
...   ^bb0(%x: tensor<8x4xf32>, %b: tensor<4xf32>):
...     %0 = "prim.broadcast"(%b) {dims = array<i64: 1>} : (tensor<4xf32>) -> tensor<8x4xf32>
...     %1 = "prim.add"(%x, %0) : (tensor<8x4xf32>, tensor<8x4xf32>) -> tensor<8x4xf32>
...     %2 = "prim.reduce"(%1) {kind = "sum"} : (tensor<8x4xf32>) -> tensor<8x1xf32>
...     "func.return"(%2) : (tensor<8x1xf32>) -> ()
...   }) : () -> ()
... }) : () -> ()''')
>>> verify(m)
"""

from __future__ import annotations

from accy.choir.attributes import I1, DenseArrayAttr, TensorType, Type
from accy.choir.ir import OP_REGISTRY, OpResult, Value, declared_ops
from accy.dialects import semantic
from accy.dialects.semantic import PREDICATES, SemanticOp


class PrimOp(SemanticOp):
    """Base of every prim op: static tensor types, declared type == inferred type."""

    def static_operand(self, i: int) -> TensorType:
        t = self.tensor_operand(i)
        if not t.is_static:
            raise self.fail(f"operand {i} must have a static type, got {t}")
        return t

    def verify_(self) -> None:
        for i in range(len(self.operands)):
            self.static_operand(i)
        declared = self.declared
        if not declared.is_static:
            raise self.fail(f"result must have a static type, got {declared}")
        inferred = self.infer()
        if declared != inferred:
            raise self.fail(f"result type {declared} differs from the expected {inferred}")


# ------------------------------------------------------------------- elementwise


class PrimUnaryOp(PrimOp):
    """One operand of the result's type."""

    num_operands = 1
    traits = frozenset({"pure", "elementwise"})

    @property
    def float_only(self) -> bool:
        """Whether it needs floating-point operands: as its semantic twin declares."""
        twin = OP_REGISTRY.get("semantic." + self.op_name.split(".", 1)[1])
        return bool(getattr(twin, "float_only", True))

    def infer(self) -> Type:
        t = self.tensor_operand(0)
        if self.float_only and not t.element.is_float:
            raise self.fail(f"needs a floating-point operand, got {t}")
        return t


class PrimBinaryOp(PrimOp):
    """Two operands of the result's type (broadcasts are explicit before)."""

    num_operands = 2
    traits = frozenset({"pure", "elementwise"})

    def infer(self) -> Type:
        a, b = self.tensor_operand(0), self.tensor_operand(1)
        if a != b:
            raise self.fail(f"operands must have one type (broadcast explicitly), got {a} "
                            f"and {b}")
        return self.result_of(a)

    def result_of(self, t: TensorType) -> TensorType:
        return t


class NegOp(PrimUnaryOp):
    name = "prim.neg"


class AbsOp(PrimUnaryOp):
    name = "prim.abs"


class ExpOp(PrimUnaryOp):
    name = "prim.exp"


class LogOp(PrimUnaryOp):
    name = "prim.log"


class SqrtOp(PrimUnaryOp):
    name = "prim.sqrt"


class RsqrtOp(PrimUnaryOp):
    name = "prim.rsqrt"


class TanhOp(PrimUnaryOp):
    name = "prim.tanh"


class SigmoidOp(PrimUnaryOp):
    name = "prim.sigmoid"


class ReluOp(PrimUnaryOp):
    name = "prim.relu"


class ErfOp(PrimUnaryOp):
    name = "prim.erf"


class ErfcOp(PrimUnaryOp):
    name = "prim.erfc"


class SinOp(PrimUnaryOp):
    name = "prim.sin"


class CosOp(PrimUnaryOp):
    name = "prim.cos"


class ReciprocalOp(PrimUnaryOp):
    name = "prim.reciprocal"


class FloorOp(PrimUnaryOp):
    name = "prim.floor"


class AddOp(PrimBinaryOp):
    name = "prim.add"
    traits = frozenset({"pure", "elementwise", "commutative"})


class SubOp(PrimBinaryOp):
    name = "prim.sub"


class MulOp(PrimBinaryOp):
    name = "prim.mul"
    traits = frozenset({"pure", "elementwise", "commutative"})


class DivOp(PrimBinaryOp):
    name = "prim.div"


class MaxOp(PrimBinaryOp):
    name = "prim.max"
    traits = frozenset({"pure", "elementwise", "commutative"})


class MinOp(PrimBinaryOp):
    name = "prim.min"
    traits = frozenset({"pure", "elementwise", "commutative"})


class PowOp(PrimBinaryOp):
    name = "prim.pow"


class CmpOp(PrimBinaryOp):
    """``prim.cmp {predicate}``: two operands of one type → i1 of the same shape."""

    name = "prim.cmp"

    def result_of(self, t: TensorType) -> TensorType:
        self.str_attr("predicate", PREDICATES)
        return t.with_element(I1)


class SelectOp(PrimOp):
    """``prim.select``: i1 condition, two branches, all of the result's shape."""

    name = "prim.select"
    num_operands = 3
    traits = frozenset({"pure", "elementwise"})

    def infer(self) -> Type:
        c, a, b = (self.tensor_operand(i) for i in range(3))
        if c.element != I1:
            raise self.fail(f"condition must be an i1 tensor, got {c}")
        if a != b or c.shape != a.shape:
            raise self.fail(f"operands must have one shape and the branches one type, got "
                            f"{c}, {a} and {b}")
        return a


class CastOp(PrimOp, semantic.CastOp):
    """``prim.cast``: same shape, element type from the result."""

    name = "prim.cast"


class ConstantOp(PrimOp, semantic.ConstantOp):
    """``prim.constant {value = dense<…>}``."""

    name = "prim.constant"


# ------------------------------------------------------------ layout, reductions


class BroadcastOp(PrimOp):
    """``prim.broadcast {dims}``: operand dim ``i`` goes to result dim ``dims[i]``.

    ``dims`` is strictly increasing; each operand dim equals its result dim or is 1.
    """

    name = "prim.broadcast"
    num_operands = 1

    def dims(self) -> tuple[int, ...]:
        a = self.attr("dims")
        if not isinstance(a, DenseArrayAttr):
            raise self.fail("needs 'dims = array<i64: …>'")
        return a.values

    def infer(self) -> Type:
        src, dst = self.tensor_operand(0), self.declared
        dims = self.dims()
        if src.element != dst.element:
            raise self.fail(f"cannot change the element type ({src} to {dst})")
        if len(dims) != src.rank:
            raise self.fail(f"needs one dim per operand dimension ({src.rank}), got "
                            f"{list(dims)}")
        if any(not 0 <= d < dst.rank for d in dims) or list(dims) != sorted(set(dims)):
            raise self.fail(f"dims {list(dims)} must be strictly increasing and below the "
                            f"result rank {dst.rank}")
        for i, d in enumerate(dims):
            if src.shape[i] not in (1, dst.shape[d]):
                raise self.fail(f"operand dim {i} ({src.shape[i]}) does not broadcast to result "
                                f"dim {d} ({dst.shape[d]})")
        return dst


REDUCE_KINDS = ("sum", "max", "min")


class ReduceOp(PrimOp):
    """``prim.reduce {kind}``: over the last axis, keeping it: ``[…, C]`` → ``[…, 1]``."""

    name = "prim.reduce"
    num_operands = 1

    @property
    def kind(self) -> str:
        return self.str_attr("kind", REDUCE_KINDS)

    def infer(self) -> Type:
        t = self.tensor_operand(0)
        self.kind  # noqa: B018  (checks the attribute)
        if t.rank < 1:
            raise self.fail(f"needs an operand of rank >= 1, got {t}")
        return t.with_shape(t.shape[:-1] + (1,))


class MatmulOp(PrimOp):
    """``prim.matmul``: ``[B…, M, K] × [B…, K, N] → [B…, M, N]``, batch dims equal."""

    name = "prim.matmul"
    num_operands = 2

    def infer(self) -> Type:
        a, b = self.tensor_operand(0), self.tensor_operand(1)
        if a.rank < 2 or a.rank != b.rank:
            raise self.fail(f"needs operands of one rank >= 2, got {a} and {b}")
        if a.element != b.element:
            raise self.fail(f"operands have different element types: {a} and {b}")
        if a.shape[:-2] != b.shape[:-2]:
            raise self.fail(f"batch dims differ (broadcast explicitly): {a} and {b}")
        if a.shape[-1] != b.shape[-2]:
            raise self.fail(f"contraction dims differ: {a} and {b}")
        return a.with_shape(a.shape[:-1] + (b.shape[-1],))


class TransposeOp(PrimOp):
    """``prim.transpose {permutation}``: result dim ``i`` is operand dim ``permutation[i]``."""

    name = "prim.transpose"
    num_operands = 1

    def permutation(self) -> tuple[int, ...]:
        t = self.tensor_operand(0)
        a = self.attr("permutation")
        if not isinstance(a, DenseArrayAttr) or sorted(a.values) != list(range(t.rank)):
            raise self.fail(f"needs 'permutation = array<i64: …>', a permutation of rank "
                            f"{t.rank}")
        return a.values

    def infer(self) -> Type:
        t = self.tensor_operand(0)
        return t.with_shape(tuple(t.shape[p] for p in self.permutation()))


class ReshapeOp(PrimOp):
    """``prim.reshape``: same element type and count, row-major."""

    name = "prim.reshape"
    num_operands = 1

    def infer(self) -> Type:
        src, dst = self.tensor_operand(0), self.declared
        if src.element != dst.element or (
                src.is_static and dst.is_static and src.num_elements != dst.num_elements):
            raise self.fail(f"cannot reshape {src} to {dst}")
        return dst


RESHAPES = frozenset({ReshapeOp.name, semantic.ReshapeOp.name})


def view_source(v: Value) -> Value:
    """``v`` through every reshape that makes it (``prim.reshape``, or
    ``semantic.reshape`` before lowering): the value whose buffer ``v`` is a view of (a
    reshape never moves an element; the layout is row-major)."""
    while isinstance(v, OpResult) and v.op.op_name in RESHAPES:
        v = v.op.operands[0]
    return v


class SliceOp(PrimOp, semantic.SliceOp):
    """``prim.slice {starts, sizes, steps}``: an index map (see the semantic op)."""

    name = "prim.slice"


class ConcatOp(PrimOp, semantic.ConcatOp):
    """``prim.concat {axis}``: each element read from the operand whose range holds it."""

    name = "prim.concat"


class PadOp(PrimOp, semantic.PadOp):
    """``prim.pad(x, value) {low, high, mode}``: an index map with a fill value."""

    name = "prim.pad"


class GatherOp(PrimOp, semantic.GatherOp):
    """``prim.gather {axis}``: the data read at an index loaded from ``indices``."""

    name = "prim.gather"


class GatherElementsOp(PrimOp, semantic.GatherElementsOp):
    """``prim.gather_elements {axis}``: ``take_along_axis`` as an index map."""

    name = "prim.gather_elements"


DATA_OPS = declared_ops("prim", semantic.DataOp)
"""Index-remapping ops with a semantic twin: never launches of their own (dispatch)."""


def broadcast_dims(operand_rank: int, result_rank: int) -> tuple[int, ...]:
    """The ``dims`` of a NumPy-style (trailing-aligned) broadcast.

    Example
    -------
    >>> broadcast_dims(1, 3)
    (2,)
    """
    return tuple(range(result_rank - operand_rank, result_rank))


UNARY_OPS = declared_ops("prim", PrimUnaryOp)
BINARY_OPS = tuple(n for n in declared_ops("prim", PrimBinaryOp) if n != "cmp")
PRIM_OPS = tuple(f"prim.{n}" for n in declared_ops("prim"))
"""Every op name of the prim dialect."""
ELEMENTWISE_OPS = frozenset(f"prim.{n}" for n in declared_ops("prim", trait="elementwise"))
"""The prim ops that compute each element from the same element of their operands."""
