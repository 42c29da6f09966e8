"""Target backends: what a target is, held in one object per target.

A :class:`Backend` knows a target's limits (threads per block, shared
memory), the element types it supports, how its emitters spell source (the
language), its compiler's identity and flags, how to compile and load a
fragment, and whether loading needs a GPU worker. :meth:`Target.parse
<accy.preparation.options.Target.parse>` returns the target whose
``backend`` is one of these; below the CLI no code compares target strings.

The backend also completes the stage table (:mod:`accy.pipeline`): the six
preparation stages are the same for every target, and the backend appends
its tail — ``compile`` and ``load`` — as Triton's ``backend.add_stages`` does.

Describing a backend never imports CuPy or a compiler: the modules that
compile and load are named here (``compiler_module``) and imported only when
a fragment is compiled or loaded, so parsing an option stays cheap.

Example
-------
>>> b = backend_for("cuda", "sm_90")
>>> b.language, b.max_threads_per_block, b.needs_gpu, b.arch
('cuda', 1024, True, 'sm_90')
>>> HOST.language, HOST.needs_gpu, HOST.flags(fast_math=True)[:2]
('c', False, ('-O3', '-fPIC'))
"""

from __future__ import annotations

import functools
import importlib
import subprocess
import sys
from dataclasses import dataclass
from typing import Any, ClassVar

ALL_DTYPES = frozenset({"f32", "f16", "bf16", "f64", "i1", "i8", "i16", "i32", "i64", "ui8",
                        "ui16", "ui32", "ui64"})

HOST_FLAGS = ("-O3", "-fPIC", "-shared", "-std=c11", "-fno-math-errno")


@dataclass(frozen=True)
class Backend:
    """One target: limits, dtypes, language, compiler, loader."""

    kind: ClassVar[str]
    """``host`` or ``cuda``: the target family (the CLI spelling's prefix)."""
    language: ClassVar[str]
    """What the target stage's renderer spells: ``c`` or ``cuda``."""
    needs_gpu: ClassVar[bool]
    """Loading (and running) a fragment needs a GPU worker."""
    thread_blocks: ClassVar[bool]
    """Kernels run as grids of thread blocks (the kernel stage maps work onto threads);
    otherwise each kernel is a plain loop nest."""
    compiler_module: ClassVar[str] = "accy.executable.device"
    """The module that compiles and loads (imported only to compile or load)."""
    max_threads_per_block: ClassVar[int]
    max_shared_bytes: ClassVar[int]
    """Static shared memory a kernel may use (bytes)."""
    max_grid: ClassVar[tuple[int, int, int]]
    """Blocks a launch may have along x, y, z."""
    max_buffer_bytes: ClassVar[int] = 1 << 40
    """The largest global buffer accy plans for (1 TiB): a bigger one is an error at
    the target stage, before anything is allocated."""
    dtypes: ClassVar[frozenset[str]] = ALL_DTYPES

    @property
    def arch(self) -> str:
        raise NotImplementedError

    @property
    def sm_number(self) -> int:
        """The CUDA compute capability as a number (``sm_90`` → 90); 0 off CUDA."""
        return 0

    @property
    def max_dynamic_shared_bytes(self) -> int:
        """Dynamic shared memory a kernel may ask for at launch (bytes; 0: none)."""
        return 0

    @property
    def wgmma(self) -> bool:
        """Hopper's warpgroup tensor-core instructions (``wgmma``) are available: the
        arch-specific target ``sm_90a``."""
        return False

    @property
    def name(self) -> str:
        """The target as the CLI spells it (``host``, ``cuda:sm_90``)."""
        raise NotImplementedError

    def device(self) -> Any:
        """The compile/load module (imports the compiler bindings)."""
        return importlib.import_module(self.compiler_module)

    def flags(self, fast_math: bool) -> tuple[str, ...]:
        raise NotImplementedError

    def compiler_identity(self) -> str:
        raise NotImplementedError

    def compile(self, source: str, workspace: str, flags: tuple[str, ...], *,
                split: bool = False) -> tuple[bytes, str]:
        """Compile ``source``; return the binary and the source file's path. ``split``: a
        unit of several kernels may compile as one program per kernel, at once (where
        the compiler allows it: CUDA)."""
        raise NotImplementedError

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class HostBackend(Backend):
    """Plain C compiled by the system C compiler into a shared object, loaded by ctypes."""

    kind: ClassVar[str] = "host"
    language: ClassVar[str] = "c"
    needs_gpu: ClassVar[bool] = False
    thread_blocks: ClassVar[bool] = False
    max_threads_per_block: ClassVar[int] = 1 << 30
    max_shared_bytes: ClassVar[int] = 1 << 30
    max_grid: ClassVar[tuple[int, int, int]] = (1 << 62, 1 << 62, 1 << 62)

    @property
    def arch(self) -> str:
        return "host"

    @property
    def name(self) -> str:
        return "host"

    def flags(self, fast_math: bool) -> tuple[str, ...]:
        return HOST_FLAGS

    def compiler_identity(self) -> str:
        return str(self.device().host_compiler_identity())

    def compile(self, source: str, workspace: str, flags: tuple[str, ...], *,
                split: bool = False) -> tuple[bytes, str]:
        import os

        so = self.device().compile_host(source, workspace, flags=flags, name="fragment")
        with open(so, "rb") as f:
            return f.read(), os.path.join(workspace, "fragment.c")


@dataclass(frozen=True)
class CudaBackend(Backend):
    """CUDA C compiled by NVRTC into a cubin for one ``sm_XX`` arch, loaded by CuPy."""

    sm: str = "sm_90"
    kind: ClassVar[str] = "cuda"
    language: ClassVar[str] = "cuda"
    needs_gpu: ClassVar[bool] = True
    thread_blocks: ClassVar[bool] = True
    max_threads_per_block: ClassVar[int] = 1024
    max_shared_bytes: ClassVar[int] = 48 * 1024
    max_grid: ClassVar[tuple[int, int, int]] = ((1 << 31) - 1, 65535, 65535)

    @property
    def max_dynamic_shared_bytes(self) -> int:
        """Shared memory a block may opt in to: 227 KB on sm_90, 163 KB on sm_80/87,
        99 KB on sm_86/89, else the static 48 KB."""
        return {90: 227 * 1024, 80: 163 * 1024, 87: 163 * 1024, 86: 99 * 1024,
                89: 99 * 1024}.get(self.sm_number, 48 * 1024)

    @property
    def wgmma(self) -> bool:
        return self.sm == "sm_90a"

    @property
    def arch(self) -> str:
        return self.sm

    @property
    def name(self) -> str:
        return f"cuda:{self.sm}"

    @property
    def sm_number(self) -> int:
        """The compute capability as a number (``sm_90`` → 90)."""
        return int(self.sm[3:].rstrip("a"))

    def flags(self, fast_math: bool) -> tuple[str, ...]:
        # No implicit a*b+c contraction: a value the kernel recomputes (a fused producer
        # read again in a later row pass) must round the same every time, as NumPy's
        # does; kernels that want an FMA (the matmul's inner product) spell fmaf.
        return ("-use_fast_math",) if fast_math else ("--fmad=false",)

    def compiler_identity(self) -> str:
        return str(self.device().cuda_compiler_identity())

    def compile(self, source: str, workspace: str, flags: tuple[str, ...], *,
                split: bool = False) -> tuple[bytes, str]:
        import os

        from accy.target.common import kernel_parts

        head, parts = kernel_parts(source) if split else (source, [])
        binary = self.device().compile_cuda_parts(head, parts, self.sm, options=flags,
                                                  name="fragment.cu", workspace=workspace)
        return binary, os.path.join(workspace, "fragment.cu")


HOST = HostBackend()


def backend_for(kind: str, arch: str | None = None) -> Backend:
    """The backend of a parsed target (``kind`` and ``arch`` already validated)."""
    if kind == "host":
        return HOST
    if kind == "cuda":
        return CudaBackend(arch or "sm_90")
    raise ValueError(f"no backend for target kind {kind!r}")


def backend_of(target: str) -> Backend:
    """The backend of a target as spelled in a plan (``host``, ``cuda:sm_90``)."""
    kind, _, arch = target.partition(":")
    return backend_for(kind, arch or None)


def target_arch(device_arch: str) -> str:
    """The arch ``--target cuda`` compiles for on a GPU of ``device_arch``: the device's
    arch-specific target where accy uses its features (``sm_90`` → ``sm_90a``:
    Hopper's warpgroup matmuls), else the device's arch. A cubin for ``sm_90a`` runs
    on compute capability 9.0 only, as accy's cubins are made for the local device.

    >>> target_arch("sm_90"), target_arch("sm_89")
    ('sm_90a', 'sm_89')
    """
    return "sm_90a" if device_arch == "sm_90" else device_arch


def runs_on(target_arch: str, device_arch: str) -> bool:
    """Whether a cubin accy compiles for ``target_arch`` runs on a GPU of ``device_arch``
    (as a device reports it, ``sm_XY``): the same compute capability, the arch-specific
    ``sm_90a`` included — what :func:`target_arch` picks for that device.

    >>> runs_on("sm_90a", "sm_90"), runs_on("sm_90", "sm_90"), runs_on("sm_90a", "sm_89")
    (True, True, False)
    """
    return target_arch.removesuffix("a") == device_arch.removesuffix("a")


@functools.cache
def local_cuda_arch() -> str | None:
    """The local GPU's ``sm_XX``, or None (only ``--target cuda`` asks).

    Asked of CuPy here when this process has loaded it already; otherwise in a
    child process, so that a process that only names the target (the client of
    ``accy batch`` over a sweep with ``targets: [cuda]``) never loads CuPy or
    creates a CUDA context — a few hundred MB of its RSS — for the question.
    """
    if "cupy" in sys.modules:
        arch: str | None = importlib.import_module(Backend.compiler_module).local_arch()
        return arch
    probe = ("from accy.executable.device import local_arch; "
             "print('accy-arch', local_arch() or '')")
    try:
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                             timeout=120, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    for line in reversed(out.stdout.splitlines()):
        if line.startswith("accy-arch"):
            found = line.split()[1:]
            return found[0] if found and found[0].startswith("sm_") else None
    return None


__all__ = ["Backend", "HostBackend", "CudaBackend", "HOST", "backend_for", "backend_of",
           "local_cuda_arch", "runs_on", "target_arch", "ALL_DTYPES", "HOST_FLAGS"]
