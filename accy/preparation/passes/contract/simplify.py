"""``simplify``: algebraic identities on the semantic dialect.

- ``x+0, 0+x, x-0, x*1, 1*x, x/1 → x`` for splat constants, only when no
  broadcasting happened (the result has ``x``'s type); ``x*0`` is never folded
  (``inf*0`` and ``nan*0`` are NaN);
- ``neg(neg x) → x``; ``relu(relu x) → relu x``; ``abs(abs x) → abs x``;
- ``reshape(reshape x) → reshape x``; ``transpose(transpose x) → transpose x``
  with the composed permutation (an identity permutation → ``x``);
- ``reshape``, ``broadcast_to`` and ``cast`` to the operand's own (static) type → ``x``.

Rewrites repeat until nothing changes; inner ops left unused go to ``dce``.

Example
-------
>>> from accy.choir.parser import parse_module
>>> from accy.choir.passes import PassManager
>>> m = parse_module('''"builtin.module"() ({
...   "func.func"() <{function_type = (tensor<4xf32>) -> tensor<4xf32>, sym_name = "main"}> ({
...   ^bb0(%x: tensor<4xf32>):
...     %0 = "semantic.neg"(%x) : (tensor<4xf32>) -> tensor<4xf32>
...     %1 = "semantic.neg"(%0) : (tensor<4xf32>) -> tensor<4xf32>
...     "func.return"(%1) : (tensor<4xf32>) -> ()
...   }) : () -> ()
... }) : () -> ()''')
>>> _ = PassManager("contract", (Simplify(),)).run(m)
>>> m.entry().return_op.operands[0] is m.entry().body.args[0]
True
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from accy.choir.attributes import DenseArrayAttr, TensorType, i64_list
from accy.choir.ir import Operation, Value
from accy.choir.passes import Pass, PassContext
from accy.preparation.passes.rewrite import blocks, defining_op, replace_op, set_attr, splat_value

Rewrite = Callable[[Operation], "Value | bool"]
"""A rewrite: a value that replaces the op's result, True if it changed the op, else False."""


def _same_type(op: Operation, x: Value) -> bool:
    return op.results[0].type == x.type


def _is(v: Value, number: int) -> bool:
    s = splat_value(v)
    return s is not None and not isinstance(s, bool) and s == number


def _neutral(n: int, commutative: bool) -> Rewrite:
    """``x ∘ n → x`` (and ``n ∘ x → x`` when ∘ commutes), when nothing was broadcast."""

    def rewrite(op: Operation) -> Value | bool:
        a, b = op.operands
        if _is(b, n) and _same_type(op, a):
            return a
        if commutative and _is(a, n) and _same_type(op, b):
            return b
        return False

    return rewrite


def _involution(op: Operation) -> Value | bool:
    """``f(f x) → x``."""
    inner = defining_op(op.operands[0])
    if inner is not None and inner.op_name == op.op_name:
        return inner.operands[0]
    return False


def _idempotent(op: Operation) -> Value | bool:
    """``f(f x) → f x``."""
    inner = defining_op(op.operands[0])
    if inner is not None and inner.op_name == op.op_name:
        return op.operands[0]
    return False


def _static_identity(op: Operation) -> Value | bool:
    """An op to the operand's own static type is the operand."""
    x = op.operands[0]
    if _same_type(op, x) and isinstance(x.type, TensorType) and x.type.is_static:
        return x
    return False


def _reshape(op: Operation) -> Value | bool:
    inner = defining_op(op.operands[0])
    if inner is not None and inner.op_name == "semantic.reshape":
        op.set_operand(0, inner.operands[0])
        return _static_identity(op) or True
    return _static_identity(op)


def _cast(op: Operation) -> Value | bool:
    return op.operands[0] if _same_type(op, op.operands[0]) else False


def _transpose(op: Operation) -> Value | bool:
    perm = i64_list(op.attr("permutation"))
    changed = False
    inner = defining_op(op.operands[0])
    if inner is not None and inner.op_name == "semantic.transpose":
        first = i64_list(inner.attr("permutation"))
        perm = tuple(first[p] for p in perm)
        op.set_operand(0, inner.operands[0])
        set_attr(op, "permutation", DenseArrayAttr(perm))
        changed = True
    if list(perm) == list(range(len(perm))) and _same_type(op, op.operands[0]):
        return op.operands[0]
    return changed


REWRITES: dict[str, Rewrite] = {
    "semantic.add": _neutral(0, commutative=True),
    "semantic.sub": _neutral(0, commutative=False),
    "semantic.mul": _neutral(1, commutative=True),
    "semantic.div": _neutral(1, commutative=False),
    "semantic.neg": _involution,
    "semantic.relu": _idempotent,
    "semantic.abs": _idempotent,
    "semantic.reshape": _reshape,
    "semantic.broadcast_to": _static_identity,
    "semantic.cast": _cast,
    "semantic.transpose": _transpose,
}


@dataclass(frozen=True)
class Simplify(Pass):
    """Apply :data:`REWRITES` until nothing changes."""

    name = "simplify"

    def apply(self, ctx: PassContext, module: Operation) -> None:
        changed = True
        while changed:
            changed = False
            for block in blocks(module):
                for op in list(block.ops):
                    rewrite = REWRITES.get(op.op_name)
                    if rewrite is None or op.parent is None:
                        continue
                    result = rewrite(op)
                    if isinstance(result, Value):
                        replace_op(op, result)
                    if result is not False:
                        ctx.stat("simplified")
                        changed = True
