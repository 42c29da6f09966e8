"""Facts about the machine this process runs on, asked in one place: the CPU's model
and the cores this process may use. The batch sizes its local cluster by them, the
tuner records them with each timing, the benchmarks say where they ran."""

from __future__ import annotations

import os
import platform


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else the platform's processor string.

    >>> isinstance(cpu_model(), str) and cpu_model() != ""
    True
    """
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def available_cores() -> int:
    """The CPU cores this process may run on (its affinity mask where the platform has
    one: a container or ``taskset`` may allow fewer than the machine has).

    >>> 1 <= available_cores() <= (os.cpu_count() or 1)
    True
    """
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
