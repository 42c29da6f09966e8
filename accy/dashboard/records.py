"""What the cluster did: bounded records of stage runs, variants and failures.

The dashboard's scheduler plugin (:class:`accy.dashboard.plugin.StageDashboardPlugin`)
owns one :class:`StageRecords` and feeds it from two places:

- its ``transition`` hook: every task keyed ``("accy_<stage>", "<hex>")`` that
  goes ``processing → memory`` (or ``→ erred``) becomes a *stage-run record*:
  stage, key, worker, thread, the compute span and the transfer spans the
  worker reported (``startstops``), and a status;
- the ``accy_record_batch`` handler: the client sends one dict per finished
  variant (its id, status, receipts and failure), which become *variant
  records*, per-stage ran/reused/skipped counters and, for failed variants,
  *failure records*.

Everything is bounded: the last ``N`` stage runs and variants (Dask config
``accy.stage-records``, default 10000) and the last 50 failures. The counters
(per-stage totals, the cumulative duration histograms) are cumulative, so
Prometheus sees them only grow. Publishes and pinned keys are the cache
plugin's own counts; a snapshot takes them as arguments.

:meth:`StageRecords.snapshot` turns all of it into one JSON-able dict, the
figures that the ``/accy/stages`` page, ``/accy/api/stages``, the Prometheus
collector and the HTML report show; :func:`snapshot_from_variants` builds the
same dict from receipts alone (a batch without the scheduler plugin).

Example
-------
>>> records = StageRecords(maxlen=100)
>>> records.transition(("accy_contract", "ab12"), "processing", "memory",
...                    worker="tcp://127.0.0.1:4000", thread=1,
...                    startstops=[{"action": "compute", "start": 10.0, "stop": 10.5}])
>>> records.record_batch([{"id": "softmax[target=host]", "program": "softmax", "status": "ok",
...                        "elapsed_ns": 500_000_000,
...                        "stages": [{"stage": "contract", "key": "ab12", "reused": False,
...                                    "elapsed_ns": 500_000_000}]}])
{'recorded': 1, 'ignored': 0}
>>> snap = records.snapshot()
>>> snap["counts"]["contract"]["tasks"], snap["counts"]["contract"]["miss_rate"]
(1, 1.0)
"""

from __future__ import annotations

import bisect
import heapq
import logging
import time
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

from accy.pipeline import STAGE_NAMES

logger = logging.getLogger("accy.dashboard")

STAGES = STAGE_NAMES
"""Stage order on every figure: the stage table's."""
"""Stage names in pipeline order (what ``accy_<stage>`` task keys carry)."""
KEY_PREFIX = "accy_"
DEFAULT_MAX_RECORDS = 10000
MAX_FAILURES = 50
SLOWEST = 20
TIMELINE_LIMIT = 2000
"""How many of the most recent stage runs a snapshot's ``timeline`` carries."""
MAX_MESSAGE = 2000
DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
"""Upper bounds (seconds) of the stage-duration histogram; ``+Inf`` follows.
From a pass over a small program (about a millisecond) to an NVRTC compile
of a large fragment (seconds)."""


def _max_records_from_config() -> int:
    import dask.config

    return int(dask.config.get("accy.stage-records", DEFAULT_MAX_RECORDS))


def stage_of(key: Any) -> tuple[str, str] | None:
    """``(stage, hex)`` of an accy task key, None for any other key.

    Example
    -------
    >>> stage_of(("accy_kernel", "ff00")), stage_of("inc-123"), stage_of(("accy_", "x"))
    (('kernel', 'ff00'), None, None)
    """
    if not isinstance(key, tuple) or not key:
        return None
    head = key[0]
    if not isinstance(head, str) or not head.startswith(KEY_PREFIX) or len(head) == len(KEY_PREFIX):
        return None
    rest = key[1] if len(key) == 2 and isinstance(key[1], str) else "-".join(map(str, key[1:]))
    return head[len(KEY_PREFIX):], rest


def stage_order(stages: Iterable[str]) -> list[str]:
    """Stages in pipeline order, unknown ones after, alphabetically."""
    known = [s for s in STAGES if s in stages]
    return known + sorted(set(stages) - set(STAGES))


def _quantiles(samples: list[float]) -> dict[str, float]:
    xs = sorted(samples)
    n = len(xs)

    def q(p: float) -> float:
        # Linear interpolation between closest ranks (NumPy's default).
        pos = p * (n - 1)
        lo = int(pos)
        hi = min(lo + 1, n - 1)
        return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)

    return {"n": n, "min": xs[0], "q1": q(0.25), "median": q(0.5), "q3": q(0.75),
            "p95": q(0.95), "max": xs[-1], "mean": sum(xs) / n}


class StageRecords:
    """Bounded stores of stage runs, variants and failures, with cumulative counters.

    Parameters
    ----------
    maxlen
        How many stage runs (and, separately, variants) are kept; None: Dask
        config ``accy.stage-records`` (default 10000).

    All methods run on the scheduler's event loop (hooks, handlers, the page's
    periodic callback, the metrics scrape), so no locking is needed.
    """

    def __init__(self, maxlen: int | None = None) -> None:
        self.maxlen = maxlen if maxlen is not None else _max_records_from_config()
        if self.maxlen < 1:
            raise ValueError(f"accy.stage-records must be >= 1, got {self.maxlen}")
        self.runs: deque[dict[str, Any]] = deque(maxlen=self.maxlen)
        self.variants: deque[dict[str, Any]] = deque(maxlen=self.maxlen)
        self.failures: deque[dict[str, Any]] = deque(maxlen=MAX_FAILURES)
        # Cumulative: stage -> {"tasks", "task_errors", "ran", "reused", "skipped"}.
        self.totals: dict[str, dict[str, int]] = {}
        # Cumulative duration histograms of finished tasks: task name -> bucket counts
        # (one per DURATION_BUCKETS bound, plus +Inf; not cumulative across buckets).
        # A task is a stage run or a fused chain of them ("kernel-load").
        self.histograms: dict[str, list[int]] = {}
        self.duration_sums: dict[str, float] = {}
        # The same, of the stage runs in variant receipts (what the report counts).
        self.receipt_histograms: dict[str, list[int]] = {}
        self.receipt_duration_sums: dict[str, float] = {}
        self.variant_totals: dict[str, int] = {}
        self.generation = 0
        """Bumped on every change: a reader can skip work when it has not moved."""

    # -- feeding
    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        """The scheduler plugin's ``transition`` hook: record finished accy tasks.

        Never raises: Dask only logs hook exceptions at INFO, so a bad record
        is logged here at WARNING and dropped.
        """
        if start != "processing" or finish not in ("memory", "erred"):
            return
        try:
            named = stage_of(key)
            if named is not None:
                self._record_run(named[0], named[1], finish, kwargs)
        except Exception:
            logger.warning("accy: could not record the transition of %r", key, exc_info=True)

    def _record_run(self, stage: str, hexkey: str, finish: str, kwargs: Mapping[str, Any]) -> None:
        compute: list[tuple[float, float]] = []
        transfers: list[list[float]] = []
        for span in kwargs.get("startstops") or ():
            span_start, span_stop = float(span["start"]), float(span["stop"])
            if span.get("action") == "compute":
                compute.append((span_start, span_stop))
            elif span.get("action") == "transfer":
                transfers.append([span_start, span_stop])
        begin: float | None = None
        end: float | None = None
        duration: float | None = None
        if compute:
            begin, end = min(b for b, _ in compute), max(e for _, e in compute)
            duration = sum(e - b for b, e in compute)
        worker = kwargs.get("worker")
        run = {
            "stage": stage, "key": hexkey,
            "worker": worker if isinstance(worker, str) else None,
            "thread": kwargs.get("thread") if isinstance(kwargs.get("thread"), int) else None,
            "start": begin, "stop": end, "duration": duration,
            "transfers": transfers,
            "status": "ok" if finish == "memory" else "erred",
        }
        totals = self._totals(stage)
        if finish == "memory":
            totals["tasks"] += 1
            if duration is not None:
                self._observe(self.histograms, self.duration_sums, stage, duration)
        else:
            totals["task_errors"] += 1
        self.runs.append(run)
        self.generation += 1

    @staticmethod
    def _observe(histograms: dict[str, list[int]], sums: dict[str, float], name: str,
                 seconds: float) -> None:
        hist = histograms.setdefault(name, [0] * (len(DURATION_BUCKETS) + 1))
        hist[bisect.bisect_left(DURATION_BUCKETS, seconds)] += 1
        sums[name] = sums.get(name, 0.0) + seconds

    def _totals(self, stage: str) -> dict[str, int]:
        totals = self.totals.get(stage)
        if totals is None:
            totals = self.totals[stage] = {"tasks": 0, "task_errors": 0,
                                           "ran": 0, "reused": 0, "skipped": 0, "failed": 0}
        return totals

    def record_batch(self, variants: Iterable[Mapping[str, Any]]) -> dict[str, int]:
        """Record finished variants (``accy_record_batch``); malformed ones are
        skipped with a warning. Returns ``{"recorded", "ignored"}``."""
        recorded = ignored = 0
        for variant in variants or ():
            try:
                self._record_variant(variant)
                recorded += 1
            except Exception:
                ignored += 1
                logger.warning("accy: ignoring a malformed variant record %.200r", variant,
                               exc_info=True)
        if recorded:
            self.generation += 1
        return {"recorded": recorded, "ignored": ignored}

    def _record_variant(self, variant: Mapping[str, Any]) -> None:
        vid = str(variant["id"])
        status = str(variant.get("status", "ok"))
        stages = []
        for receipt in variant.get("stages") or ():
            elapsed = receipt.get("elapsed_ns")
            stages.append({
                "stage": str(receipt["stage"]), "key": receipt.get("key"),
                "reused": bool(receipt.get("reused", False)),
                "skipped": receipt.get("skipped"),
                "elapsed_ns": int(elapsed) if elapsed is not None else None,
                "plan_fingerprint": receipt.get("plan_fingerprint"),
            })
        elapsed = variant.get("elapsed_ns")
        if elapsed is None:
            elapsed = sum(r["elapsed_ns"] or 0 for r in stages if not r["reused"])
        failure = variant.get("failure")
        record: dict[str, Any] = {
            "id": vid, "program": str(variant.get("program") or vid.split("[", 1)[0]),
            "status": status, "elapsed_ns": int(elapsed), "stages": stages,
            "time": time.time(),
        }
        # Validated: count only now.
        for receipt in stages:
            totals = self._totals(receipt["stage"])
            if receipt["reused"]:
                totals["reused"] += 1
            elif receipt["skipped"]:
                totals["skipped"] += 1
            else:
                totals["ran"] += 1
                if receipt["elapsed_ns"] is not None:
                    self._observe(self.receipt_histograms, self.receipt_duration_sums,
                                  receipt["stage"], receipt["elapsed_ns"] / 1e9)
        self.variant_totals[status] = self.variant_totals.get(status, 0) + 1
        if failure:
            failure = dict(failure)
            where = failure.get("stage") or failure.get("pipeline")
            if isinstance(where, str) and where:
                self._totals(where)["failed"] += 1
            record["failure"] = {k: failure.get(k) for k in ("pipeline", "pass", "reproducer")}
            record["failure"]["message"] = str(failure.get("message", ""))[:MAX_MESSAGE]
        if status != "ok" or failure:
            self.failures.append({"id": vid, "program": record["program"], "status": status,
                                  "time": record["time"],
                                  **(record.get("failure") or {"pipeline": None, "pass": None,
                                                               "message": "",
                                                               "reproducer": None})})
        self.variants.append(record)

    # -- figures
    def snapshot_histograms(self, of: str = "tasks") -> dict[str, dict[str, Any]]:
        """The cumulative duration histograms of finished tasks (``of="tasks"``, by task
        name) or of the stage runs in variant receipts (``of="receipts"``, by stage):
        ``{"buckets": [[upper bound, count ≤ bound], …, ["+Inf", count]], "sum", "count"}``."""
        counts, sums = (self.histograms, self.duration_sums) if of == "tasks" else \
            (self.receipt_histograms, self.receipt_duration_sums)
        histograms = {}
        for stage in stage_order(counts):
            cumulative: list[list[Any]] = []
            running = 0
            for bound, n in zip((*DURATION_BUCKETS, "+Inf"), counts[stage]):
                running += n
                cumulative.append([bound, running])
            histograms[stage] = {"buckets": cumulative, "sum": sums[stage], "count": running}
        return histograms

    def snapshot(self, *, publishes: int = 0, publish_conflicts: int = 0,
                 pinned_keys: int | None = None,
                 timeline_limit: int = TIMELINE_LIMIT) -> dict[str, Any]:
        """Every figure of the page, the API and the report as one JSON-able dict.

        Keys: ``stages`` (in pipeline order), ``counts`` (per stage: ``tasks``,
        ``task_errors`` — finished cluster tasks; ``ran``, ``reused``,
        ``skipped``, ``receipts`` — from variant receipts; ``reuse_rate``,
        ``miss_rate``, ``skip_rate`` — fractions of receipts), ``durations``
        (per stage: ``samples`` in seconds and their quantiles; from the
        retained task runs, or from receipts when no task was seen:
        ``duration_source``), ``histograms`` (cumulative, Prometheus-style),
        ``timeline`` (the last ``timeline_limit`` task runs), ``slowest``,
        ``failures``, ``variants`` (totals by status), ``publishes``,
        ``publish_conflicts``, ``pinned_keys`` (the cache plugin's counts, passed
        in), ``retained`` and ``time``.
        """
        source = "tasks" if self.runs else "receipts"
        samples: dict[str, list[float]] = {}
        if self.runs:
            for run in self.runs:
                if run["status"] == "ok" and run["duration"] is not None:
                    samples.setdefault(run["stage"], []).append(run["duration"])
        else:
            for variant in self.variants:
                for r in variant["stages"]:
                    if not r["reused"] and not r["skipped"] and r["elapsed_ns"] is not None:
                        samples.setdefault(r["stage"], []).append(r["elapsed_ns"] / 1e9)
        stages = stage_order(set(self.totals) | set(samples))
        counts: dict[str, dict[str, Any]] = {}
        for stage in stages:
            t: dict[str, Any] = dict(self._totals(stage))
            receipts = t["ran"] + t["reused"] + t["skipped"]
            t["receipts"] = receipts
            for name, field in (("reuse_rate", "reused"), ("miss_rate", "ran"),
                                ("skip_rate", "skipped")):
                t[name] = t[field] / receipts if receipts else 0.0
            counts[stage] = t
        durations = {stage: {"samples": xs, **_quantiles(xs)}
                     for stage in stages if (xs := samples.get(stage))}
        histograms = self.snapshot_histograms()
        timeline = list(self.runs)[-timeline_limit:] if timeline_limit > 0 else []
        slowest = heapq.nlargest(SLOWEST, self.variants, key=lambda v: v["elapsed_ns"])
        return {
            "stages": stages,
            "counts": counts,
            "durations": durations,
            "duration_source": source,
            "histograms": histograms,
            "timeline": [dict(run) for run in timeline if run["start"] is not None],
            "slowest": [_variant_row(v) for v in slowest],
            "failures": list(reversed(self.failures)),
            "variants": dict(self.variant_totals),
            "publishes": publishes,
            "publish_conflicts": publish_conflicts,
            "pinned_keys": pinned_keys,
            "retained": {"stage_runs": len(self.runs), "variants": len(self.variants),
                         "limit": self.maxlen},
            "time": time.time(),
        }


def _variant_row(variant: Mapping[str, Any]) -> dict[str, Any]:
    stages = variant["stages"]
    return {
        "id": variant["id"], "program": variant["program"], "status": variant["status"],
        "elapsed_ns": variant["elapsed_ns"], "elapsed_s": variant["elapsed_ns"] / 1e9,
        "stages_ran": sum(1 for r in stages if not r["reused"] and not r["skipped"]),
        "stages_reused": sum(1 for r in stages if r["reused"]),
        "time": variant["time"],
    }


def snapshot_from_variants(variants: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """A :meth:`StageRecords.snapshot` built from variant receipts alone (no
    cluster tasks seen: no timeline; durations from the receipts that ran).

    Example
    -------
    >>> snap = snapshot_from_variants([{"id": "a[target=host]", "status": "ok", "stages": [
    ...     {"stage": "contract", "key": "01", "reused": True, "elapsed_ns": 0}]}])
    >>> snap["counts"]["contract"]["reuse_rate"], snap["duration_source"]
    (1.0, 'receipts')
    """
    variants = list(variants)
    records = StageRecords(maxlen=max(1, len(variants)))
    records.record_batch(variants)
    return records.snapshot()
