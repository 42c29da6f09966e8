"""The refresh graph: one node per stage run, linear chains fused into one task.

A refresh of one variant is resolved against the published cache state, then
submitted:

1. **Short-circuit.** From the semantic fingerprint, each stage's content key
   ``H(stage, version, input fingerprint, options)`` is looked up in the
   published entries, which record each product's output fingerprint — so
   the next stage's key follows. The scheduler plugin walks this chain next
   to the state (:mod:`accy.distributed.resolve`, one round trip for a whole
   batch). The longest published prefix adds no node: the graph depends on
   the last prefix stage's held key (pinned by the plugin), or reads its
   product from the artifact store when it is no longer held.
2. **Nodes for the rest.** The remaining stages are nodes keyed
   ``("accy_<stage>", hex)``: the first by its content key, each later one by
   a derivation key ``H(stage, version, previous node key, options)`` (its
   input's fingerprint is not known until the previous stage has run). Equal
   keys are equal computations, so identical stage runs across the variants
   of a batch are one node. Compile and load follow; for CUDA they are
   restricted to workers with the ``GPU`` resource when there are any (NVRTC
   needs no GPU, so without GPU workers CUDA variants still compile anywhere
   and their load is reported as skipped).
3. **Fused into tasks.** :class:`GraphBuilder` fuses every node that only one
   other node reads into that reader (Dask's ``fuse_linear`` rule): a chain
   no other variant shares is one task (``accy_contract-load``), a node
   several variants read ends a task of its own. Each stage inside a task is
   still keyed, stored, reused and published by its own stage key; the task's
   value (:class:`ChainResult`) carries the variant's receipts. CUDA chains that
   compile run a few to one task (:func:`chain_group_task`, :func:`compile_grain`):
   their fragments compile in one NVRTC program. Such a chain has no task of its
   own: its value is its entry of the group's (:class:`ChainGroup`), its own result
   or failure, which a reader picks inside its own task
   (:meth:`GraphBuilder.ref`, :func:`held_value`).
4. **Early cutoff inside the task.** Each stage computes its real content key
   from its input's fingerprint and first looks in the artifact store: a
   stage whose input did not change after all is read back, not run (this is
   also what dedupes a stage two concurrent batches fused differently).

Products travel between workers as msgpack frames (registered serializers);
the control plane (task specs, small dicts) is Dask's own.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import json
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from accy.errors import AccyError
from accy.paths import user_dir
from accy.pipeline import PREPARATION_NAMES, preparation
from accy.pipeline import stage as table_stage
from accy.preparation.admission import WriteBehind, read_back, read_stage_result, write
from accy.preparation.keys import keyed
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

        self.receipts: dict[str, Any] = {}
        """Receipt fields of the stages of its chain that finished before it failed."""

    def __reduce__(self) -> Any:
        return (_rebuild_failure, (type(self), self.message, self.stage, self.pipeline,
                                   self.pass_name, self.reproducer, self.receipts))

    def failure_json(self) -> dict[str, Any]:
        return {"pipeline": self.pipeline or self.stage, "pass": self.pass_name,
                "message": self.message, "reproducer": self.reproducer}


class InputLost(StageFailed):
    """The product a task was planned to read is neither held nor stored any more
    (released pins, a lost worker, an evicted store entry): the batch refreshes
    the variant again from its program."""


def _rebuild_failure(cls: type[StageFailed], message: str, stage: str, pipeline: str,
                     pass_name: str, reproducer: str | None, receipts: dict[str, Any]) \
        -> StageFailed:
    e = cls(message, stage, pipeline, pass_name, reproducer)
    e.receipts = receipts
    return e


@dataclass(frozen=True)
class VariantRequest:
    """One refresh, as plain data (it rides in task specs)."""

    program: str
    variant: str
    target: str = "host"
    options: dict[str, Any] = field(default_factory=dict)
    shapes: dict[int, tuple[int, ...]] = field(default_factory=dict)

    def run_options(self) -> RunOptions:
        """The parsed options (parsed once: a batch asks for them at every step)."""
        cached = self.__dict__.get("_run_options")
        if cached is None:
            cached = RunOptions.parse(self.target, self.options)
            object.__setattr__(self, "_run_options", cached)
        return cached

    def template(self, stage_name: str) -> dict[str, Any]:
        """The stage's key template for this variant (:func:`stage_template`: one dict per
        distinct template in the process)."""
        return stage_template(stage_name, self.run_options(), self.shapes)

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


def _materialized(product: Product, stage_name: str) -> Product:
    """``product`` with its module decoded (a deferred read-back is verified here);
    a stored product that turns out broken is a lost input: the entry is gone and the
    variant is refreshed again (:class:`InputLost`), never a failure."""
    from accy.preparation.products import StoredProductBroken

    try:
        product.module  # noqa: B018 - decodes a deferred product
    except StoredProductBroken as e:
        raise InputLost(f"{e}; refresh again to recompute it", stage_name, stage_name) \
            from None
    return product


def _input_product(prev: Any, store: Any, stage_name: str) -> Product:
    """The product a task reads: a held result, an inline program, or (when the
    result it was resolved to is no longer held) the store's copy, admitted for
    its key like any other read-back."""
    if isinstance(prev, InlineProgram):
        return program_of(prev)
    if isinstance(prev, ChainResult):
        prev = prev.result
    if isinstance(prev, StageResult):
        return prev.product
    if isinstance(prev, Product):
        return prev
    if isinstance(prev, tuple) and len(prev) == 3 and prev[0] == "store":
        _, producer, fields = prev
        from accy.preparation.keys import StageKey

        result, why = read_stage_result(store, StageKey(producer, fields), deferred=True)
        if result is None:
            raise InputLost(f"the {fields.get('stage')} product {producer[:12]} the "
                              f"{stage_name} stage needs is neither held nor stored ({why}); "
                              "refresh again to recompute it", stage_name, stage_name)
        return result.product
    raise TypeError(f"unexpected stage input {type(prev).__name__}")


# ------------------------------------------------------------------ stage keys


@functools.cache
def _version(stage_name: str) -> str:
    """A stage's version, once per process (it hashes the source of its import closure)."""
    return table_stage(stage_name).version


def stage_template(stage_name: str, options: RunOptions, shapes: Any = None) -> dict[str, Any]:
    """:meth:`accy.pipeline.Stage.template`, once per (stage, options, shapes it reads)
    in a process: equal templates are one dict (shared: never changed)."""
    return _template(stage_name, options, _shapes_read(stage_name, shapes))


def stage_template_json(stage_name: str, options: RunOptions, shapes: Any = None) -> str:
    """:func:`stage_template` as canonical JSON, serialized once as well: a batch names
    each distinct template by this text (:func:`resolution_request`)."""
    return _template_json(stage_name, options, _shapes_read(stage_name, shapes))


def _shapes_read(stage_name: str, shapes: Any) -> Any:
    if not table_stage(stage_name).reads_shapes:
        return None
    return tuple(sorted((int(i), tuple(d)) for i, d in (shapes or {}).items()))


@functools.lru_cache(maxsize=4096)
def _template(stage_name: str, options: RunOptions, shapes: Any) -> dict[str, Any]:
    s = table_stage(stage_name)
    return {"stage": s.name, "version": _version(s.name),
            "options": s.reads(options, dict(shapes) if shapes is not None else None)}


@functools.lru_cache(maxsize=4096)
def _template_json(stage_name: str, options: RunOptions, shapes: Any) -> str:
    import json

    return json.dumps(_template(stage_name, options, shapes), sort_keys=True, default=str)


def content_key(stage_name: str, input_fingerprint: str, options: RunOptions,
                shapes: Any = None, template: dict[str, Any] | None = None) -> Any:
    """:meth:`accy.pipeline.Stage.key` (same fields, same key)."""
    t = template if template is not None else stage_template(stage_name, options, shapes)
    return keyed(t, "input", input_fingerprint)


def derived_key(stage_name: str, after: str, options: RunOptions, shapes: Any = None,
                template: dict[str, Any] | None = None) -> Any:
    """:meth:`accy.pipeline.Stage.derived_key` (same fields, same key)."""
    t = template if template is not None else stage_template(stage_name, options, shapes)
    return keyed(t, "after", after)


# ------------------------------------------------------------------ worker tasks


class ChainResult:
    """What a (fused) chain task leaves in worker memory under its Dask key.

    ``result`` is the product of the chain's last stage (a :class:`StageResult`),
    or for a chain ending in compile or load the :class:`CompiledFragment`;
    ``receipts`` are the receipt fields of every stage this variant ran in the
    chain and in the chains before it (so the last task of a variant carries
    all of them); ``load`` is the load descriptor. It moves as msgpack: the
    receipts as a map, the result as its own wire bytes, decoded only when
    read (a client gathering receipts never decodes a product).
    """

    def __init__(self, receipts: dict[str, Any], result: Any, load: dict[str, Any] | None = None,
                 kind: str = "") -> None:
        self.receipts = receipts
        self.load = load
        self.kind = kind or ("fragment" if not isinstance(result, StageResult) else "stage")
        self._result = result
        self._wire: bytes | None = None

    @property
    def result(self) -> Any:
        if self._result is None and self.kind == "stored-fragment":
            self._result = _stored_fragment(self.receipts, self.load)
            self.kind = "fragment"
        if self._result is None and self._wire is not None:
            if self.kind == "stage":
                self._result = StageResult.from_wire(self._wire)
            else:
                from accy.executable.compile import CompiledFragment

                self._result = CompiledFragment.from_wire(self._wire)
            self._wire = None
        return self._result

    def wire_parts(self) -> tuple[str, bytes]:
        """Its kind and its result's wire bytes (none for a stored fragment)."""
        if self.kind == "stored-fragment":
            return self.kind, b""
        return self.kind, self._wire if self._wire is not None else self._result.to_wire()

    @staticmethod
    def from_parts(kind: str, receipts: dict[str, Any], load: dict[str, Any] | None,
                   body: bytes) -> ChainResult:
        """:meth:`wire_parts` back, with its receipts and load descriptor; the result
        decoded only when read."""
        if kind not in ("stage", "fragment", "stored-fragment"):
            raise ValueError(f"chain result of kind {kind!r}")
        out = ChainResult(receipts, None, load, kind)
        out._wire = body
        return out

    def to_wire(self) -> bytes:
        import msgpack

        kind, body = self.wire_parts()
        return msgpack.packb([b"accy-chain", kind, self.receipts, self.load, body],
                             use_bin_type=True)

    @staticmethod
    def from_wire(data: bytes) -> ChainResult:
        import msgpack

        from accy.errors import WireFormatError

        try:
            tag, kind, receipts, load, body = msgpack.unpackb(bytes(data), raw=False,
                                                              strict_map_key=False)
            if tag != b"accy-chain":
                raise ValueError("tag")
            return ChainResult.from_parts(kind, receipts, load, body)
        except Exception as e:
            raise WireFormatError(f"malformed chain result: {type(e).__name__}") from None

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise TypeError("ChainResult never pickles: it travels as msgpack")

    def by_store_reference(self, store_url: str | None) -> ChainResult:
        """A chain ending in compile/load whose binary is in the store moves without it:
        a reader (a reload, ``accy.distributed.api.run``) reads it back by its compile
        key, so gathering a variant's receipts never carries its binary."""
        if store_url is None or self.kind != "fragment" or "compile" not in self.receipts:
            return self
        compiled = self._result
        # compile_group marks what it read from or wrote to the store (no read-back)
        if compiled is not None and compiled.meta.get("stored") != store_url \
                and not _store_holds(store_url, compiled.key.hex):
            return self
        out = ChainResult(self.receipts, compiled, self.load, "stored-fragment")
        out.receipts = dict(self.receipts, compile=dict(self.receipts["compile"],
                                                        store=store_url))
        return out


def _store_holds(store_url: str, key_hex: str) -> bool:
    try:
        return _store(store_url).get(key_hex, kind="fragment") is not None
    except Exception:  # noqa: BLE001 - an unreadable tier: keep the binary in the value
        return False


@functools.lru_cache(maxsize=256)
def _read_fragment(store_url: str, key_hex: str) -> Any:
    from accy.executable.compile import CompiledFragment

    def check(c: Any) -> str | None:
        if c.key.hex != key_hex:
            return f"entry was made for compile key {c.key.hex[:12]}, not {key_hex[:12]}"
        return None if c.binary else "entry holds no binary"

    compiled, why = read_back(_store(store_url), key_hex, "fragment", CompiledFragment.from_wire,
                              check)
    if compiled is None:
        raise InputLost(f"the compiled fragment {key_hex[:12]} is neither held nor stored "
                        f"({why}); refresh again to recompile it", "compile", "compile")
    return compiled


def _stored_fragment(receipts: dict[str, Any], load: Any) -> Any:
    c = receipts.get("compile") or {}
    return _read_fragment(c.get("store"), c.get("key"))


def stage_receipt(result: StageResult, node: str) -> dict[str, Any]:
    """The receipt fields of a stage result (what the client turns into a receipt)."""
    return {"node": node, "key": result.key.hex, "fields": result.key.fields,
            "origin": result.origin, "elapsed_ns": result.elapsed_ns,
            "pass_stats": result.pass_stats, "pass_ns": result.pass_ns,
            "plan_fingerprint": result.plan_fingerprint,
            "fingerprint": result.product.fingerprint()}


def compile_receipt(compiled: Any, node: str) -> dict[str, Any]:
    return {"node": node, "key": compiled.key.hex, "origin": compiled.meta.get("origin"),
            "elapsed_ns": compiled.elapsed_ns, "binary_bytes": len(compiled.binary),
            "binary_reused": compiled.meta.get("binary") == "reused",
            "target": compiled.plan.target}


def compiled_of(value: Any) -> Any:
    """The compiled fragment a held value carries (a chain result or the fragment)."""
    return value.result if isinstance(value, ChainResult) else value


def held_value(value: Any, pick: int | None) -> Any:
    """The value a published holder names: the task's value, or (``pick``) that chain's
    entry of the group task's value (its failure raised)."""
    return value if pick is None else chain_pick_task(value, pick)


def stage_task(stage_name: str, prev: Any, preq: PreparationRequest, store: Any,
               writes: WriteBehind | None = None) -> StageResult:
    """Run (or read back from ``store``) one stage of the variant ``preq`` on a worker.
    With ``writes`` its product is put in the store in the background (the caller
    flushes)."""
    from accy.choir.passes import Reproducer
    from accy.errors import PassFailedError

    s = table_stage(stage_name)
    product = _input_product(prev, store, stage_name)
    key = content_key(stage_name, product.fingerprint(), preq.options, preq.shapes)
    t0 = time.perf_counter_ns()
    # deferred: a result read back only to key the next stage is never decoded
    stored, _ = read_stage_result(store, key, deferred=True)
    if stored is not None:
        stored.elapsed_ns = time.perf_counter_ns() - t0
        return stored
    _materialized(product, stage_name)
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
    if writes is not None:
        writes.write(key.hex, result, stage_name)
    else:
        write(store, key.hex, result, stage_name)
    return result


def compile_group(values: list[Any], store_url: str | None) -> list[Any]:
    """Compile several target products (the compile step of a chain): each is read
    back from the store by its compile key if it is there; the rest compile together
    (:func:`~accy.executable.compile.compile_fragments`: one NVRTC run for CUDA) and
    are stored. Returns each compiled fragment, or the ``StageFailed`` of its compile."""
    from accy.executable.compile import (
        CompiledFragment,
        check_fragment,
        compile_fragments,
        compile_key,
    )

    store = _store(store_url)
    out: list[Any] = [None] * len(values)
    todo: list[tuple[int, Any, Any]] = []
    for i, value in enumerate(values):
        try:
            job = _materialized(_input_product(value, store, "compile"), "compile")
        except StageFailed as e:
            out[i] = e
            continue
        key = compile_key(job)  # type: ignore[arg-type]
        t0 = time.perf_counter_ns()
        stored, _ = read_back(store, key.hex, "fragment", CompiledFragment.from_wire,
                              functools.partial(check_fragment, key=key))
        if stored is not None:
            stored.elapsed_ns = time.perf_counter_ns() - t0
            stored.meta["origin"] = "store"
            stored.meta["stored"] = store_url
            out[i] = stored
        else:
            todo.append((i, job, key))
    compiled = compile_fragments([job for _, job, _ in todo], [key for _, _, key in todo],
                                 store)
    for (i, _, key), got in zip(todo, compiled):
        if isinstance(got, AccyError):
            out[i] = StageFailed(str(got), "compile", "compile", "",
                                 getattr(got, "source_path", None))
        else:
            if store is not None and write(store, key.hex, got, "fragment") is None:
                got.meta["stored"] = store_url
            out[i] = got
    return out


def load_task(compiled: Any) -> dict[str, Any]:
    """Load the fragment into this worker process; return a small descriptor."""
    from distributed import get_worker

    from accy.executable.fragment import load_fragment

    compiled = compiled_of(compiled)
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


def chain_task(steps: list[list[str]], prev: Any, request: dict[str, Any],
               store_url: str | None) -> ChainResult:
    """Run a linear chain of stage runs (``[[stage, node hex], ...]``, maybe ending in
    compile and load) in one task.

    Each stage is still its own keyed run: its product is read back from the
    store by its content key or run and written there under it, exactly as
    :func:`stage_task` does; only the Dask task boundary between them is gone.
    A failure carries the receipts of the stages that finished before it
    (``StageFailed.receipts``), so the client never gathers products to report it.
    """
    return chain_pick_task(chain_group_task([[steps, request]], store_url, prev), 0)


class ChainGroup:
    """What a :func:`chain_group_task` leaves under its key: per chain, its
    :class:`ChainResult` or the ``StageFailed`` that ended it. Moves as msgpack: each
    stage receipt once however many of its chains (ended or failed) carry it (those that
    read one prefix carry that prefix's receipts: four of seven in a shared sweep,
    3.4 KB a chain before; RESULTS.md, batch, thirtieth session), each result's product
    as its own wire bytes, each failure as its fields."""

    def __init__(self, entries: list[Any]) -> None:
        self.entries = entries

    def to_wire(self) -> bytes:
        import msgpack

        table: list[Any] = []
        seen: dict[int, int] = {}  # id of a receipt dict → its place in the table

        def refs(receipts: dict[str, Any]) -> dict[str, int]:
            out = {}
            for stage, r in receipts.items():
                at = seen.get(id(r))
                if at is None:
                    at = seen[id(r)] = len(table)
                    table.append(r)
                out[stage] = at
            return out

        body: list[list[Any]] = []
        for e in self.entries:
            if isinstance(e, ChainResult):
                kind, result = e.wire_parts()
                body.append([b"ok", kind, refs(e.receipts), e.load, result])
            else:
                body.append([b"failed", type(e) is InputLost, e.message, e.stage, e.pipeline,
                             e.pass_name, e.reproducer, refs(e.receipts)])
        return msgpack.packb([b"accy-chains", table, body], use_bin_type=True)

    @staticmethod
    def from_wire(data: bytes) -> ChainGroup:
        import msgpack

        from accy.errors import WireFormatError

        try:
            tag, table, body = msgpack.unpackb(bytes(data), raw=False, strict_map_key=False)
            if tag != b"accy-chains":
                raise ValueError("tag")
            entries: list[Any] = []

            def receipts(refs: dict[str, int]) -> dict[str, Any]:
                return {stage: table[i] for stage, i in refs.items()}

            for e in body:
                if e[0] == b"ok":
                    _, kind, refs, load, result = e
                    entries.append(ChainResult.from_parts(kind, receipts(refs), load, result))
                else:
                    lost, message, stage, pipeline, pass_name, repro, refs = e[1:]
                    entries.append(_rebuild_failure(InputLost if lost else StageFailed,
                                                    message, stage, pipeline, pass_name,
                                                    repro, receipts(refs)))
        except Exception as e:
            raise WireFormatError(f"malformed chain group: {type(e).__name__}") from None
        return ChainGroup(entries)

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise TypeError("ChainGroup never pickles: it travels as msgpack")


def chain_pick_task(group: ChainGroup, i: int) -> ChainResult:
    """Chain ``i`` of a group: its result, or its failure raised (so each chain keeps a
    task key, a result and a failure of its own)."""
    entry = group.entries[i]
    if isinstance(entry, StageFailed):
        raise entry
    result: ChainResult = entry
    return result


def chain_group_task(chains: list[list[Any]], store_url: str | None, *prevs: Any) \
        -> ChainGroup:
    """Run several chains (``[steps, request]`` each, reading ``prevs[i]``) in one task:
    each one's stage runs as :func:`chain_task` does, then every chain's compile at
    once (:func:`compile_group`: the CUDA ones in one NVRTC run), then each one's load.
    A chain's failure is its own: it ends that chain and is returned in its place.
    The stage products go to the store in the background (:class:`WriteBehind`),
    flushed before the task returns."""
    entries: list[Any] = []
    store = _store(store_url)
    writes = WriteBehind(store)
    for (steps, request), prev in zip(chains, prevs):
        receipts: dict[str, Any] = dict(prev.receipts) if isinstance(prev, ChainResult) else {}
        value = prev
        preq = VariantRequest.from_dict(request).preparation_request()  # once a chain
        try:
            for stage_name, node in steps:
                if stage_name in ("compile", "load"):
                    break
                value = stage_task(stage_name, value, preq, store, writes)
                receipts[stage_name] = stage_receipt(value, node)
        except StageFailed as e:
            e.receipts = receipts
            value = e
        entries.append([steps, receipts, value])
    compiling = [i for i, (steps, _, value) in enumerate(entries)
                 if not isinstance(value, StageFailed) and any(s == "compile" for s, _ in steps)]
    writes.start()  # the puts overlap the compile (NVRTC or cc, outside the GIL)
    for i, compiled in zip(compiling, compile_group([entries[i][2] for i in compiling],
                                                    store_url)):
        steps, receipts, _ = entries[i]
        if isinstance(compiled, StageFailed):
            compiled.receipts = receipts
        else:
            receipts["compile"] = compile_receipt(compiled, dict(steps)["compile"])
        entries[i][2] = compiled
    try:
        return ChainGroup([_finish_chain(steps, receipts, value, store_url)
                           for steps, receipts, value in entries])
    finally:
        writes.flush()


def _finish_chain(steps: list[list[str]], receipts: dict[str, Any], value: Any,
                  store_url: str | None) -> Any:
    """A chain's result once its stages (and compile) ran: its load, if it has one."""
    if isinstance(value, StageFailed):
        return value
    load: dict[str, Any] | None = None
    nodes = dict(steps)
    if "load" in nodes:
        try:
            load = load_task(value)
        except StageFailed as e:
            e.receipts = receipts
            return e
        receipts["load"] = dict(load, node=nodes["load"])
    if "compile" not in nodes and load is None:
        return ChainResult(receipts, value)
    return ChainResult(receipts, compiled_of(value), load).by_store_reference(store_url)


def run_task(descriptor: dict[str, Any], compiled: Any, inputs: list[Any],
             pick: int | None = None) -> list[Any]:
    """Run a loaded fragment on this worker (loading it again if this process lost it);
    ``compiled`` is the held value (with ``pick``: the group whose chain ``pick`` it is)."""
    import numpy as np

    from accy.executable.fragment import load_fragment

    loaded, _ = load_fragment(compiled_of(held_value(compiled, pick)))
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
    """One variant's refresh: the reused prefix and the nodes of what runs."""

    request: VariantRequest
    semantic_fingerprint: str
    resolved: list[Resolved]
    task_keys: dict[str, tuple[str, str]]
    """Stage (``contract`` … ``target``, ``compile``, ``load``) → its node key
    ``("accy_<stage>", hex)``: the identity of that stage run in the graph."""
    compile_entry_key: str
    load_skipped: str | None = None
    fully_reused: bool = False
    resolution: dict[str, Any] = field(default_factory=dict)
    """The scheduler's answer for this variant: prefix, compile entry, variant record."""
    held: list[Any] = field(default_factory=list)
    """Futures this plan's graph depends on (held keys): kept alive."""
    submitted: list[str] = field(default_factory=list)
    """The stages (and compile, load) that got a node in the graph."""
    holders: dict[str, Any] = field(default_factory=dict)
    """Stage → the Dask key whose value holds its product (the chain task it ends, or
    that chain's group task); stages fused inside a chain have none (their products
    are in the store)."""
    picks: dict[str, int] = field(default_factory=dict)
    """Stage → its chain's place in the group task :attr:`holders` names (a stage
    whose chain ran alone has none)."""
    tail: Any = None
    """The future of the variant's last chain task (or its group): its value carries
    every receipt."""
    tail_pick: int | None = None
    """The last chain's place in the group :attr:`tail` holds (None: a task of its own)."""
    keep: list[Any] = field(default_factory=list)
    """Futures of this plan's chain tasks, held until the plan is published."""
    copied: set[str] = field(default_factory=set)
    """Stages its chain runs itself though another variant's chain runs them too."""

    def bind(self, futures: dict[Any, Any], graph: GraphBuilder) -> None:
        """Attach the futures of the submitted ``graph``."""
        self.copied = {s for s in self.submitted if self.task_keys[s] in graph.copied}
        for stage in self.submitted:
            holder, pick = graph.handle(graph.segment_of[self.task_keys[stage]])
            # a chain ending in compile or load holds the compiled fragment
            if self.task_keys[stage] in graph.ends or stage in ("compile", "load"):
                self.holders[stage] = holder
                if pick is not None:
                    self.picks[stage] = pick
            if futures.get(holder) is not None and all(f.key != holder for f in self.keep):
                self.keep.append(futures[holder])
        if self.submitted:
            holder, self.tail_pick = graph.handle(
                graph.segment_of[self.task_keys[self.submitted[-1]]])
            self.tail = futures[holder]

    def release(self) -> None:
        """Let go of this plan's futures (after its publish pinned what it keeps)."""
        self.tail = None
        self.keep = []
        self.held = []


@dataclass(frozen=True)
class InlineProgram:
    """A program as a literal argument of the tasks that start from it: its msgpack wire
    form, decoded once per worker process (:func:`program_of`).

    Not scattered data: a task that depends on data is placed where the data lives,
    and every task of a batch read the one scattered copy of its program — on the
    GPU machine the 15-worker batch kept its workers 34 % busy, the busiest at 82 %
    (RESULTS.md, batch, fourth session). A literal argument makes the chain a
    task without dependencies, which the scheduler spreads over the workers; a
    program is a few KB, sent once per task (chains of one program in one group
    task share the bytes: pickle writes a repeated object once), and nothing is
    lost with a worker.
    """

    fingerprint: str
    wire: bytes

    @staticmethod
    def of(module: SemanticModule) -> InlineProgram:
        return InlineProgram(module.fingerprint(), module.to_wire())


_PROGRAMS: collections.OrderedDict[tuple[str, bytes], SemanticModule] = \
    collections.OrderedDict()
_PROGRAMS_LOCK = threading.Lock()
PROGRAMS_KEPT = 64
"""Decoded programs a worker process keeps (least recently used dropped first)."""


def program_of(p: InlineProgram) -> SemanticModule:
    """The module of an inline program, decoded and checked against its fingerprint once
    per process; a program whose bytes do not match the fingerprint it claims is an
    error of the batch that sent it, never run.

    >>> from accy.preparation.products import SemanticModule
    >>> sm = SemanticModule.from_file("graphs/softmax.mlir")
    >>> p = InlineProgram.of(sm)
    >>> program_of(p).fingerprint() == sm.fingerprint(), program_of(p) is program_of(p)
    (True, True)
    """
    key = (p.fingerprint, p.wire)
    with _PROGRAMS_LOCK:
        hit = _PROGRAMS.get(key)
        if hit is not None:
            _PROGRAMS.move_to_end(key)
            return hit
    module = Product.from_wire(p.wire)
    if not isinstance(module, SemanticModule) or module.fingerprint() != p.fingerprint:
        raise AccyError(f"the program sent as {p.fingerprint[:12]} does not match its "
                        "fingerprint")
    with _PROGRAMS_LOCK:
        _PROGRAMS[key] = module
        while len(_PROGRAMS) > PROGRAMS_KEPT:
            _PROGRAMS.popitem(last=False)
    return module


def settle_for_a_worker(client: Any, settle: float, timeout: float) -> None:
    """After losing workers: wait ``settle`` seconds (the scheduler removes the dead),
    then until the cluster has a worker again (a nanny restarts it), at most
    ``timeout``; what is retried next fails with its own message if none came."""
    import contextlib

    time.sleep(settle)
    with contextlib.suppress(Exception):
        client.wait_for_workers(1, timeout=timeout)


NO_WORKERS_WAIT_S = 30
"""How long a batch waits for a cluster that has no worker at all (all lost, none
restarted), then ends with one error line instead of waiting on Dask without bound.
Dask config ``accy.no-workers-wait`` (seconds) overrides it."""


COPIED_READERS = 2
"""A stage run (contract … target) read by at most this many chains runs in each of them
rather than as a task of its own (:meth:`GraphBuilder.segments`). In the shared sweep
the kernel stage of a fast-math pair was a task of ~1 ms of work: 240 extra tasks and
transfers for 480 variants."""


MAX_COMPILE_GRAIN = 8
"""The most CUDA chains one batch task compiles together (Dask config
``accy.compile-grain``; 1: every chain alone). NVRTC's cost is largely per program: on
the 2-core development machine 24 distinct variants' units compiled 1.7–2.1× faster 8
or 12 to a program than one each (RESULTS.md, batch)."""


def compile_grain(variants: int, threads: int) -> int:
    """How many CUDA chains a batch groups into one task: up to
    :data:`MAX_COMPILE_GRAIN`, while every worker thread still gets two tasks.

    >>> compile_grain(480, 15), compile_grain(96, 2), compile_grain(10, 2), compile_grain(1, 1)
    (8, 8, 2, 1)
    """
    import dask.config

    limit = int(dask.config.get("accy.compile-grain", MAX_COMPILE_GRAIN))
    return max(1, min(limit, variants // max(1, 2 * threads)))


MAX_WHOLE_GROUP = 48
"""The most chains of whole likenesses (one program, target and options each: one
source, likely) a batch puts in one group task (:func:`whole_group`)."""


def whole_group(variants: int, threads: int) -> int:
    """The most chains of a batch's group task made of whole likenesses
    (:func:`compile_groups`): up to :data:`MAX_WHOLE_GROUP`, while every worker thread
    still gets two tasks' worth of chains. A likeness of no more chains than this is
    never split, so its source compiles once, on one worker, and several such go to
    one NVRTC program.

    In groups of the grain (8), the 16 row counts of each of 96 distinct variants' six
    programs were two groups a program, which on two workers often ran at once and each
    compiled the program; one group a program: 145.5 against 171 variants/s (2-core
    machine, 2 workers, six batches each, alternating); on one worker, three programs a
    group (two NVRTC programs a batch instead of six): 94.5 against 106.5 (RESULTS.md,
    batch, twenty-second session). A likeness of more chains than this stays in groups
    of the grain, spread through the order. A batch submitted in chunks (more than
    ``batch.CHUNKED_ABOVE`` variants) bounds each chunk by its own size (its first, of a
    group for every worker thread, keeps few whole); the chunks bring each program's
    prefixes together (``batch.submission_chunks``' kin), so a likeness is seldom split
    between two.

    >>> whole_group(96, 2), whole_group(96, 1), whole_group(480, 15), whole_group(10, 2)
    (24, 48, 16, 2)
    """
    return min(MAX_WHOLE_GROUP, variants // max(1, 2 * threads))


def no_workers_wait() -> float:
    """:data:`NO_WORKERS_WAIT_S`, or Dask config ``accy.no-workers-wait``."""
    import dask.config

    value = dask.config.get("accy.no-workers-wait", None)
    return float(value) if value is not None else float(NO_WORKERS_WAIT_S)


class ClusterLost(AccyError):
    """The cluster had no worker (or no scheduler) for ``NO_WORKERS_WAIT_S`` while a
    batch waited on it. ``partial`` (set by the batch command's progress wrapper)
    holds the variants that had finished, for a partial report."""

    partial: Any = None
    total: int = 0


def resolution_request(module: SemanticModule, request: VariantRequest,
                       templates: dict[str, int] | None = None) -> dict[str, Any]:
    """What the scheduler needs to resolve this variant's published prefix.

    With ``templates`` (a table this batch fills: template JSON → index), each
    stage's key template is sent once per batch and requests name it by index.
    """

    names = [s.name for s in preparation()] + ["compile"]
    tmpls: list[Any]
    if templates is None:
        tmpls = [request.template(n) for n in names]
    else:
        options = request.run_options()
        tmpls = [templates.setdefault(stage_template_json(n, options, request.shapes),
                                      len(templates)) for n in names]
    return {"semantic": module.fingerprint(), "variant": request.variant,
            "program": request.program, "target": request.target,
            "stages": tmpls[:-1], "compile": tmpls[-1]}


def compile_entry_key(target_key: str, options: RunOptions,
                      template: dict[str, Any] | None = None) -> str:
    """Where the published state keeps the compile of a target product (by its key)."""
    return derived_key("compile", target_key, options, template=template).hex


@dataclass
class _Node:
    stage: str
    request: dict[str, Any]
    store_url: str | None
    gpu: bool
    after: Any
    """The node key of its input in this graph, or None."""
    arg: Any = None
    """Its input when that is outside this graph: a held key's ref or a store reference."""
    program: Any = None
    """A compile node's :func:`~accy.executable.compile.shared_program`: chains whose
    compiles share one may run as one group task; None: never grouped."""
    dependents: set[Any] = field(default_factory=set)


class GraphBuilder:
    """Every stage run of a batch as a node; submitted as fused chain tasks in one graph.

    Nodes are keyed by their stage key (``("accy_<stage>", hex)``): identical
    stage runs across variants are one node. At :meth:`submit`, a node whose
    product only one other node reads is fused with that reader into one task
    (Dask's ``fuse_linear`` rule), so a chain of stage runs no other variant
    shares is one task, and a stage shared by several variants ends a task of
    its own that each of them depends on. A task is named after its first and
    last stage and keyed by its last node (``("accy_kernel-load", hex)``);
    each stage inside it is still stored, reused and published by its own
    stage key. Tasks that must run on GPU workers go in a layer annotated
    with ``resources={"GPU": 1}``.
    """

    def __init__(self) -> None:
        self.nodes: dict[Any, _Node] = {}
        self.segment_of: dict[Any, Any] = {}
        self.ends: set[Any] = set()
        self.copied: set[Any] = set()
        self.pick_of: dict[Any, tuple[Any, int]] = {}
        """A chain run in a group task → (the group's key, its place in the group)."""

    def node(self, key: tuple[str, str], stage: str, prev: Any, request: dict[str, Any],
             store_url: str | None, gpu: bool = False, program: Any = None) -> tuple[str, str]:
        """Add a stage run reading ``prev`` (a node key from this builder, or an outside
        input: :meth:`ref` of a held key, or a store reference); a compile node names the
        ``program`` its compile may share (:func:`~accy.executable.compile.shared_program`)."""
        if key not in self.nodes:
            inside = isinstance(prev, tuple) and len(prev) == 2 and prev in self.nodes
            self.nodes[key] = _Node(stage, request, store_url, gpu, prev if inside else None,
                                    None if inside else prev, program)
            if inside:
                self.nodes[prev].dependents.add(key)
        return key

    @staticmethod
    def ref(key: Any, pick: int | None = None) -> Any:
        """A task argument reading the value held under ``key`` — with ``pick``, chain
        ``pick`` of the group held there, picked inside the reading task (an inline
        :func:`chain_pick_task`: no task of its own)."""
        from dask.task_spec import Task, TaskRef

        if pick is None:
            return TaskRef(key)
        return Task(None, chain_pick_task, TaskRef(key), int(pick))

    def handle(self, seg: Any) -> tuple[Any, int | None]:
        """Where a chain's value is held once submitted: its own key, or its group's key
        and its place in the group (:attr:`pick_of`)."""
        return self.pick_of.get(seg, (seg, None))

    def segments(self, fuse_gpu: bool) -> list[list[Any]]:
        """The chains: a node joins its input's chain when it is that input's only reader
        (and, unless ``fuse_gpu``, needs the same kind of worker). A stage run that only
        :data:`COPIED_READERS` chains read and that would be a task of its own is run in
        each of them instead (:attr:`copied`): a task round trip and a transfer cost
        more than the stage (about a millisecond), and the second run finds the
        first's product in the store (early cutoff) when there is one."""
        self.copied = {k for k, n in self.nodes.items() if self._copied(n, fuse_gpu)}

        def copies(k: Any) -> list[Any]:  # the copied runs a chain starts with
            if k not in self.copied:
                return []
            return copies(self.nodes[k].after) + [k]

        chains: list[list[Any]] = []
        where: dict[Any, int] = {}
        for key, n in self.nodes.items():  # insertion order: inputs come first
            if key in self.copied:
                continue
            p = self.nodes.get(n.after) if n.after is not None else None
            if n.after in self.copied:
                i = len(chains)
                chains.append(copies(n.after) + [key])
            elif p is not None and len(p.dependents) == 1 and (fuse_gpu or p.gpu == n.gpu):
                i = where[n.after]
                chains[i].append(key)
            else:
                i = len(chains)
                chains.append([key])
            where[key] = i
        return chains

    def _copied(self, n: _Node, fuse_gpu: bool) -> bool:
        if not 2 <= len(n.dependents) <= COPIED_READERS or n.stage not in PREPARATION_NAMES:
            return False
        p = self.nodes.get(n.after) if n.after is not None else None
        if p is not None and len(p.dependents) == 1 and (fuse_gpu or p.gpu == n.gpu):
            return False  # it ends its input's chain: copying would copy that chain
        return all(fuse_gpu or self.nodes[d].gpu == n.gpu for d in n.dependents)

    def submit(self, client: Any, fuse_gpu: bool = True, grain: int = 1, whole: int = 0,
               spread: dict[bool, list[str]] | None = None,
               restrict_gpu: bool = True) -> dict[Any, Any]:
        """Send the graph; return the future of every task that holds a chain's value,
        by its key.

        ``restrict_gpu=False`` (every worker is a GPU worker) leaves the GPU tasks
        unrestricted: a task with a resource restriction is never queued on the
        scheduler (Dask's ``is_rootish``), so each was placed on a worker the moment
        it arrived, by count; on the H200 every one of 15 workers got 5 of a batch's
        75 groups and they finished 0.17-0.28 s apart. In a graph where no task reads
        another (distinct variants), every task is marked a data producer, so the
        scheduler queues it however few its task group holds and hands it to the next
        worker with a free slot (``worker-saturation``), as a process pool's workers
        take the next item. Where tasks read others (a shared prefix), the readers are
        never queued and would keep the workers' slots while the prefixes they wait
        for sat in the queue; that graph is left to Dask's own root-task rule.

        With ``grain`` > 1, chains that compile CUDA fragments run ``grain`` at a time
        in one task (:func:`chain_group_task`: their compiles in one NVRTC program);
        alike chains (one source, likely) no more than ``whole`` are never split, and
        several such share a task of at most ``whole`` chains (:func:`compile_groups`,
        :func:`whole_group`). A chain in a group has no task of its own: its value is
        its entry of the group's (:attr:`pick_of`; whoever reads it picks it inside its
        own task, :meth:`ref`), and its stages stay keyed, stored and published by
        their stage keys. A pick task per chain cost a scheduler round trip each: on the
        2-core machine 96 of a 108-task batch, and 0.25 s of picks after the last
        group ended (RESULTS.md, batch, tenth session).

        ``spread`` (GPU or not → worker addresses) places the tasks that read another
        task's result round-robin over those workers (``workers=`` with
        ``allow_other_workers``). Dask puts a task where its inputs are, so the 24
        variants of a shared prefix all queued on the prefix's worker and waited for
        work stealing (the shared sweep at 0.58× the pool at 15 workers on the H200,
        the distinct one at 0.98×); a prefix's product is a few KB to fetch.
        """
        from dask.highlevelgraph import HighLevelGraph
        from dask.task_spec import Task

        if not self.nodes:
            return {}
        chains: list[tuple[Any, list[list[str]], _Node, bool]] = []
        groupable: dict[tuple[bool, Any], list[tuple[Any, list[list[str]], Any, _Node]]] = {}
        for chain in self.segments(fuse_gpu):
            first, last = self.nodes[chain[0]], self.nodes[chain[-1]]
            name = f"{TASK_PREFIX}{first.stage}" + (f"-{last.stage}" if len(chain) > 1 else "")
            seg = (name, chain[-1][1])
            for k in chain:
                self.segment_of[k] = seg
            self.ends.add(chain[-1])
            steps = [[self.nodes[k].stage, k[1]] for k in chain]
            on_gpu = any(self.nodes[k].gpu for k in chain)
            program = next((self.nodes[k].program for k in chain
                            if self.nodes[k].program is not None), None)
            chains.append((seg, steps, first, on_gpu))
            if grain > 1 and program is not None:
                groupable.setdefault((on_gpu, program), []).append((seg, steps, None, first))
        groups: list[tuple[Any, bool, list[Any]]] = []
        for (on_gpu, _), members in groupable.items():  # chains whose compiles share a program
            for group in compile_groups(members, grain, lambda c: _likeness(c[3].request),
                                        whole):
                if len(group) == 1:
                    continue
                # keyed by its members, in order: another batch (a second client) that
                # groups other chains must never read this group for one of its own
                members_id = hashlib.blake2b("/".join(seg[1] for seg, *_ in group)
                                             .encode(), digest_size=16).hexdigest()
                gkey = (f"{TASK_PREFIX}group-{group[0][0][0][len(TASK_PREFIX):]}",
                        members_id)
                for i, (seg, *_) in enumerate(group):
                    self.pick_of[seg] = (gkey, i)
                groups.append((gkey, on_gpu, [seg for seg, *_ in group]))
        cpu: dict[Any, Any] = {}
        gpu: dict[Any, Any] = {}
        built: dict[Any, tuple[list[Any], Any, _Node]] = {}
        for seg, steps, first, on_gpu in chains:  # every chain's input, by then known
            arg = self.ref(*self.handle(self.segment_of[first.after])) \
                if first.after is not None else first.arg
            if seg in self.pick_of:
                built[seg] = (steps, arg, first)
                continue
            (gpu if on_gpu else cpu)[seg] = Task(seg, chain_task, steps, arg, first.request,
                                                 first.store_url)
        for gkey, on_gpu, members in groups:
            parts = [built[seg] for seg in members]
            (gpu if on_gpu else cpu)[gkey] = Task(
                gkey, chain_group_task, [[steps, first.request] for steps, _, first in parts],
                parts[0][2].store_url, *[arg for _, arg, _ in parts])
        holders = {self.handle(seg)[0] for seg in self.segment_of.values()}
        keys = [k for k in list(cpu) + list(gpu) if k in holders]
        if not any(t.dependencies for t in (*cpu.values(), *gpu.values())):
            cpu, gpu = _producers(cpu), _producers(gpu)
        layers = _placed_layers(cpu, gpu, spread or {}, restrict_gpu)
        futures = client.get(HighLevelGraph(layers, {name: set() for name in layers}), keys,
                             sync=False)
        return dict(zip(keys, futures))


def _likeness(request: dict[str, Any]) -> tuple[str, ...]:
    """What chains that render one source have in common: the program, target and
    options (their shapes may differ in what the kernels take as launch scalars)."""
    return (str(request.get("program")), str(request.get("target")),
            json.dumps(request.get("options"), sort_keys=True, default=str))


def compile_groups(chains: list[Any], grain: int, likeness: Any, whole: int = 0) \
        -> list[list[Any]]:
    """``chains`` in groups for one compile task each. Chains alike (``likeness``: likely
    one source, so one compiled unit for a group of them) and more than ``whole`` fill
    groups of ``grain`` of their own, and the groups of one likeness are spread through
    the order (a later one then tends to find its binary remembered,
    :func:`~accy.executable.compile.reused_binary`, rather than compile beside the
    first); what they leave over shares groups of ``grain`` in its order. A likeness of
    at most ``whole`` chains (:func:`whole_group`) stays whole: such likenesses share
    groups of at most ``whole`` chains and ``grain`` likenesses, in their order, so each
    source compiles once, on one worker, and one NVRTC program holds several.

    >>> compile_groups(["a1", "b1", "a2", "b2", "a3", "a4", "a5", "c1"], 2, lambda c: c[0])
    [['a1', 'a2'], ['b1', 'b2'], ['a3', 'a4'], ['a5', 'c1']]
    >>> compile_groups(["a1", "b1", "a2", "b2", "a3", "a4", "c1"], 2, lambda c: c[0], 4)
    [['a1', 'a2', 'a3', 'a4'], ['b1', 'b2', 'c1']]
    >>> compile_groups(["a1", "b1", "a2", "b2", "c1", "c2"], 2, lambda c: c[0], 6)
    [['a1', 'a2', 'b1', 'b2'], ['c1', 'c2']]
    """
    alike: dict[Any, list[Any]] = {}
    for c in chains:
        alike.setdefault(likeness(c), []).append(c)
    big = [members for members in alike.values() if len(members) > whole]
    runs = [[members[at:at + grain] for at in range(0, len(members) - grain + 1, grain)]
            for members in big]
    rest = [c for members in big for c in members[len(members) // grain * grain:]]
    packed: list[list[Any]] = []
    kinds = 0
    for members in (m for m in alike.values() if len(m) <= whole):
        if not packed or len(packed[-1]) + len(members) > whole or kinds >= grain:
            packed.append([])
            kinds = 0
        packed[-1].extend(members)
        kinds += 1
    return [run[i] for i in range(max((len(r) for r in runs), default=0))
            for run in runs if i < len(run)] + packed + \
        [rest[at:at + grain] for at in range(0, len(rest), grain)]


def _producers(tasks: dict[Any, Any]) -> dict[Any, Any]:
    """``tasks`` (none reading another) marked data producers: the scheduler queues
    them (see :meth:`GraphBuilder.submit`)."""
    from dask.task_spec import Task

    return {k: Task(t.key, t.func, *t.args, _data_producer=True) for k, t in tasks.items()}


def _placed_layers(cpu: dict[Any, Any], gpu: dict[Any, Any],
                   spread: dict[bool, list[str]], restrict_gpu: bool = True) -> dict[str, Any]:
    """The graph's layers: CPU and GPU (``resources={"GPU": 1}`` unless
    ``restrict_gpu`` is off) tasks; those that read another task's result in a layer
    per worker of ``spread`` (round-robin, see :meth:`GraphBuilder.submit`)."""
    from dask.highlevelgraph import MaterializedLayer

    layers: dict[str, Any] = {}
    for on_gpu, tasks in ((False, cpu), (True, gpu)):
        base = {"resources": {"GPU": 1}} if on_gpu and restrict_gpu else {}
        targets = spread.get(on_gpu) or []
        where: dict[str, dict[Any, Any]] = {}  # the worker named ("": Dask's choice)
        turn = 0
        for key, task in tasks.items():
            worker = ""
            if targets and task.dependencies:
                worker, turn = targets[turn % len(targets)], turn + 1
            where.setdefault(worker, {})[key] = task
        for worker, ts in where.items():
            annotations = dict(base, **({"workers": [worker],
                                         "allow_other_workers": True} if worker else {}))
            name = f"accy-{'gpu' if on_gpu else 'stages'}" + (f"@{worker}" if worker else "")
            layers[name] = MaterializedLayer(ts, annotations=annotations or None)
    return layers


def plan_refresh(client: Any, module: SemanticModule, request: VariantRequest,
                 resolution: dict[str, Any], store_url: str | None, gpu_workers: bool,
                 graph: GraphBuilder,
                 programs: dict[str, InlineProgram] | None = None) -> RefreshPlan:
    """Short-circuit the resolved prefix and add the remaining stage runs to ``graph``.

    ``resolution`` is this variant's answer from
    :func:`accy.distributed.resolve.resolve` (run by the scheduler plugin);
    ``programs`` caches each program's :class:`InlineProgram` across one batch (its
    chains then share one bytes object). Call
    :meth:`RefreshPlan.bind` with the futures once the graph is submitted.
    """
    from distributed import Future

    from accy.executable.compile import shared_program

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
    chain = fp  # what the next key derives from: a fingerprint, then node keys
    if resolved:
        last = resolved[-1]
        tk = tuple(last.entry.get("task_key") or ())
        if last.entry.get("pinned") and len(tk) == 2:
            held.append(Future(tk, client=client))  # the held key: no task for the prefix
            prev = graph.ref(tk, last.entry.get("pick"))
        else:  # released: the next task reads it from the store (or fails: not stored)
            prev = ("store", last.key, last.entry.get("fields") or {"stage": last.stage})
    else:
        cache = programs if programs is not None else {}
        prev = cache.get(module.fingerprint())
        if prev is None:
            prev = cache[module.fingerprint()] = InlineProgram.of(module)
    for s in preparation()[len(resolved):]:
        # the first node's input is known by content; each later one's by the node before
        t = request.template(s.name)
        dk = (derived_key(s.name, chain, options, shapes, t) if task_keys
              else content_key(s.name, chain, options, shapes, t)).hex
        prev = graph.node((f"{TASK_PREFIX}{s.name}", dk), s.name, prev, rd, store_url)
        task_keys[s.name] = prev
        chain = dk

    backend = options.target.backend
    on_gpu = backend.needs_gpu and gpu_workers
    all_resolved = len(resolved) == len(PREPARATION_NAMES)
    target_key = resolved[-1].key if all_resolved else task_keys["target"][1]
    entry_key = compile_entry_key(target_key, options, request.template("compile"))
    centry = resolution.get("compile") if all_resolved else None
    descriptor = (resolution.get("variant") or {}).get("fragment") or {}
    load_skipped = "no GPU" if backend.needs_gpu and not gpu_workers else None
    if (all_resolved and centry and centry.get("pinned")
            and (load_skipped or (descriptor.get("key") == centry.get("key")
                                  and resolution.get("worker_alive")))):
        return RefreshPlan(request, module.fingerprint(), resolved, {}, entry_key,
                           load_skipped, fully_reused=True, resolution=resolution)
    submitted = list(task_keys)
    if centry and centry.get("pinned"):
        ckey = tuple(centry["task_key"])
        held.append(Future(ckey, client=client))
        cprev: Any = graph.ref(ckey, centry.get("pick"))
    else:
        ckey = (f"{TASK_PREFIX}compile", entry_key)
        cprev = graph.node(ckey, "compile", prev, rd, store_url, gpu=on_gpu,
                           program=shared_program(backend, options.target_options.fast_math))
        submitted.append("compile")
    task_keys["compile"] = ckey  # type: ignore[assignment]
    if load_skipped is None:
        lkey = (f"{TASK_PREFIX}load",
                derived_key("load", ckey[1], options, template=request.template("load")).hex)
        graph.node(lkey, "load", cprev, rd, store_url, gpu=on_gpu)
        task_keys["load"] = lkey
        submitted.append("load")
    plan = RefreshPlan(request, module.fingerprint(), resolved, task_keys,
                       entry_key, load_skipped, resolution=resolution)
    plan.held = held
    plan.submitted = submitted
    return plan


def resolve_many(client: Any, requests: list[dict[str, Any]],
                 templates: dict[str, int] | None = None) -> dict[str, Any]:
    """The scheduler's resolution of every request, in one round trip.

    The answer names each published entry and variant record once (a batch of
    variants sharing a prefix shares its entries); this expands it back into
    one resolution per request whose dicts are shared, not copied.
    """
    import json

    table = None
    if templates is not None:
        table = [json.loads(t) for t, _ in sorted(templates.items(), key=lambda kv: kv[1])]
    from accy.distributed.plugin import pack_message, unpack_message

    answer = client.sync(client.scheduler.accy_resolve, packed=pack_message([requests, table]))
    answer = dict(unpack_message(answer["packed"]))
    entries = answer.pop("entries", None)
    if entries is None:  # an answer in the expanded form
        return answer
    records = answer.pop("records", {})
    results = []
    for r in answer["results"]:
        results.append({
            "resolved": [{"stage": e["stage"], "key": k, "entry": e}
                         for k in r["resolved"] for e in (entries[k],)],
            "compile": entries.get(r["compile"]) if r.get("compile") else None,
            "variant": records.get(r["variant"]) if r.get("variant") else None,
            "nearest": records.get(r["nearest"]) if r.get("nearest") else None,
            "worker_alive": r.get("worker_alive", False)})
    answer["results"] = results
    return answer
