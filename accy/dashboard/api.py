"""The records over HTTP: ``GET /accy/api/stages``.

This is a Dask HTTP route module, like ``distributed.http.scheduler.json``:
its :data:`routes` list is served by the scheduler when the module is named in
Dask's config ``distributed.scheduler.http.routes``. Dask reads that list once,
when the scheduler is created (``distributed.http.utils.get_handlers``, which
also puts the routes under the dashboard's prefix and hands each handler the
scheduler), so it must be set before then:

- a deployment sets it in its Dask config: ``cluster/dask.yaml`` lists Dask's
  default route modules and ``accy.dashboard.api``;
- a local cluster in Python: ``with dask.config.set(routes_config()):``
  around ``LocalCluster(...)`` (``accy batch``'s local cluster does).

A scheduler whose config does not name the module still runs the dashboard
plugin (the ``accy_stages`` handler, the page and the metrics), only without
``/accy/api/stages``.

The ``accy_*`` Prometheus metrics on Dask's ``/metrics`` come from
:mod:`accy.dashboard.metrics`.

Example
-------
>>> routes_config()["distributed.scheduler.http.routes"][-1]
'accy.dashboard.api'
"""

from __future__ import annotations

import json
from typing import Any

from distributed.http.utils import RequestHandler

from accy.dashboard.plugin import get_dashboard

API_PATH = "/accy/api/stages"
ROUTES_MODULE = "accy.dashboard.api"
"""This module, as ``distributed.scheduler.http.routes`` names it."""
ROUTES_KEY = "distributed.scheduler.http.routes"


class StagesHandler(RequestHandler):
    """``GET /accy/api/stages``: the dashboard plugin's snapshot as JSON
    (503 while the scheduler has no ``accy-dashboard`` plugin).

    Dask's :class:`~distributed.http.utils.RequestHandler` receives the
    scheduler as ``self.server``.
    """

    def get(self) -> None:
        plugin = get_dashboard(self.server)
        self.set_header("Content-Type", "application/json")
        if plugin is None:
            self.set_status(503)
            self.write(json.dumps({"error": "the scheduler runs no accy-dashboard plugin"}))
            return
        self.write(json.dumps(plugin.stages()))


routes: list[tuple[str, type, dict[str, Any]]] = [(API_PATH, StagesHandler, {})]
"""What Dask serves from this module (``distributed.http.utils.get_handlers``)."""


def routes_config() -> dict[str, list[str]]:
    """Dask config that adds this module to the scheduler's HTTP routes, for
    ``dask.config.set`` around the creation of a scheduler.

    Dask's config replaces lists rather than merging them, so this is the
    current list with :data:`ROUTES_MODULE` appended (once).

    Example
    -------
    >>> import dask.config
    >>> with dask.config.set(routes_config()):
    ...     dask.config.get(ROUTES_KEY).count(ROUTES_MODULE)
    1
    """
    import dask.config

    current = [str(m) for m in dask.config.get(ROUTES_KEY, default=[]) or []]
    return {ROUTES_KEY: current if ROUTES_MODULE in current else [*current, ROUTES_MODULE]}
