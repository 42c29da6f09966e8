"""No refresh fails because a cache tier is gone: released pins fall back to the
store, a missing store entry to recomputing, a store that cannot be written to a
warning on the receipt; a store entry under the wrong key is never reused."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from accy.distributed.batch import run_batch
from accy.distributed.state import unpin
from accy.sweep import Variant

GRAPHS = Path(__file__).resolve().parents[2] / "graphs"


def _variant(name: str = "softmax", target: str = "host") -> Variant:
    return Variant(str(GRAPHS / f"{name}.mlir"), target, {0: (8, 256)})


def _ok(result) -> dict[str, dict]:  # type: ignore[no-untyped-def]
    assert result.failed == 0, [o.failure for o in result.outcomes]
    return {o.id: {r.stage: r for r in o.receipts} for o in result.outcomes}


@pytest.mark.parametrize("target", ["host", "cuda:sm_90"])
@pytest.mark.parametrize("with_store", [True, False])
def test_a_variant_refreshes_again_after_its_pins_are_released(cluster, tmp_path, target,
                                                               with_store):
    _, client = cluster
    store = str(tmp_path / "store") if with_store else None
    v = _variant(target=target)
    _ok(run_batch(client, [v], store_url=store))
    unpin(client)  # every held product is gone from worker memory
    got = _ok(run_batch(client, [v], store_url=store))[v.id]
    if with_store:  # read back from the store, not recomputed
        assert got["target"].reused and got["target"].source in ("cluster", "store")
    else:  # nothing holds the products any more: they are recomputed
        assert not got["contract"].reused


def test_an_evicted_store_entry_is_recomputed(cluster, tmp_path):
    _, client = cluster
    store = tmp_path / "store"
    v = _variant()
    _ok(run_batch(client, [v], store_url=str(store)))
    unpin(client)
    shutil.rmtree(store)  # the store lost everything the published state points at
    got = _ok(run_batch(client, [v], store_url=str(store)))[v.id]
    assert got["compile"].key


def test_a_store_that_cannot_be_written_is_a_warning_not_a_failure(tmp_path, monkeypatch):
    from accy.executable.cache import FragmentCompilerCache
    from accy.preparation.products import SemanticModule
    from accy.preparation.stages import PreparationRequest
    from accy.store import ArtifactStore

    store = ArtifactStore(str(tmp_path / "store"))

    def refuse(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store, "put", refuse)
    cache = FragmentCompilerCache(store=store)
    update = cache.refresh_from_semantic_module(
        SemanticModule.from_file(str(GRAPHS / "softmax.mlir")),
        PreparationRequest(shapes={0: (8, 256)}))
    ran = [r for r in update.report.receipts if not r.reused and r.stage != "load"]
    assert ran and all("No space left" in (r.warning or "") for r in ran), ran


def test_a_fragment_copied_over_another_key_is_not_reused(tmp_path):
    """The swapped-entry attack: softmax must never run gelu_tanh's binary."""
    import numpy as np

    from accy.executable.cache import FragmentCompilerCache
    from accy.preparation.products import SemanticModule
    from accy.preparation.stages import PreparationRequest
    from accy.store import ArtifactStore

    store_dir = tmp_path / "store"
    req = PreparationRequest(shapes={0: (8, 4096)})

    def refresh(name: str):  # type: ignore[no-untyped-def]
        cache = FragmentCompilerCache(store=ArtifactStore(str(store_dir)))
        return cache.refresh_from_semantic_module(
            SemanticModule.from_file(str(GRAPHS / f"{name}.mlir")), req)

    ka = refresh("softmax").report.receipt("compile").key
    kb = refresh("gelu_tanh").report.receipt("compile").key
    files = {p.name: p for p in store_dir.rglob("*") if p.is_file()}
    files[ka].write_bytes(files[kb].read_bytes())  # an intact entry, another key's
    again = refresh("softmax")
    assert not again.report.receipt("compile").reused  # a miss: recompiled
    x = np.random.default_rng(0).standard_normal((8, 4096)).astype(np.float32)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    (y,) = again.fragment(x)
    np.testing.assert_allclose(np.asarray(y), e / e.sum(axis=1, keepdims=True), rtol=1e-5)


def test_a_program_travels_inline_decoded_once_and_checked():
    """No scatter (a batch's tasks were placed where its one copy lived, and a worker
    dying mid-scatter hung it): the program is a literal task argument, decoded once per
    process, and bytes that do not match the fingerprint they claim never run."""
    import pickle

    from accy.distributed import graph
    from accy.errors import AccyError
    from accy.preparation.products import SemanticModule

    sm = SemanticModule.from_file(str(GRAPHS / "softmax.mlir"))
    other = SemanticModule.from_file(str(GRAPHS / "layernorm.mlir"))
    p = graph.InlineProgram.of(sm)
    back = pickle.loads(pickle.dumps(p))  # what the task spec does with it
    assert back == p and graph.program_of(back).fingerprint() == sm.fingerprint()
    assert graph.program_of(back) is graph.program_of(p)  # decoded once
    forged = graph.InlineProgram(sm.fingerprint(), other.to_wire())
    with pytest.raises(AccyError, match="does not match its fingerprint"):
        graph.program_of(forged)
    # two chains of one program in one task: the bytes are pickled once
    one, two = len(pickle.dumps([p])), len(pickle.dumps([p, p]))
    assert two - one < 64 < len(p.wire)


def test_a_batch_graph_has_no_data_dependencies_on_the_programs():
    """Chains that start from the program are tasks without dependencies: the scheduler
    spreads them, none waits on a worker holding data."""
    from accy.distributed.batch import _request
    from accy.distributed.graph import GraphBuilder, InlineProgram, plan_refresh
    from accy.preparation.products import SemanticModule
    from accy.sweep import Variant

    sm = SemanticModule.from_file(str(GRAPHS / "softmax.mlir"))
    g = GraphBuilder()
    programs: dict = {}
    for rows in (8, 16):
        plan_refresh(None, sm, _request(Variant(str(GRAPHS / "softmax.mlir"), "host",
                                                {0: (rows, 256)})),
                     {"resolved": []}, None, False, g, programs)
    firsts = [n for n in g.nodes.values() if n.after is None]
    assert len(firsts) == 2 and all(isinstance(n.arg, InlineProgram) for n in firsts)
    assert firsts[0].arg is firsts[1].arg is programs[sm.fingerprint()]


def test_a_batch_whose_cluster_loses_every_worker_ends_in_bounded_time(monkeypatch):
    """No worker left (none restarted, or the scheduler gone): the graph's tasks would
    wait without bound; the batch ends with one ClusterLost after NO_WORKERS_WAIT_S."""
    import threading
    import time

    from distributed import Client, LocalCluster

    import accy.distributed as ad
    from accy.distributed import graph
    from accy.distributed.batch import ClusterLost, run_batch
    from accy.sweep import Variant

    monkeypatch.setattr(graph, "NO_WORKERS_WAIT_S", 2)
    variants = [Variant(str(GRAPHS / "layernorm.mlir"), "host", {0: (8 + i, 4096)})
                for i in range(12)]
    box: dict = {}
    with LocalCluster(processes=False, n_workers=1, threads_per_worker=1,
                      dashboard_address=":0", **ad.local_cluster_kwargs()) as cluster, \
            Client(cluster) as client:
        def batch() -> None:
            try:
                box["result"] = run_batch(client, variants)
            except BaseException as e:  # noqa: BLE001
                box["error"] = e

        thread = threading.Thread(target=batch, daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while not any(ws.processing for ws in cluster.scheduler.workers.values()) \
                and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.005)
        started = time.monotonic()
        cluster.scale(0)
        thread.join(30)
        assert not thread.is_alive(), "the batch waited without bound"
        if "result" in box:
            pytest.skip("the batch finished before the workers left")
        # the tasks wait (the watchdog ends them) or are released and their retry
        # finds no worker to send the programs to: one ClusterLost either way
        assert isinstance(box["error"], ClusterLost), box
        assert "no workers" in str(box["error"])
        assert time.monotonic() - started < 20
