"""File-path preload for deployments that name preloads by path.

``dask scheduler --preload accy.distributed`` is the normal way. Where a
deployment only takes a file (``--preload /path/to/cluster/preload.py``), this
shim forwards Dask's preload hooks to ``accy.distributed``.
"""

from __future__ import annotations

import accy.distributed as _accy_distributed

dask_setup = _accy_distributed.dask_setup

if hasattr(_accy_distributed, "dask_teardown"):
    dask_teardown = _accy_distributed.dask_teardown
