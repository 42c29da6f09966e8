"""Cold NVRTC time of each program's translation unit; prints JSON.

NVRTC is warmed up with a trivial program first (loading the library is once a
process, not once a kernel). Each unit is then compiled ``--repeats`` times, each
time with a new ``__device__`` variable appended: a comment is not enough, because
NVRTC on the H200's host serves a source it compiled before — in any process —
in ~14 ms when only comments differ. The six stages are timed once per program.
Reports min / median / max seconds per unit: ``nvrtc_s`` as a refresh compiles it
(a unit of several kernels as one NVRTC program per kernel, at once:
:func:`accy.executable.device.compile_cuda_parts`) and, for those, ``whole_unit_s``
as one program.

The same units take 0.14 s on one host and 0.33 s on another (NVRTC 13.5 on the
development machine against 13.0 on two H100 hosts, and between those two hosts
softmax's unit 0.135 against 0.20 s; RESULTS.md, kernels, twenty-second session), so
the JSON also says where it ran — the NVRTC version, the CPU model and its cores —
and times :data:`REFERENCE_UNIT`, a fixed source that no change to accy touches, the
same way: ``over_reference`` (a unit's median over the reference's) compares units
across hosts, where seconds compare only within one.

    python3 benchmarks/cold_compile.py [--target cuda:sm_90a] [--repeats 3] [--only NAME,...] [--option STAGE.NAME=VALUE]

The default target is ``cuda:sm_90a`` (what ``cuda`` means on a Hopper GPU), so a
machine without one times the same wgmma units: there ``cuda`` would mean ``sm_90``,
whose matmuls are ``mma.sync``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # kernels.check_options

MATMUL = "benchmarks/tune/matmul_bf16.mlir"
SQUARE: dict[int, tuple[int, ...]] = {0: (4096, 4096), 1: (4096, 4096)}
QKV: dict[int, tuple[int, ...]] = {i: (512, 128, 64) for i in range(3)}
CASES: list[tuple[str, str, dict[int, tuple[int, ...]], str]] = [
    ("matmul_bf16_4096 (wgmma)", MATMUL, SQUARE, ""),
    ("matmul_f16_4096 (wgmma)", MATMUL, SQUARE, "f16"),
    ("matmul_bf16_4096 (mma.sync, sm_90)", MATMUL, SQUARE, "mma"),
    ("matmul_f32_4096 (ffma)", MATMUL, SQUARE, "f32"),
    ("attention 512x128x64", "graphs/attention.mlir", QKV, ""),
    ("mlp 8192x256", "graphs/mlp.mlir", {0: (8192, 256)}, ""),
    ("mlp_bf16 8192x256 (wgmma)", "graphs/mlp.mlir", {0: (8192, 256)}, "as-bf16"),
    ("softmax 8192x1024", "graphs/softmax.mlir", {0: (8192, 1024)}, ""),
    ("layernorm 8192x4096", "graphs/layernorm.mlir", {0: (8192, 4096)}, ""),
]


REFERENCE_UNIT = r"""
extern "C" __global__ void __launch_bounds__(256) reference(const float* __restrict__ x,
    const float* __restrict__ w, float* __restrict__ y, const long long rows) {
  const long long row = (long long)blockIdx.x * 8 + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  float v[32], m = -__int_as_float(0x7f800000), s = 0.0f;
  #pragma unroll
  for (int j = 0; j < 32; ++j) {
    v[j] = x[row * 1024 + j * 32 + lane] * w[j * 32 + lane];
    m = fmaxf(m, v[j]);
  }
  #pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  #pragma unroll
  for (int j = 0; j < 32; ++j) {
    v[j] = expf(v[j] - m) + tanhf(v[j]);
    s += v[j];
  }
  #pragma unroll
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  #pragma unroll
  for (int j = 0; j < 32; ++j) y[row * 1024 + j * 32 + lane] = v[j] / s;
}
"""
"""A fixed translation unit (a row kernel of 32 values a lane: loads, two shuffle
trees, ``expf`` and ``tanhf``, a quotient), timed like the units: its time is the
host's NVRTC speed, not accy's."""


def host_facts() -> dict[str, Any]:
    """Where the compile ran: NVRTC's version, the CPU model and the cores this
    process may use."""
    from accy.executable.device import nvrtc_version
    from accy.host import available_cores, cpu_model

    major, minor = nvrtc_version()
    return {"nvrtc": f"{major}.{minor}", "cpu": cpu_model(), "cores": available_cores()}


def spread(times: list[float]) -> list[float]:
    """min / median / max, in seconds to the millisecond.

    >>> spread([0.3, 0.1, 0.2])
    [0.1, 0.2, 0.3]
    """
    return [round(min(times), 3), round(statistics.median(times), 3), round(max(times), 3)]


def target_job(path: str, shapes: dict[int, tuple[int, ...]], variant: str, target: str,
               options: list[str] | None = None) -> Any:
    from accy.pipeline import prepare_through
    from accy.preparation.options import RunOptions
    from accy.preparation.products import SemanticModule

    with open(os.path.join(ROOT, path)) as f:
        text = f.read()
    if variant in ("f16", "f32"):
        text = text.replace("bf16", variant)
    if variant == "as-bf16":  # an f32 program in bf16
        text = text.replace("f32", "bf16")
    if variant == "mma":
        target = "cuda:sm_90"
    return prepare_through(SemanticModule.from_text(text, path), "target",
                           RunOptions.parse(target, options or []), shapes).product


def never_seen(source: str) -> str:
    """``source`` with a fresh ``__device__`` variable first: a unit NVRTC's host cache
    cannot serve (the module docstring says why a comment is not enough). First, so
    that each kernel's own program (``head + part``, the split compile) is new too."""
    return f"__device__ int accy_cold_{uuid.uuid4().hex};\n" + source


def main(argv: list[str] | None = None) -> None:
    from kernels import check_options

    from accy.executable.compile import FragmentPlan, fragment_backend
    from accy.target.common import kernel_parts

    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="cuda:sm_90a")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", default="", help="comma-separated unit names or name "
                    "prefixes (default: every unit)")
    ap.add_argument("--option", action="append", default=[], metavar="STAGE.NAME=VALUE",
                    help="an accy option for every unit (repeatable), e.g. "
                         "kernel.wgmma_stages=3")
    args = ap.parse_args(argv)
    check_options(ap, args.option, args.target)
    wanted = [w.strip() for w in args.only.split(",") if w.strip()]
    cases = [c for c in CASES if not wanted or any(c[0].startswith(w) for w in wanted)]
    if not cases:
        ap.error(f"--only {args.only!r} names no unit; the units: "
                 + ", ".join(c[0] for c in CASES))
    softmax = next(c for c in CASES if c[0].startswith("softmax"))
    warm = fragment_backend(target_job(*softmax[1:], args.target))
    warm.compile('extern "C" __global__ void k() {}', "/tmp/accy-cold-ws", warm.flags(False))
    ref: list[float] = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        warm.compile(never_seen(REFERENCE_UNIT), "/tmp/accy-cold-ws", warm.flags(False))
        ref.append(time.perf_counter() - t)
    out: dict[str, Any] = {"target": args.target, "repeats": args.repeats,
                           "options": args.option, "host": host_facts(),
                           "reference_s": spread(ref), "units": {}}
    for name, path, shapes, variant in cases:
        t0 = time.perf_counter()
        job = target_job(path, shapes, variant, args.target, args.option)
        stages = time.perf_counter() - t0
        backend, plan = fragment_backend(job), FragmentPlan.of(job)
        source = job.source
        flags = backend.flags(plan.fast_math)
        parts = len(kernel_parts(source)[1])
        times: list[float] = []
        whole: list[float] = []
        for _ in range(args.repeats):
            unique = never_seen(source)
            t = time.perf_counter()
            backend.compile(unique, "/tmp/accy-cold-ws", flags, split=True)
            times.append(time.perf_counter() - t)
            if parts > 1:  # the same unit as one program, for comparison
                unique = never_seen(source)
                t = time.perf_counter()
                backend.compile(unique, "/tmp/accy-cold-ws", flags)
                whole.append(time.perf_counter() - t)
        out["units"][name] = {"arch": backend.arch, "stages_s": round(stages, 3),
                              "nvrtc_s": spread(times),
                              "over_reference": round(statistics.median(times)
                                                      / statistics.median(ref), 2),
                              "kernels": [launch.kernel for launch in plan.launches],
                              "programs": max(parts, 1),
                              "flags": list(flags)}
        if whole:
            out["units"][name]["whole_unit_s"] = spread(whole)
        print(name, json.dumps(out["units"][name]), file=sys.stderr, flush=True)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
