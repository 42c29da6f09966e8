"""The records over HTTP on a real local cluster: /accy/api/stages, /metrics, /accy/stages."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import urllib.request
from pathlib import Path

import dask.config
import prometheus_client
import pytest
from distributed import Client, LocalCluster
from distributed.http.utils import get_handlers
from distributed.utils_test import gen_cluster
from tornado.httpclient import AsyncHTTPClient, HTTPClientError

import accy.dashboard.metrics as metrics
import accy.distributed as ad
from accy.dashboard.api import routes_config
from accy.dashboard.plugin import StageDashboardPlugin, get_dashboard
from accy.distributed.plugin import AccyCachePlugin, get_plugin

sys.path.insert(0, str(Path(__file__).parent))
from fake_batch import PIPELINE, fake_refresh  # noqa: E402

PRELOADED = {"preload": ["accy.distributed"]}

def get(url: str) -> tuple[int, str, str]:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return reply.status, reply.headers.get("Content-Type", ""), reply.read().decode()


@pytest.fixture
def cluster():
    # Dask reads its HTTP routes (here /accy/api/stages) as the scheduler starts.
    with dask.config.set(routes_config()), \
            LocalCluster(processes=False, n_workers=1, threads_per_worker=2,
                         dashboard_address="127.0.0.1:0", **ad.local_cluster_kwargs()) as cluster, \
            Client(cluster) as client:
        yield cluster, client


def test_local_cluster_kwargs_preload_accy():
    kwargs = ad.local_cluster_kwargs()
    assert kwargs["scheduler_kwargs"]["preload"] == ["accy.distributed"]


def test_api_metrics_and_page(cluster):
    cluster, client = cluster
    base = f"http://127.0.0.1:{cluster.scheduler.http_server.port}"
    variants = fake_refresh(client, n_variants=6, scale=0.2, failures=1)
    receipts = [r for v in variants for r in v["stages"]]
    tasks = {s: len({r["key"] for r in receipts if r["stage"] == s and not r["reused"]})
             for s in PIPELINE}
    ran = {s: sum(r["stage"] == s and not r["reused"] and "skipped" not in r for r in receipts)
           for s in PIPELINE}
    reused = {s: sum(r["stage"] == s and r["reused"] for r in receipts) for s in PIPELINE}
    skipped = sum("skipped" in r for r in receipts)
    assert (reused["contract"], reused["kernel"], ran["load"], skipped) == (2, 0, 4, 3)

    status, kind, body = get(base + "/accy/api/stages")
    assert status == 200 and kind.startswith("application/json")
    snap = json.loads(body)
    assert snap["stages"] == list(PIPELINE)
    assert {s: snap["counts"][s]["tasks"] for s in PIPELINE} == tasks
    assert {s: snap["counts"][s]["ran"] for s in PIPELINE} == ran
    assert {s: snap["counts"][s]["reused"] for s in PIPELINE} == reused
    assert snap["counts"]["load"]["skipped"] == skipped  # CUDA loads without a GPU
    assert snap["counts"]["contract"]["reuse_rate"] == pytest.approx(2 / 8)
    assert snap["variants"] == {"ok": 5 + 2, "failed": 1}
    assert (snap["publishes"], snap["publish_conflicts"]) == (1, 1)
    assert snap["pinned_keys"] == len({(r["stage"], r["key"]) for v in variants[1:6]
                                       for r in v["stages"]})
    assert snap["failures"][0]["pipeline"] == "kernel"
    assert snap["failures"][0]["reproducer"].endswith(".mlir")
    assert len(snap["timeline"]) == sum(tasks.values())
    assert {run["worker"] for run in snap["timeline"]} == set(cluster.scheduler.workers)
    assert all(run["stop"] >= run["start"] for run in snap["timeline"])
    assert [v["elapsed_ns"] for v in snap["slowest"]] == \
        sorted((v["elapsed_ns"] for v in variants), reverse=True)
    handler = client.sync(client.scheduler.accy_stages)
    assert {k: v for k, v in handler.items() if k != "time"} == \
        {k: v for k, v in snap.items() if k != "time"}

    status, _, metrics = get(base + "/metrics")
    assert status == 200
    # the stage figures count what the report counts (receipts); tasks are counted apart
    for stage in PIPELINE:
        assert f'accy_stage_runs_total{{stage="{stage}"}} {ran[stage]}.0' in metrics
        assert f'accy_stage_reuses_total{{stage="{stage}"}} {reused[stage]}.0' in metrics
    assert f'accy_tasks_total{{task="contract"}} {tasks["contract"]}.0' in metrics
    assert f'accy_stage_duration_seconds_count{{stage="compile"}} {ran["compile"]}.0' in metrics
    assert 'accy_task_duration_seconds_bucket{le="+Inf",task="compile"}' in metrics
    assert 'accy_stage_failures_total{stage="kernel"} 1.0' in metrics
    assert 'accy_variants_total{status="failed"} 1.0' in metrics
    for name in ("accy_publishes_total", "accy_publish_conflicts_total", "accy_pinned_keys"):
        assert name in metrics

    for _ in range(2):  # each browser session builds its own document
        status, kind, page = get(base + "/accy/stages")
        assert status == 200 and kind.startswith("text/html")
    assert "bokeh" in page and "Bokeh.embed" in page
    assert '<base href="/"' in page
    # Dask's own pages link the stages page.
    assert 'href="accy/stages"' in get(base + "/status")[2]


def test_publishes_are_counted(cluster):
    cluster, client = cluster
    plugin = get_plugin(cluster.scheduler)
    before = plugin.stats["publishes"], plugin.stats["conflicts"]
    version = client.sync(client.scheduler.accy_state, full=False)["version"]
    assert ad.publish(client, version, {}, {}, [])["ok"]
    assert not ad.publish(client, version, {}, {}, [])["ok"]
    snap = client.sync(client.scheduler.accy_stages)
    assert (snap["publishes"], snap["publish_conflicts"]) == (before[0] + 1, before[1] + 1)


def test_the_collector_exposes_the_accy_metrics():
    plugin = StageDashboardPlugin()
    for i, seconds in enumerate((0.002, 0.02, 3.0)):
        plugin.transition(("accy_compile", f"{i:x}"), "processing", "memory", worker="w",
                          startstops=[{"action": "compute", "start": 1.0, "stop": 1.0 + seconds}])
    plugin.record_batch(variants=[
        {"id": "a[target=host]", "status": "ok", "elapsed_ns": 1,
         "stages": [{"stage": "compile", "key": "0", "reused": True, "elapsed_ns": 0}]},
        {"id": "b[target=host]", "status": "failed", "elapsed_ns": 1, "stages": [],
         "failure": {"pipeline": "contract", "pass": "verify", "message": "m",
                     "reproducer": "/r"}}])
    registry = prometheus_client.CollectorRegistry()
    registry.register(metrics.AccyCollector(plugin))
    text = prometheus_client.generate_latest(registry).decode()
    for line in ('accy_tasks_total{task="compile"} 3.0',
                 'accy_task_failures_total{task="compile"} 0.0',
                 'accy_task_duration_seconds_bucket{le="0.0025",task="compile"} 1.0',
                 'accy_task_duration_seconds_bucket{le="5.0",task="compile"} 3.0',
                 'accy_task_duration_seconds_bucket{le="+Inf",task="compile"} 3.0',
                 'accy_task_duration_seconds_count{task="compile"} 3.0',
                 'accy_stage_runs_total{stage="compile"} 0.0',
                 'accy_stage_reuses_total{stage="compile"} 1.0',
                 'accy_stage_failures_total{stage="contract"} 1.0',
                 'accy_variants_total{status="ok"} 1.0',
                 'accy_variants_total{status="failed"} 1.0',
                 "accy_publishes_total 0.0", "accy_publish_conflicts_total 0.0",
                 "accy_pinned_keys 0.0"):
        assert line in text
    assert 'accy_task_duration_seconds_sum{task="compile"} 3.022' in text


def test_metrics_register_once_per_process():
    assert metrics.register_metrics() and metrics.register_metrics()
    ours = [c for c in prometheus_client.REGISTRY._collector_to_names
            if isinstance(c, metrics.AccyCollector)]
    assert len(ours) == 1
    # Another registration (e.g. this module imported anew) is refused quietly.
    registry = prometheus_client.CollectorRegistry()
    assert metrics.register_metrics(registry) and metrics.register_metrics(registry)


@gen_cluster(client=True, nthreads=[("127.0.0.1", 1)], scheduler_kwargs=PRELOADED,
             config=routes_config())
async def test_without_a_dashboard_the_api_still_answers(c, s, a):
    base = f"http://127.0.0.1:{s.http_server.port}"
    await c.submit(sum, [1, 2], key=("accy_contract", "ab" * 16))
    reply = await AsyncHTTPClient().fetch(base + "/accy/api/stages")
    assert json.loads(reply.body)["counts"]["contract"]["tasks"] == 1
    with pytest.raises(HTTPClientError) as error:
        await AsyncHTTPClient().fetch(base + "/accy/stages")
    assert error.value.code == 404


class FakeHTTP:
    def __init__(self) -> None:
        from distributed.dashboard.core import DaskBokehTornado

        # Dask's dashboard under a prefix (what add_page looks for).
        self.applications: list = [DaskBokehTornado({}, prefix="/dask")]


class FakeScheduler:
    def __init__(self) -> None:
        self.handlers: dict = {}
        self.plugins: dict = {}
        self.metadata: dict = {}
        self.http_application = FakeHTTP()

    def set_metadata(self, keys, value) -> None:
        self.metadata[tuple(keys)] = value


def test_a_broken_dashboard_does_not_stop_the_plugin(monkeypatch, caplog):
    import accy.dashboard.page as page

    def broken(*args, **kwargs):
        raise RuntimeError("no page today")

    scheduler = FakeScheduler()
    monkeypatch.setattr(page, "add_page", broken)
    with caplog.at_level(logging.WARNING):
        asyncio.run(AccyCachePlugin().start(scheduler))
        asyncio.run(StageDashboardPlugin().start(scheduler))
    assert "could not add the /accy/stages page" in caplog.text
    # The API still comes (from the route config), under the dashboard's prefix.
    assert [route[0] for route in get_handlers(scheduler, ["accy.dashboard.api"], "/dask")] == [
        "/dask/accy/api/stages"]
    assert {"accy_record_batch", "accy_stages", "accy_publish"} <= set(scheduler.handlers)

    caplog.clear()
    monkeypatch.setattr(metrics, "register_metrics", broken)
    other = FakeScheduler()
    with caplog.at_level(logging.WARNING):
        asyncio.run(AccyCachePlugin().start(other))
        asyncio.run(StageDashboardPlugin().start(other))
    assert "could not register the Prometheus metrics" in caplog.text
    assert "accy_stages" in other.handlers


def test_the_live_page_redraws_only_when_the_records_move():
    from types import SimpleNamespace

    from accy.dashboard.page import LiveStages

    plugin = StageDashboardPlugin()
    page = LiveStages(SimpleNamespace(plugins={plugin.name: plugin}), get_dashboard)
    page.update()
    rates = page.dashboard.rates
    assert rates.source.data["stage"] == []
    plugin.record_batch(variants=[{"id": "a[target=host]", "status": "ok", "elapsed_ns": 1,
                                   "stages": [{"stage": "tensor", "key": "1", "reused": True,
                                               "elapsed_ns": 0}]}])
    page.update()
    assert rates.source.data["stage"] == ["tensor"] and rates.source.data["reuse_rate"] == [1.0]
    drawn = rates.source.data
    page.update()  # nothing new: the sources stay as they are
    assert rates.source.data is drawn
    assert LiveStages(SimpleNamespace(plugins={}), get_dashboard).update() is None  # no plugin


def test_metrics_count_what_a_real_batch_reports(cluster, tmp_path):
    """A real batch (fused chain tasks on the cluster): /metrics' stage runs and reuses
    are the report's, stage by stage, and its tasks are counted apart."""
    import os

    from accy.distributed.batch import _record, run_batch
    from accy.sweep import load_sweep

    cluster, client = cluster
    graphs = os.path.join(os.path.dirname(__file__), "..", "..", "graphs")
    sweep = tmp_path / "s.yaml"
    # shapes no other test of this process uses (in-process workers keep what they loaded)
    sweep.write_text(f"programs: [{graphs}/softmax.mlir]\n"
                     "shapes: [{arg0: 6x96}, {arg0: 10x96}]\n"
                     "options: {kernel.block_size: [128, 256]}\n")
    variants = load_sweep(str(sweep))
    ran: dict[str, int] = {}
    reused: dict[str, int] = {}
    for _ in range(2):  # the second batch reuses everything
        result = run_batch(client, variants)
        assert {o.status for o in result.outcomes} == {"ok"}
        _record(client, result)
        for o in result.outcomes:
            for r in o.to_json()["stages"]:
                into = reused if r["reused"] else ran if "skipped" not in r else {}
                into[r["stage"]] = into.get(r["stage"], 0) + 1
    assert sum(ran.values()) > 0 and sum(reused.values()) > 0
    base = f"http://127.0.0.1:{cluster.scheduler.http_server.port}"
    text = get(base + "/metrics")[2]
    for stage in set(ran) | set(reused):
        assert f'accy_stage_runs_total{{stage="{stage}"}} {ran.get(stage, 0)}.0' in text
        assert f'accy_stage_reuses_total{{stage="{stage}"}} {reused.get(stage, 0)}.0' in text
    assert "accy_tasks_total{task=" in text
