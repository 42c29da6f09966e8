"""``epilogues-before-reshapes``: an elementwise op on a reshaped reduction runs before
the reshape.

``f(reshape(r), c) → reshape(f(r, c))`` where ``r`` is a reduction's result (or an
op this pass moved already), every reshaped operand is a view of a value of one
shape ``S`` with exactly the op's result shape (no broadcasting of a view), and
every other operand is rank 0 (it broadcasts to ``S`` as it did to the result).
``innermost-reductions`` ends every reduction with a reshape to the result shape
(a row sum without its kept axis, a mean's sum of everything as a rank-0 tensor);
the dispatch stage reads a reshape as a materialized buffer, so an op after it
(the mean's ``× 1/count``, a half result's cast) was a launch of its own. Moved
before the reshape, it reads the reduction's own output shape: an epilogue of the
row kernel. An elementwise op commutes with a reshape, so nothing changes but
where it runs.

Example
-------
>>> from accy.choir.parser import parse_module
>>> from accy.choir.passes import PassManager
>>> m = parse_module('''"builtin.module"() ({
...   "func.func"() <{function_type = (tensor<4x8xf32>) -> tensor<4xf32>, sym_name = "main"}> ({
...   ^bb0(%x: tensor<4x8xf32>):
...     %0 = "semantic.reduce_sum"(%x) {axes = array<i64: 1>, keepdims = true} : (tensor<4x8xf32>) -> tensor<4x1xf32>
...     %1 = "semantic.reshape"(%0) : (tensor<4x1xf32>) -> tensor<4xf32>
...     %2 = "semantic.constant"() {value = dense<0.125> : tensor<f32>} : () -> tensor<f32>
...     %3 = "semantic.mul"(%1, %2) : (tensor<4xf32>, tensor<f32>) -> tensor<4xf32>
...     "func.return"(%3) : (tensor<4xf32>) -> ()
...   }) : () -> ()
... }) : () -> ()''')
>>> _ = PassManager("tensor", (EpiloguesBeforeReshapes(),)).run(m)
>>> [op.op_name.split(".")[1] for op in m.entry().body.ops]
['reduce_sum', 'reshape', 'constant', 'mul', 'reshape', 'return']
>>> str(m.entry().body.ops[3].results[0].type)
'tensor<4x1xf32>'
"""

from __future__ import annotations

from dataclasses import dataclass

from accy.choir.attributes import TensorType
from accy.choir.ir import Operation, OpResult, Value
from accy.choir.passes import Pass, PassContext
from accy.dialects.prim import view_source
from accy.dialects.semantic import ReduceOp
from accy.preparation.passes.rewrite import Builder, blocks, replace_op


def _movable_source(v: Value, moved: set[Value]) -> Value | None:
    """What ``v`` is a reshape of, when that is a reduction's result or a moved op's."""
    src = view_source(v)
    if src is v or not isinstance(src, OpResult):
        return None
    return src if src in moved or isinstance(src.op, ReduceOp) else None


def _elementwise(op: Operation) -> bool:
    return op.op_name.startswith("semantic.") and "elementwise" in type(op).traits \
        and len(op.results) == 1


@dataclass(frozen=True)
class EpiloguesBeforeReshapes(Pass):
    """Move elementwise ops on reshaped reductions before the reshape (see the module)."""

    name = "epilogues-before-reshapes"

    def apply(self, ctx: PassContext, module: Operation) -> None:
        for block in blocks(module):
            moved: set[Value] = set()
            """Results of ops this pass moved: their readers may follow them."""
            for op in list(block.ops):
                if _elementwise(op):
                    new = self._rewrite(op, moved)
                    if new is not None:
                        moved.add(new)
                        ctx.stat("moved")

    @staticmethod
    def _rewrite(op: Operation, moved: set[Value]) -> Value | None:
        """Rewrite ``op`` when it qualifies; its new (pre-reshape) result, else None."""
        out = op.results[0].type
        if not isinstance(out, TensorType) or not out.is_static:
            return None
        shape: tuple[int, ...] | None = None
        operands: list[Value] = []
        for v in op.operands:
            t, src = v.type, _movable_source(v, moved)
            if src is not None:
                st = src.type
                if not isinstance(t, TensorType) or t.shape != out.shape or \
                        not isinstance(st, TensorType) or (shape is not None
                                                           and st.shape != shape):
                    return None
                shape = tuple(st.shape)  # type: ignore[arg-type]  # static: no None dims
                operands.append(src)
            elif isinstance(t, TensorType) and t.rank == 0:
                operands.append(v)  # broadcasts to the new shape as it did to the old
            else:
                return None
        if shape is None or shape == tuple(out.shape):
            return None
        b = Builder(op)
        new = b.op(op.op_name, operands, result_type=out.with_shape(shape),
                   attributes=dict(op.attributes))
        replace_op(op, b.reshape(new, tuple(out.shape)))  # type: ignore[arg-type]
        return new
