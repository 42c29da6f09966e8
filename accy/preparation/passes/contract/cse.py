"""``cse``: merge identical pure ops within a block.

Two ops are identical when they have the same name, operands (in any order
for a commutative op), attributes, properties and result types, and no
regions. Float constants compare bit for bit, so ``-0.0`` and ``0.0`` stay
apart.

Example
-------
>>> from accy.choir.parser import parse_module
>>> from accy.choir.passes import PassManager
>>> m = parse_module('''"builtin.module"() ({
...   "func.func"() <{function_type = (tensor<4xf32>) -> tensor<4xf32>, sym_name = "main"}> ({
...   ^bb0(%x: tensor<4xf32>):
...     %0 = "semantic.exp"(%x) : (tensor<4xf32>) -> tensor<4xf32>
...     %1 = "semantic.exp"(%x) : (tensor<4xf32>) -> tensor<4xf32>
...     %2 = "semantic.add"(%0, %1) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
...     "func.return"(%2) : (tensor<4xf32>) -> ()
...   }) : () -> ()
... }) : () -> ()''')
>>> PassManager("contract", (CSE(),)).run(m).stats["cse"]
{'merged': 1}
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

from accy.choir.attributes import Attribute, DenseElementsAttr, FloatAttr
from accy.choir.ir import Operation
from accy.choir.passes import Pass, PassContext
from accy.preparation.passes.rewrite import blocks, is_pure


def _attr_key(a: Attribute) -> Hashable:
    # repr keeps -0.0 apart from 0.0 (they compare equal) and lets NaN match NaN
    if isinstance(a, DenseElementsAttr):
        return ("dense", a.type, a.splat, tuple(map(repr, a.values)))
    if isinstance(a, FloatAttr):
        return ("float", a.type, repr(a.value))
    return a


def _attrs_key(attrs: dict[str, Attribute]) -> Hashable:
    return tuple((k, _attr_key(attrs[k])) for k in sorted(attrs))


def op_key(op: Operation) -> Hashable:
    """What makes two pure ops interchangeable."""
    operands = list(op.operands)
    if "commutative" in type(op).traits:
        operands.sort(key=id)
    return (op.op_name, tuple(operands), _attrs_key(op.attributes),
            _attrs_key(op.properties), op.result_types)


@dataclass(frozen=True)
class CSE(Pass):
    """Common-subexpression elimination within each block."""

    name = "cse"

    def apply(self, ctx: PassContext, module: Operation) -> None:
        for block in blocks(module):
            seen: dict[Hashable, Operation] = {}
            for op in list(block.ops):
                if not is_pure(op) or not op.results:
                    continue
                key = op_key(op)
                first = seen.get(key)
                if first is None:
                    seen[key] = op
                    continue
                for old, new in zip(op.results, first.results):
                    old.replace_all_uses_with(new)
                op.erase()
                ctx.stat("merged")
