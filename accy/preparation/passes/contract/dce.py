"""``dce``: erase pure ops whose results are unused.

Each block is walked backwards, so a chain of dead ops goes in one sweep;
the sweeps repeat until nothing more is erased.

Example
-------
>>> from accy.choir.parser import parse_module
>>> from accy.choir.passes import PassManager
>>> m = parse_module('''"builtin.module"() ({
...   "func.func"() <{function_type = (tensor<4xf32>) -> tensor<4xf32>, sym_name = "main"}> ({
...   ^bb0(%x: tensor<4xf32>):
...     %0 = "semantic.exp"(%x) : (tensor<4xf32>) -> tensor<4xf32>
...     %1 = "semantic.neg"(%0) : (tensor<4xf32>) -> tensor<4xf32>
...     "func.return"(%x) : (tensor<4xf32>) -> ()
...   }) : () -> ()
... }) : () -> ()''')
>>> PassManager("contract", (DCE(),)).run(m).stats["dce"]
{'erased': 2}
"""

from __future__ import annotations

from dataclasses import dataclass

from accy.choir.ir import Operation
from accy.choir.passes import Pass, PassContext
from accy.preparation.passes.rewrite import blocks, is_pure


@dataclass(frozen=True)
class DCE(Pass):
    """Dead-code elimination of pure ops."""

    name = "dce"

    def apply(self, ctx: PassContext, module: Operation) -> None:
        changed = True
        while changed:
            changed = False
            for block in blocks(module):
                for op in reversed(list(block.ops)):
                    if is_pure(op) and not any(r.uses for r in op.results):
                        op.erase()
                        ctx.stat("erased")
                        changed = True
                        changed = True
