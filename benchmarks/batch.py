"""Batch recompilation throughput on a local Dask cluster; prints JSON.

For each worker count: a fresh artifact store and a fresh LocalCluster
(processes, one thread each), one batch of N distinct variants (variants/s,
stage runs against distinct stage keys), then the same batch again (fully
reused), the time of one fully reused refresh, and a trivial Dask round trip
measured on the same cluster.

    python3 benchmarks/batch.py --target host --workers 1 2
    python3 benchmarks/batch.py --target cuda --workers 1 2 4 8      # on the GPU machine
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

PROGRAMS = {  # program → shape bindings for a given row count
    "softmax.mlir": lambda r: {0: (r, 1024)},
    "layernorm.mlir": lambda r: {0: (r, 4096)},
    "rmsnorm.mlir": lambda r: {0: (r, 4096)},
    "bias_gelu.mlir": lambda r: {0: (r, 4096)},
    "gelu_tanh.mlir": lambda r: {0: (r, 4096)},
    "residual_norm.mlir": lambda r: {0: (r, 1024), 1: (r, 1024)},
}


def variants(n: int, target: str) -> list:  # type: ignore[type-arg]
    from accy.preparation.options import Target
    from accy.sweep import Variant

    tgt = str(Target.parse(target))
    out = []
    rows = 8
    while len(out) < n:
        for prog, shape in PROGRAMS.items():
            if len(out) < n:
                out.append(Variant(os.path.join(ROOT, "graphs", prog), tgt, shape(rows)))
        rows += 8
    return out


def trivial_round_trip(client) -> float:  # type: ignore[no-untyped-def]
    times = []
    for i in range(30):
        t0 = time.perf_counter()
        client.submit(int, i, pure=False).result()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(workers: int, vs: list, target: str) -> dict:  # type: ignore[type-arg]
    from distributed import Client, LocalCluster

    from accy.distributed import local_cluster_kwargs
    from accy.distributed.api import refresh
    from accy.distributed.batch import run_batch
    from accy.distributed.state import unpin
    from accy.executable.device import gpu_available

    store = tempfile.mkdtemp(prefix="accy-bench-store-")
    kwargs = dict(n_workers=workers, threads_per_worker=1, processes=True,
                  dashboard_address=":0", **local_cluster_kwargs())
    if gpu_available():
        kwargs["resources"] = {"GPU": 1}
    import dask.config

    from accy.distributed.batch import LOCAL_CONFIG

    with dask.config.set(LOCAL_CONFIG), LocalCluster(**kwargs) as cluster, \
            Client(cluster) as client:
        client.wait_for_workers(workers)
        # warm every worker up (imports, compiler start) on variants not measured
        warm = [type(v)(v.program, v.target, {i: (8 * k + 3,) + tuple(s[1:])
                                              for i, s in v.shapes.items()})
                for k in range(1, workers + 1) for v in vs[:len(PROGRAMS)]]
        run_batch(client, warm, store_url=store)
        rt = trivial_round_trip(client)
        first = run_batch(client, vs, store_url=store)
        rep = first.report()
        keys = {(r["stage"], r["key"]) for v in rep["variants"] for r in v["stages"]
                if not r.get("skipped")}
        second = run_batch(client, vs, store_url=store)
        one = vs[0]
        reuse_times = []
        for _ in range(20):
            t0 = time.perf_counter()
            out = refresh(client, one.program, target=one.target, shapes=one.shapes,
                          store_url=store)
            reuse_times.append(time.perf_counter() - t0)
            assert all(r.reused or r.skipped for r in out.receipts), out.receipts
        unpin(client)
    return {
        "workers": workers, "variants": len(vs), "ok": rep["summary"]["ok"],
        "first_batch_s": round(first.wall_s, 3),
        "variants_per_s": round(len(vs) / first.wall_s, 2),
        "stage_runs": rep["summary"]["stage_runs"], "distinct_stage_keys": len(keys),
        "second_batch_s": round(second.wall_s, 4),
        "second_batch_stage_runs": second.report()["summary"]["stage_runs"],
        "fully_reused_refresh_ms": round(statistics.median(reuse_times) * 1e3, 3),
        "trivial_round_trip_ms": round(rt * 1e3, 3),
        "reused_refresh_in_round_trips": round(statistics.median(reuse_times) / rt, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="host")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--variants", type=int, default=240)
    args = ap.parse_args()
    vs = variants(args.variants, args.target)
    out = {"machine": platform.node(), "cpus": os.cpu_count(),
           "date": time.strftime("%Y-%m-%d"), "target": args.target, "runs": []}
    for w in args.workers:
        r = measure(w, vs, args.target)
        out["runs"].append(r)
        print(f"workers={w}: {r['variants_per_s']} variants/s, {r['stage_runs']} stage runs / "
              f"{r['distinct_stage_keys']} distinct keys, reused refresh "
              f"{r['fully_reused_refresh_ms']} ms = {r['reused_refresh_in_round_trips']} "
              f"round trips", file=sys.stderr)
    base = out["runs"][0]["variants_per_s"] / out["runs"][0]["workers"]
    for r in out["runs"]:
        r["scaling_vs_ideal"] = round(r["variants_per_s"] / (base * r["workers"]), 2)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
