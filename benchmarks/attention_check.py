"""Fused attention on the GPU: correctness and speed against torch; prints JSON.

For ``graphs/attention.mlir`` (``softmax(q kᵀ · 0.125) v``) at each shape
``BATCHxSEQxHEAD`` (default 512×128×64, 64×1024×64, 16×4096×64; the graph's 128×64
rewritten to SEQ×HEAD), one process, the same inputs for everyone:

- **accy fused** (one ``flash`` kernel) for each ``--variants`` entry of kernel
  options, and **accy unfused** (``dispatch.fuse_attention=false``: a matmul, a row
  softmax, a matmul): each compiled cold (a fresh ``FragmentCompilerCache``), its
  plan recorded, its result checked against torch's float64 computation of the same
  math (``err`` = max |accy − ref| / max |ref|, pass when ``err <= TOLERANCE``), then
  ``LoadedFragment.launch_all`` on preallocated CuPy views of torch tensors timed;
- **torch eager**: the program interpreted op by op with torch ops
  (``benchmarks/kernels.py``'s ``torch_program``: matmul, mul, softmax, matmul);
- **torch.compile** of that same function (default mode, ``dynamic=False``);
- **torch SDPA** (``F.scaled_dot_product_attention``, whatever backend torch picks for
  f32): for information.

Timing as ``benchmarks/kernels.py`` does it (its ``bench``): 50 back-to-back calls
between two CUDA events, the time per call of each repeat, median of 7 repeats; TF32
off everywhere. TFLOP/s counts 4·B·S²·H (both matmuls). Every configuration is
recorded even when it fails (its ``error``), and the JSON is written after each one
(``--out``).

Run on a GPU machine::

    python3 benchmarks/attention_check.py [--shapes 512x128x64,16x4096x64]
        [--variants "attention_tile_m=64,attention_tile_n=64;attention_tile_m=128"]
        [--calls 50] [--repeats 7] [--no-torch-compile] [--out FILE]

A variant is ``NAME=VALUE`` pairs joined by ``,`` (``kernel.`` is implied where no
stage is named); variants are separated by ``;``; the empty variant ``""`` is the
defaults. ``--grid`` adds every combination of tile_m ∈ {32, 64, 128}, tile_n ∈ {32,
64, 128}, threads ∈ {128, 256} and prefetch on/off that the options allow.
The exit status is 1 when any accy result is off by more than the tolerance.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from kernels import (  # noqa: E402
    bench,
    cupy_view,
    rate,
    run_header,
    save_json,
    torch_program,
)

TOLERANCE = 1e-4
SHAPES = ((512, 128, 64), (64, 1024, 64), (16, 4096, 64))
GRAPH = os.path.join(ROOT, "graphs", "attention.mlir")


def program_text(seq: int, head: int) -> str:
    """``graphs/attention.mlir`` at sequence length ``seq`` and head dim ``head`` (its
    128s are the sequence, its 64s the head; the scale stays 0.125)."""
    with open(GRAPH) as f:
        text = f.read()
    return text.replace("x64x", "x@H@x").replace("x64xf32", "x@H@xf32") \
        .replace("128", str(seq)).replace("@H@", str(head))


def parse_variants(text: str, grid: bool) -> list[list[str]]:
    """``--variants`` as option lists (``kernel.`` implied), plus the ``--grid``."""
    out: list[list[str]] = []
    for v in text.split(";"):
        opts = [o.strip() for o in v.split(",") if o.strip()]
        out.append([o if "." in o.split("=")[0] else f"kernel.{o}" for o in opts])
    if grid:
        for tm, tn, th, pf in itertools.product((32, 64, 128), (32, 64, 128), (128, 256),
                                                ("true", "false")):
            opts = [f"kernel.attention_tile_m={tm}", f"kernel.attention_tile_n={tn}",
                    f"kernel.attention_threads={th}", f"kernel.attention_prefetch={pf}"]
            if tm * 16 // th <= 8 and opts not in out:
                out.append(opts)
    return out or [[]]


def compile_variant(text: str, name: str, shapes: list[tuple[int, ...]],
                    opts: list[str]) -> tuple[Any, dict[str, Any]]:
    """The loaded fragment (a cold compile) and its record: options, timings, plans."""
    from accy.dialects.kernel import KernelFuncOp
    from accy.executable.cache import FragmentCompilerCache
    from accy.pipeline import prepare_through
    from accy.preparation.options import RunOptions
    from accy.preparation.products import SemanticModule
    from accy.preparation.stages import PreparationRequest

    options = RunOptions.parse("cuda", opts)
    sm = SemanticModule.from_text(text, f"{name}.mlir")
    t0 = time.perf_counter()
    update = FragmentCompilerCache().refresh_from_semantic_module(
        sm, PreparationRequest(source=name, options=options, shapes=dict(enumerate(shapes))))
    cold = time.perf_counter() - t0
    job = prepare_through(SemanticModule.from_text(text, f"{name}.mlir"), "kernel", options,
                          dict(enumerate(shapes))).product
    plans = []
    for k in job.module.body.ops:
        if isinstance(k, KernelFuncOp):
            p = k.plan
            plans.append({"kernel": k.sym_name, "mapping": p.mapping, "tile": list(p.tile),
                          "micro_tile": list(p.micro_tile), "block": list(p.block),
                          "grid": list(p.grid), "stages": p.stages,
                          "shared_bytes": p.shared_bytes, "dynamic_shared": p.dynamic_shared})
    frag = update.fragment
    assert frag is not None, "no GPU: the fragment was not loaded"
    return frag, {"options": opts, "target": str(options.target), "cold_compile_s": cold,
                  "cold_split_ms": {r.stage: r.elapsed_ns / 1e6 for r in update.report},
                  "plans": plans}


def err(got: Any, ref: Any) -> float:
    d = float((got.double() - ref).abs().max().item())
    return d / max(float(ref.abs().max().item()), 1e-30)


def run_shape(batch: int, seq: int, head: int, variants: list[list[str]],
              args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    from accy.preparation.products import SemanticModule

    name = f"attention{batch}x{seq}x{head}"
    text = program_text(seq, head)
    shapes: list[tuple[int, ...]] = [(batch, seq, head)] * 3
    flops = 4 * batch * seq * seq * head
    nbytes = 4 * 4 * batch * seq * head  # q, k, v read, o written
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(s, generator=gen, device="cuda", dtype=torch.float32)
               for s in shapes)
    ref = torch.softmax((q.double() @ k.double().transpose(1, 2)) * 0.125, dim=-1) @ v.double()
    entry: dict[str, Any] = {"shape": [batch, seq, head], "flops": flops, "bytes": nbytes,
                             "tolerance": TOLERANCE, "accy": [], "ok": True}

    def timed(key: str, fn: Any, out: Any) -> dict[str, Any]:
        t = rate(bench(fn, args.calls, args.repeats), nbytes, flops)
        assert t is not None
        t["err"] = err(out(), ref)
        return t

    configs = [(opts, "fused") for opts in variants] + [(["dispatch.fuse_attention=false"],
                                                         "unfused")]
    for opts, how in configs:
        rec: dict[str, Any] = {"how": how}
        try:
            frag, info = compile_variant(text, name, shapes, opts)
            rec.update(info)
            kinds = [p["mapping"] for p in info["plans"]]
            rec["fused"] = kinds == ["flash"]
            o = torch.empty(shapes[0], device="cuda", dtype=torch.float32)
            a_args, a_res = [cupy_view(x) for x in (q, k, v)], [cupy_view(o)]
            frag.launch_all(a_args, a_res)
            torch.cuda.synchronize()
            rec.update(timed(how, lambda f=frag, a=a_args, r=a_res: f.launch_all(a, r),
                             lambda o=o: o))
            rec["pass"] = rec["err"] <= TOLERANCE
            entry["ok"] &= rec["pass"]
        except Exception as e:  # recorded; the other configurations go on
            rec["error"] = f"{type(e).__name__}: {e}"[:2000]
            entry["ok"] = False
        entry["accy"].append(rec)
        torch.cuda.empty_cache()

    program = torch_program(SemanticModule.from_text(text, f"{name}.mlir").module)
    for key, fn in (("torch_eager", lambda: program(q, k, v)[0]),
                    ("torch_sdpa", lambda: F.scaled_dot_product_attention(q, k, v,
                                                                          scale=0.125))):
        try:
            entry[key] = timed(key, fn, fn)
        except Exception as e:
            entry[f"{key}_error"] = f"{type(e).__name__}: {e}"[:2000]
    if not args.no_torch_compile:
        try:
            torch._dynamo.reset()
            t0 = time.perf_counter()
            compiled = torch.compile(program, dynamic=False)
            compiled(q, k, v)
            torch.cuda.synchronize()
            entry["torch_compile_first_s"] = time.perf_counter() - t0
            entry["torch_compile"] = timed("torch_compile", lambda: compiled(q, k, v)[0],
                                           lambda: compiled(q, k, v)[0])
        except Exception as e:
            entry["torch_compile_error"] = f"{type(e).__name__}: {e}"[:2000]
    fused = [r for r in entry["accy"] if r.get("how") == "fused" and "tflops" in r]
    if fused:
        best = max(fused, key=lambda r: r["tflops"])
        entry["best_fused"] = {"options": best["options"], "tflops": best["tflops"]}
        for other in ("torch_compile", "torch_eager", "torch_sdpa"):
            if entry.get(other):
                entry[f"best_fused_over_{other}"] = best["tflops"] / entry[other]["tflops"]
    return entry


def summary(entry: dict[str, Any]) -> str:
    b, s, h = entry["shape"]
    parts = [f"{b}x{s}x{h}:"]
    for r in entry["accy"]:
        label = ",".join(o.split(".")[-1] for o in r.get("options", [])) or "default"
        if "error" in r:
            parts.append(f"  {r['how']} [{label}] ERROR {r['error'][:160]}")
        else:
            parts.append(f"  {r['how']} [{label}] {r['tflops']:.1f} TFLOP/s err {r['err']:.1e} "
                         f"{'pass' if r['pass'] else 'FAIL'} plan "
                         f"{[(p['mapping'], p['tile']) for p in r['plans']]}")
    for other in ("torch_eager", "torch_compile", "torch_sdpa"):
        if entry.get(other):
            parts.append(f"  {other} {entry[other]['tflops']:.1f} TFLOP/s "
                         f"err {entry[other]['err']:.1e}")
    if "best_fused_over_torch_compile" in entry:
        parts.append(f"  best fused / torch.compile: {entry['best_fused_over_torch_compile']:.2f}")
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=",".join("x".join(map(str, s)) for s in SHAPES),
                    help="BATCHxSEQxHEAD, comma separated")
    ap.add_argument("--variants", default="",
                    help="';'-separated variants of ','-separated NAME=VALUE kernel options")
    ap.add_argument("--grid", action="store_true", help="also every attention tile variant")
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--no-torch-compile", action="store_true")
    ap.add_argument("--out", default="", help="also write the JSON here (after every shape)")
    args = ap.parse_args(argv)
    variants = parse_variants(args.variants, args.grid)
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",") if s]

    out: dict[str, Any] = dict(run_header(args, TOLERANCE), variants=variants, shapes={})

    def save() -> None:
        save_json(args.out, out)

    for shape in shapes:
        key = "x".join(map(str, shape))
        try:
            b, s, h = shape
            entry = run_shape(b, s, h, variants, args)
        except Exception as e:  # one shape's failure is recorded, the run goes on
            entry = {"shape": list(shape), "error": f"{type(e).__name__}: {e}"[:2000],
                     "ok": False}
        out["shapes"][key] = entry
        print(summary(entry) if "error" not in entry else f"{key}: ERROR {entry['error']}",
              file=sys.stderr, flush=True)
        save()
    print(json.dumps(out, indent=1))
    save()
    return 0 if all(e.get("ok") for e in out["shapes"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
