"""The live ``/accy/stages`` page inside the Dask dashboard.

The dashboard plugin adds it on start (:func:`add_page`) when the scheduler
runs Dask's Bokeh dashboard: a Bokeh application served by the dashboard's
own HTTP server (``http_application.add_application``, as Dask's
``distributed.dashboard.scheduler.connect`` adds its own), under the
dashboard's prefix, with Dask's navigation bar and an "accy/stages" entry in
it (:func:`dask_template_variables`). Its panels are the shared figures of
:mod:`accy.dashboard.figures`; this module only adds the live update: every
second the page reads the plugin's records and, when they moved, refills the
figures from a fresh snapshot.

Example
-------
>>> from distributed import LocalCluster
>>> import urllib.request
>>> with LocalCluster(processes=False, n_workers=1, dashboard_address="127.0.0.1:0",
...                   scheduler_kwargs={"preload": ["accy.distributed"]}) as cluster:
...     url = f"http://127.0.0.1:{cluster.scheduler.http_server.port}{PAGE_PATH}"
...     urllib.request.urlopen(url).status
200
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from accy.dashboard.figures import StagesDashboard
from accy.dashboard.records import StageRecords

if TYPE_CHECKING:
    from bokeh.document import Document
    from bokeh.server.server import BokehTornado
    from distributed import Scheduler
    from jinja2 import Template

logger = logging.getLogger("accy.dashboard")

PAGE_PATH = "/accy/stages"
NAV_ENTRY = "accy/stages"
"""The entry added to Dask's navigation bar (relative, like Dask's own)."""
UPDATE_MS = 1000

_PAGE_TEMPLATE = """{% extends "accy-base.html" %}
{% block content %}
{{ plot_div }}
{{ plot_script }}
{% endblock %}
"""


class StagesSource(Protocol):
    """What the page reads (:class:`accy.dashboard.plugin.StageDashboardPlugin`)."""

    records: StageRecords

    def stages(self, comm: Any = None) -> dict[str, Any]: ...

    def cache_counts(self) -> dict[str, int]: ...


FindSource = Callable[[Any], "StagesSource | None"]
"""Finds a scheduler's source (``accy.dashboard.plugin.get_dashboard``)."""


class LiveStages:
    """The page's component: Dask's ``source`` + ``root`` + ``update()`` triple,
    refilling a :class:`StagesDashboard` from the scheduler's dashboard plugin
    (found with ``find``, on every update: a restarted plugin is picked up)."""

    def __init__(self, scheduler: Any, find: FindSource) -> None:
        self.scheduler = scheduler
        self.find = find
        self.dashboard = StagesDashboard()
        self.source = self.dashboard.source
        self.root = self.dashboard.root
        self._seen: tuple[Any, ...] | None = None

    def update(self) -> None:
        plugin = self.find(self.scheduler)
        if plugin is None:
            return
        seen = (id(plugin), plugin.records.generation, *plugin.cache_counts().values())
        if seen == self._seen:
            return  # nothing new: leave the browser alone
        self._seen = seen
        self.dashboard.update(plugin.stages())


def stages_doc(find: FindSource, scheduler: Scheduler, extra: dict[str, Any],
               doc: Document) -> None:
    """Bokeh document function of ``/accy/stages`` (called once per browser session)."""
    from distributed.dashboard.components import add_periodic_callback
    from distributed.dashboard.components.scheduler import BOKEH_THEME

    try:
        page = LiveStages(scheduler, find)
        page.update()
        add_periodic_callback(doc, page, UPDATE_MS)
        doc.title = "Dask: accy stages"
        doc.add_root(page.root)
        doc.template = page_template()
        doc.template_variables.update(extra)
        root = "/".join(["", *filter(None, str(extra.get("prefix", "")).split("/")), ""])
        doc.template_variables["accy_base"] = root
        doc.theme = BOKEH_THEME
    except Exception:
        logger.warning("accy: the stages page failed to build", exc_info=True)
        raise


@functools.cache
def page_template() -> Template:
    """Dask's dashboard template with a ``<base href>`` (the dashboard's root) first in its head.

    Dask's pages live one level deep (``/status``) and its template links
    statics, Bokeh's scripts and the other pages relatively; this page lives
    at ``/accy/stages``, so the base element points those links back at the
    dashboard's root.
    """
    import jinja2
    from distributed.dashboard.components.scheduler import env as dask_env

    if dask_env.loader is None:
        raise RuntimeError("Dask's dashboard templates have no loader")
    base, _, _ = dask_env.loader.get_source(dask_env, "base.html")
    if "<head>" in base:
        base = base.replace("<head>", '<head>\n    <base href="{{ accy_base }}" />', 1)
    else:
        logger.warning("accy: Dask's dashboard template has no <head>; the page's "
                       "navigation links may be broken")
    env = jinja2.Environment(loader=jinja2.DictLoader(
        {"accy-base.html": base, "accy-stages.html": _PAGE_TEMPLATE}), autoescape=False)
    return env.get_template("accy-stages.html")


def dask_template_variables(scheduler: Scheduler) -> dict[str, Any]:
    """Dask's navigation variables for this scheduler, with the page's entry added.

    ``distributed.dashboard.scheduler.template_variables`` is public, but Dask
    offers no hook to add a page to the navigation bar: this relies on it
    being memoized per scheduler, so that every dashboard page shares the
    ``pages`` list it returns and appending to it links this page from all of
    them. Should that change, only the link goes (the page still works).
    """
    try:
        from distributed.dashboard.scheduler import template_variables

        variables: dict[str, Any] = template_variables(scheduler)
        pages = variables.get("pages")
        if isinstance(pages, list) and NAV_ENTRY not in pages:
            pages.append(NAV_ENTRY)
        return variables
    except Exception:
        logger.warning("accy: could not link %s from Dask's navigation bar", PAGE_PATH,
                       exc_info=True)
        return {"pages": [NAV_ENTRY], "plots": []}


def dask_dashboard(scheduler: Scheduler) -> BokehTornado | None:
    """Dask's Bokeh dashboard application on ``scheduler``'s HTTP server, or None
    (no dashboard, or no compatible Bokeh)."""
    try:
        from distributed.dashboard.core import DaskBokehTornado
    except ImportError:  # no (compatible) bokeh: Dask runs without a dashboard too
        return None
    for app in scheduler.http_application.applications:
        if isinstance(app, DaskBokehTornado):
            return app
    return None


def add_page(scheduler: Scheduler, find: FindSource) -> bool:
    """Serve ``/accy/stages`` from this scheduler's dashboard, under its prefix,
    drawing what ``find(scheduler)`` records.

    Returns False (and adds nothing) when the scheduler runs no Bokeh
    dashboard; raises when Bokeh or Dask refuse the application (the plugin
    catches and logs it).
    """
    from distributed.dashboard.core import BokehApplication
    from tornado.ioloop import IOLoop

    dashboard = dask_dashboard(scheduler)
    if dashboard is None:
        logger.debug("accy: the scheduler runs no Bokeh dashboard; no %s page", PAGE_PATH)
        return False
    prefix = (dashboard.prefix or "").rstrip("/")
    app = BokehApplication({PAGE_PATH: functools.partial(stages_doc, find)}, scheduler,
                           prefix=prefix or "/",
                           template_variables=dask_template_variables(scheduler))
    scheduler.http_application.add_application(app)
    app.initialize(IOLoop.current())
    app.start()  # keep-alive pings and the cleanup of closed sessions, as Dask's own
    return True
