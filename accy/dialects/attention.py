"""The attention pattern over ``prim`` ops: ``softmax(q · kᵀ · scale) · v``.

What the dispatch stage fuses into one ``attention`` region and what the
renderers read back out of that region's body (the same ops, cloned), so the
pattern is written once::

    S  = prim.matmul(Q, Kᵀ)            Kᵀ: prim.transpose of K (last two axes), or a
                                       materialized [..., D, N] value read as it is
    T  = S · c | c · S | S / c         optional: c a broadcast one-value constant
    mx = prim.reduce max (T)           softmax over the last axis, as the tensor
    E  = exp(T − broadcast(mx))        stage decomposes it
    l  = prim.reduce sum (E)
    P  = E / broadcast(l)
    O  = prim.matmul(P, V)

Every intermediate (S, T, mx, E, l, P and the broadcasts between) is read by
the chain only; Q, K and V are read as they are in memory (no index map
between them and the matmuls but K's transpose); every tensor is f32 and
every extent at least 1; the batch dims of Q, K, V and O are equal (no
broadcasting batch); the head dims are at most :data:`MAX_HEAD_DIM`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from accy.choir.attributes import DenseArrayAttr, DenseElementsAttr, StringAttr, TensorType
from accy.choir.ir import BlockArgument, Operation, OpResult, Value

MAX_HEAD_DIM = 256
"""The largest head dim (of Q/K and of V) fused: a block keeps a tile of Q rows of
this width in shared memory."""

FREE = frozenset({"prim.broadcast", "prim.transpose", "prim.constant"})
"""Ops that are index maps or constants (never a launch of their own)."""


@dataclass(frozen=True)
class AttentionMatch:
    """One matched chain: its ops in order, its operands and extents."""

    ops: tuple[Operation, ...]
    """Every op of the chain in block order (free ops included), the last matmul last."""
    q: Value
    k: Value
    """K as it is in memory: ``[..., N, D]`` when ``k_rows`` (read through a transpose),
    else ``[..., D, N]``."""
    v: Value
    k_rows: bool
    """K is stored a key a row (``[..., N, D]``, the program transposes it)."""
    scale: float | None
    """The constant the scores are multiplied (or divided) by, or None."""
    scale_op: str
    """``"mul"``, ``"div"`` or ``""`` (no scale)."""
    batch: tuple[int, ...]
    m: int
    n: int
    d: int
    dv: int

    @property
    def batch_size(self) -> int:
        return math.prod(self.batch)

    @property
    def out(self) -> Value:
        return self.ops[-1].results[0]

    def arg_index(self, v: Value) -> int:
        """The block-argument index of ``v`` (a kernel body's input)."""
        assert isinstance(v, BlockArgument)
        return v.index


def _shape(v: Value) -> tuple[int, ...] | None:
    t = v.type
    if not isinstance(t, TensorType) or not t.is_static:
        return None
    return tuple(int(d) for d in t.shape)  # type: ignore[arg-type]


def _f32(v: Value) -> bool:
    t = v.type
    return isinstance(t, TensorType) and t.element.name == "f32"


def _op(v: Value, name: str) -> Operation | None:
    if isinstance(v, OpResult) and v.op.op_name == name:
        return v.op
    return None


def _materialized(v: Value) -> bool:
    """Read as it is in memory by a region (an argument, or another region's output)."""
    return isinstance(v, BlockArgument) or (isinstance(v, OpResult) and
                                            v.op.op_name not in FREE)


def _row_broadcast(v: Value, of: Value, rows: tuple[int, ...]) -> Operation | None:
    """``v`` = broadcast of ``of`` (a ``[..., 1]`` row statistic) along the last axis."""
    b = _op(v, "prim.broadcast")
    if b is None or b.operands[0] is not of:
        return None
    dims = b.attr("dims")
    rank = len(rows)
    if not isinstance(dims, DenseArrayAttr) or dims.values != tuple(range(rank)):
        return None
    return b if _shape(v) == rows else None


def _statistic(v: Value, kind: str, rows: tuple[int, ...]) \
        -> tuple[Operation | None, Operation | None]:
    """``v`` = the ``kind`` reduction of a row, broadcast along it (no broadcast when a row
    is one element long): (the reduction, the broadcast)."""
    if rows[-1] == 1:
        r = _reduce(v, kind)
        if r is not None:
            return r, None
    b = _op(v, "prim.broadcast")
    if b is None:
        return None, None
    r = _reduce(b.operands[0], kind)
    if r is None or _row_broadcast(v, r.results[0], rows) is None:
        return None, None
    return r, b


def _scalar_constant(v: Value, chain: list[Operation]) -> float | None:
    """``v`` is a one-value constant through broadcasts (appended to ``chain``)."""
    found: list[Operation] = []
    while True:
        if not isinstance(v, OpResult):
            return None
        op = v.op
        found.append(op)
        if op.op_name == "prim.broadcast":
            v = op.operands[0]
            continue
        if op.op_name != "prim.constant":
            return None
        value = op.attr("value")
        if not isinstance(value, DenseElementsAttr) or not (
                value.splat or value.type.num_elements == 1) or not value.values:
            return None
        if value.type.element.name != "f32":
            return None
        chain.extend(reversed(found))
        return float(value.values[0])  # type: ignore[arg-type]


def _reduce(v: Value, kind: str) -> Operation | None:
    r = _op(v, "prim.reduce")
    a = r.attr("kind") if r is not None else None
    return r if r is not None and isinstance(a, StringAttr) and a.value == kind else None


def match_attention(mm2: Operation) -> AttentionMatch | None:
    """The attention chain that ends in matmul ``mm2``, or None (see the module doc)."""
    if mm2.op_name != "prim.matmul":
        return None
    p, v = mm2.operands
    chain: list[Operation] = [mm2]
    div = _op(p, "prim.div")
    if div is None:
        return None
    e, lb = div.operands
    ex = _op(e, "prim.exp")
    rows = _shape(e)
    if ex is None or rows is None or len(rows) < 2:
        return None
    l_, lb_op = _statistic(lb, "sum", rows)
    if l_ is None or l_.operands[0] is not e:
        return None
    sub = _op(ex.operands[0], "prim.sub")
    if sub is None:
        return None
    t, mb = sub.operands
    mx, mb_op = _statistic(mb, "max", rows)
    if mx is None or mx.operands[0] is not t:
        return None
    # the optional scale
    scale: float | None = None
    scale_op = ""
    s = t
    pre: list[Operation] = []
    scale_node = _op(t, "prim.mul") or _op(t, "prim.div")
    if scale_node is not None:
        a, b = scale_node.operands
        consts: list[Operation] = []
        c = _scalar_constant(b, consts)
        if c is not None and _op(a, "prim.matmul") is not None:
            s, scale, scale_op = a, c, scale_node.op_name.removeprefix("prim.")
        elif scale_node.op_name == "prim.mul":
            consts = []
            c = _scalar_constant(a, consts)
            if c is not None and _op(b, "prim.matmul") is not None:
                s, scale, scale_op = b, c, "mul"
        if scale is None:
            return None
        pre = [*consts, scale_node]
    mm1 = _op(s, "prim.matmul")
    if mm1 is None:
        return None
    q, kt = mm1.operands
    k_rows = False
    k = kt
    tr = _op(kt, "prim.transpose")
    if tr is not None:
        perm = tr.attr("permutation")
        r = len(rows)
        if not isinstance(perm, DenseArrayAttr) or \
                perm.values != tuple(range(r - 2)) + (r - 1, r - 2):
            return None
        k, k_rows = tr.operands[0], True
    if not (_materialized(q) and _materialized(k) and _materialized(v)):
        return None
    chain = [*([tr] if tr is not None else []), mm1, *pre, mx, *([mb_op] if mb_op else []),
             sub, ex, l_, *([lb_op] if lb_op else []), div, mm2]
    # shapes and types
    sq, sk, sv, so = _shape(q), _shape(k), _shape(v), _shape(mm2.results[0])
    if sq is None or sk is None or sv is None or so is None or len(sq) != len(rows):
        return None
    batch, (m, d) = sq[:-2], sq[-2:]
    n = sk[-2] if k_rows else sk[-1]
    if sk != batch + ((n, d) if k_rows else (d, n)):
        return None
    dv = sv[-1]
    if sv != batch + (n, dv) or so != batch + (m, dv) or rows != batch + (m, n):
        return None
    if min((m, n, d, dv, *batch), default=1) < 1 or d > MAX_HEAD_DIM or dv > MAX_HEAD_DIM:
        return None
    values = [q, k, v] + [r for op in chain for r in op.results]
    if not all(_f32(x) for x in values):
        return None
    # every intermediate is read by the chain only
    inside = set(chain)
    for op in chain[:-1]:
        if op is tr or op.op_name == "prim.constant" or op in pre[:-1]:
            continue  # K's transpose and the scale constant may be shared: index maps
        for r in op.results:
            if any(user not in inside for user, _ in r.uses):
                return None
    order = {id(op): i for i, op in enumerate(mm2.parent.ops)} if mm2.parent else {}
    ops = tuple(sorted(set(chain), key=lambda op: order.get(id(op), 0)))
    return AttentionMatch(ops, q, k, v, k_rows, scale, scale_op, batch, m, n, d, dv)


def match_in(ops: list[Operation]) -> AttentionMatch | None:
    """The chain ending in the last ``prim.matmul`` of ``ops`` (a region's body)."""
    mms = [op for op in ops if op.op_name == "prim.matmul"]
    return match_attention(mms[-1]) if mms else None


__all__ = ["AttentionMatch", "MAX_HEAD_DIM", "match_attention", "match_in"]
