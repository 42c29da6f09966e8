"""The refresh graph: one Dask task per stage run.

A refresh of one variant is resolved on the client against the published
cache state, then submitted:

1. **Short-circuit.** From the semantic fingerprint, each stage's content key
   ``H(stage, version, input fingerprint, options)`` is looked up in the
   published entries, which record each product's output fingerprint — so
   the next stage's key follows. The scheduler plugin walks this chain next
   to the state (:mod:`accy.distributed.resolve`, one round trip for a whole
   batch). The longest published prefix adds no task: the graph depends on
   the last prefix stage's held key (pinned by the plugin), or reads its
   product from the artifact store when it is no longer pinned.
2. **Submit the rest.** The remaining stages are tasks keyed
   ``("accy_<stage>", hex)``: the first by its content key, each later one by
   a derivation key ``H(stage, version, previous task key, options)`` (its
   input's fingerprint is not known until the previous task has run). Equal
   keys are equal computations, so identical stage runs across variants and
   concurrent refreshes are one task. Compile and load follow; for CUDA they
   are restricted to workers with the ``GPU`` resource when there are any
   (NVRTC needs no GPU, so without GPU workers CUDA variants still compile
   anywhere and their load is reported as skipped).
3. **Early cutoff inside the graph.** A stage task computes its real content
   key from its input's fingerprint and first looks in the artifact store: a
   stage whose input did not change after all is read back, not run.

Products travel between workers as msgpack frames (registered serializers);
the control plane (task specs, small dicts) is Dask's own.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass, field
from typing import Any

from accy.errors import AccyError
from accy.paths import user_dir
from accy.pipeline import PREPARATION_NAMES, preparation
from accy.pipeline import stage as table_stage
from accy.preparation.admission import read_back, read_stage_result, write
from accy.preparation.keys import make_key
from accy.preparation.options import RunOptions
from accy.preparation.products import Product, SemanticModule
from accy.preparation.stages import PreparationRequest, StageResult

TASK_PREFIX = "accy_"


class StageFailed(AccyError):
    """A stage, compile or load task failed; only plain strings cross the wire."""

    def __init__(self, message: str, stage: str = "", pipeline: str = "", pass_name: str = "",
                 reproducer: str | None = None) -> None:
        super().__init__(message)
        self.stage = stage
        self.pipeline = pipeline
        self.pass_name = pass_name
        self.reproducer = reproducer

    def __reduce__(self) -> Any:
        return (StageFailed, (self.message, self.stage, self.pipeline, self.pass_name,
                              self.reproducer))

    def failure_json(self) -> dict[str, Any]:
        return {"pipeline": self.pipeline or self.stage, "pass": self.pass_name,
                "message": self.message, "reproducer": self.reproducer}


class InputLost(StageFailed):
    """The product a task was planned to read is neither held nor stored any more
    (released pins, a lost worker, an evicted store entry): the batch refreshes
    the variant again from its program."""

    def __reduce__(self) -> Any:
        return (InputLost, (self.message, self.stage, self.pipeline, self.pass_name,
                            self.reproducer))


@dataclass(frozen=True)
class VariantRequest:
    """One refresh, as plain data (it rides in task specs)."""

    program: str
    variant: str
    target: str = "host"
    options: dict[str, Any] = field(default_factory=dict)
    shapes: dict[int, tuple[int, ...]] = field(default_factory=dict)

    def run_options(self) -> RunOptions:
        return RunOptions.parse(self.target, self.options)

    def preparation_request(self) -> PreparationRequest:
        return PreparationRequest(source=self.program, variant=self.variant,
                                  options=self.run_options(), shapes=dict(self.shapes))

    def to_dict(self) -> dict[str, Any]:
        return {"program": self.program, "variant": self.variant, "target": self.target,
                "options": dict(self.options),
                "shapes": {str(i): list(s) for i, s in self.shapes.items()}}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> VariantRequest:
        return VariantRequest(d["program"], d["variant"], d["target"], dict(d["options"]),
                              {int(i): tuple(s) for i, s in d["shapes"].items()})


def _reproducer_dir() -> str:
    return os.environ.get("ACCY_REPRO_DIR") or user_dir("reproducers")


def _store(url: str | None) -> Any:
    """This process's store for ``url`` (one instance: its size index is kept)."""
    if url is None:
        return None
    from accy.store import default_max_bytes

    return _store_instance(url, default_max_bytes())


@functools.cache
def _store_instance(url: str, max_bytes: int) -> Any:
    from accy.store import ArtifactStore

    return ArtifactStore(url, max_bytes)


def _input_product(prev: Any, store: Any, stage_name: str) -> Product:
    """The product a task reads: a held result, scattered data, or (when the
    result it was resolved to is no longer held) the store's copy, admitted for
    its key like any other read-back."""
    if isinstance(prev, StageResult):
        return prev.product
    if isinstance(prev, Product):
        return prev
    if isinstance(prev, tuple) and len(prev) == 3 and prev[0] == "store":
        _, producer, fields = prev
        from accy.preparation.keys import StageKey

        result, why = read_stage_result(store, StageKey(producer, fields))
        if result is None:
            raise InputLost(f"the {fields.get('stage')} product {producer[:12]} the "
                              f"{stage_name} stage needs is neither held nor stored ({why}); "
                              "refresh again to recompute it", stage_name, stage_name)
        return result.product
    raise TypeError(f"unexpected stage input {type(prev).__name__}")


# ------------------------------------------------------------------ worker tasks


def stage_task(stage_name: str, prev: Any, request: dict[str, Any], store_url: str | None) \
        -> StageResult:
    """Run (or read back from the store) one stage on a worker."""
    from accy.choir.passes import Reproducer
    from accy.errors import PassFailedError

    s = table_stage(stage_name)
    req = VariantRequest.from_dict(request)
    store = _store(store_url)
    product = _input_product(prev, store, stage_name)
    preq = req.preparation_request()
    key = s.key(product.fingerprint(), preq.options, preq.shapes)
    t0 = time.perf_counter_ns()
    stored, _ = read_stage_result(store, key)
    if stored is not None:
        stored.elapsed_ns = time.perf_counter_ns() - t0
        return stored
    try:
        result = s.run(product, preq, key)
    except PassFailedError as e:
        repro = e.reproducer
        path = repro.write(_reproducer_dir(), f"accy-repro-{stage_name}-{key.hex[:16]}.mlir") \
            if isinstance(repro, Reproducer) else None
        raise StageFailed(str(e), stage_name, stage_name, getattr(repro, "pass_name", ""),
                          path) from None
    except AccyError as e:
        raise StageFailed(str(e), stage_name, stage_name) from None
    write(store, key.hex, result.to_wire(), stage_name)
    return result


def compile_task(prev: Any, request: dict[str, Any], store_url: str | None) -> Any:
    """Compile the target product (or read the binary back by compile key)."""
    from accy.executable.compile import (
        CompiledFragment,
        check_fragment,
        compile_fragment,
        compile_key,
    )

    store = _store(store_url)
    job = _input_product(prev, store, "compile")
    key = compile_key(job)  # type: ignore[arg-type]
    t0 = time.perf_counter_ns()
    stored, _ = read_back(store, key.hex, "fragment", CompiledFragment.from_wire,
                          functools.partial(check_fragment, key=key))
    if stored is not None:
        stored.elapsed_ns = time.perf_counter_ns() - t0
        stored.meta["origin"] = "store"
        return stored
    try:
        compiled = compile_fragment(job, None, key)  # type: ignore[arg-type]
    except AccyError as e:
        raise StageFailed(str(e), "compile", "compile", "", getattr(e, "source_path", None)) \
            from None
    write(store, key.hex, compiled.to_wire(), "fragment")
    return compiled


def load_task(compiled: Any) -> dict[str, Any]:
    """Load the fragment into this worker process; return a small descriptor."""
    from distributed import get_worker

    from accy.executable.fragment import load_fragment

    t0 = time.perf_counter_ns()
    try:
        _, reused = load_fragment(compiled)
    except AccyError as e:
        raise StageFailed(str(e), "load", "load") from None
    try:
        worker = get_worker().address
    except ValueError:
        worker = ""
    return {"worker": worker, "key": compiled.key.hex, "reused": reused,
            "elapsed_ns": time.perf_counter_ns() - t0, "launches": len(compiled.plan.launches),
            "target": compiled.plan.target}


def summarize_task(stages: list[str], *values: Any) -> dict[str, Any]:
    """What the client needs of a finished refresh (receipt fields, fingerprints).

    The products stay on the workers: the client gathers this small dict.
    """
    out: dict[str, Any] = {}
    for stage, v in zip(stages, values):
        if stage in PREPARATION_NAMES:
            out[stage] = {"key": v.key.hex, "fields": v.key.fields, "origin": v.origin,
                          "elapsed_ns": v.elapsed_ns, "pass_stats": v.pass_stats,
                          "pass_ns": v.pass_ns, "plan_fingerprint": v.plan_fingerprint,
                          "fingerprint": v.product.fingerprint()}
        elif stage == "compile":
            out[stage] = {"key": v.key.hex, "origin": v.meta.get("origin"),
                          "elapsed_ns": v.elapsed_ns, "binary_bytes": len(v.binary),
                          "target": v.plan.target}
        else:
            out[stage] = dict(v)
    return out


def run_task(descriptor: dict[str, Any], compiled: Any, inputs: list[Any]) -> list[Any]:
    """Run a loaded fragment on this worker (loading it again if this process lost it)."""
    import numpy as np

    from accy.executable.fragment import load_fragment

    loaded, _ = load_fragment(compiled)
    return [np.asarray(r) if not hasattr(r, "get") else r.get() for r in loaded(*inputs)]


# ----------------------------------------------------------------- client side


@dataclass
class Resolved:
    """A stage whose product the published state already holds."""

    stage: str
    key: str
    entry: dict[str, Any]


@dataclass
class RefreshPlan:
    """One variant's refresh: the reused prefix and the futures of what runs."""

    request: VariantRequest
    semantic_fingerprint: str
    resolved: list[Resolved]
    futures: dict[str, Any]
    """Stage (``contract`` … ``target``, ``compile``, ``load``) → Dask future."""
    task_keys: dict[str, tuple[str, str]]
    compile_entry_key: str
    load_skipped: str | None = None
    fully_reused: bool = False
    resolution: dict[str, Any] = field(default_factory=dict)
    """The scheduler's answer for this variant: prefix, compile entry, variant record."""
    summary: Any = None
    """A small task gathering the receipt fields of every submitted stage."""
    summary_key: Any = None
    held: list[Any] = field(default_factory=list)
    """Futures this plan's graph depends on (held keys, scattered data): kept alive."""
    submitted: list[str] = field(default_factory=list)
    """The stages (and compile, load) that got a task in the graph."""

    def bind(self, futures: dict[Any, Any]) -> None:
        """Attach the futures of the submitted graph."""
        for stage in self.submitted:
            self.futures[stage] = futures[self.task_keys[stage]]
        if self.summary_key is not None:
            self.summary = futures[self.summary_key]


def scatter_module(client: Any, module: SemanticModule) -> Any:
    """The program as data on the cluster (msgpack frames), keyed by its fingerprint.

    Task specs are pickled by Dask, and products refuse pickling: the module
    enters the graph as scattered data instead of a literal argument. It is
    replicated to every worker, so losing one worker loses no program.
    """
    import uuid

    # A fresh key each time: re-scattering a key the scheduler is still
    # releasing would cancel the tasks that depend on it.
    key = f"{TASK_PREFIX}semantic-{module.fingerprint()}-{uuid.uuid4().hex[:8]}"
    return client.scatter({key: module}, hash=False, broadcast=True)[key]


def resolution_request(module: SemanticModule, request: VariantRequest) -> dict[str, Any]:
    """What the scheduler needs to resolve this variant's published prefix."""
    options = request.run_options()
    return {"semantic": module.fingerprint(), "variant": request.variant,
            "program": request.program, "target": request.target,
            "stages": [s.template(options, request.shapes) for s in preparation()],
            "compile": table_stage("compile").template(options)}


def compile_entry_key(target_key: str, options: RunOptions) -> str:
    """Where the published state keeps the compile of a target product (by its key)."""
    return table_stage("compile").derived_key(target_key, options).hex


class GraphBuilder:
    """Every task of a batch, submitted as one graph (one message to the scheduler).

    Tasks that must run on GPU workers go in a layer annotated with
    ``resources={"GPU": 1}``; the rest may run anywhere.
    """

    def __init__(self) -> None:
        self.cpu: dict[Any, Any] = {}
        self.gpu: dict[Any, Any] = {}

    def add(self, key: tuple[str, str], func: Any, *args: Any, gpu: bool = False) -> Any:
        from dask.task_spec import Task

        layer = self.gpu if gpu else self.cpu
        if key not in self.cpu and key not in self.gpu:
            layer[key] = Task(key, func, *args)
        return self.ref(key)

    @staticmethod
    def ref(key: Any) -> Any:
        from dask.task_spec import TaskRef

        return TaskRef(key)

    def submit(self, client: Any) -> dict[Any, Any]:
        """Send the graph; return the future of every task by key."""
        from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

        if not self.cpu and not self.gpu:
            return {}
        layers = {"accy-stages": MaterializedLayer(self.cpu)}
        deps: dict[str, set[str]] = {"accy-stages": set()}
        if self.gpu:
            layers["accy-gpu"] = MaterializedLayer(self.gpu,
                                                   annotations={"resources": {"GPU": 1}})
            deps["accy-gpu"] = {"accy-stages"}
        keys = list(self.cpu) + list(self.gpu)
        futures = client.get(HighLevelGraph(layers, deps), keys, sync=False)
        return dict(zip(keys, futures))


def plan_refresh(client: Any, module: SemanticModule, request: VariantRequest,
                 resolution: dict[str, Any], store_url: str | None, gpu_workers: bool,
                 graph: GraphBuilder, scattered: dict[str, Any] | None = None) -> RefreshPlan:
    """Short-circuit the resolved prefix and add the remaining stage tasks to ``graph``.

    ``resolution`` is this variant's answer from
    :func:`accy.distributed.resolve.resolve` (run by the scheduler plugin);
    ``scattered`` caches the program's scattered data across one batch. Call
    :meth:`RefreshPlan.bind` with the futures once the graph is submitted.
    """
    from distributed import Future

    options = request.run_options()
    shapes = dict(request.shapes)
    resolved = [Resolved(r["stage"], r["key"], r["entry"])
                for r in resolution.get("resolved", [])]
    # the graph depends on the last resolved stage only: it must still be held or stored
    usable = [i + 1 for i, r in enumerate(resolved)
              if r.entry.get("pinned") or (r.entry.get("stored") and store_url is not None)]
    resolved = resolved[:max(usable, default=0)]
    fp = resolved[-1].entry["fingerprint"] if resolved else module.fingerprint()
    rd = request.to_dict()
    task_keys: dict[str, tuple[str, str]] = {}
    held: list[Any] = []
    prev: Any = None
    chain = fp  # what the next key derives from: a fingerprint, then task keys
    if resolved:
        last = resolved[-1]
        tk = tuple(last.entry.get("task_key") or ())
        if last.entry.get("pinned") and len(tk) == 2:
            held.append(Future(tk, client=client))  # the held key: no task for the prefix
            prev = graph.ref(tk)
        else:  # released: the next task reads it from the store (or fails: not stored)
            prev = ("store", last.key, last.entry.get("fields") or {"stage": last.stage})
    else:
        cache = scattered if scattered is not None else {}
        if module.fingerprint() not in cache:
            cache[module.fingerprint()] = scatter_module(client, module)
        held.append(cache[module.fingerprint()])
        prev = graph.ref(cache[module.fingerprint()].key)
    for s in preparation()[len(resolved):]:
        # the first task's input is known by content; each later one's by the task before
        dk = (s.derived_key(chain, options, shapes) if task_keys
              else s.key(chain, options, shapes)).hex
        key = (f"{TASK_PREFIX}{s.name}", dk)
        prev = graph.add(key, stage_task, s.name, prev, rd, store_url)
        task_keys[s.name] = key
        chain = dk

    backend = options.target.backend
    on_gpu = backend.needs_gpu and gpu_workers
    all_resolved = len(resolved) == len(PREPARATION_NAMES)
    target_key = resolved[-1].key if all_resolved else task_keys["target"][1]
    entry_key = compile_entry_key(target_key, options)
    centry = resolution.get("compile") if all_resolved else None
    descriptor = (resolution.get("variant") or {}).get("fragment") or {}
    load_skipped = "no GPU" if backend.needs_gpu and not gpu_workers else None
    if (all_resolved and centry and centry.get("pinned")
            and (load_skipped or (descriptor.get("key") == centry.get("key")
                                  and resolution.get("worker_alive")))):
        return RefreshPlan(request, module.fingerprint(), resolved, {}, {}, entry_key,
                           load_skipped, fully_reused=True, resolution=resolution)
    submitted = list(task_keys)
    if centry and centry.get("pinned"):
        ckey = tuple(centry["task_key"])
        held.append(Future(ckey, client=client))
        cref = graph.ref(ckey)
    else:
        ckey = (f"{TASK_PREFIX}compile", entry_key)
        cref = graph.add(ckey, compile_task, prev, rd, store_url, gpu=on_gpu)
        submitted.append("compile")
    task_keys["compile"] = ckey  # type: ignore[assignment]
    if load_skipped is None:
        lkey = (f"{TASK_PREFIX}load", table_stage("load").derived_key(ckey[1], options).hex)
        graph.add(lkey, load_task, cref, gpu=on_gpu)
        task_keys["load"] = lkey
        submitted.append("load")
    plan = RefreshPlan(request, module.fingerprint(), resolved, {}, task_keys,
                       entry_key, load_skipped, resolution=resolution)
    plan.held = held
    plan.submitted = submitted
    if submitted:
        skey = ("accy-receipts", make_key({"receipts": [list(task_keys[s]) for s in submitted],
                                           "variant": request.variant}).hex)
        graph.add(skey, summarize_task, submitted,
                  *[graph.ref(task_keys[s]) for s in submitted])
        plan.summary_key = skey
    return plan


def resolve_many(client: Any, requests: list[dict[str, Any]]) -> dict[str, Any]:
    """The scheduler's resolution of every request, in one round trip."""
    return client.sync(client.scheduler.accy_resolve, requests=requests)
