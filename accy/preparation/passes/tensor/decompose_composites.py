"""``decompose-composites``: composite semantic ops become primitive semantic ops.

- ``softmax`` (stable): ``e = exp(x - max(x)); e / sum(e)``, over the last
  axis; another axis is transposed last and back;
- ``layernorm``: ``c = x - mean(x); c · rsqrt(mean(c²) + eps) · gamma + beta``;
  normalizing over ``axis`` … last with ``axis`` not last reshapes ``x`` to
  ``[prod(outer), prod(inner)]`` and ``gamma``/``beta`` to ``[prod(inner)]``
  first, and the result back;
- ``rmsnorm``: ``x · rsqrt(mean(x²) + eps) · gamma`` (reshaped the same way);
- ``gelu``: ``0.5·x·erfc(-x/√2)`` (``= 0.5·x·(1 + erf(x/√2))`` without its
  cancellation for x ≪ 0), or ``x·sigmoid(2·√(2/π)·(x + 0.044715·x³))``
  (``= 0.5·x·(1 + tanh(…))``, likewise);
- ``reduce_mean``: ``reduce_sum × (1/count)``.

Reductions keep their dims and broadcasting does the rest; scalar constants
are rank-0 splats of the operand's element type. f16 and bf16 composites
compute in f32 (SEMANTIC.md: "f16/bf16 compute in f32 and round on store"):
their operands are cast to f32, the decomposition runs in f32, and only the
result is cast back, so no intermediate (a sum of squares, a mean) is rounded
to half precision or overflows it. The output is still the semantic dialect
(so the reference interpreter checks it).

Example
-------
>>> from accy.choir.parser import parse_module
>>> from accy.choir.passes import PassManager
>>> m = parse_module('''"builtin.module"() ({
...   "func.func"() <{function_type = (tensor<2x8xf32>) -> tensor<2x8xf32>, sym_name = "main"}> ({
...   ^bb0(%x: tensor<2x8xf32>):
...     %0 = "semantic.softmax"(%x) {axis = -1 : i64} : (tensor<2x8xf32>) -> tensor<2x8xf32>
...     "func.return"(%0) : (tensor<2x8xf32>) -> ()
...   }) : () -> ()
... }) : () -> ()''')
>>> _ = PassManager("tensor", (DecomposeComposites(),)).run(m)
>>> [op.op_name.split(".")[1] for op in m.entry().body.ops]
['reduce_max', 'sub', 'exp', 'reduce_sum', 'div', 'return']
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from accy.choir.attributes import F32, BoolAttr, DenseArrayAttr, TensorType
from accy.choir.ir import Operation, Value
from accy.choir.passes import Pass, PassContext
from accy.dialects.semantic import NormOp, ReduceOp, SemanticOp, SoftmaxOp
from accy.errors import VerifyError
from accy.preparation.passes.rewrite import Builder, blocks, replace_op


def _type(v: Value) -> TensorType:
    t = v.type
    assert isinstance(t, TensorType), f"expected a tensor, got {t}"
    return t


def _static_dims(op: Operation, t: TensorType, axes: Sequence[int]) -> tuple[int, ...]:
    dims = tuple(t.shape[a] for a in axes)
    if any(d is None for d in dims):
        raise VerifyError(f"'{op.op_name}' needs static dims to decompose, got {t} (bind the "
                          f"arguments' shapes with --shape)", op.loc)
    return dims  # type: ignore[return-value]


def _reduce(b: Builder, kind: str, x: Value, axes: Sequence[int], keepdims: bool = True) \
        -> Value:
    return b.op(f"semantic.reduce_{kind}", [x], attributes={
        "axes": DenseArrayAttr(tuple(axes)), "keepdims": BoolAttr(keepdims)})


def _mean(b: Builder, x: Value, axes: Sequence[int], keepdims: bool = True) -> Value:
    t = _type(x)
    count = math.prod(_static_dims(b.anchor, t, axes))
    total = _reduce(b, "sum", x, axes, keepdims)
    return b.op("semantic.mul", [total, b.constant(1.0 / count if count else math.inf,
                                                   t.element)])


def _inverse(perm: Sequence[int]) -> tuple[int, ...]:
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return tuple(inv)


# ------------------------------------------------------------------------ softmax


def _softmax_last(b: Builder, x: Value) -> Value:
    last = _type(x).rank - 1
    shifted = b.op("semantic.sub", [x, _reduce(b, "max", x, [last])])
    e = b.op("semantic.exp", [shifted])
    return b.op("semantic.div", [e, _reduce(b, "sum", e, [last])])


def softmax(b: Builder, op: Operation, operands: Sequence[Value]) -> Value:
    assert isinstance(op, SoftmaxOp)
    x = operands[0]
    rank = _type(x).rank
    axis = op.axis_attr(rank)
    if axis == rank - 1:
        return _softmax_last(b, x)
    # make the normalized axis innermost, so both reductions are innermost
    perm = [i for i in range(rank) if i != axis] + [axis]
    y = _softmax_last(b, b.transpose(x, perm))
    return b.transpose(y, _inverse(perm))


# -------------------------------------------------------------------------- norms


def _normalize(b: Builder, op: NormOp, operands: Sequence[Value],
               last_axis_form: Callable[..., Value]) -> Value:
    """Run ``last_axis_form(b, x, *params, eps)`` over ``axis`` … last, reshaping if needed."""
    x, *params = operands
    t = _type(x)
    axis = op.axis_attr(t.rank)
    eps = b.constant(op.float_attr("epsilon", 1e-5), t.element)
    if axis == t.rank - 1:
        return last_axis_form(b, x, *params, eps)
    inner = math.prod(_static_dims(op, t, range(axis, t.rank)))
    outer = math.prod(_static_dims(op, t, range(axis)))
    rows = b.reshape(x, (outer, inner))
    flat = [b.reshape(p, (inner,)) for p in params]
    y = last_axis_form(b, rows, *flat, eps)
    return b.reshape(y, _static_dims(op, t, range(t.rank)))


def _layernorm_last(b: Builder, x: Value, gamma: Value, beta: Value, eps: Value) -> Value:
    last = _type(x).rank - 1
    centered = b.op("semantic.sub", [x, _mean(b, x, [last])])
    var = _mean(b, b.op("semantic.mul", [centered, centered]), [last])
    inv_std = b.op("semantic.rsqrt", [b.op("semantic.add", [var, eps])])
    normed = b.op("semantic.mul", [centered, inv_std])
    return b.op("semantic.add", [b.op("semantic.mul", [normed, gamma]), beta])


def _rmsnorm_last(b: Builder, x: Value, gamma: Value, eps: Value) -> Value:
    last = _type(x).rank - 1
    mean_sq = _mean(b, b.op("semantic.mul", [x, x]), [last])
    inv_rms = b.op("semantic.rsqrt", [b.op("semantic.add", [mean_sq, eps])])
    return b.op("semantic.mul", [b.op("semantic.mul", [x, inv_rms]), gamma])


def layernorm(b: Builder, op: Operation, operands: Sequence[Value]) -> Value:
    assert isinstance(op, NormOp)
    return _normalize(b, op, operands, _layernorm_last)


def rmsnorm(b: Builder, op: Operation, operands: Sequence[Value]) -> Value:
    assert isinstance(op, NormOp)
    return _normalize(b, op, operands, _rmsnorm_last)


# ----------------------------------------------------------------- gelu, mean


def gelu(b: Builder, op: Operation, operands: Sequence[Value]) -> Value:
    assert isinstance(op, SemanticOp)
    x = operands[0]
    el = _type(x).element
    # Both forms avoid 1 + erf(…) / 1 + tanh(…), which cancel to 0 for x ≪ 0 where
    # gelu is tiny but not 0 (a later division or pow would see the difference).
    if op.str_attr("approximate", ("none", "tanh"), default="none") == "tanh":
        cube = b.op("semantic.mul", [b.op("semantic.mul", [x, x]), x])
        inner = b.op("semantic.add", [x, b.op("semantic.mul", [cube, b.constant(0.044715, el)])])
        scaled = b.op("semantic.mul", [inner, b.constant(2.0 * math.sqrt(2.0 / math.pi), el)])
        return b.op("semantic.mul", [x, b.op("semantic.sigmoid", [scaled])])
    tail = b.op("semantic.erfc", [b.op("semantic.mul", [x, b.constant(-math.sqrt(0.5), el)])])
    return b.op("semantic.mul", [b.op("semantic.mul", [x, b.constant(0.5, el)]), tail])


def reduce_mean(b: Builder, op: Operation, operands: Sequence[Value]) -> Value:
    assert isinstance(op, ReduceOp)
    axes, keepdims = op.reduced()
    return _mean(b, operands[0], axes, keepdims)


HALF = frozenset({"f16", "bf16"})
"""Element types a composite computes in f32 and rounds to only at its result."""


def decompose_in_compute_type(b: Builder, op: Operation,
                              decompose: Callable[[Builder, Operation, Sequence[Value]], Value]) \
        -> Value:
    """``decompose`` applied to ``op``'s operands, through f32 for an f16/bf16 op."""
    result = _type(op.results[0])
    if result.element.name not in HALF:
        return decompose(b, op, op.operands)
    wide = [b.op("semantic.cast", [v], _type(v).with_element(F32)) for v in op.operands]
    y = decompose(b, op, wide)
    return b.op("semantic.cast", [y], _type(y).with_element(result.element))


DECOMPOSITIONS: dict[str, Callable[[Builder, Operation, Sequence[Value]], Value]] = {
    "semantic.softmax": softmax,
    "semantic.layernorm": layernorm,
    "semantic.rmsnorm": rmsnorm,
    "semantic.gelu": gelu,
    "semantic.reduce_mean": reduce_mean,
}


@dataclass(frozen=True)
class DecomposeComposites(Pass):
    """Replace every composite op by its :data:`DECOMPOSITIONS` entry."""

    name = "decompose-composites"

    def apply(self, ctx: PassContext, module: Operation) -> None:
        for block in blocks(module):
            for op in list(block.ops):
                decompose = DECOMPOSITIONS.get(op.op_name)
                if decompose is None:
                    continue
                replace_op(op, decompose_in_compute_type(Builder(op), op, decompose))
                ctx.stat(op.op_name.removeprefix("semantic."))
