"""One accy worker's path against one pool process, in this process, without Dask; prints JSON.

What a batch worker does for its variants — :func:`accy.distributed.graph.chain_group_task`
on groups of ``--grain`` chains (the six stages keyed, read back or run, every product
written to a store, the compile of the group at once) — timed beside what
``benchmarks/batch.py``'s pool process does for the same variants
(:func:`batch.pool_refresh`: ``FragmentCompilerCache().refresh_from_semantic_module``,
no store), pass after pass on fresh variants, each pass with the binary memo empty and
a fresh store, alternating. No load (the chains end in compile; the pool's refresh
loads only on a GPU). Both sides run under accy's worker GC policy
(:func:`accy.distributed.tune_worker_gc`), as the worker does.

Per pass: milliseconds a variant on each side, and where each side's time went (the
functions below, timed by wrapping them: ``Stage.run`` on both sides; accy's product
encoding for the store, the wait for its writer thread, its stage keys, its store reads
and its compile group; the pool's product fingerprints). What the two sides share is
``Stage.run``; what accy adds over the pool is the rest.

    python3 benchmarks/worker_path.py --target cuda --variants 480 --passes 4
    python3 benchmarks/worker_path.py --target host --variants 48 --passes 2
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

def instrument() -> Any:
    """The functions the figures name, wrapped to record their spans
    (:class:`batch_timeline.Spans`; its ``unwrap`` puts them back)."""
    from batch_timeline import Spans

    import accy.distributed.graph as graph
    from accy.pipeline import Stage
    from accy.preparation.admission import WriteBehind
    from accy.preparation.products import Product

    spans = Spans()
    for owner, name, label in [(Stage, "run", "stages"),
                               (WriteBehind, "write", "encode_for_store"),
                               (WriteBehind, "flush", "writer_wait"),
                               (graph, "content_key", "stage_keys"),
                               (graph, "read_stage_result", "store_reads"),
                               (graph, "compile_group", "compile_group"),
                               (Product, "fingerprint", "fingerprints")]:
        spans.wrap(owner, name, label)
    return spans


def accy_pass(variants: list[Any], grain: int, programs: dict[str, Any]) -> float:
    """Seconds for ``variants`` through chain group tasks of ``grain`` chains."""
    from batch import forget_binaries

    from accy.distributed.batch import _request
    from accy.distributed.graph import InlineProgram, chain_group_task
    from accy.pipeline import preparation
    from accy.preparation.products import SemanticModule

    steps = [[s.name, "-"] for s in preparation()] + [["compile", "-"]]
    for v in variants:
        if v.program not in programs:
            programs[v.program] = InlineProgram.of(SemanticModule.from_file(v.program))
    forget_binaries()
    store = tempfile.mkdtemp(prefix="accy-worker-path-")
    t = time.perf_counter()
    for at in range(0, len(variants), grain):
        part = variants[at:at + grain]
        group = chain_group_task([[steps, _request(v).to_dict()] for v in part], store,
                                 *[programs[v.program] for v in part])
        failed = [e for e in group.entries if isinstance(e, Exception)]
        if failed:
            raise SystemExit(f"a chain failed: {failed[0]}")
    return time.perf_counter() - t


def pool_pass(variants: list[Any]) -> float:
    from batch import _items, pool_refresh

    t = time.perf_counter()
    for item in _items(variants):
        pool_refresh(item)
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> None:
    from batch import _tgt

    from accy.distributed import tune_worker_gc

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="cuda")
    ap.add_argument("--variants", type=int, default=480)
    ap.add_argument("--passes", type=int, default=4)
    ap.add_argument("--grain", type=int, default=8, help="chains a group task (default 8)")
    args = ap.parse_args(argv)
    target = _tgt(args.target)
    thresholds, frozen = gc.get_threshold(), gc.get_freeze_count()
    tune_worker_gc()
    spans = instrument()
    try:
        out = measure(args, target, spans)
    finally:  # this process as it was (a test calls main)
        spans.unwrap()
        gc.set_threshold(*thresholds)
        if not frozen:
            gc.unfreeze()
    print(json.dumps(out, indent=1))


def measure(args: argparse.Namespace, target: str, spans: Any) -> dict[str, Any]:
    from batch import distinct_variants, warm_up_variants

    programs: dict[str, Any] = {}
    warm = warm_up_variants(1, target)[:min(48, args.variants)]
    accy_pass(warm, args.grain, programs)
    pool_pass(warm)
    passes = []
    for p in range(args.passes):
        vs = distinct_variants(args.variants, target, first_rows=8 + 4000 * (p + 1))
        row: dict[str, Any] = {}
        for side in ("accy", "pool"):
            spans.spans.clear()
            took = accy_pass(vs, args.grain, programs) if side == "accy" else pool_pass(vs)
            row[side] = {"ms_per_variant": round(took / len(vs) * 1e3, 3),
                         **{k: round(v / len(vs) * 1e3, 3)
                            for k, v in sorted(spans.totals().items())}}
        passes.append(row)
        print(f"pass {p}: accy {row['accy']['ms_per_variant']} ms, "
              f"pool {row['pool']['ms_per_variant']} ms a variant", file=sys.stderr)
    a = statistics.median(r["accy"]["ms_per_variant"] for r in passes)
    b = statistics.median(r["pool"]["ms_per_variant"] for r in passes)
    return {"target": target, "variants": args.variants, "grain": args.grain,
            "date": time.strftime("%Y-%m-%d %H:%M"), "passes": passes,
            "median_ms": {"accy": a, "pool": b}, "ratio": round(b / a, 3)}


if __name__ == "__main__":
    main()
