"""``lower-to-prim``: the semantic dialect becomes the ``prim`` dialect.

- implicit NumPy broadcasts of elementwise operands become ``prim.broadcast``
  (trailing-aligned ``dims``), and so does ``broadcast_to``;
- ``reduce_sum|max|min`` over the last axis with keepdims (see
  ``innermost-reductions``) become ``prim.reduce {kind}``;
- ``matmul`` broadcasts its operands' batch dims explicitly, then ``prim.matmul``;
- the data-movement ops (``slice concat pad gather gather_elements``) rename: they
  are index maps the dispatch stage fuses into the regions that read them;
- every other op renames to its ``prim.`` twin.

Composite ops and non-innermost reductions must be gone already
(``decompose-composites``, ``innermost-reductions``), and every type static
(``require-static-shapes``). Afterwards the module holds only ``builtin.*``,
``func.*`` and ``prim.*`` ops.

Example
-------
>>> from accy.choir.parser import parse_module
>>> from accy.choir.passes import PassManager
>>> m = parse_module('''"builtin.module"() ({
...   "func.func"() <{function_type = (tensor<2x4xf32>, tensor<4xf32>) -> tensor<2x4xf32>, sym_name = "main"}> ({
...   ^bb0(%x: tensor<2x4xf32>, %b: tensor<4xf32>):
...     %0 = "semantic.add"(%x, %b) : (tensor<2x4xf32>, tensor<4xf32>) -> tensor<2x4xf32>
...     "func.return"(%0) : (tensor<2x4xf32>) -> ()
...   }) : () -> ()
... }) : () -> ()''')
>>> _ = PassManager("tensor", (LowerToPrim(),)).run(m)
>>> [op.op_name for op in m.entry().body.ops]
['prim.broadcast', 'prim.add', 'func.return']
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from accy.choir.attributes import DenseArrayAttr, StringAttr, TensorType
from accy.choir.builtin import ModuleOp
from accy.choir.ir import Operation, Value
from accy.choir.passes import Pass, PassContext
from accy.dialects import prim
from accy.dialects.semantic import ReduceOp, SemanticOp
from accy.errors import VerifyError
from accy.preparation.passes.rewrite import Builder, blocks, replace_op
from accy.preparation.passes.tensor.innermost_reductions import is_innermost


def broadcast(b: Builder, v: Value, shape: tuple[int, ...]) -> Value:
    """``v`` broadcast (NumPy rules, trailing-aligned) to ``shape``."""
    t = v.type
    assert isinstance(t, TensorType)
    if t.shape == shape:
        return v
    return b.op("prim.broadcast", [v], t.with_shape(shape),
                {"dims": DenseArrayAttr(prim.broadcast_dims(t.rank, len(shape)))})


def _result_shape(op: Operation) -> tuple[int, ...]:
    t = op.results[0].type
    assert isinstance(t, TensorType) and t.is_static
    return t.shape  # type: ignore[return-value]


def _attributes(op: Operation) -> dict:
    return {**op.properties, **op.attributes}


def _rename(b: Builder, op: Operation) -> Value:
    return b.op("prim." + op.op_name.removeprefix("semantic."), op.operands,
                op.results[0].type, _attributes(op))


def _elementwise(b: Builder, op: Operation) -> Value:
    shape = _result_shape(op)
    operands = [broadcast(b, v, shape) for v in op.operands]
    return b.op("prim." + op.op_name.removeprefix("semantic."), operands, op.results[0].type,
                _attributes(op))


def _broadcast_to(b: Builder, op: Operation) -> Value:
    return broadcast(b, op.operands[0], _result_shape(op))


def _reduce(b: Builder, op: Operation) -> Value:
    assert isinstance(op, ReduceOp)
    if not is_innermost(op):
        raise VerifyError(f"'{op.op_name}' must reduce the last axis with keepdims before "
                          f"lowering (run innermost-reductions first)", op.loc)
    attrs = {k: v for k, v in _attributes(op).items() if k not in ("axes", "keepdims")}
    attrs["kind"] = StringAttr(op.kind)
    return b.op("prim.reduce", op.operands, op.results[0].type, attrs)


def _matmul(b: Builder, op: Operation) -> Value:
    batch = _result_shape(op)[:-2]
    operands = []
    for v in op.operands:
        t = v.type
        assert isinstance(t, TensorType)
        operands.append(broadcast(b, v, batch + t.shape[-2:]))  # type: ignore[operator]
    return b.op("prim.matmul", operands, op.results[0].type, _attributes(op))


def _composite(b: Builder, op: Operation) -> Value:
    raise VerifyError(f"'{op.op_name}' must be decomposed before lowering "
                      f"(run decompose-composites first)", op.loc)


LOWERINGS: dict[str, Callable[[Builder, Operation], Value]] = {
    **{f"semantic.{n}": _rename for n in prim.UNARY_OPS},
    **{f"semantic.{n}": _elementwise for n in prim.BINARY_OPS + ("cmp", "select")},
    "semantic.cast": _rename,
    "semantic.constant": _rename,
    "semantic.transpose": _rename,
    **{f"semantic.{n}": _rename for n in prim.DATA_OPS},
    "semantic.reshape": _rename,
    "semantic.broadcast_to": _broadcast_to,
    "semantic.reduce_sum": _reduce,
    "semantic.reduce_max": _reduce,
    "semantic.reduce_min": _reduce,
    "semantic.matmul": _matmul,
    **{f"semantic.{n}": _composite for n in ("softmax", "layernorm", "rmsnorm", "gelu",
                                               "reduce_mean")},
}


@dataclass(frozen=True)
class LowerToPrim(Pass):
    """Replace every semantic op by prim ops (see :data:`LOWERINGS`)."""

    name = "lower-to-prim"

    def apply(self, ctx: PassContext, module: Operation) -> None:
        assert isinstance(module, ModuleOp)
        for block in blocks(module):
            for op in list(block.ops):
                lower = LOWERINGS.get(op.op_name)
                if lower is None:
                    continue
                assert isinstance(op, SemanticOp)
                for v in (*op.operands, *op.results):
                    if isinstance(v.type, TensorType) and not v.type.is_static:
                        raise VerifyError(f"'{op.op_name}' has a dynamic type {v.type}; "
                                          f"prim needs static shapes (run "
                                          f"require-static-shapes first)", op.loc)
                replace_op(op, lower(Builder(op), op))
                ctx.stat("lowered")
        for op in module.walk():
            if op.op_name.split(".", 1)[0] not in ("builtin", "func", "prim"):
                raise VerifyError(f"'{op.op_name}' is not part of the prim dialect; the tensor "
                                  f"stage cannot lower it", op.loc)
