"""``successive-reductions``: a reduction over several axes that shares its innermost
axis with another reduction of the same tensor becomes two, innermost first.

``reduce_k(x, A)`` with ``A`` of several axes and ``a = max(A)`` becomes
``reduce_k(reduce_k(x, {a}), A \\ {a})`` (the same ``keepdims`` on both; without
it the remaining axes, all before ``a``, keep their numbers) — only when another
reduction (any kind) of the same ``x`` over exactly ``{a}`` exists. Its first level
is then the same row reduction as that one: identical ones become one (CSE), and a
different kind over the same rows joins it in one multi-output row kernel (the
dispatch stage's sibling reductions), so ``x`` is read once, not once more through a
flat reshape. Without such a sibling the reduction is left whole (a flat reshape,
which ``split-reductions`` may split to fill the GPU).

Only ``sum``, ``max`` and ``min`` (``reduce_mean`` is a sum by then); a sum of
f16/bf16 stays whole, so no partial sum is rounded to half precision. A half
tensor's mean is a sum of ``cast(x)`` to f32 (its partial sums are f32): the
siblings of ``x`` count for it, so its first level is a row sum in f32 over the
rows another reduction of ``x`` reads (the dispatch stage puts the cast and that
sum in the same row kernel, which reads ``x`` once).

Example
-------
>>> from accy.choir.parser import parse_module
>>> from accy.choir.passes import PassManager
>>> m = parse_module('''"builtin.module"() ({
...   "func.func"() <{function_type = (tensor<8x16xf32>) -> (tensor<8xf32>, tensor<f32>), sym_name = "main"}> ({
...   ^bb0(%x: tensor<8x16xf32>):
...     %0 = "semantic.reduce_min"(%x) {axes = array<i64: 1>} : (tensor<8x16xf32>) -> tensor<8xf32>
...     %1 = "semantic.reduce_sum"(%x) {axes = array<i64: 0, 1>} : (tensor<8x16xf32>) -> tensor<f32>
...     "func.return"(%0, %1) : (tensor<8xf32>, tensor<f32>) -> ()
...   }) : () -> ()
... }) : () -> ()''')
>>> _ = PassManager("tensor", (SuccessiveReductions(),)).run(m)
>>> [op.op_name.split(".")[1] for op in m.entry().body.ops]
['reduce_min', 'reduce_sum', 'reduce_sum', 'return']
"""

from __future__ import annotations

from dataclasses import dataclass

from accy.choir.attributes import BoolAttr, DenseArrayAttr, TensorType
from accy.choir.ir import OpResult, Value
from accy.choir.passes import PassContext
from accy.dialects.semantic import ReduceOp
from accy.preparation.passes.rewrite import (
    SPLITTABLE_REDUCTIONS,
    Builder,
    ReductionRewrite,
    replace_op,
)

READERS = SPLITTABLE_REDUCTIONS + ("semantic.reduce_mean",)


def _read(x: Value) -> list[Value]:
    """``x``, and the half tensor it widens when it is ``cast(y)`` of an f16/bf16 ``y`` to
    f32 (a half mean's sum): the tensors whose reductions are siblings of one of ``x``."""
    if isinstance(x, OpResult) and x.op.op_name == "semantic.cast":
        y = x.op.operands[0]
        yt, xt = y.type, x.type
        if isinstance(yt, TensorType) and isinstance(xt, TensorType) and \
                yt.element.name in ("f16", "bf16") and xt.element.name == "f32":
            return [x, y]
    return [x]


@dataclass(frozen=True)
class SuccessiveReductions(ReductionRewrite):
    """Split a multi-axis reduction innermost axis first where a sibling reduces that axis."""

    name = "successive-reductions"

    def _rewrite(self, ctx: PassContext, op: ReduceOp) -> None:
        axes, keepdims = op.reduced()
        if len(axes) < 2:
            return
        inner = max(axes)
        x = op.operands[0]
        if not any(isinstance(u, ReduceOp) and u is not op and u.op_name in READERS
                   and u.reduced()[0] == (inner,) for v in _read(x) for u, _ in v.uses):
            return
        b = Builder(op)
        keep = BoolAttr(keepdims)
        first = b.op(op.op_name, [x], attributes={"axes": DenseArrayAttr((inner,)),
                                                 "keepdims": keep})
        rest = tuple(sorted(a for a in axes if a != inner))
        replace_op(op, b.op(op.op_name, [first], attributes={"axes": DenseArrayAttr(rest),
                                                            "keepdims": keep}))
        ctx.stat("successive")
