"""Kernel stage: the loop nest and thread mapping of every dispatch.

For each ``dispatch.region`` a ``kernel.func`` is made (its body moves there)
and a ``kernel.launch`` takes the region's place in the host function. The
plan, per kind, for CUDA:

- elementwise: a **grid-stride** loop, ``vector_width`` elements per
  iteration (16-byte loads/stores when every buffer is a float (f32, f16,
  bf16) and the innermost dimension divides: 4 f32 or 8 halves an access,
  math in f32, but for the half ops the arch runs two lanes an instruction:
  ``packed_ops``), ``block_size`` threads, a vector a thread up to 4096 blocks, then
  two (at most 16384 blocks: :func:`elementwise_grid`; with ``prefetch`` a thread
  loads its next vector before it computes the current one);
- rows: a **block per row** (a warp per row when a row is short: at most
  ``32 · vector_width · 8`` elements), each thread owning the same columns in
  every phase, so inputs read at their own element are **cached in
  registers** once (up to 32 values a thread) and reductions run as
  warp-shuffle trees (then across warps through shared memory);
- matmul: bf16/f16 on Hopper's **warpgroup tensor cores** (``wgmma-tiled``:
  ``wgmma.mma_async`` m64nNk16 from 128-byte-swizzled shared tiles the TMA loads
  for a producer warpgroup, two consumer warpgroups a block) when the shapes
  divide its tiles on ``cuda:sm_90a``; else on the **tensor cores** (``mma-tiled``: warp-level
  ``mma.sync`` m16n8k16 with f32 accumulators, operands staged through a
  ``cp.async`` pipeline of ``stages`` swizzled shared-memory tiles and read
  with ``ldmatrix``) when the shapes divide its tiles; f32 with plain row-major
  operands whose shapes divide its tiles on the register-blocked **ffma-tiled**
  kernel (``ffma_tile_m × ffma_tile_n`` outputs a block, 8×8 a thread, float4
  loads, A staged transposed, two shared buffers: the next tile's loads in flight
  while the current one is multiplied); otherwise **tiled** through shared
  memory, ``tile_m × tile_n`` outputs a block, ``tile_k`` deep, 4×4 outputs a
  thread, operands read element by element through any fused expression. Each
  applies the epilogue in registers;
- attention: the **flash** kernel — a block owns ``attention_tile_m`` query rows of
  one batch index (its Q tile in shared memory) and walks the keys in tiles of
  ``attention_tile_n`` (K and V tiles staged through shared memory, the next tile's
  loads in registers while one is used), keeping each row's running max and sum
  (an online softmax) and its output row in registers; the scores never reach
  global memory. Tiles shrink (keys first) until they fit the target's shared
  memory (dynamic shared memory, above 48 KB opted in by the loader).

For the host target every kernel is a plain loop nest (``mapping = "loop"``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from accy.choir.attributes import (
    Attribute,
    DenseArrayAttr,
    IntegerAttr,
    StringAttr,
    SymbolRefAttr,
    TensorType,
)
from accy.choir.builtin import FuncOp
from accy.choir.ir import Block, Operation, OpResult, Value
from accy.choir.passes import Pass, PassContext
from accy.dialects.attention import match_in
from accy.dialects.dispatch import RegionOp
from accy.dialects.kernel import (
    FFMA_A_PAD,
    ROW_PARTIAL_SETS,
    KernelFuncOp,
    KernelYieldOp,
    LaunchOp,
    attention_shared_floats,
)
from accy.dialects.memory import buffer_plan
from accy.preparation.options import (
    WGMMA_TILE_K,
    WGMMA_WAVE,
    KernelOptions,
    wgmma_shared_bytes,
    wgmma_tiles,
)
from accy.preparation.passes.memory import IDENTITY_READERS
from accy.target.packed import packed_ops

BLOCK_SIZE = 256
"""Threads a block where ``kernel.block_size`` is 0 (picked), but for row kernels whose
row takes a block (:func:`row_block_size`)."""
ROW_VALUES_PER_THREAD = 8
"""The values of its row a thread of an f32 block-per-row kernel holds (512 threads for
rows of 4096). On the H200 (softmax, layernorm and the dynamic row program, rows of 2048
to 16384 values, 128 to 1024 threads; RESULTS.md "Eleventh session") that was the
fastest block size, or within 2 % of it, at every row length. Rows of halves take
:data:`BLOCK_SIZE`, or :data:`CHAINED_HALF_BLOCK` where one reduction reads another's
result: at 4096 values 128 threads (32 a thread) made softmax and the dynamic program
8–17 % faster but rmsnorm (one reduction) up to 3 % slower, and 512 threads (8 a thread)
made the reductions program (sibling reductions) 20 % slower."""
CHAINED_HALF_BLOCK = 128
"""Threads of a block-per-row kernel over halves whose reductions form a chain (a
reduction of a value that another reduction's result feeds: softmax's sum after its
max, layernorm's variance after its mean): each link waits at a block-wide barrier for
a tree over the block's warps, and four warps wait less than eight. On the H200
(RESULTS.md "Eighteenth session", rows of 4096, 128 against 256 threads) the dynamic
program ran 14–17 % faster, layernorm 1 % faster, rmsnorm (one reduction) 0.5 % slower."""
MIN_GRID_BLOCKS = 4096
MAX_GRID_BLOCKS = 16384
"""An elementwise grid: a vector a thread up to ``MIN_GRID_BLOCKS`` blocks, then two
vectors a thread (a grid-stride loop of two steps; with ``prefetch`` the second
vector's loads are issued before the first is computed), at most ``MAX_GRID_BLOCKS``. On the
H200 (256 threads, three sizes of four programs in f32 and bf16, RESULTS.md "Eleventh
session") a grid of at most 4096 blocks left 1–5 % of the copy rate behind at 8192×4096
and larger, a vector a thread lost 1–7 % from 8192 rows of 4096 up, and this rule was
within 2 % of the best grid measured at every size."""
MAX_CACHED_PER_THREAD = 32
MAX_THREAD_CACHED = 2 * MAX_CACHED_PER_THREAD
"""The longest row a ``thread-per-row`` thread holds in registers (64 values: the
register file of a 256-thread block at 255 registers a thread still has room for the
row and the expression temporaries); longer rows are read again in each phase."""
MAX_THREAD_ROW = 256
"""The longest row a thread walks alone (``thread-per-row``, rows that are columns)."""
MIN_THREAD_ROWS = 16384
"""Fewer rows than this keep a warp per row: a thread per row would leave the GPU idle."""
COLUMN_SPLIT_ITEMS = 16
"""The most elements of a row one ``thread-per-row`` thread walks where ``column_split``
is picked (:func:`column_split`)."""
MAX_COLUMN_SPLIT = 8
"""The most threads that share a ``thread-per-row`` row where ``column_split`` is picked
(and that :func:`column_vector` counts on)."""
PICKED_COLUMN_VECTOR = 2
"""The rows (columns in memory) a ``thread-per-row`` thread owns where
``column_vector`` is picked (:func:`column_layout`)."""
COLUMN_STREAMS = 8
"""The runs a ``thread-per-row`` kernel's blocks are dealt into where
``kernel.column_streams`` is picked (:func:`stream_tile`). On an H100 (64 × 524288 f32,
hand-written kernels of the column softmax's layout, RESULTS.md, kernels, thirty-first
session) the blocks in launch order read 92.4–92.9 % of a copy of the same bytes, 8 runs
95.0 %, 64 runs 94.7 %; a kernel that only loads and stores in that layout 92.4 % /
95.9 % / 94.2 %: the order of the tiles, not the math, held it back. accy's kernels on
another H100, two rounds: the f32 column softmax 94.9 / 95.7 % in launch order, 96.3 /
96.2 % in 8 runs (16: 96.4 / 96.4, but bf16 93.1 / 94.5); bf16 and f16 within a round's
spread; the reductions' column max +2–4 % in halves, +1.5 % in f32. On the H200 (thirty-
second session, two rounds) 8 runs against launch order gained only 0.1–0.4 % (f32
93.3–93.4 %, halves 91.5–91.7 %), and 64 runs no more."""
PICKED_COLUMN_VALUES = 32
"""The most values of its rows a ``thread-per-row`` thread walks where
``column_vector`` is picked: past them, one row a thread (:func:`column_layout`)."""


SM_REGISTERS = 65536
"""32-bit registers of an SM (every CUDA arch accy targets)."""
MAX_REGISTERS = 255
"""The most registers a thread may have: ``kernel.max_registers`` at this is no cap."""


def min_blocks(threads: int, max_registers: int) -> int:
    """The blocks of ``threads`` an SM must hold at once (``__launch_bounds__``' second
    number, 0: none) for a thread to take at most ``max_registers`` (the option; 0 or
    :data:`MAX_REGISTERS`: no cap, ptxas takes what it likes).

    A cap was the default for f32 elementwise kernels and row kernels holding few values
    of their row in the twenty-fourth session (32 registers, a full SM: ptxas gave the
    f32 dynamic program 33, three blocks of 512 an SM for four). Timed on an H100 in the
    twenty-fifth session it made no program faster, nor did 64 for the half row kernels
    (71 registers for layernorm bf16), so no kernel is capped unless asked (RESULTS.md,
    kernels, "Twenty-fifth session").

    >>> min_blocks(512, 32), min_blocks(256, 32), min_blocks(256, 0)
    (4, 8, 0)
    >>> min_blocks(256, 40), min_blocks(128, 255), min_blocks(128, 254)
    (6, 0, 2)
    """
    if not max_registers or max_registers >= MAX_REGISTERS:
        return 0
    blocks = SM_REGISTERS // (threads * max_registers)
    return blocks if blocks > 1 else 0


def _element_names(region: RegionOp) -> set[str]:
    """The element types of ``region``'s buffers (``""`` for a value that is no tensor)."""
    types = [v.type for v in region.operands] + list(region.result_types)
    return {t.element.name if isinstance(t, TensorType) else "" for t in types}


def _floats_only(region: RegionOp) -> bool:
    """Every buffer of ``region`` holds f32."""
    return _element_names(region) == {"f32"}


def elementwise_grid(vectors: int, block: int) -> int:
    """The blocks of a ``grid-stride`` kernel over ``vectors`` vectors, ``block`` threads
    a block: a vector a thread up to :data:`MIN_GRID_BLOCKS` blocks, then two, at most
    :data:`MAX_GRID_BLOCKS` blocks.

    >>> elementwise_grid(8192 * 1024, 256), elementwise_grid(4096 * 256, 256)
    (16384, 4096)
    >>> elementwise_grid(4096 * 256 + 1, 256), elementwise_grid(10**9, 256)
    (4096, 16384)
    """
    blocks = max(1, math.ceil(vectors / block))
    if blocks <= MIN_GRID_BLOCKS:
        return blocks
    return min(MAX_GRID_BLOCKS, max(MIN_GRID_BLOCKS, math.ceil(blocks / 2)))


def column_split(cols: int, block: int, want: int = 0, vec: int = 1) -> int:
    """Threads that share a ``thread-per-row`` row of ``cols`` elements (rows that are
    columns in memory) in a block of ``block`` threads: ``want`` (the option), else the
    fewest (a power of two, at most 8) that leave each at most
    :data:`COLUMN_SPLIT_ITEMS` elements and, owning ``vec`` rows (``column_vector``), at
    most :data:`MAX_THREAD_CACHED` values; either way few enough that a block still
    holds a warp of rows.

    A thread alone on a column softmax's 64 values held them in 80 registers, 768
    threads an SM: ncu on an H100 (bf16, 64×524288) read 59 % of DRAM and 59 % of the
    SM, 34 % achieved occupancy, neither bound. Shared by 2 / 4 / 8 threads (48 / 32
    registers at 2 / 4) the f32 kernel ran +1.6 / +1.4 / −2.9 %, bf16 and f16 +4 / +7 /
    −4 % (RESULTS.md, kernels, twentieth session): 16 values a thread.

    >>> column_split(64, 256), column_split(16, 256), column_split(256, 256), column_split(256, 64)
    (4, 1, 8, 2)
    >>> column_split(64, 256, want=8), column_split(64, 64, want=8)
    (8, 2)
    >>> column_split(64, 256, vec=4), column_split(64, 256, vec=8)
    (4, 8)
    """
    split = want or 1
    while not want and split < MAX_COLUMN_SPLIT and (cols > COLUMN_SPLIT_ITEMS * split
                                      or math.ceil(cols / split) * vec > MAX_THREAD_CACHED):
        split *= 2
    return max(1, min(split, block // 32))


def column_vector(region: RegionOp, inner_rows: int, cols: int, want: int,
                  offsets: dict[int, int]) -> int:
    """The neighbouring rows a ``thread-per-row`` thread of ``region`` owns (rows that are
    columns in memory): ``want`` (at least 1), at most 16 bytes
    (:func:`_vector_elements`), halved until a thread's row values (``cols`` each,
    over at most :data:`MAX_COLUMN_SPLIT` threads a row) fit :data:`MAX_THREAD_CACHED`,
    the rows' innermost extent ``inner_rows`` divides it and every arena buffer is
    aligned to it; 1 unless every buffer holds f32 or halves.
    """
    widest = _vector_elements(region, 4)  # 16 bytes: 4 floats, 8 halves
    vec = min(want, widest)
    per_word = max(1, widest // 4)  # elements a 4-byte word holds
    while vec > 1 and (inner_rows % vec
                       or math.ceil(cols / MAX_COLUMN_SPLIT) * vec > MAX_THREAD_CACHED
                       or not _vector_aligned(region, offsets, vec // per_word)):
        vec //= 2
    return vec


def stream_tile(block: int, grid: int, streams: int) -> int:
    """The tile block ``block`` of a ``grid``-block launch takes when the blocks are
    dealt round robin into ``streams`` runs, each a contiguous stretch of the tiles (the
    first ``grid % streams`` runs one tile longer) — the mapping a ``thread-per-row``
    kernel of plan ``streams`` spells: consecutive blocks, resident at once, read
    ``streams`` places of each row in memory.

    >>> [stream_tile(b, 8, 2) for b in range(8)]
    [0, 4, 1, 5, 2, 6, 3, 7]
    >>> [stream_tile(b, 7, 3) for b in range(7)], [stream_tile(b, 3, 8) for b in range(3)]
    ([0, 3, 5, 1, 4, 6, 2], [0, 1, 2])
    """
    s, per, extra = block % streams, grid // streams, grid % streams
    return s * per + min(s, extra) + block // streams


def column_layout(region: RegionOp, inner_rows: int, cols: int, block: int,
                  vector_want: int, split_want: int, offsets: dict[int, int]) -> tuple[int, int]:
    """A ``thread-per-row`` kernel's (``column_vector``, ``column_split``): the rows a
    thread owns (:func:`column_vector`) and the threads that share them
    (:func:`column_split`), each the option where it is set. Picked (``vector_want``
    0), a thread owns :data:`PICKED_COLUMN_VECTOR` rows where it then walks at most
    :data:`PICKED_COLUMN_VALUES` values, else one.

    On an H100 (RESULTS.md, kernels, twenty-seventh session) two columns a thread read
    the column softmax (64 × 524288, 16 values a thread a column: 32) at 2785 / 2692 /
    2694 GB/s in f32 / bf16 / f16 against 2722–2725 / 2522–2524 / 2567–2587 with one,
    and four or eight (64 values) at 2735 / 2651 / 2649 and 2749 / 2475 / 2473; the
    reductions program's column max (8192 × 4096 as 131072 rows of 256: 32 values a
    column, 64 for two) ran 3 % slower in f32 with two (1377–1382 against 1420–1428
    GB/s), the same in halves.
    """
    vec = column_vector(region, inner_rows, cols, vector_want or PICKED_COLUMN_VECTOR,
                        offsets)
    split = column_split(cols, block, split_want, vec)
    if not vector_want and vec > 1 and math.ceil(cols / split) * vec > PICKED_COLUMN_VALUES:
        vec = 1
        split = column_split(cols, block, split_want, vec)
    return vec, split


def row_block_size(cols: int, element_bytes: int, chained: bool = False,
                   streamed: int = 1) -> int:
    """Threads of a block-per-row kernel over rows of ``cols`` values of
    ``element_bytes`` each (its widest streamed input): for an f32 row a power of two
    giving a thread :data:`ROW_VALUES_PER_THREAD` values, 128 to 512 threads; for a row
    of halves :data:`BLOCK_SIZE`, or when its reductions are ``chained``
    :data:`CHAINED_HALF_BLOCK`, doubled up to :data:`BLOCK_SIZE` while a thread would
    hold more than :data:`MAX_CACHED_PER_THREAD` values of its ``streamed`` inputs
    together (two rows of 32 values a thread are more registers than the fewer warps
    save); in all, up to 1024 while that keeps a thread's values of an input within
    :data:`MAX_CACHED_PER_THREAD` (registers), past which every phase reads the row
    again (softmax over rows of 16384 floats: 2289 GB/s at 256 threads, 3872 at 512).

    >>> row_block_size(4096, 4), row_block_size(4096, 2), row_block_size(2048, 4)
    (512, 256, 256)
    >>> row_block_size(16384, 2), row_block_size(32768, 4), row_block_size(10**6, 4)
    (512, 1024, 1024)
    >>> row_block_size(4096, 2, chained=True), row_block_size(8192, 2, chained=True)
    (128, 256)
    >>> row_block_size(4096, 2, chained=True, streamed=2)
    256
    """
    if element_bytes == 4:
        want = max(1, cols // ROW_VALUES_PER_THREAD)
        bs = min(512, max(128, 1 << (want.bit_length() - 1)))
    elif chained:
        bs = CHAINED_HALF_BLOCK
        while bs < BLOCK_SIZE and cols * streamed > bs * MAX_CACHED_PER_THREAD:
            bs *= 2
    else:
        bs = BLOCK_SIZE
    while bs < 1024 and cols > bs * MAX_CACHED_PER_THREAD:
        bs *= 2
    return bs


def _element_bytes(op: Operation) -> int:
    t = op.results[0].type
    return t.element.nbytes if isinstance(t, TensorType) else 4


def _chained_reductions(region: RegionOp) -> bool:
    """Whether some reduction of the row region reads (through any ops) another
    reduction's result: softmax, layernorm — not rmsnorm (one), not sibling reductions
    of the same input."""
    for op in region.body.ops:
        if op.op_name != "prim.reduce":
            continue
        stack, seen = list(op.operands), set()
        while stack:
            v = stack.pop()
            if not isinstance(v, OpResult) or v in seen:
                continue
            seen.add(v)
            if v.op.op_name == "prim.reduce":
                return True
            stack.extend(v.op.operands)
    return False


def _streamed(region: RegionOp) -> list[TensorType]:
    """The types of the inputs a row region streams (those of its iteration shape)."""
    it = tuple(region.iteration)
    return [o.type for o in region.operands
            if isinstance(o.type, TensorType) and tuple(o.type.shape) == it]


def _row_element_bytes(region: RegionOp) -> int:
    """Bytes an element of the widest input a row region streams (one of its iteration
    shape); 4 when none is (:func:`row_block_size`)."""
    return max((t.element.nbytes for t in _streamed(region)), default=4)


def _vector_elements(region: RegionOp, width: int) -> int:
    """Elements per vector access of ``region`` (1: scalar).

    ``width`` is the option's f32 width (16 bytes at 4). Half types (f16, bf16)
    take the same bytes per access, so twice the elements (8 halves a ``uint4``)
    when every buffer holds halves; with f32 buffers beside them the f32 width
    rules (a ``float4`` and a ``uint2`` per access). Other element types: scalar.
    """
    names = _element_names(region)
    if width == 1 or not names <= {"f32", "f16", "bf16"}:
        return 1
    return width if "f32" in names else 2 * width


def _packed_ops(region: RegionOp, sm: int) -> str:
    """The f16/bf16 ops of ``region`` that compute capability ``sm`` runs two lanes an
    instruction (:func:`accy.target.packed.packed_ops`), as ``el.op`` words."""
    found = set()
    for op in region.regions[0].blocks[0].ops:
        if len(op.results) != 1 or not isinstance(op.results[0].type, TensorType):
            continue
        el = op.results[0].type.element.name
        name = op.op_name.split(".", 1)[-1]
        if name in packed_ops(el, sm):
            found.add(f"{el}.{name}")
    return " ".join(sorted(found))


def _arena_offsets(func: FuncOp) -> dict[int, int]:
    """Byte offset in the arena of every arena buffer (and every view of one) by id."""
    by_id = {b.id: b for b in buffer_plan(func)}
    out: dict[int, int] = {}
    for i, b in by_id.items():
        while b.alias_of >= 0:
            b = by_id[b.alias_of]
        if b.kind == "arena":
            out[i] = b.offset
    return out


def _aliased_params(region: RegionOp, func: FuncOp) -> tuple[int, ...]:
    """Kernel parameters (inputs, then outputs) that share memory with another one.

    An output written in place over an input, or an input that is a view of
    another input's buffer: such pointers must not be ``restrict``.
    """
    by_id = {b.id: b for b in buffer_plan(func)}

    def root(i: int) -> int:
        b = by_id.get(i)
        while b is not None and (b.alias_of >= 0 or b.inplace_of >= 0):
            i = b.alias_of if b.alias_of >= 0 else b.inplace_of
            b = by_id.get(i)
        return i

    ids: list[int] = []
    for key in ("memory.inputs", "memory.outputs"):
        a = region.attr(key)
        ids += list(a.values) if isinstance(a, DenseArrayAttr) else []
    roots = [root(i) for i in ids]
    return tuple(p for p, r in enumerate(roots) if roots.count(r) > 1)


def _vector_aligned(region: RegionOp, offsets: dict[int, int], vec: int) -> bool:
    """Every arena buffer the region touches starts on a ``vec``-float boundary
    (``4 · vec`` bytes: the widest access a vector of any element type makes).

    Arguments and results are allocated by the runtime (256-byte aligned); the
    arena's own alignment (``memory.alignment``) may be as small as 1 byte.
    """
    ids: list[int] = []
    for key in ("memory.inputs", "memory.outputs"):
        a = region.attr(key)
        if isinstance(a, DenseArrayAttr):
            ids.extend(a.values)
    return all(offsets[i] % (4 * vec) == 0 for i in ids if i in offsets)


def _column_rows(region: RegionOp) -> bool:
    """Whether the region's rows are columns of an input in memory: it reads an input
    through a transpose that moves the input's last (contiguous) axis off the last
    place, so consecutive rows are neighbouring addresses and a row is strided."""
    args = set(region.body.args)
    for op in region.body.ops:
        if op.op_name == "prim.transpose" and op.operands[0] in args:
            perm = tuple(op.attr("permutation").values)  # type: ignore[union-attr]
            if perm and perm[-1] != len(perm) - 1:
                return True
    return False


def _cached_inputs(region: RegionOp, transposed: bool = False) -> tuple[int, ...]:
    """Inputs of a row region read only at their own element (cacheable in registers).

    With ``transposed`` (a thread per row), an input read only through one
    ``prim.transpose`` to the iteration shape counts too: each thread's element of
    the transpose is one element of the input (the target reads it there once).
    """
    shape = tuple(region.iteration)

    def identity_read(v: Value) -> bool:
        return bool(v.uses) and all(u.op_name in IDENTITY_READERS or u.op_name == "prim.reduce"
                                    for u, _ in v.uses)

    out = []
    for i, arg in enumerate(region.body.args):
        if tuple(arg.type.shape) == shape and identity_read(arg):  # type: ignore[attr-defined]  # a tensor-typed value
            out.append(i)
        elif transposed and len(arg.uses) == 1:
            user = arg.uses[0][0]
            moved = user.results[0] if user.op_name == "prim.transpose" else None
            moved_shape = tuple(moved.type.shape) if moved is not None else ()  # type: ignore[attr-defined]  # a tensor-typed value
            if moved is not None and moved_shape == shape and identity_read(moved):
                out.append(i)
    return tuple(out)


ATTENTION_STAGING = 32
"""The most floats a ``flash`` thread holds for the next key tile's K and V (stages 2)."""

FFMA_MIN_BLOCKS = 128
"""``ffma-tiled`` tiles picked by shape shrink while the grid has fewer blocks than this
(a wave: the H200 has 132 SMs)..."""
FFMA_LONG_K = 512
FFMA_LONG_K_BLOCKS = 256
"""... or, for a depth K over ``FFMA_LONG_K``, fewer than this: measured on the H200
(RESULTS.md, the MLP's matmuls), 8192×1024 @ 1024×256 ran 7 % faster on 256 blocks of
128×64 than on 128 of 128×128, while 2048×256 @ 256×1024 ran 6 % faster on 128 blocks
of 128×128 than on 256 of 128×64."""


def _row_major_operands(region: RegionOp, mm: Operation) -> tuple[int, int, int, int] | None:
    """(batch, M, N, K) when both matmul operands are inputs of the kernel in plain
    row-major layout (A ``[…, M, K]``, B ``[…, K, N]``, the result's batch dims), else None."""
    a, b = mm.operands
    args = list(region.body.args)
    if a not in args or b not in args:
        return None
    out = tuple(mm.results[0].type.shape)  # type: ignore[attr-defined]  # a tensor-typed value
    sa, sb = tuple(a.type.shape), tuple(b.type.shape)  # type: ignore[attr-defined]
    if len(out) < 2:
        return None
    m, n, k = out[-2], out[-1], sa[-1]
    if sa != out[:-2] + (m, k) or sb != out[:-2] + (k, n):
        return None
    return math.prod(out[:-2]), m, n, k


def _ffma_tile(batch: int, m: int, n: int, k: int, want_m: int, want_n: int) \
        -> tuple[int, int] | None:
    """The ``ffma-tiled`` block tile (m, n): the options' (0: by shape), dividing M and N.

    By shape: the first of 128×128, 128×64, 64×128 that divides and makes a grid of at
    least ``FFMA_MIN_BLOCKS`` blocks (``FFMA_LONG_K_BLOCKS`` when K is longer than
    ``FFMA_LONG_K``), else the one of them making the most blocks; 64×64 only where
    none of them divides (it was the slowest tile at every shape measured, even with
    twice the blocks: 1024³, the MLP's four matmul shapes).
    """
    order = [(tm, tn) for tm in (128, 64) for tn in (128, 64)]
    fits = [(tm, tn) for tm, tn in order if want_m in (0, tm) and want_n in (0, tn)
            and m % tm == 0 and n % tn == 0]
    if not fits:
        return None
    big = [t for t in fits if t != (64, 64)] or fits
    enough = FFMA_LONG_K_BLOCKS if k > FFMA_LONG_K else FFMA_MIN_BLOCKS

    def blocks(t: tuple[int, int]) -> int:
        return batch * (m // t[0]) * (n // t[1])

    return next((t for t in big if blocks(t) >= enough), max(big, key=blocks))


@dataclass(frozen=True)
class PlanKernels(Pass):
    """Turn dispatch regions into planned ``kernel.func`` + ``kernel.launch`` pairs."""

    name = "plan-kernels"
    thread_blocks: bool = False
    """The target runs kernels as grids of thread blocks (its backend says); else loops."""
    block_size: int = KernelOptions.block_size
    vector_width: int = KernelOptions.vector_width
    rows_per_block: int = KernelOptions.rows_per_block
    tile_m: int = KernelOptions.tile_m
    tile_n: int = KernelOptions.tile_n
    tile_k: int = KernelOptions.tile_k
    tensor_cores: bool = KernelOptions.tensor_cores
    mma_tile: tuple[int, int, int] = (KernelOptions.mma_tile_m, KernelOptions.mma_tile_n,
                                      KernelOptions.mma_tile_k)
    stages: int = KernelOptions.stages
    sm: int = 0
    """The CUDA compute capability (tensor cores need 80 or more)."""
    wgmma: bool = False
    """bf16/f16 matmuls whose shapes divide the warpgroup tiles run on ``wgmma`` (the
    option, where the backend has it: ``cuda:sm_90a``)."""
    wgmma_tile: tuple[int, int] = (KernelOptions.wgmma_tile_m, KernelOptions.wgmma_tile_n)
    wgmma_stages: int = KernelOptions.wgmma_stages
    wgmma_raster: int = KernelOptions.wgmma_raster
    ffma_tiles: bool = KernelOptions.ffma_tiles
    ffma_tile: tuple[int, int, int] = (KernelOptions.ffma_tile_m, KernelOptions.ffma_tile_n,
                                       KernelOptions.ffma_tile_k)
    """The ``ffma-tiled`` kernel: on or off, and its tiles (m, n: 0 picks by shape)."""
    ffma_unroll: int = KernelOptions.ffma_unroll
    """The ``ffma-tiled`` k steps unrolled together (at most ``ffma_tile``'s k)."""
    column_split: int = KernelOptions.column_split
    """Threads sharing a ``thread-per-row`` row (0: :func:`column_split` picks)."""
    column_vector: int = KernelOptions.column_vector
    """Neighbouring rows a ``thread-per-row`` thread owns (:func:`column_vector`)."""
    column_streams: int = KernelOptions.column_streams
    """The runs a ``thread-per-row`` kernel's blocks are dealt into (0:
    :data:`COLUMN_STREAMS`; :func:`stream_tile`)."""
    max_registers: int = KernelOptions.max_registers
    """Registers an elementwise or row kernel's thread may take (0: no cap;
    :func:`min_blocks`)."""
    prefetch: bool = KernelOptions.prefetch
    """An f32 ``grid-stride`` thread with several vectors loads its next before computing
    the current (plan ``items`` 2)."""
    attention_tile: tuple[int, int, int] = (KernelOptions.attention_tile_m,
                                            KernelOptions.attention_tile_n,
                                            KernelOptions.attention_threads)
    """The ``flash`` kernel's query rows and keys a tile, and its threads."""
    attention_prefetch: bool = KernelOptions.attention_prefetch
    """The ``flash`` kernel's next key tile waits in registers (stages 2) where it fits."""
    max_dynamic_shared: int = 0
    """Shared memory a block may take on the target (the flash tiles shrink to fit)."""

    def apply(self, ctx: PassContext, module: Operation) -> None:
        n = 0
        for func in list(module.body.ops):
            if not isinstance(func, FuncOp):
                continue
            offsets = _arena_offsets(func)
            for region in [op for op in func.body.ops if isinstance(op, RegionOp)]:
                name = f"k{n}_{region.kind}"
                n += 1
                plan = self.plan(region, offsets)
                plan["aliased_params"] = _aliased_params(region, func)
                kfunc = self.make_kernel(region, name, plan)
                module.body.insert_before(func, kfunc)
                launch = LaunchOp(region.operands, region.result_types,
                                  {"kernel": SymbolRefAttr(name),
                                   **{k: v for k, v in region.attributes.items()
                                      if k.startswith("memory.")}},
                                  loc=region.loc)
                func.body.insert_before(region, launch)
                for old, new in zip(region.results, launch.results):
                    old.replace_all_uses_with(new)
                region.erase()
                ctx.stat(f"{plan['mapping']}-kernels")

    def plan(self, region: RegionOp, offsets: dict[int, int] | None = None) \
            -> dict[str, object]:
        kind = region.kind
        it = tuple(region.iteration)
        if not self.thread_blocks:
            return {"mapping": "loop", "block": (1, 1, 1), "grid": (1, 1, 1),
                    "vector_width": 1, "shared_bytes": 0}
        if kind == "attention":
            return self.attention_plan(region, offsets or {})
        bs = self.block_size or BLOCK_SIZE
        width = _vector_elements(region, self.vector_width)
        aligned = width > 1 and _vector_aligned(region, offsets or {}, self.vector_width)
        if kind == "elementwise":
            n = math.prod(it) if it else 1
            vec = width if (aligned and it and it[-1] % width == 0) else 1
            blocks = elementwise_grid(math.ceil(n / vec), bs)
            floats = _floats_only(region)
            # f32 only: a half kernel's extra registers would cost it a block an SM
            # (bias_gelu bf16: 40 to 43)
            items = 2 if self.prefetch and floats and vec > 1 and blocks * bs * vec < n else 1
            plan: dict[str, object] = {
                "mapping": "grid-stride", "block": (bs, 1, 1), "grid": (blocks, 1, 1),
                "vector_width": vec, "shared_bytes": 0, "elements": n, "items": items}
            packed = _packed_ops(region, self.sm) if vec > 1 else ""
            if packed:
                plan["packed_ops"] = packed
            plan["min_blocks"] = min_blocks(bs, self.max_registers)
            return plan
        if kind == "rows":
            rows, cols = math.prod(it[:-1]) if len(it) > 1 else 1, it[-1]
            if _column_rows(region) and 0 < cols <= MAX_THREAD_ROW and rows >= MIN_THREAD_ROWS:
                # rows that are columns in memory: a thread per row walks its row (or
                # ``split`` threads, every split-th element each), and the threads of a
                # warp read 32 neighbouring addresses at each step
                # (``vec`` neighbouring rows a thread: one vector access a step)
                vec, split = column_layout(region, it[-2], cols, bs, self.column_vector,
                                           self.column_split, offsets or {})
                items = math.ceil(cols / split)
                cached = _cached_inputs(region, transposed=True) \
                    if items * vec <= MAX_THREAD_CACHED else ()
                rpb = bs // split
                return {
                    "mapping": "thread-per-row", "block": (bs, 1, 1),
                    "grid": (max(1, math.ceil(rows / (rpb * vec))), 1, 1),
                    "streams": self.column_streams or COLUMN_STREAMS, "vector_width": vec,
                    "shared_bytes": 8 * bs * vec if split > 1 else 0, "rows": rows,
                    "cols": cols, "rows_per_block": rpb, "items": items,
                    "cached_inputs": cached}
            vec = width if (aligned and cols % width == 0) else 1
            halves = width > self.vector_width  # no f32 buffer: the width doubled
            while halves and vec > 1 and cols < 32 * vec:
                vec //= 2  # a short row of halves keeps every lane of the warp busy
            warp = cols <= 32 * vec * 8 if self.rows_per_block == 0 else self.rows_per_block > 1
            warp = warp or rows == 0  # no rows: one block that returns (the warp path's bound)
            if warp:
                rpb = self.rows_per_block or bs // 32
                rpb = max(1, min(rpb, bs // 32))
                per_row = 32
                grid = max(1, math.ceil(rows / rpb))
                block = (32 * rpb, 1, 1)
                shared = 0
            else:
                bs = self.block_size or row_block_size(
                    cols, _row_element_bytes(region), _chained_reductions(region),
                    len(_streamed(region)))
                rpb, per_row, grid, block = 1, bs, rows, (bs, 1, 1)
                shared = ROW_PARTIAL_SETS * 32 * 8
            # an empty row still runs its (guarded, empty) column loop once: the
            # reductions of no element give their identities
            items = max(1, math.ceil(cols / (per_row * vec)))
            cached = _cached_inputs(region) if items * vec <= MAX_CACHED_PER_THREAD else ()
            row_plan: dict[str, object] = {
                "mapping": "warp-per-row" if warp else "block-per-row", "block": block,
                "grid": (grid, 1, 1), "vector_width": vec, "shared_bytes": shared,
                "rows": rows, "cols": cols, "rows_per_block": rpb, "items": items,
                "cached_inputs": cached,
                "min_blocks": min_blocks(block[0], self.max_registers)}
            packed = _packed_ops(region, self.sm) if vec > 1 else ""
            if packed:  # the row's half ops two lanes a word, as an elementwise kernel's
                row_plan["packed_ops"] = packed
            return row_plan
        # matmul
        mm = next(op for op in region.body.ops if op.op_name == "prim.matmul")
        out = tuple(mm.results[0].type.shape)  # type: ignore[attr-defined]  # a tensor-typed value
        batch = math.prod(out[:-2]) if len(out) > 2 else 1
        m, n = out[-2], out[-1]
        mma = self.mma_plan(region, mm, offsets or {})
        if mma is not None:
            return mma
        ffma = self.ffma_plan(region, mm, offsets or {})
        if ffma is not None:
            return ffma
        tm, tn, tk = self.tile_m, self.tile_n, self.tile_k
        # 16×16 threads a block; each computes a (tile_m/16)×(tile_n/16) micro-tile
        mt_m, mt_n = max(1, tm // 16), max(1, tn // 16)
        return {"mapping": "tiled", "block": (tn // mt_n, tm // mt_m, 1),
                "grid": (max(1, math.ceil(n / tn)), max(1, math.ceil(m / tm)), max(1, batch)),
                "vector_width": 1,
                "shared_bytes": tk * ((tm + 1) + (tn + 4)) * _element_bytes(mm),
                "tile": (tm, tn, tk), "micro_tile": (mt_m, mt_n)}

    def mma_plan(self, region: RegionOp, mm: Operation, offsets: dict[int, int]) \
            -> dict[str, object] | None:
        """The tensor-core plan of a bf16/f16 matmul, or None (the FFMA tiles then).

        Needs sm_80+, both operands plain row-major inputs of the kernel (A ``[…, M,
        K]``, B ``[…, K, N]``, batch dims equal to the result's), shapes that divide
        the tiles, and 16-byte aligned buffers (``cp.async`` copies 16 bytes).
        """
        if not self.tensor_cores or self.sm < 80:
            return None
        out = tuple(mm.results[0].type.shape)  # type: ignore[attr-defined]
        if 0 in out or 0 in tuple(mm.operands[0].type.shape):  # type: ignore[attr-defined]
            return None  # nothing to multiply: the guarded FFMA tiles
        a, b = mm.operands
        el = {a.type.element.name, b.type.element.name}  # type: ignore[attr-defined]
        dims = _row_major_operands(region, mm)
        if dims is None or len(el) != 1 or not el <= {"bf16", "f16"}:
            return None
        batch, m, n, k = dims
        kind = el.pop()
        if not _vector_aligned(region, offsets, 4):
            return None
        wm, wn = wgmma_tiles(*self.wgmma_tile, m, n, k, batch)
        if self.wgmma and not (m % wm or n % wn or k % WGMMA_TILE_K):
            # the TMA reads A as [batch·M, K] and B as [batch·K, N] (no tile straddles a
            # batch): a map is (launch-buffer position, rows, cols, box rows, box cols)
            maps = (a.index, batch * m, k, wm, WGMMA_TILE_K,  # type: ignore[attr-defined]
                    b.index, batch * k, n, WGMMA_TILE_K, 64)  # type: ignore[attr-defined]
            return {"mapping": "wgmma-tiled", "block": (384, 1, 1),
                    "grid": (n // wn, m // wm, batch), "vector_width": 8,
                    "dynamic_shared": wgmma_shared_bytes(wm, wn, self.wgmma_stages),
                    "tile": (wm, wn, WGMMA_TILE_K), "warps": (2, wm // 128),
                    "stages": self.wgmma_stages, "tensor_maps": maps,
                    "raster": min(self.wgmma_raster, m // wm)
                    if (m // wm) * (n // wn) > WGMMA_WAVE else 1,
                    "mma": f"m64n{wn}k16.f32.{kind}.{kind}"}
        tm, tn, tk = self.mma_tile
        if m % tm or n % tn or k % tk:
            return None
        wm, wn = 64, 32  # each warp: 4 × 4 m16n8 tiles
        warps = (tm // wm, tn // wn)
        a_chunks, b_chunks = tk // 8, tn // 8  # 16-byte chunks a row of each tile
        # ldmatrix reads 8 rows of one chunk column: XOR the chunk with the row so the
        # 8 land in 8 distinct 16-byte bank groups (a 64-byte A row pairs rows up)
        swizzle = (1, 3, 0, 7) if a_chunks == 4 else (0, 7, 0, 7)
        assert b_chunks >= 8
        return {"mapping": "mma-tiled", "block": (32 * warps[0] * warps[1], 1, 1),
                "grid": (n // tn, m // tm, batch), "vector_width": 8,
                "shared_bytes": self.stages * tk * (tm + tn) * 2,
                "tile": (tm, tn, tk), "warps": warps, "warp_tile": (wm, wn),
                "stages": self.stages, "swizzle": swizzle,
                "mma": f"m16n8k16.row.col.f32.{kind}.{kind}.f32"}

    def ffma_plan(self, region: RegionOp, mm: Operation, offsets: dict[int, int]) \
            -> dict[str, object] | None:
        """The register-blocked FFMA plan of an f32 matmul, or None (the generic tiles then).

        Needs both operands plain row-major f32 inputs of the kernel (A ``[…, M, K]``,
        B ``[…, K, N]``, batch dims equal to the result's), M and N dividing a tile,
        K dividing ``ffma_tile_k``, and 16-byte aligned buffers (float4 loads). Each
        of the ``tile_m·tile_n/64`` threads owns 8×8 outputs, 2×2 sub-tiles of 4×4
        half a tile apart (float4 shared reads); ``stages`` = 2 shared buffers.
        """
        if not self.ffma_tiles:
            return None
        dims = _row_major_operands(region, mm)
        tk = self.ffma_tile[2]
        if dims is None or not _vector_aligned(region, offsets, 4):
            return None
        batch, m, n, k = dims
        types = [v.type for v in (*mm.operands, mm.results[0])]
        if any(not isinstance(t, TensorType) or t.element.name != "f32" for t in types):
            return None
        if min(batch, m, n, k) == 0 or k % tk:
            return None
        tile = _ffma_tile(batch, m, n, k, self.ffma_tile[0], self.ffma_tile[1])
        if tile is None:
            return None
        tm, tn = tile
        return {"mapping": "ffma-tiled", "block": (tm * tn // 64, 1, 1),
                "grid": (n // tn, m // tm, batch), "vector_width": 4,
                "shared_bytes": 2 * tk * ((tm + FFMA_A_PAD) + tn) * 4,
                "tile": (tm, tn, tk), "micro_tile": (8, 8), "stages": 2,
                "unroll": min(self.ffma_unroll, tk)}

    def attention_plan(self, region: RegionOp, offsets: dict[int, int]) -> dict[str, object]:
        """The ``flash`` plan of an attention region (see the module docstring).

        ``threads / 16`` row groups of 16 threads: thread (ty, tx) owns ``rows = bm · 16 /
        threads`` query rows and ``bn / 16`` keys of every key tile (4×4 at 64×64 with 256
        threads). float4 loads (``vector_width`` 4) when both head dims divide 4 and
        every buffer is 16-byte aligned, else scalar loads.
        """
        match = match_in(region.body.ops)
        assert match is not None, "an attention region holds an attention chain"
        bm, bn, threads = self.attention_tile
        ty = threads // 16
        bm = min(bm, 8 * ty)  # at most 8 query rows a thread
        d, dv = match.d, match.dv

        def nbytes(bm: int, bn: int) -> int:
            return 4 * sum(attention_shared_floats(bm, bn, d, dv))

        limit = self.max_dynamic_shared or 48 * 1024
        while nbytes(bm, bn) > limit and (bn > 16 or bm > ty):
            if bn > 16 and (bn >= bm or bm <= ty):
                bn //= 2
            else:
                bm //= 2
        vec = 4 if d % 4 == 0 and dv % 4 == 0 and _vector_aligned(region, offsets, 4) else 1
        mtiles = math.ceil(match.m / bm)
        # the next key tile's loads wait in registers while one is used (stages 2) when
        # that takes at most ATTENTION_STAGING floats a thread
        staging = math.ceil(bn * -(-d // 4) * 4 / threads) + math.ceil(bn * -(-dv // 4) * 4
                                                                        / threads)
        return {"mapping": "flash", "block": (threads, 1, 1),
                "grid": (max(1, match.batch_size * mtiles), 1, 1), "vector_width": vec,
                "dynamic_shared": nbytes(bm, bn), "shared_bytes": 0,
                "tile": (bm, bn, d), "micro_tile": (bm // ty, bn // 16),
                "stages": 2 if self.attention_prefetch and staging <= ATTENTION_STAGING else 1}

    @staticmethod
    def make_kernel(region: RegionOp, name: str, plan: dict[str, object]) -> KernelFuncOp:
        attrs: dict[str, Attribute] = {
            "kind": StringAttr(region.kind),
            "iteration": DenseArrayAttr(tuple(region.iteration)),
        }
        if region.kind in ("matmul", "attention"):
            attrs["contraction"] = IntegerAttr(region.contraction)
        for k, v in plan.items():
            if isinstance(v, tuple):
                attrs[k] = DenseArrayAttr(tuple(int(x) for x in v))
            elif isinstance(v, str):
                attrs[k] = StringAttr(v)
            else:
                attrs[k] = IntegerAttr(int(v))  # type: ignore[call-overload]
        body_region = region.regions[0]
        region.regions.clear()
        body_region.parent = None
        block: Block = body_region.blocks[0]
        term = block.terminator
        assert term is not None
        yield_op = KernelYieldOp(term.operands, (), loc=term.loc)
        term._drop_operands()
        block.ops.remove(term)
        term.parent = None
        block.append(yield_op)
        return KernelFuncOp(properties={"sym_name": StringAttr(name)},
                            attributes=attrs, regions=[body_region], loc=region.loc)
