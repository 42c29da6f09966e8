"""Flood an ArtifactStore with puts from several writer processes; print JSON.

Two phases on one local folder, each with ``--writers`` processes putting
distinct keys as fast as they can (each put followed by a get, as a stage
run's write-back and a later reuse do):

- **below**: the bound is far away (no eviction);
- **at**: the store is first filled to ``--entries`` entries' worth of
  ``max_bytes``, so every put evicts.

The "at" phase runs twice on its own filled store: once timed alone (puts/s),
once with a sampler thread walking the folder every 2 ms to record the peak
bytes on disk (entries and in-flight temporaries, the ledger left out). The
sampler costs CPU the writers then lack, so it never runs in a timed phase
(it did until 2026-12-01: the "at" rate was measured against a busy sampler,
the "below" rate without one).

Run::

    PYTHONPATH=$PWD python3 benchmarks/store_flood.py --writers 4 --entries 1000
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import tempfile
import threading
import time
from typing import Any

from accy.store import ArtifactStore, encode_entry


def _key(i: int) -> str:
    return f"{i:032x}"


def _writer(root: str, bound: int, first: int, count: int, payload: int,
            start: Any, out: Any) -> None:
    store = ArtifactStore(root, max_bytes=bound)
    data = os.urandom(payload)
    start.wait()
    t0 = time.perf_counter()
    for i in range(first, first + count):
        store.put(_key(i), data, kind="stage:kernel")
        store.get(_key(i), kind="stage:kernel")
    out.put((t0, time.perf_counter(), store.stats()))


def _disk_bytes(root: str) -> int:
    total = 0
    for d, _, files in os.walk(root):
        for f in files:
            if f == ".accy-ledger" and d == root:
                continue
            try:
                total += os.path.getsize(os.path.join(d, f))
            except FileNotFoundError:
                pass
    return total


def _phase(root: str, bound: int, writers: int, puts: int, payload: int, base: int,
           sample: bool) -> dict[str, Any]:
    ctx = mp.get_context("fork")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(root, bound, base + w * puts, puts, payload,
                                               start, out)) for w in range(writers)]
    for p in procs:
        p.start()
    peak, done = [_disk_bytes(root)], threading.Event()

    def sampler() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _disk_bytes(root))
            time.sleep(0.002)

    thread = threading.Thread(target=sampler)
    if sample:
        thread.start()
    time.sleep(0.5)  # every writer imported and waiting
    start.set()
    results = [out.get(timeout=300) for _ in procs]
    for p in procs:
        p.join()
    done.set()
    if sample:
        thread.join()
    t0 = min(r[0] for r in results)
    t1 = max(r[1] for r in results)
    evictions = sum(r[2]["evictions"] for r in results)
    errors = sum(r[2]["put_errors"] for r in results)
    return {"puts_per_s": round(writers * puts / (t1 - t0), 1), "seconds": round(t1 - t0, 3),
            "evictions": evictions, "put_errors": errors,
            "peak_bytes": peak[0] if sample else None, "final_bytes": _disk_bytes(root)}


def main() -> None:
    """Run both phases and print one JSON object."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--writers", type=int, default=4)
    ap.add_argument("--entries", type=int, default=1000, help="entries that fit the bound")
    ap.add_argument("--puts", type=int, default=1500, help="puts per writer per phase")
    ap.add_argument("--payload", type=int, default=1000, help="payload bytes per entry")
    args = ap.parse_args()
    entry = len(encode_entry(b"x" * args.payload, "stage:kernel", _key(0)))
    bound = args.entries * entry

    with tempfile.TemporaryDirectory() as below_root:
        big = bound * 100
        ArtifactStore(below_root, max_bytes=big).keys()  # the ledger exists
        below = _phase(below_root, big, args.writers, args.puts, args.payload, 0, False)

        data = os.urandom(args.payload)
        runs = []
        for sample in (False, True):
            with tempfile.TemporaryDirectory() as root:
                fill = ArtifactStore(root, max_bytes=bound)
                for i in range(10**7, 10**7 + args.entries):
                    fill.put(_key(i), data, kind="stage:kernel")
                runs.append(_phase(root, bound, args.writers, args.puts, args.payload, 0,
                                   sample))
        at, sampled = runs
        at["peak_bytes"], at["final_bytes"] = sampled["peak_bytes"], sampled["final_bytes"]
        at["sampled_puts_per_s"] = sampled["puts_per_s"]

    print(json.dumps({
        "writers": args.writers, "entries_at_bound": args.entries, "entry_bytes": entry,
        "max_bytes": bound, "puts_per_writer": args.puts,
        "below_bound": below, "at_bound": at,
        "puts_per_s_below": below["puts_per_s"], "puts_per_s_at": at["puts_per_s"],
        "slowdown_at_bound": round(below["puts_per_s"] / at["puts_per_s"], 2),
        "peak_over_max_bytes": round(at["peak_bytes"] / bound, 4),
        "final_over_max_bytes": round(at["final_bytes"] / bound, 4),
    }, indent=2))


if __name__ == "__main__":
    main()
