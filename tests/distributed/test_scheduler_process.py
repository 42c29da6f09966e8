"""The scheduler of accy's local cluster runs in a process of its own (real processes)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from distributed import Client

from accy.distributed.batch import run_batch
from accy.distributed.local import local_cluster
from accy.distributed.scheduler_process import SchedulerProcess
from accy.sweep import Variant

GRAPHS = Path(__file__).resolve().parents[2] / "graphs"

pytestmark = pytest.mark.slow


def _scheduler_facts(dask_scheduler=None) -> dict:
    import dask.config

    from accy.distributed.plugin import PLUGIN_NAME

    return {"pid": os.getpid(), "plugin": PLUGIN_NAME in dask_scheduler.plugins,
            "saturation": dask.config.get("distributed.scheduler.worker-saturation"),
            "routes": dask.config.get("distributed.scheduler.http.routes")}


def test_the_scheduler_runs_in_its_own_process_with_accys_config_and_plugin(tmp_path):
    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the scheduler cannot import it
    with local_cluster(2, devices=[]) as cluster, Client(cluster) as client:
        assert isinstance(cluster.scheduler, SchedulerProcess)
        pid = cluster.scheduler.pid
        facts = client.run_on_scheduler(_scheduler_facts)
        assert facts["pid"] == pid != os.getpid()
        assert facts["plugin"]  # accy preloaded there: the cache plugin answers
        assert float(facts["saturation"]) == 1.1  # the batch configuration reached it
        assert "accy.dashboard.api" in facts["routes"]
        folder = cluster.scheduler.folder
        assert folder is not None and os.stat(folder).st_mode & 0o777 == 0o700
        client.wait_for_workers(2)
        # the nannies (on this process's event loop) do their own chores less often; their
        # workers keep Dask's intervals
        from accy.distributed.local import NANNY_CHORES_MS

        for nanny in cluster.workers.values():
            assert nanny.periodic_callbacks["tick"].callback_time == NANNY_CHORES_MS["tick"]
            assert nanny.periodic_callbacks["monitor"].callback_time == NANNY_CHORES_MS["monitor"]
        ticks = client.run(_tick_ms)
        assert sorted(ticks.values()) == [20, 20]
        # each worker process runs under accy's GC policy (frozen start, higher thresholds)
        from accy.distributed import WORKER_GC_THRESHOLDS

        gcs = client.run(_gc_facts)
        assert len(gcs) == 2 and all(t == list(WORKER_GC_THRESHOLDS) and frozen > 0
                                     for t, frozen in gcs.values())
        # a batch through it: published there, so the second one reuses every stage
        v = Variant(str(GRAPHS / "softmax.mlir"), "host", {0: (4, 8)}, {})
        first = run_batch(client, [v], store_url=str(tmp_path / "store"))
        again = run_batch(client, [v], store_url=str(tmp_path / "store"))
        assert [o.status for o in first.outcomes + again.outcomes] == ["ok", "ok"]
        assert again.report()["summary"]["stage_runs"] == 0
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert not os.path.exists(folder)


def _tick_ms(dask_worker: Any) -> float:
    return float(dask_worker.periodic_callbacks["tick"].callback_time)


def _gc_facts() -> tuple[list[int], int]:
    import gc

    return list(gc.get_threshold()), gc.get_freeze_count()


def test_in_process_clusters_keep_the_scheduler_in_process():
    before = _gc_facts()
    with local_cluster(2, devices=[], processes=False) as cluster:
        assert not isinstance(cluster.scheduler, SchedulerProcess)
        assert cluster.scheduler.plugins  # a Scheduler object of this process
    assert _gc_facts() == before  # a process that only hosts workers keeps its GC policy


def test_the_scheduler_process_goes_when_its_parent_is_killed(tmp_path):
    """A client process killed outright (SIGKILL: no cleanup runs) leaves no scheduler."""
    script = textwrap.dedent("""
        import json, sys, time
        from accy.distributed.local import local_cluster
        if __name__ == "__main__":
            cluster = local_cluster(1, devices=[])
            print(json.dumps({"pid": cluster.scheduler.pid}), flush=True)
            time.sleep(600)
    """)
    path = tmp_path / "parent.py"
    path.write_text(script)
    parent = subprocess.Popen([sys.executable, str(path)], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True)
    try:
        line = parent.stdout.readline()
        pid = json.loads(line)["pid"]
        assert psutil.pid_exists(pid)
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 20
        while psutil.pid_exists(pid) and time.monotonic() < deadline:
            try:
                if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.NoSuchProcess:
                break
            time.sleep(0.2)
        gone = not psutil.pid_exists(pid) or \
            psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        assert gone, "the scheduler process outlived the process that started it"
    finally:
        if parent.poll() is None:
            parent.kill()
