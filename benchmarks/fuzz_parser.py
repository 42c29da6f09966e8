"""Fuzz the choir text parser and wire decoder; time parsing at 0.1, 0.5 and 1 MB.

Every input must end as a module or a typed accy error; the JSON printed at the
end counts inputs, typed errors, accepted inputs and untyped exceptions (with
examples), round-trip mismatches, the slowest input, and the parse-time
scaling figure.

Usage::

    PYTHONPATH=. python3 benchmarks/fuzz_parser.py                 # 100,000 + 100,000
    PYTHONPATH=. python3 benchmarks/fuzz_parser.py --text 2000 --wire 2000 --seed 3
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

from accy.choir.fuzz import Tally, check_text, check_wire, text_mutations, wire_mutations
from accy.choir.parser import parse_module
from accy.choir.wire import encode

GRAPHS = sorted((Path(__file__).resolve().parents[1] / "graphs").glob("*.mlir"))


def run(inputs: object, check: object, tally: Tally) -> dict[str, object]:
    """Feed every input to ``check``; the tally plus timing."""
    start = time.perf_counter()
    slowest = 0.0
    for data in inputs:  # type: ignore[attr-defined]
        t0 = time.perf_counter()
        check(data, tally)  # type: ignore[operator]
        slowest = max(slowest, time.perf_counter() - t0)
    out = tally.as_dict()
    out["seconds"] = round(time.perf_counter() - start, 2)
    out["slowest_input_s"] = round(slowest, 4)
    return out


def program(n_bytes: int) -> str:
    """A ``main`` of chained ``semantic.add`` ops, about ``n_bytes`` long."""
    t = "tensor<8x16xf32>"
    head = ('"builtin.module"() ({\n'
            f'  "func.func"() <{{function_type = ({t}) -> {t}, sym_name = "main"}}> ({{\n'
            f'  ^bb0(%x: {t}):\n')
    lines: list[str] = []
    size, prev = len(head), "%x"
    while size < n_bytes:
        line = f'    %{len(lines)} = "semantic.add"({prev}, %x) : ({t}, {t}) -> {t}\n'
        lines.append(line)
        size += len(line)
        prev = f"%{len(lines) - 1}"
    return (head + "".join(lines) + f'    "func.return"({prev}) : ({t}) -> ()\n'
            "  }) : () -> ()\n}) : () -> ()\n")


def scaling(sizes_mb: tuple[float, ...] = (0.1, 0.5, 1.0), repeats: int = 3) -> list[dict]:
    """Best-of-``repeats`` parse time of a program of each size."""
    rows = []
    for mb in sizes_mb:
        text = program(int(mb * 1_000_000))
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            m = parse_module(text, "scale.mlir")
            best = min(best, time.perf_counter() - t0)
        ops = len(m.body.ops[0].regions[0].blocks[0].ops)
        rows.append({"mb": mb, "bytes": len(text), "ops": ops, "parse_s": round(best, 3)})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--text", type=int, default=100_000, help="parser mutants")
    ap.add_argument("--wire", type=int, default=100_000, help="wire mutants (plus the bombs)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--examples", type=int, default=10, help="examples kept per kind")
    args = ap.parse_args(argv)

    seeds = [p.read_text() for p in GRAPHS]
    blobs = [encode(parse_module(s, p.name)) for s, p in zip(seeds, GRAPHS)]
    report: dict[str, object] = {
        "command": " ".join(["benchmarks/fuzz_parser.py", *sys.argv[1:]]),
        "seeds": [p.name for p in GRAPHS],
        "parser": run(text_mutations(seeds, args.text, seed=args.seed), check_text,
                      Tally(max_examples=args.examples)),
        "wire": run(wire_mutations(blobs, args.wire, seed=args.seed), check_wire,
                    Tally(max_examples=args.examples)),
        "parse_scaling": scaling(),
        "max_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
    print(json.dumps(report, indent=2))
    bad = sum(report[k]["untyped"] + report[k]["roundtrip_mismatches"]  # type: ignore[index]
              for k in ("parser", "wire"))
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
