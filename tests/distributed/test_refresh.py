"""Refreshes on a Dask cluster: msgpack transfer, shared stages, reuse, warm starts,
concurrent clients, failures that publish nothing, lost workers, a corrupt store."""

from __future__ import annotations

import collections
import os
import pickle
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from distributed import Client, Future
from distributed.diagnostics.plugin import SchedulerPlugin

from accy import pipeline
from accy.choir.passes import Pass, Reproducer, replay
from accy.distributed import graph
from accy.distributed import serialize as accy_serialize
from accy.distributed import state as accy_state
from accy.distributed.api import refresh
from accy.distributed.batch import BatchResult, VariantOutcome, run_batch
from accy.distributed.plugin import get_plugin
from accy.distributed.state import fetch_state, inconsistencies
from accy.errors import AccyError, PassFailedError
from accy.pipeline import PREPARATION_NAMES as STAGES
from accy.preparation import recipe
from accy.preparation.report import RECEIPT_ORDER, Receipt
from accy.preparation.stages import StageResult
from accy.store import ArtifactStore, encode_entry
from accy.sweep import Variant

GRAPHS = Path(__file__).resolve().parents[2] / "graphs"
SHARED = ("contract", "tensor", "dispatch", "memory")
"""The stages variants differing only in ``kernel.*`` options share."""


def program(name: str) -> str:
    return str(GRAPHS / f"{name}.mlir")


def softmax(target: str = "host", block_size: int | None = None, rows: int = 8) -> Variant:
    options = {} if block_size is None else {"kernel.block_size": block_size}
    return Variant(program("softmax"), target, {0: (rows, 256)}, options)


def layernorm(target: str = "host") -> Variant:
    return Variant(program("layernorm"), target, {0: (8, 4096)})


def mlp(target: str = "host") -> Variant:
    return Variant(program("mlp"), target, {0: (16, 256)})


def receipts(outcome: VariantOutcome) -> dict[str, Receipt]:
    stages = [r.stage for r in outcome.receipts]
    assert stages == [s for s in RECEIPT_ORDER if s in stages], "receipts out of pipeline order"
    assert len(set(stages)) == len(stages), f"two receipts for one stage: {stages}"
    return {r.stage: r for r in outcome.receipts}


def assert_all_ok(result: BatchResult) -> None:
    failed = {o.id: o.failure for o in result.outcomes if o.status != "ok"}
    assert not failed, failed
    for o in result.outcomes:
        assert [r.stage for r in o.receipts] == list(RECEIPT_ORDER), o.id


def assert_consistent(state: dict[str, Any]) -> None:
    """Every published variant names entries that exist, chained input to output."""
    assert not inconsistencies(state), inconsistencies(state)


@pytest.fixture
def publishes(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Every compare-and-swap this process sends: the variants it carried and the reply."""
    calls: list[dict[str, Any]] = []
    real = accy_state._publish

    async def counting(client: Any, expected_version: int, entries: Any, variants: Any,
                       keys: Any) -> Any:
        reply = await real(client, expected_version, entries, variants, keys)
        calls.append({"variants": sorted(variants), "ok": bool(reply["ok"]),
                      "version": reply["version"]})
        return reply

    monkeypatch.setattr(accy_state, "_publish", counting)
    return calls


def successful(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [c for c in calls if c["ok"]]


class StageTasks(SchedulerPlugin):
    """Counts the accy stage, compile and load tasks the scheduler starts."""

    def __init__(self) -> None:
        self.started: list[Any] = []

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        if finish == "processing" and isinstance(key, tuple) and \
                key[0] in {f"{graph.TASK_PREFIX}{s}" for s in RECEIPT_ORDER}:
            self.started.append(key)


# -- 1. msgpack, never pickle


def test_stage_results_cross_worker_processes_only_as_msgpack(make_cluster, tmp_path):
    with pytest.raises(TypeError, match="never pickles"):
        pickle.dumps(StageResult.__new__(StageResult))
    variants = [softmax(t, b) for t in ("host", "cuda:sm_90") for b in (128, 256)]
    with make_cluster(processes=True) as (_, client):
        result = run_batch(client, variants, store_url=str(tmp_path / "store"))
        # Products refuse to pickle: had any of them been pickled, its task had failed.
        assert_all_ok(result)
        counts = client.run(accy_serialize.counts)
        state = fetch_state(client)
        who_has = client.who_has()
        pinned = [e for e in state["entries"].values() if e.get("pinned")
                  and e["stage"] in STAGES]
        holders = {tuple(e["task_key"]): list(who_has.get(tuple(e["task_key"]), ()))
                   for e in pinned}
        replicated = [e for e in pinned if len(holders[tuple(e["task_key"])]) == 2]
        single = [e for e in pinned if len(holders[tuple(e["task_key"])]) == 1]
        assert replicated or single, holders
        if replicated:
            # a stage result on both workers crossed between them during the batch (it
            # is held inside the chain task's result, which moves as msgpack)
            assert sum(c["deserialize"].get("chain", 0) for c in counts.values()) >= 1
        if single:
            # Move a published stage result to the worker that does not hold it.
            entry = single[0]
            held = Future(tuple(entry["task_key"]), client=client)
            [holder] = holders[held.key]
            [other] = [w for w in counts if w != holder]
            wire = client.submit(_held_stage_result_wire, held, workers=[other],
                                 allow_other_workers=False, pure=False).result()
            assert StageResult.from_wire(wire).product.fingerprint() == entry["fingerprint"]
            after = client.run(accy_serialize.counts)
            assert after[holder]["serialize"]["chain"] > \
                counts[holder]["serialize"].get("chain", 0)
            assert after[other]["deserialize"]["chain"] > \
                counts[other]["deserialize"].get("chain", 0)
            del held


def _held_stage_result_wire(held: graph.ChainResult) -> bytes:
    """On a worker: the stage result a published key holds (a chain task's value)."""
    assert isinstance(held, graph.ChainResult) and isinstance(held.result, StageResult)
    return held.result.to_wire()


# -- 2. shared stages run once


def test_variants_sharing_stages_run_each_shared_stage_once(cluster, tmp_path, monkeypatch):
    _, client = cluster
    runs: collections.Counter[tuple[str, str]] = collections.Counter()
    lock = threading.Lock()
    real = pipeline.Stage.run

    def counting_run(self: pipeline.Stage, prev: Any, *args: Any, **kwargs: Any) -> StageResult:
        with lock:
            runs[(self.name, prev.fingerprint())] += 1
        return real(self, prev, *args, **kwargs)

    monkeypatch.setattr(pipeline.Stage, "run", counting_run)
    variants = [softmax("cuda:sm_90", b) for b in (128, 256, 512)]
    result = run_batch(client, variants, store_url=str(tmp_path / "store"))
    assert_all_ok(result)

    per_stage = collections.Counter(stage for stage, _ in runs.elements())
    for stage in SHARED:
        assert per_stage[stage] == 1, runs  # one input, one run
    assert [n for (stage, _), n in runs.items() if stage in SHARED] == [1] * len(SHARED)
    # kernel reads block_size: one run per variant, all on the one memory product
    assert per_stage["kernel"] == len(variants) and per_stage["target"] == len(variants)

    by_variant = [receipts(o) for o in result.outcomes]
    for stage in SHARED:
        marks = [r[stage] for r in by_variant]
        assert len({r.key for r in marks}) == 1
        assert sum(not r.reused for r in marks) == 1, (stage, marks)
        assert all(r.source == "cluster" for r in marks if r.reused)
        ran = next(r for r in marks if not r.reused)
        assert ran.pass_stats and ran.elapsed_ns > 0
    for r in by_variant:
        assert not r["kernel"].reused and not r["target"].reused and not r["compile"].reused
        assert r["load"].skipped == "no GPU"  # no GPU worker: NVRTC compiled, nothing loaded
    assert len({r["compile"].key for r in by_variant}) == len(variants)
    s = result.report()["summary"]
    assert s["stage_runs"] == len(SHARED) + 3 * len(variants)
    assert s["reuses"] == len(SHARED) * (len(variants) - 1)


def test_a_stage_two_variants_share_runs_in_each_chain_with_its_own_receipt(cluster,
                                                                             tmp_path,
                                                                             monkeypatch):
    """A fast-math pair shares its kernel stage; the stage is copied into both chains (no
    task of its own). Each receipt says what that chain did: it ran the stage, or read
    the other's product back from the store — never "reused from the cluster"."""
    _, client = cluster
    runs: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()
    real = pipeline.Stage.run

    def counting_run(self: pipeline.Stage, prev: Any, *args: Any, **kwargs: Any) -> StageResult:
        with lock:
            runs[self.name] += 1
        return real(self, prev, *args, **kwargs)

    monkeypatch.setattr(pipeline.Stage, "run", counting_run)
    # memory is shared by two block sizes; each block size's kernel by a fast-math pair
    variants = [Variant(v.program, v.target, v.shapes, {**v.options, "target.fast_math": f})
                for v in (softmax("cuda:sm_90", 128), softmax("cuda:sm_90", 256))
                for f in (False, True)]
    result = run_batch(client, variants, store_url=str(tmp_path / "store"))
    assert_all_ok(result)
    kernel = [receipts(o)["kernel"] for o in result.outcomes]
    assert kernel[0].key == kernel[1].key != kernel[2].key == kernel[3].key
    assert all(not r.reused or r.source == "store" for r in kernel), kernel
    assert 2 <= runs["kernel"] <= 4  # the second chain of a pair ran it too, or read it back
    assert sum(not r.reused for r in kernel) == runs["kernel"]
    memory = [receipts(o)["memory"] for o in result.outcomes]
    assert sum(not r.reused for r in memory) == 1  # a task of its own: run once, shared


# -- 3. a second batch reuses everything


def test_a_second_batch_reuses_everything_and_submits_no_stage_task(cluster, tmp_path):
    c, client = cluster
    variants = [softmax("host"), layernorm("host"), softmax("cuda:sm_90", 128),
                softmax("cuda:sm_90", 256)]
    store = str(tmp_path / "store")
    first = run_batch(client, variants, store_url=store)
    assert_all_ok(first)
    version = fetch_state(client)["version"]
    assert version >= 1

    tasks = StageTasks()
    c.scheduler.add_plugin(tasks, name="test-stage-tasks")
    try:
        second = run_batch(client, variants, store_url=store)
        time.sleep(0.1)  # anything submitted would be processing by now
    finally:
        c.scheduler.remove_plugin(name="test-stage-tasks")
    assert_all_ok(second)
    assert tasks.started == []
    assert second.distinct_tasks == 0
    for o in second.outcomes:
        for r in o.receipts:
            if r.stage == "load" and o.id.find("target=cuda") >= 0:
                assert r.skipped == "no GPU" and not r.reused
            else:
                assert r.reused and r.source == "cluster", (o.id, r)
    s = second.report()["summary"]
    assert s["stage_runs"] == 0 and s["ok"] == len(variants)
    assert fetch_state(client)["version"] == version  # nothing new to publish


# -- 4. a new cluster starts warm from the store


def test_a_new_cluster_on_the_same_store_reads_the_stages_back(make_cluster, tmp_path):
    variants = [softmax("host"), mlp("host"), softmax("cuda:sm_90", 128)]
    store = str(tmp_path / "store")
    with make_cluster() as (_, client):
        first = run_batch(client, variants, store_url=store)
        assert_all_ok(first)
    assert len(ArtifactStore(store)) > 0
    with make_cluster() as (_, client):
        assert fetch_state(client) == {"version": 0, "entries": {}, "variants": {}}
        second = run_batch(client, variants, store_url=store)
        assert_all_ok(second)
        for o, before in zip(second.outcomes, first.outcomes):
            got, old = receipts(o), receipts(before)
            for stage in (*STAGES, "compile"):
                assert got[stage].reused and got[stage].source == "store", (o.id, got[stage])
                assert got[stage].key == old[stage].key
                assert got[stage].pass_stats == {}
        state = fetch_state(client)
        assert sorted(state["variants"]) == sorted(v.id for v in variants)
        assert_consistent(state)


# -- 5. two clients refreshing concurrently


def test_two_clients_refreshing_concurrently_leave_a_consistent_state(cluster, tmp_path,
                                                                      publishes):
    c, client = cluster
    store = str(tmp_path / "store")
    barrier = threading.Barrier(2, timeout=30)
    outcomes: dict[str, list[VariantOutcome]] = {}
    errors: list[BaseException] = []

    def with_refresh(other: Client) -> None:
        barrier.wait()
        outcomes["refresh"] = [
            refresh(other, program("softmax"), target="cuda:sm_90", shapes={0: (8, 256)},
                    options={"kernel.block_size": b}, store_url=store) for b in (128, 1024)]

    def with_batch(other: Client) -> None:
        barrier.wait()
        outcomes["batch"] = run_batch(other, [softmax("cuda:sm_90", 256), softmax("host")],
                                      store_url=store).outcomes

    with Client(c) as second:
        threads = [threading.Thread(target=_catching(fn, errors), args=(cl,))
                   for fn, cl in ((with_refresh, client), (with_batch, second))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not any(t.is_alive() for t in threads)
    assert not errors, errors
    done = [o for os_ in outcomes.values() for o in os_]
    assert len(done) == 4 and all(o.status == "ok" for o in done), \
        [(o.id, o.failure) for o in done]

    state = fetch_state(client)
    assert sorted(state["variants"]) == sorted(o.id for o in done)
    assert_consistent(state)
    ok = successful(publishes)
    assert state["version"] == len(ok) == get_plugin(c.scheduler).stats["publishes"]
    assert sorted(v for call in ok for v in call["variants"]) == sorted(o.id for o in done)
    # the CUDA variants differ only in kernel options: one published prefix
    cuda = [state["variants"][o.id]["keys"] for o in done if "target=cuda" in o.id]
    assert len(cuda) == 3
    for stage in SHARED:
        assert len({keys[stage] for keys in cuda}) == 1


def _catching(fn: Any, errors: list[BaseException]) -> Any:
    def run(*args: Any) -> None:
        try:
            fn(*args)
        except BaseException as e:  # noqa: BLE001 - reported by the test thread
            errors.append(e)

    return run


# -- 6. a failing pass publishes nothing


@dataclass(frozen=True)
class ExplodeInDispatch(Pass):
    """A test pass that always fails (registered, so its reproducer replays)."""

    name = "test-explode-in-dispatch"
    reason: str = "boom"

    def apply(self, ctx: Any, module: Any) -> None:
        raise AccyError(f"test pass exploded: {self.reason}")


SOFTMAX_OF_EXP = '''"builtin.module"() ({
  "func.func"() <{function_type = (tensor<?x?xf32>) -> tensor<?x?xf32>, sym_name = "main"}> ({
  ^bb0(%x: tensor<?x?xf32>):
    %0 = "semantic.exp"(%x) : (tensor<?x?xf32>) -> tensor<?x?xf32>
    %1 = "semantic.softmax"(%0) {axis = -1 : i64} : (tensor<?x?xf32>) -> tensor<?x?xf32>
    "func.return"(%1) : (tensor<?x?xf32>) -> ()
  }) : () -> ()
}) : () -> ()
'''


def test_a_failing_pass_leaves_the_published_state_current(cluster, tmp_path, monkeypatch,
                                                            repro_dir, publishes):
    _, client = cluster
    store = str(tmp_path / "store")
    mine = tmp_path / "softmax.mlir"
    mine.write_text(Path(program("softmax")).read_text())
    v = Variant(str(mine), "host", {0: (8, 256)})
    first = run_batch(client, [v, layernorm("host")], store_url=store)
    assert_all_ok(first)
    before = fetch_state(client)

    # The program changes (same variant id: every stage must run again) and its
    # dispatch pipeline now fails; other variants' dispatch runs stay fine.
    mine.write_text(SOFTMAX_OF_EXP)
    real = recipe.configure

    def configure(stage: str, options: Any, shapes: Any = None) -> tuple[Pass, ...]:
        passes = real(stage, options, shapes)
        if stage == "dispatch" and dict(shapes or {}).get(0) == (8, 256):
            passes += (ExplodeInDispatch("on purpose"),)
        return passes

    monkeypatch.setattr(recipe, "configure", configure)
    publishes.clear()
    second = run_batch(client, [v, layernorm("host"), mlp("host")], store_url=store)
    by_id = {o.id: o for o in second.outcomes}

    failed = by_id[v.id]
    assert failed.status == "failed"
    f = failed.failure
    assert f["pipeline"] == "dispatch" and f["pass"] == "test-explode-in-dispatch"
    assert "exploded: on purpose" in f["message"]
    assert f["reproducer"] and os.path.exists(f["reproducer"])
    assert Path(f["reproducer"]).parent == repro_dir
    with pytest.raises(PassFailedError, match="exploded: on purpose"):
        replay(Reproducer.read(f["reproducer"]))
    assert [o.status for o in second.outcomes[1:]] == ["ok", "ok"]
    assert second.report()["summary"]["failed"] == 1

    after = fetch_state(client)
    assert after["variants"][v.id] == before["variants"][v.id]  # keys, fields, fragment
    assert all(v.id not in call["variants"] for call in publishes)
    assert after["version"] == before["version"] + len(successful(publishes))
    assert mlp("host").id in after["variants"] and layernorm("host").id in after["variants"]
    assert_consistent(after)


# -- 7. a worker killed during a refresh


def test_a_worker_killed_mid_refresh_never_leaves_a_partial_publish(make_cluster, tmp_path,
                                                                    publishes):
    variants = [softmax(t, b) for t in ("host", "cuda:sm_90") for b in (128, 256)] + \
        [layernorm("host"), layernorm("cuda:sm_90"), mlp("host"), mlp("cuda:sm_90")]
    with make_cluster(processes=True) as (c, client):
        pids = client.run(os.getpid)
        box: dict[str, Any] = {}
        errors: list[BaseException] = []

        def batch() -> None:
            box["result"] = run_batch(client, variants, store_url=str(tmp_path / "store"))

        thread = threading.Thread(target=_catching(batch, errors))
        thread.start()
        # Kill a worker while it runs a stage.
        victim = None
        deadline = time.monotonic() + 20
        while victim is None and thread.is_alive() and time.monotonic() < deadline:
            busy = [ws.address for ws in list(c.scheduler.workers.values()) if ws.processing]
            victim = busy[0] if busy else None
            if victim is None:
                time.sleep(0.005)
        assert victim is not None, "the batch finished before any worker was busy"
        os.kill(pids[victim], signal.SIGKILL)
        thread.join(120)
        assert not thread.is_alive() and not errors, errors
        result: BatchResult = box["result"]
        assert [o.id for o in result.outcomes] == [v.id for v in variants]
        assert {o.status for o in result.outcomes} <= {"ok", "failed"}
        ok = {o.id for o in result.outcomes if o.status == "ok"}
        for o in result.outcomes:
            if o.status == "failed":  # e.g. its scattered program died with the worker
                assert o.failure and o.failure["message"], o.id
            else:
                assert [r.stage for r in o.receipts] == list(RECEIPT_ORDER), o.id

        state = fetch_state(client)
        assert_consistent(state)  # never a partial publish
        assert set(state["variants"]) == ok
        assert state["version"] == len(successful(publishes))
        # the nanny brings the worker back before the cluster closes
        client.wait_for_workers(2, timeout=30)
        assert len(client.run(os.getpid)) == 2


# -- 8. a corrupt store entry


def test_a_warm_store_chain_decodes_only_what_it_compiles(make_cluster, tmp_path,
                                                          monkeypatch):
    """Stages read back only to key the next stage stay undecoded (their fingerprint
    is in the entry); the compile's input is decoded, and verified, once."""
    from accy.preparation.products import Product

    variants = [softmax("host"), softmax("cuda:sm_90", 128)]
    store = str(tmp_path / "store")
    with make_cluster() as (_, client):
        assert_all_ok(run_batch(client, variants, store_url=store))
    decoded: list[str] = []
    real = Product._materialize

    def counting(self: Product) -> None:
        decoded.append(self.stage)
        real(self)

    monkeypatch.setattr(Product, "_materialize", counting)
    with make_cluster() as (_, client):
        second = run_batch(client, variants, store_url=store)
        assert_all_ok(second)
        assert all(receipts(o)[s].source == "store" for o in second.outcomes for s in STAGES)
    # the compile of each variant read back from the store too: nothing decoded at all
    # for the host variant's stages but what compile keys; CUDA likewise
    assert decoded == ["target"] * len(variants), decoded


def test_a_stored_product_that_does_not_decode_is_recomputed(make_cluster, tmp_path):
    """An intact entry for the right key whose product turns out broken when a stage
    needs it: the entry is dropped and the variant refreshed again, not failed."""
    import msgpack

    variant = softmax("host")
    store = str(tmp_path / "store")
    with make_cluster() as (_, client):
        first = run_batch(client, [variant], store_url=store)
        assert_all_ok(first)
    rc = receipts(first.outcomes[0])
    s = ArtifactStore(store)
    good = StageResult.from_wire(s.get(rc["contract"].key))
    tag, meta, product = msgpack.unpackb(good.to_wire(), raw=False)
    ptag, stage, pmeta, _ = msgpack.unpackb(product, raw=False)
    broken = msgpack.packb([ptag, stage, pmeta, b"\x00not a module"], use_bin_type=True)
    s.put(rc["contract"].key, msgpack.packb([tag, meta, broken], use_bin_type=True),
          kind="contract")
    s.delete(rc["tensor"].key)  # the tensor stage must run: it needs contract's product
    with make_cluster() as (_, client):
        second = run_batch(client, [variant], store_url=store)
        assert_all_ok(second)
        got = receipts(second.outcomes[0])
        assert not got["contract"].reused and not got["tensor"].reused
        assert got["contract"].key == rc["contract"].key
    again = StageResult.from_wire(ArtifactStore(store).get(rc["contract"].key))
    again.product.verify()  # rewritten, intact


def test_a_corrupt_store_entry_is_recomputed(make_cluster, tmp_path):
    variants = [softmax("host"), softmax("cuda:sm_90", 128)]
    store = str(tmp_path / "store")
    with make_cluster() as (_, client):
        first = run_batch(client, variants, store_url=store)
        assert_all_ok(first)
    host = receipts(first.outcomes[0])
    files = {p.name: p for p in Path(store).rglob("*") if p.is_file()}
    # Bytes that are no entry at all, and an intact entry holding no stage result.
    files[host["contract"].key].write_bytes(b"\x00garbage" * 64)
    files[host["kernel"].key].write_bytes(encode_entry(b"not a stage result", "kernel",
                                                                  host["kernel"].key))

    with make_cluster() as (_, client):
        second = run_batch(client, variants, store_url=store)
        assert_all_ok(second)
        got = [receipts(o) for o in second.outcomes]
        # contract is shared by both variants: one ran, the other shared its task
        assert sorted(r["contract"].reused for r in got) == [False, True]
        assert not got[0]["kernel"].reused and got[0]["kernel"].pass_stats
        for r in got:
            assert r["contract"].key == host["contract"].key
            for stage in ("tensor", "dispatch", "memory", "target", "compile"):
                assert r[stage].reused and r[stage].source == "store", (stage, r[stage])
        assert got[1]["kernel"].source == "store"
    # the recomputed entries were written back, intact
    fresh = ArtifactStore(store)
    assert StageResult.from_wire(fresh.get(host["contract"].key)).stage == "contract"
    assert StageResult.from_wire(fresh.get(host["kernel"].key)).stage == "kernel"
