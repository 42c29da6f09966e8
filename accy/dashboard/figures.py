"""Bokeh figures of a stage-records snapshot, shared by the live page and the HTML report.

Each panel is a Dask dashboard component: a ``source`` (a
``ColumnDataSource``), a ``root`` (the Bokeh model to show) and
``update(snapshot)``, which refills the source from a
:meth:`accy.dashboard.records.StageRecords.snapshot` dict. The live page
(:mod:`accy.dashboard.page`) calls ``update`` every second; the report
(:mod:`accy.dashboard.report`) calls it once.

Panels: :class:`Summary` (one line of totals), :class:`StageDurations`
(box and whiskers per stage, log scale, with the samples as dots),
:class:`StageRates` (reused / ran / skipped fractions of the receipts, stacked),
:class:`StageTimeline` (task runs per worker, coloured by stage),
:class:`SlowestVariants` and :class:`RecentFailures` (tables);
:class:`StagesDashboard` lays them all out.

Example
-------
>>> from accy.dashboard.records import snapshot_from_variants
>>> board = StagesDashboard()
>>> board.update(snapshot_from_variants([{"id": "a[target=host]", "status": "ok", "stages": [
...     {"stage": "contract", "key": "01", "reused": False, "elapsed_ns": 2_000_000}]}]))
>>> board.durations.source.data["stage"]
['contract']
"""

from __future__ import annotations

import html
import math
import time
from collections.abc import Mapping
from typing import Any

from bokeh.layouts import column, row
from bokeh.models import (
    ColumnDataSource,
    CustomJSTickFormatter,
    FactorRange,
    FixedTicker,
    HoverTool,
    Range1d,
)
from bokeh.models.annotations import Title
from bokeh.models.renderers import DataRenderer
from bokeh.models.widgets import DataTable, Div, StringFormatter, TableColumn
from bokeh.plotting import figure
from bokeh.transform import jitter

from accy.dashboard.records import STAGES

STAGE_COLORS = dict(zip(STAGES, ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b",
                                 "#e377c2", "#bcbd22", "#17becf")))
"""One colour per stage (red and grey stay free for errors and "skipped")."""
OTHER_COLOR = "#7f7f7f"
ERROR_COLOR = "#d62728"
RATE_COLORS = {"reused": "#2ca02c", "ran": "#ff7f0e", "skipped": "#c7c7c7"}
MAX_DOTS = 300
"""Samples drawn as dots per stage (the most recent); the boxes use all."""
MIN_SECONDS = 1e-6
"""Durations are clamped to this on the log axis."""
SECONDS_TICKS_JS = """
    if (tick >= 1) return `${+tick.toPrecision(3)} s`;
    if (tick >= 1e-3) return `${+(tick * 1e3).toPrecision(3)} ms`;
    return `${+(tick * 1e6).toPrecision(3)} µs`;
"""


def format_seconds(seconds: float | None) -> str:
    """A duration for people.

    Example
    -------
    >>> format_seconds(0.000412), format_seconds(0.0123), format_seconds(2.5), format_seconds(None)
    ('412 µs', '12.3 ms', '2.50 s', '—')
    """
    if seconds is None:
        return "—"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s"


def seconds_ticks(lo: float, hi: float) -> list[float]:
    """Log-axis ticks covering ``[lo, hi]``: 1-2-5 per decade over a few decades,
    whole decades beyond.

    Example
    -------
    >>> seconds_ticks(0.0015, 0.09)
    [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1]
    """
    first = math.floor(math.log10(max(lo, MIN_SECONDS)))
    last = math.ceil(math.log10(max(hi, lo, MIN_SECONDS)))
    mantissas = (1, 2, 5) if last - first <= 3 else (1,)
    ticks = [float(f"{m}e{e}") for e in range(first, last + 1) for m in mantissas]
    below = [t for t in ticks if t <= lo]
    above = [t for t in ticks if t >= hi]
    return [t for t in ticks if (not below or t >= below[-1]) and (not above or t <= above[0])]


def stage_color(stage: str) -> str:
    return STAGE_COLORS.get(stage, OTHER_COLOR)


def _short_worker(address: str | None) -> str:
    if not address:
        return "?"
    return address.split("://", 1)[-1]


def _plural(n: int, one: str, many: str) -> str:
    return one if n == 1 else many


def _clock(t: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t)) if t else ""


class Summary:
    """One line of totals: variants, tasks, publishes, pinned keys, retention."""

    def __init__(self) -> None:
        self.source = None
        self.root = Div(text="", sizing_mode="stretch_width", styles={"font-size": "14px"})

    def update(self, snapshot: Mapping[str, Any]) -> None:
        variants = snapshot.get("variants", {})
        counts = snapshot.get("counts", {})
        tasks = sum(c.get("tasks", 0) for c in counts.values())
        errors = sum(c.get("task_errors", 0) for c in counts.values())
        ran = sum(c.get("ran", 0) for c in counts.values())
        reused = sum(c.get("reused", 0) for c in counts.values())
        retained = snapshot.get("retained", {})
        parts = [
            f"<b>{sum(variants.values())}</b> variants "
            f"({variants.get('ok', 0)} ok, <span style='color:{ERROR_COLOR}'>"
            f"{sum(n for s, n in variants.items() if s != 'ok')} failed</span>)",
            f"<b>{ran}</b> stage runs, <b>{reused}</b> reused",
            f"<b>{tasks}</b> stage tasks" + (f" ({errors} erred)" if errors else ""),
            f"<b>{snapshot.get('publishes', 0)}</b> "
            f"{_plural(snapshot.get('publishes', 0), 'publish', 'publishes')} "
            f"({snapshot.get('publish_conflicts', 0)} "
            f"{_plural(snapshot.get('publish_conflicts', 0), 'conflict', 'conflicts')})",
        ]
        if snapshot.get("pinned_keys") is not None:
            parts.append(f"<b>{snapshot['pinned_keys']}</b> pinned keys")
        if retained:
            parts.append(f"keeping {retained.get('stage_runs', 0)} runs, "
                         f"{retained.get('variants', 0)} variants (limit {retained.get('limit')})")
        self.root.text = "<h2 style='margin:4px 0'>accy stages</h2>" + " &middot; ".join(parts)


class StageDurations:
    """Box (quartiles) and whiskers (min–max) of each stage's durations, log scale."""

    def __init__(self, height: int = 300) -> None:
        self.source = ColumnDataSource({k: [] for k in (
            "stage", "q1", "median", "q3", "lo", "hi", "n", "color",
            "median_text", "p95_text", "max_text")})
        self.dots = ColumnDataSource({"stage": [], "seconds": [], "color": []})
        # Typed handles on the models that update() changes.
        self.x_range = FactorRange()
        self.ticker = FixedTicker(ticks=seconds_ticks(1e-3, 1.0))
        self.title = Title(text="Stage durations (log scale; box: quartiles, whiskers: min–max)")
        fig = figure(title=self.title, x_range=self.x_range, y_axis_type="log", height=height,
                     sizing_mode="stretch_width", tools="", toolbar_location=None)
        fig.segment(x0="stage", y0="lo", x1="stage", y1="hi", source=self.source,
                    line_color="black", line_width=1)
        for end in ("lo", "hi"):
            fig.scatter(x="stage", y=end, source=self.source, marker="dash", size=14,
                        line_color="black")
        boxes = fig.vbar(x="stage", width=0.6, bottom="q1", top="q3", source=self.source,
                         fill_color="color", fill_alpha=0.55, line_color="black")
        fig.scatter(x="stage", y="median", source=self.source, marker="dash", size=34,
                    line_color="black", line_width=2)
        fig.scatter(x=jitter("stage", width=0.45, range=fig.x_range), y="seconds",
                    source=self.dots, size=3, color="color", alpha=0.35)
        fig.add_tools(HoverTool(renderers=[boxes], tooltips=[
            ("stage", "@stage"), ("runs", "@n"), ("median", "@median_text"),
            ("p95", "@p95_text"), ("max", "@max_text")]))
        fig.yaxis.ticker = self.ticker
        fig.yaxis.formatter = CustomJSTickFormatter(code=SECONDS_TICKS_JS)
        fig.xgrid.grid_line_color = None
        self.figure = self.root = fig

    def update(self, snapshot: Mapping[str, Any]) -> None:
        durations = snapshot.get("durations", {})
        stages = [s for s in snapshot.get("stages", []) if s in durations]
        data: dict[str, list[Any]] = {k: [] for k in self.source.data}
        dots: dict[str, list[Any]] = {"stage": [], "seconds": [], "color": []}
        for stage in stages:
            d = durations[stage]
            data["stage"].append(stage)
            for name, field in (("q1", "q1"), ("median", "median"), ("q3", "q3"),
                                ("lo", "min"), ("hi", "max")):
                data[name].append(max(d[field], MIN_SECONDS))
            data["n"].append(d["n"])
            data["color"].append(stage_color(stage))
            data["median_text"].append(format_seconds(d["median"]))
            data["p95_text"].append(format_seconds(d["p95"]))
            data["max_text"].append(format_seconds(d["max"]))
            samples = d.get("samples", [])[-MAX_DOTS:]
            dots["stage"] += [stage] * len(samples)
            dots["seconds"] += [max(x, MIN_SECONDS) for x in samples]
            dots["color"] += [stage_color(stage)] * len(samples)
        if list(self.x_range.factors) != stages:
            self.x_range.factors = stages
        if data["lo"]:
            ticks = seconds_ticks(min(data["lo"]), max(data["hi"]))
            if list(self.ticker.ticks) != ticks:
                self.ticker.ticks = ticks
        source = snapshot.get("duration_source", "tasks")
        self.title.text = (
            f"Stage durations from {'cluster tasks' if source == 'tasks' else 'receipts'} "
            "(log scale; box: quartiles, whiskers: min–max)")
        self.source.data = data
        self.dots.data = dots


class StageRates:
    """Reused / ran (miss) / skipped as fractions of each stage's receipts, stacked."""

    FIELDS = ("reuse_rate", "miss_rate", "skip_rate")

    def __init__(self, height: int = 300) -> None:
        self.source = ColumnDataSource({k: [] for k in (
            "stage", *self.FIELDS, "ran", "reused", "skipped", "tasks", "receipts")})
        self.x_range = FactorRange()
        # Room above the bars for the legend.
        y_range = Range1d(start=0, end=1.22)
        fig = figure(title="Reuse and miss rate per stage (fraction of receipts)",
                     x_range=self.x_range, y_range=y_range, height=height,
                     sizing_mode="stretch_width", tools="", toolbar_location=None)
        bars = fig.vbar_stack(
            list(self.FIELDS), x="stage", width=0.7, source=self.source,
            color=[RATE_COLORS["reused"], RATE_COLORS["ran"], RATE_COLORS["skipped"]],
            legend_label=["reused", "ran (miss)", "skipped"])
        stacked: list[DataRenderer] = [*bars]
        fig.add_tools(HoverTool(renderers=stacked, tooltips=[
            ("stage", "@stage"), ("receipts", "@receipts"), ("reused", "@reused"),
            ("ran", "@ran"), ("skipped", "@skipped"), ("cluster tasks", "@tasks")]))
        legend = fig.legend[0]
        legend.location = "top_right"
        legend.orientation = "horizontal"
        # Bokeh 3.9's stub types Legend.padding as the Property descriptor
        # (``Padding = Property[PaddingType]``), not its value: a stub bug.
        legend.padding = 2  # type: ignore[assignment]
        fig.yaxis.ticker = FixedTicker(ticks=[0, 0.2, 0.4, 0.6, 0.8, 1.0])
        fig.xgrid.grid_line_color = None
        self.figure = self.root = fig

    def update(self, snapshot: Mapping[str, Any]) -> None:
        counts = snapshot.get("counts", {})
        stages = [s for s in snapshot.get("stages", []) if s in counts]
        data: dict[str, list[Any]] = {k: [] for k in self.source.data}
        for stage in stages:
            c = counts[stage]
            data["stage"].append(stage)
            for field in (*self.FIELDS, "ran", "reused", "skipped", "tasks", "receipts"):
                data[field].append(c.get(field, 0))
        if list(self.x_range.factors) != stages:
            self.x_range.factors = stages
        self.source.data = data


class StageTimeline:
    """Every recorded task run on its worker's lane, coloured by stage; transfers
    as thin grey bars under them; erred runs outlined in red."""

    def __init__(self, height: int = 250) -> None:
        self.source = ColumnDataSource({k: [] for k in (
            "worker", "left", "right", "stage", "key", "color", "line", "duration_text",
            "status")})
        self.transfers = ColumnDataSource({"worker": [], "left": [], "right": []})
        self.y_range = FactorRange()
        self.title = Title(text="Stage runs per worker")
        fig = figure(title=self.title, y_range=self.y_range,
                     height=height, sizing_mode="stretch_width",
                     tools="xpan,xwheel_zoom,reset", toolbar_location="above")
        fig.hbar(y="worker", left="left", right="right", height=0.15, source=self.transfers,
                 color="#999999")
        runs = fig.hbar(y="worker", left="left", right="right", height=0.7, source=self.source,
                        fill_color="color", line_color="line", legend_field="stage")
        fig.add_tools(HoverTool(renderers=[runs], tooltips=[
            ("stage", "@stage"), ("key", "@key"), ("worker", "@worker"),
            ("duration", "@duration_text"), ("status", "@status")]))
        _legend_above(fig)
        fig.ygrid.grid_line_color = None
        self.figure = self.root = fig

    def update(self, snapshot: Mapping[str, Any]) -> None:
        timeline = sorted(snapshot.get("timeline", []), key=lambda r: r["start"])
        t0 = timeline[0]["start"] if timeline else 0.0
        data: dict[str, list[Any]] = {k: [] for k in self.source.data}
        transfers: dict[str, list[Any]] = {"worker": [], "left": [], "right": []}
        workers: list[str] = []
        for run in timeline:
            worker = _short_worker(run.get("worker"))
            if worker not in workers:
                workers.append(worker)
            data["worker"].append(worker)
            data["left"].append(run["start"] - t0)
            data["right"].append(max(run["stop"], run["start"]) - t0)
            data["stage"].append(run["stage"])
            data["key"].append(run["key"])
            data["color"].append(stage_color(run["stage"]))
            erred = run.get("status") != "ok"
            data["line"].append(ERROR_COLOR if erred else "white")
            data["duration_text"].append(format_seconds(run.get("duration")))
            data["status"].append(run.get("status", "ok"))
            for begin, end in run.get("transfers", []):
                transfers["worker"].append(worker)
                transfers["left"].append(begin - t0)
                transfers["right"].append(end - t0)
        workers.sort()
        if list(self.y_range.factors) != workers:
            self.y_range.factors = workers
        self.title.text = (
            f"Stage runs per worker (last {len(timeline)} tasks)" if timeline else
            "Stage runs per worker (no cluster tasks recorded)")
        self.figure.xaxis.axis_label = (f"seconds since {_clock(t0)}" if timeline else "seconds")
        self.source.data = data
        self.transfers.data = transfers


def _legend_above(fig: Any) -> None:
    """Move the figure's legend out of the plot area, above it, in one line."""
    legend = fig.legend[0]
    legend.orientation = "horizontal"
    legend.location = "top_left"
    legend.padding = 2
    legend.margin = 0
    legend.border_line_alpha = 0
    fig.center.remove(legend)
    fig.add_layout(legend, "above")


class _Table:
    """A titled DataTable."""

    COLUMNS: tuple[tuple[str, str, int], ...] = ()
    TITLE = ""

    def __init__(self, height: int = 210) -> None:
        self.source = ColumnDataSource({field: [] for field, _, _ in self.COLUMNS})
        self.table = DataTable(
            source=self.source, height=height, sizing_mode="stretch_width", index_position=None,
            columns=[TableColumn(field=f, title=t, width=w, formatter=StringFormatter())
                     for f, t, w in self.COLUMNS])
        self.title = Div(text=f"<b>{html.escape(self.TITLE)}</b>")
        self.root = column(self.title, self.table, sizing_mode="stretch_width")


class SlowestVariants(_Table):
    """The slowest variants (whole refresh time), slowest first."""

    TITLE = "Slowest variants"
    COLUMNS = (("id", "variant", 560), ("status", "status", 60), ("elapsed", "elapsed", 90),
               ("ran", "stages ran", 80), ("reused", "stages reused", 90),
               ("when", "finished", 80))

    def update(self, snapshot: Mapping[str, Any]) -> None:
        rows = snapshot.get("slowest", [])
        self.source.data = {
            "id": [r["id"] for r in rows], "status": [r["status"] for r in rows],
            "elapsed": [format_seconds(r["elapsed_ns"] / 1e9) for r in rows],
            "ran": [str(r["stages_ran"]) for r in rows],
            "reused": [str(r["stages_reused"]) for r in rows],
            "when": [_clock(r.get("time")) for r in rows],
        }
        self.title.text = f"<b>{html.escape(self.TITLE)}</b> (top {len(rows)})"


class RecentFailures(_Table):
    """The most recent failed variants: where they failed and their reproducer."""

    TITLE = "Recent failures"
    COLUMNS = (("when", "when", 70), ("id", "variant", 400), ("pipeline", "pipeline", 80),
               ("pass", "pass", 130), ("message", "message", 380),
               ("reproducer", "reproducer", 300))

    def update(self, snapshot: Mapping[str, Any]) -> None:
        rows = snapshot.get("failures", [])
        self.source.data = {
            "when": [_clock(r.get("time")) for r in rows], "id": [r["id"] for r in rows],
            "pipeline": [r.get("pipeline") or "" for r in rows],
            "pass": [r.get("pass") or "" for r in rows],
            "message": [(r.get("message") or "").splitlines()[0] if r.get("message") else ""
                        for r in rows],
            "reproducer": [r.get("reproducer") or "" for r in rows],
        }
        self.title.text = f"<b>{html.escape(self.TITLE)}</b> ({len(rows)})"


class StagesDashboard:
    """Every panel, laid out: totals; durations and rates; the timeline; the tables."""

    def __init__(self) -> None:
        self.summary = Summary()
        self.durations = StageDurations()
        self.rates = StageRates()
        self.timeline = StageTimeline()
        self.slowest = SlowestVariants()
        self.failures = RecentFailures()
        self.panels = (self.summary, self.durations, self.rates, self.timeline,
                       self.slowest, self.failures)
        self.source = self.durations.source
        self.root = column(
            self.summary.root,
            row(self.durations.root, self.rates.root, sizing_mode="stretch_width"),
            self.timeline.root,
            self.slowest.root,
            self.failures.root,
            sizing_mode="stretch_width",
        )

    def update(self, snapshot: Mapping[str, Any]) -> None:
        for panel in self.panels:
            panel.update(snapshot)
