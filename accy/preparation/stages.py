"""The six stage runs (the seed's ``execution.zig``).

Each run verifies its input, clones it, runs the stage's pipeline (from
:mod:`accy.preparation.recipe`) under a :class:`~accy.choir.passes.PassManager`
with timing, statistics, work limits and reproducer capture, and returns a
:class:`StageResult`: the product, elapsed ns, pass statistics, its key and,
for dispatch, memory and kernel, a plan fingerprint (display only: no key or
reuse decision reads it).

Example
-------
>>> from accy.preparation.products import SemanticModule
>>> sm = SemanticModule.from_file("graphs/softmax.mlir")  # doctest: +SKIP
>>> r = prepare_through(sm, "dispatch", RunOptions(), {0: (8, 4096)})  # doctest: +SKIP
>>> r.product.stage, r.plan_fingerprint is not None  # doctest: +SKIP
('dispatch', True)
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgpack

from accy.choir.passes import PassContext, PassManager, WorkLimits
from accy.choir.wire import canonical_bytes
from accy.errors import WireFormatError
from accy.preparation import recipe
from accy.preparation.keys import StageKey, make_key, stage_key
from accy.preparation.options import STAGES, RunOptions
from accy.preparation.products import (
    ContractJob,
    DispatchJob,
    KernelJob,
    MemoryJob,
    Product,
    SemanticModule,
    TargetJob,
    TensorJob,
)

PRODUCT_OF = {"contract": ContractJob, "tensor": TensorJob, "dispatch": DispatchJob,
              "memory": MemoryJob, "kernel": KernelJob, "target": TargetJob}
INPUT_OF = {"contract": SemanticModule, "tensor": ContractJob, "dispatch": TensorJob,
            "memory": DispatchJob, "kernel": MemoryJob, "target": KernelJob}
PLAN_STAGES = ("dispatch", "memory", "kernel")


@dataclass(frozen=True)
class PreparationRequest:
    """What one refresh of one program variant asks for."""

    source: str = "<program>"
    """The program's name (file path) for receipts and reproducers."""
    variant: str = ""
    """The variant id (e.g. ``softmax[target=host,arg0=8x4096]``)."""
    options: RunOptions = field(default_factory=RunOptions)
    shapes: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    limits: WorkLimits = field(default_factory=WorkLimits)
    record_bytes: int = 1 << 20
    """Cap on the IR a receipt or reproducer may hold."""


@dataclass
class StageResult:
    """One stage run: its product, timing, statistics, key and plan fingerprint."""

    stage: str
    key: StageKey
    product: Product
    elapsed_ns: int
    pass_stats: dict[str, dict[str, int]]
    pass_ns: dict[str, int]
    plan_fingerprint: str | None = None
    origin: str | None = None
    """Set when the result was not computed by this run: ``store`` (read back from the
    artifact store by content key — early cutoff or a warm start)."""

    def to_wire(self) -> bytes:
        meta = {"stage": self.stage, "key": self.key.hex, "fields": self.key.fields,
                "elapsed_ns": self.elapsed_ns, "pass_stats": self.pass_stats,
                "pass_ns": self.pass_ns, "plan_fingerprint": self.plan_fingerprint,
                "origin": self.origin}
        return msgpack.packb([b"accy-stage-result", meta, self.product.to_wire()],
                             use_bin_type=True)

    @staticmethod
    def from_wire(data: bytes) -> StageResult:
        try:
            tag, meta, product = msgpack.unpackb(bytes(data), raw=False, strict_map_key=True)
            if tag != b"accy-stage-result":
                raise ValueError("tag")
            return StageResult(meta["stage"], StageKey(meta["key"], meta["fields"]),
                               Product.from_wire(product), int(meta["elapsed_ns"]),
                               meta["pass_stats"], meta["pass_ns"], meta["plan_fingerprint"],
                               meta.get("origin"))
        except WireFormatError:
            raise
        except Exception as e:
            raise WireFormatError(f"malformed stage result: {type(e).__name__}") from None

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise TypeError("StageResult never pickles: it travels as msgpack")


def plan_fingerprint(stage: str, product: Product) -> str:
    """64-bit hex summary of the plans a stage made, for display only.

    Dispatch: each region's kind, iteration space and the ops it holds;
    memory: the buffer plan attributes; kernel: each kernel's mapping.
    """
    from accy.choir.ir import Operation

    h = hashlib.blake2b(digest_size=8)
    h.update(stage.encode())
    prefix = {"dispatch": "dispatch.", "memory": "memory.", "kernel": "kernel."}[stage]
    for op in product.module.walk():
        plan = {k: v for k, v in op.attributes.items() if k.startswith(prefix)}
        if op.op_name.startswith(prefix) or plan:
            h.update(op.op_name.encode())
            probe = Operation.create("plan.attrs", (), (), plan or op.attributes)
            h.update(canonical_bytes(probe))
            if stage == "dispatch" and op.regions:
                h.update(",".join(o.op_name for o in op.walk()).encode())
    return h.hexdigest()


def run_stage(stage: str, prev: Product, request: PreparationRequest,
              key: StageKey | None = None) -> StageResult:
    """Run one stage on its input product; raise ``PassFailedError`` on failure."""
    expected = INPUT_OF[stage]
    if not isinstance(prev, expected):
        raise TypeError(f"the {stage} stage takes a {expected.__name__}, got "
                        f"{type(prev).__name__}")
    prev.verify()
    if key is None:
        key = stage_key(stage, prev.fingerprint(), request.options, request.shapes)
    module = prev.clone_module()
    passes = recipe.configure(stage, request.options, request.shapes)
    pm = PassManager(recipe.PIPELINE_NAMES[stage], passes, limits=request.limits,
                     record_bytes=request.record_bytes)
    ctx = PassContext()
    t0 = time.perf_counter_ns()
    result = pm.run(module, ctx)
    elapsed = time.perf_counter_ns() - t0
    meta = {"source": request.source, "variant": request.variant}
    product = PRODUCT_OF[stage](module, meta)
    plan = plan_fingerprint(stage, product) if stage in PLAN_STAGES else None
    return StageResult(stage, key, product, elapsed, result.stats, result.pass_ns, plan)


def prepare_contract_job(sm: SemanticModule, options: RunOptions,
                         shapes: Mapping[int, tuple[int, ...]]) -> StageResult:
    return run_stage("contract", sm, PreparationRequest(options=options, shapes=dict(shapes)))


def prepare_through(sm: SemanticModule, stage: str, options: RunOptions,
                    shapes: Mapping[int, tuple[int, ...]],
                    request: PreparationRequest | None = None) -> StageResult:
    """Run every stage from contract through ``stage``; return the last result."""
    req = request or PreparationRequest(source=sm.meta.get("source", "<program>"),
                                        options=options, shapes=dict(shapes))
    product: Product = sm
    result: StageResult | None = None
    for s in STAGES:
        result = run_stage(s, product, req)
        product = result.product
        if s == stage:
            break
    assert result is not None
    return result


__all__ = ["PreparationRequest", "StageResult", "run_stage", "prepare_through",
           "prepare_contract_job", "plan_fingerprint", "make_key", "PRODUCT_OF"]
