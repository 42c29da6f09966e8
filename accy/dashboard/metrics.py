"""The ``accy_*`` Prometheus metrics, served on Dask's own ``/metrics``.

:class:`AccyCollector` is registered once per process on the global registry
(a second registration would raise "Duplicated timeseries",
dask/distributed#2544), which Dask's ``/metrics`` serves, when a dashboard
plugin starts (:func:`attach`, from the plugin's ``start``). It reads the most
recently started plugin that is still running, as Dask's own collectors follow
the most recently started scheduler of the process.

Metrics (counters are cumulative since the plugin started):

=================================  =====================================================
``accy_stage_runs_total{stage}``   stage runs in variant receipts (the report's ``ran``)
``accy_stage_failures_total``      variants that failed at the stage (``{stage}``)
``accy_stage_reuses_total{stage}`` receipts of variants that reused the stage
``accy_stage_duration_seconds``    histogram of the receipts' stage run times (``{stage}``)
``accy_tasks_total{task}``         cluster tasks that finished: a stage run, or a fused
                                   chain of them named first-last (``kernel-load``)
``accy_task_failures_total``       cluster tasks that erred (``{task}``)
``accy_task_duration_seconds``     histogram of task compute time (``{task}``)
``accy_publishes_total``           cache-state publishes that won
``accy_publish_conflicts_total``   publishes refused by compare-and-swap
``accy_variants_total{status}``    variants recorded, by ``ok`` / ``failed``
``accy_pinned_keys``               task keys pinned in worker memory now
=================================  =====================================================

Example
-------
>>> sorted(m.name for m in AccyCollector().describe())[:3]
['accy_pinned_keys', 'accy_publish_conflicts', 'accy_publishes']
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prometheus_client.registry import CollectorRegistry

    from accy.dashboard.plugin import StageDashboardPlugin

logger = logging.getLogger("accy.dashboard")

# Started plugins, oldest first (weakly: a closed scheduler's plugin goes away).
_LIVE: list[weakref.ref[StageDashboardPlugin]] = []
_COLLECTOR: AccyCollector | None = None


def attach(plugin: StageDashboardPlugin) -> None:
    """A dashboard plugin started: the metrics read it (and are registered, once)."""
    detach(plugin)
    _LIVE.append(weakref.ref(plugin))
    try:
        register_metrics()
    except Exception:
        logger.warning("accy: could not register the Prometheus metrics", exc_info=True)


def detach(plugin: StageDashboardPlugin) -> None:
    """The plugin closed: the metrics stop reading it."""
    _LIVE[:] = [ref for ref in _LIVE if ref() is not None and ref() is not plugin]


def current_plugin() -> StageDashboardPlugin | None:
    """The plugin whose metrics a scrape shows: the most recently started one
    still running (one per process outside of tests)."""
    for ref in reversed(_LIVE):
        plugin = ref()
        if plugin is not None:
            return plugin
    return None


def register_metrics(registry: CollectorRegistry | None = None) -> bool:
    """Register :class:`AccyCollector` on ``registry`` (the global one by default),
    once per process. Returns False when ``prometheus_client`` is missing."""
    global _COLLECTOR
    try:
        import prometheus_client
    except ImportError:
        return False
    if registry is None and _COLLECTOR is not None:
        return True
    collector = AccyCollector()
    try:
        (registry or prometheus_client.REGISTRY).register(collector)
    except ValueError as error:  # e.g. this module was imported anew
        if "Duplicated timeseries" not in str(error):
            raise
        logger.debug("accy: metrics already registered: %s", error)
    if registry is None:
        _COLLECTOR = collector
    return True


class AccyCollector:
    """A Prometheus collector of the ``accy_*`` metrics (see the module doc).

    Parameters
    ----------
    plugin
        Always read this plugin; None (the default): :func:`current_plugin`.
    """

    def __init__(self, plugin: StageDashboardPlugin | None = None) -> None:
        self.plugin = plugin

    def describe(self) -> Iterator[Any]:
        return self._families(None)

    def collect(self) -> Iterator[Any]:
        plugin = self.plugin or current_plugin()
        if plugin is None:
            return iter(())
        return self._families(plugin)

    def _families(self, plugin: StageDashboardPlugin | None) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )
        from prometheus_client.utils import floatToGoString

        runs = CounterMetricFamily("accy_stage_runs",
                                   "accy stage runs in variant receipts", labels=["stage"])
        failures = CounterMetricFamily("accy_stage_failures",
                                       "accy variants that failed at a stage", labels=["stage"])
        reuses = CounterMetricFamily("accy_stage_reuses",
                                     "variant receipts that reused a stage", labels=["stage"])
        durations = HistogramMetricFamily("accy_stage_duration_seconds",
                                          "run time of accy stages in variant receipts",
                                          labels=["stage"])
        tasks = CounterMetricFamily("accy_tasks", "accy cluster tasks finished (a stage run "
                                    "or a fused chain of them)", labels=["task"])
        task_failures = CounterMetricFamily("accy_task_failures", "accy cluster tasks that "
                                            "erred", labels=["task"])
        task_durations = HistogramMetricFamily("accy_task_duration_seconds",
                                               "compute time of accy cluster tasks",
                                               labels=["task"])
        publishes = CounterMetricFamily("accy_publishes", "accy cache-state publishes that won")
        conflicts = CounterMetricFamily("accy_publish_conflicts",
                                        "accy publishes refused by compare-and-swap")
        variants = CounterMetricFamily("accy_variants", "accy variants recorded, by status",
                                       labels=["status"])
        pinned = GaugeMetricFamily("accy_pinned_keys", "task keys the accy-cache plugin pins")
        if plugin is not None:
            records = plugin.records
            for name, totals in records.totals.items():
                if totals["ran"] + totals["reused"] + totals["skipped"] + totals["failed"]:
                    runs.add_metric([name], totals["ran"])
                    failures.add_metric([name], totals["failed"])
                    reuses.add_metric([name], totals["reused"])
                if totals["tasks"] + totals["task_errors"]:
                    tasks.add_metric([name], totals["tasks"])
                    task_failures.add_metric([name], totals["task_errors"])
            for family, of in ((durations, "receipts"), (task_durations, "tasks")):
                for name, hist in records.snapshot_histograms(of).items():
                    family.add_metric([name], [(b if b == "+Inf" else floatToGoString(b), n)
                                               for b, n in hist["buckets"]],
                                      sum_value=hist["sum"])
            cache = plugin.cache_counts()
            publishes.add_metric([], cache["publishes"])
            conflicts.add_metric([], cache["publish_conflicts"])
            for status, n in records.variant_totals.items():
                variants.add_metric([status], n)
            pinned.add_metric([], cache["pinned_keys"])
        yield from (runs, failures, reuses, durations, tasks, task_failures, task_durations,
                    publishes, conflicts, variants, pinned)
