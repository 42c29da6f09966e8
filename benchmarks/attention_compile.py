"""Cold NVRTC time of the attention unit, this tree against a git revision, alternating;
prints JSON.

    python3 benchmarks/attention_compile.py [--base REV|DIR] [--repeats 9] [--phases]
        [--target cuda:sm_90a] [--option STAGE.NAME=VALUE]

Each side's unit (``graphs/attention.mlir`` at 512×128×64, as
``benchmarks/cold_compile.py`` builds it) is compiled ``--repeats`` times, the two
sides alternating, each compile with a fresh ``__device__`` variable appended
(``cold_compile.py`` says why): a host whose NVRTC time drifts within a run (the
H200's moved by up to 1.6× within a visit) moves both sides alike. ``--base``'s
unit comes from that revision's tree (``git archive`` into a temporary folder, this
script run there with ``--emit``). ``--phases`` adds NVRTC's own split of each
compile (front end, NVVM, ptxas) from its ``--time`` option: a measurement only,
accy's units compile with ``-arch`` alone. Reports min / median / max seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def unit(target: str, options: list[str]) -> tuple[str, str, tuple[str, ...]]:
    """The attention unit of this tree: its source, arch and NVRTC flags."""
    from cold_compile import QKV, target_job

    from accy.executable.compile import FragmentPlan, fragment_backend

    job = target_job("graphs/attention.mlir", QKV, "", target, options)
    backend = fragment_backend(job)
    return (job.source, backend.arch,
            backend.flags(FragmentPlan.of(job).fast_math))


def base_source(rev: str, target: str, options: list[str]) -> str:
    """The attention unit's source as revision ``rev`` spells it (or, where ``rev`` is a
    folder, as the accy tree there does: a machine with a copy of the checkout and no
    git, like the GPU machine)."""
    if os.path.isdir(rev):
        return _tree_source(os.path.abspath(rev), target, options)
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "-C", ROOT, "archive", rev], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        return _tree_source(tmp, target, options)


def _tree_source(tmp: str, target: str, options: list[str]) -> str:
    """The attention unit's source as the accy tree in folder ``tmp`` spells it."""
    cmd = [sys.executable, os.path.join(tmp, "benchmarks", "attention_compile.py"),
           "--emit", "--target", target, *(f"--option={o}" for o in options)]
    if not os.path.exists(cmd[1]):  # a revision before this script: its own builder
        cmd[1:] = ["-c", "import sys; sys.path[:0] = ['benchmarks', '.']; from cold_compile "
                   "import QKV, target_job; print(target_job('graphs/attention.mlir', QKV, "
                   f"'', {target!r}, {options!r}).module.attributes"
                   "['target.source'].value, end='')"]
    env = {**os.environ, "PYTHONPATH": tmp}
    return subprocess.run(cmd, cwd=tmp, env=env, check=True, capture_output=True,
                          text=True).stdout


def compile_once(source: str, arch: str, flags: tuple[str, ...],
                 phases: bool) -> tuple[float, dict[str, float]]:
    """Seconds NVRTC took on ``source`` made unique, and (``phases``) its split in ms."""
    from cold_compile import never_seen
    from cupy_backends.cuda.libs import nvrtc

    unique = never_seen(source)
    with tempfile.TemporaryDirectory() as tmp:
        csv = os.path.join(tmp, "time.csv")
        opts = [f"-arch={arch}", "--std=c++17", *flags] + ([f"--time={csv}"] if phases else [])
        prog = nvrtc.createProgram(unique, "fragment.cu", [], [])
        try:
            t = time.perf_counter()
            nvrtc.compileProgram(prog, opts)
            took = time.perf_counter() - t
        finally:
            nvrtc.destroyProgram(prog)
        split: dict[str, float] = {}
        if phases:
            with open(csv) as f:
                for row in f.read().splitlines()[1:]:
                    _, phase, value, _unit = (x.strip() for x in row.split(","))
                    split[phase] = float(value)
        return took, split


def summary(times: list[float], splits: list[dict[str, float]]) -> dict[str, Any]:
    from cold_compile import spread

    out: dict[str, Any] = {"nvrtc_s": spread(times)}
    if splits and splits[0]:
        out["phases_ms_median"] = {k: round(statistics.median(s[k] for s in splits), 1)
                                   for k in splits[0]}
    return out


def main() -> None:
    from kernels import check_options

    ap = argparse.ArgumentParser()
    ap.add_argument("--base", default="HEAD",
                    help="the git revision (or a folder holding an accy tree) to compare against")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--target", default="cuda:sm_90a")
    ap.add_argument("--option", action="append", default=[], metavar="STAGE.NAME=VALUE")
    ap.add_argument("--phases", action="store_true", help="NVRTC's --time split as well")
    ap.add_argument("--emit", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    check_options(ap, args.option, args.target)
    source, arch, flags = unit(args.target, args.option)
    if args.emit:
        print(source, end="")
        return
    sides = {"tree": source, args.base: base_source(args.base, args.target, args.option)}
    compile_once('extern "C" __global__ void k() {}', arch, flags, False)  # load NVRTC
    runs: dict[str, list[tuple[float, dict[str, float]]]] = {k: [] for k in sides}
    for _ in range(args.repeats):
        for name, text in sides.items():
            runs[name].append(compile_once(text, arch, flags, args.phases))
    out = {"target": args.target, "arch": arch, "flags": list(flags), "options": args.option,
           "repeats": args.repeats, "same_source": sides["tree"] == sides[args.base],
           "units": {name: summary([t for t, _ in r], [s for _, s in r])
                     for name, r in runs.items()}}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
