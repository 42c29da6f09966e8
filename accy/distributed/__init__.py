"""accy on Dask: serializers, the artifact store, sweeps and the cache-state plugin.

Importing this package registers the msgpack serializers of every stage
product with Dask (so a client that imports it can gather products), and
nothing heavier: the submodules load on first use.

- :mod:`.serialize` — products (and other accy types) travel as msgpack frames.
- :mod:`accy.store` — :class:`ArtifactStore`, the persistent content-addressed tier.
- :mod:`accy.sweep` — :func:`load_sweep`, :class:`Variant`: what a batch compiles.
- :mod:`.plugin` — :class:`AccyCachePlugin`, the scheduler's versioned cache state.
- :mod:`.state` — :func:`fetch_state`, :func:`publish_with_merge`: its client side.

A cluster loads accy with Dask's own preload mechanism::

    dask scheduler --preload accy.distributed
    dask worker tcp://scheduler:8786 --preload accy.distributed

and a local cluster takes :func:`local_cluster_kwargs`.

Example
-------
>>> from distributed import Client, LocalCluster
>>> with LocalCluster(processes=False, n_workers=1, dashboard_address=":0",
...                   **local_cluster_kwargs()) as cluster, Client(cluster) as client:
...     ensure_plugin(client)["version"]
0
"""

from __future__ import annotations

import importlib
import time
from typing import TYPE_CHECKING, Any

from distributed.diagnostics.plugin import WorkerPlugin

from accy.distributed import serialize

if TYPE_CHECKING:
    from distributed import Client

    from accy.distributed.plugin import AccyCachePlugin, get_plugin
    from accy.distributed.state import fetch_state, publish, publish_with_merge, touch, unpin
    from accy.store import ArtifactStore, default_store_url
    from accy.sweep import Variant, load_sweep, load_sweeps

serialize.register()

PRELOAD = "accy.distributed"

_LAZY = {
    "ArtifactStore": "accy.store", "default_store_url": "accy.store",
    "Variant": "accy.sweep", "load_sweep": "accy.sweep", "load_sweeps": "accy.sweep",
    "AccyCachePlugin": "plugin", "get_plugin": "plugin",
    "fetch_state": "state", "publish": "state", "publish_with_merge": "state",
    "touch": "state", "unpin": "state",
}
_SUBMODULES = ("serialize", "plugin", "state")

__all__ = [
    "PRELOAD", "dask_setup", "ensure_plugin", "local_cluster_kwargs", "SerializersPlugin",
    "batch_cluster_config", "default_workers", "gpu_visible", "tune_worker_gc",
    "WORKER_GC_THRESHOLDS",
    "ArtifactStore", "default_store_url", "Variant", "load_sweep", "load_sweeps",
    "AccyCachePlugin", "get_plugin", "fetch_state", "publish", "publish_with_merge",
    "touch", "unpin",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        mod = _LAZY[name]
        return getattr(importlib.import_module(mod if "." in mod else f"accy.distributed.{mod}"),
                       name)
    if name in _SUBMODULES:
        return importlib.import_module(f"accy.distributed.{name}")
    raise AttributeError(f"module 'accy.distributed' has no attribute {name!r}")


def dask_setup(dask_server: Any) -> None:
    """Dask preload hook: the cache and dashboard plugins on a scheduler, the
    serializers on a worker.

    Idempotent: preloading twice (or into a scheduler that already has the
    plugin) changes nothing.
    """
    from distributed import Scheduler, Worker

    serialize.register()
    if isinstance(dask_server, Worker) and _own_process():
        tune_worker_gc()
    if isinstance(dask_server, Scheduler):
        from accy.dashboard.plugin import StageDashboardPlugin
        from accy.distributed.plugin import PLUGIN_NAME, AccyCachePlugin

        # Preloads run before the scheduler starts its plugins, so start() runs
        # once, from Scheduler.start, and installs the handlers.
        if PLUGIN_NAME not in dask_server.plugins:
            dask_server.add_plugin(AccyCachePlugin(), name=PLUGIN_NAME)
        dask_server.add_plugin(StageDashboardPlugin(cache_plugin=PLUGIN_NAME), idempotent=True)


WORKER_GC_THRESHOLDS = (20_000, 20, 20)
"""The garbage collector's thresholds in a worker process of accy's (Python's default:
``(700, 10, 10)``), after everything the worker imported at its start is frozen
(``gc.freeze``: collections no longer walk it). Dask config ``accy.worker-gc``: three
thresholds, or ``false`` to leave the collector alone.

A stage run allocates hundreds of thousands of short-lived IR objects; under the
default thresholds the collector ran every 700 of them over everything a Dask worker
holds. In one process on the 2-core machine (96 distinct CUDA variants, binaries warm,
the six stages and the store; RESULTS.md, batch, thirteenth session) a variant took
17.8 ms of CPU with the collector off against 20.0 with Python's thresholds. The IR's
reference cycles (an op and its blocks) are still collected, later and in larger
gulps."""


def _own_process() -> bool:
    """Whether this process is a worker's own (a nanny started it), not a process that
    runs an in-process cluster beside other work (a test, a notebook): only then does
    accy set its process-wide GC policy."""
    import multiprocessing

    return multiprocessing.parent_process() is not None


def tune_worker_gc() -> tuple[int, ...] | None:
    """Apply :data:`WORKER_GC_THRESHOLDS` (or Dask config ``accy.worker-gc``) to this
    process: freeze what is alive, then raise the thresholds. Returns the thresholds
    set, or None when the config says ``false``."""
    import gc

    import dask.config

    value = dask.config.get("accy.worker-gc", WORKER_GC_THRESHOLDS)
    if value is False or value is None or str(value).lower() in ("false", "off", "no"):
        return None
    if isinstance(value, str):
        value = [v for v in value.replace(",", " ").split() if v]
    try:
        thresholds = tuple(int(v) for v in value)
    except (TypeError, ValueError):
        thresholds = ()
    if len(thresholds) != 3 or min(thresholds) < 1:
        raise ValueError(f"accy.worker-gc takes three positive thresholds or false, "
                         f"not {value!r}")
    gc.collect()
    gc.freeze()
    gc.set_threshold(*thresholds)
    return thresholds


def local_cluster_kwargs() -> dict[str, Any]:
    """Keyword arguments that make a ``LocalCluster`` preload accy everywhere.

    Example
    -------
    >>> local_cluster_kwargs()["scheduler_kwargs"]
    {'preload': ['accy.distributed']}
    """
    return {"scheduler_kwargs": {"preload": [PRELOAD]}, "preload": [PRELOAD]}


def default_workers() -> int:
    """How many single-thread workers a local batch cluster starts: one per core but
    one (the scheduler and the client share it), at least two."""
    from accy.host import available_cores

    return max(2, available_cores() - 1)


def gpu_visible() -> bool:
    """Whether CuPy sees a GPU. Asked as :func:`accy.target.backend.local_cuda_arch`
    asks (in a child process unless CuPy is loaded here, once per process): the
    client of a batch never loads CuPy or creates a CUDA context for the question,
    and a batch over ``targets: [cuda]`` asks only once."""
    from accy.target.backend import local_cuda_arch

    return local_cuda_arch() is not None


def batch_cluster_config() -> dict[str, Any]:
    """The Dask configuration accy's local batch clusters start under.

    A batch is thousands of tasks of 1–100 ms each:

    - ``worker-saturation: 1.1`` (Dask's default, set so that a site config cannot
      change it) — a batch's root tasks (its compile groups, 100–300 ms each)
      queue on the scheduler and go to whichever worker has a slot: a
      one-thread worker holds two (one running, the next in hand, so no round
      trip between them). Under ``inf`` every root task was placed up front,
      unevenly: 96 distinct variants (12 groups) on 2 workers went 8 and 4, the
      second worker idle for the last third of the batch; measured on the H200 at
      15 workers (480 variants, 4 interleaved passes), ``inf`` / 1.1 read 283–531 /
      440–529 distinct variants/s and 169–362 / 298–372 shared.
    - ``worker.profile.enabled: False`` — the statistical profiler samples each
      worker thread every 10 ms (under the GIL, next to tasks of a few ms);
      turn it back on to profile a batch.

    What this cannot change: a trivial task's ~10 ms round trip is the
    client's batched stream to the scheduler, which sends at most every 10 ms
    (``BatchedSend(interval="10ms")`` in ``Client``, not a config key): a
    ``submit`` right after a ``result`` waits out the window. A batch pays it
    once (one graph message); a fully reused refresh pays none (one RPC).
    """
    return {"distributed.scheduler.worker-saturation": 1.1,
            "distributed.worker.profile.enabled": False}


def ensure_plugin(client: Client, timeout: float = 10.0) -> dict[str, Any]:
    """Make sure the cluster runs accy: the cache plugin and the worker serializers.

    A cluster started with ``--preload accy.distributed`` (or
    :func:`local_cluster_kwargs`) already does, and this only checks. Otherwise
    it registers :class:`AccyCachePlugin` (and the dashboard's plugin) from the
    client and waits until the scheduler answers ``accy_state``, and registers a
    worker plugin that loads the serializers on every worker, present and
    future. Returns the state's ``{"version"}``.
    """
    from accy.dashboard.plugin import StageDashboardPlugin
    from accy.distributed.plugin import METADATA_KEY, PLUGIN_NAME, AccyCachePlugin

    # The plugin announces itself in the scheduler's metadata when it starts
    # (asking an absent handler gets None back and a warning in the log).
    if client.get_metadata([METADATA_KEY], default=None) is None:
        client.register_plugin(AccyCachePlugin(), name=PLUGIN_NAME)
        client.register_plugin(StageDashboardPlugin(cache_plugin=PLUGIN_NAME))
        client.register_plugin(SerializersPlugin())
        deadline = time.monotonic() + timeout
        while client.get_metadata([METADATA_KEY], default=None) is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the {PLUGIN_NAME} plugin did not start within {timeout} s")
            time.sleep(0.05)
    return client.sync(client.scheduler.accy_state, full=False)


class SerializersPlugin(WorkerPlugin):
    """Worker plugin: registers accy's serializers on each worker it reaches."""

    name = "accy-serializers"
    idempotent = True

    def setup(self, worker: Any) -> None:
        serialize.register()
