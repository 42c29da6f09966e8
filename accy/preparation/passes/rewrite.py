"""Small rewriting helpers shared by the contract and tensor passes.

:class:`Builder` inserts new ops before an anchor op, at the anchor's
location (so errors about generated ops still point at the source line), and
infers the result type of semantic ops it creates.

Example
-------
>>> from accy.choir.attributes import TensorType, F32
>>> from accy.choir.builtin import FuncOp, ReturnOp
>>> t = TensorType((4,), F32)
>>> f = FuncOp.build("main", [t], [t])
>>> ret = f.body.append(ReturnOp([f.body.args[0]]))
>>> b = Builder(ret)
>>> y = b.op("semantic.mul", [f.body.args[0], b.constant(2.0, F32)])
>>> str(y.type), [op.op_name for op in f.body.ops]
('tensor<4xf32>', ['semantic.constant', 'semantic.mul', 'func.return'])
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from accy.choir.attributes import (
    Attribute,
    DenseArrayAttr,
    DenseElementsAttr,
    ScalarType,
    TensorType,
    Type,
)
from accy.choir.ir import Block, Operation, OpResult, Value
from accy.choir.passes import Pass, PassContext
from accy.dialects.semantic import ReduceOp, SemanticOp


class Builder:
    """Creates ops right before ``anchor``, with ``anchor``'s location."""

    def __init__(self, anchor: Operation) -> None:
        assert anchor.parent is not None, "the anchor must be in a block"
        self.anchor = anchor
        self.block: Block = anchor.parent

    def op(self, name: str, operands: Sequence[Value], result_type: Type | None = None,
           attributes: dict[str, Attribute] | None = None) -> Value:
        """Insert ``name(operands)``; the result type is inferred when not given."""
        placeholder = result_type if result_type is not None else operands[0].type
        op = Operation.create(name, operands, [placeholder], attributes, loc=self.anchor.loc)
        if result_type is None:
            assert isinstance(op, SemanticOp), f"cannot infer the type of {name}"
            op.results[0].type = op.infer()
        self.block.insert_before(self.anchor, op)
        return op.result

    def constant(self, value: float, element: ScalarType, shape: tuple[int, ...] = (),
                 dialect: str = "semantic") -> Value:
        """A splat constant (rank 0 by default, relying on broadcasting)."""
        t = TensorType(shape, element)
        attr = DenseElementsAttr(t, (value,), splat=bool(shape))
        return self.op(f"{dialect}.constant", [], t, {"value": attr})

    def reshape(self, x: Value, shape: tuple[int, ...], dialect: str = "semantic") -> Value:
        t = x.type
        assert isinstance(t, TensorType)
        if t.shape == tuple(shape):
            return x
        return self.op(f"{dialect}.reshape", [x], t.with_shape(tuple(shape)))

    def transpose(self, x: Value, permutation: Sequence[int], dialect: str = "semantic") \
            -> Value:
        if list(permutation) == sorted(permutation):
            return x
        t = x.type
        assert isinstance(t, TensorType)
        shape = tuple(t.shape[p] for p in permutation)
        return self.op(f"{dialect}.transpose", [x], t.with_shape(shape),
                       {"permutation": DenseArrayAttr(tuple(permutation))})


def blocks(root: Operation) -> Iterator[Block]:
    """Every block nested in ``root`` (a snapshot, pre-order)."""
    for op in list(root.walk()):
        for region in op.regions:
            yield from region.blocks


SPLITTABLE_REDUCTIONS = ("semantic.reduce_sum", "semantic.reduce_max", "semantic.reduce_min")
"""The reductions whose partial results combine with the same reduction (a sum of
partial sums): what the tensor stage may split or reorder."""


def splittable_reductions(root: Operation) -> Iterator[ReduceOp]:
    """Every :data:`SPLITTABLE_REDUCTIONS` op nested in ``root`` (a snapshot per block,
    so a rewrite may replace the op it is given) but a sum of f16/bf16: it accumulates
    once and rounds once, where partial sums would each be rounded to half precision."""
    for block in blocks(root):
        for op in list(block.ops):
            if isinstance(op, ReduceOp) and op.op_name in SPLITTABLE_REDUCTIONS and not (
                    op.op_name == "semantic.reduce_sum"
                    and op.tensor_operand(0).element.name in ("f16", "bf16")):
                yield op


@dataclass(frozen=True)
class ReductionRewrite(Pass):
    """A tensor-stage pass that rewrites each of :func:`splittable_reductions` (its
    ``_rewrite``), unless ``enabled`` is off."""

    enabled: bool = True

    def apply(self, ctx: PassContext, module: Operation) -> None:
        if not self.enabled:
            return
        for op in splittable_reductions(module):
            self._rewrite(ctx, op)

    def _rewrite(self, ctx: PassContext, op: ReduceOp) -> None:
        raise NotImplementedError


def defining_op(v: Value) -> Operation | None:
    """The op that defines ``v`` (None for a block argument)."""
    return v.op if isinstance(v, OpResult) else None


def constant_value(v: Value, name: str = "semantic.constant") -> DenseElementsAttr | None:
    """The dense value of ``v`` when a constant op (``name``) defines it."""
    op = defining_op(v)
    if op is None or op.op_name != name:
        return None
    a = op.attr("value")
    return a if isinstance(a, DenseElementsAttr) else None


def splat_value(v: Value) -> float | int | bool | None:
    """The one value of a splat (or one-element) semantic constant, else None."""
    a = constant_value(v)
    if a is None or not (a.splat or len(a.values) == 1):
        return None
    return a.values[0]


def replace_op(op: Operation, value: Value) -> None:
    """Make every user of ``op``'s one result use ``value``, then erase ``op``."""
    op.result.replace_all_uses_with(value)
    op.erase()


def set_attr(op: Operation, key: str, value: Attribute) -> None:
    """Set ``key`` where the op keeps it (properties if already there, else attributes)."""
    where = op.properties if key in op.properties else op.attributes
    where[key] = value


def is_pure(op: Operation) -> bool:
    return "pure" in type(op).traits and not op.regions
