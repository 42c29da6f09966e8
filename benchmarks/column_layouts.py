"""Hand-written layouts of a softmax over axis 0 against a copy of the same bytes; prints
one JSON line per layout.

What holds a column softmax (64 × C, f32: a softmax down each column) under a copy?
This times accy's own kernel (as ``accy emit`` renders it) beside hand-written CuPy
kernels that change one thing at a time — the columns a thread owns (``vec``), the
threads that share a column (``split``), the block size, cache hints on the loads and
stores, persistent blocks, ``cp.async`` pipelines, the order in which blocks take their
tiles (``streams``: block ``b`` takes tile ``b / G`` of run ``b % G``, as
``kernel.column_streams`` does) — and kernels that only load and store in the softmax's
layout (``tilecopy``) or a flat one (``flatcopy``), with no math: a layout's own cost.

Each kernel is timed as ``kernels.py`` times (50 back-to-back launches between two CUDA
events, median of 7 repeats) between two timings of torch's ``copy_`` of the same bytes;
``of_copy`` is the kernel's GB/s over the median of those copies. Every output is
checked (max |Δ| against CuPy's softmax, or the input for the copies).

    python3 benchmarks/column_layouts.py [--cols 524288] [--set probe|order]

``probe`` (the default) is the first survey (layouts, hints, persistent blocks,
``cp.async``); ``order`` the load-store kernels, a padded pitch and the tile orders
(RESULTS.md, kernels, thirty-first session). Needs a GPU, CuPy and torch.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

ROWS = 64
"""The softmax's axis: each column holds this many values."""
LOADS = {"ldg": "__ldg", "cs": "__ldcs", "cg": "__ldcg", "lu": "__ldlu"}
VECTOR = {1: "float", 2: "float2", 4: "float4"}
FIELDS = {1: [""], 2: [".x", ".y"], 4: [".x", ".y", ".z", ".w"]}


def _unrolled(src: str) -> str:
    """``src`` with ``#pragma unroll`` before each constant-trip loop (every ``for (int``
    but the persistent one): a thread's values stay in registers.

    >>> print(_unrolled("for (int j = 0; j < 2; ++j) x += j;"))
    #pragma unroll
    for (int j = 0; j < 2; ++j) x += j;
    """
    return "\n".join("#pragma unroll\n" + line
                     if line.lstrip().startswith("for (int ")
                     and not line.lstrip().startswith("for (int it ") else line
                     for line in src.split("\n"))


def tile_of(streams: int) -> str:
    """The tile a block takes: ``blockIdx.x``, or (``streams`` G) tile ``b / G`` of run
    ``b % G`` when G divides the grid.

    >>> tile_of(0), tile_of(8)
    ('(long long)blockIdx.x', '((long long)(blockIdx.x % 8) * (gridDim.x / 8) + blockIdx.x / 8)')
    """
    if not streams:
        return "(long long)blockIdx.x"
    return f"((long long)(blockIdx.x % {streams}) * (gridDim.x / {streams}) + blockIdx.x / {streams})"


def _store(vec: int, row: str, value: str, store: str) -> str:
    at = f"reinterpret_cast<{VECTOR[vec]}*>(out + (long long){row} * cols + col)"
    return f"*{at} = {value};" if store == "plain" else f"__stcs({at}, {value});"


def _reduce(vec: int, split: int, tpc: int, per: int, kind: str) -> list[str]:
    """This thread's partial (max or sum) of each column, then the column's, through
    shared memory."""
    init, op = ("-__int_as_float(0x7f800000)", "fmaxf({a}, {b})") if kind == "max" \
        else ("0.0f", "{a} + {b}")
    acc = "m" if kind == "max" else "s"
    lines = [f"for (int e = 0; e < {vec}; ++e) {{", f"  {acc}[e] = {init};"]
    if kind == "max":
        lines.append(f"  for (int j = 0; j < {per}; ++j) m[e] = fmaxf(m[e], v[j][e]);")
    else:
        lines.append(f"  for (int j = 0; j < {per}; ++j) {{ v[j][e] = expf(v[j][e] - m[e]); "
                     "s[e] += v[j][e]; }")
    lines += [f"  sh[e][threadIdx.x] = {acc}[e];", "}", "__syncthreads();",
              f"for (int e = 0; e < {vec}; ++e) {{", "  float x = sh[e][lane];",
              f"  for (int g = 1; g < {split}; ++g) x = {op.format(a='x', b=f'sh[e][g * {tpc} + lane]')};",
              f"  {acc}[e] = x;", "}", "__syncthreads();"]
    return lines


def _softmax_body(vec: int, split: int, tpc: int, per: int, row: str, read: str,
                  store: str) -> list[str]:
    """Read a thread's columns (``read`` gives vector ``w`` of step ``j``), max, sum, store."""
    unpack = [f"  v[j][{i}] = w{f};" for i, f in enumerate(FIELDS[vec])]
    quotients = [f"v[j][{i}] / s[{i}]" for i in range(vec)]
    value = quotients[0] if vec == 1 else f"make_{VECTOR[vec]}({', '.join(quotients)})"
    return ([f"float v[{per}][{vec}], m[{vec}], s[{vec}];",
             f"for (int j = 0; j < {per}; ++j) {{", f"  const {VECTOR[vec]} w = {read};",
             *unpack, "}"]
            + _reduce(vec, split, tpc, per, "max") + _reduce(vec, split, tpc, per, "sum")
            + [f"for (int j = 0; j < {per}; ++j) {_store(vec, row, value, store)}"])


def softmax(vec: int, split: int, block: int, load: str = "ldg", store: str = "plain",
            persist: bool = False, streams: int = 0) -> tuple[str, int]:
    """A column softmax kernel ``k(in, out, cols, tiles)`` and the columns of its tile:
    ``split`` threads a column, ``vec`` columns a thread, each thread every split-th row."""
    tpc, per = block // split, ROWS // split
    row = f"(j * {split} + t)"
    read = f"{LOADS[load]}(reinterpret_cast<const {VECTOR[vec]}*>(in + (long long){row} * cols + col))"
    loop = ("for (long long tile = blockIdx.x; tile < tiles; tile += gridDim.x) {" if persist
            else f"{{ const long long tile = {tile_of(streams)};")
    body = _softmax_body(vec, split, tpc, per, row, read, store)
    src = "\n".join([
        f'extern "C" __global__ void __launch_bounds__({block}) k(const float* __restrict__ in, '
        "float* __restrict__ out, const long long cols, const long long tiles) {",
        f"const int t = threadIdx.x / {tpc}, lane = threadIdx.x % {tpc};",
        f"__shared__ float sh[{vec}][{block}];", loop,
        f"const long long col = (tile * {tpc} + lane) * {vec};", *body, "__syncthreads();",
        "}", "}"])
    return _unrolled(src), tpc * vec


def pipelined(vec: int, split: int, block: int, stages: int, store: str = "plain") \
        -> tuple[str, int, int]:
    """Persistent blocks, each tile copied to shared memory 16 bytes a thread with
    ``cp.async``, ``stages`` tiles in flight: the kernel, its tile's columns, its dynamic
    shared bytes."""
    tpc, per = block // split, ROWS // split
    tcols = tpc * vec
    each = ROWS * tcols // 4 // block
    row = f"(j * {split} + t)"
    read = f"*reinterpret_cast<const {VECTOR[vec]}*>(sb + {row} * {tcols} + lane * {vec})"
    body = _softmax_body(vec, split, tpc, per, row, read, store)
    src = "\n".join([
        "__device__ __forceinline__ void issue(float* buf, const float* __restrict__ in, "
        "long long cols, long long tile) {",
        "const unsigned base = (unsigned)__cvta_generic_to_shared(buf);",
        f"for (int i = 0; i < {each}; ++i) {{",
        f"  const int q = i * {block} + threadIdx.x, r = q / {tcols // 4}, c4 = q % {tcols // 4};",
        f"  const float* g = in + (long long)r * cols + tile * {tcols} + c4 * 4;",
        f'  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(base + (unsigned)'
        f'(r * {tcols} + c4 * 4) * 4u), "l"(g));',
        "}", 'asm volatile("cp.async.commit_group;");', "}",
        f'extern "C" __global__ void __launch_bounds__({block}) k(const float* __restrict__ in, '
        "float* __restrict__ out, const long long cols, const long long tiles) {",
        "extern __shared__ __align__(16) float buf[];",
        f"__shared__ float sh[{vec}][{block}];",
        f"const int t = threadIdx.x / {tpc}, lane = threadIdx.x % {tpc};",
        "long long tile = blockIdx.x;",
        f"for (int p = 0; p < {stages - 1}; ++p) {{",
        "  const long long pt = tile + (long long)p * gridDim.x;",
        f"  if (pt < tiles) issue(buf + p * {ROWS * tcols}, in, cols, pt);",
        '  else asm volatile("cp.async.commit_group;");', "}",
        "for (int it = 0; tile < tiles; ++it, tile += gridDim.x) {",
        f"const long long nt = tile + (long long){stages - 1} * gridDim.x;",
        f"if (nt < tiles) issue(buf + ((it + {stages - 1}) % {stages}) * {ROWS * tcols}, in, cols, nt);",
        'else asm volatile("cp.async.commit_group;");',
        f'asm volatile("cp.async.wait_group %0;" :: "n"({stages - 1}));', "__syncthreads();",
        f"const float* sb = buf + (it % {stages}) * {ROWS * tcols};",
        f"const long long col = tile * {tcols} + lane * {vec};", *body, "}",
        'asm volatile("cp.async.wait_all;");', "}"])
    return _unrolled(src), tcols, stages * ROWS * tcols * 4


def tilecopy(vec: int, split: int, block: int, load: str = "ldg", store: str = "plain",
             sync: bool = False, streams: int = 0) -> tuple[str, int]:
    """The softmax's loads and stores (its layout and tile order), no math."""
    tpc, per = block // split, ROWS // split
    row = f"(j * {split} + t)"
    src = "\n".join([
        f'extern "C" __global__ void __launch_bounds__({block}) k(const float* __restrict__ in, '
        "float* __restrict__ out, const long long cols, const long long tiles) {",
        f"const int t = threadIdx.x / {tpc}, lane = threadIdx.x % {tpc};",
        f"const long long col = ({tile_of(streams)} * {tpc} + lane) * {vec};",
        f"{VECTOR[vec]} v[{per}];",
        f"for (int j = 0; j < {per}; ++j) v[j] = {LOADS[load]}(reinterpret_cast<const "
        f"{VECTOR[vec]}*>(in + (long long){row} * cols + col));",
        "__syncthreads();" if sync else "",
        f"for (int j = 0; j < {per}; ++j) {_store(vec, row, 'v[j]', store)}", "}"])
    return _unrolled(src), tpc * vec


def flatcopy(vec: int, block: int, items: int) -> tuple[str, int]:
    """A contiguous copy, ``items`` vectors a thread, a block's accesses neighbours (its
    "tile" is ``block · items · vec`` elements, counted in columns of ``ROWS``)."""
    span = block * vec
    src = "\n".join([
        f'extern "C" __global__ void __launch_bounds__({block}) k(const float* __restrict__ in, '
        "float* __restrict__ out, const long long cols, const long long tiles) {",
        f"const long long base = (long long)blockIdx.x * {span * items} + threadIdx.x * {vec};",
        f"{VECTOR[vec]} v[{items}];",
        f"for (int j = 0; j < {items}; ++j) v[j] = __ldg(reinterpret_cast<const {VECTOR[vec]}*>"
        f"(in + base + j * {span}));",
        f"for (int j = 0; j < {items}; ++j) *reinterpret_cast<{VECTOR[vec]}*>(out + base + j * "
        f"{span}) = v[j];", "}"])
    return _unrolled(src), span * items // ROWS


def _tag(kind: str, **params: Any) -> str:
    return " ".join([kind] + [f"{k}={v}" for k, v in params.items()])


def probe_set() -> list[dict[str, Any]]:
    """The first survey: layouts, cache hints, persistent blocks, ``cp.async``."""
    out: list[dict[str, Any]] = []
    layouts: list[dict[str, Any]] = [
        dict(vec=2, split=4, block=256), dict(vec=2, split=4, block=256, load="cs"),
        dict(vec=2, split=4, block=256, load="cg"), dict(vec=2, split=4, block=256, load="lu"),
        dict(vec=2, split=4, block=256, store="cs"),
        dict(vec=2, split=4, block=256, load="cs", store="cs"),
        dict(vec=2, split=4, block=128), dict(vec=2, split=8, block=256),
        dict(vec=2, split=8, block=512), dict(vec=4, split=8, block=256),
        dict(vec=4, split=4, block=256), dict(vec=1, split=4, block=256),
        dict(vec=2, split=2, block=128), dict(vec=2, split=4, block=256, persist=True),
        dict(vec=4, split=8, block=256, persist=True), dict(vec=4, split=8, block=512),
        dict(vec=2, split=8, block=512, persist=True)]
    for p in layouts:
        src, tcols = softmax(**p)
        out.append({"tag": _tag("softmax", **p), "source": src, "tcols": tcols,
                    "block": p["block"], "persist": bool(p.get("persist")), "check": "softmax"})
    for vec, split, block, stages, store in [
            (2, 4, 256, 2, "plain"), (2, 4, 256, 3, "plain"), (2, 4, 256, 4, "plain"),
            (2, 4, 256, 2, "cs"), (2, 8, 256, 2, "plain"), (4, 8, 256, 2, "plain"),
            (2, 2, 128, 3, "plain"), (1, 2, 128, 4, "plain")]:
        src, tcols, dyn = pipelined(vec, split, block, stages, store)
        out.append({"tag": _tag("cp.async", vec=vec, split=split, block=block, stages=stages,
                                store=store),
                    "source": src, "tcols": tcols, "block": block, "persist": True,
                    "dynamic": dyn, "check": "softmax"})
    return out


def order_set() -> list[dict[str, Any]]:
    """The layout's own cost (load-store kernels, a padded pitch) and the tile orders."""
    out: list[dict[str, Any]] = []
    copies: list[dict[str, Any]] = [
        dict(vec=2, split=4, block=256), dict(vec=2, split=4, block=256, sync=True),
        dict(vec=2, split=4, block=256, load="cs", store="cs"),
        dict(vec=4, split=4, block=256), dict(vec=1, split=4, block=256),
        dict(vec=4, split=8, block=512), dict(vec=2, split=8, block=512),
        dict(vec=4, split=16, block=1024), dict(vec=4, split=4, block=256, streams=8),
        dict(vec=2, split=4, block=256, streams=8), dict(vec=2, split=4, block=256, streams=64),
        dict(vec=2, split=4, block=256, streams=64, load="cs", store="cs")]
    for p in copies:
        src, tcols = tilecopy(**p)
        out.append({"tag": _tag("tilecopy", **p), "source": src, "tcols": tcols,
                    "block": p["block"], "check": "copy"})
    src, tcols = tilecopy(2, 4, 256)
    out.append({"tag": "tilecopy vec=2 split=4 block=256 pitch+64", "source": src,
                "tcols": tcols, "block": 256, "check": "copy", "pad": 64})
    for vec, block, items in [(4, 256, 4), (2, 256, 16), (4, 512, 8)]:
        src, tcols = flatcopy(vec, block, items)
        out.append({"tag": _tag("flatcopy", vec=vec, block=block, items=items), "source": src,
                    "tcols": tcols, "block": block, "check": "copy"})
    orders: list[dict[str, Any]] = [
        dict(vec=2, split=4, block=256), dict(vec=2, split=4, block=256, streams=8),
        dict(vec=2, split=4, block=256, streams=64),
        dict(vec=2, split=4, block=256, streams=64, load="cs", store="cs")]
    for p in orders:
        src, tcols = softmax(**p)
        out.append({"tag": _tag("softmax", **p), "source": src, "tcols": tcols,
                    "block": p["block"], "check": "softmax"})
    return out


def accy_kernel(cols: int) -> dict[str, Any]:
    """accy's own column softmax kernel at 64 × ``cols``, as rendered, with its launch."""
    from accy.pipeline import prepare_through
    from accy.preparation.options import RunOptions
    from accy.preparation.products import SemanticModule

    path = os.path.join(ROOT, "graphs", "softmax_axis0.mlir")
    with open(path) as f:
        sm = SemanticModule.from_text(f.read(), path)
    from accy.executable.compile import FragmentPlan

    job: Any = prepare_through(sm, "target", RunOptions.parse("cuda", []), {0: (ROWS, cols)}).product
    (launch,) = FragmentPlan.of(job).launches
    return {"tag": "accy", "source": job.source,
            "name": launch.kernel, "grid": launch.grid[0], "block": launch.block[0],
            "check": "softmax", "accy": True}


def timed(run: Any, number: int = 50, repeats: int = 7) -> list[float]:
    """Seconds a call, a figure a repeat (back-to-back launches between two events)."""
    from accy.executable.device import time_cuda

    for _ in range(3):
        run()
    return time_cuda(run, number, repeats)


def measure(case: dict[str, Any], x: Any, ref: Any, copy: Any, sms: int) -> dict[str, Any]:
    """One kernel's GB/s and share of the copy of its bytes (timed right before and
    after it), and its error."""
    import cupy as cp

    cols = x.shape[1]
    pad = case.get("pad", 0)
    src_arr = x
    if pad:
        src_arr = cp.zeros((ROWS, cols + pad), dtype=cp.float32)
        src_arr[:, :cols] = x
    out = cp.zeros_like(src_arr)
    mod = cp.RawModule(code=case["source"], options=("--fmad=false", "--std=c++17"))
    kern = mod.get_function(case.get("name", "k"))
    dyn = case.get("dynamic", 0)
    if dyn:  # past 48 KB with the static shared memory too, a launch needs the limit raised
        kern.max_dynamic_shared_size_bytes = dyn
    args: tuple[Any, ...]
    if case.get("accy"):
        grid, args = case["grid"], (src_arr, out, cp.int64(cols))
    else:
        tiles = cols // case["tcols"]
        grid = tiles
        if case.get("persist"):
            per_sm = cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(
                kern.kernel.ptr, case["block"], dyn)
            grid = min(tiles, sms * per_sm)
        args = (src_arr, out, cp.int64(cols + pad), cp.int64(tiles))

    def run() -> None:
        kern((grid,), (case["block"],), args, shared_mem=dyn)

    run()
    cp.cuda.Device().synchronize()
    want = ref if case["check"] == "softmax" else x
    err = float(cp.abs(out[:, :cols] - want).max())
    before, ts, after = copy(), timed(run), copy()
    nbytes = 2 * x.nbytes
    copy_s, med = statistics.median(before + after), statistics.median(ts)
    return {"layout": case["tag"], "grid": grid, "gbs": round(nbytes / med / 1e9),
            "gbs_range": [round(nbytes / max(ts) / 1e9), round(nbytes / min(ts) / 1e9)],
            "copy_gbs": round(nbytes / copy_s / 1e9), "of_copy": round(100 * copy_s / med, 1),
            "err": err, "registers": kern.num_regs}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cols", type=int, default=524288,
                    help="columns (a multiple of 4096: every layout's tiles divide it)")
    ap.add_argument("--set", choices=("probe", "order"), default="probe")
    args = ap.parse_args(argv)
    if args.cols <= 0 or args.cols % 4096:
        ap.error("--cols must be a positive multiple of 4096")
    import cupy as cp
    import torch

    x = cp.random.default_rng(0).standard_normal((ROWS, args.cols), dtype=cp.float32) * 3
    e = cp.exp(x - x.max(0))
    ref = e / e.sum(0)
    tx, ty = torch.from_dlpack(x), torch.empty_like(torch.from_dlpack(x))
    nbytes = 2 * x.nbytes

    def copy() -> list[float]:
        return timed(lambda: ty.copy_(tx))

    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    print(json.dumps({"gpu": gpu, "sms": sms, "rows": ROWS, "cols": args.cols,
                      "set": args.set, "copy_gbs": round(nbytes / statistics.median(copy()) / 1e9)}),
          flush=True)
    cases = [accy_kernel(args.cols)] + (probe_set() if args.set == "probe" else order_set())
    for case in cases:
        try:
            print(json.dumps(measure(case, x, ref, copy, sms)), flush=True)
        except Exception as exc:  # a layout that does not build or launch: say so, go on
            print(json.dumps({"layout": case["tag"], "error": f"{type(exc).__name__}: {exc}"[:400]}),
                  flush=True)


if __name__ == "__main__":
    main()
