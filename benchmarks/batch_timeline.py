"""Where one batch's wall time goes, on one time line; prints JSON.

One local cluster as ``accy batch`` builds it, warmed up, then ``--passes`` batches
of fresh distinct variants (``benchmarks/batch.py``'s set; ``--shared`` its
shared-stage sweep), each with Dask's task stream and the client's own phases
on one clock (seconds from the batch's start):

- ``submit``: each chunk's :func:`accy.distributed.batch._submit` (the resolve round
  trip, planning, the graph's message), with ``resolve`` inside it;
- ``tasks``: per worker, its first start, last stop and task count; ``busy_s`` and
  ``busy_fraction``: the workers' computing, in all and over workers × wall;
  ``concurrency``: the mean number of workers computing in each 50 ms;
- ``publishes``: each publish's span and its variant count;
- ``collect``: the collecting thread's spans turning results into receipts (calls
  less than 2 ms apart merged), with their variant counts;
- ``end``: when :func:`run_batch` returned.

    python3 benchmarks/batch_timeline.py --target host --workers 2 --variants 96
    python3 benchmarks/batch_timeline.py --target cuda --workers 15 --variants 480   # H200

``--set NAME=VALUE`` sets a constant of :mod:`accy.distributed.batch` first (e.g.
``TAIL_GRAIN_DIVISOR=4``), or of another module named in full
(``accy.distributed.local.NANNY_CHORES_MS={}``; the value is JSON), to compare settings
in one visit.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))


class Spans:
    """Wall-clock spans of the client's phases, recorded by wrapping module functions
    (or methods: ``module`` may be a class); :meth:`unwrap` puts them back."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, float, float, int]] = []
        self.wrapped: list[tuple[Any, str, Any]] = []

    def totals(self) -> dict[str, float]:
        """Seconds spent in each label's spans."""
        out: dict[str, float] = {}
        for label, a, b, _ in self.spans:
            out[label] = out.get(label, 0.0) + b - a
        return out

    def unwrap(self) -> None:
        while self.wrapped:
            module, name, inner = self.wrapped.pop()
            setattr(module, name, inner)

    def wrap(self, module: Any, name: str, label: str, size: Any = None) -> None:
        inner = getattr(module, name)
        self.wrapped.append((module, name, inner))

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.time()
            try:
                return inner(*args, **kwargs)
            finally:
                self.spans.append((label, t0, time.time(), size(args) if size else 0))

        setattr(module, name, timed)


def one_pass(client: Any, vs: list[Any], spans: Spans) -> dict[str, Any]:
    from batch import cold_workers
    from distributed import get_task_stream

    from accy.distributed.batch import run_batch

    cold_workers(client)
    spans.spans.clear()
    with get_task_stream(client) as ts:
        t0 = time.time()
        result = run_batch(client, vs, store_url=tempfile.mkdtemp(prefix="accy-tl-"))
        t1 = time.time()
    assert result.report()["summary"]["ok"] == len(vs), result.report()["summary"]
    workers: dict[str, list[float]] = {}
    computes: list[tuple[float, float]] = []
    for t in ts.data:
        for ss in t.get("startstops", ()):
            if ss.get("action") == "compute":
                w = workers.setdefault(t["worker"], [ss["start"], ss["stop"], 0, 0.0])
                w[0], w[1], w[2] = min(w[0], ss["start"]), max(w[1], ss["stop"]), w[2] + 1
                w[3] += ss["stop"] - ss["start"]
                computes.append((ss["start"] - t0, ss["stop"] - t0))

    def r(x: float) -> float:
        return round(x - t0, 4)

    phases: dict[str, list[Any]] = {}
    for label, a, b, n in sorted(spans.spans, key=lambda s: s[1]):
        runs = phases.setdefault(label, [])
        if label == "collect" and runs and a - t0 - runs[-1][1] < 0.002:
            runs[-1][1], runs[-1][2] = r(b), runs[-1][2] + 1
        else:
            runs.append([r(a), r(b), 1 if label == "collect" else n])
    tasks = sorted(([r(a), r(b), n] for a, b, n, _ in workers.values()), key=lambda w: w[0])
    busy = sum(w[3] for w in workers.values())
    return {"end": r(t1), "variants_per_s": round(len(vs) / (t1 - t0), 1),
            "first_task": min(t[0] for t in tasks), "last_task_end": max(t[1] for t in tasks),
            "tasks": tasks, "busy_s": round(busy, 3),
            "busy_fraction": round(busy / (len(workers) * (t1 - t0)), 3),
            "concurrency": concurrency(computes, t1 - t0), **phases}


def concurrency(computes: list[tuple[float, float]], wall: float, step: float = 0.05) \
        -> list[float]:
    """The mean number of workers computing in each ``step`` seconds of the batch.

    >>> concurrency([(0.0, 0.1), (0.05, 0.1)], 0.1)
    [1.0, 2.0]
    """
    out = []
    at = 0.0
    while at < wall - 1e-9:
        end = min(at + step, wall)
        out.append(round(sum(max(0.0, min(b, end) - max(a, at)) for a, b in computes)
                         / (end - at), 2))
        at = end
    return out


def set_constant(item: str, default: Any) -> None:
    """``NAME=VALUE``: the constant ``NAME`` of module ``default`` (or, with dots, of the
    module its prefix names) set to the JSON ``VALUE``.

    >>> import types
    >>> m = types.SimpleNamespace(GRAIN=8)
    >>> set_constant("GRAIN=4", m); m.GRAIN
    4
    >>> import accy.distributed.local as local
    >>> before = local.NANNY_CHORES_MS
    >>> set_constant("accy.distributed.local.NANNY_CHORES_MS={}", m)
    >>> local.NANNY_CHORES_MS
    {}
    >>> local.NANNY_CHORES_MS = before
    """
    import importlib

    name, value = item.split("=", 1)
    module: Any = default
    if "." in name:
        path, name = name.rsplit(".", 1)
        module = importlib.import_module(path)
    if not hasattr(module, name):
        raise SystemExit(f"--set: {getattr(module, '__name__', module)} has no {name}")
    setattr(module, name, json.loads(value))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="host")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--variants", type=int, default=96)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--shared", action="store_true", help="the shared-stage sweep")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="set a constant of accy.distributed.batch, or of the module "
                         "NAME names in full, to VALUE (JSON) first")
    args = ap.parse_args()

    from batch import PROGRAMS, distinct_variants, shared_variants
    from distributed import Client

    import accy.distributed.batch as batch_mod
    from accy.distributed.local import local_cluster
    from accy.distributed.state import unpin

    for item in args.set:
        set_constant(item, batch_mod)
    spans = Spans()
    spans.wrap(batch_mod, "_submit", "submit", lambda a: len(a[1]))
    spans.wrap(batch_mod, "resolve_many", "resolve", lambda a: len(a[1]))
    spans.wrap(batch_mod._Collector, "publish", "publish", lambda a: len(a[1]))
    spans.wrap(batch_mod._Collector, "collect", "collect")
    make = shared_variants if args.shared else distinct_variants
    out: dict[str, Any] = {"target": args.target, "workers": args.workers,
                           "variants": args.variants, "shared": args.shared, "set": args.set,
                           "passes": []}
    with local_cluster(args.workers) as cluster, Client(cluster) as client:
        client.wait_for_workers(args.workers)
        warm = distinct_variants(len(PROGRAMS) * args.workers, args.target, first_rows=4)
        batch_mod.run_batch(client, warm, store_url=tempfile.mkdtemp(prefix="accy-tl-"))
        for p in range(args.passes):
            vs = make(args.variants, args.target, first_rows=8 + 8000 * (p + 1))
            out["passes"].append(one_pass(client, vs, spans))
        unpin(client)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
