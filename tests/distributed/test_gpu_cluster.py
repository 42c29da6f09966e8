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
