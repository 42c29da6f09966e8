"""One GPU worker per GPU, pinned to it; CPU workers on the rest — simulated here with
``ACCY_GPUS`` (no GPU needed): the pinning is in each worker process's environment."""

from __future__ import annotations

import os

import pytest
from distributed import Client

from accy.distributed.local import gpu_devices, local_cluster, visible_devices, worker_specs


def test_gpu_devices_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("ACCY_GPUS", "3")
    assert gpu_devices() == ["0", "1", "2"]
    monkeypatch.setenv("ACCY_GPUS", "1,3")
    assert gpu_devices() == ["1", "3"]
    monkeypatch.delenv("ACCY_GPUS")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")
    assert gpu_devices() == ["2", "5"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    assert gpu_devices() == []


def test_each_gpu_worker_sees_its_own_device_first():
    assert [visible_devices(i, ["4", "6", "7"]) for i in range(3)] == ["4,6,7", "6,7,4", "7,4,6"]
    specs = worker_specs(4, ["0", "1"])
    assert list(specs) == ["gpu-0", "gpu-1", "cpu-0", "cpu-1"]
    assert specs["gpu-1"]["options"]["env"] == {"CUDA_VISIBLE_DEVICES": "1,0"}
    assert "env" not in specs["cpu-0"]["options"]
    # more GPUs than workers: every worker is a GPU worker
    assert list(worker_specs(1, ["0", "1"])) == ["gpu-0"]


@pytest.mark.slow
def test_a_two_gpu_cluster_pins_each_worker_process(monkeypatch):
    """Real worker processes: each GPU worker's CUDA_VISIBLE_DEVICES names its device
    first, it declares GPU and GPU_TIMER; the CPU worker declares CPU_TIMER only."""
    with local_cluster(3, devices=["0", "1"]) as cluster, Client(cluster) as client:
        client.wait_for_workers(3, timeout=60)
        seen = client.run(lambda: os.environ.get("CUDA_VISIBLE_DEVICES"))
        info = client.scheduler_info(n_workers=-1)["workers"]
        by_name = {w["name"]: (w["resources"], seen[addr]) for addr, w in info.items()}
    assert by_name["gpu-0"] == ({"GPU": 1, "GPU_TIMER": 1}, "0,1")
    assert by_name["gpu-1"] == ({"GPU": 1, "GPU_TIMER": 1}, "1,0")
    assert by_name["cpu-0"][0] == {"CPU_TIMER": 1}


def test_gpu_tasks_go_to_gpu_workers_in_process():
    with local_cluster(3, devices=["0", "1"], processes=False) as cluster, \
            Client(cluster) as client:
        from distributed import get_worker

        names = client.gather([client.submit(lambda i: get_worker().name, i, pure=False,
                                             resources={"GPU": 1}) for i in range(8)])
    assert set(names) <= {"gpu-0", "gpu-1"}
