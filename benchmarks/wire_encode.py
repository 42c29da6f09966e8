"""Time of encoding a stage product for the store (``accy.choir.wire.encode_and_fingerprint``:
its wire bytes and its fingerprint, one walk); prints JSON.

Every stage product of a refresh on a cluster is encoded once so that its store entry
can be written: on the 2-core machine that was 15.5 % of a distinct batch's task time,
which a process pool (no store) does not pay (RESULTS.md, batch, twenty-third session).
The products are those of softmax, layernorm and the MLP after each of the six stages
(``--target cuda``), each encoded over and over for ``--seconds``; the figure is the mean
time of one product, min / median / max over ``--repeats``.

    python3 benchmarks/wire_encode.py [--seconds 1.0] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from accy.pipeline import PREPARATION_NAMES  # noqa: E402

PROGRAMS = [("graphs/softmax.mlir", {0: (64, 1024)}), ("graphs/layernorm.mlir", {0: (64, 4096)}),
            ("graphs/mlp.mlir", {0: (256, 256)})]
STAGES = PREPARATION_NAMES


def products() -> list[Any]:
    """The module of every program after every stage."""
    from accy.pipeline import prepare_through
    from accy.preparation.options import RunOptions
    from accy.preparation.products import Product, SemanticModule

    out = []
    options = RunOptions.parse("cuda", [])
    for path, shapes in PROGRAMS:
        product: Product = SemanticModule.from_file(os.path.join(ROOT, path))
        for stage in STAGES:  # each stage once, on the one before's product
            product = prepare_through(product, stage, options, shapes).product
            out.append(product.module)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from accy.choir.wire import encode_and_fingerprint

    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    mods = products()
    per: list[float] = []
    for _ in range(args.repeats):
        t0, n = time.perf_counter(), 0
        while n == 0 or time.perf_counter() - t0 < args.seconds:
            for m in mods:
                encode_and_fingerprint(m)
            n += 1
        per.append((time.perf_counter() - t0) / (n * len(mods)))
    us = sorted(round(x * 1e6, 1) for x in per)
    out = {"products": len(mods), "encode_us": [us[0], statistics.median(us), us[-1]]}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
