"""The recipe: which passes make up each stage's pipeline, configured from options.

One function per stage, named after it, returns the stage's pipeline — a
tuple of passes whose fields come from the run options (and, for contract,
the variant's shape bindings). This is the one place to read to know what a
stage does, in order. Each function imports only its own stage's passes: a
stage's version (:mod:`accy.preparation.keys`) follows the imports of its
function here, so an edit to the kernel passes changes no earlier stage's key.

Example
-------
>>> from accy.preparation.options import RunOptions
>>> [p.name for p in configure("contract", RunOptions(), {})]
['inline-calls', 'specialize-shapes', 'simplify', 'fold-constants', 'simplify', 'cse', 'dce']
"""

from __future__ import annotations

from collections.abc import Mapping
from types import FunctionType

from accy.choir.passes import Pass
from accy.preparation.options import RunOptions

Shapes = Mapping[int, tuple[int, ...]]


def contract(options: RunOptions, shapes: Shapes) -> tuple[Pass, ...]:
    from accy.preparation.passes import contract as c

    o = options.contract
    passes: list[Pass] = [
        # func.call becomes the callee's body: the later stages compile the entry only
        c.InlineCalls(),
        # bind the variant's shapes and re-infer every type (shape/dtype checking)
        c.SpecializeShapes(tuple(sorted((i, tuple(s)) for i, s in shapes.items()))),
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


def tensor(options: RunOptions, shapes: Shapes) -> tuple[Pass, ...]:
    from accy.preparation.passes import contract as c
    from accy.preparation.passes import tensor as t

    return (
        t.RequireStaticShapes(),            # compiling needs every ? bound
        t.DecomposeComposites(),            # softmax, layernorm, rmsnorm, gelu, mean
        t.SuccessiveReductions(),           # innermost axis first where a sibling reduces it
        t.SplitReductions(options.tensor.split_reductions
                          and options.target.backend.thread_blocks),  # fill the GPU
        t.InnermostReductions(options.tensor.innermost_reductions),
        t.EpiloguesBeforeReshapes(),        # the mean's scale: the reduction's epilogue
        t.LowerToPrim(),                    # explicit broadcasts, prim ops
        t.CastsInsideTransposes(),          # transposes outside a half reduction's casts
        c.CSE(),
        c.DCE(),
    )


def dispatch(options: RunOptions, shapes: Shapes) -> tuple[Pass, ...]:
    from accy.preparation.passes import dispatch as d

    o = options.dispatch
    return (
        d.FormDispatchRegions(o.fuse, o.max_region_ops,   # one region = one launch
                              o.fuse_attention),          # softmax(q·kᵀ·c)·v: one flash
        d.MaterializeResults(),                           # each result its own buffer
    )


def memory(options: RunOptions, shapes: Shapes) -> tuple[Pass, ...]:
    from accy.preparation.passes import memory as m

    o = options.memory
    return (m.PlanBuffers(o.reuse, o.inplace, o.alignment),)


def kernel(options: RunOptions, shapes: Shapes) -> tuple[Pass, ...]:
    from accy.preparation.passes import kernel as k

    o = options.kernel
    return (k.PlanKernels(options.target.backend.thread_blocks, o.block_size, o.vector_width,
                          o.rows_per_block, o.tile_m, o.tile_n, o.tile_k, o.tensor_cores,
                          (o.mma_tile_m, o.mma_tile_n, o.mma_tile_k), o.stages,
                          options.target.backend.sm_number,
                          wgmma=o.wgmma and options.target.backend.wgmma,
                          wgmma_tile=(o.wgmma_tile_m, o.wgmma_tile_n),
                          wgmma_stages=o.wgmma_stages, wgmma_raster=o.wgmma_raster,
                          ffma_tiles=o.ffma_tiles,
                          ffma_tile=(o.ffma_tile_m, o.ffma_tile_n, o.ffma_tile_k),
                          ffma_unroll=o.ffma_unroll, column_split=o.column_split,
                          column_vector=o.column_vector, column_streams=o.column_streams,
                          prefetch=o.prefetch,
                          max_registers=o.max_registers,
                          attention_tile=(o.attention_tile_m, o.attention_tile_n,
                                          o.attention_threads),
                          attention_prefetch=o.attention_prefetch,
                          max_dynamic_shared=options.target.backend.max_dynamic_shared_bytes),)


def target(options: RunOptions, shapes: Shapes) -> tuple[Pass, ...]:
    from accy.preparation.passes import target as tg

    return (
        tg.CheckTargetSupport(str(options.target)),
        tg.EmitSource(str(options.target), options.target_options.fast_math),
    )


def configure(stage: str, options: RunOptions, shapes: Shapes | None = None) \
        -> tuple[Pass, ...]:
    """The pipeline of ``stage`` for these options."""
    recipe = globals().get(stage)
    if not isinstance(recipe, FunctionType) or recipe.__module__ != __name__ \
            or stage == "configure":
        raise ValueError(f"unknown stage {stage!r}")
    passes: tuple[Pass, ...] = recipe(options, shapes or {})
    return passes
