"""The ``kernel`` dialect: kernels with their loop nest, thread mapping and launch.

- ``kernel.func`` (a module-level symbol) holds one dispatch's body (``prim``
  ops over its inputs, ending in ``kernel.yield``) and the plan the kernel
  stage made for it: ``mapping`` (``grid-stride``, ``block-per-row``,
  ``warp-per-row``, ``tiled``, ``ffma-tiled`` (register-blocked f32),
  ``mma-tiled`` / ``wgmma-tiled`` (tensor cores), ``flash`` (attention with an online
  softmax over key tiles), or ``loop`` on the host), the block
  and grid
  shapes, the vector width, items per thread, which inputs are cached in
  registers, tile sizes and shared-memory bytes;
- ``kernel.launch`` replaces the dispatch in the host function: it names the
  kernel (``@symbol``) and carries the buffers it reads and writes.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

from accy.choir.attributes import (
    Attribute,
    DenseArrayAttr,
    IntegerAttr,
    StringAttr,
    SymbolRefAttr,
)
from accy.choir.ir import Operation
from accy.errors import VerifyError

MAPPINGS = ("grid-stride", "block-per-row", "warp-per-row", "thread-per-row", "tiled",
            "ffma-tiled", "mma-tiled", "wgmma-tiled", "flash", "loop")
KINDS = ("elementwise", "rows", "matmul", "attention")
ARCH_SPECIFIC_MAPPINGS = frozenset({"wgmma-tiled"})
"""Mappings whose kernels compile only for an arch-specific target (``cuda:sm_90a``)."""
ROW_PARTIAL_SETS = 2
"""``block-per-row``: the sets of shared slots, one an 8-byte partial for each warp of a
block at most (1024 threads: 32 warps), that its reductions use in turn, so each needs
one barrier (the planner sizes ``shared_bytes`` with it, the renderer finds a set in
it)."""

FFMA_A_PAD = 4
"""``ffma-tiled``: floats after each k-row of the transposed A tile in shared memory
(the planner sizes ``shared_bytes`` with it, the renderer lays the tile out by it): the
float4 loads of two k-chunks of 16 rows then store into 32 distinct banks, and the
rows stay 16-byte aligned for the float4 reads."""

ATTENTION_PAD = 4
"""``flash``: floats after each row of the Q and K tiles (and of the transposed P tile)
in shared memory: rows 16 bytes aligned for float4 reads, and 8 rows read at one
column by a quarter-warp fall in 8 distinct 16-byte bank groups."""


def attention_shared_floats(bm: int, bn: int, d: int, dv: int) -> tuple[int, int, int]:
    """``flash``: the floats of its three shared tiles, (Q, K-then-P, V): ``bm`` query rows
    of ``d`` (padded to 4, then :data:`ATTENTION_PAD`), ``bn`` keys of it (later the
    probabilities transposed, ``bn`` × ``bm``: they reuse K's tile) and ``bn`` rows of V
    (``dv`` padded to 4). The planner sizes ``dynamic_shared`` with it, the renderer lays
    the tiles out by it."""
    dp, dvp = -(-d // 4) * 4, -(-dv // 4) * 4
    return (bm * (dp + ATTENTION_PAD), bn * max(dp + ATTENTION_PAD, bm + ATTENTION_PAD),
            bn * dvp)


@dataclass(frozen=True)
class KernelPlan:
    """What the kernel stage decided for one kernel: the declared plan fields.

    A ``kernel.func`` carries these as attributes of the same names; reading them
    back (:meth:`of`) is a verify error for a missing required field, a field of
    the wrong type or an attribute that is no plan field (a misspelling), so no
    reader ever sees a silent default. The renderers spell what this says.

    >>> KernelPlan.of_attributes({"kind": StringAttr("rows"), "mapping":
    ...     StringAttr("warp-per-row"), "iteration": DenseArrayAttr((8, 64)),
    ...     "block": DenseArrayAttr((256, 1, 1)), "grid": DenseArrayAttr((1, 1, 1)),
    ...     "vectr_width": IntegerAttr(4)})
    Traceback (most recent call last):
    ...
    accy.errors.VerifyError: 'kernel.func' has no plan field 'vectr_width' (fields: kind, mapping, iteration, block, grid, vector_width, shared_bytes, dynamic_shared, elements, rows, cols, rows_per_block, items, cached_inputs, aliased_params, tile, micro_tile, contraction, mma, stages, warps, warp_tile, tensor_maps, swizzle, packed_ops, unroll, min_blocks, raster, streams)
    """

    kind: str
    """The dispatch kind it implements: ``elementwise``, ``rows``, ``matmul`` or
    ``attention``."""
    mapping: str
    """``grid-stride``, ``block-per-row``, ``warp-per-row``, ``tiled``, ``ffma-tiled``,
    ``mma-tiled``, ``wgmma-tiled``, ``flash`` or ``loop``."""
    iteration: tuple[int, ...]
    """The dispatch's iteration space."""
    block: tuple[int, ...]
    """Threads per block (x, y, z)."""
    grid: tuple[int, ...]
    """Blocks per grid (x, y, z)."""
    vector_width: int = 1
    """Elements per vector load/store. ``thread-per-row``: the neighbouring rows a thread
    owns (rows that are columns in memory: its vector reads one element of each)."""
    shared_bytes: int = 0
    """Static shared memory the kernel uses."""
    dynamic_shared: int = 0
    """Dynamic shared memory the launch gives the kernel (bytes; the loader raises the
    kernel's limit to it)."""
    elements: int = 0
    """Elements a grid-stride loop covers."""
    rows: int = 0
    cols: int = 0
    """Row kernels: rows and the length of each row."""
    rows_per_block: int = 1
    items: int = 1
    """Row kernels: rows a block handles; vector items per thread per row.
    ``grid-stride``: 2 where a thread loads its next vector before it computes the
    current one (its loop pipelined), else 1.
    ``thread-per-row``: ``block / rows_per_block`` threads share a row (thread ``i`` of
    block ``b`` walks the ``vector_width`` rows from ``vector_width · (b · rows_per_block
    + i % rows_per_block)``, from element ``i / rows_per_block``, every
    ``block / rows_per_block``-th), their reductions combined through shared memory."""
    cached_inputs: tuple[int, ...] = ()
    """Row kernels: inputs held in registers across the row's passes."""
    aliased_params: tuple[int, ...] = ()
    """Parameters that share memory (in-place outputs, views): never ``restrict``."""
    tile: tuple[int, ...] = ()
    micro_tile: tuple[int, ...] = ()
    """Matmul: block tile (m, n, k) and each thread's micro-tile (m, n). ``ffma-tiled``:
    the micro-tile is sub-tiles of ``vector_width`` × ``vector_width`` outputs (float4
    shared reads), spaced ``tile · vector_width / micro_tile`` apart. ``flash``: the
    tile is (query rows, keys, head dim) a block and the micro-tile the (rows, scores)
    of a key tile each thread owns: rows ``ty · rows + r``, keys ``tx + 16 · c``
    (``ty``, ``tx`` = thread / 16, thread % 16)."""
    contraction: int = 0
    """Matmul: the contracted dimension; attention: the head dim of Q and K."""
    mma: str = ""
    """``mma-tiled``: the warp-level tensor-core instruction (``m16n8k16`` and its types,
    as PTX spells them after ``mma.sync.aligned.``: ``m16n8k16.row.col.f32.bf16.bf16.f32``);
    ``wgmma-tiled``: the warpgroup one after ``wgmma.mma_async.sync.aligned.``
    (``m64n128k16.f32.bf16.bf16``)."""
    stages: int = 0
    """``mma-tiled`` / ``wgmma-tiled``: shared-memory stages of the ``cp.async`` pipeline;
    ``ffma-tiled``: shared buffers (2: the next k-tile's loads in registers while one is
    multiplied); ``flash``: 2 when the next key tile's loads wait in registers while
    one is used, 1 when each tile is loaded as it is reached."""
    warps: tuple[int, ...] = ()
    warp_tile: tuple[int, ...] = ()
    """``mma-tiled``: warps of the block (m, n) and the outputs each warp owns (m, n);
    ``wgmma-tiled``: consumer warpgroups and the 64-row slices each one computes."""
    tensor_maps: tuple[int, ...] = ()
    """``wgmma-tiled``: the TMA tensor maps the loader encodes for the launch, five
    numbers each: the operand's position in the launch's buffers, its rows and columns
    (as 2-d), the box's rows and columns (128-byte swizzle); the kernel takes them, in
    order, after its buffers."""
    swizzle: tuple[int, ...] = ()
    """``mma-tiled``: the 16-byte-chunk XOR swizzle of the A and B tiles in shared memory,
    ``(a_shift, a_mask, b_shift, b_mask)``: a row ``r``'s chunk ``c`` sits at
    ``c ^ ((r >> shift) & mask)`` (``ldmatrix`` reads 8 rows free of bank conflicts)."""
    packed_ops: str = ""
    """``grid-stride`` vectors of halves, and the rows of a ``block-per-row`` or
    ``warp-per-row`` kernel read as such vectors: the f16/bf16 ops whose two adjacent lanes run
    as one instruction on a 32-bit word of two halves (``bf16.add bf16.max …``, the
    target's :func:`accy.target.packed.packed_ops`), each rounding as the f32 op
    rounded does; the kernel's other ops run in f32 a lane at a time."""
    unroll: int = 0
    """``ffma-tiled``: k steps of a shared stage unrolled together (0: all of them)."""
    min_blocks: int = 0
    """``grid-stride`` and row kernels: the blocks an SM must hold at once, the second
    number of the kernel's ``__launch_bounds__`` (a cap on its registers); 0: none."""
    raster: int = 1
    """``wgmma-tiled``: rows of tiles that consecutive blocks sweep together before moving
    along N (block ``b`` of the grid's x·y, in launch order, is tile row ``g·raster + b %
    span % rows``, tile column ``b % span / rows``, for group ``g = b / span``, ``span =
    raster · grid.x``, ``rows`` the group's rows, fewer in a last short group); 1:
    row-major."""
    streams: int = 1
    """``thread-per-row``: the runs the launch's blocks are dealt into, round robin: block
    ``b`` of a grid of ``n`` takes the tile ``s · (n / streams) + min(s, n % streams) + b
    / streams`` of run ``s = b % streams`` (:func:`accy.preparation.passes.kernel.
    stream_tile`); 1: tile ``b``."""

    def __post_init__(self) -> None:
        if self.mapping not in MAPPINGS:
            raise VerifyError(f"'kernel.func' mapping must be one of {', '.join(MAPPINGS)}")
        if self.kind not in KINDS:
            raise VerifyError(f"'kernel.func' kind must be one of {', '.join(KINDS)}")
        for key in ("block", "grid"):
            v = getattr(self, key)
            if len(v) != 3 or min(v) < 1:
                raise VerifyError(f"'kernel.func' needs '{key} = array<i64: x, y, z>'")

    @property
    def arch_specific(self) -> bool:
        """The kernel uses arch-specific instructions (``wgmma``): only an arch-specific
        target (``cuda:sm_90a``) compiles it."""
        return self.mapping in ARCH_SPECIFIC_MAPPINGS

    @staticmethod
    def of_attributes(attributes: dict[str, Attribute]) -> KernelPlan:
        """The plan held in a ``kernel.func``'s attributes (a ``VerifyError`` if it is
        not a well-formed plan)."""
        fields = _plan_fields()
        values: dict[str, Any] = {}
        for key, attr in attributes.items():
            if key not in fields:
                raise VerifyError(f"'kernel.func' has no plan field '{key}' (fields: "
                                  f"{', '.join(fields)})")
            want = fields[key]
            if want is str and isinstance(attr, StringAttr):
                values[key] = attr.value
            elif want is int and isinstance(attr, IntegerAttr):
                values[key] = attr.value
            elif want is tuple and isinstance(attr, DenseArrayAttr):
                values[key] = tuple(attr.values)
            else:
                raise VerifyError(f"'kernel.func' plan field '{key}' must be "
                                  f"{_SPELLING[want]}")
        missing = [f.name for f in dataclasses.fields(KernelPlan)
                   if f.default is dataclasses.MISSING and f.name not in values]
        if missing:
            raise VerifyError(f"'kernel.func' plan lacks {', '.join(missing)}")
        return KernelPlan(**values)

    def to_attributes(self, given: tuple[str, ...]) -> dict[str, Attribute]:
        """The attributes of the fields in ``given`` (the ones the planner set)."""
        out: dict[str, Attribute] = {}
        for name in given:
            v = getattr(self, name)
            out[name] = StringAttr(v) if isinstance(v, str) else \
                DenseArrayAttr(tuple(int(x) for x in v)) if isinstance(v, tuple) else \
                IntegerAttr(int(v))
        return out


_SPELLING = {str: "a string", int: "an integer", tuple: "an array<i64: …>"}


@functools.cache
def _plan_fields() -> dict[str, type]:
    kinds = {"str": str, "int": int}
    return {f.name: kinds.get(str(f.type), tuple) for f in dataclasses.fields(KernelPlan)}


class KernelFuncOp(Operation):
    """``kernel.func``: one kernel's body and its plan."""

    name = "kernel.func"
    num_operands = 0
    num_results = 0

    @property
    def sym_name(self) -> str:
        a = self.attr("sym_name")
        return a.value if isinstance(a, StringAttr) else ""

    @property
    def plan(self) -> KernelPlan:
        """The kernel stage's plan for this kernel (typed; see :class:`KernelPlan`)."""
        try:
            return KernelPlan.of_attributes(dict(self.attributes))
        except VerifyError as e:
            raise VerifyError(e.message, self.loc) from None

    def verify_(self) -> None:
        if not self.sym_name:
            raise VerifyError("'kernel.func' needs a 'sym_name'", self.loc)
        _ = self.plan
        if len(self.regions) != 1 or len(self.regions[0].blocks) != 1:
            raise VerifyError("'kernel.func' needs one region with one block", self.loc)
        if not isinstance(self.body.terminator, KernelYieldOp):
            raise VerifyError("'kernel.func' must end with 'kernel.yield'", self.loc)


class KernelYieldOp(Operation):
    """``kernel.yield``: the values a kernel writes."""

    name = "kernel.yield"
    num_results = 0
    traits = frozenset({"terminator"})


class LaunchOp(Operation):
    """``kernel.launch``: run ``kernel`` on buffers (``memory.inputs`` / ``memory.outputs``)."""

    name = "kernel.launch"

    @property
    def kernel(self) -> str:
        a = self.attr("kernel")
        return a.name if isinstance(a, SymbolRefAttr) else ""

    def verify_(self) -> None:
        if not self.kernel:
            raise VerifyError("'kernel.launch' needs 'kernel = @name'", self.loc)
