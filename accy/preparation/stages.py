"""What a stage run takes and gives (the seed's ``execution.zig``).

A :class:`PreparationRequest` is one variant's refresh (options, shapes,
limits, names); a :class:`StageResult` is one stage run: the product, elapsed
ns, pass statistics, its key and, for dispatch, memory and kernel, a plan
fingerprint (display only: no key or reuse decision reads it). The runs
themselves are the stage table's (:meth:`accy.pipeline.Stage.run`).

Example
-------
>>> from accy.pipeline import prepare_through
>>> from accy.preparation.options import RunOptions
>>> from accy.preparation.products import SemanticModule
>>> sm = SemanticModule.from_file("graphs/softmax.mlir")
>>> r = prepare_through(sm, "dispatch", RunOptions(), {0: (8, 4096)})
>>> r.product.stage, r.plan_fingerprint is not None
('dispatch', True)
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgpack

from accy.choir.passes import WorkLimits
from accy.choir.wire import canonical_bytes
from accy.errors import WireFormatError
from accy.preparation.keys import StageKey
from accy.preparation.options import RunOptions
from accy.preparation.products import Product


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
        product = self.product.to_wire()  # first: it fingerprints on the same walk
        meta = {"stage": self.stage, "key": self.key.hex, "fields": self.key.fields,
                "elapsed_ns": self.elapsed_ns, "pass_stats": self.pass_stats,
                "pass_ns": self.pass_ns, "plan_fingerprint": self.plan_fingerprint,
                "origin": self.origin, "fingerprint": self.product.fingerprint()}
        return msgpack.packb([b"accy-stage-result", meta, product], use_bin_type=True)

    @staticmethod
    def from_wire(data: bytes, on_broken: Callable[[], None] | None = None) -> StageResult:
        """The result ``to_wire`` wrote. With ``on_broken`` the product's module stays
        undecoded until it is used (:meth:`Product.from_wire`; ``on_broken`` is called
        if it then fails), when the entry states its product's fingerprint."""
        try:
            tag, meta, product = msgpack.unpackb(bytes(data), raw=False, strict_map_key=True)
            if tag != b"accy-stage-result":
                raise ValueError("tag")
            fp = meta.get("fingerprint")
            later = (fp, on_broken) if on_broken is not None and isinstance(fp, str) else None
            return StageResult(meta["stage"], StageKey(meta["key"], meta["fields"]),
                               Product.from_wire(product, later), int(meta["elapsed_ns"]),
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
    prefix = f"{stage}."
    for op in product.module.walk():
        plan = {k: v for k, v in op.attributes.items() if k.startswith(prefix)}
        if op.op_name.startswith(prefix) or plan:
            h.update(op.op_name.encode())
            probe = Operation.create("plan.attrs", (), (), plan or op.attributes)
            h.update(canonical_bytes(probe))
            if stage == "dispatch" and op.regions:
                h.update(",".join(o.op_name for o in op.walk()).encode())
    return h.hexdigest()


__all__ = ["PreparationRequest", "StageResult", "plan_fingerprint"]
