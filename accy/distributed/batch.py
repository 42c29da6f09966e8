"""Batch recompilation of many program variants on one Dask cluster.

:func:`run_batch` asks the scheduler to resolve every variant's published
prefix (one round trip), submits the remaining stage runs of all variants as
one graph of fused chain tasks (:mod:`accy.distributed.graph`; shared stage
runs are one node), and as variants finish takes the receipts that come back
with each one's last task and publishes their new entries in grouped
compare-and-swaps — a failed variant publishes nothing and fails only
itself. It returns the report INTERFACE.md describes.

Example
-------
>>> from distributed import Client, LocalCluster
>>> from accy.sweep import Variant
>>> # with LocalCluster(processes=False, **local_cluster_kwargs()) as c, Client(c) as client:
>>> #     report = run_batch(client, [Variant("graphs/softmax.mlir", "host", {0: (64, 4096)})])
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Sequence
from concurrent.futures import CancelledError
from dataclasses import dataclass, field
from typing import Any

from accy.distributed.graph import (
    ClusterLost,
    GraphBuilder,
    InlineProgram,
    InputLost,
    RefreshPlan,
    StageFailed,
    VariantRequest,
    compile_grain,
    plan_refresh,
    resolution_request,
    resolve_many,
    settle_for_a_worker,
    whole_group,
)
from accy.distributed.local import HOST_ENV
from accy.errors import AccyError
from accy.frontends import is_frontend_file, load_program
from accy.host import available_cores
from accy.pipeline import PREPARATION_NAMES
from accy.preparation.keys import StageKey, explain
from accy.preparation.products import SemanticModule
from accy.preparation.report import RECEIPT_ORDER, Receipt, summary
from accy.sweep import Variant


@dataclass
class VariantOutcome:
    """One variant's result: receipts, status and (if it failed) why."""

    id: str
    program: str
    status: str
    receipts: list[Receipt] = field(default_factory=list)
    failure: dict[str, Any] | None = None
    fragment: dict[str, Any] | None = None
    """The load descriptor (worker, compile key) when the fragment was loaded."""
    compile_task: list[Any] | None = None
    """The Dask key holding the compiled fragment (to run it on the loading worker)."""
    compile_pick: int | None = None
    """Where :attr:`compile_task` is a group task: the chain's place in it
    (:func:`accy.distributed.graph.held_value`)."""
    elapsed_ns: int = 0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "status": self.status,
                               "stages": [r.to_json() for r in self.receipts]}
        if self.failure is not None:
            out["failure"] = self.failure
        return out


@dataclass
class BatchResult:
    """Every variant's outcome, the summary, and what the batch cost."""

    outcomes: list[VariantOutcome]
    wall_s: float
    distinct_tasks: int
    version: int

    def report(self) -> dict[str, Any]:
        variants = [o.to_json() for o in self.outcomes]
        s: dict[str, Any] = dict(summary(variants))
        s["wall_s"] = round(self.wall_s, 3)
        s["distinct_tasks"] = self.distinct_tasks
        s["state_version"] = self.version
        return {"variants": variants, "summary": s}

    @property
    def failed(self) -> int:
        return sum(o.status != "ok" for o in self.outcomes)


def _request(v: Variant) -> VariantRequest:
    return VariantRequest(v.program, v.id, v.target, dict(v.options), dict(v.shapes))


CLUSTER_FAULTS = ("FutureCancelledError", "CancelledError", "KilledWorker", "CommClosedError",
                  "StreamClosedError", "FutureLostError")
"""Exceptions that say the cluster lost work (workers died, their data went with them),
not that the variant is wrong: such a variant is refreshed once more."""


def _failure_of(exc: BaseException, stage: str) -> dict[str, Any]:
    if isinstance(exc, StageFailed):
        f = exc.failure_json()
        f["stage"] = exc.stage or stage
        if isinstance(exc, InputLost):
            f["input_lost"] = True
        return f
    name = type(exc).__name__
    f = {"pipeline": stage, "pass": "", "message": f"{name}: {exc}", "reproducer": None,
         "stage": stage}
    if name in CLUSTER_FAULTS or any(type(c).__name__ in CLUSTER_FAULTS
                                     for c in (exc.__cause__, exc.__context__) if c):
        f["input_lost"] = True
    return f


def _receipt(stage: str, value: dict[str, Any], shared: bool,
             old_fields: dict[str, Any] | None) -> Receipt:
    """The receipt of a submitted stage (or compile, load) from its summary fields.

    ``shared``: the same task already has a ``ran`` receipt in this batch, so this
    variant reused it from the cluster.
    """
    if stage == "load":
        return Receipt("load", value["key"], bool(value["reused"]), int(value["elapsed_ns"]))
    from_store = value["origin"] == "store"
    if stage == "compile":
        reused = from_store or shared
        return Receipt("compile", value["key"], reused, 0 if shared else value["elapsed_ns"],
                       source=("store" if from_store else "cluster") if reused else None,
                       pass_stats={} if reused else {"compile": {
                           "binary_bytes": value["binary_bytes"],
                           "binary_reused": int(bool(value.get("binary_reused")))}})
    if from_store:
        return Receipt(stage, value["key"], True, value["elapsed_ns"],
                       value["plan_fingerprint"], source="store")
    if shared:
        return Receipt(stage, value["key"], True, 0, value["plan_fingerprint"],
                       source="cluster")
    why = explain(StageKey(value["key"], value["fields"]), old_fields)
    if why == "same key":
        why = ("same key as published (its input did not change after all); "
               "ran again because no artifact store holds the product")
    return Receipt(stage, value["key"], False, value["elapsed_ns"], value["plan_fingerprint"],
                   value["pass_stats"], explain=why, pass_ns=value["pass_ns"])


class _Collector:
    """Turns finished plans into receipts and publishes them."""

    def __init__(self, client: Any, version: int, store_url: str | None) -> None:
        self.client = client
        self.store_url = store_url
        self.claimed: set[Any] = set()
        self.version = version

    def collect(self, plan: RefreshPlan, summary: dict[str, Any] | None,
                error: BaseException | None) -> tuple[VariantOutcome, dict[str, Any] | None]:
        """The variant's outcome, and (when it succeeded) what it publishes.

        ``summary`` is the receipts map the variant's last chain task returned;
        on failure the receipts of what finished come with the error itself
        (``StageFailed.receipts``): nothing is gathered.
        """
        req = plan.request
        out = VariantOutcome(req.variant, req.program, "ok")
        record = plan.resolution.get("variant") or {}
        old_fields = (record or plan.resolution.get("nearest") or {}).get("fields") or {}
        for r in plan.resolved:
            out.receipts.append(Receipt(r.stage, r.key, True, 0,
                                        r.entry.get("plan_fingerprint"), {}, source="cluster"))
        if error is not None:
            summary = dict(getattr(error, "receipts", None) or {})
        # only this plan's own stage runs (a held input's chain carries older receipts)
        summary = {s: v for s, v in (summary or {}).items()
                   if s in plan.submitted and v.get("node") == plan.task_keys[s][1]}
        if error is not None:
            failed_stage = next((s for s in RECEIPT_ORDER
                                 if s in plan.submitted and s not in summary), "")
            out.status = "failed"
            out.failure = _failure_of(error, failed_stage)
        for stage in (s for s in RECEIPT_ORDER if s in summary):
            tk = plan.task_keys[stage]
            # another variant's receipt already says "ran" (a copied run is its own)
            shared = tk in self.claimed and stage not in plan.copied
            self.claimed.add(tk)
            if stage == "load":
                out.fragment = {k: v for k, v in summary[stage].items() if k != "node"}
            out.receipts.append(_receipt(stage, summary[stage], shared, old_fields.get(stage)))
        publication = None
        if out.status == "ok":
            centry = plan.resolution.get("compile") or {}
            if "compile" in plan.submitted:
                ctk, out.compile_pick = plan.holders.get("compile"), plan.picks.get("compile")
            else:
                ctk, out.compile_pick = centry.get("task_key"), centry.get("pick")
            out.compile_task = list(ctk) if ctk else None
            if "compile" not in plan.submitted:  # a published compile: held key, or all reused
                out.receipts.append(Receipt("compile", centry.get("key", ""), True, 0,
                                            source="cluster"))
            if plan.fully_reused and plan.load_skipped is None:
                desc = record.get("fragment")
                out.fragment = desc
                out.receipts.append(Receipt("load", (desc or {}).get("key", ""), True, 0,
                                            source="cluster"))
            if plan.load_skipped is not None:
                ckey = next((r.key for r in out.receipts if r.stage == "compile"), "")
                out.receipts.append(Receipt("load", ckey, False, 0, skipped=plan.load_skipped))
            if not plan.fully_reused:
                publication = self.publication(plan, summary, out)
        out.receipts.sort(key=lambda r: RECEIPT_ORDER.index(r.stage))
        out.elapsed_ns = sum(r.elapsed_ns for r in out.receipts)
        return out, publication

    def publication(self, plan: RefreshPlan, summary: dict[str, Any],
                    out: VariantOutcome) -> dict[str, Any]:
        from accy.distributed.graph import compile_entry_key

        entries: dict[str, Any] = {}
        keys: list[Any] = []
        stage_keys: dict[str, str] = {r.stage: r.key for r in plan.resolved}
        for r in plan.resolved:
            if r.entry.get("task_key"):
                keys.append(list(r.entry["task_key"]))
        for stage in PREPARATION_NAMES:
            value = summary.get(stage)
            if value is None:
                continue
            entry = {"stage": stage, "fingerprint": value["fingerprint"],
                     "plan_fingerprint": value["plan_fingerprint"],
                     "elapsed_ns": value["elapsed_ns"], "fields": value["fields"],
                     "stored": self.store_url is not None}
            holder = plan.holders.get(stage)
            if holder is not None:  # it ends a chain task: its product is held under that key
                entry["task_key"] = list(holder)
                if stage in plan.picks:  # as that chain's entry of a group's value
                    entry["pick"] = plan.picks[stage]
                keys.append(list(holder))
            entries[value["key"]] = entry
            stage_keys[stage] = value["key"]
        compiled = summary.get("compile")
        ckey = plan.holders.get("compile")
        if compiled is not None and ckey is not None:
            entry_key = compile_entry_key(stage_keys.get("target", ""),
                                          plan.request.run_options(),
                                          plan.request.template("compile"))
            entries[entry_key] = {"stage": "compile", "task_key": list(ckey),
                                  "key": compiled["key"], "fingerprint": compiled["key"],
                                  "elapsed_ns": compiled["elapsed_ns"],
                                  "stored": self.store_url is not None}
            if "compile" in plan.picks:
                entries[entry_key]["pick"] = plan.picks["compile"]
            keys.append(list(ckey))
        elif "load" in plan.holders:
            keys.append(list(plan.holders["load"]))
        # no "fields": the scheduler takes each stage's from the entry its key names (the
        # same fields again were 1.1 of a variant's 3.8 KB; RESULTS.md, batch, fifteenth
        # session)
        variants = {plan.request.variant: {
            "program": plan.request.program, "target": plan.request.target,
            "keys": stage_keys, "fragment": out.fragment}}
        return {"entries": entries, "variants": variants, "keys": keys}

    def publish(self, publications: list[dict[str, Any]], retries: int = 10) -> None:
        """One compare-and-swap for several finished variants (each complete).

        A publish is a delta: when another writer won the race, the same delta
        is sent again against the version its refusal names (no state read).
        """
        from accy.distributed.state import PublishConflict, publish

        if not publications:
            return
        entries: dict[str, Any] = {}
        variants: dict[str, Any] = {}
        keys: list[Any] = []
        for p in publications:
            entries.update(p["entries"])
            variants.update(p["variants"])
            keys.extend(p["keys"])
        for _ in range(retries + 1):
            reply = publish(self.client, self.version, entries, variants, keys)
            self.version = int(reply.get("version", self.version))
            if reply.get("ok"):
                return
        raise PublishConflict(f"publishing the cache state lost {retries + 1} races in a row "
                              f"(last version seen: {self.version})")


PUBLISH_INTERVAL_S = 0.05
PUBLISH_GROUP = 512
"""Finished variants are published at least this often / in groups of at most this many.
The last publish of a batch is on its critical path and holds what finished since the
one before: at 0.2 s, on the H200 at 15 workers, it held up to 280 variants and took up
to 147 ms of a 0.77–0.90 s batch; at 0.05 s, 36–140 variants and 6–21 ms (RESULTS.md, batch,
thirteenth session)."""


def run_batch(client: Any, variants: Sequence[Variant], *, store_url: str | None = None,
              on_done: Callable[[VariantOutcome], None] | None = None) -> BatchResult:
    """Refresh every variant on ``client``'s cluster; publish each success atomically.

    Variants that finish together are published in one compare-and-swap (each
    complete: a variant is published only when all its stages, its compile
    and its load succeeded). A variant whose resolved prefix turned out to be
    neither held nor stored any more (pins released, a worker lost, the store
    evicted it) is refreshed once more from its program: a cache tier that is
    gone is a recompute, never a failure.
    """
    result = _run_batch(client, variants, store_url, on_done, fresh=False)
    for attempt in range(LOST_RETRIES):
        lost = {o.id for o in result.outcomes if (o.failure or {}).get("input_lost")}
        if not lost:
            break
        if attempt:  # lost to dead workers twice: give their nannies time to restart them
            settle_for_a_worker(client, 2.0 * attempt, 30.0)
        last = attempt + 1 == LOST_RETRIES
        again = _run_batch(client, [v for v in variants if v.id in lost], store_url,
                           on_done if last else _unless_lost(on_done), fresh=True)
        redone = {o.id: o for o in again.outcomes}
        result = BatchResult([redone.get(o.id, o) for o in result.outcomes],
                             result.wall_s + again.wall_s,
                             result.distinct_tasks + again.distinct_tasks, again.version)
    return result


LOST_RETRIES = 3
"""Refreshes of a variant whose inputs the cluster lost, after the first pass."""


def _unless_lost(on_done: Callable[[VariantOutcome], None] | None) \
        -> Callable[[VariantOutcome], None] | None:
    if on_done is None:
        return None
    return lambda o: None if (o.failure or {}).get("input_lost") else on_done(o)


def _run_batch(client: Any, variants: Sequence[Variant], store_url: str | None,
               on_done: Callable[[VariantOutcome], None] | None, fresh: bool) -> BatchResult:
    """One pass of :func:`run_batch`: check the variants, resolve and submit them in
    chunks, and collect and publish their results as they arrive: the first chunk is
    submitted here, the rest by a :class:`_Submitter` thread while this one collects."""
    from accy.distributed import ensure_plugin

    t0 = time.perf_counter()
    if not getattr(client, "_accy_plugin_checked", False):
        ensure_plugin(client)
        client._accy_plugin_checked = True
    outcomes: dict[str, VariantOutcome] = {}

    def finish(o: VariantOutcome) -> None:
        outcomes[o.id] = o
        if on_done and (fresh or not (o.failure or {}).get("input_lost")):
            on_done(o)  # a variant refreshed again is reported when that ends

    todo = _checked_variants(variants, finish)
    threads = _worker_threads(client)
    grain = compile_grain(len(todo), threads)
    chunked = len(todo) > CHUNKED_ABOVE
    # a chunked batch's first round in smaller groups (the cluster starts sooner) and its
    # last round too (the workers finish closer together)
    opening, closing = (max(1, grain // FIRST_GRAIN_DIVISOR), max(1, grain // TAIL_GRAIN_DIVISOR))
    first = max(1, threads) * opening if chunked else len(todo)
    chunks = submission_chunks(todo, first, _prefix_of,
                               tail=max(1, threads) * grain if chunked else 0, kin=_kin_of)
    del todo
    grains = [grain] * len(chunks)
    if len(chunks) > 1:
        grains[0], grains[-1] = opening, closing
    if not chunks:  # nothing passed the checks
        return BatchResult([outcomes[v.id] for v in variants if v.id in outcomes],
                           time.perf_counter() - t0, 0, _Collector(client, 0, store_url).version)
    # each chunk keeps its likenesses whole up to a bound of its own size, at least its
    # grain (a first chunk has a group of the grain for every thread)
    (chunk, first_grain, whole), *rounds = [(c, g, max(g, whole_group(len(c), threads)))
                                            for c, g in zip(chunks, grains)]
    del chunks
    collector, part = _submit(client, chunk, store_url, fresh, None, first_grain, whole)
    submitter = _Submitter(client, rounds, store_url, fresh, collector)
    del chunk, rounds
    submitted = _collect(collector, part, finish, submitter)
    ordered = [outcomes[v.id] for v in variants if v.id in outcomes]
    return BatchResult(ordered, time.perf_counter() - t0, len(submitted), collector.version)


FIRST_GRAIN_DIVISOR = 2
TAIL_GRAIN_DIVISOR = 2
"""A chunked batch's first chunk (a group for every worker thread) and last one go out
in groups of the grain divided by these."""

CHUNKED_ABOVE = 256
"""Batches of more variants than this go out in chunks (:func:`submission_chunks`); a
smaller one is planned in well under 0.1 s, and one graph keeps every compile group of
alike chains whole (on the 2-core machine chunks cost the shared sweep 1.69× against
2.00× the pool at 96 variants)."""


def submission_chunks(todo: Sequence[Any], first: int, prefix: Callable[[Any], Any],
                      tail: int = 0, kin: Callable[[Any], Any] | None = None) \
        -> list[list[Any]]:
    """``todo`` in the chunks a batch submits one after another: the first of about
    ``first`` variants (a compile group for every worker thread), each next one twice
    the last, so the cluster starts on the first while the client plans the rest (as
    ``Client.map(batch_size=...)`` does). Variants of one ``prefix`` (program, target and
    shapes: every variant that can share a stage run with another has its prefix) are
    brought together, first appearance first, and never split: a stage run two
    variants share is in one graph, fused one way, with one receipt that ran it.

    With ``kin`` (a prefix → what prefixes whose variants may render one source have in
    common: the program and target) and prefixes that several variants share (a sweep
    over kernel options), the prefixes of one kin come together, first appearance
    first: a sweep that varies the shapes outside the options (every program at one
    row count, then at the next) then has each source's variants in one chunk, where a
    compile group can hold them whole (:func:`whole_group`), instead of a chunk for each
    row count, each compiling the source again (480 variants of 20 prefixes: 94–106
    kernels compiled instead of 112–180 on 8 workers, 120–122 instead of 172–176 on 15;
    RESULTS.md, batch, twenty-third session). Where every variant is a prefix of its
    own, a source is a whole program, far more than a group: brought together, its
    chains would fill the first chunk's groups, each compiling it at once (7 NVRTC
    programs instead of 2 for 480 distinct variants on 2 workers), so the order stays.

    With ``tail``, the final ``tail`` or so variants (whole prefixes) are a chunk of
    their own, when something is left before them: the batch submits that last round
    in smaller groups. On the H200 at 15 workers the workers' last tasks ended 0.2–0.3 s
    apart, 3 to 5 groups of 8 a worker (RESULTS.md, batch, thirteenth session).

    >>> [len(c) for c in submission_chunks(list(range(20)), 3, lambda i: i // 4)]
    [4, 8, 8]
    >>> [len(c) for c in submission_chunks(list(range(20)), 3, lambda i: i // 4, tail=3)]
    [4, 8, 4, 4]
    >>> [len(c) for c in submission_chunks(list(range(20)), 3, lambda i: i // 4, tail=20)]
    [4, 16]
    >>> submission_chunks([1, 2, 1, 2, 3], 2, lambda i: i)
    [[1, 1], [2, 2, 3]]
    >>> submission_chunks([10, 10, 20, 20, 11, 11, 21, 21], 2, lambda i: i,
    ...                   kin=lambda p: p // 10)
    [[10, 10], [11, 11, 20, 20], [21, 21]]
    """
    alike: dict[Any, list[Any]] = {}
    for item in todo:
        alike.setdefault(prefix(item), []).append(item)
    groups = list(alike.values())
    if kin is not None and len(alike) < len(todo):
        kinds: dict[Any, list[list[Any]]] = {}
        for p, members in alike.items():
            kinds.setdefault(kin(p), []).append(members)
        groups = [members for family in kinds.values() for members in family]
    last: list[Any] = []
    while tail > 0 and len(groups) > 1 and len(last) < tail:  # back over whole prefixes
        last[:0] = groups.pop()
    out: list[list[Any]] = []
    chunk: list[Any] = []
    size = max(1, first)
    for members in groups:
        chunk.extend(members)
        if len(chunk) >= size:
            out.append(chunk)
            chunk, size = [], size * 2
    if chunk:
        out.append(chunk)
    return out + [last] if last else out


def _prefix_of(item: tuple[Variant, SemanticModule, VariantRequest]) -> Any:
    req = item[2]
    return (req.program, req.target, tuple(sorted(req.shapes.items())))


def _kin_of(prefix: Any) -> Any:
    """Of a :func:`_prefix_of`: the program and target (only prefixes of one kin may
    share a compiled source)."""
    return prefix[:2]


def _worker_threads(client: Any) -> int:
    workers = client.scheduler_info().get("workers", {})
    return sum(w.get("nthreads", 1) for w in workers.values())


def _checked_variants(variants: Sequence[Variant], finish: Callable[[VariantOutcome], None]) \
        -> list[tuple[Variant, SemanticModule, VariantRequest]]:
    """Each variant with its program and request; one whose program does not load or
    whose options are bad is finished as failed here."""
    modules: dict[Any, SemanticModule | AccyError] = {}
    todo: list[tuple[Variant, SemanticModule, VariantRequest]] = []
    for v in variants:
        # A front end's import depends on the shapes (a model's Shape ops fold for them).
        which = (v.program, tuple(sorted(v.shapes.items()))) \
            if is_frontend_file(v.program) else v.program
        if which not in modules:
            try:
                modules[which] = load_program(v.program, v.shapes)
            except AccyError as e:
                modules[which] = e
        mod = modules[which]
        if isinstance(mod, AccyError):
            finish(VariantOutcome(v.id, v.program, "failed", failure={
                "pipeline": "parse", "pass": "", "message": str(mod), "reproducer": None,
                "stage": "semantic"}))
            continue
        req = _request(v)
        try:
            req.run_options()
        except AccyError as e:
            finish(VariantOutcome(v.id, v.program, "failed", failure={
                "pipeline": "options", "pass": "", "message": str(e), "reproducer": None,
                "stage": "contract"}))
            continue
        todo.append((v, mod, req))
    return todo


@dataclass
class _Part:
    """What one submitted chunk hands the collecting loop: its plans by the key of their
    last task, the plans with no task (fully reused: they finish as they are) and the
    keys of the tasks submitted."""

    pending: dict[Any, list[RefreshPlan]]
    immediate: list[RefreshPlan]
    keys: set[Any]


def _submit(client: Any, todo: list[tuple[Variant, SemanticModule, VariantRequest]],
            store_url: str | None, fresh: bool, collector: _Collector | None, grain: int,
            whole: int = 0) \
        -> tuple[_Collector, _Part]:
    """Resolve every variant's published prefix (one round trip), plan its chains and
    submit them as one graph, ``grain`` chains a compile group and likenesses of at most
    ``whole`` chains kept whole (:meth:`GraphBuilder.submit`). A later chunk of the
    batch passes the batch's ``collector`` (one claim set, one version; None: the first
    makes it). Only reads the collector: the collecting loop takes the :class:`_Part`."""
    templates: dict[str, int] = {}
    answer = resolve_many(client, [resolution_request(m, r, templates) for _, m, r in todo],
                          templates)
    if collector is None:
        collector = _Collector(client, int(answer.get("version", 0)), store_url)
    gpu = bool(answer.get("gpu_workers"))
    all_gpu = bool(answer.get("all_gpu", gpu))
    graph = GraphBuilder()
    plans: list[RefreshPlan] = []
    programs: dict[str, InlineProgram] = {}  # each program's bytes, once for the batch
    for (_, mod, req), resolution in zip(todo, answer["results"]):
        if fresh:  # what the published state pointed at is gone: recompute it all
            resolution = {"resolved": [], "variant": resolution.get("variant"),
                          "nearest": resolution.get("nearest")}
        plans.append(plan_refresh(client, mod, req, resolution, store_url, gpu, graph,
                                  programs))
    # one message: every chain task of the batch (a CUDA chain fuses through compile
    # and load when every worker is a GPU worker; otherwise it splits there)
    spread = _spread(client, answer.get("workers"))
    del answer
    futures = graph.submit(client, fuse_gpu=not gpu or all_gpu, grain=grain, whole=whole,
                           spread=spread, restrict_gpu=not all_gpu)
    part = _Part({}, [], set(futures))
    for p in plans:
        p.bind(futures, graph)
        if p.tail is None:
            part.immediate.append(p)
        else:
            part.pending.setdefault(p.tail.key, []).append(p)
    return collector, part


def _spread(client: Any, workers: dict[str, bool] | None) -> dict[bool, list[str]]:
    """The workers a graph's readers are spread over, all and those with a GPU: from the
    resolve answer (``workers``: address → has a GPU), else — a scheduler whose plugin
    does not say — from the scheduler's identity (a round trip of its own)."""
    if workers is None:
        info = client.scheduler_info().get("workers", {})
        workers = {a: (w.get("resources") or {}).get("GPU", 0) > 0 for a, w in info.items()}
    return {False: sorted(workers), True: sorted(a for a, gpu in workers.items() if gpu)}


class _Submitter:
    """Submits a batch's later chunks on a thread of its own while the collecting loop
    takes the first results: on the H200 at 15 workers the client planned the second
    and third chunks of 480 variants until 0.18–0.25 s into a 0.53–0.59 s batch, and
    only then began collecting, with 136–176 variants already finished (RESULTS.md,
    batch, fifteenth session).

    Each submitted chunk's :class:`_Part` (or the error that stopped the submitting)
    is put on :attr:`parts`; ``notify`` (the collecting loop's wake-up) is called after
    each. :meth:`stop` makes it submit nothing more."""

    def __init__(self, client: Any, chunks: list[tuple[list[Any], int, int]],
                 store_url: str | None, fresh: bool, collector: _Collector) -> None:
        import queue
        import threading

        self.parts: queue.SimpleQueue[_Part | BaseException] = queue.SimpleQueue()
        self.notify: Callable[[], None] = lambda: None
        self._stop = threading.Event()
        self._chunks = chunks
        self._args = (client, store_url, fresh, collector)
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="accy-batch-submit")
        self.running = bool(chunks)

    def start(self, notify: Callable[[], None]) -> None:
        self.notify = notify
        if self.running:
            self._thread.start()

    def _run(self) -> None:
        client, store_url, fresh, collector = self._args
        try:
            while self._chunks and not self._stop.is_set():
                chunk, grain, whole = self._chunks.pop(0)
                self.parts.put(_submit(client, chunk, store_url, fresh, collector, grain,
                                       whole)[1])
                del chunk
                self.notify()
        except BaseException as e:  # noqa: BLE001 — the collecting loop raises it
            self.parts.put(e)
        finally:
            self._chunks = []
            self.running = False
            self.notify()

    def stop(self) -> None:
        self._stop.set()


def _collect(collector: _Collector, first: _Part, finish: Callable[[VariantOutcome], None],
             submitter: _Submitter) -> set[Any]:
    """Results arrive in the background (``with_results``): each is the small receipts
    map of a variant's last chain task. Finished variants are published together every
    :data:`PUBLISH_INTERVAL_S`, so the client makes a scheduler round trip per group of
    variants, not per variant, off the collecting thread (:class:`_Publisher`); a plan
    lets go of its futures once published. The later chunks' parts join as the
    ``submitter`` hands them over. Returns the keys of every task submitted."""
    import threading

    from distributed import as_completed

    finished = as_completed([], loop=collector.client.loop, with_results=True,
                            raise_errors=False)
    stop, lost = threading.Event(), threading.Event()
    watchdog = threading.Thread(target=_no_workers_watchdog,
                                args=(collector.client, stop, lost), daemon=True,
                                name="accy-no-workers-watchdog")
    watchdog.start()
    intake = _Intake(collector, finished, finish)
    intake.take(first)
    del first

    def wake() -> None:
        with finished.thread_condition:
            finished.thread_condition.notify_all()

    submitter.start(wake)
    try:
        _collect_batches(intake, finished, lost, submitter)
    finally:
        submitter.stop()
        stop.set()
        finished.clear()  # a stopped batch (Ctrl-C) tracks no result any more
    return intake.keys


class _Intake:
    """The collecting loop's side of the submitted parts: which plans wait on which
    task, the tasks ``finished`` tracks, and the publications of the plans that
    finished as they were (fully reused)."""

    def __init__(self, collector: _Collector, finished: Any,
                 finish: Callable[[VariantOutcome], None]) -> None:
        self.collector, self.finished, self.finish = collector, finished, finish
        self.pending: dict[Any, list[RefreshPlan]] = {}
        self.keys: set[Any] = set()
        self.publications: list[dict[str, Any]] = []

    def take(self, part: _Part) -> None:
        self.keys |= part.keys
        for p in part.immediate:
            o, pub = self.collector.collect(p, {}, None)
            self.finish(o)
            if pub:
                self.publications.append(pub)
        for key, plans in part.pending.items():
            waiting = self.pending.get(key)
            if waiting is not None:  # the same last task as an earlier chunk's, not yet back
                waiting.extend(plans)
            else:
                self.pending[key] = list(plans)
                self.finished.add(plans[0].tail)

    def drain(self, submitter: _Submitter) -> None:
        """Take every part the submitter has handed over; raise what stopped it."""
        import queue

        while True:
            try:
                part = submitter.parts.get_nowait()
            except queue.Empty:
                return
            if isinstance(part, BaseException):
                raise part
            self.take(part)


def _no_workers_watchdog(client: Any, stop: Any, lost: Any) -> None:
    """Tasks of a cluster that lost every worker (or its scheduler) wait without
    bound: after ``NO_WORKERS_WAIT_S`` with no worker answering, ``lost`` is set and
    the collecting loop ends the batch."""
    from accy.distributed.graph import no_workers_wait

    wait = no_workers_wait()
    empty_since: float | None = None
    while not stop.wait(1.0):
        try:
            workers = len(client.sync(client.scheduler.ncores, callback_timeout=10))
        except Exception:  # noqa: BLE001 — the scheduler gone: no workers either
            workers = 0
        if workers:
            empty_since = None
            continue
        empty_since = empty_since or time.monotonic()
        if time.monotonic() - empty_since >= wait:
            lost.set()
            return


def _batches(finished: Any, lost: Any, intake: _Intake, submitter: _Submitter) -> Any:
    """``finished.batches()``, polled, so that a lost cluster (``lost`` set by the
    watchdog) ends the wait: one :class:`ClusterLost`, never a wait without bound.
    While the ``submitter`` runs, each part it hands over joins through ``intake``
    and the batch is not over."""
    from accy.distributed.graph import no_workers_wait

    # as_completed notifies this condition as each future lands (its own __next__ waits
    # on it), and the submitter after each part: woken at once, not up to a poll later
    arrived = getattr(finished, "thread_condition", None)

    def submitting() -> bool:
        return submitter.running or not submitter.parts.empty()

    while True:
        intake.drain(submitter)
        if finished.has_ready():
            yield finished.next_batch(block=False)
        elif finished.is_empty() and not submitting():
            intake.drain(submitter)  # the last part, put just before it stopped
            if finished.is_empty():
                return
        elif lost is not None and lost.is_set():
            raise ClusterLost(f"the cluster had no workers for {no_workers_wait():g} s (all "
                              f"lost, or the scheduler is gone); {finished.count()} "
                              f"variant(s) of the batch had not finished")
        elif arrived is not None:
            with arrived:
                if not finished.has_ready() and submitter.parts.empty():
                    arrived.wait(timeout=0.05)
        else:
            time.sleep(0.01)


def _collect_batches(intake: _Intake, finished: Any, lost: Any,
                     submitter: _Submitter) -> None:
    """Each group of finished chains: its variants' outcomes, published in groups by a
    :class:`_Publisher` while the next results are collected."""
    collector, finish = intake.collector, intake.finish
    publications: list[dict[str, Any]] = []
    published: list[RefreshPlan] = []
    last_publish = time.monotonic()
    publisher = _Publisher(collector)
    pending = intake.pending
    try:
        for done in _batches(finished, lost, intake, submitter):
            publications += intake.publications  # fully reused: nothing to release
            intake.publications.clear()
            for f, result in done:
                for p in pending.pop(f.key):
                    o, pub = collector.collect(p, *_outcome_of(f, result, p.tail_pick))
                    if pub:
                        publications.append(pub)
                        published.append(p)
                    else:
                        p.release()
                    finish(o)
                del f, result
            if publications and (time.monotonic() - last_publish >= PUBLISH_INTERVAL_S
                                 or len(publications) >= PUBLISH_GROUP):
                publisher.send(publications, published)
                publications, published, last_publish = [], [], time.monotonic()
        publisher.send(publications + intake.publications, published)
    except BaseException:
        publisher.close(cancel=True)  # a lost cluster, Ctrl-C: no queued publish waited on
        raise
    publisher.close()


class _Publisher:
    """The batch's publishes, in order, on a thread of their own: the collecting loop
    hands each group over and goes on turning results into receipts, instead of
    waiting for the scheduler's reply. On the H200 at 15 workers publishes of 20-204
    variants took 8-137 ms each while results queued behind them; in one pass the
    last, of 204 variants, ran until 0.13 s after the last task had ended
    (RESULTS.md, batch, fourteenth session). :meth:`close` waits for every publish
    and raises the first failure; after a failure nothing more is published (each
    publish is one compare-and-swap of complete variants either way)."""

    def __init__(self, collector: _Collector) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.collector = collector
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="accy-publish")
        self.sent: list[Any] = []
        self.failed: BaseException | None = None

    def send(self, publications: list[dict[str, Any]], plans: list[RefreshPlan]) -> None:
        if publications:
            self.sent.append(self.pool.submit(self._publish, publications, plans))

    def _publish(self, publications: list[dict[str, Any]], plans: list[RefreshPlan]) -> None:
        if self.failed is not None:
            return
        try:
            self.collector.publish(publications)
        except BaseException as e:
            self.failed = e
            raise
        for p in plans:  # published: the scheduler pins what they keep
            p.release()

    def close(self, cancel: bool = False) -> None:
        """Wait for the publishes and raise the first failure; with ``cancel`` (the batch
        is ending on an error of its own) drop those not started and raise nothing."""
        self.pool.shutdown(wait=True, cancel_futures=cancel)
        if cancel:
            return
        for f in self.sent:
            f.result()  # the first failure, raised here


def _outcome_of(f: Any, result: Any, pick: int | None = None) \
        -> tuple[Any, BaseException | None]:
    """(receipts, None) of a finished chain (``pick``: chain ``pick`` of the finished
    group); (None, the error) of an erred one — or of a cancelled refresh (an input it
    needed was lost with a worker): a failure, never an empty success."""
    if f.status == "finished":
        from accy.distributed.graph import StageFailed, held_value

        try:
            return held_value(result, pick).receipts, None
        except StageFailed as e:
            return None, e
    if isinstance(result, tuple) and len(result) == 3:  # (type, exception, traceback)
        result = result[1]
    err = result if isinstance(result, BaseException) else CancelledError(
        f"the refresh was {f.status}: an input it needed was lost (a worker died?)")
    return None, err


# ---------------------------------------------------------------- the command


LOCAL_HOST_ENV = HOST_ENV
"""The interface the local cluster of ``accy batch`` binds (scheduler, dashboard,
workers): 127.0.0.1 unless this says otherwise (``0.0.0.0`` for every interface)."""


def _local_cluster(workers: int, dashboard_port: int) -> Any:
    """accy's local cluster (:func:`accy.distributed.local.local_cluster`)."""
    from accy.distributed.local import local_cluster

    return local_cluster(workers, dashboard_port=dashboard_port)


def local_workers(requested: int | None, force: bool, warn: Callable[[str], None]) -> int:
    """The worker count of the local cluster: ``requested`` (default: a worker per core
    but one, at least two — :func:`accy.distributed.default_workers`), capped at the
    core count with a warning unless ``force``."""
    from accy.distributed import default_workers

    cores = available_cores()
    if requested is None:
        return min(default_workers(), max(2, cores))
    if requested > cores and not force:
        warn(f"warning: --workers {requested} is more than the {cores} core(s) here; "
             f"starting {cores} (--force-workers starts {requested})")
        return cores
    return requested


def check_scheduler_address(address: str) -> None:
    """A one-line :class:`AccyError` for an address Dask cannot connect to at all:
    no scheme or port, a scheme Dask has no comm for (``http://``), or ``tls://``
    without the client certificates in Dask's config."""
    from distributed.comm.addressing import parse_address
    from distributed.comm.registry import backends

    try:
        scheme, loc = parse_address(address, strict=True)
    except ValueError:
        raise AccyError(f"--scheduler {address}: not a Dask scheduler address (expected "
                        f"tcp://HOST:PORT or tls://HOST:PORT)") from None
    if scheme not in backends:
        raise AccyError(f"--scheduler {address}: Dask has no '{scheme}' comm (expected "
                        f"{' or '.join(s + '://' for s in ('tcp', 'tls'))}; the dashboard's "
                        f"http:// address is not the scheduler's)")
    if ":" not in loc.rsplit("]", 1)[-1]:
        raise AccyError(f"--scheduler {address}: no port (e.g. {scheme}://{loc}:8786)")
    if scheme in ("tls", "wss"):
        from distributed.security import Security

        try:
            context = Security().get_connection_args("client").get("ssl_context")
        except (OSError, ValueError) as e:
            raise AccyError(f"--scheduler {address}: the TLS configuration does not load: "
                            f"{e}") from None
        if context is None:
            raise AccyError(f"--scheduler {address}: TLS needs certificates: set "
                            f"distributed.comm.tls.ca-file, .client.cert and .client.key in "
                            f"the Dask config (or DASK_DISTRIBUTED__COMM__TLS__* variables)")


def check_store_url(url: str, local: bool) -> None:
    """A one-line :class:`AccyError` for a ``--cache`` that cannot be a store: an
    unknown fsspec protocol, a missing backend, a file, an unwritable folder.

    With ``local`` (a cluster on this machine) a local folder is created now; for
    a remote cluster only the URL is checked (the folder is the workers')."""
    import fsspec

    from accy.store import ArtifactStore, default_max_bytes

    try:
        fsspec.core.url_to_fs(url)
    except (ValueError, ImportError) as e:
        raise AccyError(f"--cache {url}: not a usable store URL: "
                        f"{str(e).splitlines()[0]}") from None
    is_path = "://" not in url and "::" not in url
    if not local and is_path:
        return
    if is_path:
        path = os.path.abspath(os.path.expanduser(url))
        probe = path
        while probe and not os.path.exists(probe):
            probe = os.path.dirname(probe)
        if probe and not os.path.isdir(probe):
            raise AccyError(f"--cache {url}: {probe} is a file, not a folder")
    try:
        ArtifactStore(url, default_max_bytes())
    except AccyError as e:
        raise AccyError(f"--cache {url}: {e.message}") from None
    except (OSError, ValueError, ImportError) as e:
        raise AccyError(f"--cache {url}: not a usable store: {e}") from None
    if is_path and not os.access(path, os.W_OK | os.X_OK):
        raise AccyError(f"--cache {url}: the folder is not writable")


def format_summary(result: BatchResult) -> str:
    """A small table: per stage, runs and reuses; then the totals."""
    runs: dict[str, int] = {}
    reuses: dict[str, int] = {}
    for o in result.outcomes:
        for r in o.receipts:
            if r.skipped:
                continue
            (reuses if r.reused else runs)[r.stage] = \
                (reuses if r.reused else runs).get(r.stage, 0) + 1
    lines = [f"{'stage':<9} {'ran':>6} {'reused':>7}"]
    for stage in RECEIPT_ORDER:
        if stage in runs or stage in reuses:
            lines.append(f"{stage:<9} {runs.get(stage, 0):>6} {reuses.get(stage, 0):>7}")
    s = result.report()["summary"]
    rate = s["variants"] / result.wall_s if result.wall_s > 0 else 0.0
    lines.append(f"{s['variants']} variants: {s['ok']} ok, {s['failed']} failed; "
                 f"{s['stage_runs']} stage runs, {s['reuses']} reuses; "
                 f"{result.wall_s:.2f} s ({rate:.1f} variants/s)")
    return "\n".join(lines)


def batch_main(sweeps: Sequence[str], *, scheduler: str | None, workers: int | None,
               cache: str | None, report: str | None, explain_misses: bool,
               html: str | None, keep_open: float | None, echo: Callable[[str], None],
               progress: bool = True, force_workers: bool = False,
               max_variants: int | None = None, tuned: bool = False) -> int:
    """``accy batch``: returns the exit code (0 all ok, 1 any failed).

    With ``tuned`` each variant takes the options ``accy tune`` chose for its
    program, shapes and target on the tuned axes (:func:`accy.tune.apply_tuning`),
    and its report entry's ``tuned`` says which (null: nothing was tuned).

    Everything a user can get wrong is checked before a cluster starts: the
    sweeps (at most ``max_variants`` variants), the scheduler address, the
    ``--cache`` store and where the report and page go. Each failed variant is
    said once, as a ``FAILED`` line after the summary (the progress bar names it
    as it fails).
    """
    import sys

    variants, store_url = check_inputs(sweeps, scheduler, cache, report, html, max_variants)
    client, cluster = connect(scheduler, workers, force_workers)
    try:
        if keep_open is not None:
            echo(f"dashboard: {client.dashboard_link}")
            sys.stdout.flush()
        notes: dict[str, Any] | None = None
        if tuned:
            variants, notes = _apply_tuned(client, variants, store_url, echo)
        try:
            result = _run_with_progress(client, variants, store_url, progress)
        except BatchInterrupted as stop:
            echo(f"interrupted: {len(stop.partial.outcomes)} of {stop.total} variants had "
                 f"finished")
            _write_outputs(client, stop.partial, report, html, echo, notes)
            raise KeyboardInterrupt from None  # the command exits 130
        except ClusterLost as lost:
            if lost.partial is not None:  # the report only: the page needs the scheduler
                echo(f"stopped: {len(lost.partial.outcomes)} of {lost.total} variants had "
                     f"finished")
                _write_outputs(client, lost.partial, report, None, echo, notes)
            raise
        _record(client, result)
        _say_results(result, explain_misses, echo)
        _write_outputs(client, result, report, html, echo, notes)
        if keep_open is not None and cluster is not None:
            sys.stdout.flush()
            time.sleep(keep_open)
        return 1 if result.failed else 0
    finally:
        shut_down(client, cluster)


def check_inputs(sweeps: Sequence[str], scheduler: str | None, cache: str | None,
                    report: str | None, html: str | None,
                    max_variants: int | None) -> tuple[list[Variant], str]:
    """Check everything a user can get wrong before a cluster starts; (variants, store URL)."""
    from accy.paths import check_writable_file
    from accy.store import default_store_url
    from accy.sweep import MAX_VARIANTS, load_sweeps

    variants = load_sweeps(list(sweeps), MAX_VARIANTS if max_variants is None else max_variants)
    if not variants:
        raise AccyError("the sweep files define no variant")
    store_url = cache or default_store_url()
    if scheduler:
        check_scheduler_address(scheduler)
    check_store_url(store_url, local=not scheduler)
    for path, what in ((report, "the report"), (html, "the HTML page")):
        if path:
            check_writable_file(path, what)
    return variants, store_url


def _apply_tuned(client: Any, variants: list[Variant], store_url: str,
                 echo: Callable[[str], None]) -> tuple[list[Variant], dict[str, Any]]:
    """``--tuned``: each variant takes the options ``accy tune`` chose for it on this
    cluster's devices; (variants, what each took)."""
    from accy.tune.database import apply_tuning, cluster_device_names

    variants, notes = apply_tuning(variants, store_url, cluster_device_names(client))
    missing = sum(n is None for n in notes.values())
    echo(f"tuned: {len(notes) - missing} of {len(notes)} variants take tuned options"
         + (f" ({missing} have no tuning for this accy version and keep their own)"
            if missing else ""))
    return variants, notes


def connect(scheduler: str | None, workers: int | None,
             force_workers: bool) -> tuple[Any, Any]:
    """A client of the scheduler at ``scheduler``, or of a new local cluster; (client, cluster)."""
    import sys

    from distributed import Client

    from accy.distributed import quiet

    def warn(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    quiet.install()  # Dask's tracebacks of a cluster going away: accy says it in a line
    if scheduler:
        try:
            return Client(scheduler, timeout="10s"), None
        except (OSError, TimeoutError, ValueError, TypeError) as e:
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise AccyError(f"cannot reach the Dask scheduler at {scheduler}: {first}") \
                from None
    cluster = _local_cluster(local_workers(workers, force_workers, warn), 8787)
    return Client(cluster), cluster


def _run_with_progress(client: Any, variants: Sequence[Variant], store_url: str,
                       progress: bool) -> BatchResult:
    """Run the batch under a progress bar that names each variant as it fails."""
    import sys

    from tqdm import tqdm

    bar = tqdm(total=len(variants), unit="variant", disable=not progress,
               file=sys.stderr, dynamic_ncols=True)
    texts: dict[str, bytes | None] = {}

    finished: list[VariantOutcome] = []
    t0 = time.perf_counter()

    def done(o: VariantOutcome) -> None:
        finished.append(o)
        bar.update(1)
        if o.status != "ok":
            _own_location(o, texts)
            if progress:  # the details follow the summary, once
                bar.write(f"failed: {o.id}", file=sys.stderr)

    try:
        result = run_batch(client, variants, store_url=store_url, on_done=done)
    except KeyboardInterrupt:
        bar.close()
        # what finished before Ctrl-C: the caller writes it as a partial report
        raise BatchInterrupted(BatchResult(list(finished), time.perf_counter() - t0, 0, 0),
                               len(variants)) from None
    except ClusterLost as lost:
        bar.close()
        lost.partial = BatchResult(list(finished), time.perf_counter() - t0, 0, 0)
        lost.total = len(variants)
        raise
    bar.close()
    return result


class BatchInterrupted(KeyboardInterrupt):
    """Ctrl-C during a batch: the variants that had finished (their report is written
    before the command exits 130)."""

    def __init__(self, partial: BatchResult, total: int) -> None:
        super().__init__()
        self.partial = partial
        self.total = total


def _say_results(result: BatchResult, explain_misses: bool,
                 echo: Callable[[str], None]) -> None:
    """The summary, why each stage that ran missed (``--explain``), then a line per failure."""
    echo(format_summary(result))
    if explain_misses:
        for o in result.outcomes:
            for r in o.receipts:
                if not r.reused and not r.skipped and r.explain:
                    echo(f"{o.id} {r.stage}: {r.explain}")
    for o in result.outcomes:
        if o.status != "ok":
            echo(_failed_line(o))


def _write_outputs(client: Any, result: BatchResult, report: str | None, html: str | None,
                   echo: Callable[[str], None], tuned: dict[str, Any] | None = None) -> None:
    """Write the JSON report and the HTML page, where asked for (with ``--tuned``, each
    variant's entry says which tuned options it took)."""
    from accy.preparation.report import write_report_file

    data = result.report()
    if tuned is not None:
        for v in data["variants"]:
            v["tuned"] = tuned.get(v["id"])
    if report:
        write_report_file(report, data["variants"], data["summary"])
        echo(f"report: {report}")
    if html:
        try:
            _write_html(client, result, html)
        except OSError as e:
            raise AccyError(f"cannot write the HTML page to {html}: "
                            f"{e.strerror or e}") from None
        echo(f"html: {html}")


def shut_down(client: Any, cluster: Any) -> None:
    """Close the client, and the local cluster (its pinned state released first) if any."""
    from accy.distributed.state import unpin

    if cluster is not None:
        try:
            unpin(client)
        except Exception:  # noqa: BLE001 - best effort before shutdown
            pass
    client.close()
    if cluster is not None:
        cluster.close()


def _failed_line(o: VariantOutcome) -> str:
    """``FAILED id: pipeline/pass: message (reproducer: …)``; an exception that is not
    an accy error (``TypeError: …``, an accy bug) says so."""
    f = o.failure or {}
    message = str(f.get("message", ""))
    head = message.split(":", 1)[0]
    if head.isidentifier() and head.endswith(("Error", "Exception")) \
            and head not in _accy_error_names():
        message += " (internal error; ACCY_DEBUG=1 shows the workers' tracebacks)"
    return (f"FAILED {o.id}: {f.get('pipeline')}/{f.get('pass')}: {message}"
            + (f" (reproducer: {f['reproducer']})" if f.get("reproducer") else ""))


def _accy_error_names() -> set[str]:
    names: set[str] = set()
    todo: list[type] = [AccyError]
    while todo:
        cls = todo.pop()
        names.add(cls.__name__)
        todo.extend(cls.__subclasses__())
    return names


_LOCATED = re.compile(r"^(?P<path>[^\n]+?):(?P<line>\d+):(?P<col>\d+): error: ")


def _own_location(o: VariantOutcome, texts: dict[str, bytes | None]) -> None:
    """Point a failure's ``FILE:LINE:COL`` at the variant's own program.

    Programs with the same content share their stage tasks and stored products
    (one key), so a failure's location can name whichever program first made
    the task or the product: another program of the batch, or one a batch before
    stored. When that file's text is this program's, the location is the same
    in this file and the message names it; otherwise the message says where the
    location comes from.
    """
    f = o.failure
    m = _LOCATED.match(f.get("message") or "") if f and isinstance(f.get("message"), str) \
        else None
    if f is None or m is None or os.path.abspath(m["path"]) == os.path.abspath(o.program):
        return
    for p in (m["path"], o.program):
        if p not in texts:
            try:
                with open(p, "rb") as fh:
                    texts[p] = fh.read()
            except OSError:
                texts[p] = None
    if texts[o.program] is not None and texts[m["path"]] == texts[o.program]:
        f["message"] = o.program + f["message"][len(m["path"]):]
    else:
        f["message"] += (f" (the location is in {m['path']}, a program with the same "
                         f"content as {o.program})")


def _record(client: Any, result: BatchResult) -> None:
    """Hand the finished variants to the scheduler plugin (dashboard figures)."""
    payload = []
    for o in result.outcomes:
        d = o.to_json()
        d["program"] = o.program.rsplit("/", 1)[-1].rsplit(".", 1)[0]
        d["elapsed_ns"] = o.elapsed_ns
        payload.append(d)
    try:
        client.sync(client.scheduler.accy_record_batch, variants=payload)
    except Exception:  # noqa: BLE001 - an older scheduler without the dashboard handler
        pass


def _write_html(client: Any, result: BatchResult, path: str) -> None:
    from accy.dashboard.report import write_html_report

    try:
        snapshot = client.sync(client.scheduler.accy_stages)
    except Exception:  # noqa: BLE001
        snapshot = None
    write_html_report(path, snapshot if snapshot else result.report())
