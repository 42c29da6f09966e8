"""Fuzz the command line: mutated programs through ``accy check``, ``opt`` and ``emit``.

Half the mutants are ``accy.choir.fuzz.text_mutations`` of the ``graphs/``
programs (mostly parse errors); the other half keep the syntax and change
what the later stages see: an integer literal (a dim, an axis, an epsilon's
digits) swapped for an extreme value, or an element type for another. Each is
written to a file and run in process through :func:`accy.cli.main`, one command
per mutant in turn: ``check``, ``opt --to dispatch``, ``emit --target host``,
``emit --target cuda:sm_90`` (NVRTC is not run by ``emit``). An outcome is
*clean* when the exit code is 0 or 1 and the output has no ``Traceback`` and
no ``internal error`` line (an accy bug by definition). Prints JSON: inputs,
exit codes, untyped outcomes (with examples), the slowest input.

Usage::

    PYTHONPATH=. python3 benchmarks/fuzz_cli.py [-n 100000] [--seed 0]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import itertools
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

GRAPHS = sorted((Path(__file__).resolve().parents[1] / "graphs").glob("*.mlir"))
COMMANDS = (["check"], ["opt", "--to", "dispatch"], ["emit", "--target", "host"],
            ["emit", "--target", "cuda:sm_90"])


EXTREMES = ("0", "1", "-1", "2", "3", "7", "64", "4096", "65535", "2147483648",
            "9223372036854775808", "1" + "0" * 40)
ELEMENTS = ("f32", "f16", "bf16", "f64", "i1", "i8", "i32", "i64", "ui8", "index")


def semantic_mutations(seeds: list[str], count: int, seed: int) -> Iterator[str]:
    """Mutants that still parse as often as not: literals and element types changed."""
    import random
    import re

    rng = random.Random(seed)
    for _ in range(count):
        text = rng.choice(seeds)
        for _ in range(rng.randrange(1, 3)):
            if rng.random() < 0.6:
                spots = [m.span() for m in re.finditer(r"(?<![%#\w])-?\d+(?![\w.])", text)]
                if spots:
                    a, b = rng.choice(spots)
                    text = text[:a] + rng.choice(EXTREMES) + text[b:]
            else:
                spots = [m.span(1) for m in re.finditer(r"x(f32|f16|bf16|i32|i1)>", text)]
                if spots:
                    a, b = rng.choice(spots)
                    text = text[:a] + rng.choice(ELEMENTS) + text[b:]
        yield text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", "--inputs", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--examples", type=int, default=5)
    args = ap.parse_args(argv)

    from accy.choir.fuzz import text_mutations
    from accy.cli import main as accy_main

    seeds = [p.read_text() for p in GRAPHS]
    codes: collections.Counter[int] = collections.Counter()
    bad: list[dict[str, object]] = []
    untyped = 0
    slowest = (0.0, "")
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "p.mlir")
        half = args.inputs // 2
        mutants = itertools.chain(text_mutations(seeds, args.inputs - half, seed=args.seed),
                                  semantic_mutations(seeds, half, seed=args.seed))
        for k, text in enumerate(mutants):
            with open(path, "w", encoding="utf-8", errors="surrogatepass") as f:
                f.write(text)
            command = COMMANDS[k % len(COMMANDS)]
            out, err = io.StringIO(), io.StringIO()
            t = time.perf_counter()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    code = accy_main([*command, path])
                except BaseException as e:  # noqa: BLE001 — counted: main must never raise
                    code = -1
                    err.write(f"raised {type(e).__name__}: {e}")
            dt = time.perf_counter() - t
            if dt > slowest[0]:
                slowest = (dt, " ".join(command))
            codes[code] += 1
            said = err.getvalue() + out.getvalue()[-2000:]
            if code not in (0, 1) or "Traceback" in said or "internal error" in said:
                untyped += 1
                if len(bad) < args.examples:
                    bad.append({"input": k, "command": command, "code": code,
                                "output": said[-600:], "program": text[:1500]})
    print(json.dumps({"inputs": args.inputs, "seed": args.seed, "exit_codes": dict(codes),
                      "untyped": untyped, "seconds": round(time.monotonic() - start, 1),
                      "slowest_s": round(slowest[0], 3), "slowest_command": slowest[1],
                      "examples": bad}, indent=1))
    return 1 if untyped else 0


if __name__ == "__main__":
    sys.exit(main())
