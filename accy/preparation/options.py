"""Run options: the target and every stage's options, frozen and validated.

``--option STAGE.NAME=VALUE`` on the command line and the option axes of a
sweep file land here. Each stage has a frozen dataclass of its options,
validated in ``__post_init__``; :meth:`RunOptions.stage_key_fields` gives
exactly what one stage reads, which is what its key hashes (so a
``kernel.*`` option never changes a contract … memory key).

Example
-------
>>> o = RunOptions.parse("cuda:sm_90", ["kernel.block_size=128"])
>>> o.kernel.block_size, o.target.arch
(128, 'sm_90')
>>> o.stage_key_fields("memory") == RunOptions.parse("host", []).stage_key_fields("memory")
True
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from accy.errors import OptionError
from accy.target.backend import Backend, backend_for


@dataclass(frozen=True)
class Target:
    """``host``, or ``cuda`` with an ``sm_XX`` arch."""

    kind: str = "host"
    arch: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("host", "cuda"):
            raise OptionError(f"unknown target '{self.kind}' (expected host, cuda or cuda:sm_XX)")
        if self.kind == "cuda" and (self.arch is None or not re.fullmatch(r"sm_\d{2,3}a?",
                                                                          self.arch)):
            raise OptionError(f"bad CUDA arch '{self.arch}' (expected e.g. sm_90)")
        if self.kind == "host" and self.arch is not None:
            raise OptionError("the host target takes no arch")

    @staticmethod
    def parse(text: str) -> Target:
        """``host``, ``cuda`` (the local GPU's arch — ``sm_90a`` on Hopper, see
        :func:`accy.target.backend.target_arch` — else sm_90) or ``cuda:sm_XX``."""
        text = text.strip()
        if text == "host":
            return Target("host")
        if text == "cuda":
            from accy.target.backend import local_cuda_arch, target_arch

            local = local_cuda_arch()
            return Target("cuda", target_arch(local) if local else "sm_90")
        if text.startswith("cuda:"):
            return Target("cuda", text[5:])
        raise OptionError(f"unknown target '{text}' (expected host, cuda or cuda:sm_XX)")

    @property
    def backend(self) -> Backend:
        """The target's backend: limits, dtypes, language, compiler, loader."""
        return backend_for(self.kind, self.arch)

    def __str__(self) -> str:
        return self.backend.name


def _positive(name: str, value: int, *, power_of_two: bool = False, at_most: int | None = None) \
        -> None:
    if value <= 0:
        raise OptionError(f"{name} must be positive, got {value}")
    if power_of_two and value & (value - 1):
        raise OptionError(f"{name} must be a power of two, got {value}")
    if at_most is not None and value > at_most:
        raise OptionError(f"{name} must be at most {at_most}, got {value}")


@dataclass(frozen=True)
class ContractOptions:
    fold_constants: bool = True
    """Fold ops whose operands are all constants."""
    cse: bool = True
    """Merge identical pure ops."""
    max_fold_elements: int = 1 << 16
    """Largest constant a fold may create."""

    def __post_init__(self) -> None:
        _positive("contract.max_fold_elements", self.max_fold_elements)


@dataclass(frozen=True)
class TensorOptions:
    innermost_reductions: bool = True
    """Transpose so every reduction runs over the innermost axis."""
    split_reductions: bool = True
    """On GPU targets, split a long reduction with few outputs into two."""


@dataclass(frozen=True)
class DispatchOptions:
    fuse: bool = True
    """Fuse elementwise producers/consumers into reductions and matmul epilogues."""
    max_region_ops: int = 128
    """Largest fused region (ops)."""
    fuse_attention: bool = True
    """With ``fuse``: each ``softmax(q·kᵀ·c)·v`` chain (f32, the scores and
    probabilities read nowhere else) is one ``attention`` region, a flash-style kernel
    that never writes the scores; off, it is a matmul, a row softmax and a matmul."""

    def __post_init__(self) -> None:
        _positive("dispatch.max_region_ops", self.max_region_ops)


@dataclass(frozen=True)
class MemoryOptions:
    reuse: bool = True
    """Reuse the buffers of dead intermediates."""
    inplace: bool = True
    """Write an elementwise result over a dying input of the same layout."""
    alignment: int = 256
    """Byte alignment of every buffer in the workspace arena."""

    def __post_init__(self) -> None:
        _positive("memory.alignment", self.alignment, power_of_two=True, at_most=4096)


WGMMA_TILE_K = 64
"""The warpgroup matmul's depth per stage: one 128-byte swizzle row of halves."""


def wgmma_shared_bytes(tile_m: int, tile_n: int, stages: int) -> int:
    """Dynamic shared memory of a warpgroup matmul: ``stages`` A and B tiles of halves,
    1 KB to align the first to the 1024-byte swizzle atom, two mbarriers a stage."""
    return stages * (tile_m + tile_n) * WGMMA_TILE_K * 2 + 1024 + 16 * stages


WGMMA_WIDE_K = 2048
"""The depth from which ``wgmma_tile_n`` 0 may pick 256 columns (:func:`wgmma_tiles`)."""


WGMMA_RASTER = 16
"""Rows of warpgroup tiles a group of consecutive blocks sweeps (``kernel.wgmma_raster``).
Row-major, the 132 blocks resident on a Hopper GPU at 8192³ (128×256 tiles) cover four
rows of tiles and so every column of B, 128 MB, more than L2's 50 MB: each wave reads B
from memory again. Sixteen rows of tiles by eight columns read 32 MB of A and 34 MB of B.
On an H100 at 8192³ row-major ran 0.79–0.82× cuBLAS, 16 rows 0.94–0.97× (RESULTS.md,
kernels, nineteenth session)."""
FFMA_UNROLL = 16
"""k steps of an ``ffma-tiled`` shared stage unrolled together (``kernel.ffma_unroll``,
at most the stage's ``ffma_tile_k``): each is a thread's 64 FMAs on its 8×8 outputs, so
the stage's steps unrolled are most of what NVRTC compiles in an f32 matmul. All of them
by default: on an H100, 2 of 8 compiled the FFMA matmul in 0.096 s instead of 0.152 (the
f32 MLP 0.155 / 0.189) but ran it 12 % slower (0.78 against 0.89× cuBLAS at 2048³–8192³;
RESULTS.md, kernels, twentieth session); fewer are for sweeps that compile more than
they run."""

WGMMA_WAVE = 132
"""Blocks of a warpgroup matmul resident at once on an H100 SXM or H200 (132 SMs, one
384-thread block each): a grid of no more keeps row-major order, in which it is one
wave anyway (at 2048³, 128 blocks, the grouped order ran 3 % slower on the H100)."""


def wgmma_tiles(tile_m: int, tile_n: int, m: int, n: int, k: int, batch: int) \
        -> tuple[int, int]:
    """The block tile a warpgroup matmul of ``batch`` × ``m`` × ``n`` outputs, ``k``
    deep, uses: the options', where ``tile_n`` 0 picks 256 columns when the product is
    at least :data:`WGMMA_WIDE_K` deep and 256 columns still make 128 blocks (a wave of
    the GPU's SMs), else 128. A 256-column tile holds 128 accumulators a thread: it
    compiles twice as slowly as 128 (NVVM and ptxas), and pays for it only where a long
    K loop amortises its epilogue (4096³: 602 against 533 TFLOP/s on the H200).

    >>> wgmma_tiles(128, 0, 4096, 4096, 4096, 1), wgmma_tiles(128, 0, 8192, 1024, 256, 1)
    ((128, 256), (128, 128))
    """
    if tile_n == 0:
        wide = tile_m != 256 and k >= WGMMA_WIDE_K and batch * (m // tile_m) * (n // 256) >= 128
        tile_n = 256 if wide else 128
    return tile_m, tile_n

@dataclass(frozen=True)
class KernelOptions:
    block_size: int = 0
    """Threads per block (CUDA) for elementwise and row kernels (a power of two, 32 to
    1024); 0 lets the kernel stage pick (its ``BLOCK_SIZE``, and ``row_block_size`` for a
    row kernel whose row takes a whole block)."""
    vector_width: int = 4
    """Elements per vector load/store (1, 2 or 4)."""
    prefetch: bool = False
    """On, a thread of an f32 elementwise (``grid-stride``) kernel whose grid leaves it
    several vectors loads its next vector before it computes the current one (twice the
    bytes in flight); off, each step of its loop loads, computes and stores one vector.
    Kernels over halves never prefetch (bias_gelu in bf16: 40 registers to 43, five
    blocks of 256 an SM for six). Off by default: on an H100 it made no f32 program
    faster and the elementwise chain 8 % slower (RESULTS.md, kernels, twenty-fifth
    session)."""
    max_registers: int = 0
    """Registers a thread of an elementwise or row kernel may take: its
    ``__launch_bounds__`` asks for ``65536 / (threads · max_registers)`` blocks an SM
    (32 to 255; 0 or 255: no cap, ptxas takes what it likes). A cap of 32 gives a full
    SM of 2048 threads; it made no program faster on an H100, nor did 64 for the half
    row kernels (RESULTS.md, kernels, twenty-fifth session)
    (:func:`accy.preparation.passes.kernel.min_blocks`)."""
    rows_per_block: int = 0
    """Rows per block for row kernels; 0 picks (a warp per row for short rows)."""
    column_split: int = 0
    """Threads that share a row whose elements are a column in memory (a softmax over
    axis 0: ``thread-per-row``), each walking every ``column_split``-th element, their
    reductions combined through shared memory (1, 2, 4 or 8; 0 picks by row length:
    :func:`accy.preparation.passes.kernel.column_split`)."""
    column_vector: int = 0
    """Neighbouring rows a ``thread-per-row`` thread owns (rows that are columns in
    memory: a softmax over axis 0), read and written as one vector of that many elements
    at each step of its row (1, 2, 4 or 8; at most 16 bytes; 0 picks: 2 where a thread
    then walks at most 32 values of its rows, else 1 — the H100 figures behind that are
    :func:`accy.preparation.passes.kernel.column_layout`'s). Where the rows' innermost
    extent does not divide it, a buffer is not aligned to it or an element is no float,
    one row a thread."""
    column_streams: int = 0
    """The runs a ``thread-per-row`` kernel's blocks are dealt into (rows that are
    columns in memory: a softmax over axis 0): block ``b`` of the launch takes the tile
    ``b / streams`` of run ``b % streams``, each run a contiguous stretch of the tiles,
    so the blocks resident at once read ``streams`` places of each row in memory rather
    than one (1: the tiles in launch order; 1 to 1024; 0 picks
    :data:`accy.preparation.passes.kernel.COLUMN_STREAMS`)."""
    tile_m: int = 64
    tile_n: int = 64
    tile_k: int = 16
    """Tile sizes of the generic ``tiled`` matmul (any matmul the FFMA and tensor-core
    kernels below do not take: 16×16 threads a block, each a (tile_m/16)×(tile_n/16)
    micro-tile).

    128×128×8 ran the MLP block 9 % faster on the H200 (18.9 against 17.3
    TFLOP/s) but took 70 % longer to compile (NVRTC unrolls the larger micro-tile
    and its epilogue): the default favours recompilation."""

    ffma_tiles: bool = True
    """f32 matmuls whose operands are plain row-major inputs of the kernel (16-byte
    aligned) and whose shapes divide the ``ffma_tile_*`` tiles run the register-blocked
    FFMA kernel (``ffma-tiled``: 8×8 outputs a thread, float4 loads, two shared buffers);
    every other matmul (or all, when off) the ``tile_*`` tiles above."""
    ffma_tile_m: int = 0
    ffma_tile_n: int = 0
    """``ffma-tiled`` block tile (64 or 128; a thread per 8×8 outputs: 128×128 is 256
    threads). 0 picks by shape: 128×128, else 128×64 or 64×128 while the grid would
    have fewer than 128 blocks (256 when K > 512), 64×64 only where nothing larger
    divides (``_ffma_tile`` in the kernel stage)."""
    ffma_tile_k: int = 8
    """``ffma-tiled`` depth of each shared-memory stage (8 or 16)."""
    ffma_unroll: int = FFMA_UNROLL
    """``ffma-tiled`` k steps unrolled together within a stage (1, 2, 4, 8 or 16; at most
    the stage's depth): fewer compile faster (:data:`FFMA_UNROLL`)."""

    tensor_cores: bool = True
    """bf16/f16 matmuls on the tensor cores (``mma.sync`` m16n8k16, f32 accumulation)
    when the shapes divide the mma tiles and the operands are plain row-major
    inputs; otherwise (or off) the FFMA tiles above."""
    mma_tile_m: int = 128
    mma_tile_n: int = 128
    mma_tile_k: int = 32
    """Tensor-core block tile: ``mma_tile_m × mma_tile_n`` outputs, ``mma_tile_k`` deep per
    stage; warps own 64×32 outputs each (128×128: 8 warps)."""
    stages: int = 3
    """Shared-memory stages of the tensor-core ``cp.async`` pipeline (2–4)."""
    wgmma: bool = True
    """On ``cuda:sm_90a`` (what ``--target cuda`` means on a Hopper GPU), bf16/f16
    matmuls whose shapes divide the warpgroup tiles run on ``wgmma.mma_async``: the TMA
    brings the operands into 128-byte-swizzled shared memory for a producer warpgroup,
    two consumer warpgroups multiply. Off (or another arch, ``sm_90`` included, whose
    source compiles with ``-arch=sm_90``): the ``mma.sync`` tiles above."""
    wgmma_tile_m: int = 128
    wgmma_tile_n: int = 0
    """Warpgroup block tile: ``wgmma_tile_m`` × ``wgmma_tile_n`` outputs (128 or 256
    each, not both 256), 64 deep per stage; two consumer warpgroups share it by rows.
    ``wgmma_tile_n`` 0 picks by shape: 256 where K is at least 2048 and the grid still
    has a wave of blocks (128), else 128 (:func:`wgmma_tiles`)."""
    wgmma_stages: int = 4
    """Shared-memory stages of the warpgroup pipeline (2–6, as shared memory allows)."""
    wgmma_raster: int = WGMMA_RASTER
    """Rows of warpgroup tiles that consecutive blocks sweep together before they move
    along N (1: row-major, a row of tiles after another): the blocks resident at once
    then read a squarer patch of A and B, which L2 holds (:data:`WGMMA_RASTER`). Only
    for grids of more than a wave of blocks (:data:`WGMMA_WAVE`)."""

    attention_tile_m: int = 128
    attention_tile_n: int = 64
    """The flash attention kernel's block tile: ``attention_tile_m`` query rows of one
    batch index a block (32, 64 or 128), keys in tiles of ``attention_tile_n`` (32, 64
    or 128) staged through shared memory with V's rows; shrunk (keys first) while the
    tiles overflow the target's shared memory. 128×64 by default: the fastest of the
    31 tile variants at 512×128×64 and 16×4096×64 on the H200 (27.1 and 35.5
    TFLOP/s against 23.3 and 29.7 for 64×64; RESULTS.md, attention)."""
    attention_threads: int = 256
    """Threads of a flash attention block (64, 128 or 256): 16 share a query row (a
    half-warp: its max and sum are shuffle trees), each owning
    ``attention_tile_m · 16 / attention_threads`` rows × ``attention_tile_n / 16``
    scores of a key tile — at most 8 rows: fewer threads shrink the query tile to
    ``attention_threads / 2`` rows."""
    attention_prefetch: bool = False
    """The flash kernel loads the next key tile (K and V) into registers while it uses
    the current one, when that takes at most 32 floats a thread; off, each tile is
    loaded when it is reached (fewer registers; as fast or faster at every tile the
    H200 measured, so the default)."""

    def _check_block_size(self) -> None:
        if self.block_size == 0:  # by kind and row (the kernel stage's row_block_size)
            return
        _positive("kernel.block_size", self.block_size, power_of_two=True, at_most=1024)
        if self.block_size < 32:
            raise OptionError(f"kernel.block_size must be 0 (picked) or at least 32, got "
                              f"{self.block_size}")

    def __post_init__(self) -> None:
        self._check_block_size()
        self._check_attention_tiles()
        for n in ("mma_tile_m", "mma_tile_n"):
            if getattr(self, n) not in (64, 128):
                raise OptionError(f"kernel.{n} must be 64 or 128, got {getattr(self, n)}")
        if self.mma_tile_k not in (32, 64):
            raise OptionError(f"kernel.mma_tile_k must be 32 or 64, got {self.mma_tile_k}")
        if self.stages not in (2, 3, 4):
            raise OptionError(f"kernel.stages must be 2, 3 or 4, got {self.stages}")
        if self.wgmma_tile_m not in (128, 256):
            raise OptionError(f"kernel.wgmma_tile_m must be 128 or 256, got "
                              f"{self.wgmma_tile_m}")
        if self.wgmma_tile_n not in (0, 128, 256):
            raise OptionError(f"kernel.wgmma_tile_n must be 0 (by shape), 128 or 256, got "
                              f"{self.wgmma_tile_n}")
        if self.wgmma_tile_m == 256 and self.wgmma_tile_n == 256:
            raise OptionError("kernel.wgmma_tile_m and kernel.wgmma_tile_n cannot both be "
                              "256 (256 accumulators a thread)")
        if not 2 <= self.wgmma_stages <= 6:
            raise OptionError(f"kernel.wgmma_stages must be 2 to 6, got {self.wgmma_stages}")
        if not 1 <= self.wgmma_raster <= 64:
            raise OptionError(f"kernel.wgmma_raster must be 1 to 64, got {self.wgmma_raster}")
        self._check_rows()
        for n in ("tile_m", "tile_n"):
            _positive(f"kernel.{n}", getattr(self, n), power_of_two=True, at_most=128)
            if getattr(self, n) < 16:
                raise OptionError(f"kernel.{n} must be at least 16")
        _positive("kernel.tile_k", self.tile_k, power_of_two=True, at_most=64)
        if self.tile_k < 4:
            raise OptionError("kernel.tile_k must be at least 4")
        self._check_ffma_tiles()

    def _check_rows(self) -> None:
        if self.vector_width not in (1, 2, 4):
            raise OptionError(f"kernel.vector_width must be 1, 2 or 4, got {self.vector_width}")
        if self.max_registers and not 32 <= self.max_registers <= 255:
            raise OptionError(f"kernel.max_registers must be 0 (no cap) or 32 to 255, got "
                              f"{self.max_registers}")
        if self.rows_per_block < 0:
            raise OptionError("kernel.rows_per_block must be >= 0")
        if self.column_split not in (0, 1, 2, 4, 8):
            raise OptionError(f"kernel.column_split must be 0 (by row), 1, 2, 4 or 8, got "
                              f"{self.column_split}")
        if not 0 <= self.column_streams <= 1024:
            raise OptionError(f"kernel.column_streams must be 0 (picked) to 1024, got "
                              f"{self.column_streams}")
        if self.column_vector not in (0, 1, 2, 4, 8):
            raise OptionError(f"kernel.column_vector must be 0 (picked), 1, 2, 4 or 8, got "
                              f"{self.column_vector}")

    def _check_attention_tiles(self) -> None:
        for n in ("attention_tile_m", "attention_tile_n"):
            if getattr(self, n) not in (32, 64, 128):
                raise OptionError(f"kernel.{n} must be 32, 64 or 128, got {getattr(self, n)}")
        if self.attention_threads not in (64, 128, 256):
            raise OptionError(f"kernel.attention_threads must be 64, 128 or 256, got "
                              f"{self.attention_threads}")

    def _check_ffma_tiles(self) -> None:
        for n in ("ffma_tile_m", "ffma_tile_n"):
            if getattr(self, n) not in (0, 64, 128):
                raise OptionError(f"kernel.{n} must be 0 (by shape), 64 or 128, got "
                                  f"{getattr(self, n)}")
        if self.ffma_tile_k not in (8, 16):
            raise OptionError(f"kernel.ffma_tile_k must be 8 or 16, got {self.ffma_tile_k}")
        if self.ffma_unroll not in (1, 2, 4, 8, 16):
            raise OptionError(f"kernel.ffma_unroll must be 1, 2, 4, 8 or 16, got "
                              f"{self.ffma_unroll}")

    @property
    def matmul_shared_bytes(self) -> int:
        """Shared memory a tiled matmul kernel of these tiles uses (padded A and B tiles)."""
        return self.tile_k * (self.tile_m + 1 + self.tile_n + 4) * 4

    @property
    def mma_shared_bytes(self) -> int:
        """Shared memory a tensor-core matmul of these tiles and stages uses (2-byte halves)."""
        return self.stages * self.mma_tile_k * (self.mma_tile_m + self.mma_tile_n) * 2

    @property
    def wgmma_shared_bytes(self) -> int:
        """Dynamic shared memory a warpgroup matmul of these tiles and stages uses at most
        (``wgmma_tile_n`` 0 counted as 256 columns unless the rows are 256)."""
        n = self.wgmma_tile_n or (128 if self.wgmma_tile_m == 256 else 256)
        return wgmma_shared_bytes(self.wgmma_tile_m, n, self.wgmma_stages)

    def check_target(self, backend: Backend) -> None:
        """The options fit the target's limits (shared memory)."""
        if self.wgmma and backend.wgmma and \
                self.wgmma_shared_bytes > backend.max_dynamic_shared_bytes:
            n = self.wgmma_tile_n or (128 if self.wgmma_tile_m == 256 else 256)
            raise OptionError(f"kernel.wgmma_stages={self.wgmma_stages} of "
                              f"{self.wgmma_tile_m}×{n}×64 warpgroup tiles needs "
                              f"{self.wgmma_shared_bytes} bytes of shared memory (at most "
                              f"{backend.max_dynamic_shared_bytes} on {backend.name})")
        if self.tensor_cores and self.mma_shared_bytes > backend.max_shared_bytes:
            raise OptionError(f"kernel.stages={self.stages} of {self.mma_tile_m}×"
                              f"{self.mma_tile_n}×{self.mma_tile_k} tensor-core tiles needs "
                              f"{self.mma_shared_bytes} bytes of shared memory (at most "
                              f"{backend.max_shared_bytes} on {backend.name})")
        if self.matmul_shared_bytes > backend.max_shared_bytes:
            raise OptionError(f"kernel.tile_k={self.tile_k} with {self.tile_m}×{self.tile_n} "
                              f"tiles needs {self.matmul_shared_bytes} bytes of shared memory "
                              f"(at most {backend.max_shared_bytes} on {backend.name})")


@dataclass(frozen=True)
class TargetOptions:
    fast_math: bool = False
    """Use fast approximate math intrinsics (``__expf``…)."""




def _convert(stage: str, f: dataclasses.Field[Any], text: str) -> Any:
    full = f"{stage}.{f.name}"
    if f.type in ("bool", bool):
        low = text.strip().lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise OptionError(f"{full} takes true or false, got '{text}'")
    if f.type in ("int", int):
        try:
            return int(text, 0)
        except ValueError:
            raise OptionError(f"{full} takes an integer, got '{text}'") from None
    return text



@functools.lru_cache(maxsize=4096)
def _stage_key_fields(stage: str, group: Any, target: Target) -> dict[str, Any]:
    """:meth:`RunOptions.stage_key_fields`, once per (stage, options, target): a batch
    asks it for every stage of every variant, and ``dataclasses.asdict`` was half of
    the client's time before the first task could start (cProfile, 480 variants)."""
    out: dict[str, Any] = dataclasses.asdict(group)
    if stage == "kernel":
        out["target.kind"] = target.kind
        if target.backend.thread_blocks:
            # tensor cores from sm_80; attention tiles fit the arch's shared memory
            out["target.arch"] = target.arch
    if stage == "target":
        out["target"] = str(target)
    return out

@dataclass(frozen=True)
class RunOptions:
    """The target plus every stage's options."""

    target: Target = field(default_factory=Target)
    contract: ContractOptions = field(default_factory=ContractOptions)
    tensor: TensorOptions = field(default_factory=TensorOptions)
    dispatch: DispatchOptions = field(default_factory=DispatchOptions)
    memory: MemoryOptions = field(default_factory=MemoryOptions)
    kernel: KernelOptions = field(default_factory=KernelOptions)
    target_options: TargetOptions = field(default_factory=TargetOptions)

    def __post_init__(self) -> None:
        self.kernel.check_target(self.target.backend)

    def __hash__(self) -> int:
        """The fields' hash, computed once: a batch's client looks its key templates up
        by options some twenty times a variant, and hashing the seven nested option sets
        each time took 1.4 µs (0.25 once cached; a template lookup 1.75 → 0.69 µs, 2-core
        machine). Never pickled: a string's hash differs between processes."""
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash(tuple(getattr(self, f.name) for f in fields(self)))
            object.__setattr__(self, "_hash", h)
        return h

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    @staticmethod
    def parse(target: str | Target = "host", assignments: Iterable[str] | Mapping[str, Any] = ()) \
            -> RunOptions:
        """Build from a target and ``STAGE.NAME=VALUE`` assignments (or a mapping).

        Options are immutable, so equal requests share one parse (a variant's
        options are read by every stage task of a batch).
        """
        tgt = target if isinstance(target, Target) else Target.parse(target)
        pairs: list[tuple[str, str]] = []
        if isinstance(assignments, Mapping):
            pairs = [(k, str(v).lower() if isinstance(v, bool) else str(v))
                     for k, v in assignments.items()]
        else:
            for a in assignments:
                if "=" not in a:
                    raise OptionError(f"option '{a}' must look like STAGE.NAME=VALUE")
                k, v = a.split("=", 1)
                pairs.append((k.strip(), v.strip()))
        return _parse_pairs(tgt, tuple(pairs))

    @staticmethod
    def _build(tgt: Target, pairs: tuple[tuple[str, str], ...]) -> RunOptions:
        groups = option_groups()
        per_stage: dict[str, dict[str, Any]] = {s: {} for s in groups}
        for key, value in pairs:
            stage, _, name = key.partition(".")
            if stage not in groups or not name:
                raise OptionError(f"unknown option '{key}' (stages: {', '.join(groups)})")
            fmap = {f.name: f for f in fields(groups[stage])}
            if name not in fmap:
                known = ", ".join(f"{stage}.{n}" for n in fmap)
                raise OptionError(f"unknown option '{key}' (known: {known})")
            per_stage[stage][name] = _convert(stage, fmap[name], value)
        built = {_field_of(s): groups[s](**per_stage[s]) for s in groups}
        return RunOptions(tgt, **built)

    def stage_options(self, stage: str) -> Any:
        """The options group ``stage.*`` (each stage has one, named after it)."""
        return getattr(self, _field_of(stage))

    def stage_key_fields(self, stage: str) -> dict[str, Any]:
        """Every option ``stage`` reads (the target included where it reads it)."""
        return dict(_stage_key_fields(stage, self.stage_options(stage), self.target))

    def assignments(self) -> dict[str, Any]:
        """The non-default options as ``STAGE.NAME`` → value."""
        out: dict[str, Any] = {}
        for s, group in option_groups().items():
            opts = self.stage_options(s)
            default = group()
            for f in fields(opts):
                if getattr(opts, f.name) != getattr(default, f.name):
                    out[f"{s}.{f.name}"] = getattr(opts, f.name)
        return out


@functools.lru_cache(maxsize=4096)
def _parse_pairs(tgt: Target, pairs: tuple[tuple[str, str], ...]) -> RunOptions:
    return RunOptions._build(tgt, pairs)


def _field_of(stage: str) -> str:
    # ``target`` names the Target itself; the target stage's options are ``target_options``
    return "target_options" if stage == "target" else stage


def option_groups() -> dict[str, type]:
    """``STAGE`` → its options dataclass, in pipeline order (read off :class:`RunOptions`)."""
    return {("target" if f.name == "target_options" else f.name): globals()[str(f.type)]
            for f in fields(RunOptions) if f.name != "target"}


def parse_shapes(assignments: Iterable[str] | Mapping[str, str]) -> dict[int, tuple[int, ...]]:
    """``arg0=8192x4096`` → ``{0: (8192, 4096)}`` (repeatable, one per argument)."""
    pairs = list(assignments.items()) if isinstance(assignments, Mapping) else \
        [tuple(a.split("=", 1)) if "=" in a else (a, "") for a in assignments]
    out: dict[int, tuple[int, ...]] = {}
    for key, value in pairs:
        m = re.fullmatch(r"arg(\d+)", str(key).strip())
        if not m:
            raise OptionError(f"--shape key '{key}' must be argN (e.g. arg0=8192x4096)")
        text = str(value).strip()
        if text in ("", "scalar"):
            dims: tuple[int, ...] = ()
        elif re.fullmatch(r"\d+(x\d+)*", text):
            dims = tuple(int(d) for d in text.split("x"))
        else:
            raise OptionError(f"--shape value '{value}' for {key} must look like 8192x4096")
        idx = int(m.group(1))
        if idx in out:
            raise OptionError(f"--shape given twice for arg{idx}")
        out[idx] = dims
    return out
