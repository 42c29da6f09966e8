"""The worker-kill fault suite: batches on a real-process cluster, a worker killed at a
random moment in each trial, the invariants checked after every one.

A trial runs one batch (host and ``cuda:sm_90`` variants of the row graphs,
shapes new to the trial so it really computes) in a thread, and kills a worker
(SIGKILL; the nanny restarts it) at one of these moments, in turn: at once
(while the batch is resolved and submitted), when a worker is busy (mid-graph), a
random delay in, twice (two kills), or after the batch (before the follow-up).
Then:

- **no hang**: the batch returns within ``--bound`` seconds;
- **no partial publish**: every published variant names all its stage entries,
  each computed from the previous one's product;
- **no wrong result**: every variant that finished has the same stage keys as a
  fault-free local refresh of it (keys are content-addressed: same key, same
  product) — checked for the whole follow-up batch;
- **no permanent failure**: a follow-up batch of the same variants, once the
  workers are back, has every variant ok.

With ``--concurrent`` every other trial has a second client of the same
scheduler batch an overlapping sweep (half the trial's variants and two of its
own) while the worker dies; both batches are held to the same invariants.

Usage::

    PYTHONPATH=. python3 benchmarks/faults.py [--trials 50] [--seed 0] [--concurrent]

prints ``{"trials": N, "hangs": …, "partial_publishes": …, "wrong": …,
"permanent_failures": …, "faulted_failures": …, "moments": {...}, "seconds": …}``
(``faulted_failures`` counts variants of the faulted batches that failed with a
message, which the follow-up then refreshed: allowed; ``clean_errors`` are
batches that ended with one accy error line — every worker lost and none back
within the bound — also allowed; ``errors`` are anything else: a bug).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

GRAPHS = Path(__file__).resolve().parents[1] / "graphs"
MOMENTS = ("start", "busy", "random", "twice", "after")


def trial_variants(trial: int) -> list[Any]:
    from accy.sweep import Variant

    rows = 8 + trial  # a shape no earlier trial used
    out = []
    for target in ("host", "cuda:sm_90"):
        out.append(Variant(str(GRAPHS / "softmax.mlir"), target, {0: (rows, 256)}))
        out.append(Variant(str(GRAPHS / "softmax.mlir"), target, {0: (rows, 256)},
                           {"kernel.block_size": 128}))
        out.append(Variant(str(GRAPHS / "layernorm.mlir"), target, {0: (rows, 4096)}))
        out.append(Variant(str(GRAPHS / "gelu_tanh.mlir"), target, {0: (rows, 4096)}))
    return out


def local_keys(variant: Any) -> dict[str, str]:
    """The stage keys of a fault-free local refresh (prepared, not compiled)."""
    from accy.executable.cache import FragmentCompilerCache
    from accy.frontends import load_program
    from accy.preparation.options import RunOptions
    from accy.preparation.stages import PreparationRequest

    sm = load_program(variant.program)
    update = FragmentCompilerCache(load=False).refresh_from_semantic_module(
        sm, PreparationRequest(source=variant.program, variant=variant.id,
                               options=RunOptions.parse(variant.target, dict(variant.options)),
                               shapes=dict(variant.shapes)))
    return {r.stage: _hex(r.key) for r in update.report if r.key is not None}


def _hex(key: Any) -> str:
    return key if isinstance(key, str) else key.hex


def _workers_back(client: Any, cluster: Any = None) -> bool:
    """Wait for both workers. A nanny that did not restart its worker (both killed within
    a second, now and then) is replaced, as a deployment's supervisor would: True then
    (the trial is recorded as degraded)."""
    from distributed.exceptions import WorkerStartTimeoutError

    try:
        client.wait_for_workers(2, timeout=20)
        return False
    except (TimeoutError, WorkerStartTimeoutError):
        pass
    if cluster is not None:
        alive = set(cluster.scheduler.workers)
        with contextlib.suppress(Exception):
            for name, nanny in list(cluster.workers.items()):
                if getattr(nanny, "worker_address", None) not in alive:
                    cluster.sync(nanny.close)
                    del cluster.workers[name]
            cluster.sync(cluster._correct_state)
    try:
        client.wait_for_workers(2, timeout=60)
    except (TimeoutError, WorkerStartTimeoutError):
        client.wait_for_workers(1, timeout=60)
    return True


def _kill(pids: dict[str, int], address: str) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pids[address], signal.SIGKILL)


def overlapping_variants(trial: int) -> list[Any]:
    """A second client's sweep: every other variant of the trial's, and two of its own."""
    return trial_variants(trial)[::2] + trial_variants(10_000 + trial)[:2]


def run_trial(cluster: Any, client: Any, trial: int, moment: str, rng: random.Random,
              store: str, bound: float, other: Any = None) -> dict[str, Any]:
    """One trial (see the module docstring). With ``other`` (a second client of the
    same scheduler) that client batches an overlapping sweep at the same time: both
    batches must end, and the published state stays consistent for both."""
    from accy.distributed.batch import run_batch
    from accy.distributed.state import fetch_state, inconsistencies

    variants = trial_variants(trial)
    degraded = _workers_back(client, cluster)
    pids = client.run(os.getpid)
    box: dict[str, Any] = {}
    other_box: dict[str, Any] = {}

    def batch(c: Any, vs: list[Any], into: dict[str, Any]) -> None:
        try:
            into["result"] = run_batch(c, vs, store_url=store)
        except BaseException as e:  # noqa: BLE001 — recorded: an error is a finding
            into["error"] = e

    thread = threading.Thread(target=batch, args=(client, variants, box), daemon=True)
    second = threading.Thread(target=batch, args=(other, overlapping_variants(trial),
                                                  other_box), daemon=True)
    start = time.monotonic()
    thread.start()
    if other is not None:
        second.start()
    kills = 0
    if moment in ("start", "twice"):
        _kill(pids, rng.choice(sorted(pids)))
        kills += 1
    if moment in ("busy", "twice"):
        deadline = time.monotonic() + 20
        while thread.is_alive() and time.monotonic() < deadline:
            busy = [ws.address for ws in list(cluster.scheduler.workers.values())
                    if ws.processing and ws.address in pids]
            if busy:
                _kill(pids, busy[0])
                kills += 1
                break
            time.sleep(0.002)
    if moment == "random":
        time.sleep(rng.uniform(0.0, 1.5))
        _kill(pids, rng.choice(sorted(pids)))
        kills += 1
    thread.join(bound)
    if other is not None:
        second.join(max(1.0, bound - (time.monotonic() - start)))
    hung = thread.is_alive() or second.is_alive()
    out: dict[str, Any] = {"trial": trial, "moment": moment, "kills": kills, "hung": hung,
                           "seconds": round(time.monotonic() - start, 2),
                           "clients": 2 if other is not None else 1}
    if hung:
        import faulthandler

        faulthandler.dump_traceback(all_threads=True)  # where the batch waits
        out["workers"] = len(cluster.scheduler.workers)
        return out
    errors = [b["error"] for b in (box, other_box) if "error" in b]
    if errors:
        out["error"] = f"{type(errors[0]).__name__}: {errors[0]}"
    results = [b["result"] for b in (box, other_box) if b.get("result") is not None]
    if results:
        failed = [o for r in results for o in r.outcomes if o.status != "ok"]
        out["faulted_failures"] = len(failed)
        out["unexplained"] = sum(1 for o in failed if not (o.failure or {}).get("message"))
        if failed:
            out["first_failure"] = str((failed[0].failure or {}).get("message"))[:200]
    if moment == "after":
        _kill(pids, rng.choice(sorted(pids)))
        out["kills"] += 1
    out["partial"] = sorted(inconsistencies(fetch_state(client)))
    out["degraded"] = degraded or _workers_back(client, cluster)
    checked = variants + (overlapping_variants(trial)[-2:] if other is not None else [])
    follow = run_batch(client, checked, store_url=store)
    out["permanent"] = [o.id for o in follow.outcomes if o.status != "ok"]
    if out["permanent"]:
        first = next(o for o in follow.outcomes if o.status != "ok")
        out["permanent_failure"] = str((first.failure or {}).get("message"))[:300]
    wrong = []
    for v, o in zip(checked, follow.outcomes):
        if o.status == "ok":
            got = {r.stage: _hex(r.key) for r in o.receipts if r.key is not None}
            want = local_keys(v)
            if any(got.get(s) != k for s, k in want.items() if s in got):
                wrong.append(v.id)
    out["wrong"] = wrong
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bound", type=float, default=120.0, help="seconds before a hang")
    ap.add_argument("--moments", default=",".join(MOMENTS),
                    help="the kill moments to cycle through (comma-separated)")
    ap.add_argument("--concurrent", action="store_true",
                    help="every other trial, a second client batches an overlapping sweep "
                         "at the same time")
    args = ap.parse_args(argv)

    import logging
    import tempfile
    import warnings

    from distributed import Client, LocalCluster

    import accy.distributed as ad
    from accy.distributed.quiet import install as install_quiet_logging

    warnings.simplefilter("ignore")
    install_quiet_logging()
    logging.getLogger("distributed").setLevel(logging.ERROR)  # the kills are the point
    rng = random.Random(args.seed)
    trials = []
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp, \
            LocalCluster(processes=True, n_workers=2, threads_per_worker=1,
                         dashboard_address=":0", **ad.local_cluster_kwargs()) as cluster, \
            Client(cluster) as client, Client(cluster) as other:
        moments = args.moments.split(",")
        for t in range(args.trials):
            moment = moments[t % len(moments)]
            trials.append(run_trial(cluster, client, t, moment, rng,
                                    os.path.join(tmp, "store"), args.bound,
                                    other if args.concurrent and t % 2 else None))
            print(json.dumps(trials[-1]), file=sys.stderr, flush=True)
            if trials[-1]["hung"]:
                break
    summary = {
        "trials": len(trials),
        "kills": sum(t["kills"] for t in trials),
        "hangs": sum(1 for t in trials if t["hung"]),
        "errors": [t["error"] for t in trials
                   if "error" in t and not t["error"].startswith("AccyError")],
        "clean_errors": [t["error"] for t in trials if t.get("error", "").startswith("AccyError")],
        "partial_publishes": sum(len(t.get("partial", ())) for t in trials),
        "wrong": sum(len(t.get("wrong", ())) for t in trials),
        "permanent_failures": sum(len(t.get("permanent", ())) for t in trials),
        "faulted_failures": sum(t.get("faulted_failures", 0) for t in trials),
        "degraded_trials": sum(1 for t in trials if t.get("degraded")),
        "unexplained_failures": sum(t.get("unexplained", 0) for t in trials),
        "moments": {m: sum(1 for t in trials if t["moment"] == m) for m in MOMENTS},
        "two_client_trials": sum(1 for t in trials if t.get("clients") == 2),
        "slowest_trial_s": max((t["seconds"] for t in trials), default=0),
        "seconds": round(time.monotonic() - start, 1),
    }
    print(json.dumps(summary, indent=1))
    bad = summary["hangs"] or summary["errors"] or summary["partial_publishes"] or \
        summary["wrong"] or summary["permanent_failures"] or summary["unexplained_failures"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
