"""``LoadedFragment.launch_all`` on the GPU: launches made ready once per address set, a
CUDA graph of a multi-launch table from the second call, and the tuner's graph timer."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "preparation"))
from stage_programs import graph  # noqa: E402

from accy.executable import fragment as fragment_module  # noqa: E402
from accy.executable.cache import FragmentCompilerCache  # noqa: E402
from accy.preparation.options import RunOptions  # noqa: E402
from accy.preparation.stages import PreparationRequest  # noqa: E402

pytestmark = pytest.mark.gpu


def _loaded(name: str, shapes: dict[int, tuple[int, ...]]):  # type: ignore[no-untyped-def]
    sm = graph(name)
    update = FragmentCompilerCache().refresh_from_semantic_module(
        sm, PreparationRequest(options=RunOptions.parse("cuda", []), shapes=shapes))
    return sm, update.fragment


def _reductions(rows: int, cols: int):  # type: ignore[no-untyped-def]
    """graphs/reductions.mlir (static 64×128) at rows×cols, as the benchmark renames it."""
    from accy.preparation.products import SemanticModule

    path = Path(__file__).resolve().parents[2] / "graphs" / "reductions.mlir"
    text = path.read_text().replace("64x128", f"{rows}x{cols}") \
        .replace("tensor<64x", f"tensor<{rows}x").replace("1x128", f"1x{cols}")
    sm = SemanticModule.from_text(text, str(path))
    update = FragmentCompilerCache().refresh_from_semantic_module(
        sm, PreparationRequest(options=RunOptions.parse("cuda", []), shapes={}))
    return update.fragment


@pytest.mark.parametrize("graphs", [True, False])
def test_launch_all_replays_a_multi_launch_table_as_one_graph(
        graphs: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    import cupy

    monkeypatch.setattr(fragment_module, "GRAPHS", graphs)
    frag = _reductions(300, 4097)
    # the process keeps this loaded fragment, and CuPy's pool may hand the arrays below
    # the addresses an earlier run made ready (its graph with them): start from none
    frag._ready.clear()
    assert len(frag.plan.launches) > 1
    x = np.random.default_rng(0).standard_normal((300, 4097)).astype(np.float32)
    want = [np.asarray(w) for w in frag(x)]
    args, results = frag.prepare([x])
    outs = []
    for _ in range(3):  # plain launches, then the capture, then a replay
        for r in results:
            r.fill(np.nan)
        frag.launch_all(args, results)
        cupy.cuda.get_current_stream().synchronize()
        outs.append([cupy.asnumpy(r) for r in results])
    for got in outs:
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g.reshape(w.shape), w)
    ready = frag._ready[tuple(a.data.ptr for a in args) + (-1,)
                        + tuple(r.data.ptr for r in results)]
    assert (ready.graph is not None) == graphs
    before = len(frag._ready)
    # new result buffers are a new address set: ready again, the first one still kept
    other = frag.allocate_results()
    frag.launch_all(args, other)
    cupy.cuda.get_current_stream().synchronize()
    assert len(frag._ready) == min(before + 1, fragment_module.READY_SETS)
    for g, w in zip(other, want):
        np.testing.assert_array_equal(cupy.asnumpy(g).reshape(w.shape), w)


def test_a_single_launch_fragment_is_never_captured() -> None:
    import cupy

    _, frag = _loaded("softmax", {0: (64, 1024)})
    assert len(frag.plan.launches) == 1
    x = cupy.asarray(np.random.default_rng(1).standard_normal((64, 1024)).astype(np.float32))
    args, results = frag.prepare([x])
    for _ in range(3):
        frag.launch_all(args, results)
    cupy.cuda.get_current_stream().synchronize()
    assert [r.graph for r in frag._ready.values()] == [None]
    np.testing.assert_allclose(cupy.asnumpy(results[0]), cupy.asnumpy(frag(x)[0]), rtol=0,
                               atol=0)


def test_the_graph_timer_times_what_the_launches_do() -> None:
    """The graph timer and back-to-back launches agree on a kernel that is not
    launch-bound (within the machine's noise: a loose bound, not a timing claim), and
    a multi-launch fragment inside the timer's capture launches its kernels."""
    from accy.executable.device import GraphTimer, time_cuda

    frag = _reductions(4096, 4096)
    x = np.random.default_rng(2).standard_normal((4096, 4096)).astype(np.float32)
    args, results = frag.prepare([x])

    def run() -> None:
        frag.launch_all(args, results)

    for _ in range(3):
        run()
    timer = GraphTimer(run, 20)
    by_graph = float(np.median(timer(5)))
    by_launches = float(np.median(time_cuda(run, 20, 5)))
    assert by_graph > 0 and by_launches > 0
    assert by_graph < 3 * by_launches
    for r, w in zip(results, frag(x)):  # the timed graphs computed the results
        np.testing.assert_array_equal(r.get().reshape(np.shape(w)), np.asarray(w))
