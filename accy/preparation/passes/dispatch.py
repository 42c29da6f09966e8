"""Dispatch stage: partition prim ops into dispatch regions (one launch each).

Fusion, in one forward walk over each function (producer → consumer):

- ``prim.broadcast`` / ``prim.transpose`` / the data-movement ops (``slice
  concat pad gather gather_elements``) and constants are *index maps*: they
  are never launches of their own; every region that reads through them
  clones them (a broadcast of a row statistic is a register read, a
  transposed operand is a strided load, a slice an offset load, a gather a
  load at an index loaded first);
- so is a ``prim.cast`` of an argument (or of such a value) that no matmul, attention
  chain or reshape reads: each reader converts the argument as it loads it. A half
  layernorm's ``cast(gamma)`` is then read in the row kernel as the half vector
  itself, not computed by a launch of its own into an f32 buffer the row kernel reads
  back; a ``cast(x)`` read by two regions is the narrower ``x`` read twice;
- an elementwise op joins the group of one of its producers when it iterates
  the same space: an elementwise group of its shape, a row group whose row
  (or reduced row) it is — a reduction's epilogue — or a matmul group whose
  output it is — a matmul epilogue;
- a reduction joins the row group its input comes from (softmax's two
  reductions share one), turns an elementwise producer group of its input's
  shape into a row group (prologue fusion) — or, when a row group over the
  same rows reads one of that group's inputs, moves the group and itself
  into it (a row sum of ``cast(x)`` beside a row sum of ``x``) — joins a row group over the same
  rows that reads one of the same inputs (sibling reductions: a row sum and a
  row min of ``x`` are one launch reading ``x`` once, with two outputs), or
  starts a row group;
- a matmul starts a group — unless it ends an **attention** chain
  (``softmax(q·kᵀ·c)·v``, :mod:`accy.dialects.attention`, its intermediates read
  nowhere else): then the whole chain is one ``attention`` group (one flash-style
  launch; ``fuse_attention``), found before the walk so that its inner ops are
  left for it; nothing joins an attention group;
- an elementwise op with no producer group to join may join an elementwise
  group of its shape that reads one of the same inputs (siblings: the input
  is then read by one launch, not two);
- once placed, an elementwise op in an elementwise group merges into it the
  other elementwise groups of its shape that it reads (fan-in) or shares an
  input with, so that a pure elementwise DAG over one iteration space —
  shared inputs, fan-out, fan-in — is one region;
- a join or merge that would make two groups depend on each other (directly
  or through a third group) is refused, and so is any beyond
  ``max_region_ops``.

Inside a region each value is computed once, however many of its ops read it;
a value read by a later region (or returned) is a region output, so regions
never depend on each other in a cycle.

``prim.reshape`` stays between regions (a view of a materialized buffer).
Every function result is a distinct region output, or a reshape (a view) of
one that no other result claims — a row sum returned without its kept axis
is the reduction's output seen as the result, which the memory stage makes a
view of the result's buffer, so the row kernel writes the result directly. A
copy region is made only when needed: a returned argument, index map or
constant, or a value (or a view of it) returned twice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from accy.choir.attributes import DenseArrayAttr, IntegerAttr, StringAttr, TensorType
from accy.choir.builtin import FuncOp, ReturnOp
from accy.choir.ir import Block, BlockArgument, Operation, OpResult, Region, Value
from accy.choir.passes import Pass, PassContext
from accy.dialects import prim
from accy.dialects.attention import AttentionMatch, match_attention
from accy.dialects.dispatch import SPLITS, RegionOp, YieldOp
from accy.dialects.prim import DATA_OPS

INDEX_OPS = frozenset({"prim.broadcast", "prim.transpose"} |
                      {f"prim.{n}" for n in DATA_OPS})
"""Index maps: broadcast, transpose and the data-movement ops (slice, concat, pad,
gather, gather_elements), which read their operands at remapped (or loaded) indices."""
ELEMENTWISE = prim.ELEMENTWISE_OPS


def _shape(v: Value) -> tuple[int, ...]:
    t = v.type
    assert isinstance(t, TensorType) and t.is_static
    return tuple(t.shape)  # type: ignore[arg-type]


def _free(op: Operation) -> bool:
    """Index maps and constants: cloned into every region that reads them."""
    return op.op_name in INDEX_OPS or op.op_name == "prim.constant"


@dataclass(eq=False)
class Group:
    kind: str
    shape: tuple[int, ...]
    """Elementwise: the iteration shape; rows: the row shape; matmul: the output shape."""
    ops: list[Operation] = field(default_factory=list)
    deps: set[Group] = field(default_factory=set)
    """Every group this one (transitively) reads from."""
    copy_of: Value | None = None
    """For a copy region made for a function result: the value copied."""
    attention: AttentionMatch | None = None
    """For an attention group: the chain it computes."""

    def __hash__(self) -> int:
        return id(self)


class _Former:
    def __init__(self, func: FuncOp, fuse: bool, max_ops: int, ctx: PassContext,
                 fuse_attention: bool = True) -> None:
        self.func = func
        self.fuse = fuse
        self.max_ops = max_ops
        self.ctx = ctx
        self.chains: dict[Operation, AttentionMatch] = {}
        """Every op of an attention chain to fuse → its chain (filled before the walk)."""
        if fuse and fuse_attention:
            self.find_attention()
        self.inlined: set[Operation] = self.find_inlined_casts() if fuse else set()
        """Casts of arguments that every reader computes itself (:meth:`find_inlined_casts`)."""
        self.group_of: dict[Operation, Group] = {}
        self.groups: list[Group] = []
        self.result_sources: list[Group | None] = []
        """Per function result: None when a region output is returned as is, else its copy."""
        self.readers: dict[Value, list[Group]] = {}
        """Per materialized value that is no group's (arguments, reshapes): the groups reading it."""
        self.order = {op: i for i, op in enumerate(func.body.ops)}

    # ---------------------------------------------------------------- analysis
    def free(self, op: Operation) -> bool:
        """Cloned into every region that reads it: index maps, constants, inlined casts."""
        return _free(op) or op in self.inlined

    def find_inlined_casts(self) -> set[Operation]:
        """The casts that are no launch's own work: a ``prim.cast`` of an argument, or of
        an index map, constant or cast of one, that is read (through index maps) by no
        matmul (whose fast kernels read plain buffers), no attention chain and no reshape
        (which views a buffer)."""
        out: set[Operation] = set()

        def no_buffer_readers(op: Operation) -> bool:
            # no reader needs op's value in a buffer of its own (through index maps)
            for user, _ in op.results[0].uses:
                if isinstance(user, ReturnOp):
                    continue
                if user.op_name in ("prim.matmul", "prim.reshape") or user in self.chains:
                    return False
                if user.op_name in INDEX_OPS and not no_buffer_readers(user):
                    return False
            return True

        def from_arguments(v: Value) -> bool:
            if isinstance(v, BlockArgument):
                return True
            assert isinstance(v, OpResult)
            return (_free(v.op) or v.op in out) and all(from_arguments(o)
                                                        for o in v.op.operands)

        for op in self.func.body.ops:
            if op.op_name == "prim.cast" and op not in self.chains \
                    and from_arguments(op.operands[0]) and no_buffer_readers(op):
                out.add(op)
        return out

    def bases(self, v: Value) -> list[tuple[Value, list[Operation]]]:
        """The materialized values ``v`` reads through index maps, with the chain."""
        if isinstance(v, OpResult) and self.free(v.op) and v.op not in self.group_of:
            out = []
            for operand in v.op.operands:
                for base, chain in self.bases(operand):
                    out.append((base, [v.op, *chain]))
            return out
        return [(v, [])]

    def group_of_value(self, v: Value) -> Group | None:
        return self.group_of.get(v.op) if isinstance(v, OpResult) else None

    def producer_groups(self, op: Operation) -> list[tuple[Group, list[Operation]]]:
        out: list[tuple[Group, list[Operation]]] = []
        for operand in op.operands:
            out.extend(self.groups_read(operand, []))
        return out

    def groups_read(self, v: Value, chain: list[Operation]) \
            -> list[tuple[Group, list[Operation]]]:
        """The groups ``v`` reads, through index maps and reshapes (kept in the chain)."""
        out = []
        for base, c in self.bases(v):
            g = self.group_of_value(base)
            if g is not None:
                out.append((g, chain + c))
            elif isinstance(base, OpResult) and base.op.op_name == "prim.reshape":
                out.extend(self.groups_read(base.op.operands[0], chain + c + [base.op]))
        return out

    def can_join(self, op: Operation, g: Group) -> bool:
        if len(g.ops) >= self.max_ops:
            return False
        shape = _shape(op.results[0]) if op.results else ()
        if g.kind == "elementwise" and shape != g.shape:
            return False
        if g.kind == "rows":
            reduced = g.shape[:-1] + (1,)
            if op.op_name == "prim.reduce":
                if _shape(op.operands[0]) != g.shape:
                    return False
            elif shape not in (g.shape, reduced):
                return False
        if g.kind == "matmul" and (shape != g.shape or op.op_name == "prim.reduce"):
            return False
        if g.kind == "attention":
            return False  # the flash kernel writes its output as it is
        for other, chain in self.producer_groups(op):
            if other is g:
                if not self.row_local(g, chain):
                    return False
            elif g in other.deps:
                return False  # joining would make g and other read each other
        return True

    def row_local(self, g: Group, chain: list[Operation]) -> bool:
        """An index chain from a value of ``g`` back into ``g`` stays on the same row/element."""
        if any(op.op_name == "prim.reshape" for op in chain):
            return False  # a reshape reads the materialized buffer: g would read itself
        if g.kind == "elementwise" or not chain:
            return True
        if g.kind == "matmul":
            return False
        if len(chain) != 1 or chain[0].op_name != "prim.broadcast":
            return False
        b = chain[0]
        dims = b.attr("dims")
        src = _shape(b.operands[0])
        return (isinstance(dims, DenseArrayAttr) and dims.values == tuple(range(len(src)))
                and src == g.shape[:-1] + (1,) and _shape(b.results[0]) == g.shape)

    def add(self, op: Operation, g: Group) -> None:
        g.ops.append(op)
        self.group_of[op] = g
        for base in self.outside_inputs(op):
            readers = self.readers.setdefault(base, [])
            if g not in readers:
                readers.append(g)
        for other, _ in self.producer_groups(op):
            if other is not g:
                g.deps.add(other)
                g.deps |= other.deps
        for h in self.groups:  # keep deps transitive for groups that read g
            if g in h.deps:
                h.deps |= g.deps

    def new_group(self, kind: str, shape: tuple[int, ...], op: Operation | None) -> Group:
        g = Group(kind, shape)
        self.groups.append(g)
        if op is not None:
            self.add(op, g)
        return g

    # ---------------------------------------------------------------- grouping
    def find_attention(self) -> None:
        """Reserve the ops of every attention chain (the walk leaves them to it)."""
        for op in self.func.body.ops:
            if op.op_name != "prim.matmul" or op in self.chains:
                continue
            match = match_attention(op)
            if match is None:
                continue
            inner = [o for o in match.ops if not _free(o)]
            if len(inner) > self.max_ops or any(o in self.chains for o in inner):
                continue
            for o in inner:
                self.chains[o] = match

    def form(self) -> None:
        block = self.func.body
        for op in block.ops:
            name = op.op_name
            if self.free(op) or name == "prim.reshape" or isinstance(op, ReturnOp):
                continue
            if op in self.chains:
                match = self.chains[op]
                if op is match.ops[-1]:  # the chain's last op: every input is placed
                    g = self.new_group("attention", _shape(op.results[0]), None)
                    g.attention = match
                    for o in match.ops:
                        if not _free(o):
                            self.add(o, g)
                    self.ctx.stat("fused-attention")
                continue
            if name in ELEMENTWISE:
                self.place_elementwise(op)
            elif name == "prim.reduce":
                self.place_reduce(op)
            elif name == "prim.matmul":
                self.new_group("matmul", _shape(op.results[0]), op)
            else:
                raise AssertionError(f"unexpected op '{name}' at the dispatch stage")
        # A reshape reads a materialized buffer: an index map or constant feeding
        # one is given its own (copy) region.
        for op in list(block.ops):
            if op.op_name == "prim.reshape":
                src = op.operands[0]
                if isinstance(src, OpResult) and self.free(src.op) and src.op not in self.group_of:
                    free = src.op
                    if any(user is not op for user, _ in src.uses):
                        # others read through it (cloning it): the copy region gets a
                        # clone of its own, so they keep reading its operands, not it
                        free = block.insert_before(op, src.op.clone())
                        op.set_operand(0, free.results[0])
                    self.new_group("elementwise", _shape(src), free)
        self.materialize_results()

    def place_elementwise(self, op: Operation) -> None:
        if not self.fuse:
            self.new_group("elementwise", _shape(op.results[0]), op)
            return
        order = {"rows": 0, "matmul": 0, "attention": 0, "elementwise": 1}
        producers = [g for g, _ in sorted(self.producer_groups(op), key=lambda c: order[c[0].kind])]
        siblings = self.siblings(op)
        for g in producers + siblings:
            if self.can_join(op, g):
                self.add(op, g)
                self.ctx.stat("fused-ops" if g in producers else "fused-siblings")
                break
        else:
            g = self.new_group("elementwise", _shape(op.results[0]), op)
        if g.kind != "elementwise":
            return
        for other in producers + siblings:  # fan-in and shared inputs: one region
            if other is not g and other in self.groups and other.kind == "elementwise" \
                    and other.shape == g.shape and self.can_merge(other, g):
                self.merge(other, g)
                self.ctx.stat("merged-groups")

    # ---------------------------------------------------------------- merging
    def outside_inputs(self, op: Operation) -> list[Value]:
        """The materialized values ``op`` reads that no group computes."""
        out = []
        for operand in op.operands:
            for base, _ in self.bases(operand):
                if self.group_of_value(base) is None and base not in out and not (
                        isinstance(base, OpResult) and self.free(base.op)):
                    out.append(base)
        return out

    def siblings(self, op: Operation, kind: str = "elementwise") -> list[Group]:
        """Groups of ``kind`` that read an input ``op`` reads, over ``op``'s iteration
        space: its result's shape for elementwise groups, the shape it reduces for row
        groups (one multi-output region then reads the input once: a row sum and a row
        min of ``x``)."""
        shape = _shape(op.operands[0] if kind == "rows" else op.results[0])
        out: list[Group] = []
        for base in self.outside_inputs(op):
            for g in self.readers.get(base, []):
                if g.kind == kind and g.shape == shape and g not in out:
                    out.append(g)
        return out

    def can_merge(self, a: Group, b: Group) -> bool:
        """Whether elementwise groups ``a`` and ``b`` of one shape can be one region."""
        if len(a.ops) + len(b.ops) > self.max_ops:
            return False
        for h in self.groups:
            if h is not a and h is not b and (
                    (h in a.deps and b in h.deps) or (h in b.deps and a in h.deps)):
                return False  # a → h → b: one region would read itself through h
        for x, y in ((a, b), (b, a)):
            for op in x.ops:
                for other, chain in self.producer_groups(op):
                    if other is y and any(c.op_name == "prim.reshape" or (
                            c.op_name in INDEX_OPS and c.op_name != "prim.broadcast")
                            for c in chain):
                        return False  # another element of the region, or its buffer
        return True

    def merge(self, a: Group, b: Group) -> None:
        """Move the ops of ``a`` into ``b`` and drop ``a``."""
        for op in a.ops:
            self.group_of[op] = b
        b.ops = sorted(b.ops + a.ops, key=self.order.__getitem__)
        b.deps = (a.deps | b.deps) - {a, b}
        self.groups.remove(a)
        for h in self.groups:
            if a in h.deps:
                h.deps.discard(a)
                h.deps.add(b)
            if b in h.deps and h is not b:
                h.deps |= b.deps
        for readers in self.readers.values():
            if a in readers:
                readers.remove(a)
                if b not in readers:
                    readers.append(b)

    def place_reduce(self, op: Operation) -> None:
        row = _shape(op.operands[0])
        if self.fuse:
            for g, chain in self.producer_groups(op):
                if g.kind == "rows" and g.shape == row and self.can_join(op, g):
                    self.add(op, g)
                    self.ctx.stat("fused-reductions")
                    return
                if g.kind == "elementwise" and g.shape == row and not chain:
                    h = self.sibling_rows(g, row)
                    if h is not None:  # the prologue and the reduction join h
                        self.merge(g, h)
                        self.add(op, h)
                        self.ctx.stat("fused-sibling-prologues")
                        return
                    g.kind, g.shape = "rows", row
                    if self.can_join(op, g):
                        self.add(op, g)
                        self.ctx.stat("fused-prologues")
                        return
                    g.kind = "elementwise"
            for g in self.siblings(op, "rows"):
                if self.can_join(op, g):
                    self.add(op, g)
                    self.ctx.stat("fused-sibling-reductions")
                    return
        self.new_group("rows", row, op)

    def sibling_rows(self, g: Group, row: tuple[int, ...]) -> Group | None:
        """A row group over ``row`` that reads an input of elementwise group ``g`` (of that
        shape) and can take ``g`` and one reduction of it: a row sum of ``cast(x)`` and a
        row sum of ``x`` are then one launch reading ``x`` once (a half mean's first level
        beside the row sum). As for a merge of elementwise groups (:meth:`can_merge`),
        neither may read the other through a reshape or an index map (one region would
        read its own output) or through a third group."""
        for h in [h for op in g.ops for h in self.siblings(op, "rows")]:
            if h.shape == row and h is not g and len(g.ops) + len(h.ops) < self.max_ops \
                    and self.can_merge(g, h):
                return h
        return None

    def materialize_results(self) -> None:
        ret = self.func.body.terminator
        assert isinstance(ret, ReturnOp)
        claimed: set[Value] = set()
        for v in ret.operands:
            self.store_transposed(v)
            base = prim.view_source(v)  # a returned reshape is a view of its region output
            g = self.group_of_value(base)
            if g is not None and base not in claimed and g.copy_of is None:
                claimed.add(base)
                self.result_sources.append(None)
                continue
            copy = self.new_group("elementwise", _shape(v), None)
            copy.copy_of = v
            self.result_sources.append(copy)
            for base, _ in self.bases(v):
                bg = self.group_of_value(base)
                if bg is not None:
                    copy.deps.add(bg)
                    copy.deps |= bg.deps
            self.ctx.stat("result-copies")

    def store_transposed(self, v: Value) -> None:
        """A returned transpose of a row group's full-width value is stored by that
        group through the permutation (a column softmax writes its result in place,
        not a transposed copy that a second launch transposes back)."""
        if not self.fuse or not isinstance(v, OpResult) or v.op.op_name != "prim.transpose" \
                or v.op in self.group_of:
            return
        src = v.op.operands[0]
        g = self.group_of_value(src)
        if g is None or g.kind != "rows" or g.copy_of is not None or _shape(src) != g.shape:
            return
        if len(g.ops) >= self.max_ops:
            return
        self.add(v.op, g)
        self.ctx.stat("transposed-stores")

    # ---------------------------------------------------------------- building
    def used_outside(self, v: Value, g: Group) -> bool:
        for user, _ in v.uses:
            if user in g.ops:
                continue
            if self.free(user) and user not in self.group_of:
                if any(self.used_outside(r, g) for r in user.results):
                    return True
                continue
            return True
        return False

    def build(self) -> None:
        """Rebuild the function body: regions and reshapes in dependency order."""
        old = self.func.body
        ret = old.terminator
        assert isinstance(ret, ReturnOp)
        new = Block([a.type for a in old.args], [a.loc for a in old.args])
        avail: dict[Value, Value] = dict(zip(old.args, new.args))
        result_of_copy: dict[Group, Value] = {}
        pending = [g for g in self.groups if g.ops or g.copy_of is not None]
        reshapes = [op for op in old.ops if op.op_name == "prim.reshape"]
        index = {id(op): i for i, op in enumerate(old.ops)}

        def ready(g: Group) -> bool:
            return all(b in avail for b in self.group_inputs(g))

        while pending or reshapes:
            progressed = False
            for op in list(reshapes):
                if op.operands[0] in avail:
                    r = Operation.create("prim.reshape", [avail[op.operands[0]]],
                                         op.result_types, op.attributes, op.properties, (),
                                         op.loc)
                    new.append(r)
                    avail[op.results[0]] = r.results[0]
                    reshapes.remove(op)
                    progressed = True
            for g in sorted(pending, key=lambda g: index.get(id(g.ops[0]), 1 << 30)
                            if g.ops else 1 << 30):
                if ready(g):
                    outs = self.emit_region(g, new, avail)
                    if g.copy_of is not None:
                        result_of_copy[g] = outs[0]
                    pending.remove(g)
                    progressed = True
                    break
            if not progressed:
                raise AssertionError("dispatch regions depend on each other")
        results = [avail[v] if src is None else result_of_copy[src]
                   for v, src in zip(ret.operands, self.result_sources)]
        new.append(ReturnOp(results, loc=ret.loc))
        for op in reversed(list(old.ops)):  # the old body is dropped whole
            op._drop_operands()
        region = self.func.regions[0]
        region.blocks = []
        region.add_block(new)

    def group_inputs(self, g: Group) -> list[Value]:
        vals: list[Value] = []
        sources = [g.copy_of] if g.copy_of is not None else \
            [o for op in g.ops for o in op.operands]
        for operand in sources:
            for base, _ in self.bases(operand):
                if isinstance(base, OpResult) and base.op in g.ops:
                    continue
                if base not in vals:
                    vals.append(base)
        return vals

    def emit_region(self, g: Group, new: Block, avail: dict[Value, Value]) -> list[Value]:
        inputs = self.group_inputs(g)
        body = Block([v.type for v in inputs])
        inner: dict[Value, Value] = dict(zip(inputs, body.args))

        def resolve(v: Value) -> Value:
            if v in inner:
                return inner[v]
            assert isinstance(v, OpResult), "unresolved region operand"
            clone = Operation.create(v.op.op_name, [resolve(o) for o in v.op.operands],
                                     v.op.result_types, v.op.attributes, v.op.properties, (),
                                     v.op.loc)
            body.append(clone)
            for r, cr in zip(v.op.results, clone.results):
                inner[r] = cr
            return inner[v]

        if g.copy_of is not None:
            outputs_orig = [g.copy_of]
            yielded = [resolve(g.copy_of)]
        else:
            for op in g.ops:
                resolve(op.results[0]) if op.results else None
            outputs_orig = [r for op in g.ops for r in op.results if self.used_outside(r, g)]
            yielded = [inner[v] for v in outputs_orig]
        body.append(YieldOp(yielded))
        shape = g.shape
        attrs = {"kind": StringAttr(g.kind), "iteration": DenseArrayAttr(tuple(shape)),
                 "split": StringAttr(SPLITS[g.kind]),
                 "work_items": IntegerAttr(self.work_items(g))}
        if g.kind == "matmul":
            mm = next(op for op in g.ops if op.op_name == "prim.matmul")
            attrs["contraction"] = IntegerAttr(_shape(mm.operands[0])[-1])
        if g.attention is not None:
            attrs["contraction"] = IntegerAttr(g.attention.d)
            attrs["keys"] = IntegerAttr(g.attention.n)
        region = RegionOp([avail[v] for v in inputs], [v.type for v in outputs_orig], attrs,
                          regions=[Region([body])],
                          loc=g.ops[0].loc if g.ops else self.func.loc)
        new.append(region)
        for v, r in zip(outputs_orig, region.results):
            if g.copy_of is None:
                avail[v] = r
        self.ctx.stat(f"{g.kind}-regions")
        return list(region.results)

    @staticmethod
    def work_items(g: Group) -> int:
        if g.kind == "rows":
            return math.prod(g.shape[:-1])
        if g.kind == "matmul":
            return math.prod(g.shape[:-2]) if len(g.shape) > 2 else 1
        if g.kind == "attention":
            return math.prod(g.shape[:-1])  # query rows
        return math.prod(g.shape)


@dataclass(frozen=True)
class FormDispatchRegions(Pass):
    """Group prim ops into ``dispatch.region`` ops (see the module docstring)."""

    name = "form-dispatch-regions"
    fuse: bool = True
    max_region_ops: int = 128
    fuse_attention: bool = True
    """One ``attention`` region for each ``softmax(q·kᵀ·c)·v`` chain (with ``fuse``)."""

    def apply(self, ctx: PassContext, module: Operation) -> None:
        for op in list(module.body.ops):
            if isinstance(op, FuncOp):
                former = _Former(op, self.fuse, self.max_region_ops, ctx, self.fuse_attention)
                former.form()
                former.build()


@dataclass(frozen=True)
class MaterializeResults(Pass):
    """Check that every function result is a distinct region output, or a reshape of one
    (one buffer each: the memory stage makes the output a view of the result's buffer)."""

    name = "materialize-results"
    preserves = frozenset({"*"})

    def apply(self, ctx: PassContext, module: Operation) -> None:
        from accy.errors import VerifyError

        for func in module.body.ops:
            if not isinstance(func, FuncOp):
                continue
            seen: set[Value] = set()
            for v in func.return_op.operands:
                base = prim.view_source(v)
                if isinstance(base, BlockArgument) or \
                        not isinstance(getattr(base, "op", None), RegionOp) or base in seen:
                    raise VerifyError("a function result is not a distinct dispatch output",
                                      func.return_op.loc)
                seen.add(base)
                if base is not v:
                    ctx.stat("result-views")
            ctx.stat("results", len(seen))
