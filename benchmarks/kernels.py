"""Kernel bandwidth and cold compile time on the GPU; prints JSON.

For softmax, layernorm and gelu(x + b) on 8192×4096 fp32: GB/s moved (bytes
read + written, counted once each) by accy's fragment, next to torch eager,
torch.compile and CuPy composed ops measured in the same run, and a device
copy as the ceiling; plus each program's cold compile time split into the
six stages, NVRTC and load.

Run on a GPU machine: ``python3 benchmarks/kernels.py [--rows 8192] [--cols 4096]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _time_cuda(fn, reps: int = 50, warmup: int = 5) -> float:  # type: ignore[no-untyped-def]
    """Median seconds per call, timed with CUDA events around each call."""
    import cupy

    for _ in range(warmup):
        fn()
    cupy.cuda.Device().synchronize()
    times = []
    for _ in range(reps):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end) / 1e3)
    return statistics.median(times)


def _accy(program: str, shapes: dict[int, tuple[int, ...]], inputs: list, options=()):  # type: ignore[no-untyped-def]
    import cupy

    from accy.executable.cache import FragmentCompilerCache
    from accy.preparation.options import RunOptions
    from accy.preparation.products import SemanticModule
    from accy.preparation.stages import PreparationRequest

    sm = SemanticModule.from_file(os.path.join(ROOT, "graphs", program))
    t0 = time.perf_counter()
    cache = FragmentCompilerCache()
    update = cache.refresh_from_semantic_module(
        sm, PreparationRequest(options=RunOptions.parse("cuda", list(options)), shapes=shapes))
    cold = time.perf_counter() - t0
    split = {r.stage: r.elapsed_ns / 1e6 for r in update.report}
    frag = update.fragment
    assert frag is not None
    results = [cupy.empty(tuple(s), dtype=cupy.float32) for s, _ in frag.plan.results]
    secs = _time_cuda(lambda: frag.launch_all(inputs, results))
    return secs, results[0], cold, split, frag.plan.launches


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--no-torch-compile", action="store_true")
    args = ap.parse_args()
    import cupy

    R, C = args.rows, args.cols
    rng = cupy.random.default_rng(0)
    x = rng.standard_normal((R, C), dtype=cupy.float32)
    g = rng.standard_normal((C,), dtype=cupy.float32)
    b = rng.standard_normal((C,), dtype=cupy.float32)
    nbytes = x.nbytes * 2  # read x, write y (params are 2·C floats: noise)
    out: dict = {"machine": platform.node(), "date": time.strftime("%Y-%m-%d"),
                 "device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(),
                 "shape": [R, C], "dtype": "float32", "programs": {}}
    y = cupy.empty_like(x)
    copy_s = _time_cuda(lambda: cupy.copyto(y, x))
    out["device_copy_gbs"] = nbytes / copy_s / 1e9
    out["device_memcpy_gbs"] = nbytes / _time_cuda(
        lambda: cupy.cuda.runtime.memcpyAsync(y.data.ptr, x.data.ptr, x.nbytes, 3, 0)) / 1e9

    try:
        import torch
        import torch.nn.functional as F

        tx = torch.as_tensor(x, device="cuda")
        tg = torch.as_tensor(g, device="cuda")
        tb = torch.as_tensor(b, device="cuda")
        have_torch = True
    except Exception as e:  # pragma: no cover - depends on the machine
        out["torch_error"] = repr(e)
        have_torch = False

    cases = {
        "softmax": ("softmax.mlir", [x], lambda: F.softmax(tx, dim=-1),
                    lambda: _cupy_softmax(x)),
        "layernorm": ("layernorm.mlir", [x, g, b],
                      lambda: F.layer_norm(tx, (C,), tg, tb, 1e-5), lambda: _cupy_layernorm(x, g, b)),
        "bias_gelu": ("bias_gelu.mlir", [x, b], lambda: F.gelu(tx + tb),
                      lambda: _cupy_gelu(x, b)),
    }
    for name, (program, inputs, torch_fn, cupy_fn) in cases.items():
        entry: dict = {}
        secs, result, cold, split, launches = _accy(program, {0: (R, C)}, inputs)
        entry["accy_gbs"] = nbytes / secs / 1e9
        entry["accy_ms"] = secs * 1e3
        entry["cold_compile_s"] = cold
        entry["cold_split_ms"] = split
        entry["launches"] = [{k: v for k, v in launch.items() if k != "buffers"}
                             for launch in launches]
        entry["cupy_composed_gbs"] = nbytes / _time_cuda(cupy_fn, reps=20) / 1e9
        if have_torch:
            ref = torch_fn().float().cpu().numpy()
            mine = cupy.asnumpy(result)
            entry["max_abs_err_vs_torch"] = float(np.max(np.abs(mine - ref)))
            entry["bitwise_equal_to_torch_frac"] = float(np.mean(mine == ref))
            entry["torch_eager_gbs"] = nbytes / _time_cuda(torch_fn) / 1e9
            if not args.no_torch_compile:
                t0 = time.perf_counter()
                compiled = torch.compile(torch_fn)
                compiled()
                torch.cuda.synchronize()
                entry["torch_compile_first_s"] = time.perf_counter() - t0
                entry["torch_compile_gbs"] = nbytes / _time_cuda(compiled) / 1e9
        # a second variant: block size 512 / 128, to see the option's effect
        for bs in (128, 512):
            s2, _, _, _, _ = _accy(program, {0: (R, C)}, inputs, (f"kernel.block_size={bs}",))
            entry[f"accy_gbs_block{bs}"] = nbytes / s2 / 1e9
        out["programs"][name] = entry
        print(f"{name:10s} accy {entry['accy_gbs']:7.0f} GB/s  "
              f"torch eager {entry.get('torch_eager_gbs', 0):7.0f}  "
              f"torch.compile {entry.get('torch_compile_gbs', 0):7.0f}  "
              f"cupy {entry['cupy_composed_gbs']:7.0f}  cold {cold:.3f}s", file=sys.stderr)
    out["programs"]["mlp"] = _mlp(R, have_torch)
    print(json.dumps(out, indent=2))


def _mlp(rows: int, have_torch: bool) -> dict:  # type: ignore[type-arg]
    """The MLP block (two matmuls with bias and gelu epilogues): TFLOP/s, fp32."""
    import cupy

    rng = cupy.random.default_rng(1)
    x = rng.standard_normal((rows, 256), dtype=cupy.float32)
    w1 = rng.standard_normal((256, 1024), dtype=cupy.float32) / 16
    b1 = rng.standard_normal((1024,), dtype=cupy.float32)
    w2 = rng.standard_normal((1024, 256), dtype=cupy.float32) / 32
    b2 = rng.standard_normal((256,), dtype=cupy.float32)
    flops = 2 * rows * (256 * 1024 + 1024 * 256)
    secs, result, cold, split, launches = _accy("mlp.mlir", {0: (rows, 256)}, [x, w1, b1, w2, b2])
    entry = {"accy_tflops": flops / secs / 1e12, "accy_ms": secs * 1e3, "cold_compile_s": cold,
             "cold_split_ms": split, "launches": [{k: v for k, v in launch.items()
                                                   if k != "buffers"} for launch in launches]}
    if have_torch:
        import torch
        import torch.nn.functional as F

        torch.backends.cuda.matmul.allow_tf32 = False
        tx, tw1, tb1, tw2, tb2 = (torch.as_tensor(a, device="cuda") for a in (x, w1, b1, w2, b2))

        def fn():  # type: ignore[no-untyped-def]
            return F.gelu(tx @ tw1 + tb1, approximate="tanh") @ tw2 + tb2

        ref = fn().cpu().numpy().astype(np.float64)
        mine = cupy.asnumpy(result).astype(np.float64)
        entry["rel_err_vs_torch"] = float(np.linalg.norm(mine - ref) / np.linalg.norm(ref))
        entry["torch_fp32_tflops"] = flops / _time_cuda(fn) / 1e12
    print(f"mlp        accy {entry['accy_tflops']:6.1f} TFLOP/s  torch fp32 "
          f"{entry.get('torch_fp32_tflops', 0):6.1f}  cold {cold:.3f}s", file=sys.stderr)
    return entry


def _cupy_softmax(x):  # type: ignore[no-untyped-def]
    import cupy

    e = cupy.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _cupy_layernorm(x, g, b):  # type: ignore[no-untyped-def]
    import cupy

    m = x.mean(axis=-1, keepdims=True)
    v = ((x - m) ** 2).mean(axis=-1, keepdims=True)
    return (x - m) / cupy.sqrt(v + 1e-5) * g + b


def _cupy_gelu(x, b):  # type: ignore[no-untyped-def]
    import cupyx.scipy.special as sp

    z = x + b
    return 0.5 * z * (1 + sp.erf(z * np.float32(0.7071067811865476)))


if __name__ == "__main__":
    main()
