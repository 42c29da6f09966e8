"""SASS instructions of each kernel accy renders for ``benchmarks/kernels.py``'s cases; prints JSON.

A static count, no GPU needed: each case's program is prepared through the target stage
as ``kernels.py`` prepares it (same text, same shapes), its unit compiled with NVRTC to a
cubin exactly as a refresh compiles it (the backend's flags), and the cubin disassembled
with ``cuobjdump -sass`` (the ``nvidia-cuda-cuobjdump`` and ``nvidia-cuda-nvdisasm``
wheels, in the test extra, or a CUDA toolkit's on ``PATH``).

What it is for: on the H200, whose copy is 40 % faster than an H100's, the half-precision
row and elementwise kernels are bound by the SMs' issue rate, not memory (RESULTS.md,
kernels, thirty-second session: bias_gelu bf16 reads 3075 GB/s, ~770 G elements/s, at 34
SASS instructions an element, 78 % of the GPU's issue rate). An instruction saved there is
time saved, and this counts them on any machine, before a GPU visit times the change.

Per kernel: ``instructions`` (every SASS instruction, ``NOP`` included, as the cubin holds
them), ``registers`` (a thread's, ``cuobjdump -res-usage``: what bounds occupancy),
``classes`` (:data:`CLASSES`: FP32 arithmetic, special functions, integer,
conversions and packing, memory, control, predicates and selects, other) and the ten most
frequent opcodes. For an elementwise kernel (one vector of ``items`` elements a thread a
step), ``loop`` is its grid-stride loop's instructions (:func:`loop_body`) and
``per_element`` those over ``items``: what one element costs the SMs' issue slots.

    python3 benchmarks/sass_count.py --only bias_gelu_bf16,bias_gelu_f16
    python3 benchmarks/sass_count.py --only softmax --option kernel.vector_width=2
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

CLASSES: dict[str, tuple[str, ...]] = {
    "fp32": ("FFMA", "FMUL", "FADD", "FMNMX", "FCHK"),
    "special": ("MUFU",),
    "half": ("HFMA2", "HADD2", "HMUL2", "HMNMX2"),
    "integer": ("IADD3", "IMAD", "LEA", "SHF", "LOP3", "IABS", "IMNMX", "POPC", "FLO"),
    "convert": ("F2F", "F2FP", "F2I", "I2F", "PRMT", "I2FP", "F2IP"),
    "memory": ("LDG", "STG", "LDS", "STS", "LDC", "ULDC", "LD", "ST", "LDGSTS", "SHFL",
               "ATOM", "RED", "LDSM", "STSM"),
    "control": ("BRA", "EXIT", "BAR", "RET", "CALL", "BSSY", "BSYNC", "WARPSYNC", "NOP"),
    "select": ("FSETP", "ISETP", "FSEL", "SEL", "PLOP3", "P2R", "R2P"),
}
"""Opcode classes (the opcode before its first ``.``); anything else is ``other``."""

_INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*)"
                          r"(?:\.[A-Z0-9_.]*)?\s*([^;]*);")
_FUNCTION = re.compile(r"Function : (\S+)")


def parse_sass(text: str) -> dict[str, list[tuple[int, str, str]]]:
    """``cuobjdump -sass`` output as each function's instructions: (offset, opcode,
    operands), in order.

    >>> sass = '''
    ...         Function : k0
    ...         /*0000*/                   LDC R1, c[0x0][0x28] ;
    ...         /*0010*/              @!P0 FMUL R2, R2, 0.5 ;
    ...         /*0020*/                   BRA `(.L_x_0) ;
    ... '''
    >>> parse_sass(sass)["k0"]
    [(0, 'LDC', 'R1, c[0x0][0x28] '), (16, 'FMUL', 'R2, R2, 0.5 '), (32, 'BRA', '`(.L_x_0) ')]
    """
    out: dict[str, list[tuple[int, str, str]]] = {}
    current: list[tuple[int, str, str]] | None = None
    for line in text.splitlines():
        f = _FUNCTION.search(line)
        if f:
            current = out.setdefault(f.group(1), [])
            continue
        m = _INSTRUCTION.search(line)
        if m and current is not None:
            current.append((int(m.group(1), 16), m.group(2), m.group(3)))
    return out


def parse_registers(text: str) -> dict[str, int]:
    """Each function's registers a thread, from ``cuobjdump -res-usage``.

    >>> parse_registers(" Function k0_rows:\\n  REG:48 STACK:0 SHARED:5120 LOCAL:0")
    {'k0_rows': 48}
    """
    return {name: int(reg) for name, reg in
            re.findall(r"Function ([^\s:]+):\s*REG:(\d+)", text)}


def classify(opcodes: list[str]) -> dict[str, int]:
    """Instructions a class (:data:`CLASSES`), ``other`` for the rest.

    >>> classify(["FFMA", "FFMA", "MUFU", "BRA", "XYZ"])
    {'fp32': 2, 'special': 1, 'control': 1, 'other': 1}
    """
    owner = {op: name for name, ops in CLASSES.items() for op in ops}
    counts: collections.Counter[str] = collections.Counter(owner.get(o, "other")
                                                           for o in opcodes)
    return {name: counts[name] for name in [*CLASSES, "other"] if counts[name]}


def loop_body(instructions: list[tuple[int, str, str]]) -> list[tuple[int, str, str]]:
    """The instructions one trip of a kernel's main loop issues: from a backward
    branch's target to the branch, for the widest such loop that holds a global load;
    ``[]`` where there is none.

    >>> body = [(0, "S2R", ""), (16, "LDG", ""), (32, "FFMA", ""), (48, "STG", ""),
    ...         (64, "BRA", "0x10 "), (80, "EXIT", ""), (96, "BRA", "0x60")]
    >>> [op for _, op, _ in loop_body(body)]
    ['LDG', 'FFMA', 'STG', 'BRA']
    >>> loop_body(body[:4])
    []
    """
    best: list[tuple[int, str, str]] = []
    for at, op, operands in instructions:
        target = _branch_target(operands) if op == "BRA" else None
        if target is None or target >= at:
            continue
        trip = [ins for ins in instructions if target <= ins[0] <= at]
        if any(o == "LDG" for _, o, _ in trip) and len(trip) > len(best):
            best = trip
    return best


def _branch_target(operands: str) -> int | None:
    """A branch's target offset where the disassembly gives one (``BRA 0x120``), else
    None."""
    m = re.search(r"0x([0-9a-f]+)", operands)
    return int(m.group(1), 16) if m else None


def find_cuobjdump() -> str | None:
    """``cuobjdump`` on ``PATH``, else the one of the ``nvidia-cuda-cuobjdump`` wheel
    (which needs the ``nvidia-cuda-nvdisasm`` wheel's ``nvdisasm`` beside it)."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    try:
        import nvidia
    except ImportError:
        return None
    found_in = (glob.glob(os.path.join(root, "*", "bin", "cuobjdump"))
                for root in getattr(nvidia, "__path__", []))
    return next((p for paths in found_in for p in sorted(paths) if os.access(p, os.X_OK)),
                None)


def case_job(case: dict[str, Any], target: str, options: list[str]) -> Any:
    """``case`` (one of :func:`kernels.cases`) prepared through the target stage, at the
    shapes ``kernels.py`` runs it."""
    from kernels import arg_shapes

    from accy.pipeline import prepare_through
    from accy.preparation.options import RunOptions
    from accy.preparation.products import SemanticModule

    sm = SemanticModule.from_text(case["text"], f"{case['name']}.mlir")
    shapes = arg_shapes(sm, case["rows"], case["cols"])
    return prepare_through(sm, "target", RunOptions.parse(target, options),
                           dict(enumerate(shapes))).product


def count_case(case: dict[str, Any], target: str, options: list[str], tool: str) \
        -> dict[str, Any]:
    """Each kernel's counts for one case (the module docstring says which)."""
    from accy.executable.compile import FragmentPlan, fragment_backend
    from accy.executable.device import cubins

    job = case_job(case, target, options)
    backend, plan = fragment_backend(job), FragmentPlan.of(job)
    source = job.source
    # cuobjdump runs nvdisasm, which it looks for on PATH: the wheels put the two side
    # by side
    env = dict(os.environ, PATH=os.pathsep.join([os.path.dirname(tool),
                                                 os.environ.get("PATH", "")]))
    with tempfile.TemporaryDirectory(prefix="accy-sass-") as ws:
        binary, _ = backend.compile(source, ws, backend.flags(plan.fast_math), split=True)
        functions: dict[str, list[tuple[int, str, str]]] = {}
        registers: dict[str, int] = {}
        for i, cubin in enumerate(cubins(binary)):  # one a kernel (compile_cuda_parts)
            path = os.path.join(ws, f"k{i}.cubin")
            with open(path, "wb") as f:
                f.write(cubin)
            done = subprocess.run([tool, "-sass", "-res-usage", path], capture_output=True,
                                  text=True, env=env, check=False)
            if done.returncode:
                raise SystemExit(f"cuobjdump failed on {case['name']}: "
                                 f"{done.stderr.strip() or done.stdout.strip()}")
            functions.update(parse_sass(done.stdout))
            registers.update(parse_registers(done.stdout))
    kernels: dict[str, Any] = {}
    for launch in plan.launches:
        ins = functions.get(launch.kernel, [])
        ops = [op for _, op, _ in ins]
        entry: dict[str, Any] = {"instructions": len(ins),
                                 "registers": registers.get(launch.kernel),
                                 "classes": classify(ops),
                                 "top": dict(collections.Counter(ops).most_common(10))}
        items = elementwise_items(job, launch.kernel)
        body = loop_body(ins)
        if items and body:
            entry["loop"] = len(body)
            entry["items"] = items
            entry["per_element"] = round(len(body) / items, 1)
        kernels[launch.kernel] = entry
    return {"element": case["element"], "arch": backend.arch, "kernels": kernels}


def elementwise_items(job: Any, kernel: str) -> int:
    """Elements a thread of an elementwise (``grid-stride``) kernel handles a step (its
    vector), from the kernel stage's plan; 0 for any other kernel."""
    from accy.dialects.kernel import KernelFuncOp

    for op in job.module.walk():
        if isinstance(op, KernelFuncOp) and op.sym_name == kernel \
                and op.plan.mapping == "grid-stride":
            return int(op.plan.vector_width)
    return 0


def main(argv: list[str] | None = None) -> None:
    from kernels import cases, check_options, select_cases

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="cuda:sm_90a")
    ap.add_argument("--only", default="", help="comma-separated case names or name "
                    "prefixes, as kernels.py takes them (default: every case)")
    ap.add_argument("--option", action="append", default=[], metavar="STAGE.NAME=VALUE")
    args = ap.parse_args(argv)
    check_options(ap, args.option, args.target)
    tool = find_cuobjdump()
    if tool is None:
        ap.error("no cuobjdump: pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm "
                 "(or put a CUDA toolkit's on PATH)")
    chosen = select_cases(cases(), args.only)
    if not chosen:
        ap.error(f"--only {args.only!r} names no case")
    out: dict[str, Any] = {"target": args.target, "options": args.option, "cases": {}}
    for case in chosen:
        out["cases"][case["name"]] = count_case(case, args.target, args.option, tool)
        print(case["name"], json.dumps({k: {"instructions": v["instructions"],
                                             "per_element": v.get("per_element")}
                                         for k, v in out["cases"][case["name"]]
                                         ["kernels"].items()}),
              file=sys.stderr, flush=True)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
