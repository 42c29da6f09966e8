"""The device boundary: the one module of accy that talks to CuPy, NVRTC and cc.

Everything here imports CuPy (and ``cupy_backends``) lazily, inside functions,
so ``import accy`` stays free of CuPy. Failures of the underlying tools become
:class:`~accy.errors.FragmentCompileError` (with the compiler log, the options
and the path of the saved source) or :class:`~accy.errors.FragmentLoadError`.

Compiling needs no GPU: NVRTC produces a cubin for any ``sm_XY`` it knows, and
the host C compiler builds a shared object. Loading a cubin needs a GPU.

Example
-------
>>> cubin = compile_cuda('extern "C" __global__ void k(float* x) {}', "sm_90")
>>> cubin[:4]
b'\\x7fELF'
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shlex
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import msgpack
import numpy as np

from accy.errors import FragmentCompileError, FragmentLoadError
from accy.files import write_atomic
from accy.host import available_cores
from accy.paths import lasting_source, private_subdir
from accy.target.backend import HOST_FLAGS

DEFAULT_HOST_FLAGS: tuple[str, ...] = HOST_FLAGS  # the host backend's flags
"""Flags :func:`compile_host` passes to the C compiler unless told otherwise."""


# ---------------------------------------------------------------- NVRTC (no GPU needed)


def nvrtc_version() -> tuple[int, int]:
    """The (major, minor) version of the NVRTC library CuPy binds to.

    Example
    -------
    >>> nvrtc_version() >= (12, 0)
    True
    """
    from cupy_backends.cuda.libs import nvrtc

    major, minor = nvrtc.getVersion()
    return int(major), int(minor)


def cuda_compiler_identity() -> str:
    """The CUDA compiler's identity for compile keys, e.g. ``"nvrtc-13.5"``.

    Example
    -------
    >>> cuda_compiler_identity().startswith("nvrtc-")
    True
    """
    major, minor = nvrtc_version()
    return f"nvrtc-{major}.{minor}"


def compile_cuda(
    source: str,
    arch: str,
    *,
    options: Sequence[str] = (),
    name: str = "fragment.cu",
    workspace: str | None = None,
) -> bytes:
    """Compile CUDA C++ ``source`` to a cubin for ``arch`` (``"sm_90"``) with NVRTC.

    The options are ``-arch=<arch>``, ``--std=c++17``, then ``options`` (for
    example ``-use_fast_math``). When ``workspace`` is given the source is saved
    there as ``name``; otherwise it is saved to the user's
    ``accy.paths.user_dir("sources")`` only when compilation fails, so the error
    always points at a file to open.

    Raises
    ------
    FragmentCompileError
        NVRTC rejected the source or an option; carries NVRTC's log, the
        options and the path of the saved source.

    Example
    -------
    >>> src = 'extern "C" __global__ void twice(float* x) { x[threadIdx.x] *= 2; }'
    >>> compile_cuda(src, "sm_90", options=["-use_fast_math"])[:4]
    b'\\x7fELF'
    """
    opts = (f"-arch={arch}", "--std=c++17", *options)
    source_path = _saved_source(workspace, name, source)
    cubin, failure = _nvrtc(source, name, opts)
    if failure is None:
        return cubin
    error, log = failure
    raise FragmentCompileError(
        f"NVRTC failed to compile {name} for {arch} ({error})",
        log=log,
        options=opts,
        source_path=lasting_source(source_path, name, source),
    )


CUBINS_TAG = b"accy-cubins"
"""The first field of a binary that holds several cubins (:func:`compile_cuda_parts`)."""


def compile_cuda_parts(
    head: str,
    parts: Sequence[str],
    arch: str,
    *,
    options: Sequence[str] = (),
    name: str = "fragment.cu",
    workspace: str | None = None,
) -> bytes:
    """Compile the translation unit ``head + "".join(parts)`` as one NVRTC program per
    part (``head + part``), the programs at once in threads (NVRTC runs without the
    GIL): a unit of several kernels — the MLP's two matmuls — costs its slowest kernel's
    compile rather than the sum of them all. ``head`` must hold everything the parts
    use (:func:`accy.target.common.kernel_parts` splits a rendered unit so).

    Returns one cubin when there is at most one part, else msgpack of
    ``[CUBINS_TAG, [cubin, ...]]``, which :class:`CudaModule` loads as one module per
    cubin. The whole source is what ``workspace`` keeps. If any part fails, the whole
    unit compiles as one program, so the error (and its log) is the one
    :func:`compile_cuda` gives for it.

    Example
    -------
    >>> k = 'extern "C" __global__ void {}(float* x) {{ x[0] = 1; }}\\n'
    >>> two = compile_cuda_parts("", [k.format("a"), k.format("b")], "sm_90")
    >>> msgpack.unpackb(two)[0], [c[:4] for c in msgpack.unpackb(two)[1]]
    (b'accy-cubins', [b'\\x7fELF', b'\\x7fELF'])
    """
    source = head + "".join(parts)
    if len(parts) < 2:
        return compile_cuda(source, arch, options=options, name=name, workspace=workspace)
    opts = (f"-arch={arch}", "--std=c++17", *options)
    _saved_source(workspace, name, source)
    stem = name.rsplit(".", 1)[0]
    with ThreadPoolExecutor(min(len(parts), available_cores())) as pool:
        runs = list(pool.map(lambda ip: _nvrtc(head + ip[1], f"{stem}.k{ip[0]}.cu", opts),
                             enumerate(parts)))
    if any(failure is not None for _, failure in runs):
        return compile_cuda(source, arch, options=options, name=name, workspace=workspace)
    return bytes(msgpack.packb([CUBINS_TAG, [cubin for cubin, _ in runs]],
                               use_bin_type=True))


def cubins(binary: bytes) -> list[bytes]:
    """The cubins of a binary :func:`compile_cuda` or :func:`compile_cuda_parts` made.

    >>> cubins(b"\\x7fELF...") == [b"\\x7fELF..."]
    True
    """
    if binary[:4] == b"\x7fELF":
        return [binary]
    try:
        tag, found = msgpack.unpackb(binary)
    except Exception:  # noqa: BLE001 - not msgpack: a single binary
        return [binary]
    if tag != CUBINS_TAG or not isinstance(found, list):
        return [binary]
    return [bytes(c) for c in found]


def _saved_source(workspace: str | None, name: str, source: str) -> str | None:
    """Save ``source`` as ``<workspace>/<name>`` when there is a workspace; its path."""
    if workspace is None:
        return None
    os.makedirs(workspace, exist_ok=True)
    path = os.path.join(workspace, name)
    write_atomic(path, source.encode())
    return path


class NvrtcCounts(NamedTuple):
    """What :func:`nvrtc_counts` counts."""

    programs: int
    kernels: int
    seconds: float
    """Wall seconds inside NVRTC (creating, compiling, reading back the cubin)."""


_NVRTC_COUNTS: list[int] = [0, 0, 0]  # programs, kernels, nanoseconds
_NVRTC_COUNTS_LOCK = threading.Lock()


def nvrtc_counts(*, reset: bool = False) -> NvrtcCounts:
    """The NVRTC programs this process compiled, the kernels they held (``extern "C"
    __global__`` in their sources) and the seconds that took, since it started or the
    last ``reset``: how many times a batch compiled its sources, and at what cost
    (``benchmarks/batch.py`` reads it on every worker). ``reset`` starts them from zero
    again, returning the counts before.

    >>> _ = nvrtc_counts(reset=True)
    >>> _ = compile_cuda('extern "C" __global__ void k(float* x) { x[0] = 1; }', "sm_90")
    >>> c = nvrtc_counts()
    >>> (c.programs, c.kernels), c.seconds > 0
    ((1, 1), True)
    """
    with _NVRTC_COUNTS_LOCK:
        programs, kernels, ns = _NVRTC_COUNTS
        if reset:
            _NVRTC_COUNTS[:] = [0, 0, 0]
    return NvrtcCounts(programs, kernels, ns / 1e9)


def _nvrtc(source: str, name: str, opts: Sequence[str]) \
        -> tuple[bytes, None] | tuple[bytes, tuple[Exception, str]]:
    """One NVRTC program: its cubin and None, or no bytes and NVRTC's error and log."""
    from cupy_backends.cuda.libs import nvrtc

    with _NVRTC_COUNTS_LOCK:
        _NVRTC_COUNTS[0] += 1
        _NVRTC_COUNTS[1] += source.count('extern "C" __global__')

    t0 = time.perf_counter_ns()
    prog = nvrtc.createProgram(source, name, [], [])
    try:
        try:
            nvrtc.compileProgram(prog, list(opts))
            return _whole_cubin(prog, bytes(nvrtc.getCUBIN(prog))), None
        except nvrtc.NVRTCError as e:
            return b"", (e, nvrtc.getProgramLog(prog) or str(e))
    finally:
        nvrtc.destroyProgram(prog)
        with _NVRTC_COUNTS_LOCK:
            _NVRTC_COUNTS[2] += time.perf_counter_ns() - t0


def _whole_cubin(prog: int, cubin: bytes) -> bytes:
    """The whole cubin of NVRTC program ``prog``, of which CuPy's ``getCUBIN`` returned
    ``cubin``: CuPy 14 drops its last byte (it strips the terminator NVRTC counts in a
    PTX or log size, which a cubin's size does not hold), so the ELF ends one byte
    short of its last header — a driver loads it, but ``cuobjdump`` and ``nvdisasm``
    reject it. Read again through NVRTC's C API (the library CuPy loaded, by soname)
    when its size says a byte is missing; otherwise ``cubin`` as it is."""
    try:
        lib = _nvrtc_library()
        size = ctypes.c_size_t()
        if lib.nvrtcGetCUBINSize(ctypes.c_void_p(prog), ctypes.byref(size)) != 0 or \
                size.value != len(cubin) + 1:
            return cubin
        buf = ctypes.create_string_buffer(size.value)
        if lib.nvrtcGetCUBIN(ctypes.c_void_p(prog), buf) != 0 or buf.raw[:len(cubin)] != cubin:
            return cubin
        return buf.raw
    except (OSError, AttributeError):
        return cubin


@functools.cache
def _nvrtc_library() -> ctypes.CDLL:
    """NVRTC's shared library, as loaded by CuPy (``libnvrtc.so.<major>``)."""
    return ctypes.CDLL(f"libnvrtc.so.{nvrtc_version()[0]}")


# ---------------------------------------------------------------- host C compiler


def _cc_command() -> list[str]:
    return shlex.split(os.environ.get("CC", "cc")) or ["cc"]


@functools.cache
def _cc_identity(cc: str) -> str:
    cmd = shlex.split(cc)
    try:
        out = subprocess.run([*cmd, "--version"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        raise FragmentCompileError(
            f"no usable C compiler {cc!r} (install gcc or clang, or set $CC): {e}"
        ) from None
    first = out.stdout.strip().splitlines()[0] if out.stdout.strip() else "unknown version"
    return f"{cmd[0]}: {first}"


def host_compiler_identity() -> str:
    """The host C compiler (``$CC`` or ``cc``) and the first line of its ``--version``.

    Example
    -------
    >>> host_compiler_identity()  # doctest: +SKIP
    'cc: cc (Debian 12.2.0-14+deb12u1) 12.2.0'
    """
    return _cc_identity(shlex.join(_cc_command()))


def compile_host(
    source: str,
    workspace: str | None = None,
    *,
    flags: Sequence[str] = DEFAULT_HOST_FLAGS,
    name: str = "fragment",
) -> str:
    """Compile C ``source`` to ``<workspace>/<name>.so`` and return that path.

    ``workspace`` defaults to a fresh folder in this process's private
    directory (:func:`accy.paths.private_subdir`), removed at exit. The source
    is written to ``<workspace>/<name>.c`` (and, if the compile fails, kept in
    ``accy.paths.user_dir("sources")``, the path the error names); the library is built
    under a temporary name in the same folder and moved into place with
    ``os.replace``, so a reader never sees a half-written ``.so``. ``-lm`` is
    linked.

    Raises
    ------
    FragmentCompileError
        The compiler rejected the source (log: its stderr) or is missing.

    Example
    -------
    >>> so = compile_host("void f(void** b) {}")
    >>> so.endswith("fragment.so")
    True
    """
    workspace = workspace or private_subdir("build-")
    os.makedirs(workspace, exist_ok=True)
    source_path = os.path.join(workspace, f"{name}.c")
    so_path = os.path.join(workspace, f"{name}.so")
    write_atomic(source_path, source.encode())
    fd, tmp = tempfile.mkstemp(dir=workspace, prefix=f".{name}-", suffix=".so.tmp")
    os.close(fd)
    cmd = [*_cc_command(), *flags, "-o", tmp, source_path, "-lm"]
    try:
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True)
        except OSError as e:
            raise FragmentCompileError(
                f"no usable C compiler {cmd[0]!r} (install gcc or clang, or set $CC): {e}",
                options=tuple(flags),
                source_path=lasting_source(source_path, f"{name}.c", source),
            ) from None
        if proc.returncode != 0:
            raise FragmentCompileError(
                f"{cmd[0]} failed to compile {name}.c (exit {proc.returncode})",
                log=proc.stderr,
                options=tuple(flags),
                source_path=lasting_source(source_path, f"{name}.c", source),
            )
        os.replace(tmp, so_path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return so_path


class HostLibrary:
    """A shared object built by :func:`compile_host`, loaded with ``ctypes``.

    Note that ``dlopen`` returns the already-loaded library for a path it has
    seen, so a process must not rebuild a different library at the same path
    and load it again; give each compile key its own workspace.

    Example
    -------
    >>> src = "void twice(void** b, long long n) { float* x = b[0]; for (long long i = 0; i < n; i++) x[i] *= 2; }"
    >>> lib = HostLibrary(compile_host(src))
    >>> x = np.ones(3, np.float32)
    >>> lib.call("twice", [x.ctypes.data], 3)
    >>> x.tolist()
    [2.0, 2.0, 2.0]
    """

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            self._lib = ctypes.CDLL(os.path.abspath(path))
        except OSError as e:
            raise FragmentLoadError(f"cannot load host library {path}: {e}") from None

    def _function(self, name: str) -> Any:
        try:
            fn = getattr(self._lib, name)
        except AttributeError:
            raise FragmentLoadError(f"{self.path} has no function {name!r}") from None
        fn.restype = None
        return fn

    def call(self, name: str, pointers: Sequence[int], *ints: int) -> None:
        """Call ``void name(void** buffers, int64_t i0, ...)``.

        ``pointers`` are addresses (``ndarray.ctypes.data``); the caller keeps
        the memory they point into alive for the call. ``ints`` follow as
        ``int64_t`` arguments.
        """
        buffers = (ctypes.c_void_p * max(len(pointers), 1))(*pointers)
        self._function(name)(buffers, *(ctypes.c_int64(int(i)) for i in ints))

    def call_with_buffers(self, name: str, arrays: Sequence[np.ndarray], *ints: int) -> None:
        """Call ``void name(void** buffers, ...)`` with the data of C-contiguous ``arrays``.

        Example
        -------
        >>> lib = HostLibrary(compile_host("void z(void** b) { ((float*)b[0])[0] = 0; }"))
        >>> x = np.ones(2, np.float32); lib.call_with_buffers("z", [x]); x.tolist()
        [0.0, 1.0]
        """
        for i, a in enumerate(arrays):
            if not a.flags.c_contiguous:
                raise ValueError(f"buffer {i} of {name} is not C-contiguous")
        self.call(name, [a.ctypes.data for a in arrays], *ints)


# ---------------------------------------------------------------- GPU (CuPy)


@functools.cache
def gpu_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device (probed once per process).

    Example
    -------
    >>> isinstance(gpu_available(), bool)
    True
    """
    try:
        import cupy

        return int(cupy.cuda.runtime.getDeviceCount()) > 0
    except Exception:
        return False


def local_arch() -> str | None:
    """``"sm_XY"`` of the current CUDA device, or None without a GPU.

    Example
    -------
    >>> local_arch() is None or local_arch().startswith("sm_")
    True
    """
    if not gpu_available():
        return None
    import cupy

    return f"sm_{cupy.cuda.Device().compute_capability}"


_TMAP_DTYPES = {"bf16": 9, "f16": 6, "f32": 7}
"""``CUtensorMapDataType`` of the element types a tensor map is made for."""
_DRIVER: Any = None


def _cuda_driver() -> Any:
    """``libcuda`` through ctypes, for the one call CuPy does not wrap."""
    global _DRIVER
    if _DRIVER is None:
        import ctypes

        lib = ctypes.CDLL("libcuda.so.1")
        lib.cuTensorMapEncodeTiled.restype = ctypes.c_int
        _DRIVER = lib
    return _DRIVER


def tensor_map(address: int, element: str, rows: int, cols: int, box_rows: int,
               box_cols: int) -> np.void:
    """A TMA tensor map (``CUtensorMap``, 128 bytes, passed to a kernel by value) of a
    row-major ``rows`` × ``cols`` ``element`` matrix at device ``address``: tiles of
    ``box_rows`` × ``box_cols``, 128-byte swizzle (the layout ``wgmma`` reads), L2
    promotion of 128 bytes, zero fill out of bounds.

    Raises
    ------
    FragmentLoadError
        The driver refused the map (an address not 16-byte aligned, a box too big).
    """
    import ctypes

    buf = np.zeros(192, np.uint8)
    off = (-buf.ctypes.data) % 64  # CUtensorMap is 64-byte aligned
    item = 4 if element == "f32" else 2
    u64x2, u32x2 = ctypes.c_uint64 * 2, ctypes.c_uint32 * 2
    err = _cuda_driver().cuTensorMapEncodeTiled(
        ctypes.c_void_p(buf.ctypes.data + off), ctypes.c_int(_TMAP_DTYPES[element]),
        ctypes.c_uint32(2), ctypes.c_void_p(address), u64x2(cols, rows),
        (ctypes.c_uint64 * 1)(cols * item), u32x2(box_cols, box_rows), u32x2(1, 1),
        ctypes.c_int(0), ctypes.c_int(3), ctypes.c_int(2), ctypes.c_int(0))
    if err != 0:
        raise FragmentLoadError(f"cannot make a tensor map of a {rows}x{cols} {element} "
                                f"matrix at {address:#x} (CUresult {err})")
    out: np.void = np.frombuffer(buf[off:off + 128].tobytes(), dtype="V128")[0]
    return out


_STATIC_SHARED_LIMIT = 48 * 1024
"""Shared memory a launch may pass without the kernel opting in."""
_MAX_DYNAMIC_SHARED_ATTRIBUTE = 8
"""``CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES``."""


_MODULES: dict[tuple[int, bytes], CudaModule] = {}
_MODULES_LOCK = threading.Lock()


def cuda_module(cubin: bytes) -> CudaModule:
    """This process's :class:`CudaModule` of ``cubin`` on the current device: loaded once
    however many fragments share the binary (the fragments of one grouped compile share
    one cubin holding all their kernels; loading it again for each cost a module load of
    the whole group per fragment). Kept for the life of the process, as the fragments
    that use it are (:func:`accy.executable.fragment.load_fragment`)."""
    import cupy

    key = (cupy.cuda.runtime.getDevice(), hashlib.sha256(cubin).digest())
    with _MODULES_LOCK:
        hit = _MODULES.get(key)
        if hit is None:
            hit = _MODULES[key] = CudaModule(cubin)
        return hit


class CudaModule:
    """A cubin loaded into the current CUDA device's context through CuPy (a binary of
    several cubins, :func:`compile_cuda_parts`, as one module each; a kernel is looked
    up in each in turn).

    Kernel arguments are passed as CuPy passes them: a ``cupy.ndarray`` as the
    device address of its first element (a view's offset included), a
    ``cupy.cuda.MemoryPointer`` as its address, and NumPy scalars
    (``np.int32``, ``np.int64``, ``np.float32``...) by value with their own
    width. A raw pointer into an arena buffer is therefore either a view,
    ``arena[off:off + nbytes].view(cupy.float32)``, or ``arena.data + off``.
    Bare Python ``int``/``float`` are refused: CuPy would widen them to 64
    bits, which silently mismatches an ``int``/``float`` parameter.

    Example
    -------
    >>> mod = CudaModule(compile_cuda(src, local_arch()))  # doctest: +SKIP
    >>> mod.launch("twice", (1, 1, 1), (32, 1, 1), [x])  # doctest: +SKIP
    """

    def __init__(self, cubin: bytes) -> None:
        self._functions: dict[str, Any] = {}
        self._dynamic: dict[str, int] = {}
        self._modules: list[Any] = []
        try:
            import cupy

            cupy.cuda.runtime.free(0)  # make the device's primary context current
            for one in cubins(cubin):  # several when the unit compiled in parts
                module = cupy.cuda.function.Module()
                module.load(one)
                self._modules.append(module)
        except Exception as e:
            raise FragmentLoadError(f"cannot load cubin ({len(cubin)} bytes): {e}") from None

    def _raise_shared_limit(self, name: str, fn: Any, nbytes: int) -> None:
        """Let kernel ``name`` take ``nbytes`` of dynamic shared memory (above 48 KB a
        kernel must opt in)."""
        from cupy_backends.cuda.api import driver

        try:
            driver.funcSetAttribute(fn.ptr, _MAX_DYNAMIC_SHARED_ATTRIBUTE, nbytes)
        except Exception as e:
            raise FragmentLoadError(f"kernel {name} cannot take {nbytes} bytes of shared "
                                    f"memory: {e}") from None
        self._dynamic[name] = nbytes

    def get_function(self, name: str) -> Any:
        """The kernel ``name`` (a ``cupy.cuda.function.Function``); cached."""
        fn = self._functions.get(name)
        if fn is None:
            error: Exception | None = None
            for module in self._modules:
                try:
                    fn = self._functions[name] = module.get_function(name)
                    return fn
                except Exception as e:  # noqa: BLE001 - the next module may hold it
                    error = e
            raise FragmentLoadError(f"no kernel {name!r} in module: {error}") from None
        return fn

    def launch(
        self,
        name: str,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        args: Sequence[Any],
        shared_mem: int = 0,
        stream: Any = None,
    ) -> None:
        """Launch kernel ``name`` asynchronously on ``stream`` (CuPy's current if None)."""
        import cupy

        for i, a in enumerate(args):
            if not isinstance(a, cupy.ndarray | cupy.cuda.MemoryPointer | np.generic):
                raise TypeError(
                    f"argument {i} of {name} is {type(a).__name__}; pass a cupy.ndarray, "
                    "a cupy.cuda.MemoryPointer or a NumPy scalar (np.int32, np.float32, ...)"
                )
        self.bound(name, grid, block, args, shared_mem)(stream)

    def bound(self, name: str, grid: tuple[int, int, int], block: tuple[int, int, int],
              args: Sequence[Any], shared_mem: int = 0) -> BoundLaunch:
        """Launch ``name`` with these arguments, made ready once (the function looked up,
        its shared-memory limit raised): a call launches it on a stream (CuPy's current
        if None). What :meth:`LoadedFragment.launch_all` replays call after call."""
        fn = self.get_function(name)
        if shared_mem > _STATIC_SHARED_LIMIT and self._dynamic.get(name, 0) < shared_mem:
            self._raise_shared_limit(name, fn, shared_mem)
        return BoundLaunch(name, fn, tuple(grid), tuple(block), tuple(args), shared_mem)


class BoundLaunch:
    """One kernel launch with its arguments fixed: a call enqueues it on a stream."""

    __slots__ = ("name", "fn", "grid", "block", "args", "shared_mem")

    def __init__(self, name: str, fn: Any, grid: tuple[int, ...], block: tuple[int, ...],
                 args: tuple[Any, ...], shared_mem: int) -> None:
        self.name, self.fn, self.grid, self.block = name, fn, grid, block
        self.args, self.shared_mem = args, shared_mem

    def __call__(self, stream: Any = None) -> None:
        import cupy

        if stream is None:
            stream = cupy.cuda.get_current_stream()
        try:
            self.fn(self.grid, self.block, self.args, shared_mem=self.shared_mem,
                    stream=stream)
        except Exception as e:
            raise FragmentLoadError(f"launch of {self.name} failed: {e}") from None


def capture_graph(run: Any) -> Any:
    """A CUDA graph of the device work ``run()`` enqueues on the current stream, captured
    on a private stream in thread-local mode (so other threads of the process — a Dask
    worker's — may go on using the device), uploaded and ready to launch. Replaying it
    is one host call however many kernels it holds: what multi-launch fragments and the
    tuner's timed repeats use (``triton.testing.do_bench_cudagraph`` times the same way).

    Raises whatever ``run`` raises, or CuPy's error if the work cannot be captured (a
    synchronous copy, an allocation); the stream is left out of capture either way.
    """
    import cupy

    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture(cupy.cuda.runtime.streamCaptureModeThreadLocal)
        try:
            run()
        except BaseException:
            try:
                stream.end_capture()
            except Exception:  # noqa: BLE001, S110 - the capture was invalid anyway
                pass
            raise
        graph = stream.end_capture()
    graph.upload(stream)
    stream.synchronize()
    return graph


# ---------------------------------------------------------------- timing (accy tune)


def gpu_identity() -> dict[str, Any] | None:
    """The current CUDA device: ``name``, ``arch``, ``pci_bus_id`` and ``memory_bytes``;
    None without a GPU. What a tuning result is keyed by (with the arch) and what a
    tuning report names.

    Example
    -------
    >>> gpu_identity() is None or gpu_identity()["arch"].startswith("sm_")
    True
    """
    if not gpu_available():
        return None
    import cupy

    dev = cupy.cuda.Device()
    props = cupy.cuda.runtime.getDeviceProperties(dev.id)
    name = props["name"]
    return {"name": name.decode() if isinstance(name, bytes) else str(name),
            "arch": f"sm_{dev.compute_capability}", "pci_bus_id": str(dev.pci_bus_id),
            "memory_bytes": int(props["totalGlobalMem"])}


def time_cuda(run: Any, number: int, repeats: int) -> list[float]:
    """Seconds per call of ``run()``: one figure per repeat, each ``number`` back-to-back
    calls on the current stream between two CUDA events (so the figure is the
    device's time, not the host's dispatch of one launch).

    Example
    -------
    >>> time_cuda(lambda: None, 10, 3)  # doctest: +SKIP
    [0.0, 0.0, 0.0]
    """
    import cupy

    stream = cupy.cuda.get_current_stream()
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    out = []
    stream.synchronize()
    for _ in range(repeats):
        start.record(stream)
        for _ in range(number):
            run()
        end.record(stream)
        end.synchronize()
        out.append(cupy.cuda.get_elapsed_time(start, end) / 1e3 / number)
    return out


class GraphTimer:
    """``number`` calls of ``run()`` captured as one CUDA graph (:func:`capture_graph`),
    timed per repeat between two CUDA events: the host enqueues a repeat in one call,
    so a busy or descheduled host thread cannot leave the device idle inside it, and a
    launch-bound program is timed by what the device does. ``run`` must be capturable
    (no allocation, no synchronous copy). A call gives seconds per ``run()``, one figure
    per repeat; the graph's first launch (at construction) is not timed.

    Example
    -------
    >>> GraphTimer(lambda: None, 10)(3)  # doctest: +SKIP
    [0.0, 0.0, 0.0]
    """

    def __init__(self, run: Any, number: int) -> None:
        import cupy

        def calls() -> None:
            for _ in range(number):
                run()

        self.number = number
        self.graph = capture_graph(calls)
        self.graph.launch(cupy.cuda.get_current_stream())
        cupy.cuda.get_current_stream().synchronize()

    def __call__(self, repeats: int) -> list[float]:
        import cupy

        stream = cupy.cuda.get_current_stream()
        return [t / self.number for t in time_cuda(lambda: self.graph.launch(stream), 1,
                                                   repeats)]


def cuda_synchronize() -> None:
    """Wait for the current stream (after warm-up launches)."""
    import cupy

    cupy.cuda.get_current_stream().synchronize()
