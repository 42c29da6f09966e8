"""Batch recompilation throughput: accy's Dask batch beside a plain process pool; prints JSON.

For each worker count, in one run:

- **accy**: a fresh artifact store and a fresh local cluster built as
  ``accy batch`` builds it (:func:`accy.distributed.local.local_cluster`:
  processes, one thread each, every worker pinned to a GPU when there is one,
  the config accy uses for its clusters), a warm-up batch on other shapes,
  then one batch of the *distinct* variants and one of the *shared-stage*
  sweep (variants that share every stage but kernel and target);
- **pool**: a ``concurrent.futures.ProcessPoolExecutor`` (spawn) with as many
  processes, warmed up the same way, whose workers call
  ``FragmentCompilerCache().refresh_from_semantic_module`` per variant (the
  same six stages, cc/NVRTC, load), on the same two variant sets;

each measured pass starts with every process's binary memo empty on both sides
(``accy.executable.compile.BINARIES``: within the pass, a source a process compiled
once is not compiled again, for the pool as for accy's workers);

and the ratio accy/pool of variants per second. Then, on the accy cluster:
the distinct batch again (fully reused), one fully reused refresh, and a
trivial Dask task round trip, on accy's cluster and on a plain Dask one.

``--no-nvrtc-cache`` runs every process of both sides with ``CUDA_CACHE_DISABLE=1``;
``--compile-apart`` has accy's compile groups give each distinct source an NVRTC program
of its own (``ACCY_GROUP_SOURCES=0``), the text a pool process compiles.
NVRTC 13.0 on the GPU machine keeps the cubins it built in the driver's compute cache
(``~/.nv/ComputeCache``) and serves a source it compiled before, in any process, in
~16 ms instead of ~0.15–0.22 s (RESULTS.md, batch, twenty-eighth session); the warm-ups
compile every measured source (and, for accy's compile groups, every measured NVRTC
program: :func:`accy_warm_up_sets`), so by default every measured compile on either side
is such a hit, while accy's store starts empty each pass. Without the cache every compile
is a real one, as in a sweep over sources the machine never compiled: each pool
process compiles each source it meets, accy's batch each source about once.

``--big`` adds the 10,080-variant sweep (5 row programs × 84 shapes × 4 block
sizes × 3 vector widths × 2 fast-math) at the largest worker count: its time
and the client's peak RSS, then the same sweep on a new cluster over the same
(now warm) store, as a second ``accy batch --cache`` runs it. ``--profile DIR`` writes a cProfile of the client
and Dask's statistical profiles of the scheduler and the workers for the
distinct batch at the first worker count. ``--pool-gc`` runs the pool's processes
under accy's worker GC policy too (:func:`accy.distributed.tune_worker_gc`).

    python3 benchmarks/batch.py --target host --workers 2 --variants 60
    python3 benchmarks/batch.py --target cuda --workers 1 8 15 --big   # on the GPU machine
    python3 benchmarks/batch.py --target cuda --workers 1 8 15 --no-nvrtc-cache
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
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

PROGRAMS: dict[str, Any] = {  # program → shape bindings for a given row count
    "softmax.mlir": lambda r: {0: (r, 1024)},
    "layernorm.mlir": lambda r: {0: (r, 4096)},
    "rmsnorm.mlir": lambda r: {0: (r, 4096)},
    "bias_gelu.mlir": lambda r: {0: (r, 4096)},
    "gelu_tanh.mlir": lambda r: {0: (r, 4096)},
    "residual_norm.mlir": lambda r: {0: (r, 1024), 1: (r, 1024)},
}
BIG_PROGRAMS = ("softmax.mlir", "layernorm.mlir", "rmsnorm.mlir", "bias_gelu.mlir",
                "residual_norm.mlir")
KERNEL_AXES = [{"kernel.block_size": b, "kernel.vector_width": w, "target.fast_math": f}
               for b in (64, 128, 256, 512) for w in (1, 2, 4) for f in (False, True)]
"""24 option combinations: they change only the kernel and target stages (and compile)."""


def _variant(prog: str, target: str, rows: int, options: dict[str, Any] | None = None) -> Any:
    from accy.sweep import Variant

    return Variant(os.path.join(ROOT, "graphs", prog), target, PROGRAMS[prog](rows),
                   dict(options or {}))


def distinct_variants(n: int, target: str, first_rows: int = 8) -> list[Any]:
    """``n`` variants sharing no stage run: 6 row programs × row counts. A program's row
    counts render one source (the row count is a launch scalar), so each side compiles
    each program once a process (accy: once a group, or not at all where a worker or the
    store has the binary)."""
    out: list[Any] = []
    rows = first_rows
    while len(out) < n:
        for prog in PROGRAMS:
            if len(out) < n:
                out.append(_variant(prog, target, rows))
        rows += 8
    return out


def shared_variants(n: int, target: str, first_rows: int = 16) -> list[Any]:
    """``n`` variants in groups of 24 that share contract … memory (kernel options differ)."""
    out: list[Any] = []
    rows = first_rows
    while len(out) < n:
        for prog in PROGRAMS:
            for opts in KERNEL_AXES:
                if len(out) < n:
                    out.append(_variant(prog, target, rows, opts))
        rows += 16
    return out


def warm_up_variants(workers: int, target: str) -> list[Any]:
    """Both sides' warm-up: a round of distinct variants per process, then one variant of
    every program under every kernel option combination, on shapes no measured set
    uses. The second part makes every source the measured sets render known to NVRTC,
    which on the GPU machine serves a source it compiled before, in any process, from a
    cache of its own: no measured pool pass compiles one cold. accy's compile groups
    need :func:`accy_warm_up_sets` as well."""
    return (distinct_variants(len(PROGRAMS) * workers, target, first_rows=4)
            + [_variant(prog, target, 4, opts) for prog in PROGRAMS for opts in KERNEL_AXES])


def accy_warm_up_sets(n: int, target: str, shared: int | None = None) -> list[list[Any]]:
    """accy's second warm-up: one unmeasured batch of each measured set's make-up (``n``
    distinct variants, ``shared`` or ``n`` shared ones) on rows no measured set uses
    (4008 + 8k and 4016 + 16k; the measured sets' are 8 + 8k and 16 + 16k, plus
    multiples of 8000, and the profiled batch's 8n + 4 + 8k).

    :func:`warm_up_variants` renders every source, and a pool process compiles each
    source as an NVRTC program of its own, so NVRTC's cache on the GPU machine knows
    every program a measured pool pass compiles. accy's compile groups put several
    sources in one NVRTC program, whose text depends on the batch's make-up: the first
    measured shared batch then compiled its programs cold — on an H100 host, 15 workers,
    71 programs in 9.6 s of NVRTC against 1.9–2.1 s for the same 71 in the later
    repeats, 378 variants/s against 611–639 (RESULTS.md, batch, thirty-second session).
    A batch of the same make-up on other rows forms the same programs (a program's row
    counts render one source), so after these every measured compile on either side is
    a hit in that cache, as the module docstring says."""
    return [distinct_variants(n, target, first_rows=4008),
            shared_variants(shared or n, target, first_rows=4016)]


def warm_up_accy(client: Any, warm: list[Any], n: int, target: str,
                 shared: int | None = None) -> None:
    """accy's side of the warm-up: ``warm`` (:func:`warm_up_variants`), then
    :func:`accy_warm_up_sets`, each batch on a store of its own."""
    from accy.distributed.batch import run_batch

    for vs in [warm, *accy_warm_up_sets(n, target, shared)]:
        run_batch(client, vs, store_url=tempfile.mkdtemp(prefix="accy-bench-store-"))


def big_sweep(target: str) -> list[Any]:
    """5 row programs × 84 shapes × 4 block sizes × 3 vector widths × 2 fast-math."""
    return [_variant(prog, target, 8 * (k + 1) + 4, opts)
            for prog in BIG_PROGRAMS for k in range(84) for opts in KERNEL_AXES]


def _tgt(target: str) -> str:
    from accy.preparation.options import Target

    return str(Target.parse(target))


# ------------------------------------------------------------------ the peer

_MODULES: dict[str, Any] = {}
_PASS: list[Any] = [None]


def forget_binaries() -> None:
    """Empty this process's binary memo (``accy.executable.compile.BINARIES``): each
    measured pass starts cold on both sides, as a fresh process would."""
    from accy.executable.compile import BINARIES

    BINARIES.clear()


def pool_refresh(item: tuple[str, str, dict[int, tuple[int, ...]], dict[str, Any], str]) \
        -> int:
    """One variant in a pool process: the same six stages, compile and load, through
    accy's own library (so with its binary memo: a source this process compiled earlier
    in the pass is not compiled again). The first variant of a new pass (``item[4]``)
    empties the memo."""
    from accy.executable.cache import FragmentCompilerCache
    from accy.preparation.options import RunOptions
    from accy.preparation.products import SemanticModule
    from accy.preparation.stages import PreparationRequest

    program, target, shapes, options, pass_id = item
    if pass_id != _PASS[0]:
        forget_binaries()
        _PASS[0] = pass_id
    module = _MODULES.get(program)
    if module is None:
        module = _MODULES[program] = SemanticModule.from_file(program)
    req = PreparationRequest(source=program, variant="", options=RunOptions.parse(target, options),
                             shapes=dict(shapes))
    update = FragmentCompilerCache().refresh_from_semantic_module(module, req)
    return next((r.elapsed_ns for r in update.report.receipts if r.stage == "compile"), 0)


def _items(vs: list[Any]) -> list[Any]:
    """The pool's work items for one pass (a pass id of their own)."""
    import uuid

    pass_id = uuid.uuid4().hex
    return [(v.program, v.target, dict(v.shapes), dict(v.options), pass_id) for v in vs]


def cold_workers(client: Any) -> None:
    """Every worker's binary memo emptied before a measured accy pass, and its count of
    NVRTC programs (:func:`count_compiles`) started again."""
    client.run(forget_binaries)
    client.run(count_compiles)


def count_compiles() -> None:
    """From now on, in this process, count the NVRTC programs compiled and the kernels
    they hold (:func:`accy.executable.device.nvrtc_counts` from zero again; read by
    :func:`compiles_counted`): how many times a batch compiled its sources."""
    from accy.executable.device import nvrtc_counts

    nvrtc_counts(reset=True)


def compiles_counted() -> list[float]:
    """NVRTC programs and kernels this process compiled since :func:`count_compiles`, and
    the seconds it spent in NVRTC."""
    from accy.executable.device import nvrtc_counts

    return list(nvrtc_counts())


POOL_GC = [False]
"""``--pool-gc``: the pool's processes take accy's worker GC policy too
(:func:`accy.distributed.tune_worker_gc`), to show what of the ratio is that policy."""


def make_pool(workers: int) -> Any:
    """The peer: a spawn process pool of ``workers`` (with ``--pool-gc``, each process
    under accy's worker GC policy)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from accy.distributed import tune_worker_gc

    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                               initializer=tune_worker_gc if POOL_GC[0] else None)


def measure_pool(workers: int, sets: dict[str, list[Any]], warm: list[Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with make_pool(workers) as pool:
        list(pool.map(pool_refresh, _items(warm)))
        for name, vs in sets.items():
            wall, compiles = pool_pass(pool, vs)
            out[name] = {"wall_s": round(wall, 3), "variants_per_s": round(len(vs) / wall, 2),
                         "compile_ms": round(statistics.mean(compiles) / 1e6, 2)}
    return out


def pool_pass(pool: Any, vs: list[Any]) -> tuple[float, list[int]]:
    """The variants through the pool: (wall seconds, each variant's compile ns)."""
    t0 = time.perf_counter()
    compiles = list(pool.map(pool_refresh, _items(vs)))
    return time.perf_counter() - t0, compiles


# ------------------------------------------------------------------ accy


def trivial_round_trip(client: Any, n: int = 30) -> float:
    times = []
    for i in range(n):
        t0 = time.perf_counter()
        client.submit(int, i, pure=False).result()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _short_send_round_trip(client: Any) -> float:
    """Diagnosis only: the round trip with the client's batched stream sending every 1 ms
    instead of Client's hard-coded 10 ms (not a config key; accy does not do this)."""
    comm = client.scheduler_comm
    old = comm.interval
    comm.interval = 0.001
    try:
        trivial_round_trip(client, 5)
        return trivial_round_trip(client)
    finally:
        comm.interval = old


def plain_dask_round_trip(workers: int) -> float:
    """The same round trip on a plain LocalCluster (Dask's defaults, no accy)."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        client.wait_for_workers(workers)
        trivial_round_trip(client, 5)
        return trivial_round_trip(client)


class CpuMeter:
    """CPU seconds spent during a batch, by where: the client process's event-loop
    thread and its other threads, the scheduler's process (when it has one of its
    own), and the worker processes (summed, and the busiest)."""

    def __init__(self, cluster: Any) -> None:
        import psutil

        self.me = psutil.Process()
        pid = getattr(cluster.scheduler, "pid", None)
        self.scheduler = psutil.Process(pid) if pid else None

    def _snap(self) -> dict[str, Any]:
        import threading

        import psutil

        names = {t.native_id: t.name for t in threading.enumerate()}
        threads: dict[str, float] = {}
        for t in self.me.threads():
            name = "client_io_loop" if names.get(t.id) == "IO loop" else "client_other"
            threads[name] = threads.get(name, 0.0) + t.user_time + t.system_time
        sched = self.scheduler.pid if self.scheduler else None
        workers = {}
        for c in self.me.children(recursive=True):
            if c.pid != sched:
                try:
                    workers[c.pid] = sum(c.cpu_times()[:2])
                except psutil.Error:
                    pass
        s = sum(self.scheduler.cpu_times()[:2]) if self.scheduler else None
        return {"threads": threads, "scheduler": s, "workers": workers}

    def __enter__(self) -> CpuMeter:
        self.before, self.t0 = self._snap(), time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        after, wall = self._snap(), time.perf_counter() - self.t0
        b = self.before
        out: dict[str, Any] = {k: round(v - b["threads"].get(k, 0.0), 2)
                               for k, v in after["threads"].items()}
        if after["scheduler"] is not None:
            out["scheduler_process"] = round(after["scheduler"] - b["scheduler"], 2)
        used = [v - b["workers"].get(pid, 0.0) for pid, v in after["workers"].items()]
        out["workers_total"] = round(sum(used), 2)
        out["worker_busiest"] = round(max(used, default=0.0), 2)
        out["wall"] = round(wall, 2)
        self.figures = out


STREAM = [False]
"""``--stream``: each measured accy batch records its task stream's figures."""


def metered_batch(client: Any, cluster: Any, vs: list[Any], store: str) \
        -> tuple[Any, dict[str, Any]]:
    """One accy batch and the CPU it took (:class:`CpuMeter`'s figures), the NVRTC
    programs and kernels its workers compiled (``"nvrtc"``), with ``--stream`` also the
    figures of its task stream (:func:`stream_figures`) under ``"task_stream"``."""
    import contextlib

    from distributed import get_task_stream

    from accy.distributed.batch import run_batch

    cold_workers(client)
    stream = get_task_stream(client) if STREAM[0] else contextlib.nullcontext()
    with stream as ts, CpuMeter(cluster) as meter:
        t0 = time.time()
        result = run_batch(client, vs, store_url=store)
        t1 = time.time()
    figures = dict(meter.figures)
    counts = client.run(compiles_counted).values()
    figures["nvrtc"] = {"programs": sum(c[0] for c in counts),
                        "kernels": sum(c[1] for c in counts),
                        "seconds": round(sum(c[2] for c in counts), 3)}
    if ts is not None:
        workers = len(client.scheduler_info().get("workers", {}))
        figures["task_stream"] = stream_figures(ts.data, t0, t1, workers)
    return result, figures


def stream_figures(stream: list[dict[str, Any]], t0: float, t1: float, workers: int) \
        -> dict[str, Any]:
    """Where a batch's wall time (``t0`` … ``t1``, wall-clock seconds) went on the
    workers, from Dask's task stream: how long before the first task started and after
    the last one stopped, the workers' busy fraction of the wall, and each task kind's
    count and compute seconds (a kind is the key's name, e.g. ``accy_group-contract-load``).

    >>> s = [{"key": ("accy_contract-load", "a"), "worker": "w1",
    ...       "startstops": [{"action": "compute", "start": 1.0, "stop": 2.0}]},
    ...      {"key": ("accy_contract-load", "b"), "worker": "w2",
    ...       "startstops": [{"action": "transfer", "start": 0.5, "stop": 1.5},
    ...                      {"action": "compute", "start": 1.5, "stop": 3.0}]}]
    >>> f = stream_figures(s, 0.5, 3.5, 2)
    >>> f["first_start_s"], f["after_last_s"], f["busy_fraction"], f["kinds"]
    (0.5, 0.5, 0.417, {'accy_contract-load': [2, 2.5]})
    """
    spans = [(ss["start"], ss["stop"], t["key"]) for t in stream
             for ss in t.get("startstops", ()) if ss.get("action") == "compute"]
    if not spans:
        return {"tasks": 0}
    kinds: dict[str, list[Any]] = {}
    for start, stop, key in spans:
        name = key[0] if isinstance(key, tuple) else str(key).split("-")[0]
        k = kinds.setdefault(str(name), [0, 0.0])
        k[0] += 1
        k[1] += stop - start
    busy = sum(stop - start for start, stop, _ in spans)
    return {"tasks": len(spans), "wall_s": round(t1 - t0, 3),
            "first_start_s": round(min(s[0] for s in spans) - t0, 3),
            "after_last_s": round(t1 - max(s[1] for s in spans), 3),
            "busy_fraction": round(busy / max(1, workers) / max(t1 - t0, 1e-9), 3),
            "kinds": {n: [c, round(sec, 3)] for n, (c, sec) in kinds.items()}}


def measure_accy(workers: int, sets: dict[str, list[Any]], warm: list[Any],
                 profile: str | None, scheduler_process: bool = True,
                 extras: bool = True) -> dict[str, Any]:
    from distributed import Client

    from accy.distributed.api import refresh
    from accy.distributed.batch import run_batch
    from accy.distributed.local import local_cluster
    from accy.distributed.state import unpin

    out: dict[str, Any] = {}
    # the statistical profiler is off on accy's clusters; --profile turns it back on
    config = {"distributed.worker.profile.enabled": True} if profile else None
    with local_cluster(workers, config=config, scheduler_process=scheduler_process) \
            as cluster, Client(cluster) as client:
        client.wait_for_workers(workers)
        warm_up_accy(client, warm, len(sets["distinct"]), sets["distinct"][0].target,
                     len(sets["shared"]))
        stores: dict[str, str] = {}
        for name, vs in sets.items():
            # a store of its own, as each repeat has: the warm-up's store holds every
            # binary the measured sets compile (it renders all their sources), and its
            # passes then compiled nothing (RESULTS.md, batch, twenty-third session)
            store = stores[name] = tempfile.mkdtemp(prefix="accy-bench-store-")
            result, cpu = metered_batch(client, cluster, vs, store)
            rep = result.report()
            ran: dict[str, list[int]] = {}
            for o in result.outcomes:
                for rc in o.receipts:
                    if not rc.reused and not rc.skipped:
                        ran.setdefault(rc.stage, []).append(rc.elapsed_ns)
            out[name] = {"wall_s": round(result.wall_s, 3),
                         "stage_ms": {k: round(statistics.mean(v) / 1e6, 2)
                                      for k, v in ran.items()},
                         "variants_per_s": round(len(vs) / result.wall_s, 2),
                         "ok": rep["summary"]["ok"], "stage_runs": rep["summary"]["stage_runs"],
                         "reuses": rep["summary"]["reuses"],
                         "distinct_tasks": result.distinct_tasks, "cpu_s": cpu}
        if not extras:
            unpin(client)
            return out
        vs, store = sets["distinct"], stores["distinct"]
        second = run_batch(client, vs, store_url=store)
        out["second_batch_s"] = round(second.wall_s, 4)
        out["second_batch_stage_runs"] = second.report()["summary"]["stage_runs"]
        one = vs[0]
        reuse_times = []
        for _ in range(20):
            t0 = time.perf_counter()
            o = refresh(client, one.program, target=one.target, shapes=one.shapes,
                        store_url=store)
            reuse_times.append(time.perf_counter() - t0)
            assert all(r.reused or r.skipped for r in o.receipts), o.receipts
        rt = trivial_round_trip(client)
        out["trivial_round_trip_client_send_1ms"] = round(_short_send_round_trip(client) * 1e3, 3)
        out["fully_reused_refresh_ms"] = round(statistics.median(reuse_times) * 1e3, 3)
        out["trivial_round_trip_ms"] = round(rt * 1e3, 3)
        if profile:  # other shapes, a fresh store: the profiled batch is not a figure above
            n = len(sets["distinct"])
            _profiled(client, distinct_variants(n, vs[0].target, first_rows=8 * n + 4),
                      tempfile.mkdtemp(prefix="accy-bench-prof-"), profile)
        unpin(client)
    return out


def interleaved(workers: int, repeats: int, n: int, target: str,
                own_scheduler: bool = True) -> dict[str, Any]:
    """accy and the pool side by side, alternating which goes first, ``repeats`` times
    at one worker count: a cluster and a pool, both warmed up, kept for every repeat;
    each repeat has fresh variant sets (shapes no earlier repeat used, so nothing is
    reused from it) and a fresh store. On a shared machine a slow spell then lands on
    both sides, and the ratio comes per repeat, with its min / median / max."""
    from distributed import Client

    from accy.distributed.local import local_cluster
    from accy.distributed.state import unpin

    warm = warm_up_variants(workers, target)
    reps: list[dict[str, Any]] = []
    with local_cluster(workers, scheduler_process=own_scheduler) as cluster, \
            Client(cluster) as client, make_pool(workers) as pool:
        client.wait_for_workers(workers)
        warm_up_accy(client, warm, n, target)
        list(pool.map(pool_refresh, _items(warm)))
        for rep in range(repeats):
            offset = 8 * 1000 * (rep + 1)
            sets = {"distinct": distinct_variants(n, target, first_rows=8 + offset),
                    "shared": shared_variants(n, target, first_rows=16 + offset)}
            row: dict[str, Any] = {"repeat": rep}
            for name, vs in sets.items():
                for who in (("accy", "pool") if rep % 2 == 0 else ("pool", "accy")):
                    if who == "accy":
                        res, cpu = metered_batch(client, cluster, vs, tempfile.mkdtemp(
                            prefix="accy-bench-store-"))
                        assert res.report()["summary"]["ok"] == len(vs), res.report()["summary"]
                        row[f"accy_{name}"] = round(len(vs) / res.wall_s, 2)
                        row[f"accy_{name}_cpu_s"] = cpu
                    else:
                        wall, compiles = pool_pass(pool, vs)
                        row[f"pool_{name}"] = round(len(vs) / wall, 2)
                        # its processes' compile receipts: NVRTC, or a binary they held
                        row[f"pool_{name}_compile_s"] = round(sum(compiles) / 1e9, 3)
                row[f"ratio_{name}"] = round(row[f"accy_{name}"] / row[f"pool_{name}"], 2)
            reps.append(row)
            print(f"workers={workers} repeat {rep}: " + ", ".join(
                f"{k} accy {row[f'accy_{k}']}/s pool {row[f'pool_{k}']}/s ratio "
                f"{row[f'ratio_{k}']}" for k in sets), file=sys.stderr, flush=True)
        unpin(client)

    def spread(key: str) -> list[float]:
        xs = sorted(r[key] for r in reps)
        return [xs[0], round(statistics.median(xs), 2), xs[-1]]

    return {"workers": workers, "variants": n, "repeats": reps,
            "min_median_max": {k: spread(k) for k in
                               ("ratio_distinct", "ratio_shared", "accy_distinct",
                                "pool_distinct", "accy_shared", "pool_shared")}}


def big_in_child(workers: int, target: str, limit: int | None = None,
                 scheduler_process: bool = True) -> dict[str, Any]:
    """The big sweep as ``accy batch`` runs it: a fresh process (the client), a fresh
    cluster (its scheduler in a process of its own, unless asked otherwise) and store."""
    import subprocess

    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--big-child",
                          "--workers", str(workers), "--target", target]
                         + (["--big-limit", str(limit)] if limit else [])
                         + ([] if scheduler_process else ["--scheduler-in-client"]),
                         capture_output=True, text=True, check=False)
    try:
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {"error": out.stderr[-2000:]}


def big_child(workers: int, target: str, limit: int | None = None,
              scheduler_process: bool = True) -> dict[str, Any]:
    from distributed import Client

    from accy.distributed.batch import run_batch
    from accy.distributed.local import local_cluster

    store = tempfile.mkdtemp(prefix="accy-bench-big-")
    with local_cluster(workers, scheduler_process=scheduler_process) as cluster, \
            Client(cluster) as client:
        client.wait_for_workers(workers)
        run_batch(client, distinct_variants(len(PROGRAMS) * workers, target, first_rows=4),
                  store_url=store)
        out = _big(client, big_sweep(target)[:limit], store, cluster)
    # the same sweep again as a second `accy batch --cache` would run it: a new
    # cluster (nothing published, nothing held), the store warm
    with local_cluster(workers, scheduler_process=scheduler_process) as cluster, \
            Client(cluster) as client:
        client.wait_for_workers(workers)
        warm = _big(client, big_sweep(target)[:limit], store, cluster)
    out["warm_store_new_cluster"] = {k: warm[k] for k in
                                     ("wall_s", "variants_per_s", "ok", "stage_runs", "cpu_s")}
    return out


def _big(client: Any, vs: list[Any], store: str, cluster: Any) -> dict[str, Any]:
    """The big sweep; this process's peak RSS sampled every 50 ms (and the scheduler's,
    when it has a process of its own)."""
    import threading

    import psutil


    proc = psutil.Process()
    spid = getattr(cluster.scheduler, "pid", None)
    sched = psutil.Process(spid) if spid else None
    base = proc.memory_info().rss
    peak = [base, sched.memory_info().rss if sched else 0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.05):
            peak[0] = max(peak[0], proc.memory_info().rss)
            if sched:
                peak[1] = max(peak[1], sched.memory_info().rss)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        result, cpu = metered_batch(client, cluster, vs, store)
    finally:
        stop.set()
        t.join()
    rep = result.report()["summary"]
    return {"variants": len(vs), "ok": rep["ok"], "wall_s": round(result.wall_s, 2),
            "cpu_s": cpu, "scheduler_in_own_process": sched is not None,
            "scheduler_peak_rss_mb": round(peak[1] / 2**20) if sched else None,
            "variants_per_s": round(len(vs) / result.wall_s, 1),
            "stage_runs": rep["stage_runs"], "reuses": rep["reuses"],
            "client_rss_before_mb": round(base / 2**20), "client_peak_rss_mb":
                round(peak[0] / 2**20), "client_rss_after_mb":
                round(proc.memory_info().rss / 2**20)}


def _profiled(client: Any, vs: list[Any], store: str, folder: str) -> Any:
    """The batch under cProfile (client) and Dask's profiler (scheduler, workers)."""
    import cProfile
    import pstats

    from distributed import performance_report

    from accy.distributed.batch import run_batch

    os.makedirs(folder, exist_ok=True)
    start = time.time()
    prof = cProfile.Profile()
    with performance_report(filename=os.path.join(folder, "dask-report.html")):
        prof.enable()
        result = run_batch(client, vs, store_url=store)
        prof.disable()
    prof.dump_stats(os.path.join(folder, "client.prof"))
    with open(os.path.join(folder, "client.txt"), "w") as f:
        pstats.Stats(prof, stream=f).sort_stats("cumulative").print_stats(45)
    for who, kw in (("scheduler", {"scheduler": True}), ("workers", {})):
        data = client.profile(start=start, **kw)
        with open(os.path.join(folder, f"{who}.txt"), "w") as f:
            f.write(_profile_lines(data))
    return result


def _profile_lines(node: dict[str, Any], depth: int = 0, out: list[str] | None = None,
                   total: int | None = None) -> str:
    """Dask's profile tree as indented text (frames over 2% of the samples)."""
    out = [] if out is None else out
    total = total or max(node.get("count", 0), 1)
    for child in sorted(node.get("children", {}).values(), key=lambda c: -c["count"]):
        if child["count"] / total < 0.02:
            continue
        d = child.get("description", {})
        out.append(f"{'  ' * depth}{100 * child['count'] / total:5.1f}% "
                   f"{d.get('name', '?')} {d.get('filename', '')}:{d.get('line_number', '')}")
        _profile_lines(child, depth + 1, out, total)
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="host")
    ap.add_argument("--workers", type=int, nargs="+", default=[2])
    ap.add_argument("--variants", type=int, default=480)
    ap.add_argument("--shared", type=int, default=None,
                    help="variants in the shared-stage sweep (default: --variants)")
    ap.add_argument("--big", action="store_true", help="add the 10,080-variant sweep")
    ap.add_argument("--big-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--big-limit", type=int, default=None,
                    help="only the first N variants of the big sweep (a smoke test)")
    ap.add_argument("--no-pool", action="store_true")
    ap.add_argument("--pool-gc", action="store_true",
                    help="run the pool's processes under accy's worker GC policy too")
    ap.add_argument("--scheduler-in-client", action="store_true",
                    help="accy's cluster with its scheduler on the client's event loop "
                         "(as a LocalCluster runs it) instead of a process of its own")
    ap.add_argument("--compare-scheduler", action="store_true",
                    help="also measure accy with the scheduler on the client's event loop "
                         "(distinct and shared sets, and the big sweep)")
    ap.add_argument("--repeats", type=int, default=0,
                    help="interleave accy and the pool this many times per worker count "
                         "(fresh variants and store each time) and report min/median/max "
                         "of the ratios, instead of one pass each")
    ap.add_argument("--profile", default=None, metavar="DIR")
    ap.add_argument("--stream", action="store_true",
                    help="record each measured accy batch's task stream figures: time to "
                         "the first task, after the last, the workers' busy fraction")
    ap.add_argument("--compile-apart", action="store_true",
                    help="accy's compile groups give each distinct source an NVRTC program "
                         "of its own (ACCY_GROUP_SOURCES=0), as the pool's processes do")
    ap.add_argument("--no-nvrtc-cache", action="store_true",
                    help="CUDA_CACHE_DISABLE=1 for every process of both sides: every NVRTC "
                         "compile a real one (the module docstring says why)")
    ap.add_argument("--output", default=None, help="also write the JSON here")
    args = ap.parse_args()
    if args.no_nvrtc_cache:  # before any process starts: clusters and pools inherit it
        os.environ["CUDA_CACHE_DISABLE"] = "1"
    if args.compile_apart:  # the same: accy's workers inherit it
        from accy.executable.compile import GROUP_SOURCES_ENV

        os.environ[GROUP_SOURCES_ENV] = "0"
    STREAM[0] = args.stream
    POOL_GC[0] = args.pool_gc
    tgt = _tgt(args.target)
    own = not args.scheduler_in_client
    if args.big_child:
        print(json.dumps(big_child(args.workers[-1], tgt, args.big_limit, own)))
        return
    sets = {"distinct": distinct_variants(args.variants, tgt),
            "shared": shared_variants(args.shared or args.variants, tgt)}
    out: dict[str, Any] = {"machine": platform.node(), "cpus": os.cpu_count(),
                           "pool_gc": args.pool_gc,
                           "nvrtc_cache": not args.no_nvrtc_cache,
                           "group_sources": not args.compile_apart,
                           "date": time.strftime("%Y-%m-%d %H:%M"), "target": tgt, "runs": []}
    for w in args.workers if args.repeats else []:
        out.setdefault("interleaved", []).append(
            interleaved(w, args.repeats, args.variants, tgt, own))
        print(f"workers={w}: min/median/max {out['interleaved'][-1]['min_median_max']}",
              file=sys.stderr, flush=True)
        _write(out, args.output)
    for w in [] if args.repeats else args.workers:
        # warm-up: other shapes, one round per process
        warm = warm_up_variants(w, tgt)
        r: dict[str, Any] = {"workers": w, "variants": {k: len(v) for k, v in sets.items()}}
        r["accy"] = measure_accy(w, sets, warm, args.profile if w == args.workers[0] else None,
                                 own)
        if args.compare_scheduler:
            r["accy_scheduler_in_client"] = measure_accy(w, sets, warm, None, False,
                                                         extras=False)
        r["plain_dask_round_trip_ms"] = round(plain_dask_round_trip(w) * 1e3, 3)
        if not args.no_pool:
            r["pool"] = measure_pool(w, sets, warm)
            r["ratio"] = {k: round(r["accy"][k]["variants_per_s"]
                                   / r["pool"][k]["variants_per_s"], 2) for k in sets}
        out["runs"].append(r)
        print(f"workers={w}: " + ", ".join(
            f"{k} accy {r['accy'][k]['variants_per_s']}/s"
            + (f" pool {r['pool'][k]['variants_per_s']}/s ratio {r['ratio'][k]}"
               if "pool" in r else "") for k in sets)
            + f"; stage ms {r['accy']['distinct']['stage_ms']}"
            + (f", pool compile ms {r['pool']['distinct']['compile_ms']}" if "pool" in r else "")
            + (", scheduler in the client: " + ", ".join(
                f"{k} {r['accy_scheduler_in_client'][k]['variants_per_s']}/s" for k in sets)
               if "accy_scheduler_in_client" in r else "")
            + f"; reused refresh {r['accy']['fully_reused_refresh_ms']} ms; round trip "
              f"accy {r['accy']['trivial_round_trip_ms']} ms, plain Dask "
              f"{r['plain_dask_round_trip_ms']} ms, client sending every 1 ms "
              f"{r['accy']['trivial_round_trip_client_send_1ms']} ms", file=sys.stderr, flush=True)
        _write(out, args.output)
    if args.big:
        out["big"] = dict(big_in_child(max(args.workers), tgt, args.big_limit, own),
                          workers=max(args.workers))
        print(f"big: {out['big']}", file=sys.stderr, flush=True)
        _write(out, args.output)
        if args.compare_scheduler:
            out["big_scheduler_in_client"] = dict(
                big_in_child(max(args.workers), tgt, args.big_limit, False),
                workers=max(args.workers))
            print(f"big, scheduler in the client: {out['big_scheduler_in_client']}",
                  file=sys.stderr, flush=True)
            _write(out, args.output)
    print(json.dumps(out, indent=2))


def _write(out: dict[str, Any], path: str | None) -> None:
    if path:
        with open(path, "w") as f:
            f.write(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
