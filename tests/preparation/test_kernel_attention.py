"""Kernel stage: the ``flash`` plan of an attention region, as data on the kernel.func."""

from __future__ import annotations

import pytest
from stage_programs import attention, graph

from accy.dialects.kernel import KernelFuncOp, attention_shared_floats
from accy.errors import OptionError
from accy.pipeline import prepare_through
from accy.preparation.options import RunOptions

SHAPES = {i: (512, 128, 64) for i in range(3)}


def plan_of(sm, shapes=None, opts=(), target: str = "cuda:sm_90"):  # type: ignore[no-untyped-def]
    r = prepare_through(sm, "kernel", RunOptions.parse(target, list(opts)), shapes or {})
    (k,) = [op for op in r.product.module.body.ops if isinstance(op, KernelFuncOp)]
    return k.plan


def test_the_attention_graph_plans_one_flash_kernel():
    p = plan_of(graph("attention"), SHAPES)
    assert (p.kind, p.mapping) == ("attention", "flash")
    assert p.tile == (128, 64, 64) and p.micro_tile == (8, 4)
    assert p.block == (256, 1, 1) and p.grid == (512, 1, 1)
    assert p.vector_width == 4 and p.stages == 1 and p.contraction == 64
    # Q, K then P, V: over 48 KB, dynamic
    assert p.dynamic_shared == 4 * sum(attention_shared_floats(128, 64, 64, 64)) > 48 * 1024
    assert p.shared_bytes == 0


@pytest.mark.parametrize("opts,tile,micro,block", [
    (["kernel.attention_tile_m=64"], (64, 64), (4, 4), 256),
    (["kernel.attention_tile_n=32"], (128, 32), (8, 2), 256),
    (["kernel.attention_tile_m=64", "kernel.attention_tile_n=128"], (64, 128), (4, 8), 256),
    (["kernel.attention_threads=128", "kernel.attention_tile_m=64"], (64, 64), (8, 4), 128),
    (["kernel.attention_threads=64", "kernel.attention_tile_m=32"], (32, 64), (8, 4), 64),
])
def test_the_tile_options_are_the_plan(opts, tile, micro, block):
    p = plan_of(graph("attention"), SHAPES, opts)
    assert p.tile[:2] == tile and p.micro_tile == micro and p.block == (block, 1, 1)
    assert p.grid == (512 * -(-128 // tile[0]), 1, 1)
    assert p.dynamic_shared == 4 * sum(attention_shared_floats(*tile, 64, 64))


def test_prefetch_off_or_too_big_loads_each_tile_when_reached():
    assert plan_of(graph("attention"), SHAPES).stages == 1  # off by default
    on = ["kernel.attention_prefetch=true", "kernel.attention_tile_m=64"]
    assert plan_of(graph("attention"), SHAPES, on).stages == 2
    assert plan_of(graph("attention"), SHAPES, on + ["kernel.attention_tile_n=128"]).stages == 1


def test_fewer_threads_shrink_the_query_tile_to_8_rows_a_thread():
    p = plan_of(graph("attention"), SHAPES, ["kernel.attention_threads=128"])
    assert p.tile[:2] == (64, 64) and p.micro_tile == (8, 4) and p.block == (128, 1, 1)


def test_ragged_head_dims_load_scalars_and_pad_the_tiles():
    p = plan_of(attention((3,), 17, 17, 3, 5), {})
    assert p.vector_width == 1 and p.tile == (128, 64, 3) and p.grid == (3, 1, 1)
    assert p.dynamic_shared == 4 * sum(attention_shared_floats(128, 64, 3, 5))


def test_the_tiles_shrink_to_the_targets_shared_memory():
    sm = attention((2,), 256, 256, 128, 128)
    big = plan_of(sm, {}, target="cuda:sm_90")
    assert big.tile == (128, 64, 128) and big.dynamic_shared > 48 * 1024
    small = plan_of(sm, {}, target="cuda:sm_75")  # 48 KB a block
    assert small.dynamic_shared <= 48 * 1024
    assert small.tile[1] < 64 and small.grid[0] == 2 * -(-256 // small.tile[0])


def test_the_host_plans_a_loop():
    p = plan_of(graph("attention"), SHAPES, target="host")
    assert (p.kind, p.mapping, p.block, p.grid) == ("attention", "loop", (1, 1, 1), (1, 1, 1))


@pytest.mark.parametrize("bad", ["kernel.attention_tile_m=48", "kernel.attention_tile_n=256",
                                 "kernel.attention_threads=512"])
def test_bad_attention_options_are_errors(bad):
    with pytest.raises(OptionError, match=bad.split("=")[0]):
        RunOptions.parse("cuda:sm_90", [bad])


def test_the_attention_options_and_the_arch_are_in_the_kernel_key():
    base = RunOptions.parse("cuda:sm_90").stage_key_fields("kernel")
    for name in ("attention_tile_m", "attention_tile_n", "attention_threads",
                 "attention_prefetch"):
        assert name in base
    assert base["target.arch"] == "sm_90"
    off = RunOptions.parse("cuda:sm_80", ["kernel.tensor_cores=false"])
    assert off.stage_key_fields("kernel")["target.arch"] == "sm_80"  # the shared memory
