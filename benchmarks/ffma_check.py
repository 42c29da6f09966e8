"""The f32 FFMA matmul against cuBLAS on the GPU: correctness and speed; prints JSON.

For square f32 matmuls 1024³, 2048³, 4096³, 8192³ (the ``ffma-tiled`` kernel) and one
ragged shape (the generic ``tiled`` kernel), each case:

- compiles ``C = A @ B`` through accy (a fresh ``FragmentCompilerCache``: the six
  stages, NVRTC and the load, timed as ``cold_compile_s``) and reads the kernel
  stage's plan (mapping, tile, block, grid);
- checks accy's result and cuBLAS's (``cupy.matmul``, f32, TF32 off) against an f64
  matmul of the same inputs: ``max |C − ref| / max |ref|`` for each, and accy against
  cuBLAS;
- times accy (``LoadedFragment.launch_all`` on preallocated CuPy arrays) and cuBLAS
  alike: ``--calls`` back-to-back calls between two CUDA events, the time per call of
  each of ``--repeats`` repeats, the median (min and max too), after warm-up calls.

Run on a GPU machine::

    python3 benchmarks/ffma_check.py [--sizes 1024,4096] [--ragged 2049x2051x2047]
        [--option kernel.ffma_tile_k=16 ...] [--calls 30] [--repeats 5] [--out FILE]

``--compile-only`` (no GPU needed) compiles each case twice in one process and prints
the refresh and NVRTC times (a fresh ``FragmentCompilerCache`` each time).

``--option`` takes ``STAGE.NAME=VALUE`` as the ``accy`` command does (e.g.
``kernel.ffma_tile_m=64``); ``--option kernel.ffma_tiles=false`` times the generic
kernel instead. The exit status is 1 when any accy result is off by more than
``TOLERANCE`` (relative to max |ref|).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

os.environ.setdefault("CUPY_TF32", "0")  # cuBLAS in plain fp32 (the FFMA figure to beat)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

TOLERANCE = 1e-4
SIZES = (1024, 2048, 4096, 8192)
RAGGED = (2049, 2051, 2047)


def matmul_text(m: int, n: int, k: int) -> str:
    a, b, c = (f"tensor<{m}x{k}xf32>", f"tensor<{k}x{n}xf32>", f"tensor<{m}x{n}xf32>")
    return (f'"builtin.module"() ({{\n'
            f'  "func.func"() <{{function_type = ({a}, {b}) -> {c}, sym_name = "main"}}> ({{\n'
            f'  ^bb0(%a: {a}, %b: {b}):\n'
            f'    %0 = "semantic.matmul"(%a, %b) : ({a}, {b}) -> {c}\n'
            f'    "func.return"(%0) : ({c}) -> ()\n'
            f'  }}) : () -> ()\n'
            f'}}) : () -> ()\n')


def bench(fn: Any, calls: int, repeats: int) -> dict[str, Any]:
    """Seconds per call: ``calls`` back-to-back calls between two CUDA events, per repeat."""
    import cupy

    for _ in range(3):
        fn()
    cupy.cuda.Device().synchronize()
    per_call = []
    for _ in range(repeats):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        per_call.append(cupy.cuda.get_elapsed_time(start, end) / 1e3 / calls)
    return {"median_s": statistics.median(per_call), "min_s": min(per_call),
            "max_s": max(per_call), "calls": calls, "repeats": repeats}


def rel_err(got: Any, ref: Any) -> float:
    import cupy

    d = float(cupy.max(cupy.abs(got.astype(cupy.float64) - ref)).item())
    return d / max(float(cupy.max(cupy.abs(ref)).item()), 1e-30)


def plan_of(sm: Any, options: Any) -> dict[str, Any]:
    """The kernel stage's plan of the matmul kernel (mapping, tile, block, grid)."""
    from accy.dialects.kernel import KernelFuncOp
    from accy.pipeline import prepare_through

    job = prepare_through(sm, "kernel", options, {}).product
    (k,) = [op for op in job.module.body.ops if isinstance(op, KernelFuncOp)]
    p = k.plan
    return {"mapping": p.mapping, "tile": list(p.tile), "micro_tile": list(p.micro_tile),
            "block": list(p.block), "grid": list(p.grid), "shared_bytes": p.shared_bytes}


def compile_case(m: int, n: int, k: int, args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """The loaded fragment of ``m×n×k`` (None without a GPU) and its compile record."""
    from accy.executable.cache import FragmentCompilerCache
    from accy.preparation.options import RunOptions
    from accy.preparation.products import SemanticModule
    from accy.preparation.stages import PreparationRequest

    name = f"matmul{m}x{n}x{k}"
    options = RunOptions.parse("cuda", args.option)
    sm = SemanticModule.from_text(matmul_text(m, n, k), f"{name}.mlir")
    t0 = time.perf_counter()
    update = FragmentCompilerCache().refresh_from_semantic_module(
        sm, PreparationRequest(source=name, options=options))
    cold = time.perf_counter() - t0
    entry: dict[str, Any] = {"m": m, "n": n, "k": k, "options": list(args.option),
                             "cold_compile_s": cold,
                             "cold_split_ms": {r.stage: r.elapsed_ns / 1e6
                                               for r in update.report},
                             "plan": plan_of(SemanticModule.from_text(matmul_text(m, n, k)),
                                             options)}
    return update.fragment, entry


def run_case(m: int, n: int, k: int, args: argparse.Namespace) -> dict[str, Any]:
    import cupy

    frag, entry = compile_case(m, n, k, args)
    assert frag is not None
    rng = cupy.random.default_rng(0)
    a = (rng.standard_normal((m, k), dtype=cupy.float32) / k ** 0.5).astype(cupy.float32)
    b = rng.standard_normal((k, n), dtype=cupy.float32)
    c = cupy.empty((m, n), dtype=cupy.float32)
    frag.launch_all([a, b], [c])
    cublas = cupy.matmul(a, b)
    ref = cupy.matmul(a.astype(cupy.float64), b.astype(cupy.float64))
    cupy.cuda.Device().synchronize()
    entry["err"] = rel_err(c, ref)
    entry["cublas_err"] = rel_err(cublas, ref)
    entry["err_vs_cublas"] = rel_err(c, cublas.astype(cupy.float64))
    entry["pass"] = entry["err"] <= TOLERANCE
    del ref
    flops = 2.0 * m * n * k
    out = cupy.empty_like(c)
    for key, fn in (("accy", lambda: frag.launch_all([a, b], [c])),
                    ("cublas", lambda: cupy.matmul(a, b, out=out))):
        t = bench(fn, args.calls, args.repeats)
        t["tflops"] = flops / t["median_s"] / 1e12
        t["tflops_range"] = [flops / t["max_s"] / 1e12, flops / t["min_s"] / 1e12]
        entry[key] = t
    entry["accy_over_cublas"] = entry["accy"]["tflops"] / entry["cublas"]["tflops"]
    return entry


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)),
                    help="square sizes, comma separated")
    ap.add_argument("--ragged", default="x".join(map(str, RAGGED)),
                    help="MxNxK shapes, comma separated ('' for none)")
    ap.add_argument("--option", action="append", default=[], help="STAGE.NAME=VALUE")
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", help="also write the JSON here")
    ap.add_argument("--compile-only", action="store_true",
                    help="only compile each case (the six stages and NVRTC; no GPU needed), "
                         "each twice in this process: the first pays NVRTC's start")
    args = ap.parse_args(argv)
    shapes = [(s, s, s) for s in map(int, filter(None, args.sizes.split(",")))]
    shapes += [tuple(int(x) for x in r.split("x"))  # type: ignore[misc]
               for r in filter(None, args.ragged.split(","))]
    if args.compile_only:
        runs = []
        for m, n, k in shapes:
            for rep in range(2):
                e = compile_case(m, n, k, args)[1]
                e["repeat"] = rep
                runs.append(e)
                print(f"{m}x{n}x{k} {e['plan']['mapping']} {e['plan']['tile']} (#{rep}): "
                      f"refresh {e['cold_compile_s']:.3f} s, NVRTC "
                      f"{e['cold_split_ms']['compile']:.1f} ms", file=sys.stderr)
        print(json.dumps({"compile_only": runs}, indent=1))
        return 0
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    result: dict[str, Any] = {"device": props["name"].decode(), "cupy": cupy.__version__,
                              "cupy_tf32": os.environ.get("CUPY_TF32"), "cases": []}
    for m, n, k in shapes:
        entry = run_case(m, n, k, args)
        result["cases"].append(entry)
        print(f"{m}x{n}x{k} {entry['plan']['mapping']} {entry['plan']['tile']}: accy "
              f"{entry['accy']['tflops']:.1f} TFLOP/s, cuBLAS {entry['cublas']['tflops']:.1f} "
              f"({entry['accy_over_cublas']:.2f}x), err {entry['err']:.2e} (cuBLAS "
              f"{entry['cublas_err']:.2e}), cold {entry['cold_compile_s']:.3f} s",
              file=sys.stderr)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0 if all(e["pass"] for e in result["cases"]) else 1


if __name__ == "__main__":
    sys.exit(main())
