"""Two adjacent f16/bf16 lanes a word in a vector kernel's body: :class:`PairBuilder`
spells the ops the kernel stage's plan packs (``packed_ops``, from the table in
:mod:`accy.target.packed`, which the kernel stage reads: that module imports no
renderer, so the kernel stage's version does not hash this one)."""

from __future__ import annotations

from collections.abc import Callable

from accy.choir.ir import BlockArgument, Operation, OpResult, Value
from accy.target.common import BINARY_F, LANE, UNARY_F, ExprBuilder, Scope, elem_of
from accy.target.packed import HALVES, ROUNDING, half_lanes, helper_name, round_pack


def _exact_pack(el: str) -> str:
    """The helper that packs two floats that are ``el`` numbers, NaNs as they are where
    it can (bf16: their top halves; f16: the conversion, exact but for a NaN's bits)."""
    return "accy_bits_bf2" if el == "bf16" else round_pack(el)


Words = Callable[[int, tuple[str, ...], int], str | None]
"""``words(input, idx, pair)``: the vector-loaded word of an input's lanes ``2·pair``
and ``2·pair + 1`` at ``idx``, or None (not loaded as a vector)."""


class PairBuilder:
    """Emit a vector kernel's f16/bf16 values two lanes a word (:mod:`accy.target.packed`).

    The values it owns (:attr:`paired`) are the half op results that either run packed
    (the plan lists the op and its operands are half numbers) or are rounded — those
    are rounded by packing two lanes, and a lane of either is read, where an f32 op
    needs it, by unpacking the word (the builder's ``value_hook``).

    Parameters
    ----------
    b
        The kernel's expression builder (its ``value_hook`` is set to :meth:`lane`).
    ops
        The kernel's body.
    packed
        The plan's ``packed_ops`` (``bf16.add`` …).
    words
        The vector-loaded words of the inputs (:data:`Words`).
    """

    def __init__(self, b: ExprBuilder, ops: list[Operation], packed: str, words: Words) -> None:
        self.b = b
        self.packed = frozenset(packed.split())
        self.words = words
        self.paired = {op.results[0] for op in ops if self.runs_packed(op) or self.rounds(op)}
        """The half values computed a pair at a time."""
        self.canonical: set[str] = set()
        """Words whose NaNs are canonical (made by a rounding op or conversion)."""
        b.value_hook = self.lane

    def runs_packed(self, op: Operation) -> bool:
        """``op`` runs as one packed instruction on both lanes."""
        if len(op.results) != 1 or elem_of(op.results[0]) not in HALVES:
            return False
        el = elem_of(op.results[0])
        return f"{el}.{op.op_name.split('.', 1)[1]}" in self.packed and \
            all(self.b.representable(o, el) for o in op.operands)

    def rounds(self, op: Operation) -> bool:
        """``op`` is a half float op or conversion whose lanes the f32 path rounds."""
        if len(op.results) != 1 or elem_of(op.results[0]) not in HALVES:
            return False
        name = op.op_name.split(".", 1)[1]
        if name == "cast":
            return elem_of(op.operands[0]) != elem_of(op.results[0])
        return (name in UNARY_F or name in BINARY_F) and not self.b.picks_operand(op)

    def lane(self, v: Value, idx: tuple[str, ...], scope: Scope, lane: int) -> str | None:
        """Lane ``lane`` of paired ``v`` at ``idx``: its word's half as a float."""
        if v not in self.paired or not any(LANE in i for i in idx):
            return None  # not paired, or the same in every lane (computed once)
        return half_lanes(self.word(v, idx, scope, lane // 2), elem_of(v))[lane % 2]

    def store_word(self, v: Value, idx: tuple[str, ...], scope: Scope, pair: int) -> str:
        """The word a store of ``v``'s lanes ``2·pair``, ``2·pair + 1`` writes: rounded,
        its NaNs the canonical one the f32 path's conversion makes."""
        src, at = self._source(v, idx)
        el = elem_of(v)
        if src not in self.paired and not isinstance(src, BlockArgument):
            lanes = [self.b.expr(v, idx, scope, 2 * pair + h) for h in (0, 1)]
            return f"{round_pack(el)}({lanes[0]}, {lanes[1]})"  # as the f32 path stores it
        w = self.word(src, at, scope, pair)
        return w if w in self.canonical else f"{helper_name('canon', el)}({w})"

    @staticmethod
    def _source(v: Value, idx: tuple[str, ...]) -> tuple[Value, tuple[str, ...]]:
        """``v`` through its broadcasts and transposes, and the index read there."""
        while isinstance(v, OpResult) and v.op.op_name in ("prim.broadcast", "prim.transpose"):
            idx = ExprBuilder.operand_index(v.op, idx)
            v = v.op.operands[0]
        return v, idx

    def word(self, v: Value, idx: tuple[str, ...], scope: Scope, pair: int) -> str:
        """The C name of a word holding ``v``'s lanes ``2·pair`` (low) and ``2·pair + 1``
        at ``idx``, each an ``el`` number."""
        v, idx = self._source(v, idx)
        key = ("word", id(v), idx, pair)
        found = scope.find(key)
        if found is not None:
            return found
        el = elem_of(v)
        lanes = (2 * pair, 2 * pair + 1)
        canonical = False
        text: str | None = None
        if not any(LANE in i for i in idx):  # the same in both lanes: computed once
            one = self.b.expr(v, idx, scope, 0)
            text, canonical = f"{_exact_pack(el)}({one}, {one})", el == "f16"
        elif isinstance(v, BlockArgument):
            loaded = self.words(v.index, idx, pair)
            if loaded is not None:  # the word as it was loaded (``v1.x``)
                scope.memo[key] = loaded
                return loaded
        elif v in self.paired and self.runs_packed(v.op):
            name = v.op.op_name.split(".", 1)[1]
            args = [self.word(o, idx, scope, pair) for o in v.op.operands]
            text, canonical = f"{helper_name(name, el)}({', '.join(args)})", name in ROUNDING
        elif v in self.paired:  # rounded: both lanes by one conversion
            lo, hi = (self.b.op_expr(v.op, idx, scope, h, rounded=False) for h in lanes)
            text, canonical = f"{round_pack(el)}({lo}, {hi})", True
        if text is None:  # a half number computed a lane at a time (a select, a load)
            lo, hi = (self.b.expr(v, idx, scope, h) for h in lanes)
            text, canonical = f"{_exact_pack(el)}({lo}, {hi})", el == "f16"
        name = self.b.fresh("w")
        scope.lines.append(f"const unsigned int {name} = {text};")
        if canonical:
            self.canonical.add(name)
        scope.memo[key] = name
        return name
