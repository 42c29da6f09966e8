"""``fold-constants``: an op of constants becomes one constant.

The value comes from the reference interpreter's implementation of the op,
so folding has exactly the numerics of running the program.

Example
-------
>>> from accy.choir.parser import parse_module
>>> from accy.choir.passes import PassManager
>>> m = parse_module('''"builtin.module"() ({
...   "func.func"() <{function_type = () -> tensor<2xf32>, sym_name = "main"}> ({
...     %a = "semantic.constant"() {value = dense<[1.0, 2.0]> : tensor<2xf32>} : () -> tensor<2xf32>
...     %b = "semantic.exp"(%a) : (tensor<2xf32>) -> tensor<2xf32>
...     "func.return"(%b) : (tensor<2xf32>) -> ()
...   }) : () -> ()
... }) : () -> ()''')
>>> PassManager("contract", (FoldConstants(),)).run(m).stats["fold-constants"]
{'folded': 1}
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from accy.choir.attributes import DenseElementsAttr, TensorType
from accy.choir.ir import Operation
from accy.choir.passes import Pass, PassContext
from accy.errors import AccyError
from accy.preparation.passes.rewrite import Builder, blocks, constant_value, is_pure, replace_op
from accy.reference import IMPLS


@dataclass(frozen=True)
class FoldConstants(Pass):
    """Replace a pure semantic op whose operands are all constants by a constant."""

    name = "fold-constants"

    max_elements: int = 65536
    """Largest constant (in elements) a fold may create."""

    def apply(self, ctx: PassContext, module: Operation) -> None:
        for block in blocks(module):
            for op in list(block.ops):
                value = self._fold(op)
                if value is None:
                    continue
                new = Builder(op).op("semantic.constant", [], value.type, {"value": value})
                replace_op(op, new)
                ctx.stat("folded")

    def _fold(self, op: Operation) -> DenseElementsAttr | None:
        if not op.op_name.startswith("semantic.") or op.op_name == "semantic.constant":
            return None
        if not is_pure(op) or len(op.results) != 1 or op.op_name not in IMPLS:
            return None
        t = op.results[0].type
        if not isinstance(t, TensorType) or not t.is_static or t.num_elements > self.max_elements:
            return None
        values = [constant_value(v) for v in op.operands]
        if any(v is None or not v.type.is_static for v in values):
            return None
        try:
            with np.errstate(all="ignore"):
                arrays = [IMPLS["semantic.constant"](v.owner, [])[0]  # type: ignore[union-attr,arg-type]
                          for v in op.operands]
                (result,) = IMPLS[op.op_name](op, arrays)
        except AccyError:
            return None  # left for the reference / the compiled program to report
        return DenseElementsAttr.from_numpy(result, t)
