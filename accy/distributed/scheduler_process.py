"""The scheduler of accy's local cluster, in a process of its own.

A ``LocalCluster`` (and a :class:`distributed.SpecCluster` given the
``Scheduler`` class) runs the scheduler on the client's event loop: the
scheduler's work for every task — task-finished messages, transitions, the
gathers it serves, the cache plugin's publishes — and the client's — results,
releases, the batch's own bookkeeping — then share one thread and one GIL. On
the 16-core GPU machine at 15 workers, a scheduler of its own halved that
thread's CPU per batch (``benchmarks/RESULTS.md``). :class:`SchedulerProcess` is a ``SpecCluster`` scheduler spec that
starts the scheduler in a child process instead;
:func:`accy.distributed.local.local_cluster` uses it for every cluster of
worker processes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import sys
import tempfile
from typing import Any

import dask.config
from distributed.deploy.spec import ProcessInterface

from accy.distributed.quiet import python_warnings


class SchedulerProcess(ProcessInterface):
    """A Dask scheduler in a child process, as a :class:`distributed.SpecCluster`'s
    scheduler spec (``{"cls": SchedulerProcess, "options": {...}}``).

    The child starts ``distributed.Scheduler(**options)`` under this process's
    Dask configuration (passed as Dask passes it to a nanny's worker:
    ``DASK_INTERNAL_INHERIT_CONFIG``), writes its address to a file in a private
    directory (``mkdtemp``, 0700), and stops when the scheduler is terminated
    (the cluster closing), when this process goes away (it polls its parent),
    or when :meth:`close` kills it. Its log records go to this process's stderr.
    """

    START_TIMEOUT_S = 60.0

    def __init__(self, **options: Any) -> None:
        self.options = options
        self.process: asyncio.subprocess.Process | None = None
        self.folder: str | None = None
        super().__init__()

    async def start(self) -> None:
        self.folder = tempfile.mkdtemp(prefix="accy-scheduler-")
        address_file = os.path.join(self.folder, "scheduler.json")
        env = dict(os.environ, DASK_INTERNAL_INHERIT_CONFIG=dask.config.serialize(
            dask.config.global_config), PYTHONWARNINGS=python_warnings(
                os.environ.get("PYTHONWARNINGS")))
        self.process = await asyncio.create_subprocess_exec(
            sys.executable, "-c", "from accy.distributed.scheduler_process import serve_scheduler; "
            "import sys; serve_scheduler(sys.argv[1], sys.argv[2], int(sys.argv[3]))",
            address_file, json.dumps(self.options), str(os.getpid()), env=env,
            stdin=asyncio.subprocess.DEVNULL)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.START_TIMEOUT_S
        while True:
            if self.process.returncode is not None:
                raise OSError(f"the scheduler process exited with {self.process.returncode} "
                              "as it started")
            try:
                with open(address_file) as f:
                    self.address = json.load(f)["address"]
                break
            except (OSError, ValueError, KeyError):
                if loop.time() > deadline:
                    await self._stop()
                    raise TimeoutError(f"the scheduler process did not start in "
                                       f"{self.START_TIMEOUT_S:g} s") from None
                await asyncio.sleep(0.05)
        await super().start()

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    async def _stop(self, grace: float = 5.0) -> None:
        proc = self.process
        if proc is not None and proc.returncode is None:
            try:  # the cluster has sent terminate: it is usually on its way out
                await asyncio.wait_for(proc.wait(), grace)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        if self.folder:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None

    async def close(self) -> None:
        await self._stop()
        await super().close()


def serve_scheduler(address_file: str, options: str, parent: int) -> None:
    """The body of a :class:`SchedulerProcess` (runs in the child)."""
    import signal
    import warnings

    from distributed import Scheduler

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the command's to handle
    logging.getLogger("distributed").setLevel(logging.WARNING)  # as LocalCluster's
    # another cluster on the dashboard's port: Dask takes a free one (dashboard_link)
    warnings.filterwarnings("ignore", message=r"Port \d+ is already in use",
                            category=UserWarning)

    async def run() -> None:
        async with Scheduler(**json.loads(options)) as scheduler:
            tmp = address_file + ".tmp"
            with open(tmp, "w") as f:
                json.dump({"address": scheduler.address}, f)
            os.replace(tmp, address_file)
            while scheduler.status.name not in ("closing", "closed", "failed"):
                if os.getppid() != parent:  # the command is gone: so is its cluster
                    await scheduler.close(reason="accy: the parent process is gone")
                    break
                await asyncio.sleep(0.5)
            await scheduler.finished()

    asyncio.run(run())


__all__ = ["SchedulerProcess", "serve_scheduler"]
