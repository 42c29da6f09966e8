"""The batch's control plane: fused chains, resolution without scans, a bounded state."""

from __future__ import annotations

import collections
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from distributed.diagnostics.plugin import SchedulerPlugin

from accy.distributed import graph
from accy.distributed.batch import run_batch
from accy.distributed.plugin import AccyCachePlugin
from accy.distributed.resolve import latest_index, resolve
from accy.distributed.state import fetch_state
from accy.errors import AccyError, WireFormatError
from accy.pipeline import PREPARATION_NAMES as STAGES
from accy.preparation.report import RECEIPT_ORDER
from accy.store import ArtifactStore
from accy.sweep import Variant

GRAPHS = Path(__file__).resolve().parents[2] / "graphs"


class StartedTasks(SchedulerPlugin):
    """The keys of every task the scheduler starts."""

    def __init__(self) -> None:
        self.started: list[Any] = []

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        if finish == "processing":
            self.started.append(key)


def test_a_variant_no_other_shares_is_one_task_and_each_stage_keeps_its_key(cluster,
                                                                            tmp_path):
    c, client = cluster
    # 13 rows: shapes no other test loads in this process (a fragment another test
    # loaded would make this batch's load a reuse)
    variants = [Variant(str(GRAPHS / p), "host", {0: (13, n)})
                for p, n in (("softmax.mlir", 256), ("layernorm.mlir", 4096),
                             ("rmsnorm.mlir", 4096))]
    store = str(tmp_path / "store")
    tasks = StartedTasks()
    c.scheduler.add_plugin(tasks, name="test-started")
    try:
        result = run_batch(client, variants, store_url=store)
    finally:
        c.scheduler.remove_plugin(name="test-started")
    assert all(o.status == "ok" for o in result.outcomes), [o.failure for o in result.outcomes]
    accy_tasks = [k for k in tasks.started if isinstance(k, tuple)
                  and str(k[0]).startswith(graph.TASK_PREFIX)]
    # one chain task per variant: contract … target, compile and load fused
    assert len(accy_tasks) == len(variants) == result.distinct_tasks
    assert {k[0] for k in accy_tasks} == {f"{graph.TASK_PREFIX}contract-load"}
    stored = ArtifactStore(store)
    state = fetch_state(client)
    for o in result.outcomes:
        # every stage still has its own receipt, key, stored product and published entry
        assert [r.stage for r in o.receipts] == list(RECEIPT_ORDER)
        assert all(not r.reused for r in o.receipts), [(r.stage, r.reused) for r in o.receipts]
        for r in o.receipts:
            if r.stage in STAGES:
                assert stored.get(r.key) is not None, (o.id, r.stage)
                assert state["entries"][r.key]["stage"] == r.stage


def test_stages_shared_by_several_variants_end_a_task_of_their_own(cluster, tmp_path):
    c, client = cluster
    variants = [Variant(str(GRAPHS / "softmax.mlir"), "host", {0: (8, 256)},
                        {"kernel.block_size": b}) for b in (128, 256, 512)]
    tasks = StartedTasks()
    c.scheduler.add_plugin(tasks, name="test-started")
    try:
        result = run_batch(client, variants, store_url=str(tmp_path / "store"))
    finally:
        c.scheduler.remove_plugin(name="test-started")
    assert all(o.status == "ok" for o in result.outcomes)
    names = collections.Counter(k[0] for k in tasks.started if isinstance(k, tuple)
                                and str(k[0]).startswith(graph.TASK_PREFIX))
    # contract … memory are shared: one task; kernel … load differ: one task each
    assert names == {f"{graph.TASK_PREFIX}contract-memory": 1,
                     f"{graph.TASK_PREFIX}kernel-load": 3}
    # the shared prefix is held under its chain key and published with it
    state = fetch_state(client)
    memory = {r.key for o in result.outcomes for r in o.receipts if r.stage == "memory"}
    [key] = memory
    assert state["entries"][key]["task_key"][0] == f"{graph.TASK_PREFIX}contract-memory"
    assert state["entries"][key]["pinned"]


class NoScan(Mapping[str, Any]):
    """Published variants that refuse to be iterated: a lookup by id is all one gets."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    def __iter__(self) -> Iterator[str]:
        raise AssertionError("resolve scanned the published variants")

    def __len__(self) -> int:
        return len(self.data)


def test_resolution_finds_the_nearest_variant_from_the_index_without_a_scan():
    published = {f"v{i}": {"program": f"p{i % 3}", "target": "host", "fields": {"i": i}}
                 for i in range(30)}
    latest = latest_index(published)
    requests = [{"semantic": "00" * 16, "stages": [], "variant": f"new{i}",
                 "program": f"p{i % 3}", "target": "host"} for i in range(5)]
    out = resolve({}, NoScan(published), [], requests, latest=latest)
    assert [r["nearest"]["fields"]["i"] for r in out["results"]] == [27, 28, 29, 27, 28]
    compact = resolve({}, NoScan(published), [], requests, latest=latest, compact=True)
    assert [r["nearest"] for r in compact["results"]] == ["v27", "v28", "v29", "v27", "v28"]
    assert sorted(compact["records"]) == ["v27", "v28", "v29"]


def test_the_published_state_is_bounded():
    class Scheduler:
        tasks: dict[Any, Any] = {}
        workers: dict[Any, Any] = {}

        def client_desires_keys(self, **kwargs: Any) -> None:
            pass

    plugin = AccyCachePlugin(max_pinned=10, max_entries=5, max_variants=3)
    plugin.scheduler = Scheduler()  # type: ignore[assignment]
    for i in range(12):
        assert plugin.publish(expected_version=i, entries={f"e{i}": {"stage": "kernel"}},
                              variants={f"v{i}": {"program": "p", "target": "host"}},
                              keys=[])["ok"]
    assert list(plugin.entries) == [f"e{i}" for i in range(7, 12)]
    assert list(plugin.variants) == ["v9", "v10", "v11"]
    assert plugin.resolve(requests=[{"semantic": "00", "stages": [], "variant": "x",
                                     "program": "p", "target": "host"}])[
        "results"][0]["nearest"] == {"program": "p", "target": "host"}


def test_a_chain_result_moves_without_its_binary_when_the_store_holds_it(tmp_path):
    from distributed.protocol import deserialize, serialize

    from accy.distributed.batch import _request
    from accy.preparation.products import SemanticModule

    v = Variant(str(GRAPHS / "softmax.mlir"), "cuda:sm_90", {0: (8, 256)})
    steps = [[s, "x"] for s in (*STAGES, "compile")]
    store = str(tmp_path / "store")
    out = graph.chain_task(steps, SemanticModule.from_file(v.program), _request(v).to_dict(),
                           store)
    binary = out.result.binary
    header, frames = serialize(out, serializers=("dask",))
    assert sum(len(bytes(f)) for f in frames) < len(binary)  # the receipts, not the cubin
    moved = deserialize(header, frames)
    assert moved.receipts["compile"]["key"] == out.result.key.hex
    assert moved.result.binary == binary  # read back from the store by its compile key
    # without a store the binary travels in the value
    alone = graph.chain_task(steps, SemanticModule.from_file(v.program),
                             _request(v).to_dict(), None)
    h2, f2 = serialize(alone, serializers=("dask",))
    assert deserialize(h2, f2).result.binary == alone.result.binary


# ------------------------------------------------------------------ compile grain


def test_cuda_chains_compile_several_to_a_task_each_keeping_its_key_and_failure(cluster,
                                                                                tmp_path):
    """The 8 kernel…compile chains of two programs' block-size sweeps (and one variant
    that fails its contract stage) run as group tasks whose compiles share an NVRTC
    program; every variant keeps its chain key, its receipts, its stored fragment and
    its own failure."""
    import dask

    from accy.executable.compile import CompiledFragment

    c, client = cluster
    variants = [Variant(str(GRAPHS / p), "cuda:sm_90", {0: (8, n)}, {"kernel.block_size": b})
                for p, n in (("softmax.mlir", 256), ("layernorm.mlir", 4096))
                for b in (64, 128, 256, 512)]
    variants.append(Variant(str(GRAPHS / "rmsnorm.mlir"), "cuda:sm_90", {0: (8, 100)}))
    store = str(tmp_path / "store")
    tasks = StartedTasks()
    c.scheduler.add_plugin(tasks, name="test-started")
    try:
        with dask.config.set({"accy.compile-grain": 8}):
            result = run_batch(client, variants, store_url=store)
    finally:
        c.scheduler.remove_plugin(name="test-started")
    names = collections.Counter(str(k[0]) for k in tasks.started if isinstance(k, tuple)
                                and str(k[0]).startswith(graph.TASK_PREFIX))
    groups = {n: k for n, k in names.items() if n.startswith(f"{graph.TASK_PREFIX}group-")}
    # 9 variants on 2 worker threads: 2 chains a group (two tasks a thread); the 8
    # kernel…compile chains make 4 groups, the failing contract…compile chain is alone
    assert graph.compile_grain(len(variants), 2) == 2
    assert groups == {f"{graph.TASK_PREFIX}group-kernel-compile": 4}, names
    # a chain in a group has no task of its own (no pick task per chain)
    assert f"{graph.TASK_PREFIX}kernel-compile" not in names, names
    by_id = {o.id: o for o in result.outcomes}
    failed = by_id["rmsnorm[target=cuda:sm_90,arg0=8x100]"]
    assert failed.status == "failed" and "disagrees with its static dims" in \
        failed.failure["message"]
    stored = ArtifactStore(store)
    for o in result.outcomes:
        if o is failed:
            continue
        assert o.status == "ok", o.failure
        assert [r.stage for r in o.receipts] == list(RECEIPT_ORDER)
        [comp] = [r for r in o.receipts if r.stage == "compile"]
        fragment = CompiledFragment.from_wire(stored.get(comp.key, kind="fragment"))
        # the shared cubin holds this variant's kernels under its renamed launch table
        for launch in fragment.plan.launches:
            assert launch.kernel.startswith("accy_g") and launch.kernel.encode() in \
                fragment.binary
    # a second batch over the same variants reuses everything (and groups nothing new)
    again = run_batch(client, variants[:-1], store_url=store)
    assert all(o.status == "ok" and all(r.reused for r in o.receipts if r.stage != "load")
               for o in again.outcomes)


def test_a_chain_group_moves_as_msgpack_with_its_failures():
    from distributed.protocol import deserialize, serialize

    ok = graph.ChainResult({"contract": {"key": "k"}}, None, None, "stage")
    ok._wire = b"product bytes"  # moved undecoded
    lost = graph.InputLost("gone", "memory", "memory")
    lost.receipts = {"contract": {"key": "k"}}
    header, frames = serialize(graph.ChainGroup([ok, lost]), serializers=("dask",))
    moved = deserialize(header, frames)
    assert isinstance(moved.entries[0], graph.ChainResult)
    assert moved.entries[0].receipts == ok.receipts and moved.entries[0]._wire == ok._wire
    assert type(moved.entries[1]) is graph.InputLost
    assert moved.entries[1].message == "gone" and moved.entries[1].receipts == lost.receipts
    assert graph.chain_pick_task(moved, 0) is moved.entries[0]
    try:
        graph.chain_pick_task(moved, 1)
    except graph.InputLost as e:
        assert e.stage == "memory"
    else:
        raise AssertionError("a failed chain's pick must raise its failure")


def test_a_chain_group_moves_a_receipt_its_chains_share_once():
    """Chains of one group that read one prefix carry that prefix's receipt dicts: the
    group's wire holds each once, and they come back equal (and shared)."""
    prefix = {"contract": {"key": "c" * 32, "fields": {"options": {"x": 1}}},
              "memory": {"key": "m" * 32, "pass_ns": {"plan": 5}}}
    chains = []
    for i in range(8):
        c = graph.ChainResult(dict(prefix, kernel={"key": str(i), "origin": "ran"}), None,
                              {"worker": "w"}, "stage")
        c._wire = b"product %d" % i
        chains.append(c)
    wire = graph.ChainGroup(chains).to_wire()
    alone = sum(len(c.to_wire()) for c in chains)
    assert len(wire) < 0.6 * alone
    moved = graph.ChainGroup.from_wire(wire)
    for c, m in zip(chains, moved.entries):
        assert m.receipts == c.receipts and m.load == c.load and m._wire == c._wire
    assert moved.entries[0].receipts["contract"] is moved.entries[7].receipts["contract"]
    with pytest.raises(WireFormatError):
        graph.ChainGroup.from_wire(wire[:-3])


def _two_chains() -> graph.ChainGroup:
    ok = graph.ChainResult({"contract": {"key": "k"}}, None, None, "stage")
    ok._wire = b"product bytes"
    lost = graph.InputLost("gone", "memory", "memory")
    return graph.ChainGroup([ok, lost])


def _receipts_of(value: Any) -> Any:
    return value.receipts


def test_a_task_reading_a_chain_of_a_group_picks_it_inside_its_own_task(cluster):
    """A chain run in a group task has no task of its own: a reader names the group and
    the chain's place in it (``GraphBuilder.ref``) and picks the entry itself; a failed
    chain's entry fails its reader with that chain's own failure."""
    from dask.highlevelgraph import HighLevelGraph, MaterializedLayer
    from dask.task_spec import Task

    c, client = cluster
    gkey = ("accy_group-test", "two-chains")
    tasks = {gkey: Task(gkey, _two_chains)}
    for i in (0, 1):
        key = ("accy_test-reader", str(i))
        tasks[key] = Task(key, _receipts_of, graph.GraphBuilder.ref(gkey, i))
    assert tasks[("accy_test-reader", "1")].dependencies == {gkey}
    readers = [("accy_test-reader", "0"), ("accy_test-reader", "1")]
    ok, lost = client.get(HighLevelGraph({"t": MaterializedLayer(tasks)}, {"t": set()}),
                          readers, sync=False)
    assert ok.result() == {"contract": {"key": "k"}}
    with pytest.raises(graph.InputLost, match="gone"):
        lost.result()
    # the entries as a published holder names them (what `accy.distributed.api.run` and
    # the tuner read): the group's value and a place in it
    group = _two_chains()
    assert graph.held_value(group, 0) is group.entries[0] and graph.held_value(ok, None) is ok


def test_a_chain_that_fails_in_a_group_fails_alone(tmp_path):
    """One group task, three chains: one fails its contract stage, one fails to compile
    (its target product's source is broken), one is fine. The broken compile costs the
    others nothing but a compile each of their own."""
    from accy.distributed.batch import _request
    from accy.preparation.products import SemanticModule

    good = Variant(str(GRAPHS / "softmax.mlir"), "cuda:sm_90", {0: (8, 256)})
    other = Variant(str(GRAPHS / "layernorm.mlir"), "cuda:sm_90", {0: (8, 4096)})
    bad = Variant(str(GRAPHS / "rmsnorm.mlir"), "cuda:sm_90", {0: (8, 100)})
    steps = [[s, "x"] for s in (*STAGES, "compile")]
    store = str(tmp_path / "store")
    # `other` runs to its target stage first, then its stored target product is broken
    target = graph.chain_task(steps[:-1], SemanticModule.from_file(other.program),
                              _request(other).to_dict(), store).result
    broken = target.product.module.attributes
    from accy.choir.attributes import StringAttr

    broken["target.source"] = StringAttr(broken["target.source"].value + "\nnot C++ at all;\n")
    group = graph.chain_group_task(
        [[steps, _request(good).to_dict()], [steps[-1:], _request(other).to_dict()],
         [steps, _request(bad).to_dict()]], store,
        SemanticModule.from_file(good.program), target, SemanticModule.from_file(bad.program))
    ok, failed_compile, failed_contract = group.entries
    assert isinstance(ok, graph.ChainResult) and ok.result.binary[:4] == b"\x7fELF"
    # compiled alone once the shared run failed: its kernels keep their planned names
    assert not any(launch.kernel.startswith("accy_g") for launch in ok.result.plan.launches)
    assert isinstance(failed_compile, graph.StageFailed) and failed_compile.stage == "compile"
    assert "not C++ at all" in open(failed_compile.reproducer).read()  # the saved source
    assert isinstance(failed_contract, graph.StageFailed)
    assert failed_contract.stage == "contract" and failed_contract.receipts == {}



class CaptureTasks:
    """A client that keeps the tasks of the graphs it is given, running none."""

    def __init__(self) -> None:
        self.tasks: dict[Any, Any] = {}

    def get(self, hlg: Any, keys: Any, sync: bool = False) -> list[Any]:
        self.tasks.update(dict(hlg))
        return list(keys)

def test_a_group_is_keyed_by_its_members():
    """Two batches (two clients) that group different chains never share a group key:
    a reader of one must never read the other's group (found by the fault suite's
    two-client trials: a pick read another batch's group under the same key)."""
    def groups(names: list[str]) -> set[Any]:
        g = graph.GraphBuilder()
        for n in names:
            request = {"target": "cuda:sm_90", "options": {}}
            g.node(("accy_compile", n), "compile", "outside", request, None,
                   program=("cuda:sm_90", ("--fmad=false",)))
        client = CaptureTasks()
        g.submit(client, grain=2)
        return {k for k in client.tasks if str(k[0]).startswith("accy_group-")}

    first, second, again = groups(["a", "b"]), groups(["a", "c"]), groups(["a", "b"])
    assert len(first) == len(second) == 1
    assert first != second and first == again



def test_alike_chains_up_to_the_whole_bound_stay_together():
    """Alike chains (one program, target and options: one source) of at most ``whole``
    stay together, several such sharing a group task of at most ``whole`` chains, so each
    source compiles once, on one worker; more than ``whole`` go in groups of the
    grain."""
    def group_sizes(counts: dict[str, int], whole: int) -> list[int]:
        g = graph.GraphBuilder()
        for prog, n in counts.items():
            for i in range(n):
                request = {"program": prog, "target": "cuda:sm_90", "options": {}}
                g.node(("accy_compile", f"{prog}{i}"), "compile", "outside", request, None,
                       program=("cuda:sm_90", ("--fmad=false",)))
        client = CaptureTasks()
        g.submit(client, grain=4, whole=whole)
        return sorted(len(t.args[0]) for k, t in client.tasks.items()
                      if str(k[0]).startswith("accy_group-"))

    assert group_sizes({"p": 9, "q": 3}, whole=0) == [4, 4, 4]  # p9 rides with q's three
    assert group_sizes({"p": 9, "q": 3}, whole=9) == [3, 9]
    assert group_sizes({"p": 4, "q": 3, "r": 2}, whole=8) == [2, 7]  # p and q share one
    # p: 10 > 9 in groups of the grain (its last two together), q whole
    assert group_sizes({"p": 10, "q": 3}, whole=9) == [2, 3, 4, 4]


def test_tasks_reading_a_shared_result_are_spread_over_the_workers():
    """Dask places a task where its inputs are: every variant of a shared prefix queued on
    the prefix's worker. The batch names a worker for each task that reads another
    task's result, round-robin, and lets the scheduler move it (allow_other_workers);
    tasks that read nothing are left to Dask."""
    class Capture:
        def __init__(self) -> None:
            self.layers: dict[str, Any] = {}

        def get(self, hlg: Any, keys: Any, sync: bool = False) -> list[Any]:
            self.layers = dict(hlg.layers)
            return list(keys)

    g = graph.GraphBuilder()
    request = {"target": "cuda:sm_90", "options": {}}
    prefix = g.node(("accy_memory", "p"), "memory", "outside", request, None)
    for n in "abcdef":  # six variants read the shared prefix
        k = g.node(("accy_kernel", n), "kernel", prefix, request, None)
        g.node(("accy_compile", n), "compile", k, request, None, gpu=True,
               program=("cuda:sm_90", ("--fmad=false",)))
    client = Capture()
    g.submit(client, grain=2, spread={False: ["tcp://c"], True: ["tcp://g1", "tcp://g2"]})
    placed = {name: (layer.annotations or {}, set(layer.mapping)) for name, layer
              in client.layers.items()}
    assert set(placed) == {"accy-stages", "accy-gpu@tcp://g1", "accy-gpu@tcp://g2"}
    assert placed["accy-stages"][1] == {("accy_memory", "p")}  # reads nothing: Dask's choice
    for w in ("tcp://g1", "tcp://g2"):
        annotations, keys = placed[f"accy-gpu@{w}"]
        assert annotations == {"resources": {"GPU": 1}, "workers": [w],
                               "allow_other_workers": True}
        assert all(k[0].startswith("accy_group-") for k in keys), keys  # no pick tasks
    # a graph whose tasks read others is left to Dask's root-task rule: none queued
    # as a data producer (the readers would hold the slots while the prefix waited)
    assert not any(t.data_producer for layer in client.layers.values()
                   for t in layer.mapping.values())
    # three groups of two variants, round-robin: two on g1, one on g2
    assert [len([k for k in placed[f"accy-gpu@{w}"][1] if k[0].startswith("accy_group-")])
            for w in ("tcp://g1", "tcp://g2")] == [2, 1]


def test_on_a_cluster_of_gpu_workers_the_gpu_tasks_are_unrestricted_and_queued():
    """When every worker is a GPU worker the resource restriction picks nothing, and a
    restricted task is never queued by the scheduler (it is placed on arrival, by
    count): the GPU tasks go without it. A task that reads no other task is a data
    producer, so the scheduler queues it and hands it to the next free worker."""
    class Capture:
        layers: dict[str, Any] = {}

        def get(self, hlg: Any, keys: Any, sync: bool = False) -> list[Any]:
            self.layers = dict(hlg.layers)
            return list(keys)

    def build() -> graph.GraphBuilder:
        g = graph.GraphBuilder()
        request = {"target": "cuda:sm_90", "options": {}}
        for n in "abcd":  # four variants, nothing shared: chains from the program
            k = g.node(("accy_target", n), "target", f"outside-{n}", request, None)
            g.node(("accy_compile", n), "compile", k, request, None, gpu=True,
                   program=("cuda:sm_90", ()))
        return g

    for restrict, expected in ((True, {"resources": {"GPU": 1}}), (False, None)):
        client = Capture()
        build().submit(client, grain=2, restrict_gpu=restrict)
        assert set(client.layers) == {"accy-gpu"}
        layer = client.layers["accy-gpu"]
        assert layer.annotations == expected
        tasks = list(layer.mapping.values())
        assert len(tasks) == 2 and all(t.data_producer for t in tasks)


def test_a_batch_of_independent_chains_is_queued_on_the_scheduler(cluster, tmp_path,
                                                                 monkeypatch):
    """The batch's root tasks wait on the scheduler until a worker has a free slot
    (they pass through ``queued``), rather than being placed up front — also when they
    are too few for Dask's own root-task heuristic (more than twice the threads)."""
    c, client = cluster
    seen = StartedTasks()
    queued: list[Any] = []

    class Queued(SchedulerPlugin):
        def transition(self, key: Any, start: str, finish: str, *a: Any, **k: Any) -> None:
            if finish == "queued":
                queued.append(key)

    c.scheduler.add_plugin(seen, name="started")
    c.scheduler.add_plugin(Queued(), name="queued")
    monkeypatch.setattr(c.scheduler, "WORKER_SATURATION", 1.0)  # one task a worker
    variants = [Variant(str(GRAPHS / "softmax.mlir"), "host", {0: (r, 256)})
                for r in (8, 16, 24, 32)]  # 4 chains on 2 threads: not "root-ish" to Dask
    result = run_batch(client, variants, store_url=str(tmp_path / "store"))
    assert all(o.status == "ok" for o in result.outcomes)
    roots = {k for k in seen.started if str(k[0]).startswith("accy_contract")}
    assert len(roots) == 4
    assert len(roots & set(queued)) == 2  # two started at once, two waited for a slot


def test_a_stage_run_two_chains_read_runs_in_both():
    """A stage read by two chains (a fast-math pair's kernel stage) is copied into both
    instead of being a task of its own; one read by three stays a task; a compile is
    never copied."""
    g = graph.GraphBuilder()
    request = {"target": "cuda:sm_90", "options": {}}
    start = g.node(("accy_dispatch", "d"), "dispatch", "outside", request, None)
    prefix = g.node(("accy_memory", "p"), "memory", start, request, None)  # ends d's chain
    pair = g.node(("accy_kernel", "k2"), "kernel", prefix, request, None)
    trio = g.node(("accy_kernel", "k3"), "kernel", prefix, request, None)
    for n in "ab":
        g.node(("accy_target", n), "target", pair, request, None)
    for n in "cde":
        g.node(("accy_target", n), "target", trio, request, None)
    compile_ = g.node(("accy_compile", "c"), "compile", ("accy_target", "a"), request, None)
    for n in "xy":
        g.node(("accy_load", n), "load", compile_, request, None)
    chains = g.segments(fuse_gpu=True)
    assert g.copied == {pair}
    assert [pair, ("accy_target", "a")] not in chains  # 'a' continues to its compile
    assert [pair, ("accy_target", "b")] in chains
    assert [pair, ("accy_target", "a"), compile_] in chains
    assert [pair] not in chains and [trio] in chains and [start, prefix] in chains
    assert [("accy_load", "x")] in chains and [("accy_load", "y")] in chains


def test_a_batch_submitted_at_once_keeps_whole_likenesses(cluster, tmp_path, monkeypatch):
    from accy.distributed import batch

    c, client = cluster
    groupings: list[Any] = []
    real = batch._submit

    def seen(client, todo, store_url, fresh, collector, grain, whole=0):  # type: ignore[no-untyped-def]
        groupings.append((grain, whole))
        return real(client, todo, store_url, fresh, collector, grain, whole)

    monkeypatch.setattr(batch, "_submit", seen)
    variants = [Variant(str(GRAPHS / "softmax.mlir"), "host", {0: (r, 256)})
                for r in range(8, 8 + 8 * 12, 8)]
    result = run_batch(client, variants, store_url=str(tmp_path / "store"))
    assert all(o.status == "ok" for o in result.outcomes)
    assert groupings == [(graph.compile_grain(12, 2), graph.whole_group(12, 2))] == [(3, 3)]


def test_a_large_batch_is_submitted_in_growing_chunks_and_each_variant_lands(cluster,
                                                                            tmp_path,
                                                                            monkeypatch):
    """The cluster starts on a first chunk while the client plans the rest; the variants
    of one prefix (program, target, shapes) stay in one chunk, so a stage they share is
    run once, and a program's prefixes come together (its sources' chains are then in
    few chunks, though the sweep varies the shapes outside the programs); every variant
    is published, so the same batch again reuses everything."""
    from accy.distributed import batch

    c, client = cluster
    chunks: list[int] = []
    real = batch._submit

    grains: list[int] = []
    wholes: list[int] = []
    programs: list[str] = []

    def counted(client, todo, store_url, fresh, collector, grain, whole=0):  # type: ignore[no-untyped-def]
        chunks.append(len(todo))
        grains.append(grain)
        wholes.append(whole)
        programs.extend(os.path.basename(v.program) for v, _, _ in todo)
        return real(client, todo, store_url, fresh, collector, grain, whole)

    monkeypatch.setattr(batch, "_submit", counted)
    monkeypatch.setattr(batch, "CHUNKED_ABOVE", 8)  # 24 variants: chunked here
    variants = [Variant(str(GRAPHS / prog), "host", {0: (r, cols)}, {"kernel.block_size": b})
                for r in range(8, 8 + 8 * 6, 8)
                for prog, cols in (("softmax.mlir", 256), ("layernorm.mlir", 4096))
                for b in (64, 128)]  # 12 prefixes of 2, the programs alternating
    result = run_batch(client, variants, store_url=str(tmp_path / "store"))
    assert len(chunks) >= 2 and sum(chunks) == len(variants)
    assert all(n % 2 == 0 for n in chunks)  # a prefix's two variants never apart
    # the first and last rounds go out in groups of half the grain (the cluster starts
    # sooner, the workers end together)
    full = max(grains)
    assert len(chunks) >= 3 and grains[0] == grains[-1] == max(1, full // 2) < full
    assert set(grains[1:-1]) == {full}
    assert programs == ["softmax.mlir"] * 12 + ["layernorm.mlir"] * 12  # a program's together
    # each chunk keeps its alike chains whole up to a bound of its own size, at least its
    # grain
    threads = batch._worker_threads(client)
    assert wholes == [max(g, graph.whole_group(n, threads)) for n, g in zip(chunks, grains)]
    assert [o.id for o in result.outcomes] == [v.id for v in variants]
    assert all(o.status == "ok" for o in result.outcomes)
    for o in result.outcomes[::2]:  # the contract … memory run, once a prefix
        pair = {r.stage: r for r in result.outcomes[result.outcomes.index(o) + 1].receipts}
        mine = {r.stage: r for r in o.receipts}
        assert sum(not x.reused for x in (mine["memory"], pair["memory"])) == 1
    chunks.clear()
    again = run_batch(client, variants, store_url=str(tmp_path / "store"))
    assert all(r.reused or r.skipped for o in again.outcomes for r in o.receipts)
    monkeypatch.setattr(batch, "CHUNKED_ABOVE", 256)
    chunks.clear()
    run_batch(client, variants, store_url=str(tmp_path / "store"))
    assert chunks == [len(variants)]  # a small batch is one graph


def _chunked(monkeypatch: pytest.MonkeyPatch) -> list[Variant]:
    from accy.distributed import batch

    monkeypatch.setattr(batch, "CHUNKED_ABOVE", 8)
    return [Variant(str(GRAPHS / "softmax.mlir"), "host", {0: (r, 256)})
            for r in range(8, 8 + 8 * 24, 8)]


def test_the_first_results_are_collected_while_later_chunks_are_submitted(cluster, tmp_path,
                                                                          monkeypatch):
    """Later chunks go out from a thread of their own: a variant of the first chunk is
    finished (reported, published) before the last chunk is submitted."""
    import threading

    from accy.distributed import batch

    c, client = cluster
    variants = _chunked(monkeypatch)
    seen = threading.Event()
    waited: list[bool] = []
    real = batch._submit

    def late(client, todo, *args, **kwargs):  # type: ignore[no-untyped-def]
        if args[2] is not None:  # a later chunk (the first passes no collector)
            waited.append(seen.wait(timeout=20))
        return real(client, todo, *args, **kwargs)

    monkeypatch.setattr(batch, "_submit", late)
    result = run_batch(client, variants, store_url=str(tmp_path / "store"),
                       on_done=lambda o: seen.set())
    assert waited and all(waited)  # the collecting loop ran while the submitter waited
    assert [o.status for o in result.outcomes] == ["ok"] * len(variants)
    again = run_batch(client, variants, store_url=str(tmp_path / "store"))
    assert all(r.reused or r.skipped for o in again.outcomes for r in o.receipts)


def test_a_failure_submitting_a_later_chunk_ends_the_batch_with_it(cluster, tmp_path,
                                                                   monkeypatch):
    """What stops the submitter thread (the scheduler gone, say) is raised by the batch,
    which does not wait for the variants that were never submitted."""
    from accy.distributed import batch

    c, client = cluster
    variants = _chunked(monkeypatch)
    real = batch._submit

    def broken(client, todo, *args, **kwargs):  # type: ignore[no-untyped-def]
        if args[2] is not None:
            raise AccyError("the scheduler went away")
        return real(client, todo, *args, **kwargs)

    monkeypatch.setattr(batch, "_submit", broken)
    with pytest.raises(AccyError, match="went away"):
        run_batch(client, variants, store_url=str(tmp_path / "store"))


def test_a_chunk_takes_its_workers_from_the_resolve_answer_not_a_round_trip_of_its_own(
        cluster, tmp_path, monkeypatch):
    """The resolve answer names each worker and whether it has a GPU; a chunk spreads its
    readers over those, asking the scheduler's identity only of a plugin that does not
    say (the batch's worker-thread count is asked once, before the first chunk)."""
    from accy.distributed import batch

    c, client = cluster
    variants = _chunked(monkeypatch)
    answer = client.sync(client.scheduler.accy_resolve, requests=[])
    assert answer["workers"] == {a: False for a in client.scheduler_info()["workers"]}
    asked: list[int] = []
    real_info = type(client).scheduler_info

    def counted(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        asked.append(1)
        return real_info(self, *args, **kwargs)

    monkeypatch.setattr(type(client), "scheduler_info", counted)
    result = run_batch(client, variants, store_url=str(tmp_path / "store"))
    assert result.report()["summary"]["ok"] == len(variants)
    assert len(asked) == 1  # the thread count; no chunk asked again
    assert batch._spread(client, None) == {False: sorted(answer["workers"]), True: []}


def test_publishes_run_in_order_off_the_collecting_thread_and_a_failure_is_raised():
    """The collecting loop hands each group to the publisher and goes on; the publishes
    keep their order, plans are released once theirs is published, and after a failed
    one nothing more is published and closing raises it."""
    import threading

    from accy.distributed.batch import _Publisher
    from accy.distributed.state import PublishConflict

    class Plan:
        released = False

        def release(self) -> None:
            self.released = True

    class Collector:
        def __init__(self) -> None:
            self.seen: list[Any] = []
            self.threads: set[str] = set()

        def publish(self, publications: list[Any]) -> None:
            self.threads.add(threading.current_thread().name)
            if publications == ["bad"]:
                raise PublishConflict("lost the race")
            self.seen.append(list(publications))

    c = Collector()
    plans = [Plan(), Plan()]
    pub = _Publisher(c)  # type: ignore[arg-type]
    pub.send(["a"], [plans[0]])
    pub.send([], [])
    pub.send(["b"], [plans[1]])
    pub.close()
    assert c.seen == [["a"], ["b"]] and all(p.released for p in plans)
    assert c.threads and threading.current_thread().name not in c.threads

    c, late = Collector(), Plan()
    pub = _Publisher(c)  # type: ignore[arg-type]
    pub.send(["bad"], [])
    pub.send(["c"], [late])
    with pytest.raises(PublishConflict, match="lost the race"):
        pub.close()
    assert c.seen == [] and not late.released


def test_a_batch_ending_on_its_own_error_drops_the_publishes_not_started():
    """Ending on its own error (a lost cluster, Ctrl-C), a batch waits for the publish in
    flight but not for those queued behind it."""
    import threading
    import time

    from accy.distributed.batch import _Publisher

    started, release = threading.Event(), threading.Event()

    class Collector:
        seen: list[Any] = []

        def publish(self, publications: list[Any]) -> None:
            started.set()
            release.wait(5)
            self.seen.append(list(publications))

    c = Collector()
    pub = _Publisher(c)  # type: ignore[arg-type]
    pub.send(["first"], [])
    pub.send(["second"], [])
    started.wait(5)
    closer = threading.Thread(target=pub.close, kwargs={"cancel": True})
    closer.start()  # cancels the queued one at once, then waits for the one in flight
    deadline = time.monotonic() + 5
    while not pub.sent[1].cancelled() and time.monotonic() < deadline:
        time.sleep(0.001)
    release.set()
    closer.join(5)
    assert not closer.is_alive() and c.seen == [["first"]]
