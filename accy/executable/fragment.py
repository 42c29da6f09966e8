"""Load a compiled fragment and run it: :class:`LoadedFragment`.

Loading is per process: a process keeps its loaded fragments in a registry
keyed by compile key and reuses one while the key is unchanged; a new
process loads again. A CUDA fragment is a CuPy module on this process's GPU;
a host fragment is a shared object loaded with ctypes.

Calling a loaded fragment allocates the buffers of its plan (the arena once
per fragment, results per call), runs the launch table in order and returns
the results: NumPy arrays on the host target, and on CUDA CuPy arrays when
the inputs were CuPy arrays, NumPy otherwise.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from accy.errors import AccyError, FragmentLoadError
from accy.executable.compile import CompiledFragment, FragmentPlan
from accy.numerics import bf16_bits
from accy.paths import fresh_file
from accy.target.backend import backend_of

_STORAGE = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16, "f64": np.float64,
            "i1": np.bool_, "i8": np.int8, "i16": np.int16, "i32": np.int32, "i64": np.int64,
            "index": np.int64, "ui8": np.uint8, "ui16": np.uint16, "ui32": np.uint32,
            "ui64": np.uint64}
_REGISTRY: dict[str, LoadedFragment] = {}
_LOCK = threading.Lock()


READY_SETS = 8
"""Address sets a CUDA fragment keeps its launches ready for (:meth:`LoadedFragment.launch_all`)."""
GRAPHS = os.environ.get("ACCY_CUDA_GRAPHS", "1") != "0"
"""Whether a CUDA fragment of several launches replays them as one CUDA graph."""


class _Ready:
    """A fragment's launches ready on one set of addresses; a graph of them from the
    second run on (a one-off call, as ``LoadedFragment.__call__`` makes, never pays for a
    capture)."""

    __slots__ = ("launches", "runs", "graph")

    def __init__(self, launches: list[Any]) -> None:
        self.launches = launches
        self.runs = 0
        self.graph: Any = None

    def run(self) -> None:
        import cupy

        stream = cupy.cuda.get_current_stream()
        if GRAPHS and len(self.launches) > 1 and (self.graph is not None or self.runs == 1):
            if _capturing(stream):  # inside another capture (a timer's): its kernels
                self._enqueue(stream)
                return
            if self.graph is None:  # the second run: capture (once; None if it cannot)
                from accy.executable.device import capture_graph

                try:
                    self.graph = capture_graph(self._enqueue)
                except Exception:  # noqa: BLE001 - not capturable here: launch one by one
                    self.graph = None
            if self.graph is not None:
                self.graph.launch(stream)
                return
        self.runs += 1
        self._enqueue(stream)

    def _enqueue(self, stream: Any = None) -> None:
        for launch in self.launches:
            launch(stream)


def _capturing(stream: Any) -> bool:
    try:
        return bool(stream.is_capturing())
    except Exception:  # noqa: BLE001 - a query the driver refuses: treat as not capturing
        return False


def _from_bf16(a: Any) -> Any:
    """float32 values of bf16 bit patterns, on the host or the device."""
    return (a.astype(np.uint32) << 16).view(np.float32)


def cupy_asnumpy(a: Any) -> np.ndarray:
    import cupy

    return cupy.asnumpy(a)


class LoadedFragment:
    """The loaded kernels + launch table + buffer plan; callable on arrays."""

    def __init__(self, compiled: CompiledFragment, workspace: str | None = None) -> None:
        self.key = compiled.key.hex
        self.plan: FragmentPlan = compiled.plan
        self._lock = threading.Lock()
        self._arena: Any = None
        self._tensor_maps: dict[tuple[int, ...], Any] = {}
        self._ready: dict[tuple[int, ...], _Ready] = {}
        self._ready_lock = threading.Lock()
        self._buffer_elements = {b.id: b.dtype for b in self.plan.buffers}
        self.backend = backend_of(self.plan.target)
        """The target's backend: a host library (ctypes) or a CUDA module (CuPy)."""
        if not self.backend.needs_gpu:
            from accy.executable.device import HostLibrary

            # a file this call just created (O_EXCL), never a path that may pre-exist
            path = fresh_file(compiled.binary, f"fragment-{self.key[:16]}-", ".so", workspace)
            self._lib: Any = HostLibrary(path)
            self.device = self.backend.kind
        else:
            from accy.executable.device import cuda_module, gpu_available

            if not gpu_available():
                raise FragmentLoadError("no GPU: a CUDA fragment cannot be loaded here")
            self._module: Any = cuda_module(compiled.binary)
            self.device = self.backend.kind

    # ------------------------------------------------------------------ calls
    def _check_inputs(self, inputs: Sequence[Any]) -> None:
        if len(inputs) != len(self.plan.args):
            raise AccyError(f"the fragment takes {len(self.plan.args)} input(s), got "
                            f"{len(inputs)}")
        for i, (a, (shape, _)) in enumerate(zip(inputs, self.plan.args)):
            if tuple(a.shape) != tuple(shape):
                raise AccyError(f"input {i} has shape {tuple(a.shape)} but the fragment was "
                                f"compiled for {tuple(shape)}")

    def __call__(self, *inputs: Any) -> list[Any]:
        self._check_inputs(inputs)
        with self._lock:
            if not self.backend.needs_gpu:
                return self._run_host(inputs)
            return self._run_cuda(inputs)

    def _views(self, xp: Any, args: Sequence[Any], arena: Any,
               results: Sequence[Any] | None = None) -> tuple[dict[int, Any], list[Any]]:
        """Every buffer of the plan as an array: arguments, results (allocated unless
        given), arena slices and reshaped views."""
        views: dict[int, Any] = {}
        out: list[Any] = list(results) if results is not None else [None] * len(self.plan.results)
        for b in self.plan.buffers:
            dtype = _STORAGE[b.dtype]
            shape = b.shape
            if b.kind == "arg":
                views[b.id] = args[b.index]
            elif b.kind == "result":
                if results is None:
                    out[b.index] = xp.empty(shape, dtype=dtype)
                views[b.id] = out[b.index]
            elif b.kind == "arena":
                views[b.id] = arena[b.offset:b.offset + b.bytes].view(dtype) \
                    .reshape(shape)
            elif b.kind == "alias":
                views[b.id] = views[b.alias_of].reshape(shape)
        return views, out

    def _prepare(self, xp: Any, inputs: Sequence[Any]) -> list[Any]:
        args = []
        for a, (_, el) in zip(inputs, self.plan.args):
            if el == "bf16":
                a = bf16_bits(np.asarray(a) if xp is np else cupy_asnumpy(a))
            arr = xp.ascontiguousarray(xp.asarray(a, dtype=_STORAGE[el]))
            if xp is not np and arr.data.ptr % 16:
                arr = arr.copy()
            args.append(arr)
        return args

    def _finish(self, xp: Any, results: list[Any]) -> list[Any]:
        out = []
        for r, (_, el) in zip(results, self.plan.results):
            out.append(_from_bf16(r) if el == "bf16" else r)
        return out

    def _run_host(self, inputs: Sequence[Any]) -> list[Any]:
        args = self._prepare(np, [np.asarray(a) for a in inputs])
        views, results = self._views(np, args, self._host_arena())
        self._launch_host(views)
        return self._finish(np, results)

    def _host_arena(self) -> Any:
        if self._arena is None:
            self._arena = np.empty(max(self.plan.arena_bytes, 1) + 256, dtype=np.uint8)
            off = (-self._arena.ctypes.data) % 256
            self._arena = self._arena[off:off + max(self.plan.arena_bytes, 1)]
        return self._arena

    def _launch_host(self, views: dict[int, Any]) -> None:
        for launch in self.plan.launches:
            self._lib.call_with_buffers(launch.kernel, [views[i] for i in launch.buffers])

    def _run_cuda(self, inputs: Sequence[Any]) -> list[Any]:
        import cupy

        # device arrays in, device arrays out; host arrays (or no inputs at all) in, NumPy out
        on_device = bool(inputs) and all(isinstance(a, cupy.ndarray) for a in inputs)
        views, results = self._views(cupy, self._prepare(cupy, inputs), self._device_arena())
        self._launch_cuda(views)
        results = self._finish(cupy, results)
        return results if on_device else [cupy.asnumpy(r) for r in results]

    def prepare(self, inputs: Sequence[Any]) -> tuple[list[Any], list[Any]]:
        """The arguments in the form the kernels take (storage dtypes, contiguous, on the
        device for CUDA) and freshly allocated result buffers: what :meth:`launch_all`
        runs on, call after call, without converting or allocating (benchmarks, tuning).

        Example
        -------
        >>> # args, results = loaded.prepare([x]); loaded.launch_all(args, results)
        """
        self._check_inputs(inputs)
        if not self.backend.needs_gpu:
            inputs = [np.asarray(a) for a in inputs]
        return self._prepare(self._xp(), inputs), self.allocate_results()

    def allocate_results(self) -> list[Any]:
        """Fresh result buffers for :meth:`launch_all` (CuPy on CUDA, NumPy on the host):
        what another fragment of the same signature needs besides arguments
        :meth:`prepare` made once (``accy tune`` times a group's variants on one set)."""
        xp = self._xp()
        return [xp.empty(tuple(shape), dtype=_STORAGE[el]) for shape, el in self.plan.results]

    def _xp(self) -> Any:
        """The array module of this fragment's arrays: CuPy on CUDA, NumPy on the host."""
        if self.backend.needs_gpu:
            import cupy

            return cupy
        return np

    def launch_all(self, args: Sequence[Any], results: Sequence[Any]) -> None:
        """Run the launch table on arrays already prepared (:meth:`prepare`): CuPy
        arrays on CUDA (asynchronous, on the current stream), NumPy on the host.

        On CUDA the launches are made ready once per set of device addresses (the
        kernels looked up, the arguments packed: :class:`BoundLaunch`), and a table of
        several launches is replayed as one CUDA graph from the second call on the same
        arrays (``ACCY_CUDA_GRAPHS=0`` turns graphs off): a call is then one host call,
        not one per kernel. The last :data:`READY_SETS` address sets are kept; they hold
        addresses, not the arrays, so a set stays right for arrays reallocated in place.
        """
        if not self.backend.needs_gpu:
            views, _ = self._views(np, args, self._host_arena(), results)
            self._launch_host(views)
            return
        key = tuple(a.data.ptr for a in args) + (-1,) + tuple(r.data.ptr for r in results)
        ready = self._ready.get(key)
        if ready is None:
            import cupy

            views, _ = self._views(cupy, args, self._device_arena(), results)
            ready = _Ready(self._bind(views, by_address=True))
            with self._ready_lock:
                if len(self._ready) >= READY_SETS:
                    self._ready.pop(next(iter(self._ready)))
                self._ready[key] = ready
        ready.run()

    @property
    def graphed(self) -> bool:
        """Whether :meth:`launch_all` replays a CUDA graph for some set of addresses."""
        return any(r.graph is not None for r in self._ready.values())

    def _device_arena(self) -> Any:
        import cupy

        if self._arena is None:
            self._arena = cupy.empty(max(self.plan.arena_bytes, 1), dtype=cupy.uint8)
        return self._arena

    def _bind(self, views: dict[int, Any], by_address: bool = False) -> list[Any]:
        """The launch table made ready on these buffers (device addresses only when
        ``by_address``: nothing then keeps the arrays alive)."""
        out = []
        for launch in self.plan.launches:
            args = [views[i] for i in launch.buffers]
            maps = [self._tensor_map(launch.buffers[t[0]], args[t[0]], t)
                    for t in launch.tensor_maps]
            if by_address:
                args = [np.uint64(a.data.ptr) for a in args]
            scalars = [np.int64(v) for v in launch.scalars]
            out.append(self._module.bound(launch.kernel, launch.grid, launch.block,
                                          args + maps + scalars,
                                          shared_mem=launch.dynamic_shared))
        return out

    def _launch_cuda(self, views: dict[int, Any]) -> None:
        for launch in self._bind(views):
            launch()

    def _tensor_map(self, buffer: int, view: Any, spec: tuple[int, ...]) -> Any:
        """The TMA tensor map of ``view`` (buffer ``buffer``) that ``spec`` asks for, made
        once per device address (a small cache: arrays are usually reused)."""
        key = (view.data.ptr,) + tuple(spec)
        hit = self._tensor_maps.get(key)
        if hit is None:
            from accy.executable.device import tensor_map

            element = self._buffer_elements[buffer]
            hit = tensor_map(view.data.ptr, element, *spec[1:])
            if len(self._tensor_maps) >= 64:
                self._tensor_maps.pop(next(iter(self._tensor_maps)))
            self._tensor_maps[key] = hit
        return hit


def load_fragment(compiled: CompiledFragment, workspace: str | None = None) -> \
        tuple[LoadedFragment, bool]:
    """This process's loaded fragment for ``compiled`` and whether it was reused."""
    with _LOCK:
        hit = _REGISTRY.get(compiled.key.hex)
        if hit is not None:
            return hit, True
        loaded = LoadedFragment(compiled, workspace)
        _REGISTRY[compiled.key.hex] = loaded
        return loaded, False
