"""The ``dispatch`` dialect: regions that become one kernel launch each.

``dispatch.region`` takes its inputs as operands, binds them to its block's
arguments, computes with ``prim`` ops and ends with ``dispatch.yield``. Its
attributes fix the iteration space and how it splits into independent work:

- ``kind = "elementwise"``: ``iteration`` = the output shape, split into
  ``"elements"``;
- ``kind = "rows"``: ``iteration`` = the row shape ``[..., C]``; every value
  inside is a full row value (that shape) or a reduced one (``[..., 1]``);
  split into ``"rows"``;
- ``kind = "matmul"``: ``iteration`` = ``[B..., M, N]``, ``contraction`` = K;
  one ``prim.matmul`` plus an elementwise epilogue; split into ``"tiles"``;
- ``kind = "attention"``: ``iteration`` = the output ``[B..., M, Dv]``,
  ``contraction`` = the head dim D, ``keys`` = N; the whole chain
  ``softmax(q·kᵀ·c)·v`` of :mod:`accy.dialects.attention` (two ``prim.matmul``),
  split into ``"query-tiles"`` (rows of queries of one batch index).

Block sizes stay symbolic here; the kernel stage picks them.
"""

from __future__ import annotations

from accy.choir.attributes import DenseArrayAttr, IntegerAttr, StringAttr, TensorType
from accy.choir.ir import Operation
from accy.errors import VerifyError

KINDS = ("elementwise", "rows", "matmul", "attention")
SPLITS = {"elementwise": "elements", "rows": "rows", "matmul": "tiles",
          "attention": "query-tiles"}


class RegionOp(Operation):
    """``dispatch.region``: one kernel launch's worth of computation."""

    name = "dispatch.region"
    traits = frozenset({"pure"})

    @property
    def kind(self) -> str:
        a = self.attr("kind")
        return a.value if isinstance(a, StringAttr) else ""

    @property
    def iteration(self) -> tuple[int, ...]:
        a = self.attr("iteration")
        return a.values if isinstance(a, DenseArrayAttr) else ()

    @property
    def contraction(self) -> int:
        a = self.attr("contraction")
        return a.value if isinstance(a, IntegerAttr) else 0

    def verify_(self) -> None:
        if self.kind not in KINDS:
            raise VerifyError(f"'dispatch.region' kind must be one of {', '.join(KINDS)}",
                              self.loc)
        if len(self.regions) != 1 or len(self.regions[0].blocks) != 1:
            raise VerifyError("'dispatch.region' needs one region with one block", self.loc)
        block = self.body
        if [a.type for a in block.args] != [v.type for v in self.operands]:
            raise VerifyError("'dispatch.region' block arguments must match its operands",
                              self.loc)
        term = block.terminator
        if not isinstance(term, YieldOp):
            raise VerifyError("'dispatch.region' must end with 'dispatch.yield'", self.loc)
        if [v.type for v in term.operands] != list(self.result_types):
            raise VerifyError("'dispatch.yield' operands must match the region's results",
                              term.loc)
        for op in block.ops[:-1]:
            if not op.op_name.startswith("prim."):
                raise VerifyError(f"'{op.op_name}' cannot appear in a dispatch region", op.loc)
        for t in list(self.result_types) + [v.type for v in self.operands]:
            if not isinstance(t, TensorType) or not t.is_static:
                raise VerifyError("dispatch regions take and produce static tensors", self.loc)
        if not self.iteration and self.kind != "elementwise":
            raise VerifyError("'dispatch.region' needs an 'iteration' space", self.loc)
        if self.kind == "matmul":
            mm = [op for op in block.ops if op.op_name == "prim.matmul"]
            if len(mm) != 1:
                raise VerifyError("a matmul region holds exactly one 'prim.matmul'", self.loc)
        if self.kind == "attention":
            from accy.dialects.attention import match_in

            if match_in(block.ops) is None:
                raise VerifyError("an attention region holds one softmax(q·kᵀ·c)·v chain",
                                  self.loc)


class YieldOp(Operation):
    """``dispatch.yield``: the outputs of a region."""

    name = "dispatch.yield"
    num_results = 0
    traits = frozenset({"terminator"})
