"""Dispatch stage: ``softmax(q·kᵀ·c)·v`` as one ``attention`` region, and its fallbacks.

The fused region must compute what the program does (the reference interpreter
runs region bodies), and every form the fusion does not cover keeps today's
regions: a matmul, a row softmax and a matmul.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from stage_programs import attention, graph

import accy.reference_lowered  # noqa: F401  (registers the prim and dispatch impls)
from accy.dialects.dispatch import RegionOp
from accy.pipeline import prepare_through
from accy.preparation.options import RunOptions
from accy.reference import run_reference


def dispatch(sm, shapes=None, opts=()):  # type: ignore[no-untyped-def]
    return prepare_through(sm, "dispatch", RunOptions.parse("host", list(opts)), shapes or {})


def kinds(r) -> list[str]:  # type: ignore[no-untyped-def]
    return re.findall(r'kind = "(elementwise|rows|matmul|attention)"', r.product.text())


def regions(r) -> list[RegionOp]:  # type: ignore[no-untyped-def]
    return [op for op in r.product.entry().body.ops if isinstance(op, RegionOp)]


def inputs(sm, seed: int = 0) -> list[np.ndarray]:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(tuple(t.shape)).astype(np.float32)
            for t in sm.entry().function_type.inputs]


SHAPES = {i: (2, 128, 64) for i in range(3)}


def test_the_attention_graph_is_one_region():
    r = dispatch(graph("attention"), SHAPES)
    assert kinds(r) == ["attention"]
    (region,) = regions(r)
    names = [op.op_name for op in region.body.ops]
    assert names.count("prim.matmul") == 2 and names.count("prim.reduce") == 2
    assert "prim.exp" in names and names[-1] == "dispatch.yield"
    assert [v.type.shape for v in region.operands] == [(2, 128, 64)] * 3
    assert region.iteration == (2, 128, 64)
    assert region.contraction == 64 and region.attr("keys").value == 128
    assert region.attr("split").value == "query-tiles"
    assert region.attr("work_items").value == 2 * 128
    assert r.pass_stats["form-dispatch-regions"]["fused-attention"] == 1


@pytest.mark.parametrize("kw", [{}, {"k_rows": False}, {"scale": "div"}, {"scale": "lmul"},
                                {"scale": "none"}], ids=str)
@pytest.mark.parametrize("batch", [(), (3,), (2, 2)], ids=str)
def test_the_forms_of_attention_are_fused_and_compute_the_program(batch, kw):
    sm = attention(batch, 17, 33, 8, 5, **kw)
    r = dispatch(sm)
    assert kinds(r) == ["attention"]
    xs = inputs(sm)
    np.testing.assert_allclose(run_reference(r.product.module, xs)[0],
                               run_reference(sm.module, xs)[0], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("why,sm", [
    ("the scores are also returned", attention((2,), 16, 16, 8, 8, return_scores=True)),
    ("softmax over another axis", attention((2,), 16, 16, 8, 8, axis=-2)),
    ("K's batch broadcasts", attention((2,), 16, 16, 8, 8, k_batch=(1,))),
    ("a head dim past 256", attention((2,), 4, 4, 300, 8)),
    ("not f32", attention((2,), 16, 16, 8, 8, element="f16")),
], ids=lambda x: x if isinstance(x, str) else "")
def test_other_forms_keep_todays_regions(why, sm):
    r = dispatch(sm)
    assert "attention" not in kinds(r), why
    assert kinds(r).count("matmul") == 2 and "rows" in kinds(r)
    xs = inputs(sm)
    if why != "not f32":
        for got, want in zip(run_reference(r.product.module, xs),
                             run_reference(sm.module, xs)):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_the_probabilities_read_elsewhere_keep_todays_regions():
    from stage_programs import attention_text

    from accy.preparation.products import SemanticModule

    src = attention_text((2,), 16, 16, 8, 8).replace(
        '"func.return"(%o) : (tensor<2x16x8xf32>) -> ()',
        '%e = "semantic.exp"(%p) : (tensor<2x16x16xf32>) -> tensor<2x16x16xf32>\n'
        '    "func.return"(%o, %e) : (tensor<2x16x8xf32>, tensor<2x16x16xf32>) -> ()').replace(
        "-> tensor<2x16x8xf32>, sym_name", "-> (tensor<2x16x8xf32>, tensor<2x16x16xf32>), "
        "sym_name")
    sm = SemanticModule.from_text(src, "p.mlir")
    r = dispatch(sm)
    assert "attention" not in kinds(r) and kinds(r).count("matmul") == 2


@pytest.mark.parametrize("opts", [["dispatch.fuse_attention=false"], ["dispatch.fuse=false"]])
def test_turned_off_the_attention_graph_keeps_three_regions(opts):
    r = dispatch(graph("attention"), SHAPES, opts)
    assert "attention" not in kinds(r)
    if opts == ["dispatch.fuse_attention=false"]:
        assert kinds(r) == ["matmul", "rows", "matmul"]


def test_the_option_is_in_the_dispatch_key_only():
    on, off = RunOptions.parse("host"), RunOptions.parse("host", ["dispatch.fuse_attention=0"])
    assert on.stage_key_fields("dispatch")["fuse_attention"] is True
    assert off.stage_key_fields("dispatch")["fuse_attention"] is False
    for stage in ("contract", "tensor", "memory", "kernel", "target"):
        assert on.stage_key_fields(stage) == off.stage_key_fields(stage), stage
    from accy.pipeline import stage

    assert stage("dispatch").key("00", on).hex != stage("dispatch").key("00", off).hex


def test_stacked_attention_is_two_regions_and_an_epilogue_is_its_own():
    from stage_programs import program

    t = "tensor<2x16x8xf32>"
    s = "tensor<2x16x16xf32>"
    kt = "tensor<2x8x16xf32>"
    body = []
    for i, q in enumerate(("%a0", "%o0")):
        body += [f'    %kt{i} = "semantic.transpose"(%a1) {{permutation = array<i64: 0, 2, 1>}} '
                 f': ({t}) -> {kt}',
                 f'    %s{i} = "semantic.matmul"({q}, %kt{i}) : ({t}, {kt}) -> {s}',
                 f'    %p{i} = "semantic.softmax"(%s{i}) {{axis = -1 : i64}} : ({s}) -> {s}',
                 f'    %o{i} = "semantic.matmul"(%p{i}, %a2) : ({s}, {t}) -> {t}']
    body += [f'    %r = "semantic.add"(%o1, %a0) : ({t}, {t}) -> {t}',
             f'    "func.return"(%r) : ({t}) -> ()']
    sm = program([t, t, t], [t], "\n".join(body))
    r = dispatch(sm)
    assert kinds(r) == ["attention", "attention", "elementwise"]
    first, second, add = regions(r)
    assert second.operands[0] is first.results[0] and add.operands[0] is second.results[0]
    xs = inputs(sm)
    np.testing.assert_allclose(run_reference(r.product.module, xs)[0],
                               run_reference(sm.module, xs)[0], rtol=1e-6, atol=1e-7)
