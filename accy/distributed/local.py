"""accy's local cluster: every worker pinned to a GPU (round-robin), timers declared.

One builder for every local cluster accy starts (``accy batch``, ``accy tune``):

- ``workers`` single-thread worker processes (default: a core each but one, for
  the scheduler and the client; see :func:`accy.distributed.default_workers`);
- on a machine with N GPUs every worker is a GPU worker (a batch's fused stage
  chains end in the load, which must happen in the process that runs the
  kernel), worker *i* pinned to GPU ``i mod N`` by ``CUDA_VISIBLE_DEVICES``
  listing that GPU first — set in the worker's environment before CuPy
  initialises, as dask-cuda's ``LocalCUDACluster`` does (accy does the small
  part it needs and does not depend on dask-cuda). Every worker declares
  ``GPU=1``; the first :data:`TIMERS_PER_GPU` workers of each GPU also
  ``GPU_TIMER=1`` — ``accy tune`` spreads its groups over them, and a device lock
  lets one of them time at a time (timings never share a device) while the others
  make their groups' inputs and reference results on the CPU; every worker
  declares ``CPU_TIMER=1`` (host timings, one per core);
- the scheduler and workers bind ``host`` (127.0.0.1 unless asked), accy is
  preloaded everywhere, the dashboard's routes and the batch configuration
  (:func:`accy.distributed.batch_cluster_config`) are set as the scheduler starts;
- the scheduler runs in a process of its own
  (:class:`accy.distributed.scheduler_process.SchedulerProcess`), not on the
  client's event loop; in-process clusters (``processes=False``, the tests) keep
  it in-process.

GPUs are counted without importing CuPy in this process: ``ACCY_GPUS`` (a count,
or a comma-separated device list) if set, else ``CUDA_VISIBLE_DEVICES``, else the
devices the NVIDIA driver lists under ``/proc/driver/nvidia/gpus`` — confirmed by
:func:`accy.distributed.gpu_visible` (CuPy, in a child process) when not forced.

Example
-------
>>> visible_devices(2, 4)
'2,3,0,1'
>>> [sorted(s["options"]["resources"]) for s in worker_specs(7, ["0", "1"]).values()][-2:]
[['CPU_TIMER', 'GPU', 'GPU_TIMER'], ['CPU_TIMER', 'GPU']]
>>> [s["options"]["env"] for s in worker_specs(3, ["0", "1"]).values()]
[{'CUDA_VISIBLE_DEVICES': '0,1'}, {'CUDA_VISIBLE_DEVICES': '1,0'}, {'CUDA_VISIBLE_DEVICES': '0,1'}]
"""

from __future__ import annotations

import functools
import logging
import os
import warnings
from typing import Any

from accy.errors import AccyError

GPUS_ENV = "ACCY_GPUS"
"""A count (``2``) or a device list (``0,3``): the GPUs the local cluster uses."""

HOST_ENV = "ACCY_BATCH_HOST"
"""The interface local clusters bind (default 127.0.0.1)."""


def gpu_devices() -> list[str]:
    """The device ids of the GPUs this machine offers accy (see the module docstring)."""
    forced = os.environ.get(GPUS_ENV, "").strip()
    if forced:
        if forced.isdigit():
            return [str(i) for i in range(int(forced))]
        return [d.strip() for d in forced.split(",") if d.strip()]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        found = [d.strip() for d in visible.split(",") if d.strip() and d.strip() != "-1"]
    else:
        try:
            found = [str(i) for i in range(len(os.listdir("/proc/driver/nvidia/gpus")))]
        except OSError:
            found = []
    if found:
        from accy.distributed import gpu_visible

        if not gpu_visible():  # a driver, but no GPU CuPy can use here
            return []
    return found


def visible_devices(i: int, devices: int | list[str]) -> str:
    """``CUDA_VISIBLE_DEVICES`` for a worker of device ``i``: its own first, then the
    others (a library that opens "device 0" opens this worker's GPU)."""
    ids = [str(d) for d in range(devices)] if isinstance(devices, int) else list(devices)
    return ",".join(ids[i:] + ids[:i])


TIMERS_PER_GPU = 3
"""Workers of each GPU that declare ``GPU_TIMER``. One timed at a time (the device
lock), so a tuning on one GPU was serial in everything: 240 variants in 9 groups
timed for 13 s of the 46-s timing phase, the rest each group's random inputs,
reference run and checks (RESULTS.md, tuning). Three let two groups prepare while
one times."""


NANNY_CHORES_MS = {"tick": 1000, "monitor": 2000, "memory_monitor": 500}
"""The intervals (ms) of a local cluster's nannies' own periodic chores. The nannies live
in the client's process, on its event loop, and by Dask's defaults each one measures
that loop's tick every 20 ms, its process's CPU and memory every 500 ms and its worker's
memory every 100 ms: idle, 8 nannies took 70 ms of the client's CPU a second (12 at these
intervals), under the GIL the batch's collecting, submitting and publishing threads
share. No batch on 15 workers of a 16-core host ran measurably faster for it (RESULTS.md,
batch, thirtieth session); the idle CPU is saved. Their workers keep Dask's intervals."""


@functools.cache
def _quiet_nanny_class() -> Any:
    from distributed import Nanny

    class QuietNanny(Nanny):
        """A :class:`distributed.Nanny` whose own chores run at :data:`NANNY_CHORES_MS`."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            for name, ms in NANNY_CHORES_MS.items():
                pc = self.periodic_callbacks.get(name)
                if pc is not None:  # created here, started with the nanny
                    pc.callback_time = max(pc.callback_time, ms)

    return QuietNanny


def worker_specs(workers: int, devices: list[str], *, processes: bool = True,
                 options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Dask worker specs (see the module docstring): GPU workers round-robin over
    ``devices``, or CPU workers when there are none. With ``processes`` the workers
    are nannies (quieter than Dask's: :data:`NANNY_CHORES_MS`) whose environment pins
    the device; in-process workers (tests)
    declare the same resources without pinning."""
    from distributed import Worker

    cls = _quiet_nanny_class() if processes else Worker
    base = dict(options or {}, nthreads=1)
    specs: dict[str, Any] = {}
    for i in range(workers):
        opts = dict(base)
        resources = {"CPU_TIMER": 1}
        if devices:
            d = i % len(devices)
            timer = i < len(devices) * TIMERS_PER_GPU
            resources.update(GPU=1, **({"GPU_TIMER": 1} if timer else {}))
            if processes:
                opts["env"] = {**opts.get("env", {}),
                               "CUDA_VISIBLE_DEVICES": visible_devices(d, devices)}
            name = f"gpu{devices[d]}-{i}"
        else:
            name = f"cpu-{i}"
        opts["resources"] = resources
        specs[name] = {"cls": cls, "options": opts}
    return specs


def local_cluster(workers: int | None = None, *, devices: list[str] | None = None,
                  processes: bool = True, dashboard_port: int = 0,
                  host: str | None = None, config: dict[str, Any] | None = None,
                  scheduler_process: bool = True) -> Any:
    """Start accy's local cluster (see the module docstring); an :class:`AccyError`
    in one line if it does not start. ``config`` is Dask configuration set over the
    batch configuration while it starts (e.g. the worker profiler back on).
    ``scheduler_process=False`` runs the scheduler on this process's event loop, as
    a ``LocalCluster`` does (``benchmarks/batch.py`` compares the two)."""
    import dask.config
    from distributed import Scheduler, SpecCluster

    from accy.dashboard.api import routes_config
    from accy.distributed import PRELOAD, batch_cluster_config, default_workers
    from accy.distributed.quiet import PRELOAD as QUIET
    from accy.distributed.quiet import SCRATCH_WARNING, python_warnings

    n = workers or default_workers()
    devices = gpu_devices() if devices is None else devices
    host = host or os.environ.get(HOST_ENV) or "127.0.0.1"
    wopts: dict[str, Any] = {"preload": [PRELOAD, QUIET] if processes else [PRELOAD],
                             "silence_logs": logging.WARN}  # as LocalCluster: no INFO chatter
    sopts: dict[str, Any] = {"preload": [PRELOAD]}
    scheduler_cls: Any = Scheduler
    if processes:
        wopts["host"] = host
        sopts.update(host=host, dashboard_address=f"{host}:{dashboard_port}")
        if scheduler_process:
            from accy.distributed.scheduler_process import SchedulerProcess

            scheduler_cls = SchedulerProcess
            sopts["preload"] = [PRELOAD, QUIET]
    else:
        sopts.update(protocol="inproc://", dashboard_address=":0")
    specs = worker_specs(n, devices, processes=processes, options=wopts)
    # Dask reads the HTTP routes (/accy/api/stages) as the scheduler starts; another
    # cluster on the port moves the dashboard to a free one (client.dashboard_link)
    # the nannies' worker processes (their restarts too) and the scheduler's process
    # start with the scratch-folder warning filtered (python_warnings says why)
    quiet = {"distributed.nanny.pre-spawn-environ.PYTHONWARNINGS":
             python_warnings(os.environ.get("PYTHONWARNINGS"))}
    with dask.config.set({**batch_cluster_config(), **quiet, **(config or {})}), \
            dask.config.set(routes_config()), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Port \d+ is already in use",
                                category=UserWarning)
        warnings.filterwarnings("ignore", message=SCRATCH_WARNING, category=UserWarning)
        try:
            return SpecCluster(workers=specs, scheduler={"cls": scheduler_cls, "options": sopts},
                               name="accy", silence_logs=logging.WARN)
        except (OSError, TimeoutError) as e:
            raise AccyError(f"the local cluster of {n} worker(s) did not start: "
                            f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") \
                from None


__all__ = ["GPUS_ENV", "HOST_ENV", "gpu_devices", "visible_devices", "worker_specs",
           "local_cluster"]
