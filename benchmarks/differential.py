"""Run N random programs through the compiler (host, or a GPU) against the NumPy oracle; print JSON.

The generator and the oracle are those of ``tests/test_differential.py``.

Usage::

    PYTHONPATH=. python3 benchmarks/differential.py [-n 2000] [--seed S] [--offset K] [--examples 5] [--target cuda:sm_90]

prints ``{"programs": N, "wrong": W, "seed": S, "seconds": T, "examples": [...]}``;
each example is a minimised reproducer (program text, inputs, options).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
import warnings


def _load_tests_module():  # type: ignore[no-untyped-def]
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests",
                        "test_differential.py")
    spec = importlib.util.spec_from_file_location("accy_differential", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--programs", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=None, help="default: today's date")
    parser.add_argument("--offset", type=int, default=0,
                        help="first program index (to split one seed's programs over processes)")
    parser.add_argument("--examples", type=int, default=5, help="reproducers to print")
    parser.add_argument("--target", default="host", help="host (cc) or cuda:sm_XX (a GPU)")
    args = parser.parse_args(argv)

    import numpy as np

    td = _load_tests_module()
    seed = td.daily_seed() if args.seed is None else args.seed
    wrong = 0
    examples: list[dict[str, object]] = []
    start = time.monotonic()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for k in range(args.offset, args.offset + args.programs):
            case = td.generate(np.random.default_rng([seed, k]))
            problems = td.run_case(case, seed + k, args.target)
            if problems:
                wrong += 1
                if len(examples) < args.examples:
                    examples.append({"program": k, "problems": problems})
    print(json.dumps({"programs": args.programs, "offset": args.offset, "target": args.target,
                      "wrong": wrong,
                      "seed": seed,
                      "seconds": round(time.monotonic() - start, 1), "examples": examples},
                     indent=1))
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
