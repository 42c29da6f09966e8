"""Quiet logs for the local cluster of ``accy batch``: each failure is said once, by accy.

A failing stage task raises an accy error (``StageFailed``, ``StoreError``…)
that the batch reports itself, as one ``failed:`` line; Dask's worker would
also log it as a multi-line ``Compute Failed … Traceback:`` block. And when the
local cluster shuts down, a worker's last heartbeat can meet a closed comm and
log a ``CommClosedError`` traceback after a batch that went well.
:class:`AccyLogFilter` drops exactly those records; everything else Dask logs
still gets through. With ``ACCY_DEBUG`` set nothing is dropped.

``accy batch`` preloads this module into the workers of the local cluster it
starts (:data:`PRELOAD`) and installs the filter in its own process (where the
scheduler of that cluster runs). A cluster someone else runs (``--scheduler``)
keeps its logs as they are.

Example
-------
>>> import logging
>>> r = logging.LogRecord("distributed.worker", logging.ERROR, __file__, 1,
...                       "Compute Failed\\nKey: %s\\nState: %s\\nTask: %s\\nException: %r\\n"
...                       "Traceback: %r\\n", (("accy_contract", "ab"), "executing", "",
...                       'StageFailed("x.mlir:1:1: error: bad")', ""), None)
>>> AccyLogFilter().filter(r)
False
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

PRELOAD = "accy.distributed.quiet"
"""Dask preload name of this module (its :func:`dask_setup` installs the filter)."""

LOGGERS = ("distributed.worker", "distributed.core", "distributed.comm",
           "distributed.batched", "distributed.nanny", "distributed.worker.state_machine",
           "distributed.scheduler", "distributed.client", "distributed.utils",
           "tornado.application", "tornado.general", "asyncio")
"""The Dask loggers the filter sits on (a logger's filter sees only its own records)."""

TASK_PREFIX = "accy_"
"""accy's stage, compile and load tasks have keys ``("accy_<stage>", "<hex>")``."""


def _is_accy_task(key: Any) -> bool:
    return isinstance(key, tuple) and bool(key) and str(key[0]).startswith(TASK_PREFIX)


class AccyLogFilter(logging.Filter):
    """Drops Dask's log records of failures that accy reports itself.

    - ``Compute Failed`` of an accy task (key ``("accy_…", …)``): the batch
      prints the failure as one line — an accy error (``StageFailed``) as its
      message, any other exception (an accy bug) as an internal error;
      ``ACCY_DEBUG=1`` shows Dask's block with its traceback.
    - A ``CommClosedError`` (or any ``OSError``) logged with traceback from a
      worker's heartbeat or a closing comm, and the client's "Failed to
      reconnect to scheduler": the cluster is going away (a batch then ends
      with its own line).
    """

    def __init__(self) -> None:
        super().__init__("accy")

    def filter(self, record: logging.LogRecord) -> bool:
        if os.environ.get("ACCY_DEBUG"):
            return True
        msg = record.msg if isinstance(record.msg, str) else ""
        args = record.args if isinstance(record.args, tuple) else ()
        if msg.startswith("Compute Failed") and args and _is_accy_task(args[0]):
            return False
        if "ended with CancelledError" in record.getMessage() and \
                f"'{TASK_PREFIX}" in record.getMessage():
            return False  # an accy task cancelled as the batch stops (Ctrl-C, shutdown)
        if msg.startswith(("Couldn't gather keys", "Couldn't gather")) and \
                f"'{TASK_PREFIX}" in record.getMessage():
            return False  # results of a batch that stopped, no longer wanted
        if msg.startswith("Failed to reconnect to scheduler"):
            return False  # the scheduler is gone: the batch says so in its own line
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            if "heartbeat" in msg and isinstance(exc, OSError):
                return False
            if type(exc).__name__ in ("CommClosedError", "StreamClosedError") or \
                    isinstance(exc, (OSError, TimeoutError, asyncio.CancelledError)):
                return False  # a connection (the scheduler, a worker) went away, or closing
        return True


_FILTER = AccyLogFilter()


def install() -> None:
    """Put the filter on Dask's loggers in this process (idempotent)."""
    for name in LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
    # records of other loggers that reach the handlers (propagated): filtered there too
    for logger in (logging.getLogger(), logging.getLogger("distributed")):
        for handler in logger.handlers:
            if _FILTER not in handler.filters:
                handler.addFilter(_FILTER)


SCRATCH_WARNING = "Creating scratch directories is taking a surprisingly long time"
"""The start of Dask's warning when a server took over a second to set up its scratch
folder. It means a network file system; on a loaded machine a local folder takes that
long too (the 2-core test machine: 1.17 s, under the test suite), and a local cluster's
folder is this machine's temporary one — there the warning only alarms."""


def python_warnings(current: str | None = None) -> str:
    """``PYTHONWARNINGS`` for the processes of accy's local cluster: ``current`` (the
    user's) and a filter for :data:`SCRATCH_WARNING`, which a server raises while it is
    built, before any preload runs (so it is set from the environment).

    >>> python_warnings("default")
    'default,ignore:Creating scratch directories is taking a surprisingly long time:UserWarning'
    """
    quiet = f"ignore:{SCRATCH_WARNING}:UserWarning"
    return f"{current},{quiet}" if current else quiet


def dask_setup(dask_server: Any) -> None:
    """Dask preload hook: install the filter in the worker's process, and let Ctrl-C
    at the terminal reach only the command: the local cluster's worker processes
    share its process group, and their nannies stop them when the command shuts the
    cluster down (a SIGINT in each would print a traceback per worker)."""
    import signal
    import threading

    install()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
