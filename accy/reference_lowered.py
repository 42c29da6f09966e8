"""Reference implementations of the ``prim`` dialect for :mod:`accy.reference`.

Importing this module registers every ``prim.*`` op with
:func:`accy.reference.register_impl`, so :func:`accy.reference.run_reference`
runs tensor-stage products. Each prim op that has a semantic twin runs the
twin's implementation (so the numerics are the same: float64 compute, one
rounding to the declared element type); ``prim.reduce`` is the semantic
reduction over the last axis with ``keepdims``, and ``prim.broadcast`` places
operand dims at ``dims`` and broadcasts.

Example
-------
>>> import numpy as np
>>> from accy.choir.parser import parse_module
>>> from accy.reference import run_reference  # this module is imported: prim ops run
>>> m = parse_module('''"builtin.module"() ({
...   "func.func"() <{function_type = (tensor<2x3xf32>) -> tensor<2x1xf32>, sym_name = "main"}> ({
...   ^bb0(%x: tensor<2x3xf32>):
...     %0 = "prim.reduce"(%x) {kind = "max"} : (tensor<2x3xf32>) -> tensor<2x1xf32>
...     "func.return"(%0) : (tensor<2x1xf32>) -> ()
...   }) : () -> ()
... }) : () -> ()''')
>>> run_reference(m, [np.arange(6, dtype=np.float32).reshape(2, 3)])[0].ravel()
array([2., 5.], dtype=float32)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from accy.choir.attributes import Attribute, BoolAttr, DenseArrayAttr, TensorType, i64_list
from accy.choir.ir import Operation
from accy.dialects import prim
from accy.errors import VerifyError
from accy.reference import IMPLS, register_impl


class _AsSemantic:
    """A view of a prim op as its semantic twin (another name, some attributes added).

    The semantic implementations read only ``op_name``, attributes, operand and
    result types and ``loc``, so they run unchanged on this view.
    """

    def __init__(self, op: Operation, name: str, extra: dict[str, Attribute] | None = None) \
            -> None:
        self._op = op
        self.op_name = name
        self._extra = extra or {}

    def attr(self, key: str) -> Attribute | None:
        return self._extra[key] if key in self._extra else self._op.attr(key)

    def __getattr__(self, key: str) -> Any:
        return getattr(self._op, key)


_TWINS = tuple(f"prim.{n}" for n in prim.UNARY_OPS + prim.BINARY_OPS + (
    "cmp", "select", "cast", "constant", "matmul", "transpose", "reshape") + prim.DATA_OPS)


@register_impl(*_TWINS)
def _twin(op: Operation, args: list[np.ndarray]) -> list[np.ndarray]:
    name = "semantic." + op.op_name.removeprefix("prim.")
    return IMPLS[name](_AsSemantic(op, name), args)  # type: ignore[arg-type]


@register_impl("prim.reduce")
def _reduce(op: Operation, args: list[np.ndarray]) -> list[np.ndarray]:
    kind = op.attr("kind")
    kind_name = getattr(kind, "value", None)
    if kind_name not in prim.REDUCE_KINDS:
        raise VerifyError("'prim.reduce' needs kind = \"sum\", \"max\" or \"min\"", op.loc)
    if args[0].ndim < 1:
        raise VerifyError("'prim.reduce' needs an operand of rank >= 1", op.loc)
    name = f"semantic.reduce_{kind_name}"
    view = _AsSemantic(op, name, {"axes": DenseArrayAttr((args[0].ndim - 1,)),
                                  "keepdims": BoolAttr(True)})
    return IMPLS[name](view, args)  # type: ignore[arg-type]


@register_impl("prim.broadcast")
def _broadcast(op: Operation, args: list[np.ndarray]) -> list[np.ndarray]:
    x, t = args[0], op.results[0].type
    dims = i64_list(op.attr("dims"))
    if not isinstance(t, TensorType) or not t.is_static or len(dims) != x.ndim or \
            any(not 0 <= d < t.rank for d in dims):
        raise VerifyError(f"'prim.broadcast' dims {list(dims)} do not place an operand of "
                          f"shape {x.shape} into {t}", op.loc)
    placed = [1] * t.rank
    for i, d in enumerate(dims):
        placed[d] = x.shape[i]
    shape = tuple(int(d) for d in t.shape)  # type: ignore[arg-type]
    return [np.array(np.broadcast_to(x.reshape(placed), shape))]


@register_impl("dispatch.region")
def _region(op: Operation, args: list[np.ndarray]) -> list[np.ndarray]:
    """A dispatch region computes its body on its inputs (fusion changes nothing)."""
    from accy.reference import run_block

    return run_block(op.regions[0].blocks[0], args)


@register_impl("prim.reshape")
def _reshape(op: Operation, args: list[np.ndarray]) -> list[np.ndarray]:
    t = op.results[0].type
    assert isinstance(t, TensorType)
    return [args[0].reshape(tuple(int(d) for d in t.shape if d is not None))]
