"""Worker side of ``accy tune``: time a group's loaded fragments, then check them.

One task per group (:func:`time_group_task`) runs on the worker chosen to time
that group. It holds the device's timing lock for its whole run (a
``distributed.Lock`` named after the device: the GPU's host and PCI bus id, or
the worker for the host target), so no other timing — and no other group's
correctness run — ever overlaps it on that device, whatever the cluster's
resources say. Within the task:

1. **Inputs.** Random arrays of the program's argument dtypes and the group's
   shapes, from a fixed seed (standard normal floats, small positive
   integers, fair booleans); every variant of the group sees the same inputs.
2. **Timing.** Per variant: the fragment is loaded in this process (reused if
   it already is), its arguments prepared and its results allocated once
   (:meth:`LoadedFragment.prepare`, the arguments once for the group),
   :data:`WARMUP` warm-up runs (on a GPU, at least :data:`WARMUP_S` of them), then
   ``reps`` repeats of ``number`` back-to-back :meth:`LoadedFragment.launch_all`
   calls between two CUDA events (GPU) or two reads of the monotonic clock
   (host). ``number`` is calibrated once per variant so a repeat lasts about
   :data:`REPEAT_S` (at most :data:`MAX_NUMBER`). The figure is seconds per call.
   On a GPU the ``number`` calls are captured as one CUDA graph and a repeat is one
   graph launch (``timed_as: "graph"``; ``"launches"`` where they cannot be
   captured): the host enqueues a repeat at once, so a host thread descheduled by
   the compiles and reference runs beside it cannot leave the GPU idle inside a
   repeat, and the device runs a repeat without gaps, as it runs in a model. (The
   H200 caps its power near 700 W: a long bf16 matmul drops its clock from 1980 to
   1575–1860 MHz, so a figure depends on how long the device has been loaded;
   gapless repeats after the same warm-up load it alike every time.)
3. **Checking.** The reference interpreter runs once on the inputs; the
   variants are checked against it in order of their median time until one
   is correct (the winner), then ``check`` more chosen at random with a fixed
   seed (all of them with ``check < 0``). A wrong variant is never the winner.

Example
-------
>>> import numpy as np
>>> spread([1.0, 2.0, 3.0])
{'median_s': 2.0, 'min_s': 1.0, 'max_s': 3.0, 'spread': 1.0}
>>> result_error([np.ones(3, np.float32)], [np.ones(3, np.float32)], ["f32"])
(0.0, True)
"""

from __future__ import annotations

import functools
import math
import platform
import random
import socket
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from accy.host import available_cores, cpu_model

WARMUP = 3
"""Untimed runs of each variant before its repeats (caches, clocks, lazy loading)."""
WARMUP_S = 0.025
"""On a GPU the warm-up then goes on for at least this long (as Triton's ``do_bench``
warms up for 25 ms): a variant timed right after a pause ran at other clocks — the
4096³ bf16 matmul's winner was 3.9 % apart between two tunings with 3 warm-up runs
(RESULTS.md, tuning), the row programs' at most 0.7 %."""
REPEAT_S = 0.02
"""About how long one timed repeat lasts (``number`` calls)."""
MAX_NUMBER = {"cuda": 50, "host": 1000}
"""At most this many back-to-back calls per repeat (50 on a GPU, as DESIGN.md times)."""
TOLERANCE = {"f32": 1e-4, "f16": 4e-3, "bf16": 3e-2, "f64": 1e-10}
"""Largest accepted ``max |got - ref| / max |ref|`` per result element type (integers
and booleans must be equal); as ``benchmarks/kernels.py`` accepts a kernel."""


# ------------------------------------------------------------------ devices


def worker_device_info() -> dict[str, Any]:
    """What a worker times on: its host, CPU, cores, C compiler and GPU (if any).

    Example
    -------
    >>> sorted(worker_device_info())
    ['cc', 'cores', 'cpu', 'gpu', 'host', 'machine', 'nvrtc']
    """
    from accy.executable.device import gpu_identity, host_compiler_identity

    try:
        cc = host_compiler_identity()
    except Exception:  # noqa: BLE001 - no C compiler: host groups fail to compile anyway
        cc = None
    gpu = gpu_identity()
    nvrtc = None
    if gpu is not None:
        from accy.executable.device import cuda_compiler_identity

        nvrtc = cuda_compiler_identity()
    return {"host": socket.gethostname(), "machine": platform.machine(), "cpu": cpu_model(),
            "cores": available_cores(), "cc": cc, "gpu": gpu, "nvrtc": nvrtc}


# ------------------------------------------------------------------ figures


def spread(times: Sequence[float]) -> dict[str, float]:
    """Median, min, max of the repeats and their spread ``(max - min) / median``."""
    med = statistics.median(times)
    lo, hi = min(times), max(times)
    return {"median_s": med, "min_s": lo, "max_s": hi,
            "spread": (hi - lo) / med if med > 0 else 0.0}


def random_inputs(arg_types: Sequence[tuple[tuple[int, ...], np.dtype]], seed: int) \
        -> list[np.ndarray]:
    """One array per argument (shape, dtype): standard normal floats, integers in
    1..8 (no zero divisors), fair booleans; the same for the same seed.

    Example
    -------
    >>> [a.dtype.name for a in random_inputs([((2, 3), np.dtype("float32")),
    ...                                       ((4,), np.dtype("int32"))], 0)]
    ['float32', 'int32']
    """
    rng = np.random.default_rng(seed)
    out = []
    for shape, dtype in arg_types:
        a: np.ndarray
        if dtype.kind == "f":
            a = rng.standard_normal(shape)
        elif dtype.kind == "b":
            a = rng.random(shape) < 0.5
        else:
            a = rng.integers(1, 9, shape)
        out.append(np.ascontiguousarray(np.asarray(a).astype(dtype)))
    return out


def result_error(got: Sequence[Any], want: Sequence[np.ndarray], elements: Sequence[str]) \
        -> tuple[float, bool]:
    """The largest ``max |got - want| / max |want|`` over the results, and whether every
    result is within its element type's :data:`TOLERANCE` (NaN and infinities must sit
    where the reference has them; integers and booleans must be equal)."""
    worst, ok = 0.0, len(got) == len(want)
    for g, w, el in zip(got, want, elements):
        g = np.asarray(g)
        w = np.asarray(w)
        if g.shape != w.shape:
            return math.inf, False
        if w.dtype.kind not in "fc":
            bad = float(np.count_nonzero(g != w))
            worst = max(worst, bad)
            ok = ok and bad == 0
            continue
        g64, w64 = g.astype(np.float64), w.astype(np.float64)
        finite = np.isfinite(w64)
        if not np.array_equal(np.isfinite(g64), finite) or \
                not np.array_equal(g64[~finite], w64[~finite], equal_nan=True):
            return math.inf, False
        if not finite.any():
            continue
        scale = float(np.max(np.abs(w64[finite]))) or 1.0
        err = float(np.max(np.abs(g64[finite] - w64[finite]))) / scale
        worst = max(worst, err)
        ok = ok and err <= TOLERANCE.get(el, 1e-4)
    return worst, ok


# ------------------------------------------------------------------ the task


def _compiled(item: Any) -> Any:
    """A compiled fragment: held by the cluster (``{"held": value, "pick": i}``, the
    value of a chain or its group), or read back from the store."""
    from accy.distributed.graph import compiled_of, held_value
    from accy.executable.compile import CompiledFragment

    if "held" in item:  # a held chain result (or fragment) of the batch
        compiled = compiled_of(held_value(item["held"], item.get("pick")))
        if isinstance(compiled, CompiledFragment):
            return compiled
        raise RuntimeError(f"the held value is no compiled fragment "
                           f"({type(compiled).__name__})")
    url, key = item["store"], item["key"]  # the cluster no longer held it: the store's copy
    from accy.store import ArtifactStore, default_max_bytes

    data = ArtifactStore(url, default_max_bytes()).get(key, kind="fragment") if url else None
    if data is None:
        raise RuntimeError(f"compiled fragment {key[:16]} is neither held by the cluster "
                           f"nor in the store")
    return CompiledFragment.from_wire(data)


def _measure(run: Callable[[], None], device: str, reps: int) \
        -> tuple[list[float], int, str]:
    """Seconds per call over ``reps`` repeats, the calls per repeat, and how they were
    timed (``timed_as``): ``graph`` (a :class:`~accy.executable.device.GraphTimer`),
    ``launches`` on a GPU where the calls cannot be captured (``time_cuda``), ``clock``
    on the host."""
    if device == "cuda":
        from accy.executable.device import GraphTimer, cuda_synchronize, time_cuda

        for _ in range(WARMUP):
            run()
        cuda_synchronize()
        one = time_cuda(run, 1, 1)[0]
        more = math.ceil(WARMUP_S / max(one, 1e-9)) - WARMUP - 1
        if more > 0:
            time_cuda(run, min(more, 100_000), 1)
        number = max(1, min(MAX_NUMBER["cuda"], math.ceil(REPEAT_S / max(one, 1e-9))))
        try:
            timer = GraphTimer(run, number)
        except Exception:  # noqa: BLE001 - not capturable: time the launches
            return time_cuda(run, number, reps), number, "launches"
        return timer(reps), number, "graph"
    for _ in range(WARMUP):
        run()
    t0 = time.perf_counter_ns()
    run()
    one = (time.perf_counter_ns() - t0) / 1e9
    number = max(1, min(MAX_NUMBER["host"], math.ceil(REPEAT_S / max(one, 1e-9))))
    return _host_repeats(run, number, reps), number, "clock"


def _host_repeats(run: Callable[[], None], number: int, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        for _ in range(number):
            run()
        out.append((time.perf_counter_ns() - t0) / 1e9 / number)
    return out


def _lock_name(device: dict[str, Any], worker: str) -> str:
    gpu = device.get("gpu")
    if device.get("kind") == "cuda" and gpu:
        return f"accy-timer:{device.get('host')}:{gpu.get('pci_bus_id')}"
    return f"accy-timer:{worker}"


def _worker_address() -> str:
    from distributed import get_worker

    try:
        return str(get_worker().address)
    except ValueError:
        return ""


def time_group_task(spec: dict[str, Any], module_wire: bytes, *fragments: Any) \
        -> dict[str, Any]:
    """Time, then check, every compiled fragment of one group on this worker.

    ``spec``: ``kind`` (``cuda`` or ``host``), ``shapes`` (argument → dims),
    ``seed``, ``reps``, ``check`` (how many non-winners to check; < 0: all) and
    ``variants`` (the ids, one per fragment). Returns the worker, its device and,
    per variant, its times or its failure and its check.
    """
    from distributed import Lock

    from accy.executable.fragment import load_fragment
    from accy.preparation.products import Product
    from accy.reference import run_reference

    kind = spec["kind"]
    worker = _worker_address()
    device = dict(worker_device_info(), kind=kind)
    module = Product.from_wire(module_wire)
    shapes = {int(i): tuple(d) for i, d in spec["shapes"].items()}
    arg_types = _arg_types(module, shapes)
    inputs = random_inputs(arg_types, int(spec["seed"]))
    want = run_reference(module.module, inputs)  # CPU work: before the device is taken
    elements = [str(getattr(getattr(t, "element", t), "name", ""))
                for t in module.entry().function_type.results]
    rows: list[dict[str, Any]] = []
    loaded_by_id: dict[str, Any] = {}
    # the group's arguments in storage form, made once per signature: converting them
    # (bf16 bits on the host, then a copy to the device) for every variant took most of
    # a matmul group's time under the lock (0.24 s a 4096² bf16 operand)
    prepared: dict[Any, list[Any]] = {}
    with Lock(_lock_name(device, worker)):
        started = time.time()
        for vid, item in zip(spec["variants"], fragments):
            row: dict[str, Any] = {"id": vid}
            rows.append(row)
            try:
                loaded, _ = load_fragment(_compiled(item))
                signature = tuple((tuple(s), e) for s, e in loaded.plan.args)
                if signature not in prepared:
                    prepared[signature] = loaded.prepare(inputs)[0]
                args, results = prepared[signature], loaded.allocate_results()
                times, number, timed_as = _measure(
                    functools.partial(loaded.launch_all, args, results), kind,
                    int(spec["reps"]))
            except Exception as e:  # noqa: BLE001 - one variant's failure is reported
                row.update(status="failed", failure={"stage": "time", "message":
                                                     f"{type(e).__name__}: {e}"})
                continue
            loaded_by_id[vid] = loaded
            row.update(status="ok", times_s=times, number=number, timed_as=timed_as,
                       **spread(times))
        # the fastest variants are checked until one is right, then a sample of the rest
        timed = sorted((r for r in rows if r["status"] == "ok"), key=lambda r: r["median_s"])
        winner = None
        for r in timed:
            _check(r, loaded_by_id[r["id"]], inputs, want, elements)
            if r["check"] == "ok":
                winner = r["id"]
                break
        rest = [r for r in timed if "check" not in r]
        n = len(rest) if int(spec["check"]) < 0 else min(int(spec["check"]), len(rest))
        for r in random.Random(int(spec["seed"])).sample(rest, n):
            _check(r, loaded_by_id[r["id"]], inputs, want, elements)
        for r in rows:
            r.setdefault("check", "unchecked")
        elapsed = time.time() - started
    return {"worker": worker, "device": device, "variants": rows, "winner": winner,
            "elapsed_s": elapsed}


def _check(row: dict[str, Any], loaded: Any, inputs: list[np.ndarray],
           want: list[np.ndarray], elements: list[str]) -> None:
    try:
        got = [np.asarray(r) if not hasattr(r, "get") else r.get() for r in loaded(*inputs)]
        err, ok = result_error(got, want, elements)
    except Exception as e:  # noqa: BLE001 - a crash in the check makes it wrong
        row.update(check="wrong", max_error=None,
                   check_message=f"{type(e).__name__}: {e}")
        return
    row.update(check="ok" if ok else "wrong", max_error=err if math.isfinite(err) else None)
    if not ok:
        row["check_message"] = ("results differ from the reference interpreter "
                                + (f"(max error {err:.3g})" if math.isfinite(err)
                                   else "(shape, NaN or infinity mismatch)"))


def _arg_types(module: Any, shapes: dict[int, tuple[int, ...]]) \
        -> list[tuple[tuple[int, ...], np.dtype]]:
    """(shape, NumPy dtype) of each argument, its ``?`` dims bound by ``shapes``."""
    from accy.choir.attributes import TensorType, numpy_dtype

    out = []
    for i, t in enumerate(module.entry().function_type.inputs):
        if isinstance(t, TensorType):
            shape = shapes.get(i) or tuple(int(d or 0) for d in t.shape)
            out.append((tuple(shape), numpy_dtype(t.element)))
        else:
            out.append(((), numpy_dtype(t)))
    return out
