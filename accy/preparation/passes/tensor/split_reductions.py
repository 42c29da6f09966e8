"""``split-reductions``: a long reduction over few outputs becomes two short ones.

A GPU reduction runs a row (or a column) per warp, block or thread; a
reduction with few outputs and a long reduced extent leaves most of the GPU
idle (a sum of everything is one block reading the whole tensor). Before
``innermost-reductions``, on targets that run thread blocks, a reduction of
``x`` over axes ``A`` with ``K`` kept elements and ``N`` reduced ones becomes
two, through a reshape (always a view: the layout is row-major):

- ``A`` a trailing block (rows), ``K < 1024``, ``N ≥ 65536``:
  ``[K, N] → [K·B, N/B]``, reduce the last axis, ``→ [K, B]``, reduce it again
  (``B`` a power of two dividing ``N``, ``K·B ≤ 4096``, ``N/B ≥ 256``);
- ``A`` a leading block (columns), ``N > 256``: ``[N, K] → [N/L, L, K]``,
  reduce axis 1 (``L`` ≤ 256 rows a thread walks), then axis 0 — when the
  first has enough columns (``K·N/L ≥ 16384``) to give each thread one.

Only ``sum``, ``max`` and ``min`` (``reduce_mean`` is a sum by then); a sum of
f16/bf16 stays whole, so no partial sum is rounded to half precision (a
composite's sums are in f32 already). Max and min are exact in any order; an
f32 sum summed in two levels is, if anything, more accurate.

Example
-------
>>> from accy.choir.parser import parse_module
>>> from accy.choir.passes import PassManager
>>> m = parse_module('''"builtin.module"() ({
...   "func.func"() <{function_type = (tensor<1024x4096xf32>) -> tensor<f32>, sym_name = "main"}> ({
...   ^bb0(%x: tensor<1024x4096xf32>):
...     %0 = "semantic.reduce_sum"(%x) {axes = array<i64: 0, 1>} : (tensor<1024x4096xf32>) -> tensor<f32>
...     "func.return"(%0) : (tensor<f32>) -> ()
...   }) : () -> ()
... }) : () -> ()''')
>>> _ = PassManager("tensor", (SplitReductions(),)).run(m)
>>> [op.op_name.split(".")[1] for op in m.entry().body.ops]
['reshape', 'reduce_sum', 'reshape', 'reduce_sum', 'reshape', 'return']
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from accy.choir.attributes import BoolAttr, DenseArrayAttr, TensorType
from accy.choir.ir import OpResult, Value
from accy.choir.passes import PassContext
from accy.dialects.semantic import ReduceOp
from accy.preparation.passes.rewrite import (
    Builder,
    ReductionRewrite,
    replace_op,
)

FEW_OUTPUTS = 1024
LONG_ROW = 65536
MAX_PARTIAL_ROWS = 4096
MIN_CHUNK = 256
THREAD_CHUNK = 256
MIN_COLUMNS = 16384


def _row_split(kept: int, n: int) -> int:
    """``B`` for a row reduction (0: leave it)."""
    if kept >= FEW_OUTPUTS or n < LONG_ROW:
        return 0
    b = 1
    while b * 2 * kept <= MAX_PARTIAL_ROWS and n % (b * 2) == 0 and n // (b * 2) >= MIN_CHUNK:
        b *= 2
    return b if b > 1 else 0


def _column_chunk(kept: int, n: int) -> int:
    """``L`` for a column reduction (0: leave it)."""
    if n <= THREAD_CHUNK:
        return 0
    for chunk in range(THREAD_CHUNK, 31, -1):
        if n % chunk == 0 and kept * (n // chunk) >= MIN_COLUMNS:
            return chunk
    return 0


def _view(b: Builder, x: Value, shape: tuple[int, ...]) -> Value:
    """``x`` reshaped; a cast that only this reduction reads is moved after the reshape
    (a reshape reads a materialized buffer: the cast then fuses into the reduction,
    instead of an f32 copy of a half tensor)."""
    if isinstance(x, OpResult) and x.op.op_name == "semantic.cast" and len(x.uses) == 1:
        t = x.type
        assert isinstance(t, TensorType)
        return b.op("semantic.cast", [b.reshape(x.op.operands[0], shape)],
                    result_type=TensorType(shape, t.element))
    return b.reshape(x, shape)


@dataclass(frozen=True)
class SplitReductions(ReductionRewrite):
    """Split long reductions with few outputs into two (GPU targets)."""

    name = "split-reductions"

    def _rewrite(self, ctx: PassContext, op: ReduceOp) -> None:
        t = op.tensor_operand(0)
        if not t.is_static or not isinstance(op.declared, TensorType) or \
                not op.declared.is_static:
            return
        axes, _ = op.reduced()
        ordered = sorted(axes)
        if not ordered:
            return
        shape = tuple(int(d) for d in t.shape)  # type: ignore[arg-type]
        n = math.prod(shape[a] for a in ordered)
        kept = math.prod(shape) // n if n else 0
        if n == 0 or kept == 0:
            return
        rank = len(shape)
        b = Builder(op)
        x = op.operands[0]
        name = op.op_name
        if ordered == list(range(rank - len(ordered), rank)):
            split = _row_split(kept, n)
            if not split:
                return
            rows = _view(b, x, (kept * split, n // split))
            partial = b.op(name, [rows], attributes={"axes": DenseArrayAttr((1,)),
                                                     "keepdims": BoolAttr(False)})
            again = b.reshape(partial, (kept, split))
            whole = b.op(name, [again], attributes={"axes": DenseArrayAttr((1,)),
                                                    "keepdims": BoolAttr(False)})
        elif ordered == list(range(len(ordered))):
            chunk = _column_chunk(kept, n)
            if not chunk:
                return
            cols = _view(b, x, (n // chunk, chunk, kept))
            partial = b.op(name, [cols], attributes={"axes": DenseArrayAttr((1,)),
                                                     "keepdims": BoolAttr(False)})
            whole = b.op(name, [partial], attributes={"axes": DenseArrayAttr((0,)),
                                                      "keepdims": BoolAttr(False)})
        else:
            return
        replace_op(op, b.reshape(whole, tuple(op.declared.shape)))  # type: ignore[arg-type]
        ctx.stat("split")
