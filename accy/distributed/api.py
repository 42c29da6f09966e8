"""The Python API for users who hold their own Dask ``Client``.

Example
-------
>>> from distributed import Client, LocalCluster
>>> from accy.distributed import local_cluster_kwargs
>>> from accy.distributed.api import refresh, run
>>> # with LocalCluster(processes=False, **local_cluster_kwargs()) as c, Client(c) as client:
>>> #     out = refresh(client, "graphs/softmax.mlir", shapes={0: (8, 4096)})
>>> #     (y,) = run(client, out, x)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from accy.distributed.batch import BatchResult, VariantOutcome, run_batch
from accy.errors import AccyError
from accy.sweep import Variant
from accy.target.backend import backend_of


def refresh(client: Any, program: str, *, target: str = "host",
            shapes: Mapping[int, tuple[int, ...]] | None = None,
            options: Mapping[str, Any] | None = None,
            store_url: str | None = None) -> VariantOutcome:
    """Refresh one program variant on the cluster; publish it if it succeeds."""
    from accy.preparation.options import Target

    tgt = str(Target.parse(target))
    result = run_batch(client, [Variant(program, tgt, dict(shapes or {}), dict(options or {}))],
                       store_url=store_url)
    return result.outcomes[0]


def batch(client: Any, variants: Sequence[Variant], store_url: str | None = None) \
        -> BatchResult:
    """Refresh many variants (see :func:`accy.distributed.batch.run_batch`)."""
    return run_batch(client, variants, store_url=store_url)


def run(client: Any, outcome: VariantOutcome, *arrays: Any) -> list[Any]:
    """Run a refreshed variant's loaded fragment on the worker that loaded it.

    If that worker is gone, the fragment is loaded again on another eligible
    worker (any worker for host fragments, a ``GPU`` worker for CUDA ones)
    from the compiled artifact the cluster holds.
    """
    from distributed import Future

    from accy.distributed.graph import TASK_PREFIX, run_task

    if outcome.status != "ok":
        raise AccyError(f"variant {outcome.id} did not refresh successfully")
    if outcome.compile_task is None:
        raise AccyError(f"variant {outcome.id} has no compiled fragment on the cluster")
    compiled: Future = Future(tuple(outcome.compile_task), client=client)
    desc = outcome.fragment or {}
    workers = client.scheduler_info(n_workers=-1)["workers"]
    # the load descriptor names the target; without one the load was skipped, which
    # happens only to a target that needs a GPU where none was
    cuda = backend_of(str(desc["target"])).needs_gpu if desc.get("target") else True
    gpu = any((w.get("resources") or {}).get("GPU", 0) > 0 for w in workers.values())
    if cuda and not gpu:
        raise AccyError(f"variant {outcome.id} is a CUDA fragment and the cluster has no GPU "
                        f"worker")
    kwargs: dict[str, Any] = {"pure": False, "key": f"{TASK_PREFIX}run-{id(arrays):x}"}
    if desc.get("worker") in workers:
        kwargs.update(workers=[desc["worker"]], allow_other_workers=False)
    elif cuda:
        kwargs.update(resources={"GPU": 1})
    [data] = client.scatter([list(arrays)], hash=False)
    return client.submit(run_task, desc, compiled, data, outcome.compile_pick,
                         **kwargs).result()
