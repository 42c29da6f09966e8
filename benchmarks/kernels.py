"""Kernel speed on the GPU, every implementation timed the same way; prints JSON.

Implementations, side by side in one process on the same inputs:

- **accy**: the program's loaded fragment, ``LoadedFragment.launch_all`` on
  preallocated CuPy arrays (views of the torch tensors below, no copies);
- **torch eager**: the same program interpreted op by op with torch ops;
- **torch.compile**: that interpreter under ``torch.compile`` (default mode,
  ``dynamic=False``);
- **torch.compile, reduce-overhead** (only where accy replays its fragment as a CUDA
  graph: a fragment of several launches, from its second call): the same under
  ``mode="reduce-overhead"``, torch's CUDA-graph mode, so the graphs are on both sides;
- **cuBLAS** (matmuls only): ``torch.matmul``.

TF32 is off everywhere. Timing: ``calls`` back-to-back calls between two CUDA
events (50; fewer, never under 3, when one call takes longer than 4 ms, so a
repeat stays near 0.2 s), the time per call of each repeat, median of 7
repeats, with min and max; warm-up calls first. One call between two events
would time host dispatch, not the kernel; ``host_bound`` marks a figure whose
host enqueue time per call reached the GPU time (dispatch-bound). A device copy (``torch``'s
``copy_`` and ``cudaMemcpyAsync``) of an f32 8192×4096 tensor is timed the same way in the
same run, and beside every case measured in GB/s a ``copy_`` of that case's own bytes
(``copy``; "% of copy" in the summary and the table is against it).

Programs: every ``graphs/*.mlir`` (row programs at 8192×4096, softmax over
axis 0 at 64×524288, attention 512×128×64, the MLP block 8192×256→1024→256,
static-shape graphs rewritten to 8192×4096 where that is a plain rename, and
``all_ops`` at its own 4×8), bf16 and f16 versions of the row programs and the MLP
block (the element type rewritten in the text), and square matmuls 1024³…8192³ in
f32/bf16/f16. GB/s counts every input read and every output written once;
TFLOP/s counts 2·M·N·K per matmul.

Each accy result is checked against torch's float32 computation of the same
program on the same (rounded) inputs: ``err`` = max |accy − ref| / max |ref|,
pass when ``err <= TOLERANCE[dtype]``. Each accy program's cold compile (the
six stages + NVRTC + load, a fresh cache and an empty binary memo) is timed too; where
NVRTC itself reuses a source it compiled before (the H200's host does, across
processes), that column is only cold on a machine that never compiled the programs —
``benchmarks/cold_compile.py`` times NVRTC on sources it cannot have seen.

Run on a GPU machine::

    python3 benchmarks/kernels.py [--only NAME[,NAME]] [--quick] [--out FILE]
        [--option STAGE.NAME=VALUE ...]   # accy options for every fragment (an A/B)
    python3 benchmarks/kernels.py --markdown FILE   # that run's table for RESULTS.md
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import platform
import re
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

TOLERANCE = {"f32": 1e-4, "f16": 4e-3, "bf16": 3e-2}
"""Largest accepted max |accy − ref| / max |ref| per element type (f32 ref)."""
ROWS, COLS = 8192, 4096
HALF_PROGRAMS = ("bias_gelu", "dynamic", "elementwise_chain", "gelu_tanh", "layernorm",
                 "mlp", "reductions", "residual_norm", "rmsnorm", "softmax", "softmax_axis0")
"""The graphs also measured in bf16 and f16 (the row programs, and the MLP block, whose
matmuls then run on tensor cores)."""
GRAPH_SETUP: dict[str, dict[str, Any]] = {
    "softmax_axis0": {"cols": 524288},
    "attention": {"rows": 512},
    # static shapes renamed to the benchmark's (every occurrence is a shape)
    "reductions": {"rename": [("64x128", f"{ROWS}x{COLS}"), ("tensor<64x", f"tensor<{ROWS}x"),
                              ("1x128", f"1x{COLS}")]},
    "residual_norm": {"rename": [("1024", str(COLS))]},
}
MATMUL_SIZES = (1024, 2048, 4096, 8192)
TORCH_DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16", "i1": "bool",
                "i8": "int8", "i16": "int16", "i32": "int32", "i64": "int64"}


# --------------------------------------------------------------------------- cases


def with_element(text: str, element: str) -> str:
    """``text`` with every f32 tensor type (constants too) made ``element``."""
    return re.sub(r"(tensor<(?:[0-9?]+x)*)f32>", rf"\g<1>{element}>", text)


def matmul_text(n: int, element: str) -> str:
    t = f"tensor<{n}x{n}x{element}>"
    return (f'"builtin.module"() ({{\n'
            f'  "func.func"() <{{function_type = ({t}, {t}) -> {t}, sym_name = "main"}}> ({{\n'
            f'  ^bb0(%a: {t}, %b: {t}):\n'
            f'    %0 = "semantic.matmul"(%a, %b) : ({t}, {t}) -> {t}\n'
            f'    "func.return"(%0) : ({t}) -> ()\n'
            f'  }}) : () -> ()\n'
            f'}}) : () -> ()\n')


def cases(quick: bool = False) -> list[dict[str, Any]]:
    """Every benchmark case: name, program text, ``?`` binding, element type, kind."""
    out = []
    for path in sorted(glob.glob(os.path.join(ROOT, "graphs", "*.mlir"))):
        name = os.path.splitext(os.path.basename(path))[0]
        setup = GRAPH_SETUP.get(name, {})
        with open(path) as f:
            text = f.read()
        for old, new in setup.get("rename", []):
            text = text.replace(old, new)
        elements = ("f32", "bf16", "f16") if name in HALF_PROGRAMS else ("f32",)
        for el in elements:
            out.append({"name": name if el == "f32" else f"{name}_{el}", "graph": name,
                        "text": with_element(text, el), "element": el, "kind": "graph",
                        "rows": setup.get("rows", ROWS), "cols": setup.get("cols", COLS)})
    for n in MATMUL_SIZES[:2] if quick else MATMUL_SIZES:
        for el in ("f32", "bf16", "f16"):
            out.append({"name": f"matmul{n}_{el}", "graph": "matmul", "text": matmul_text(n, el),
                        "element": el, "kind": "matmul", "rows": n, "cols": n})
    # the f32 graphs first, then the matmuls, then the half-precision graphs
    rank = {"f32": 0, "bf16": 2, "f16": 3}
    return sorted(out, key=lambda c: 1 if c["kind"] == "matmul" else rank[c["element"]])


def select_cases(todo: list[dict[str, Any]], only: str) -> list[dict[str, Any]]:
    """The cases ``--only`` names: comma-separated names or name prefixes (``softmax``
    is every softmax case, ``softmax_axis0_bf16`` one); every case when empty.

    >>> [c["name"] for c in select_cases([{"name": "softmax"}, {"name": "mlp_bf16"}],
    ...                                  "mlp")]
    ['mlp_bf16']
    """
    wanted = [w.strip() for w in only.split(",") if w.strip()]
    return [c for c in todo if not wanted or any(c["name"].startswith(w) for w in wanted)]


def arg_shapes(sm: Any, rows: int, cols: int) -> list[tuple[int, ...]]:
    """Each argument's shape: a ``?`` on axis 0 of a matrix or more is ``rows``, else ``cols``."""
    shapes = []
    for t in sm.entry().function_type.inputs:
        shapes.append(tuple((rows if i == 0 and t.rank >= 2 else cols) if d is None else d
                            for i, d in enumerate(t.shape)))
    return shapes


def element_name(t: Any) -> str:
    """The element type's name of a tensor type (``f32``…)."""
    return str(t.element.name)


def flops(sm: Any, shapes: list[tuple[int, ...]]) -> int:
    """2·M·N·K for every matmul of the program (batch dims multiplied in)."""
    from accy.choir.attributes import TensorType
    from accy.pipeline import prepare_through
    from accy.preparation.options import RunOptions

    contract = prepare_through(sm, "contract", RunOptions.parse("host"),
                               dict(enumerate(shapes))).product
    total = 0
    for op in contract.module.walk():
        if op.op_name == "semantic.matmul":
            out, a = op.results[0].type, op.operands[0].type
            assert isinstance(out, TensorType) and isinstance(a, TensorType)
            total += 2 * math.prod(d or 0 for d in out.shape) * (a.shape[-1] or 0)
    return total


# --------------------------------------------------------------------------- torch


def torch_program(module: Any) -> Callable[..., tuple[Any, ...]]:
    """A torch function computing the semantic ``module``'s entry, op by op.

    Every op becomes a closure over plain Python values, so ``torch.compile``
    traces a straight line of torch calls.
    """
    import torch
    import torch.nn.functional as F

    from accy.choir.attributes import BoolAttr, IntegerAttr, StringAttr, i64_list

    func = module.entry()
    slot: dict[Any, int] = {a: i for i, a in enumerate(func.body.args)}
    steps: list[tuple[Callable[..., Any], tuple[int, ...]]] = []
    outs: tuple[int, ...] = ()

    def dtype(t: Any) -> Any:
        return getattr(torch, TORCH_DTYPES[t.element.name])

    unary = {"exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt,
             "tanh": torch.tanh, "sigmoid": torch.sigmoid, "erf": torch.erf, "sin": torch.sin,
             "cos": torch.cos, "reciprocal": torch.reciprocal, "neg": torch.neg,
             "abs": torch.abs, "relu": torch.relu, "floor": torch.floor}
    binary = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "max": torch.maximum,
              "min": torch.minimum, "pow": torch.pow}
    predicates = {"lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge,
                  "eq": torch.eq, "ne": torch.ne}
    reductions = {"sum": torch.sum, "max": torch.amax, "min": torch.amin, "mean": torch.mean}

    def translate(op: Any) -> Callable[..., Any]:
        name = op.op_name.removeprefix("semantic.")
        res = op.results[0].type
        if name in unary:
            return unary[name]
        if name in binary:
            return binary[name]
        if name == "div":
            if res.element.is_float:
                return torch.div
            return lambda a, b: torch.div(a, b, rounding_mode="trunc")
        if name == "gelu":
            a = op.attr("approximate")
            approx = a.value if isinstance(a, StringAttr) else "none"
            return lambda x: F.gelu(x, approximate=approx)
        if name == "cmp":
            return predicates[op.attr("predicate").value]
        if name == "select":
            return torch.where
        if name == "cast":
            dt = dtype(res)
            return lambda x: x.to(dt)
        if name == "constant":
            import numpy as np

            arr = np.asarray(op.attr("value").to_numpy())
            value = torch.from_numpy(np.ascontiguousarray(
                arr.astype(np.float32) if arr.dtype.kind == "f" else arr)).to(
                "cuda", dtype(res))
            return lambda: value
        if name.startswith("reduce_"):
            axes = tuple(i64_list(op.attr("axes")))
            k = op.attr("keepdims")
            keep = bool(k.value) if isinstance(k, BoolAttr | IntegerAttr) else k is not None
            red = reductions[name.removeprefix("reduce_")]
            return lambda x: red(x, dim=axes, keepdim=keep)
        if name == "reshape":
            shape = tuple(-1 if d is None else d for d in res.shape)
            return lambda x: x.reshape(shape)
        if name == "transpose":
            perm = tuple(i64_list(op.attr("permutation")))
            return lambda x: x.permute(perm)
        if name == "broadcast_to":
            rank, fixed = res.rank, tuple(-1 if d is None else d for d in res.shape)
            return lambda x: x.reshape((1,) * (rank - x.dim()) + tuple(x.shape)).expand(*fixed)
        if name == "matmul":
            return torch.matmul
        if name == "softmax":
            axis = op.attr("axis").value
            return lambda x: F.softmax(x, dim=axis)
        if name in ("layernorm", "rmsnorm"):
            axis, eps = op.attr("axis").value, float(op.attr("epsilon").value)
            if name == "layernorm":
                return lambda x, g, b: F.layer_norm(x, tuple(x.shape[axis:]), g, b, eps)
            return lambda x, g: F.rms_norm(x, tuple(x.shape[axis:]), g, eps)
        raise NotImplementedError(f"no torch form of '{op.op_name}'")

    for op in func.body.ops:
        if op.op_name == "func.return":
            outs = tuple(slot[v] for v in op.operands)
            break
        steps.append((translate(op), tuple(slot[v] for v in op.operands)))
        for r in op.results:
            slot[r] = len(slot)

    def run(*xs: Any) -> tuple[Any, ...]:
        env = list(xs)
        for fn, ins in steps:
            env.append(fn(*[env[i] for i in ins]))
        return tuple(env[i] for i in outs)

    return run


# -------------------------------------------------------------------------- timing


def bench(fn: Callable[[], Any], calls: int, repeats: int) -> dict[str, Any]:
    """Seconds per call: ``calls`` back-to-back calls between two CUDA events, per repeat.

    ``calls`` shrinks (to no fewer than 3) when one call takes over 4 ms, so a
    repeat stays near 0.2 s; warm-up calls run first.
    """
    import torch

    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    one = time.perf_counter() - t0
    if one > 4e-3:
        calls = max(3, min(calls, int(0.2 / one)))
    for _ in range(min(calls, 5)):
        fn()
    torch.cuda.synchronize()
    per_call, host = [], []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        host.append((time.perf_counter() - t0) / calls)
        end.record()
        end.synchronize()
        per_call.append(start.elapsed_time(end) / 1e3 / calls)
    med = statistics.median(per_call)
    return {"median_s": med, "min_s": min(per_call), "max_s": max(per_call), "calls": calls,
            "repeats": repeats, "host_enqueue_s": statistics.median(host),
            # the GPU waited on the host: the figure is dispatch-bound, not kernel-bound
            "host_bound": statistics.median(host) >= 0.9 * med}


def rate(t: dict[str, Any] | None, nbytes: int, nflops: int) -> dict[str, Any] | None:
    """A timing with its GB/s (and TFLOP/s) at the median, min and max."""
    if t is None:
        return None
    out = dict(t)
    out["ms"] = t["median_s"] * 1e3
    out["gbs"] = nbytes / t["median_s"] / 1e9
    out["gbs_range"] = [nbytes / t["max_s"] / 1e9, nbytes / t["min_s"] / 1e9]
    if nflops:
        out["tflops"] = nflops / t["median_s"] / 1e12
        out["tflops_range"] = [nflops / t["max_s"] / 1e12, nflops / t["min_s"] / 1e12]
    return out


# ---------------------------------------------------------------------------- accy


def result_errs(got: Any, ref: Any) -> list[list[float]]:
    """Per result: [max |got − ref|, max |ref|] (NaN where both are NaN counts as equal)."""
    import torch

    out = []
    for g, w in zip(got, ref):
        g, w = g.double(), w.double()
        diff = torch.where(torch.isnan(g) & torch.isnan(w), torch.zeros_like(g), (g - w).abs())
        scale = float(torch.nan_to_num(w.abs(), nan=0.0, posinf=0.0).max().item())
        out.append([float(torch.nan_to_num(diff, nan=math.inf).max().item()), scale])
    return out


def rel_err(got: Any, ref: Any) -> float:
    """max over results of max |got − ref| / max |ref|."""
    return max([d / (s or 1.0) for d, s in result_errs(got, ref)], default=0.0)


def cupy_view(t: Any) -> Any:
    """The CuPy array over a torch tensor's memory (bf16 as its uint16 bit patterns)."""
    import cupy
    import torch

    if t.dtype == torch.bfloat16:
        return cupy.asarray(t.view(torch.int16)).view(cupy.uint16)
    return cupy.asarray(t)


OPTIONS: list[str] = []
"""``--option STAGE.NAME=VALUE`` assignments every accy fragment of the run is built with."""


def check_options(ap: argparse.ArgumentParser, options: list[str],
                  target: str = "cuda:sm_90a") -> None:
    """A bad ``--option`` is a usage error before the run, not an error in every case."""
    from accy.errors import AccyError
    from accy.preparation.options import RunOptions

    try:
        RunOptions.parse(target, options)
    except AccyError as e:
        ap.error(str(e))


def accy_fragment(case: dict[str, Any], shapes: list[tuple[int, ...]]) -> tuple[Any, dict]:
    """The loaded fragment (a fresh cache: a cold compile) and its compile timings."""
    from accy.executable.cache import FragmentCompilerCache
    from accy.executable.compile import BINARIES
    from accy.preparation.options import RunOptions
    from accy.preparation.products import SemanticModule
    from accy.preparation.stages import PreparationRequest

    sm = SemanticModule.from_text(case["text"], f"{case['name']}.mlir")
    BINARIES.clear()  # cold: not the binary of a same-source program compiled earlier
    t0 = time.perf_counter()
    update = FragmentCompilerCache().refresh_from_semantic_module(
        sm, PreparationRequest(source=case["name"], options=RunOptions.parse("cuda", OPTIONS),
                               shapes=dict(enumerate(shapes))))
    cold = time.perf_counter() - t0
    frag = update.fragment
    assert frag is not None
    info = {"cold_compile_s": cold,
            "cold_split_ms": {r.stage: r.elapsed_ns / 1e6 for r in update.report},
            "reused": [r.stage for r in update.report if r.reused],
            "launches": [{k: v for k, v in launch.to_plain().items() if k != "buffers"}
                         for launch in frag.plan.launches]}
    return frag, info


# ---------------------------------------------------------------------------- runs


def run_case(case: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from accy.preparation.products import SemanticModule

    sm = SemanticModule.from_text(case["text"], f"{case['name']}.mlir")
    func = sm.entry()
    shapes = arg_shapes(sm, case["rows"], case["cols"])
    gen = torch.Generator(device="cuda").manual_seed(0)
    inputs = []
    for t, s in zip(func.function_type.inputs, shapes):
        x = torch.randn(s, generator=gen, device="cuda", dtype=torch.float32)
        if case["kind"] == "matmul" or case["graph"] == "mlp":
            x = x / math.sqrt(s[0])  # keep products O(1)
        inputs.append(x.to(getattr(torch, TORCH_DTYPES[element_name(t)])))
    program = torch_program(sm.module)
    ref = program(*[x.float() if x.is_floating_point() else x for x in inputs])
    out_types = func.function_type.results
    nbytes = sum(x.numel() * x.element_size() for x in inputs) + sum(
        r.numel() * torch.empty((), dtype=getattr(torch, TORCH_DTYPES[element_name(t)]))
        .element_size() for r, t in zip(ref, out_types))
    nflops = flops(sm, shapes)
    entry: dict[str, Any] = {"element": case["element"], "shapes": shapes,
                             "bytes": nbytes, "flops": nflops}

    # accy
    frag, info = accy_fragment(case, shapes)
    entry.update(info)
    results = [torch.empty(tuple(s), device="cuda",
                           dtype=getattr(torch, TORCH_DTYPES[el])) for s, el in frag.plan.results]
    a_args = [cupy_view(x) for x in inputs]
    a_res = [cupy_view(r) for r in results]
    frag.launch_all(a_args, a_res)
    torch.cuda.synchronize()
    entry["err"] = rel_err(results, ref)
    entry["result_errs"] = result_errs(results, ref)
    entry["tolerance"] = TOLERANCE[case["element"]]
    entry["pass"] = entry["err"] <= entry["tolerance"]
    entry["accy"] = rate(bench(lambda: frag.launch_all(a_args, a_res), args.calls,
                               args.repeats), nbytes, nflops)
    entry["accy_graph"] = frag.graphed
    if not nflops:
        entry["copy"] = same_bytes_copy(nbytes, args)

    # torch eager, torch.compile, cuBLAS
    entry["torch_eager"] = rate(bench(lambda: program(*inputs), args.calls, args.repeats),
                                nbytes, nflops)
    entry["torch_eager_err"] = rel_err(program(*inputs), ref)
    if not args.no_torch_compile:
        try:
            torch._dynamo.reset()  # one code object serves every case: no recompile limit
            t0 = time.perf_counter()
            compiled = torch.compile(program, dynamic=False)
            compiled(*inputs)
            torch.cuda.synchronize()
            entry["torch_compile_first_s"] = time.perf_counter() - t0
            entry["torch_compile_err"] = rel_err(compiled(*inputs), ref)
            entry["torch_compile"] = rate(bench(lambda: compiled(*inputs), args.calls,
                                                args.repeats), nbytes, nflops)
        except Exception as e:  # recorded; accy's and eager's figures stand
            entry["torch_compile_error"] = f"{type(e).__name__}: {e}"[:2000]
        if entry["accy_graph"]:
            # accy replays this multi-launch fragment as one CUDA graph: the peer that
            # does the same is torch.compile's "reduce-overhead" mode (CUDA graphs)
            try:
                torch._dynamo.reset()
                graphed = torch.compile(program, dynamic=False, mode="reduce-overhead")
                for _ in range(3):
                    graphed(*inputs)
                torch.cuda.synchronize()
                entry["torch_compile_graphs_err"] = rel_err(
                    [t.clone() for t in graphed(*inputs)], ref)
                entry["torch_compile_graphs"] = rate(bench(lambda: graphed(*inputs),
                                                           args.calls, args.repeats),
                                                     nbytes, nflops)
            except Exception as e:  # recorded; the other figures stand
                entry["torch_compile_graphs_error"] = f"{type(e).__name__}: {e}"[:2000]
    if case["kind"] == "matmul":
        a, b = inputs
        entry["cublas"] = rate(bench(lambda: torch.matmul(a, b), args.calls, args.repeats),
                               nbytes, nflops)
    key = "tflops" if nflops else "gbs"
    mine = entry["accy"][key]
    for other in ("torch_compile", "torch_compile_graphs", "cublas", "torch_eager"):
        if entry.get(other):
            entry[f"accy_over_{other}"] = mine / entry[other][key]
    return entry


def device_copy(args: argparse.Namespace) -> dict[str, Any]:
    """The run's reference copies of an f32 ``ROWS``×``COLS`` tensor (256 MiB moved):
    ``torch``'s ``copy_`` (:func:`same_bytes_copy`) and ``cudaMemcpyAsync``."""
    import cupy

    nbytes = 2 * ROWS * COLS * 4
    xs = cupy.empty(nbytes // 2, dtype=cupy.uint8)
    ys = cupy.empty_like(xs)
    return {
        "bytes": nbytes,
        "torch_copy": same_bytes_copy(nbytes, args),
        "cuda_memcpy": rate(bench(lambda: cupy.cuda.runtime.memcpyAsync(
            ys.data.ptr, xs.data.ptr, xs.size, 3, 0), args.calls, args.repeats), nbytes, 0),
    }


def same_bytes_copy(nbytes: int, args: argparse.Namespace) -> dict[str, Any] | None:
    """A device copy (``torch``'s ``copy_``) that moves ``nbytes`` (read + write), timed
    as the programs are: the run's reference (:func:`device_copy`) and each GB/s case's
    "% of copy" — a half-precision program moves half an f32 one's bytes, and a smaller
    copy reaches fewer GB/s (its launch and last wave weigh more).
    """
    import torch

    x = torch.empty(max(1, nbytes // 2), dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    return rate(bench(lambda: y.copy_(x), args.calls, args.repeats), 2 * x.numel(), 0)


def of_copy(e: dict[str, Any]) -> float | None:
    """A case's GB/s as a fraction of the copy of its own bytes (None for a case
    measured in TFLOP/s, or without that copy)."""
    copy = e.get("copy")
    return e["accy"]["gbs"] / copy["gbs"] if copy and not e["flops"] else None


def _measure(e: dict[str, Any]) -> tuple[str, str]:
    """A program's figure: its key in each side's timing, and its unit."""
    return ("tflops", "TFLOP/s") if e["flops"] else ("gbs", "GB/s")


def _dagger(side: dict[str, Any]) -> str:
    """† on a dispatch-bound side (its host enqueue per call reached its GPU time)."""
    return "†" if side.get("host_bound") else ""


def summary_line(name: str, e: dict[str, Any]) -> str:
    if "error" in e:
        return f"{name:26s} ERROR {e['error'][:100]}"
    key, unit = _measure(e)

    def fig(side: dict[str, Any]) -> str:
        return f"{side[key]:8.1f}" + (_dagger(side) or " ")

    parts = [f"{name:26s}", f"accy {fig(e['accy'])}"]
    for other in ("torch_eager", "torch_compile", "cublas"):
        if e.get(other):
            parts.append(f"{other.replace('torch_', '')} {fig(e[other])}")
    parts.append(unit)
    if "accy_over_torch_compile" in e:
        # a ratio against a dispatch-bound side compares with its host, not its kernel
        bound = e["accy"].get("host_bound") or (e.get("torch_compile") or {}).get("host_bound")
        parts.append(f"accy/compile {e['accy_over_torch_compile']:.2f}"
                     + (" (dispatch-bound)" if bound else ""))
    if "accy_over_torch_compile_graphs" in e:
        parts.append(f"accy/compile(graphs) {e['accy_over_torch_compile_graphs']:.2f}")
    if "accy_over_cublas" in e:
        parts.append(f"accy/cuBLAS {e['accy_over_cublas']:.2f}")
    share = of_copy(e)
    if share is not None:
        parts.append(f"{100 * share:.1f}% of copy")
    parts.append(f"err {e['err']:.1e} {'pass' if e['pass'] else 'FAIL'}")
    parts.append(f"cold {e['cold_compile_s']:.3f}s")
    return "  ".join(parts)



def run_header(args: Any, tolerance: Any) -> dict[str, Any]:
    """TF32 off in torch, and the run's record: machine, date, versions, the method
    (``args.calls`` back-to-back calls between two CUDA events, median of
    ``args.repeats``)."""
    import cupy
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    return {"machine": platform.node(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
            "cupy": cupy.__version__, "options": list(getattr(args, "option", [])),
            "method": {"calls": args.calls, "repeats": args.repeats, "tf32": False,
                       "statistic": "median of repeats; per repeat, CUDA-event time of "
                                    "the back-to-back calls / calls",
                       "tolerance": tolerance}}


def markdown_table(result: dict[str, Any]) -> str:
    """A run's JSON (``--out``) as the table ``benchmarks/RESULTS.md`` keeps: every
    program, both ratios, † on a dispatch-bound side.

    >>> side = {"gbs": 3795.0, "gbs_range": [3791.0, 3797.0], "host_bound": False}
    >>> run = {"programs": {"bias_gelu": {"flops": 0, "accy": side, "torch_compile": dict(
    ...     side, gbs=3692.0, host_bound=True), "accy_over_torch_compile": 1.028,
    ...     "launches": [{}], "err": 6.3e-08, "pass": True}}}
    >>> print(markdown_table(run).splitlines()[-1])
    | bias_gelu | GB/s | 3795 | 3791–3797 | — | 3692† | — | — | 1.03 |  |  | 1 | 6.3e-08 pass |
    >>> run["programs"]["bias_gelu"]["copy"] = {"gbs": 3900.0}
    >>> print(markdown_table(run).splitlines()[-1])
    | bias_gelu | GB/s | 3795 | 3791–3797 | — | 3692† | — | — | 1.03 |  | 97.3 | 1 | 6.3e-08 pass |
    """
    def fig(v: float | None) -> str:
        return "—" if v is None else (f"{v:.3g}" if v < 100 else f"{v:.0f}")

    lines = ["| program | unit | accy | accy min–max | torch eager | torch.compile | "
             "compile, reduce-overhead | cuBLAS | accy / compile | accy / cuBLAS | "
             "% of copy (same bytes) | launches (graph) | err |", "| --- " * 13 + "|"]
    for name, e in result["programs"].items():
        if "error" in e:
            lines.append(f"| {name} | ERROR {e['error'][:80]} |" + " |" * 11)
            continue
        key, unit = _measure(e)

        def side(k: str, e: dict[str, Any] = e, key: str = key) -> str:
            x = e.get(k)
            return "—" if not x else fig(x.get(key)) + _dagger(x)

        lo, hi = e["accy"][key + "_range"]
        ratio = e.get("accy_over_torch_compile")
        cublas = e.get("accy_over_cublas")
        share = of_copy(e)
        lines.append(
            f"| {name} | {unit} | {side('accy')} | {fig(lo)}–{fig(hi)} | "
            f"{side('torch_eager')} | {side('torch_compile')} | "
            f"{side('torch_compile_graphs')} | {side('cublas')} | "
            f"{'—' if ratio is None else f'{ratio:.2f}'} | "
            f"{'' if cublas is None else f'{cublas:.2f}'} | "
            f"{'' if share is None else f'{100 * share:.1f}'} | "
            f"{len(e.get('launches', []))}{' (graph)' if e.get('accy_graph') else ''} | "
            f"{e['err']:.1e} {'pass' if e['pass'] else 'FAIL'} |")
    return "\n".join(lines)


def save_json(path: str, obj: Any) -> None:
    """Write ``obj`` to ``path`` whole or not at all (no-op without a path)."""
    if path:
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=1)
        os.replace(tmp, path)

def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated case names or name prefixes")
    ap.add_argument("--quick", action="store_true",
                    help="3 repeats of 10 calls; matmuls up to 2048³ only")
    ap.add_argument("--no-torch-compile", action="store_true")
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", default="", help="also write the JSON here (after every case)")
    ap.add_argument("--list", action="store_true", help="print the case names and stop")
    ap.add_argument("--option", action="append", default=[], metavar="STAGE.NAME=VALUE",
                    help="an accy option for every fragment (repeatable), as accy's CLI")
    ap.add_argument("--markdown", default="", metavar="JSON",
                    help="print the RESULTS.md table of an earlier run's --out JSON and stop")
    args = ap.parse_args(argv)
    if args.markdown:
        with open(args.markdown) as f:
            print(markdown_table(json.load(f)))
        return {}
    if args.quick:
        args.calls, args.repeats = min(args.calls, 10), min(args.repeats, 3)
    todo = select_cases(cases(args.quick), args.only)
    OPTIONS[:] = args.option
    check_options(ap, OPTIONS)
    if args.list:
        print("\n".join(c["name"] for c in todo))
        return {}
    import cupy
    import torch

    out: dict[str, Any] = dict(run_header(args, TOLERANCE),
                               cuda_driver=cupy.cuda.runtime.driverGetVersion(),
                               device_copy=device_copy(args), programs={})
    print(f"device copy {out['device_copy']['torch_copy']['gbs']:.0f} GB/s, "
          f"cudaMemcpyAsync {out['device_copy']['cuda_memcpy']['gbs']:.0f} GB/s",
          file=sys.stderr)

    def save() -> None:
        save_json(args.out, out)

    for case in todo:
        try:
            entry = run_case(case, args)
        except Exception as e:  # one case's failure is recorded, the run goes on
            entry = {"error": f"{type(e).__name__}: {e}"}
        out["programs"][case["name"]] = entry
        print(summary_line(case["name"], entry), file=sys.stderr, flush=True)
        save()
        torch.cuda.empty_cache()
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
