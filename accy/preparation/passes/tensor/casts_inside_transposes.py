"""``casts-inside-transposes``: a cast and a transpose commute; keep the transpose outside.

``cast(transpose(y)) → transpose(cast(y))`` and ``transpose(cast(x)) →
cast(transpose(x))`` (each when the inner op has no other reader), so that the
transposes ``innermost-reductions`` adds around an f16/bf16 reduction (whose
decomposition computes in f32 between two casts) sit at the function's
boundary: the dispatch stage then reads the argument through the transpose
and stores the result through it, and the casts fuse into the row kernel,
instead of an f32 copy on each side of it.

Example
-------
>>> from accy.choir.parser import parse_module
>>> from accy.choir.passes import PassManager
>>> m = parse_module('''"builtin.module"() ({
...   "func.func"() <{function_type = (tensor<4x8xf32>) -> tensor<8x4xf16>, sym_name = "main"}> ({
...   ^bb0(%x: tensor<4x8xf32>):
...     %0 = "prim.transpose"(%x) {permutation = array<i64: 1, 0>} : (tensor<4x8xf32>) -> tensor<8x4xf32>
...     %1 = "prim.cast"(%0) : (tensor<8x4xf32>) -> tensor<8x4xf16>
...     "func.return"(%1) : (tensor<8x4xf16>) -> ()
...   }) : () -> ()
... }) : () -> ()''')
>>> _ = PassManager("tensor", (CastsInsideTransposes(),)).run(m)
>>> [op.op_name for op in m.entry().body.ops]
['prim.cast', 'prim.transpose', 'func.return']
"""

from __future__ import annotations

from dataclasses import dataclass

from accy.choir.attributes import TensorType
from accy.choir.ir import Operation, OpResult, Value
from accy.choir.passes import Pass, PassContext
from accy.preparation.passes.rewrite import blocks


def _only_reader(v: Value, op: Operation) -> bool:
    return [user for user, _ in v.uses] == [op]


@dataclass(frozen=True)
class CastsInsideTransposes(Pass):
    """Swap each cast-of-a-transpose and transpose-of-a-cast pair (see the module)."""

    name = "casts-inside-transposes"

    def apply(self, ctx: PassContext, module: Operation) -> None:
        for block in blocks(module):
            for op in list(block.ops):
                if op.op_name not in ("prim.cast", "prim.transpose") or not op.results:
                    continue
                src = op.operands[0]
                if not isinstance(src, OpResult) or not _only_reader(src, op):
                    continue
                inner = src.op
                if {inner.op_name, op.op_name} != {"prim.cast", "prim.transpose"}:
                    continue
                x = inner.operands[0]
                xt, out = x.type, op.results[0].type
                assert isinstance(xt, TensorType) and isinstance(out, TensorType)
                # the op outside now runs first, on x; the inner one after it
                first_type = TensorType(xt.shape, out.element) if op.op_name == "prim.cast" \
                    else TensorType(out.shape, xt.element)
                first = Operation.create(op.op_name, [x], [first_type], op.attributes,
                                         op.properties, (), op.loc)
                second = Operation.create(inner.op_name, [first.results[0]], [out],
                                          inner.attributes, inner.properties, (), inner.loc)
                block.insert_before(op, first)
                block.insert_before(op, second)
                op.results[0].replace_all_uses_with(second.results[0])
                op.erase()
                inner.erase()
                ctx.stat("swapped")
