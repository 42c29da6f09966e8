"""The live ``/accy/stages`` page inside the Dask dashboard.

The scheduler plugin adds it on start (:func:`add_page`) when the scheduler
runs Dask's Bokeh dashboard: a Bokeh application served by the dashboard's
own HTTP server, with Dask's navigation bar (and an "Accy/Stages" entry added
to it on every dashboard page). Its panels are the shared figures of
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
from typing import TYPE_CHECKING, Any

from accy.dashboard.figures import StagesDashboard

if TYPE_CHECKING:
    from bokeh.document import Document
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


class LiveStages:
    """The page's component: Dask's ``source`` + ``root`` + ``update()`` triple,
    refilling a :class:`StagesDashboard` from the scheduler's plugin."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.dashboard = StagesDashboard()
        self.source = self.dashboard.source
        self.root = self.dashboard.root
        self._seen: tuple[int, int, int] | None = None

    def update(self) -> None:
        from accy.distributed.plugin import get_plugin

        plugin = get_plugin(self.scheduler)
        if plugin is None:
            return
        pinned = len(plugin.pinned_keys)
        seen = (id(plugin), plugin.records.generation, pinned)
        if seen == self._seen:
            return  # nothing new: leave the browser alone
        self._seen = seen
        self.dashboard.update(plugin.stages())


def stages_doc(scheduler: Scheduler, extra: dict[str, Any], doc: Document) -> None:
    """Bokeh document function of ``/accy/stages`` (called once per browser session)."""
    from distributed.dashboard.components import add_periodic_callback
    from distributed.dashboard.components.scheduler import BOKEH_THEME

    try:
        page = LiveStages(scheduler)
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

    Dask memoizes them per scheduler and every dashboard page shares the same
    ``pages`` list, so appending to it links this page from all of them.
    """
    try:
        from distributed.dashboard.scheduler import template_variables

        variables = template_variables(scheduler)
        pages = variables.get("pages")
        if isinstance(pages, list) and NAV_ENTRY not in pages:
            pages.append(NAV_ENTRY)
        return variables
    except Exception:
        logger.warning("accy: could not link %s from Dask's navigation bar", PAGE_PATH,
                       exc_info=True)
        return {"pages": [NAV_ENTRY], "plots": []}


def add_page(scheduler: Scheduler, prefix: str = "") -> bool:
    """Serve ``/accy/stages`` (under the dashboard's ``prefix``) from this scheduler.

    Returns False (and adds nothing) when the scheduler has no Bokeh
    dashboard; raises when Bokeh or Dask refuse the application (the plugin
    catches and logs it).
    """
    from tornado.ioloop import IOLoop

    http_application = getattr(scheduler, "http_application", None)
    if http_application is None:
        return False
    try:
        from distributed.dashboard.core import BokehApplication
    except ImportError:  # no (compatible) bokeh: Dask runs without a dashboard too
        return False
    app = BokehApplication({PAGE_PATH: stages_doc}, scheduler, prefix=prefix or "/",
                           template_variables=dask_template_variables(scheduler))
    http_application.add_application(app)
    app.initialize(IOLoop.current())
    app.start()  # keep-alive pings and the cleanup of closed sessions, as Dask's own
    return True
