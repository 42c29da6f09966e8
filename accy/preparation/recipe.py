"""The recipe: which passes make up each stage's pipeline, configured from options.

Each stage's pipeline is a tuple of passes whose fields come from the run
options (and, for contract, the variant's shape bindings). This is the one
place to read to know what a stage does, in order.

Example
-------
>>> from accy.preparation.options import RunOptions
>>> [p.name for p in configure("contract", RunOptions(), {})]
['inline-calls', 'specialize-shapes', 'simplify', 'fold-constants', 'simplify', 'cse', 'dce']
"""

from __future__ import annotations

from collections.abc import Mapping

from accy.choir.passes import Pass
from accy.preparation.options import RunOptions

PIPELINE_NAMES = {s: s for s in ("contract", "tensor", "dispatch", "memory", "kernel", "target")}


def configure(stage: str, options: RunOptions,
              shapes: Mapping[int, tuple[int, ...]] | None = None) -> tuple[Pass, ...]:
    """The pipeline of ``stage`` for these options."""
    if stage == "contract":
        from accy.preparation.passes import contract as c

        o = options.contract
        passes: list[Pass] = [
            # func.call becomes the callee's body: the later stages compile the entry only
            c.InlineCalls(),
            # bind the variant's shapes and re-infer every type (shape/dtype checking)
            c.SpecializeShapes(tuple(sorted((i, tuple(s)) for i, s in (shapes or {}).items()))),
            # algebraic identities (x+0, reshape∘reshape, …)
            c.Simplify(),
        ]
        if o.fold_constants:
            passes.append(c.FoldConstants(o.max_fold_elements))
            passes.append(c.Simplify())  # identities that folding uncovered
        if o.cse:
            passes.append(c.CSE())
        passes.append(c.DCE())
        return tuple(passes)
    if stage == "tensor":
        from accy.preparation.passes import contract as c
        from accy.preparation.passes import tensor as t

        return (
            t.RequireStaticShapes(),            # compiling needs every ? bound
            t.DecomposeComposites(),            # softmax, layernorm, rmsnorm, gelu, mean
            t.InnermostReductions(options.tensor.innermost_reductions),
            t.LowerToPrim(),                    # explicit broadcasts, prim ops
            c.CSE(),
            c.DCE(),
        )
    if stage == "dispatch":
        from accy.preparation.passes import dispatch as d

        o = options.dispatch
        return (
            d.FormDispatchRegions(o.fuse, o.max_region_ops),  # one region = one launch
            d.MaterializeResults(),                           # each result its own buffer
        )
    if stage == "memory":
        from accy.preparation.passes import memory as m

        o = options.memory
        return (m.PlanBuffers(o.reuse, o.inplace, o.alignment),)
    if stage == "kernel":
        from accy.preparation.passes import kernel as k

        o = options.kernel
        return (k.PlanKernels(options.target.kind, o.block_size, o.vector_width,
                              o.rows_per_block, o.tile_m, o.tile_n, o.tile_k),)
    if stage == "target":
        from accy.preparation.passes import target as tg

        return (
            tg.CheckTargetSupport(str(options.target)),
            tg.EmitSource(str(options.target), options.target_options.fast_math),
        )
    raise ValueError(f"unknown stage {stage!r}")
