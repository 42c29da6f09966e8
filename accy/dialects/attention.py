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


def _softmax(p: Value) -> tuple[list[Operation], Value, tuple[int, ...]] | None:
    """``p`` = softmax of ``t`` over the last axis as the tensor stage spells it: (its
    ops in order, ``t``, the row shape)."""
    div = _op(p, "prim.div")
    if div is None:
        return None
    e, lb = div.operands
    ex = _op(e, "prim.exp")
    rows = _shape(e)
    if ex is None or rows is None or len(rows) < 2:
        return None
    l_, lb_op = _statistic(lb, "sum", rows)
    sub = _op(ex.operands[0], "prim.sub")
    if l_ is None or l_.operands[0] is not e or sub is None:
        return None
    t, mb = sub.operands
    mx, mb_op = _statistic(mb, "max", rows)
    if mx is None or mx.operands[0] is not t:
        return None
    ops = [mx, *([mb_op] if mb_op else []), sub, ex, l_, *([lb_op] if lb_op else []), div]
    return ops, t, rows


def _scale(t: Value) -> tuple[list[Operation], Value, float | None, str] | None:
    """``t`` = scores · c, c · scores, scores / c, or the scores themselves: (the scale's
    ops, its constant's first, the scores, c, ``mul``/``div``/``""``)."""
    node = _op(t, "prim.mul") or _op(t, "prim.div")
    if node is None:
        return [], t, None, ""
    a, b = node.operands
    sides = [(a, b)] + ([(b, a)] if node.op_name == "prim.mul" else [])
    for scores, const in sides:
        consts: list[Operation] = []
        c = _scalar_constant(const, consts)
        if c is not None and _op(scores, "prim.matmul") is not None:
            return [*consts, node], scores, c, node.op_name.removeprefix("prim.")
    return None


def _keys(kt: Value, rank: int) -> tuple[Operation | None, Value] | None:
    """The first matmul's B: K through a transpose of its last two axes (the transpose,
    K), or ``[..., D, N]`` as it is (None, it)."""
    tr = _op(kt, "prim.transpose")
    if tr is None:
        return None, kt
    perm = tr.attr("permutation")
    if not isinstance(perm, DenseArrayAttr) or \
            perm.values != tuple(range(rank - 2)) + (rank - 1, rank - 2):
        return None
    return tr, tr.operands[0]


def _extents(q: Value, k: Value, v: Value, out: Value, rows: tuple[int, ...], k_rows: bool) \
        -> tuple[tuple[int, ...], int, int, int, int] | None:
    """(batch, M, N, D, Dv) when the shapes line up without broadcasting and fit."""
    sq, sk, sv, so = _shape(q), _shape(k), _shape(v), _shape(out)
    if sq is None or sk is None or sv is None or so is None or len(sq) != len(rows):
        return None
    batch, (m, d) = sq[:-2], sq[-2:]
    n = sk[-2] if k_rows else sk[-1]
    dv = sv[-1]
    if sk != batch + ((n, d) if k_rows else (d, n)) or sv != batch + (n, dv) or \
            so != batch + (m, dv) or rows != batch + (m, n):
        return None
    if min((m, n, d, dv, *batch)) < 1 or d > MAX_HEAD_DIM or dv > MAX_HEAD_DIM:
        return None
    return batch, m, n, d, dv


def _private(chain: list[Operation], shared: set[Operation]) -> bool:
    """Every value of the chain (but those of ``shared`` ops and the last) is read by the
    chain only."""
    inside = set(chain)
    return all(user in inside for op in chain[:-1] if op not in shared
               for res in op.results for user, _ in res.uses)


def match_attention(mm2: Operation) -> AttentionMatch | None:
    """The attention chain that ends in matmul ``mm2``, or None (see the module doc)."""
    if mm2.op_name != "prim.matmul":
        return None
    p, v = mm2.operands
    soft = _softmax(p)
    scaled = _scale(soft[1]) if soft is not None else None
    if soft is None or scaled is None:
        return None
    soft_ops, _, rows = soft
    pre, s, scale, scale_op = scaled
    mm1 = _op(s, "prim.matmul")
    keys = _keys(mm1.operands[1], len(rows)) if mm1 is not None else None
    if mm1 is None or keys is None:
        return None
    tr, k = keys
    q = mm1.operands[0]
    if not (_materialized(q) and _materialized(k) and _materialized(v)):
        return None
    chain = [*([tr] if tr is not None else []), mm1, *pre, *soft_ops, mm2]
    ext = _extents(q, k, v, mm2.results[0], rows, tr is not None)
    if ext is None or not all(_f32(x) for x in [q, k, v] + [r for op in chain
                                                            for r in op.results]):
        return None
    # K's transpose and the scale constant (and its broadcasts) are index maps others
    # may share; nothing else of the chain is read outside it
    if not _private(chain, {*([tr] if tr is not None else []), *pre[:-1]}):
        return None
    order = {id(op): i for i, op in enumerate(mm2.parent.ops)} if mm2.parent else {}
    ops = tuple(sorted(set(chain), key=lambda op: order.get(id(op), 0)))
    return AttentionMatch(ops, q, k, v, tr is not None, scale, scale_op, *ext)


def match_in(ops: list[Operation]) -> AttentionMatch | None:
    """The chain ending in the last ``prim.matmul`` of ``ops`` (a region's body)."""
    mms = [op for op in ops if op.op_name == "prim.matmul"]
    return match_attention(mms[-1]) if mms else None


__all__ = ["AttentionMatch", "MAX_HEAD_DIM", "match_attention", "match_in"]
