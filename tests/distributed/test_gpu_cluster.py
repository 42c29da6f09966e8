"""GPU workers on a local cluster compile, load and run every graph (needs a GPU)."""

from __future__ import annotations

import glob
import os

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GRAPHS = sorted(glob.glob(os.path.join(ROOT, "graphs", "*.mlir")))

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def gpu_client(tmp_path_factory):  # type: ignore[no-untyped-def]
    from distributed import Client, LocalCluster

    from accy.distributed import local_cluster_kwargs
    from accy.distributed.state import unpin

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      resources={"GPU": 1}, dashboard_address=":0",
                      **local_cluster_kwargs()) as cluster, Client(cluster) as client:
        client.store_url = str(tmp_path_factory.mktemp("store"))  # type: ignore[attr-defined]
        yield client
        unpin(client)


def _inputs(path: str, dyn: int) -> tuple[list[np.ndarray], dict[int, tuple[int, ...]]]:
    from accy.preparation.products import SemanticModule

    sm = SemanticModule.from_file(path)
    rng = np.random.default_rng(3)
    arrays, shapes = [], {}
    for i, t in enumerate(sm.entry().function_type.inputs):
        shape = tuple(dyn if d is None else d for d in t.shape)
        if not t.is_static:
            shapes[i] = shape
        arrays.append(rng.standard_normal(shape).astype(np.float32))
    return arrays, shapes


@pytest.mark.parametrize("path", GRAPHS, ids=lambda p: os.path.basename(p))
def test_gpu_workers_run_every_graph(gpu_client, path: str) -> None:  # type: ignore[no-untyped-def]
    from accy.distributed.api import refresh, run
    from accy.preparation.products import SemanticModule
    from accy.reference import run_reference

    arrays, shapes = _inputs(path, 33)
    out = refresh(gpu_client, path, target="cuda", shapes=shapes,
                  store_url=gpu_client.store_url)
    assert out.status == "ok", out.failure
    load = [r for r in out.receipts if r.stage == "load"]
    assert load and not load[0].skipped and out.fragment and out.fragment["worker"]
    results = run(gpu_client, out, *arrays)
    ref = run_reference(SemanticModule.from_file(path).module, arrays)
    for got, want in zip(results, ref):
        want = want.astype(np.float64)
        scale = float(np.max(np.abs(want))) if want.size else 0.0
        np.testing.assert_allclose(np.asarray(got, dtype=np.float64), want, rtol=2e-5,
                                   atol=max(2e-5, 4e-6 * scale))


def test_variants_compiled_in_one_group_task_run_from_its_value(gpu_client) -> None:  # type: ignore[no-untyped-def]
    """CUDA variants compiled two to a group task (no task per chain): each runs from its
    entry of the group's value (``compile_pick``), on the worker that loaded it."""
    import dask

    from accy.distributed.api import run
    from accy.distributed.batch import run_batch
    from accy.preparation.products import SemanticModule
    from accy.reference import run_reference
    from accy.sweep import Variant

    path = os.path.join(ROOT, "graphs", "softmax.mlir")
    variants = [Variant(path, "cuda", {0: (rows, 96)}, {"kernel.block_size": b})
                for rows in (1, 17, 33, 4097) for b in (64, 128)]
    with dask.config.set({"accy.compile-grain": 2}):
        result = run_batch(gpu_client, variants, store_url=None)
    assert all(o.status == "ok" for o in result.outcomes), [o.failure for o in result.outcomes]
    assert {o.compile_pick for o in result.outcomes} == {0, 1}
    module = SemanticModule.from_file(path).module
    rng = np.random.default_rng(5)
    for v, o in zip(variants, result.outcomes):
        x = rng.standard_normal(v.shapes[0]).astype(np.float32)
        [got] = run(gpu_client, o, x)
        [want] = run_reference(module, [x])
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)
