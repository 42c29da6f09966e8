"""Kernel stage: plan-kernels (thread mapping, vector width, block/grid, tiles).

Inputs come from the real pipelines (contract … kernel) on small programs and
``graphs/*.mlir``; checks read the ``kernel.func`` plans and the printed IR.
"""

from __future__ import annotations

import math

import pytest
from stage_programs import GRAPHS, graph, graph_shapes, offset_matmul, program, with_element

from accy.dialects.kernel import KernelFuncOp, LaunchOp
from accy.pipeline import PREPARATION_NAMES as STAGES
from accy.pipeline import prepare_through, run_stage
from accy.preparation.options import RunOptions
from accy.preparation.products import SemanticModule
from accy.preparation.stages import PreparationRequest

CUDA = "cuda:sm_90"


def kernel(sm: SemanticModule, shapes=None, opts=(), target: str = CUDA):
    return prepare_through(sm, "kernel", RunOptions.parse(target, list(opts)), shapes or {})


def plans(result) -> list[dict]:
    """Each kernel's plan as plain values, in module order."""
    out = []
    for op in result.product.module.body.ops:
        if isinstance(op, KernelFuncOp):
            d = {"name": op.sym_name}
            for k, v in op.attributes.items():
                d[k] = getattr(v, "value", getattr(v, "values", v))
            out.append(d)
    return out


def unary(name: str, t: str, out: str | None = None) -> SemanticModule:
    out = out or t
    return program([t], [out], f'    %0 = "semantic.{name}"(%a0) : ({t}) -> {out}\n'
                               f'    "func.return"(%0) : ({out}) -> ()')


# ------------------------------------------------------------------------ host


@pytest.mark.parametrize("path", GRAPHS, ids=[p.stem for p in GRAPHS])
def test_host_kernels_are_plain_loops(path):
    sm = SemanticModule.from_file(str(path))
    r = kernel(sm, graph_shapes(sm), target="host")
    ps = plans(r)
    assert ps and all(p["mapping"] == "loop" for p in ps)
    assert all(p["block"] == (1, 1, 1) and p["grid"] == (1, 1, 1) for p in ps)
    assert r.pass_stats["plan-kernels"] == {"loop-kernels": len(ps)}


# ----------------------------------------------------------------- elementwise


def test_elementwise_is_a_vectorized_grid_stride_loop():
    r = kernel(graph("bias_gelu"), {0: (8, 4096)})
    (p,) = plans(r)
    assert p["mapping"] == "grid-stride" and p["kind"] == "elementwise"
    assert p["vector_width"] == 4 and p["block"] == (256, 1, 1)
    assert p["grid"] == (8 * 4096 // (4 * 256), 1, 1) and p["elements"] == 8 * 4096
    assert r.pass_stats["plan-kernels"] == {"grid-stride-kernels": 1}


def test_an_odd_last_dimension_is_not_vectorized():
    r = kernel(unary("exp", "tensor<8x4095xf32>"))
    (p,) = plans(r)
    assert p["mapping"] == "grid-stride" and p["vector_width"] == 1
    assert p["grid"] == (math.ceil(8 * 4095 / 256), 1, 1)


def test_an_integer_buffer_is_not_vectorized():
    r = kernel(unary("cast", "tensor<8x4096xf32>", "tensor<8x4096xi32>"))
    (p,) = plans(r)
    assert p["vector_width"] == 1


@pytest.mark.parametrize("element", ["bf16", "f16"])
def test_half_buffers_take_sixteen_bytes_an_access(element):
    t = f"tensor<8x4096x{element}>"
    (p,) = plans(kernel(unary("exp", t)))
    assert p["vector_width"] == 8  # 8 halves: a uint4
    assert p["grid"] == (8 * 4096 // (8 * 256), 1, 1)
    (p,) = plans(kernel(unary("exp", t), opts=["kernel.vector_width=2"]))
    assert p["vector_width"] == 4
    (p,) = plans(kernel(unary("exp", t), opts=["kernel.vector_width=1"]))
    assert p["vector_width"] == 1
    (p,) = plans(kernel(unary("exp", f"tensor<8x4100x{element}>")))
    assert p["vector_width"] == 1  # 4100 does not divide by 8


def test_f32_beside_halves_takes_the_f32_width():
    (p,) = plans(kernel(unary("cast", "tensor<8x4096xf32>", "tensor<8x4096xbf16>")))
    assert p["vector_width"] == 4  # a float4 in, a uint2 out


@pytest.mark.parametrize("element", ["bf16", "f16"])
def test_half_rows_are_vectorized(element):
    sm = graph("softmax", element)
    (p,) = plans(kernel(sm, {0: (8, 4096)}))
    assert p["mapping"] == "block-per-row" and p["vector_width"] == 8
    # softmax's sum reads its max: a chained half row, 128 threads (CHAINED_HALF_BLOCK)
    assert p["block"] == (128, 1, 1)
    assert p["items"] == 4096 // (128 * 8) and p["cached_inputs"] == (0,)
    (p,) = plans(kernel(sm, {0: (8, 2048)}))  # 32 lanes · 8 halves · 8 items
    assert p["mapping"] == "warp-per-row" and p["vector_width"] == 8


def test_vector_width_and_block_size_options():
    sm = graph("bias_gelu")
    (p,) = plans(kernel(sm, {0: (8, 4096)}, ["kernel.vector_width=2",
                                             "kernel.block_size=128"]))
    assert p["vector_width"] == 2 and p["block"] == (128, 1, 1)
    assert p["grid"] == (8 * 4096 // (2 * 128), 1, 1)
    (p,) = plans(kernel(unary("exp", "tensor<8x4098xf32>"), opts=["kernel.vector_width=2"]))
    assert p["vector_width"] == 2  # 4098 divides by 2, not by 4


@pytest.mark.parametrize("rows,grid", [
    (1024, 4096),   # 1M vectors: a vector a thread, 4096 blocks of 256
    (2048, 4096),   # 2M: two a thread, still 4096 blocks
    (8192, 16384),  # 8M: two a thread
    (32768, 16384),  # 32M: the grid is capped; a grid-stride loop covers the rest
])
def test_an_elementwise_grid_gives_a_thread_two_vectors_past_4096_blocks(rows, grid):
    (p,) = plans(kernel(unary("exp", f"tensor<{rows}x4096xf32>")))
    assert p["vector_width"] == 4 and p["block"] == (256, 1, 1)
    assert p["grid"] == (grid, 1, 1)


# ------------------------------------------------------------------------ rows


def test_long_rows_are_a_block_per_row_with_the_row_cached():
    r = kernel(graph("softmax"), {0: (8, 4096)})
    (p,) = plans(r)
    assert p["mapping"] == "block-per-row" and p["kind"] == "rows"
    assert p["grid"] == (8, 1, 1) and p["block"] == (512, 1, 1)  # 8 floats a thread
    assert (p["rows"], p["cols"], p["vector_width"]) == (8, 4096, 4)
    assert p["items"] == 4096 // (512 * 4)
    assert p["cached_inputs"] == (0,)
    assert p["shared_bytes"] > 0


@pytest.mark.parametrize("cols,element,block", [
    (2048, "f32", 256), (4096, "f32", 512), (8192, "f32", 512), (16384, "f32", 512),
    (32768, "f32", 1024), (4096, "bf16", 128), (8192, "f16", 256), (16384, "bf16", 512),
])
def test_a_block_per_row_kernel_sizes_its_block_by_its_row(cols, element, block):
    (p,) = plans(kernel(graph("softmax", element), {0: (8, cols)}))
    assert p["mapping"] == "block-per-row" and p["block"] == (block, 1, 1)
    assert bool(p["cached_inputs"]) == (cols <= 32 * block)
    (p,) = plans(kernel(graph("softmax", element), {0: (8, cols)}, ["kernel.block_size=256"]))
    assert p["block"] == (256, 1, 1)  # an explicit block size is kept


@pytest.mark.parametrize("name,element,block", [
    ("softmax", "bf16", 128), ("layernorm", "f16", 128), ("dynamic", "bf16", 128),
    ("rmsnorm", "bf16", 256),  # one reduction
    ("residual_norm", "f16", 256),  # chained, but two streamed rows: 64 values at 128
    ("layernorm", "f32", 512),  # f32 rows: 8 values a thread
])
def test_half_rows_whose_reductions_chain_take_fewer_threads(name, element, block):
    """A reduction that reads another's result waits at a block-wide barrier per link:
    rows of halves whose reductions chain take 128 threads (32 values a thread), while
    a thread's values of every streamed row fit its registers."""
    text = GRAPHS[0].parent.joinpath(f"{name}.mlir").read_text().replace("1024", "4096")
    sm = SemanticModule.from_text(with_element(text, element))  # at 4096, as benchmarked
    shapes = {i: (8192, 4096) if len(t.shape) == 2 else (4096,)
              for i, t in enumerate(sm.entry().function_type.inputs)}
    rows = [p for p in plans(kernel(sm, shapes)) if p["kind"] == "rows"]
    assert rows and all(p["block"] == (block, 1, 1) for p in rows)
    assert all(p["cached_inputs"] and p["items"] * p["vector_width"] * block == 4096
               for p in rows)


def test_sibling_half_reductions_keep_the_block():
    """The reductions program's row sum and row min of one input do not chain."""
    text = GRAPHS[0].parent.joinpath("reductions.mlir").read_text()
    sm = SemanticModule.from_text(with_element(text.replace("64x128", "8192x4096").replace(
        "tensor<64xf32>", "tensor<8192xf32>").replace("1x128xf32", "1x4096xf32"), "bf16"))
    (p,) = [p for p in plans(kernel(sm)) if p["kind"] == "rows" and p["cols"] == 4096
            and p["rows"] == 8192]
    assert p["block"] == (256, 1, 1)


def test_layernorm_caches_the_row_but_not_the_broadcast_vectors():
    (p,) = plans(kernel(graph("layernorm"), {0: (8, 4096)}))
    assert p["mapping"] == "block-per-row" and p["cached_inputs"] == (0,)


def test_short_rows_are_a_warp_per_row():
    r = kernel(graph("softmax"), {0: (20, 256)})
    (p,) = plans(r)
    assert p["mapping"] == "warp-per-row"
    assert p["rows_per_block"] == 8 and p["block"] == (256, 1, 1)
    assert p["grid"] == (math.ceil(20 / 8), 1, 1)
    assert p["items"] == 256 // (32 * 4) and p["cached_inputs"] == (0,)


def test_block_size_changes_the_row_kernels():
    sm = graph("softmax")
    (long_rows,) = plans(kernel(sm, {0: (8, 4096)}, ["kernel.block_size=128"]))
    assert long_rows["block"] == (128, 1, 1) and long_rows["grid"] == (8, 1, 1)
    assert long_rows["items"] == 4096 // (128 * 4)
    (short,) = plans(kernel(sm, {0: (20, 256)}, ["kernel.block_size=128"]))
    assert short["block"] == (128, 1, 1) and short["rows_per_block"] == 4
    assert short["grid"] == (5, 1, 1)


def test_rows_per_block_option():
    (p,) = plans(kernel(graph("softmax"), {0: (20, 256)}, ["kernel.rows_per_block=2"]))
    assert p["mapping"] == "warp-per-row" and p["rows_per_block"] == 2
    assert p["block"] == (64, 1, 1) and p["grid"] == (10, 1, 1)
    (p,) = plans(kernel(graph("softmax"), {0: (20, 256)}, ["kernel.rows_per_block=1"]))
    assert p["mapping"] == "block-per-row"


def test_very_long_rows_are_not_cached():
    (p,) = plans(kernel(graph("softmax"), {0: (4, 65536)}, ["tensor.split_reductions=false"]))
    assert p["mapping"] == "block-per-row" and p["cached_inputs"] == ()


def test_a_few_very_long_rows_are_split_over_many_blocks():
    ps = plans(kernel(graph("softmax"), {0: (4, 65536)}))
    assert len(ps) > 1 and max(p["grid"][0] for p in ps) >= 128  # was 4 blocks


def test_an_odd_row_is_not_vectorized():
    (p,) = plans(kernel(graph("softmax"), {0: (8, 4095)}))
    assert p["vector_width"] == 1 and p["mapping"] == "block-per-row"


# ---------------------------------------------------------------------- matmul


def test_matmul_is_tiled_with_the_grid_covering_the_output():
    r = kernel(graph("mlp"), {0: (100, 256)})
    first, second = plans(r)
    for p, (m, n) in ((first, (100, 1024)), (second, (100, 256))):
        assert p["mapping"] == "tiled" and p["tile"] == (64, 64, 16)
        assert p["grid"] == (math.ceil(n / 64), math.ceil(m / 64), 1)
        assert p["block"] == (16, 16, 1) and p["micro_tile"] == (4, 4)
    assert first["contraction"] == 256 and second["contraction"] == 1024


def test_matmul_tile_options_are_reflected():
    opts = ["kernel.tile_m=32", "kernel.tile_n=128", "kernel.tile_k=8"]
    first, _ = plans(kernel(graph("mlp"), {0: (100, 256)}, opts))
    assert first["tile"] == (32, 128, 8)
    assert first["grid"] == (math.ceil(1024 / 128), math.ceil(100 / 32), 1)
    assert first["micro_tile"] == (32 // 16, 128 // 16)
    assert first["block"] == (16, 16, 1)
    assert first["shared_bytes"] == 8 * ((32 + 1) + (128 + 4)) * 4


def test_batched_matmul_puts_the_batch_on_the_grid():
    r = kernel(graph("attention"), {i: (3, 128, 64) for i in range(3)},
               ["dispatch.fuse_attention=false"])
    first, soft, last = plans(r)
    # 128×64 tiles for the second (64×64 only where nothing larger divides)
    assert first["grid"] == (2, 2, 3) and last["grid"] == (1, 1, 3)
    assert soft["mapping"] == "warp-per-row" and soft["rows"] == 3 * 128


# ------------------------------------------------------------ f32 FFMA matmul


def f32_matmul(m: int, n: int, k: int, batch: tuple[int, ...] = (),
               element: str = "f32") -> SemanticModule:
    pre = "".join(f"{d}x" for d in batch)
    a, b, c = (f"tensor<{pre}{m}x{k}x{element}>", f"tensor<{pre}{k}x{n}x{element}>",
               f"tensor<{pre}{m}x{n}x{element}>")
    return program([a, b], [c], f'    %0 = "semantic.matmul"(%a0, %a1) : ({a}, {b}) -> {c}\n'
                                f'    "func.return"(%0) : ({c}) -> ()')


def test_an_f32_matmul_of_plain_inputs_runs_the_ffma_kernel():
    (p,) = plans(kernel(f32_matmul(4096, 4096, 4096)))
    assert p["mapping"] == "ffma-tiled"
    assert p["tile"] == (128, 128, 8) and p["micro_tile"] == (8, 8) and p["stages"] == 2
    assert p["block"] == (256, 1, 1) and p["grid"] == (32, 32, 1)
    assert p["vector_width"] == 4
    assert p["shared_bytes"] == 2 * 8 * ((128 + 4) + 128) * 4
    assert "mma" not in p and "warps" not in p


@pytest.mark.parametrize("shape,batch,tile", [
    ((2048, 2048, 2048), (), (128, 128)),   # 256 blocks
    ((1024, 1024, 1024), (), (128, 64)),    # 64 blocks at 128×128: n halves
    ((1024, 1024, 1024), (8,), (128, 128)),  # the batch fills the grid
    ((512, 512, 512), (), (128, 64)),       # never 128 blocks: the most, 64×64 aside
    ((8192, 256, 1024), (), (128, 64)),     # K > 512: 128 blocks of 128×128 are too few
    ((2048, 1024, 256), (), (128, 128)),    # K ≤ 512: 128 blocks are a wave
    ((8192, 1024, 256), (), (128, 128)),
    ((2048, 256, 1024), (), (128, 64)),     # 64 blocks of 128×64 beat 128 of 64×64
    ((192, 8192, 64), (), (64, 128)),       # 128 does not divide M
    ((8192, 192, 64), (), (128, 64)),       # nor N
    ((64, 64, 8), (), (64, 64)),
])
def test_ffma_tiles_by_shape(shape, batch, tile):
    m, n, k = shape
    (p,) = plans(kernel(f32_matmul(m, n, k, batch)))
    assert p["mapping"] == "ffma-tiled" and p["tile"][:2] == tile
    assert p["grid"] == (n // tile[1], m // tile[0], math.prod(batch))
    assert p["block"] == (tile[0] * tile[1] // 64, 1, 1)


def test_ffma_tiles_are_options():
    opts = ["kernel.ffma_tile_m=64", "kernel.ffma_tile_n=128", "kernel.ffma_tile_k=16"]
    (p,) = plans(kernel(f32_matmul(4096, 4096, 4096), opts=opts))
    assert p["mapping"] == "ffma-tiled" and p["tile"] == (64, 128, 16)
    assert p["block"] == (128, 1, 1) and p["grid"] == (32, 64, 1)
    assert p["shared_bytes"] == 2 * 16 * ((64 + 4) + 128) * 4
    both = ["kernel.ffma_tile_m=128", "kernel.ffma_tile_n=128"]
    (p,) = plans(kernel(f32_matmul(1024, 1024, 1024), opts=both))
    assert p["tile"] == (128, 128, 8)  # the options win over the shape's pick (128, 64)
    (p,) = plans(kernel(f32_matmul(1024, 1024, 1024), opts=["kernel.ffma_tile_n=128"]))
    assert p["tile"] == (64, 128, 8)  # M still by shape
    (p,) = plans(kernel(f32_matmul(1024, 1024, 1024), opts=["kernel.ffma_tile_m=64"]))
    assert p["tile"] == (64, 128, 8)


@pytest.mark.parametrize("opts,unroll", [
    ((), 8), (("kernel.ffma_unroll=2",), 2), (("kernel.ffma_unroll=1",), 1),
    (("kernel.ffma_unroll=16",), 8),                        # at most the stage's depth
    (("kernel.ffma_tile_k=16",), 16),                       # all of a stage by default
    (("kernel.ffma_unroll=4", "kernel.ffma_tile_k=16"), 4)])
def test_ffma_unroll_is_a_plan_field(opts, unroll):
    (p,) = plans(kernel(f32_matmul(1024, 1024, 1024), opts=list(opts)))
    assert p["mapping"] == "ffma-tiled" and p["unroll"] == unroll


TRANSPOSED_B = program(["tensor<256x128xf32>", "tensor<256x128xf32>"], ["tensor<256x256xf32>"], """\
    %0 = "semantic.transpose"(%a1) {permutation = array<i64: 1, 0>} : (tensor<256x128xf32>) -> tensor<128x256xf32>
    %1 = "semantic.matmul"(%a0, %0) : (tensor<256x128xf32>, tensor<128x256xf32>) -> tensor<256x256xf32>
    "func.return"(%1) : (tensor<256x256xf32>) -> ()""")
BROADCAST_B = program(["tensor<2x256x128xf32>", "tensor<128x256xf32>"], ["tensor<2x256x256xf32>"], """\
    %0 = "semantic.matmul"(%a0, %a1) : (tensor<2x256x128xf32>, tensor<128x256xf32>) -> tensor<2x256x256xf32>
    "func.return"(%0) : (tensor<2x256x256xf32>) -> ()""")
F64 = program(["tensor<256x256xf64>", "tensor<256x256xf64>"], ["tensor<256x256xf64>"], """\
    %0 = "semantic.matmul"(%a0, %a1) : (tensor<256x256xf64>, tensor<256x256xf64>) -> tensor<256x256xf64>
    "func.return"(%0) : (tensor<256x256xf64>) -> ()""")


@pytest.mark.parametrize("sm,opts", [
    (f32_matmul(17, 256, 64), ()),                   # ragged M
    (f32_matmul(256, 4097, 64), ()),                 # ragged N
    (f32_matmul(1, 17, 4097), ()),
    (f32_matmul(256, 256, 12), ()),                  # K not a multiple of 8
    (f32_matmul(256, 256, 24), ("kernel.ffma_tile_k=16",)),
    (f32_matmul(64, 256, 64), ("kernel.ffma_tile_m=128",)),  # the forced tile does not divide
    (f32_matmul(0, 256, 64), ()),                    # nothing to multiply
    (f32_matmul(128, 128, 64, (0,)), ()),            # an empty batch
    (f32_matmul(256, 256, 64), ("kernel.ffma_tiles=false",)),
    (TRANSPOSED_B, ()),                              # an operand through a transpose
    (BROADCAST_B, ()),                               # B broadcast over the batch
    (F64, ()),
    (f32_matmul(256, 256, 64, (), "bf16"), ("kernel.tensor_cores=false",)),  # halves
])
def test_other_f32_matmuls_keep_the_generic_tiles(sm, opts):
    (p,) = plans(kernel(sm, opts=opts))
    assert p["mapping"] == "tiled"


def test_an_unaligned_arena_operand_keeps_the_generic_tiles():
    sm = offset_matmul(64, 64, 64)
    for alignment, mapping in ((4, "tiled"), (16, "ffma-tiled"),
                               (256, "ffma-tiled")):
        r = kernel(sm, opts=["dispatch.fuse=false", f"memory.alignment={alignment}"])
        (p,) = [p for p in plans(r) if p["kind"] == "matmul"]
        assert p["mapping"] == mapping, alignment


@pytest.mark.parametrize("option", ["kernel.ffma_tile_m=32", "kernel.ffma_tile_n=256",
                                    "kernel.ffma_tile_k=4", "kernel.ffma_tile_k=32",
                                    "kernel.ffma_unroll=0", "kernel.ffma_unroll=3",
                                    "kernel.ffma_unroll=32", "kernel.column_split=3",
                                    "kernel.column_split=16", "kernel.column_streams=-1",
                                    "kernel.column_streams=1025"])
def test_bad_ffma_tiles_are_option_errors(option):
    from accy.errors import OptionError

    with pytest.raises(OptionError, match=option.split("=")[0]):
        RunOptions.parse(CUDA, [option])


@pytest.mark.parametrize("option", ["kernel.wgmma_raster=0", "kernel.wgmma_raster=65"])
def test_bad_warpgroup_rasters_are_option_errors(option):
    from accy.errors import OptionError

    with pytest.raises(OptionError, match="kernel.wgmma_raster must be 1 to 64"):
        RunOptions.parse(CUDA, [option])


# -------------------------------------------------------------- launches, keys


def test_every_region_becomes_a_kernel_and_a_launch():
    sm = graph("all_ops")
    mem = prepare_through(sm, "memory", RunOptions.parse(CUDA), {}).product
    n_regions = sum(op.op_name == "dispatch.region" for op in mem.entry().body.ops)
    r = kernel(sm)
    launches = [op for op in r.product.entry().body.ops if isinstance(op, LaunchOp)]
    kernels = {p["name"]: p for p in plans(r)}
    assert len(launches) == len(kernels) == n_regions
    assert [op.kernel for op in launches] == list(kernels)
    assert all(op.attr("memory.inputs") is not None and op.attr("memory.outputs") is not None
               for op in launches)
    text = r.product.text()
    assert "dispatch.region" not in text and "dispatch.yield" not in text
    assert text.count('"kernel.yield"') == n_regions


@pytest.mark.parametrize("option,fused", [
    ("kernel.block_size=128", False), ("kernel.vector_width=1", False),
    ("kernel.ffma_tile_k=16", False), ("kernel.ffma_unroll=2", False),
    ("kernel.tile_m=32", False),
    ("kernel.rows_per_block=2", False), ("kernel.attention_tile_n=32", True),
    ("kernel.attention_tile_m=32", True), ("kernel.attention_threads=128", True),
    ("kernel.attention_prefetch=true", True)])
def test_a_kernel_option_changes_only_the_kernel_product(option, fused):
    """Unfused, attention is three kernels the general options plan; fused, one flash
    kernel that the attention options plan."""
    sm = graph("attention")
    shapes = {i: (2, 128, 64) for i in range(3)}
    common = [] if fused else ["dispatch.fuse_attention=false"]
    base = RunOptions.parse(CUDA, common)
    changed = RunOptions.parse(CUDA, common + [option])
    a_prod, b_prod = sm, sm
    for stage in STAGES[:-1]:
        a = run_stage(stage, a_prod, PreparationRequest(options=base, shapes=shapes))
        b = run_stage(stage, b_prod, PreparationRequest(options=changed, shapes=shapes))
        if stage == "kernel":
            assert a.key != b.key
            assert a.product.fingerprint() != b.product.fingerprint()
            assert a.plan_fingerprint != b.plan_fingerprint
        else:
            assert a.key == b.key, stage
            assert a.product.fingerprint() == b.product.fingerprint(), stage
            assert a.plan_fingerprint == b.plan_fingerprint, stage
        a_prod, b_prod = a.product, b.product


def test_the_target_kind_changes_only_the_kernel_and_target_keys():
    sm = graph("softmax")
    host = prepare_through(sm, "memory", RunOptions.parse("host"), {0: (8, 64)})
    cuda = prepare_through(sm, "memory", RunOptions.parse(CUDA), {0: (8, 64)})
    assert host.key == cuda.key
    assert kernel(sm, {0: (8, 64)}, target="host").key != kernel(sm, {0: (8, 64)}).key


# ------------------------------------------------------------ vector alignment


@pytest.mark.parametrize("alignment", [1, 4, 8, 16, 256])
def test_vectorized_kernels_only_touch_16_byte_aligned_buffers(alignment):
    # a 3x1 row statistic (12 bytes) is allocated first: with a small arena alignment
    # the next buffer would start at byte 12, where a float4 load faults
    sm = program(["tensor<3x8xf32>"], ["tensor<3x8xf32>"], """\
    %0 = "semantic.reduce_sum"(%a0) {axes = array<i64: 1>, keepdims = true} : (tensor<3x8xf32>) -> tensor<3x1xf32>
    %1 = "semantic.exp"(%a0) : (tensor<3x8xf32>) -> tensor<3x8xf32>
    %2 = "semantic.div"(%1, %0) : (tensor<3x8xf32>, tensor<3x1xf32>) -> tensor<3x8xf32>
    "func.return"(%2) : (tensor<3x8xf32>) -> ()""")
    r = kernel(sm, opts=["dispatch.fuse=false", f"memory.alignment={alignment}"])
    func = r.product.entry()
    offset = {}
    for d in func.attr("memory.buffers").values:
        e = dict(d.entries)
        if e["kind"].value == "arena":
            offset[e["id"].value] = e["offset"].value
    ps = {p["name"]: p for p in plans(r)}
    for launch in (op for op in func.body.ops if isinstance(op, LaunchOp)):
        p = ps[launch.kernel]
        ids = launch.attr("memory.inputs").values + launch.attr("memory.outputs").values
        width = 4 * p["vector_width"]
        assert all(offset[i] % width == 0 for i in ids if i in offset), (p, offset)
    if alignment >= 16:
        assert any(p["vector_width"] == 4 for p in ps.values())


# ------------------------------------------------------------ tensor-core matmul


def matmul(m: int, n: int, k: int, element: str, batch: tuple[int, ...] = ()) -> SemanticModule:
    pre = "".join(f"{d}x" for d in batch)
    a, b, c = (f"tensor<{pre}{m}x{k}x{element}>", f"tensor<{pre}{k}x{n}x{element}>",
               f"tensor<{pre}{m}x{n}x{element}>")
    return program([a, b], [c], f'    %0 = "semantic.matmul"(%a0, %a1) : ({a}, {b}) -> {c}\n'
                                f'    "func.return"(%0) : ({c}) -> ()')


@pytest.mark.parametrize("element", ["bf16", "f16"])
def test_half_matmuls_run_on_the_tensor_cores(element):
    (p,) = plans(kernel(matmul(256, 384, 96, element)))
    assert p["mapping"] == "mma-tiled"
    assert p["mma"] == f"m16n8k16.row.col.f32.{element}.{element}.f32"
    assert p["tile"] == (128, 128, 32) and p["stages"] == 3
    assert p["warps"] == (2, 4) and p["warp_tile"] == (64, 32) and p["block"] == (256, 1, 1)
    assert p["grid"] == (3, 2, 1) and p["shared_bytes"] == 3 * 32 * 256 * 2
    assert p["swizzle"] == (1, 3, 0, 7)


def test_mma_tiles_and_stages_are_options():
    (p,) = plans(kernel(matmul(128, 64, 128, "bf16", (3,)), opts=[
        "kernel.mma_tile_m=64", "kernel.mma_tile_n=64", "kernel.mma_tile_k=64",
        "kernel.stages=2"]))
    assert p["mapping"] == "mma-tiled" and p["tile"] == (64, 64, 64) and p["stages"] == 2
    assert p["warps"] == (1, 2) and p["block"] == (64, 1, 1) and p["grid"] == (1, 2, 3)
    assert p["swizzle"] == (0, 7, 0, 7)  # a 128-byte A row: 8 chunks


@pytest.mark.parametrize("case,opts", [
    (("f32", 256, 256, 64), ()),                      # f32: the FFMA tiles (TF32 is not on)
    (("bf16", 17, 256, 64), ()),                      # ragged M
    (("bf16", 256, 4097, 64), ()),                    # ragged N
    (("bf16", 256, 256, 48), ()),                     # K not a multiple of 32
    (("bf16", 256, 256, 64), ("kernel.tensor_cores=false",)),
])
def test_other_matmuls_keep_the_ffma_tiles(case, opts):
    el, m, n, k = case
    (p,) = plans(kernel(matmul(m, n, k, el), opts=opts))
    assert p["mapping"] in ("tiled", "ffma-tiled") and "mma" not in p


def test_tensor_cores_need_sm_80():
    (p,) = plans(kernel(matmul(256, 256, 64, "bf16"), target="cuda:sm_75"))
    assert p["mapping"] == "tiled"


def test_too_many_stages_for_shared_memory_is_an_option_error():
    from accy.errors import OptionError

    with pytest.raises(OptionError, match="kernel.stages=4"):
        RunOptions.parse(CUDA, ["kernel.stages=4"])
    RunOptions.parse(CUDA, ["kernel.stages=4", "kernel.mma_tile_n=64"])


def test_short_half_rows_keep_every_lane_busy():
    # 64 columns: 8 halves a lane would leave 24 of 32 lanes idle; 2 fill the warp
    (p,) = plans(kernel(graph("softmax", "bf16"), {0: (300, 64)}))
    assert p["mapping"] == "warp-per-row" and p["vector_width"] == 2 and p["items"] == 1
    (p,) = plans(kernel(graph("softmax"), {0: (300, 64)}))
    assert p["vector_width"] == 4  # f32 keeps its width


def test_rows_that_are_columns_in_memory_get_a_thread_each():
    """softmax over axis 0 reads its rows through a transpose: with many short rows each
    thread walks one (coalesced across the warp); few rows keep a warp per row."""
    from stage_programs import graph

    from accy.pipeline import prepare_through
    from accy.preparation.options import RunOptions

    sm = graph("softmax_axis0")
    many = prepare_through(sm, "kernel", RunOptions.parse(CUDA), {0: (64, 65536)}).product
    assert 'mapping = "thread-per-row"' in many.text()
    few = prepare_through(graph("softmax_axis0"), "kernel", RunOptions.parse(CUDA),
                          {0: (64, 1024)}).product
    assert 'mapping = "thread-per-row"' not in few.text()
    assert 'mapping = "warp-per-row"' in few.text()


@pytest.mark.parametrize("opts,streams", [((), 8), (("kernel.column_streams=1",), 1),
                                          (("kernel.column_streams=3",), 3)])
def test_a_column_kernels_blocks_are_dealt_into_streams(opts, streams):
    """``kernel.column_streams`` (0 picks ``COLUMN_STREAMS``) is the plan's ``streams``,
    whatever the grid: the kernel reads ``gridDim.x``, so one source serves every row
    count."""
    from stage_programs import graph

    from accy.preparation.passes.kernel import COLUMN_STREAMS

    for cols in (65536, 65536 + 77):
        (p,) = plans(kernel(graph("softmax_axis0"), {0: (64, cols)}, opts=list(opts)))
        assert p["mapping"] == "thread-per-row"
        assert p.get("streams", 1) == streams
    assert COLUMN_STREAMS == 8


@pytest.mark.parametrize("streams", [1, 2, 3, 8, 64])
def test_stream_tiles_are_every_tile_once_in_runs(streams):
    """:func:`stream_tile` is a permutation of the grid's tiles, and each run's blocks
    take consecutive tiles (what the ``thread-per-row`` kernel spells with gridDim.x)."""
    from accy.preparation.passes.kernel import stream_tile

    for grid in (1, 2, 7, 8, 9, 129, 4096):
        tiles = [stream_tile(b, grid, streams) for b in range(grid)]
        assert sorted(tiles) == list(range(grid))
        for s in range(min(streams, grid)):
            run = tiles[s::streams]
            assert run == list(range(run[0], run[0] + len(run)))


@pytest.mark.parametrize("element", ["bf16", "f16"])
def test_a_half_column_softmax_is_one_thread_per_row_kernel(element):
    """Its f32 compute sits between two casts; the transposes move outside them
    (casts-inside-transposes), so the casts fuse: no f32 copy on either side."""
    from stage_programs import graph

    ps = plans(kernel(graph("softmax_axis0", element), {0: (64, 65536)}))
    assert [p["mapping"] for p in ps] == ["thread-per-row"]


def test_a_half_mean_of_everything_is_split_without_an_f32_copy():
    """reduce_mean of bf16 8192×4096 computes in f32 (a cast, then a sum): the split's
    reshape goes before the cast, so the cast fuses into the partial sums."""
    from stage_programs import program

    t, o = "tensor<8192x4096xbf16>", "tensor<bf16>"
    sm = program([t], [o], f'''    %0 = "semantic.reduce_mean"(%a0) {{axes = array<i64: 0, 1>, keepdims = false}} : ({t}) -> {o}
    "func.return"(%0) : ({o}) -> ()''')
    ps = plans(kernel(sm))
    assert not [p for p in ps if p["mapping"] == "grid-stride" and p["elements"] == 8192 * 4096]
    assert max(p["grid"][0] for p in ps) >= 1024  # the partial sums: many blocks


@pytest.mark.parametrize("name,element,opts,threads,blocks", [
    ("dynamic", None, (), 512, 0),                    # no cap unless asked
    ("elementwise_chain", None, (), 256, 0),
    ("layernorm", "bf16", (), 128, 0),
    ("dynamic", None, ("kernel.max_registers=32",), 512, 4),   # a full SM
    ("elementwise_chain", None, ("kernel.max_registers=32",), 256, 8),
    ("layernorm", "bf16", ("kernel.max_registers=64",), 128, 8),
    ("softmax", None, ("kernel.block_size=1024", "kernel.rows_per_block=4",
                       "kernel.max_registers=64"), 128, 8),  # warp-per-row too
    ("dynamic", None, ("kernel.max_registers=40",), 512, 3),
    ("dynamic", None, ("kernel.max_registers=255",), 512, 0),
])
def test_kernel_max_registers_caps_a_thread(name, element, opts, threads, blocks):
    """``min_blocks``: ``kernel.max_registers`` caps an elementwise or row kernel's
    registers (blocks an SM must hold: 65536 / (threads · cap)); 0, the default, and
    255 leave ptxas alone. The rendered ``__launch_bounds__`` carries the number."""
    sm = graph(name, element)
    shapes = {i: tuple(8192 if d is None and len(s) == 2 and i < 2 else d for d in s)
              for i, s in graph_shapes(sm, 4096).items()}
    job = prepare_through(sm, "target", RunOptions.parse("cuda:sm_90", list(opts)),
                          shapes).product
    (k,) = [op for op in job.module.body.ops if isinstance(op, KernelFuncOp)]
    assert (k.plan.block[0], k.plan.min_blocks) == (threads, blocks)
    bounds = f"__launch_bounds__({threads}, {blocks})" if blocks else \
        f"__launch_bounds__({threads}) {k.sym_name}("
    assert bounds in job.source
