"""``innermost-reductions``: every reduction runs over the last axis, keeping it.

A ``reduce_*`` over axes ``A`` of ``x`` becomes

1. ``transpose`` moving ``A`` last (in their order), unless ``A`` is already a
   trailing block of axes;
2. ``reshape`` to ``[kept…, prod(A)]`` when ``A`` has several axes;
3. the reduction over the last axis with ``keepdims = true``;
4. ``reshape`` to the original result shape (dropped dims, or kept 1s).

With ``enabled = False`` only trailing blocks are accepted (steps 2–4); any
other reduction is an error that names the option to turn on.

Example
-------
>>> from accy.choir.parser import parse_module
>>> from accy.choir.passes import PassManager
>>> from accy.choir.printer import print_op
>>> m = parse_module('''"builtin.module"() ({
...   "func.func"() <{function_type = (tensor<4x8xf32>) -> tensor<8xf32>, sym_name = "main"}> ({
...   ^bb0(%x: tensor<4x8xf32>):
...     %0 = "semantic.reduce_sum"(%x) {axes = array<i64: 0>} : (tensor<4x8xf32>) -> tensor<8xf32>
...     "func.return"(%0) : (tensor<8xf32>) -> ()
...   }) : () -> ()
... }) : () -> ()''')
>>> _ = PassManager("tensor", (InnermostReductions(),)).run(m)
>>> [op.op_name.split(".")[1] for op in m.entry().body.ops]
['transpose', 'reduce_sum', 'reshape', 'return']
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from accy.choir.attributes import BoolAttr, DenseArrayAttr, TensorType
from accy.choir.ir import Operation
from accy.choir.passes import Pass, PassContext
from accy.dialects.semantic import ReduceOp
from accy.errors import VerifyError
from accy.preparation.passes.rewrite import Builder, blocks, replace_op, set_attr


def is_innermost(op: ReduceOp) -> bool:
    """Already a reduction over the last axis with keepdims."""
    rank = op.tensor_operand(0).rank
    axes, keepdims = op.reduced()
    return keepdims and axes == (rank - 1,)


@dataclass(frozen=True)
class InnermostReductions(Pass):
    """Rewrite every ``reduce_*`` into an innermost, keepdims reduction."""

    name = "innermost-reductions"

    enabled: bool = True
    """Transpose non-trailing reduced axes last (otherwise they are an error)."""

    def apply(self, ctx: PassContext, module: Operation) -> None:
        for block in blocks(module):
            for op in list(block.ops):
                if isinstance(op, ReduceOp) and op.op_name.startswith("semantic."):
                    self._rewrite(ctx, op)

    def _rewrite(self, ctx: PassContext, op: ReduceOp) -> None:
        x = op.operands[0]
        t = op.tensor_operand(0)
        axes, keepdims = op.reduced()
        if is_innermost(op):
            if op.attr("axes") != DenseArrayAttr((t.rank - 1,)):
                set_attr(op, "axes", DenseArrayAttr((t.rank - 1,)))  # -1 → rank-1
            return
        if not axes:  # a reduction over no axis is the identity
            replace_op(op, x)
            ctx.stat("identities")
            return
        if not t.is_static or not op.declared.is_static:
            raise VerifyError(f"'{op.op_name}' needs static shapes to move its reduction "
                              f"innermost, got {t} (bind the arguments' shapes with --shape)",
                              op.loc)
        ordered = sorted(axes)
        kept = [i for i in range(t.rank) if i not in axes]
        b = Builder(op)
        if ordered != list(range(t.rank - len(axes), t.rank)):
            if not self.enabled:
                raise VerifyError(
                    f"'{op.op_name}' reduces axes {list(axes)} of {t}, which are not its "
                    f"innermost axes; turn on tensor.innermost_reductions "
                    f"(--option tensor.innermost_reductions=true) to transpose them last",
                    op.loc)
            x = b.transpose(x, kept + ordered)
            ctx.stat("transposed")
        kept_shape = tuple(t.shape[i] for i in kept)
        rows = b.reshape(x, kept_shape + (math.prod(t.shape[a] for a in ordered),))  # type: ignore[misc,arg-type]  # static shapes: no None dims
        reduced = b.op(op.op_name, [rows], attributes={
            "axes": DenseArrayAttr((len(kept),)), "keepdims": BoolAttr(True)})
        assert isinstance(op.declared, TensorType)
        replace_op(op, b.reshape(reduced, op.declared.shape))  # type: ignore[arg-type]
        ctx.stat("rewritten")
