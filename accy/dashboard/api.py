"""The records over HTTP: ``GET /accy/api/stages`` and ``accy_*`` Prometheus metrics.

:func:`install` runs from the scheduler plugin's ``start`` and wires, on the
dashboard's port (under its prefix):

- ``/accy/api/stages`` — :class:`StagesHandler`, the plugin's snapshot as
  JSON (the figures of the ``/accy/stages`` page);
- ``/accy/stages`` — the live page (:func:`accy.dashboard.page.add_page`), when
  the scheduler runs Dask's Bokeh dashboard;
- Prometheus metrics on Dask's ``/metrics``: :class:`AccyCollector`, registered
  once per process on the global registry (a second registration would raise
  "Duplicated timeseries", dask/distributed#2544). It finds the plugin lazily,
  at scrape time: the one of the scheduler whose ``/metrics`` is being served.

Metrics (counters are cumulative since the plugin started):

=================================  =====================================================
``accy_stage_runs_total{stage}``   stage tasks that finished on the cluster
``accy_stage_failures_total``      stage tasks that erred (``{stage}``)
``accy_stage_reuses_total{stage}`` receipts of variants that reused the stage
``accy_stage_duration_seconds``    histogram of stage task compute time (``{stage}``)
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

import json
import logging
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from tornado import web

if TYPE_CHECKING:
    from distributed import Scheduler

    from accy.distributed.plugin import AccyCachePlugin

logger = logging.getLogger("accy.dashboard")

API_PATH = "/accy/api/stages"

# Started plugins, oldest first (weakly: a closed scheduler's plugin goes away).
_LIVE: list[weakref.ref[AccyCachePlugin]] = []
# HTTP applications already given the routes (a plugin restarted on the same
# scheduler must not add them twice).
_WIRED: weakref.WeakSet[Any] = weakref.WeakSet()
_COLLECTOR: AccyCollector | None = None


def dashboard_prefix(scheduler: Scheduler) -> str:
    """The dashboard's URL prefix (``""`` at the root, e.g. ``"/dask"`` otherwise),
    read from Dask's own Bokeh application."""
    for app in getattr(getattr(scheduler, "http_application", None), "applications", ()):
        if type(app).__name__.endswith("BokehTornado") and hasattr(app, "prefix"):
            return (app.prefix or "").rstrip("/")
    return ""


def _has_dask_dashboard(scheduler: Scheduler) -> bool:
    apps = getattr(getattr(scheduler, "http_application", None), "applications", ())
    return any(type(app).__name__ == "DaskBokehTornado" for app in apps)


def install(plugin: AccyCachePlugin, scheduler: Scheduler) -> None:
    """Serve ``plugin``'s records from ``scheduler``'s HTTP server: the JSON API,
    the page (with a dashboard) and the metrics. Idempotent per scheduler."""
    _LIVE[:] = [ref for ref in _LIVE if ref() is not None and ref() is not plugin]
    _LIVE.append(weakref.ref(plugin))
    try:
        register_metrics()
    except Exception:
        logger.warning("accy: could not register the Prometheus metrics", exc_info=True)
    http_application = getattr(scheduler, "http_application", None)
    if http_application is None or http_application in _WIRED:
        return
    _WIRED.add(http_application)
    prefix = dashboard_prefix(scheduler)
    http_application.add_handlers(
        r".*", [(prefix + API_PATH, StagesHandler, {"scheduler": scheduler})])
    if not _has_dask_dashboard(scheduler):
        logger.debug("accy: the scheduler runs no Bokeh dashboard; no %s page", "/accy/stages")
        return
    try:
        from accy.dashboard.page import add_page

        add_page(scheduler, prefix)
    except Exception:
        logger.warning("accy: could not add the /accy/stages page", exc_info=True)


def forget(plugin: AccyCachePlugin) -> None:
    """The plugin closed: the metrics stop reading it."""
    _LIVE[:] = [ref for ref in _LIVE if ref() is not None and ref() is not plugin]


class StagesHandler(web.RequestHandler):
    """``GET /accy/api/stages``: the scheduler plugin's snapshot as JSON
    (503 while the scheduler has no accy plugin)."""

    def initialize(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler

    def get(self) -> None:
        from accy.distributed.plugin import get_plugin

        plugin = get_plugin(self.scheduler)
        self.set_header("Content-Type", "application/json")
        if plugin is None:
            self.set_status(503)
            self.write(json.dumps({"error": "the scheduler runs no accy-cache plugin"}))
            return
        self.write(json.dumps(plugin.stages()))


# -- Prometheus
def register_metrics(registry: Any = None) -> bool:
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


def current_plugin() -> AccyCachePlugin | None:
    """The plugin whose metrics a scrape shows: that of the scheduler whose
    ``/metrics`` is being served (Dask points its collectors at it for each
    request), else the most recently started one."""
    from accy.distributed.plugin import get_plugin

    try:
        from distributed.http.scheduler.prometheus.core import PrometheusHandler

        for collector in PrometheusHandler._collectors or ():
            server = getattr(collector, "server", None)
            plugin = get_plugin(server) if hasattr(server, "plugins") else None
            if plugin is not None:
                return plugin
    except Exception:
        logger.debug("accy: no scheduler from Dask's collectors", exc_info=True)
    for ref in reversed(_LIVE):
        plugin = ref()
        if plugin is not None:
            return plugin
    return None


class AccyCollector:
    """A Prometheus collector of the ``accy_*`` metrics (see the module doc).

    Parameters
    ----------
    plugin
        Always read this plugin; None (the default): :func:`current_plugin`.
    """

    def __init__(self, plugin: AccyCachePlugin | None = None) -> None:
        self.plugin = plugin

    def describe(self) -> Iterator[Any]:
        return self._families(None)

    def collect(self) -> Iterator[Any]:
        plugin = self.plugin or current_plugin()
        if plugin is None:
            return iter(())
        return self._families(plugin)

    def _families(self, plugin: AccyCachePlugin | None) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )
        from prometheus_client.utils import floatToGoString

        records = plugin.records if plugin is not None else None
        runs = CounterMetricFamily("accy_stage_runs", "accy stage tasks finished on the cluster",
                                   labels=["stage"])
        failures = CounterMetricFamily("accy_stage_failures", "accy stage tasks that erred",
                                       labels=["stage"])
        reuses = CounterMetricFamily("accy_stage_reuses",
                                     "variant receipts that reused a stage", labels=["stage"])
        durations = HistogramMetricFamily("accy_stage_duration_seconds",
                                          "compute time of accy stage tasks", labels=["stage"])
        publishes = CounterMetricFamily("accy_publishes", "accy cache-state publishes that won")
        conflicts = CounterMetricFamily("accy_publish_conflicts",
                                        "accy publishes refused by compare-and-swap")
        variants = CounterMetricFamily("accy_variants", "accy variants recorded, by status",
                                       labels=["status"])
        pinned = GaugeMetricFamily("accy_pinned_keys", "task keys the accy-cache plugin pins")
        if records is not None:
            for stage, totals in records.totals.items():
                runs.add_metric([stage], totals["tasks"])
                failures.add_metric([stage], totals["task_errors"])
                reuses.add_metric([stage], totals["reused"])
            for stage, hist in records.snapshot_histograms().items():
                durations.add_metric([stage], [(b if b == "+Inf" else floatToGoString(b), n)
                                               for b, n in hist["buckets"]],
                                     sum_value=hist["sum"])
            publishes.add_metric([], records.publishes)
            conflicts.add_metric([], records.publish_conflicts)
            for status, n in records.variant_totals.items():
                variants.add_metric([status], n)
            pinned.add_metric([], len(plugin.pinned_keys))
        yield from (runs, failures, reuses, durations, publishes, conflicts, variants, pinned)
