"""accy's local cluster on an N-GPU machine: every worker pinned to a GPU round-robin
(its own first in CUDA_VISIBLE_DEVICES), one timer per GPU — simulated here with
``ACCY_GPUS`` (no GPU needed): the pinning is in each worker process's environment."""

from __future__ import annotations

import os

import pytest
from distributed import Client, get_worker

import accy.distributed
from accy.distributed.local import gpu_devices, local_cluster, visible_devices, worker_specs


def test_gpu_devices_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("ACCY_GPUS", "3")
    assert gpu_devices() == ["0", "1", "2"]
    monkeypatch.setenv("ACCY_GPUS", "1,3")
    assert gpu_devices() == ["1", "3"]
    monkeypatch.delenv("ACCY_GPUS")
    monkeypatch.setattr(accy.distributed, "gpu_visible", lambda: True)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")
    assert gpu_devices() == ["2", "5"]
    monkeypatch.setattr(accy.distributed, "gpu_visible", lambda: False)
    assert gpu_devices() == []  # a driver, but no GPU CuPy can use
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    assert gpu_devices() == []


def test_workers_are_pinned_round_robin_with_timers_per_gpu(monkeypatch):
    from accy.distributed import local

    monkeypatch.setattr(local, "TIMERS_PER_GPU", 2)
    assert [visible_devices(i, ["4", "6", "7"]) for i in range(3)] == ["4,6,7", "6,7,4", "7,4,6"]
    specs = worker_specs(5, ["0", "1"])
    assert list(specs) == ["gpu0-0", "gpu1-1", "gpu0-2", "gpu1-3", "gpu0-4"]
    envs = [s["options"]["env"]["CUDA_VISIBLE_DEVICES"] for s in specs.values()]
    assert envs == ["0,1", "1,0", "0,1", "1,0", "0,1"]
    timers = [s["options"]["resources"].get("GPU_TIMER", 0) for s in specs.values()]
    assert timers == [1, 1, 1, 1, 0]  # two a GPU
    assert all(s["options"]["resources"]["GPU"] == 1 for s in specs.values())
    cpu = worker_specs(2, [])
    assert list(cpu) == ["cpu-0", "cpu-1"]
    assert all(s["options"]["resources"] == {"CPU_TIMER": 1} for s in cpu.values())


@pytest.mark.slow
def test_a_two_gpu_cluster_pins_each_worker_process(monkeypatch):
    """Real worker processes: each worker's CUDA_VISIBLE_DEVICES names its GPU first."""
    from accy.distributed import local

    monkeypatch.setattr(local, "TIMERS_PER_GPU", 1)
    with local_cluster(3, devices=["0", "1"]) as cluster, Client(cluster) as client:
        client.wait_for_workers(3, timeout=60)
        seen = client.run(lambda: os.environ.get("CUDA_VISIBLE_DEVICES"))
        info = client.scheduler_info(n_workers=-1)["workers"]
        by_name = {w["name"]: (w["resources"], seen[addr]) for addr, w in info.items()}
    assert by_name["gpu0-0"] == ({"CPU_TIMER": 1, "GPU": 1, "GPU_TIMER": 1}, "0,1")
    assert by_name["gpu1-1"] == ({"CPU_TIMER": 1, "GPU": 1, "GPU_TIMER": 1}, "1,0")
    assert by_name["gpu0-2"] == ({"CPU_TIMER": 1, "GPU": 1}, "0,1")


def test_timings_run_on_the_timer_workers_in_process(monkeypatch):
    from accy.distributed import local

    monkeypatch.setattr(local, "TIMERS_PER_GPU", 1)
    with local_cluster(3, devices=["0", "1"], processes=False) as cluster, \
            Client(cluster) as client:
        names = client.gather([client.submit(lambda i: get_worker().name, i, pure=False,
                                             resources={"GPU_TIMER": 1}) for i in range(8)])
    assert set(names) <= {"gpu0-0", "gpu1-1"}
