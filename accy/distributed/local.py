"""The local cluster's topology: one GPU worker per GPU, pinned to it, and CPU workers.

A machine with N GPUs gets N GPU workers — each started with
``CUDA_VISIBLE_DEVICES`` listing its own GPU first (so CuPy's device 0 in that
process *is* its GPU, set before CuPy initialises, as dask-cuda's
``LocalCUDACluster`` does) and declaring ``GPU=1`` and ``GPU_TIMER=1`` — plus
CPU workers for the stages and NVRTC on the remaining cores, each declaring
``CPU_TIMER=1``. Only the small part of dask-cuda accy needs is here (device
pinning by environment, one worker per device); accy does not depend on it.

GPUs are counted without importing CuPy or initialising CUDA in this process:
``ACCY_GPUS`` (a count, or a comma-separated device list) if set, else
``CUDA_VISIBLE_DEVICES``, else the devices the NVIDIA driver lists under
``/proc/driver/nvidia/gpus``.

Example
-------
>>> visible_devices(2, 4)
'2,3,0,1'
>>> [s["options"]["resources"] for s in worker_specs(3, ["0", "1"]).values()]
[{'GPU': 1, 'GPU_TIMER': 1}, {'GPU': 1, 'GPU_TIMER': 1}, {'CPU_TIMER': 1}]
"""

from __future__ import annotations

import os
from typing import Any

GPUS_ENV = "ACCY_GPUS"
"""A count (``2``) or a device list (``0,3``): the GPUs the local cluster uses."""

GPU_RESOURCES = {"GPU": 1, "GPU_TIMER": 1}
CPU_RESOURCES = {"CPU_TIMER": 1}


def gpu_devices() -> list[str]:
    """The device ids of the GPUs this machine offers accy (see the module docstring)."""
    forced = os.environ.get(GPUS_ENV, "").strip()
    if forced:
        if forced.isdigit():
            return [str(i) for i in range(int(forced))]
        return [d.strip() for d in forced.split(",") if d.strip()]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [d.strip() for d in visible.split(",") if d.strip() and d.strip() != "-1"]
    try:
        return [str(i) for i in range(len(os.listdir("/proc/driver/nvidia/gpus")))]
    except OSError:
        return []


def visible_devices(i: int, devices: int | list[str]) -> str:
    """``CUDA_VISIBLE_DEVICES`` for the worker of device ``i``: its own first, then
    the others (so a library that opens "device 0" opens this worker's GPU)."""
    ids = [str(d) for d in range(devices)] if isinstance(devices, int) else list(devices)
    return ",".join(ids[i:] + ids[:i])


def worker_specs(workers: int, devices: list[str], *, processes: bool = True,
                 threads: int = 1, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Dask worker specs: one GPU worker per device (at most ``workers``), then CPU
    workers up to ``workers`` in all.

    With ``processes`` the workers are nannies whose environment pins the device;
    in-process workers (tests) declare the same resources without pinning.
    """
    from distributed import Nanny, Worker

    cls = Nanny if processes else Worker
    base = dict(options or {}, nthreads=threads)
    specs: dict[str, Any] = {}
    n_gpu = min(len(devices), workers)
    for i in range(workers):
        opts = dict(base)
        if i < n_gpu:
            opts["resources"] = dict(GPU_RESOURCES)
            if processes:
                opts["env"] = {**opts.get("env", {}),
                               "CUDA_VISIBLE_DEVICES": visible_devices(i, devices)}
            name = f"gpu-{devices[i]}"
        else:
            opts["resources"] = dict(CPU_RESOURCES)
            name = f"cpu-{i - n_gpu}"
        specs[name] = {"cls": cls, "options": opts}
    return specs


def local_cluster(workers: int, *, devices: list[str] | None = None, processes: bool = True,
                  host: str = "127.0.0.1", dashboard_address: str | None = None,
                  threads: int = 1, worker_options: dict[str, Any] | None = None,
                  scheduler_options: dict[str, Any] | None = None) -> Any:
    """A ``SpecCluster`` of :func:`worker_specs` (GPU workers pinned to their devices,
    CPU workers after them) with accy preloaded on the scheduler and every worker."""
    from distributed import Scheduler, SpecCluster

    from accy.distributed import PRELOAD

    devices = gpu_devices() if devices is None else devices
    wopts = dict(worker_options or {})
    wopts["preload"] = [PRELOAD, *wopts.get("preload", [])]
    sopts: dict[str, Any] = dict(scheduler_options or {})
    sopts["preload"] = [PRELOAD, *sopts.get("preload", [])]
    if processes:
        wopts.setdefault("host", host)
        sopts.setdefault("host", host)
        sopts.setdefault("dashboard_address", dashboard_address or f"{host}:0")
    else:
        sopts.setdefault("dashboard_address", dashboard_address or ":0")
        sopts.setdefault("protocol", "inproc://")
        wopts.pop("host", None)
    scheduler = {"cls": Scheduler, "options": sopts}
    return SpecCluster(workers=worker_specs(workers, devices, processes=processes,
                                            threads=threads, options=wopts),
                       scheduler=scheduler, asynchronous=False, name="accy")


__all__ = ["GPUS_ENV", "GPU_RESOURCES", "CPU_RESOURCES", "gpu_devices", "visible_devices",
           "worker_specs", "local_cluster"]
