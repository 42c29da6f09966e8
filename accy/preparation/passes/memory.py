"""Memory stage: plan the global buffers of every function.

Every tensor that crosses a dispatch boundary gets a buffer:

- function arguments are ``arg`` buffers (the caller's), function results
  ``result`` buffers (allocated per call); a result that is a reshape of a
  region output (a row sum without its kept axis) makes that output a view
  (``alias``) of the result's buffer, so the region writes the result itself;
- every other region output lives in one workspace **arena** at an aligned
  offset; liveness over the launch order lets a dead buffer's bytes be reused
  (best fit, coalescing freed neighbours);
- an elementwise or row region may write an output **in place** over an input
  that dies there, when both have the same shape and dtype and the input is
  read only at the element being written (no index map, reduction or matmul
  reads it);
- a ``prim.reshape`` is a view: it aliases its input's buffer.

The plan is written as attributes (``memory.buffers`` and
``memory.arena_bytes`` on the function; ``memory.inputs`` /
``memory.outputs`` on regions; ``memory.buffer`` on reshapes), which the
kernel stage turns into launch arguments. Shared-memory scratch is the kernel
stage's: it knows the block size.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from accy.choir.attributes import (
    DenseArrayAttr,
    IntegerAttr,
    TensorType,
)
from accy.choir.builtin import FuncOp
from accy.choir.ir import BlockArgument, Operation, OpResult, Value
from accy.choir.passes import Pass, PassContext
from accy.dialects import prim
from accy.dialects.dispatch import RegionOp
from accy.dialects.memory import BufferSpec, plan_attr

IDENTITY_READERS = prim.ELEMENTWISE_OPS
"""Ops that read element i of each operand to make element i (the declared trait)."""


def row_major_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    return tuple(strides)


@dataclass
class Buffer:
    id: int
    kind: str  # "arg" | "result" | "arena" | "alias"
    type: TensorType
    index: int = -1
    offset: int = -1
    alias_of: int = -1
    inplace_of: int = -1
    last_use: int = -1

    @property
    def nbytes(self) -> int:
        return self.type.nbytes

    def spec(self, alignment: int) -> BufferSpec:
        """The buffer as the plan declares it (:class:`accy.dialects.memory.BufferSpec`)."""
        shape = tuple(int(d) for d in self.type.shape)  # type: ignore[arg-type]
        return BufferSpec(
            id=self.id, kind=self.kind, bytes=self.nbytes, dtype=self.type.element.name,
            shape=shape, strides=row_major_strides(shape),
            index=self.index if self.kind in ("arg", "result") else -1,
            offset=self.offset if self.kind == "arena" else -1,
            alignment=alignment if self.kind == "arena" else -1,
            alias_of=self.alias_of, inplace_of=self.inplace_of)


class Arena:
    """Best-fit allocation of aligned blocks with freeing and coalescing."""

    def __init__(self, alignment: int, reuse: bool) -> None:
        self.alignment = alignment
        self.reuse = reuse
        self.free: list[tuple[int, int]] = []  # (offset, size)
        self.top = 0

    def _align(self, n: int) -> int:
        return (n + self.alignment - 1) // self.alignment * self.alignment

    def alloc(self, nbytes: int) -> int:
        size = self._align(max(nbytes, 1))
        if self.reuse:
            fits = [(s, o) for o, s in self.free if s >= size]
            if fits:
                s, o = min(fits)
                self.free.remove((o, s))
                if s > size:
                    self.free.append((o + size, s - size))
                return o
        off = self.top
        self.top += size
        return off

    def release(self, offset: int, nbytes: int) -> None:
        if not self.reuse:
            return
        self.free.append((offset, self._align(max(nbytes, 1))))
        self.free.sort()
        merged: list[tuple[int, int]] = []
        for o, s in self.free:
            if merged and merged[-1][0] + merged[-1][1] == o:
                merged[-1] = (merged[-1][0], merged[-1][1] + s)
            else:
                merged.append((o, s))
        if merged and merged[-1][0] + merged[-1][1] == self.top:  # give back the tail
            self.top = merged[-1][0]
            merged.pop()
        self.free = merged


def _reads_identically(region: RegionOp, arg_index: int) -> bool:
    """The region reads input ``arg_index`` only at the element it writes.

    Every value computed from the input counts: ``exp(x)`` read through a
    transpose reads ``x`` at the transposed element.
    """
    arg = region.body.args[arg_index]
    shape = tuple(region.iteration)
    if tuple(arg.type.shape) != shape:  # type: ignore[attr-defined]  # a tensor-typed value
        return False
    values: list[Value] = [arg]
    seen: set[int] = set()
    while values:
        for user, _ in values.pop().uses:
            if user.op_name == "dispatch.yield":
                continue
            if user.op_name == "prim.reduce" and region.kind == "rows":
                continue  # a row statistic: computed before the row is written
            if user.op_name not in IDENTITY_READERS:
                return False
            if id(user) not in seen:
                seen.add(id(user))
                values.extend(user.results)
    return True


@dataclass(frozen=True)
class PlanBuffers(Pass):
    """Assign every cross-dispatch tensor a buffer (see the module docstring)."""

    name = "plan-buffers"
    reuse: bool = True
    inplace: bool = True
    alignment: int = 256

    def apply(self, ctx: PassContext, module: Operation) -> None:
        for func in module.body.ops:
            if isinstance(func, FuncOp):
                self.plan(ctx, func)

    def plan(self, ctx: PassContext, func: FuncOp) -> None:
        """Plan ``func``'s buffers: create them, find their last uses, place them in order."""
        ops = func.body.ops
        buffers, buf_of = _create_buffers(func)

        def root(b: Buffer) -> Buffer:
            while b.alias_of >= 0:
                b = buffers[b.alias_of]
            return b

        # liveness: the last op index that reads each buffer (through aliases)
        for idx, op in enumerate(ops):
            for v in op.operands:
                rb = root(buf_of[v])
                rb.last_use = max(rb.last_use, idx)

        arena = Arena(self.alignment, self.reuse)
        live: list[Buffer] = []
        for idx, op in enumerate(ops):
            if isinstance(op, RegionOp):
                self.place_outputs(ctx, op, idx, buf_of, root, arena, live)
            elif op.op_name == "prim.reshape":
                op.attributes["memory.buffer"] = IntegerAttr(buf_of[op.results[0]].id)
            # free what dies here
            for b in list(live):
                if b.last_use <= idx:
                    arena.release(b.offset, b.nbytes)
                    live.remove(b)
                    if self.reuse:
                        ctx.stat("released")
        func.attributes["memory.buffers"] = plan_attr([b.spec(self.alignment)
                                                        for b in buffers])
        func.attributes["memory.arena_bytes"] = IntegerAttr(arena_size(buffers, self.alignment))
        ctx.stat("buffers", len(buffers))

    def place_outputs(self, ctx: PassContext, region: RegionOp, idx: int,
                      buf_of: dict[Value, Buffer], root: Callable[[Buffer], Buffer],
                      arena: Arena, live: list[Buffer]) -> None:
        """Place the region's arena outputs (in place over a donor, or in the arena); annotate it."""
        donated: set[int] = set()
        for r in region.results:
            b = buf_of[r]
            if b.kind != "arena":
                continue
            donor = self.donor(region, r, buf_of, root, idx, donated) if self.inplace \
                else None
            if donor is not None:
                b.offset, b.inplace_of = donor.offset, donor.id
                donated.add(donor.id)
                live.remove(donor)
                b.last_use = max(b.last_use, idx)
                live.append(b)
                ctx.stat("inplace")
                continue
            b.offset = arena.alloc(b.nbytes)
            live.append(b)
            ctx.stat("arena-buffers")
        region.attributes["memory.inputs"] = DenseArrayAttr(
            tuple(buf_of[v].id for v in region.operands))
        region.attributes["memory.outputs"] = DenseArrayAttr(
            tuple(buf_of[r].id for r in region.results))

    def donor(self, region: RegionOp, out: OpResult, buf_of: dict[Value, Buffer], root,  # type: ignore[no-untyped-def]
              idx: int, donated: set[int]) -> Buffer | None:
        if region.kind not in ("elementwise", "rows"):
            return None
        if tuple(out.type.shape) != tuple(region.iteration):  # type: ignore[attr-defined]  # a tensor-typed value
            return None
        yielded = region.body.terminator.operands[out.index]  # type: ignore[union-attr]
        if isinstance(yielded, OpResult) and yielded.op.op_name == "prim.transpose":
            return None  # stored through a permutation: other rows still read those bytes
        for i, v in enumerate(region.operands):
            b = buf_of[v]
            if isinstance(v, BlockArgument) or b.kind != "arena" or b.id in donated:
                continue
            if root(b) is not b or b.last_use != idx or b.type != out.type:
                continue
            if region.operands.count(v) != 1 or not _reads_identically(region, i):
                continue
            if any(root(buf_of[w]) is b for w in region.operands if w is not v):
                continue  # another input is a view of the same bytes
            return b
        return None


def _create_buffers(func: FuncOp) -> tuple[list[Buffer], dict[Value, Buffer]]:
    """One buffer per argument, op result and reshape view, in program order; value -> buffer."""
    block = func.body
    buffers: list[Buffer] = []
    buf_of: dict[Value, Buffer] = {}
    returned = func.return_op.operands
    results = {v: i for i, v in enumerate(returned)}
    viewed = {base: i for i, v in enumerate(returned)
              if (base := prim.view_source(v)) is not v}
    """Region outputs that results are reshapes of → the result (the dispatch stage's
    materialize-results: distinct, and none of them is returned itself)."""
    for i, a in enumerate(block.args):
        b = Buffer(len(buffers), "arg", a.type, index=i)  # type: ignore[arg-type]
        buffers.append(b)
        buf_of[a] = b
    for op in block.ops:
        for r in op.results:
            if op.op_name == "prim.reshape":
                continue
            if r in viewed:  # the result's buffer, and this output a view of it
                i = viewed[r]
                res = Buffer(len(buffers), "result", returned[i].type, index=i)  # type: ignore[arg-type]
                buffers.append(res)
                b = Buffer(len(buffers), "alias", r.type, alias_of=res.id)  # type: ignore[arg-type]
            else:
                kind = "result" if r in results else "arena"
                b = Buffer(len(buffers), kind, r.type, index=results.get(r, -1))  # type: ignore
            buffers.append(b)
            buf_of[r] = b
        if op.op_name == "prim.reshape":
            src = buf_of[op.operands[0]]
            b = Buffer(len(buffers), "alias", op.results[0].type,  # type: ignore[arg-type]
                       alias_of=src.id)
            buffers.append(b)
            buf_of[op.results[0]] = b
    return buffers, buf_of


def arena_size(buffers: list[Buffer], alignment: int) -> int:
    end = 0
    for b in buffers:
        if b.kind == "arena":
            end = max(end, b.offset + math.ceil(b.nbytes / alignment) * alignment)
    return end
