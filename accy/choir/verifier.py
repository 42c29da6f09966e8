"""Structural verification of choir and the per-op ``verify_`` hooks.

Checks, for every op under the root: the op kind is known where its dialect
is closed, operand and result counts, that every operand is defined before its
use (dominance within a block, or by an enclosing scope), that terminators
come last, and then the kind's own ``verify_``. Errors are ``VerifyError``
with the op's ``file:line:col``.

Example
-------
>>> from accy.choir.parser import parse_module
>>> verify(parse_module('"builtin.module"() ({\\n}) : () -> ()'))
"""

from __future__ import annotations

from accy.choir.ir import OP_REGISTRY, Block, Operation, Value
from accy.errors import VerifyError

CLOSED_DIALECTS = frozenset({"semantic", "builtin", "func", "prim", "dispatch", "memory",
                             "kernel", "target"})
"""Dialects whose every op must be declared; ops of other dialects pass unchecked."""


def verify(root: Operation) -> None:
    """Verify ``root`` and everything nested in it; raise the first ``VerifyError``."""
    _verify_op(root, set())


def _verify_op(op: Operation, visible: set[Value]) -> None:
    dialect = op.op_name.split(".", 1)[0]
    cls = OP_REGISTRY.get(op.op_name)
    if cls is None and dialect in CLOSED_DIALECTS:
        raise VerifyError(f"unknown operation '{op.op_name}'", op.loc)
    if cls is not None:
        if cls.num_operands is not None and len(op.operands) != cls.num_operands:
            raise VerifyError(f"'{op.op_name}' takes {cls.num_operands} operand"
                              f"{'s' if cls.num_operands != 1 else ''}, got {len(op.operands)}",
                              op.loc)
        if cls.num_results is not None and len(op.results) != cls.num_results:
            raise VerifyError(f"'{op.op_name}' has {cls.num_results} result"
                              f"{'s' if cls.num_results != 1 else ''}, got {len(op.results)}",
                              op.loc)
    for i, v in enumerate(op.operands):
        if v not in visible:
            raise VerifyError(f"operand {i} of '{op.op_name}' does not dominate its use", op.loc)
    for region in op.regions:
        for block in region.blocks:
            _verify_block(block, set(visible))
    op.verify_()


def _verify_block(block: Block, visible: set[Value]) -> None:
    visible.update(block.args)
    for i, op in enumerate(block.ops):
        if "terminator" in type(op).traits and i != len(block.ops) - 1:
            raise VerifyError(f"'{op.op_name}' must be the last operation of its block", op.loc)
        _verify_op(op, visible)
        visible.update(op.results)
