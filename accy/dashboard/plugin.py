"""The ``accy-dashboard`` scheduler plugin: the stage records and what serves them.

One diagnostic, one plugin (as Dask's ``TaskStreamPlugin`` is to the task
stream): :class:`StageDashboardPlugin` owns the :class:`StageRecords` and
feeds them itself,

- from its ``transition`` hook: every finished ``("accy_<stage>", "<hex>")`` task;
- from its ``accy_record_batch`` handler: the variants a batch finished.

It reads the cache plugin's counts (publishes, conflicts, pinned keys) from
:func:`accy.distributed.plugin.get_plugin` at snapshot time; the cache plugin
knows nothing of the dashboard (no import goes that way).

What it serves:

- ``accy_stages()`` (a scheduler handler): :meth:`StageDashboardPlugin.stages`;
- ``/accy/api/stages``: a route of :mod:`accy.dashboard.api`, which Dask adds
  when that module is named in ``distributed.scheduler.http.routes``
  (:func:`accy.dashboard.api.routes_config`; ``cluster/dask.yaml`` names it);
- ``/accy/stages``: the live page, added on start when the scheduler runs
  Dask's Bokeh dashboard (:func:`accy.dashboard.page.add_page`);
- the ``accy_*`` Prometheus metrics on Dask's ``/metrics``
  (:class:`accy.dashboard.metrics.AccyCollector`).

``accy.distributed.dask_setup`` (the preload) and ``ensure_plugin`` install it
next to the cache plugin.

Example
-------
>>> plugin = StageDashboardPlugin(max_records=100)
>>> plugin.transition(("accy_contract", "ab12"), "processing", "memory", worker="tcp://w:1",
...                   startstops=[{"action": "compute", "start": 1.0, "stop": 1.5}])
>>> plugin.stages()["counts"]["contract"]["tasks"]
1
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from distributed.diagnostics.plugin import SchedulerPlugin

from accy.dashboard import metrics
from accy.dashboard.records import StageRecords
from accy.files import jsonable

if TYPE_CHECKING:
    from distributed import Scheduler

logger = logging.getLogger("accy.dashboard")

PLUGIN_NAME = "accy-dashboard"
HANDLERS = ("accy_record_batch", "accy_stages")


class StageDashboardPlugin(SchedulerPlugin):
    """Records accy stage runs and finished variants; serves them as the
    dashboard's page, JSON and metrics.

    Parameters
    ----------
    max_records
        How many stage runs and variants :attr:`records` keeps; None: Dask
        config ``accy.stage-records`` (default 10000).
    """

    name = PLUGIN_NAME
    idempotent = True

    def __init__(self, max_records: int | None = None, cache_plugin: str = "accy-cache") \
            -> None:
        self.records = StageRecords(max_records)
        """Stage runs, variants and failures, for the page, the API and the metrics."""
        self.cache_plugin = cache_plugin
        """The name of the scheduler plugin whose ``stats`` and ``pinned_keys`` the
        summary shows (the cache plugin; nothing here imports it)."""
        self.scheduler: Scheduler | None = None

    # -- lifecycle
    async def start(self, scheduler: Scheduler) -> None:
        """Install the handlers, the metrics and the page. Only the handlers are
        essential: a metrics or page failure is logged and the scheduler goes on."""
        self.scheduler = scheduler
        scheduler.handlers["accy_record_batch"] = self.record_batch
        scheduler.handlers["accy_stages"] = self.stages
        metrics.attach(self)
        try:
            from accy.dashboard.page import add_page  # Bokeh is optional: import it here

            add_page(scheduler, get_dashboard)
        except Exception:
            logger.warning("accy: could not add the /accy/stages page", exc_info=True)

    async def close(self) -> None:
        metrics.detach(self)
        if self.scheduler is not None:
            for name in HANDLERS:
                if self.scheduler.handlers.get(name) in (self.record_batch, self.stages):
                    del self.scheduler.handlers[name]

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        # Finished accy_<stage> tasks become stage-run records (never raises).
        self.records.transition(key, start, finish, *args, **kwargs)

    # -- handlers (synchronous: each runs without interleaving)
    def record_batch(self, comm: Any = None,
                     variants: list[dict[str, Any]] | None = None) -> dict[str, int]:
        """Record finished variants: one dict per variant with ``id``, ``program``,
        ``status``, ``stages`` (receipts), ``elapsed_ns`` and, when it failed,
        ``failure``. Returns ``{"recorded", "ignored"}``."""
        return self.records.record_batch(jsonable(list(variants or ())))

    def stages(self, comm: Any = None) -> dict[str, Any]:
        """The dashboard's figures (``/accy/api/stages`` serves the same dict)."""
        return self.records.snapshot(**self.cache_counts())

    def cache_counts(self) -> dict[str, int]:
        """``publishes``, ``publish_conflicts`` and ``pinned_keys`` of the
        scheduler's cache plugin (zeros without one)."""
        cache = self.scheduler.plugins.get(self.cache_plugin) \
            if self.scheduler is not None else None
        if cache is None or not hasattr(cache, "stats"):
            return {"publishes": 0, "publish_conflicts": 0, "pinned_keys": 0}
        return {"publishes": cache.stats["publishes"],
                "publish_conflicts": cache.stats["conflicts"],
                "pinned_keys": len(getattr(cache, "pinned_keys", ()))}


def get_dashboard(scheduler: Any) -> StageDashboardPlugin | None:
    """The scheduler's ``accy-dashboard`` plugin, or None if it has none.

    Example
    -------
    >>> class FakeScheduler:
    ...     plugins = {}
    >>> get_dashboard(FakeScheduler()) is None
    True
    """
    plugin = scheduler.plugins.get(PLUGIN_NAME)
    return plugin if isinstance(plugin, StageDashboardPlugin) else None
