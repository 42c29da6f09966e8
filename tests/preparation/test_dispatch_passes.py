"""Dispatch stage: form-dispatch-regions and materialize-results.

Inputs are built by running the real pipelines (contract → tensor → dispatch)
on small programs and on ``graphs/*.mlir``; checks read the printed IR.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from stage_programs import GRAPHS, filecheck, graph, program

import accy.reference_lowered  # noqa: F401  (registers the prim and dispatch impls)
from accy.choir.attributes import TensorType, numpy_dtype
from accy.choir.ir import BlockArgument
from accy.dialects.dispatch import RegionOp
from accy.pipeline import prepare_through, run_stage
from accy.preparation.options import RunOptions
from accy.preparation.products import SemanticModule
from accy.preparation.stages import PreparationRequest
from accy.reference import run_reference

FREE = ("prim.broadcast", "prim.transpose", "prim.constant")
"""Index maps and constants: cloned into the regions that read them, never launches."""


def dispatch(sm: SemanticModule, shapes=None, opts=(), stage: str = "dispatch"):
    return prepare_through(sm, stage, RunOptions.parse("host", list(opts)), shapes or {})


def regions(result) -> list[RegionOp]:
    return [op for op in result.product.entry().body.ops if isinstance(op, RegionOp)]


def _cloned(op) -> bool:
    """Index maps, constants and casts of the region's inputs (or of such values): the
    former clones them into each region that reads them (a cast of an argument is then
    a conversion at the load)."""
    if op.op_name in FREE:
        return True
    return op.op_name == "prim.cast" and all(
        isinstance(v, BlockArgument) or _cloned(v.op) for v in op.operands)


def body_ops(region: RegionOp, casts: bool = False) -> list[str]:
    """The computing ops of a region (cloned ops and the yield left out; with ``casts``,
    the casts of its inputs kept: without fusion nothing is cloned but index maps)."""
    return [op.op_name for op in region.body.ops
            if op.op_name != "dispatch.yield" and not (
                op.op_name in FREE if casts else _cloned(op))]




def kinds(text: str) -> list[str]:
    return re.findall(r'kind = "(elementwise|rows|matmul|attention)"', text)


T = "tensor<4x8xf32>"
CHAIN = ("exp", "neg", "abs", "tanh", "sin", "cos", "neg", "exp", "abs", "sigmoid")


def chain_program(n: int = 10) -> SemanticModule:
    lines = [f'    %{i} = "semantic.{CHAIN[i]}"(%{"a0" if i == 0 else i - 1}) : ({T}) -> {T}'
             for i in range(n)]
    lines.append(f'    "func.return"(%{n - 1}) : ({T}) -> ()')
    return program([T], [T], "\n".join(lines))


# ----------------------------------------------------------------- the graphs


def test_softmax_is_one_rows_region_with_both_reductions_and_the_epilogue():
    r = dispatch(graph("softmax"), {0: (8, 16)})
    text = r.product.text()
    assert text.count('"dispatch.region"') == 1 and kinds(text) == ["rows"]
    filecheck(text,
              '"dispatch.region"(%arg0)',
              '"prim.reduce"(%arg1) {kind = "max"}',
              '"prim.broadcast"', '"prim.sub"', '"prim.exp"',
              '"prim.reduce"', '{kind = "sum"}',
              '"prim.broadcast"', '"prim.div"',
              '"dispatch.yield"',
              'iteration = array<i64: 8, 16>, kind = "rows", split = "rows", work_items = 8',
              '"func.return"(%0)')
    assert r.pass_stats["form-dispatch-regions"] == {
        "fused-ops": 3, "fused-reductions": 1, "rows-regions": 1}


@pytest.mark.parametrize("name", ["layernorm", "rmsnorm"])
def test_a_normalization_is_one_rows_region(name):
    r = dispatch(graph(name), {0: (8, 4096)})
    (region,) = regions(r)
    assert region.kind == "rows" and region.iteration == (8, 4096)
    assert body_ops(region).count("prim.reduce") == (2 if name == "layernorm" else 1)
    # the scale (and shift) vectors are read through broadcasts inside the region
    assert [o.type.shape for o in region.operands][1:] == [(4096,)] * (
        2 if name == "layernorm" else 1)
    filecheck(r.product.text(), '"prim.reduce"', '"prim.rsqrt"', '"prim.broadcast"',
              '"dispatch.yield"', "NOT: semantic.")


@pytest.mark.parametrize("element", ["bf16", "f16"])
@pytest.mark.parametrize("name", ["layernorm", "rmsnorm", "residual_norm"])
def test_a_half_normalization_converts_its_parameters_in_the_row_kernel(name, element):
    """The tensor stage computes a half program in f32, casting each argument: the cast
    of a scale or shift vector is no launch of its own (an f32 copy the row kernel reads
    back) but the conversion at the row kernel's load of the half vector."""
    sm = graph(name, element)
    shapes = _shapes(sm, 6)
    r = dispatch(sm, shapes)
    (region,) = regions(r)
    assert region.kind == "rows"
    assert list(region.operands) == list(r.product.entry().body.args)
    assert body_ops(region, casts=True).count("prim.cast") >= len(region.operands)
    assert r.pass_stats["form-dispatch-regions"]["rows-regions"] == 1
    xs = [x.astype(np.float32) for x in _inputs(graph(name), shapes)]
    xs = [x.astype(numpy_dtype(t.element)) for x, t in
          zip(xs, sm.entry().function_type.inputs)]
    tensor = dispatch(sm, shapes, stage="tensor")
    for got, want in zip(run_reference(r.product.module, xs),
                         run_reference(tensor.product.module, xs), strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_cast_read_by_a_matmul_is_a_launch_of_its_own():
    """The fast matmul kernels read plain buffers: a cast of an argument that a matmul
    reads stays a region writing the converted operand (the cast an elementwise op
    also reads is then that region's output, not a second conversion)."""
    A, B, C = "tensor<16x32xbf16>", "tensor<16x32xf32>", "tensor<32x8xf32>"
    sm = program([A, C], ["tensor<16x8xf32>", B], f"""\
    %0 = "semantic.cast"(%a0) : ({A}) -> {B}
    %1 = "semantic.matmul"(%0, %a1) : ({B}, {C}) -> tensor<16x8xf32>
    %2 = "semantic.exp"(%0) : ({B}) -> {B}
    "func.return"(%1, %2) : (tensor<16x8xf32>, {B}) -> ()""")
    r = dispatch(sm)
    assert [g.kind for g in regions(r)] == ["elementwise", "matmul"]
    assert body_ops(regions(r)[0], casts=True) == ["prim.cast", "prim.exp"]


def test_bias_gelu_is_one_elementwise_region_reading_the_bias_through_an_index_map():
    r = dispatch(graph("bias_gelu"), {0: (8, 4096)})
    text = r.product.text()
    assert text.count('"dispatch.region"') == 1 and kinds(text) == ["elementwise"]
    filecheck(text,
              '"dispatch.region"(%arg0, %arg1)',
              '^bb0(%arg2: tensor<8x4096xf32>, %arg3: tensor<4096xf32>)',
              '"prim.broadcast"(%arg3) {dims = array<i64: 1>} : (tensor<4096xf32>) -> '
              'tensor<8x4096xf32>',
              '"prim.add"(%arg2, %1)', '"prim.erfc"', '"dispatch.yield"',
              'kind = "elementwise", split = "elements", work_items = 32768')
    # the broadcast is not a launch of its own: the function body is one region
    ops = [op.op_name for op in r.product.entry().body.ops]
    assert ops == ["dispatch.region", "func.return"]


def test_mlp_is_two_matmul_regions_with_their_epilogues():
    r = dispatch(graph("mlp"), {0: (8, 256)})
    assert [op.op_name for op in r.product.entry().body.ops] == [
        "dispatch.region", "dispatch.region", "func.return"]
    first, second = regions(r)
    assert (first.kind, second.kind) == ("matmul", "matmul")
    assert (first.iteration, first.contraction) == ((8, 1024), 256)
    assert (second.iteration, second.contraction) == ((8, 256), 1024)
    one = body_ops(first)
    assert one[0] == "prim.matmul" and one[1] == "prim.add" and "prim.sigmoid" in one
    assert one.count("prim.matmul") == 1 and "prim.reduce" not in one
    assert body_ops(second) == ["prim.matmul", "prim.add"]
    # the bias vectors are region inputs, broadcast inside
    assert [v.type.shape for v in first.operands] == [(8, 256), (256, 1024), (1024,)]
    assert second.operands[0] is first.results[0]
    assert [v.type.shape for v in second.operands][1:] == [(1024, 256), (256,)]


def test_unfused_attention_fuses_the_transpose_and_the_scale_into_the_first_matmul():
    r = dispatch(graph("attention"), {i: (2, 128, 64) for i in range(3)},
                 ["dispatch.fuse_attention=false"])
    text = r.product.text()
    assert kinds(text) == ["matmul", "rows", "matmul"]
    first, soft, last = regions(r)
    assert [op.op_name for op in first.body.ops] == [
        "prim.transpose", "prim.matmul", "prim.constant", "prim.broadcast", "prim.mul",
        "dispatch.yield"]
    filecheck(text,
              '"prim.transpose"(%arg4) {permutation = array<i64: 0, 2, 1>}',
              '"prim.matmul"(%arg3, %1)', '"prim.constant"() {value = dense<1.25e-01>',
              '"prim.mul"(%2, %4)', '"dispatch.yield"(%5)',
              'contraction = 64 : i64, iteration = array<i64: 2, 128, 128>, kind = "matmul"')
    assert text.count('"prim.transpose"') == 1  # no transpose outside the first region
    assert body_ops(soft).count("prim.reduce") == 2 and "prim.exp" in body_ops(soft)
    assert body_ops(last) == ["prim.matmul"]
    assert soft.operands[0] is first.results[0] and last.operands[0] is soft.results[0]


def test_elementwise_chain_graph_is_one_region():
    r = dispatch(graph("elementwise_chain"), {0: (6, 8), 1: (1, 8)})
    (region,) = regions(r)
    assert region.kind == "elementwise" and len(body_ops(region)) == 14


# ----------------------------------------------------------- fusion and its options


def test_a_chain_of_ten_elementwise_ops_is_one_region():
    r = dispatch(chain_program())
    (region,) = regions(r)
    assert body_ops(region) == [f"prim.{n}" for n in CHAIN]
    assert r.pass_stats["form-dispatch-regions"]["fused-ops"] == 9


@pytest.mark.parametrize("name,shapes", [
    ("softmax", {0: (8, 16)}), ("layernorm", {0: (4, 4096)}), ("mlp", {0: (8, 256)}),
    ("attention", {i: (2, 128, 64) for i in range(3)}), ("all_ops", {}),
    ("residual_norm", {0: (4, 1024), 1: (4, 1024)}),
])
def test_without_fusion_every_non_index_op_is_its_own_region(name, shapes):
    sm = graph(name)
    tensor = dispatch(sm, shapes, stage="tensor").product
    launches = [op for op in tensor.entry().body.ops
                if op.op_name not in FREE + ("prim.reshape", "func.return")]
    r = dispatch(sm, shapes, ["dispatch.fuse=false"])
    stats = r.pass_stats["form-dispatch-regions"]
    regs = [g for g in regions(r) if body_ops(g, casts=True)]  # returned views' copies out
    assert len(regions(r)) == len(regs) + stats.get("result-copies", 0)
    assert all(len(body_ops(g, casts=True)) == 1 for g in regs)
    assert [body_ops(g, casts=True)[0] for g in regs] == [op.op_name for op in launches]
    assert "fused-ops" not in stats


@pytest.mark.parametrize("limit,sizes", [(1, [1] * 10), (3, [3, 3, 3, 1]), (4, [4, 4, 2]),
                                         (10, [10]), (128, [10])])
def test_max_region_ops_bounds_every_region(limit, sizes):
    r = dispatch(chain_program(), opts=[f"dispatch.max_region_ops={limit}"])
    assert [len(body_ops(g)) for g in regions(r)] == sizes


def test_max_region_ops_bounds_the_regions_of_every_graph():
    for path in GRAPHS:
        sm = SemanticModule.from_file(str(path))
        r = dispatch(sm, _shapes(sm, 8), ["dispatch.max_region_ops=2"])
        assert all(len(body_ops(g)) <= 2 for g in regions(r)), path.stem


def test_returning_an_argument_gets_a_copy_region():
    sm = program([T], [T], f'    "func.return"(%a0) : ({T}) -> ()')
    r = dispatch(sm)
    filecheck(r.product.text(),
              '%0 = "dispatch.region"(%arg0)', '"dispatch.yield"(%arg1)',
              'kind = "elementwise"', '"func.return"(%0)')
    assert r.pass_stats["form-dispatch-regions"] == {"result-copies": 1,
                                                     "elementwise-regions": 1}
    assert r.pass_stats["materialize-results"] == {"results": 1}


def test_returning_a_value_twice_gives_two_distinct_region_outputs():
    sm = program([T], [T, T, T], f"""\
    %0 = "semantic.exp"(%a0) : ({T}) -> {T}
    "func.return"(%0, %0, %a0) : ({T}, {T}, {T}) -> ()""")
    r = dispatch(sm)
    ret = r.product.entry().return_op.operands
    assert len(set(ret)) == 3
    assert all(isinstance(v.op, RegionOp) for v in ret)
    assert [body_ops(g) for g in regions(r)] == [["prim.exp"], [], []]
    assert r.pass_stats["form-dispatch-regions"]["result-copies"] == 2


def test_materialize_results_rejects_a_result_that_is_not_a_distinct_region_output():
    from accy.choir.passes import PassManager
    from accy.errors import PassFailedError
    from accy.preparation.passes.dispatch import MaterializeResults

    sm = program([T], [T], f'    "func.return"(%a0) : ({T}) -> ()')
    module = dispatch(sm, stage="tensor").product.clone_module()
    with pytest.raises(PassFailedError, match="not a distinct dispatch output") as info:
        PassManager("dispatch", (MaterializeResults(),)).run(module)
    assert "p.mlir:4:5" in str(info.value.__cause__)


def test_a_value_used_inside_a_region_and_returned_is_a_region_output():
    sm = program([T], [T, T], f"""\
    %0 = "semantic.exp"(%a0) : ({T}) -> {T}
    %1 = "semantic.neg"(%0) : ({T}) -> {T}
    %2 = "semantic.abs"(%1) : ({T}) -> {T}
    "func.return"(%2, %0) : ({T}, {T}) -> ()""")
    r = dispatch(sm)
    filecheck(r.product.text(),
              '%0:2 = "dispatch.region"(%arg0)',
              '%1 = "prim.exp"(%arg1)', '%2 = "prim.neg"(%1)', '%3 = "prim.abs"(%2)',
              '"dispatch.yield"(%1, %3)',
              '"func.return"(%0#1, %0#0)', "NOT: %2, %3")
    assert "result-copies" not in r.pass_stats["form-dispatch-regions"]


def test_a_row_statistic_that_is_returned_is_an_output_of_the_rows_region():
    sm = graph("dynamic")
    r = dispatch(sm, {0: (6, 8), 1: (8,)})
    (region,) = regions(r)
    assert region.kind == "rows"
    assert [tuple(t.shape) for t in region.result_types] == [(6, 1), (6, 8)]


def test_a_reshape_stays_between_regions():
    sm = program([T], ["tensor<8x4xf32>"], f"""\
    %0 = "semantic.exp"(%a0) : ({T}) -> {T}
    %1 = "semantic.reshape"(%0) : ({T}) -> tensor<8x4xf32>
    %2 = "semantic.neg"(%1) : (tensor<8x4xf32>) -> tensor<8x4xf32>
    "func.return"(%2) : (tensor<8x4xf32>) -> ()""")
    r = dispatch(sm)
    ops = r.product.entry().body.ops
    assert [op.op_name for op in ops] == ["dispatch.region", "prim.reshape",
                                          "dispatch.region", "func.return"]
    assert ops[1].operands[0] is ops[0].results[0]
    assert ops[2].operands[0] is ops[1].results[0]


def test_a_returned_reshape_is_a_view_of_its_region_output_not_a_copy():
    sm = program([T], ["tensor<8x4xf32>"], f"""\
    %0 = "semantic.exp"(%a0) : ({T}) -> {T}
    %1 = "semantic.reshape"(%0) : ({T}) -> tensor<8x4xf32>
    "func.return"(%1) : (tensor<8x4xf32>) -> ()""")
    r = dispatch(sm)
    ops = r.product.entry().body.ops
    assert [op.op_name for op in ops] == ["dispatch.region", "prim.reshape", "func.return"]
    assert ops[2].operands[0] is ops[1].results[0]
    assert ops[1].operands[0] is ops[0].results[0]
    assert "result-copies" not in r.pass_stats["form-dispatch-regions"]
    assert r.pass_stats["materialize-results"] == {"result-views": 1, "results": 1}


def test_a_region_output_returned_and_viewed_or_viewed_twice_gets_one_copy():
    R, F = "tensor<8x4xf32>", "tensor<32xf32>"
    for returned, second in (("%1, %0", T), ("%1, %2", F)):
        sm = program([T], [R, second], f"""\
    %0 = "semantic.exp"(%a0) : ({T}) -> {T}
    %1 = "semantic.reshape"(%0) : ({T}) -> {R}
    %2 = "semantic.reshape"(%0) : ({T}) -> {F}
    "func.return"({returned}) : ({R}, {second}) -> ()""")
        r = dispatch(sm)
        assert r.pass_stats["form-dispatch-regions"]["result-copies"] == 1, returned
        assert [body_ops(g) for g in regions(r)] == [["prim.exp"], []], returned
        x = np.arange(32, dtype=np.float32).reshape(4, 8) / 32
        for got, want in zip(run_reference(r.product.module, [x]),
                             run_reference(sm.module, [x]), strict=True):
            np.testing.assert_array_equal(got, want)


def test_a_consumer_reading_its_producer_through_a_reshape_is_not_fused_into_it():
    # %3 reads %0 directly and through reshape + transpose: the reshape is a view of
    # %0's buffer, so %3 cannot sit in %0's region (that region would read itself).
    R = "tensor<8x4xf32>"
    sm = program([T], [T], f"""\
    %0 = "semantic.exp"(%a0) : ({T}) -> {T}
    %1 = "semantic.reshape"(%0) : ({T}) -> {R}
    %2 = "semantic.transpose"(%1) {{permutation = array<i64: 1, 0>}} : ({R}) -> {T}
    %3 = "semantic.add"(%0, %2) : ({T}, {T}) -> {T}
    "func.return"(%3) : ({T}) -> ()""")
    r = dispatch(sm)
    assert [op.op_name for op in r.product.entry().body.ops] == [
        "dispatch.region", "prim.reshape", "dispatch.region", "func.return"]
    x = np.arange(32, dtype=np.float32).reshape(4, 8) / 32
    np.testing.assert_array_equal(run_reference(r.product.module, [x])[0],
                                  run_reference(sm.module, [x])[0])


def test_an_index_map_feeding_a_reshape_gets_its_own_region():
    sm = program(["tensor<8x4xf32>"], ["tensor<32xf32>"], """\
    %0 = "semantic.transpose"(%a0) {permutation = array<i64: 1, 0>} : (tensor<8x4xf32>) -> tensor<4x8xf32>
    %1 = "semantic.reshape"(%0) : (tensor<4x8xf32>) -> tensor<32xf32>
    %2 = "semantic.exp"(%1) : (tensor<32xf32>) -> tensor<32xf32>
    "func.return"(%2) : (tensor<32xf32>) -> ()""")
    r = dispatch(sm)
    ops = r.product.entry().body.ops
    assert [op.op_name for op in ops] == ["dispatch.region", "prim.reshape",
                                          "dispatch.region", "func.return"]
    assert [op.op_name for op in ops[0].body.ops] == ["prim.transpose", "dispatch.yield"]
    x = np.arange(32, dtype=np.float32).reshape(8, 4) / 32
    np.testing.assert_array_equal(run_reference(r.product.module, [x])[0],
                                  run_reference(sm.module, [x])[0])


def test_regions_are_in_dependency_order_and_verify():
    r = dispatch(graph("all_ops"))
    r.product.verify()
    defined = set(r.product.entry().body.args)
    for op in r.product.entry().body.ops:
        assert all(v in defined for v in op.operands), op.op_name
        defined.update(op.results)


# ------------------------------------------------------- elementwise DAGs fuse whole


DAG = f"""\
    %0 = "semantic.exp"(%a0) : ({T}) -> {T}
    %1 = "semantic.neg"(%0) : ({T}) -> {T}
    %2 = "semantic.sin"(%a1) : ({T}) -> {T}
    %3 = "semantic.mul"(%0, %2) : ({T}, {T}) -> {T}
    %4 = "semantic.add"(%1, %3) : ({T}, {T}) -> {T}
    %5 = "semantic.tanh"(%a0) : ({T}) -> {T}
    %6 = "semantic.mul"(%4, %5) : ({T}, {T}) -> {T}"""
"""Fan-out (%0 read twice, %a0 read by two chains), fan-in (%4, %6), two inputs."""


def _host_run(sm: SemanticModule, shapes=None, seed: int = 0) -> None:
    """Through all six stages, compiled and run on the host: equal to the reference."""
    from accy.executable.cache import FragmentCompilerCache

    shapes = shapes or {}
    xs = _inputs(sm, {i: shapes.get(i, tuple(t.shape)) for i, t in
                      enumerate(sm.entry().function_type.inputs)}, seed)
    update = FragmentCompilerCache().refresh_from_semantic_module(
        sm, PreparationRequest(options=RunOptions.parse("host"), shapes=shapes))
    got = update.fragment(*xs)
    want = run_reference(sm.module, xs)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g, np.float64), w.astype(np.float64),
                                   rtol=2e-6, atol=2e-6)


def test_gelu_tanh_is_one_elementwise_region_computing_x_cubed_once():
    sm = graph("gelu_tanh")
    r = dispatch(sm, {0: (8, 4096)})
    (region,) = regions(r)
    assert region.kind == "elementwise" and region.operands[0] is r.product.entry().body.args[0]
    tensor = dispatch(sm, {0: (8, 4096)}, stage="tensor").product
    launches = sorted(op.op_name for op in tensor.entry().body.ops
                      if op.op_name not in FREE + ("func.return",))
    assert sorted(body_ops(region)) == launches  # every prim op exactly once
    assert len(region.results) == 1
    assert r.pass_stats["form-dispatch-regions"]["elementwise-regions"] == 1
    _host_run(sm, {0: (5, 4096)})


@pytest.mark.parametrize("results", [["%6"], ["%6", "%0"], ["%4", "%6", "%2"]])
def test_a_fan_out_fan_in_dag_is_one_region_and_each_value_is_computed_once(results):
    sm = program([T, T], [T] * len(results), DAG + f"""
    "func.return"({", ".join(results)}) : ({", ".join([T] * len(results))}) -> ()""")
    r = dispatch(sm)
    (region,) = regions(r)
    assert sorted(body_ops(region)) == sorted(
        f"prim.{n}" for n in ("exp", "neg", "sin", "mul", "add", "tanh", "mul"))
    assert len(region.results) == len(results)  # only what is returned leaves the region
    # the host C computes exp(%a0) once for its two readers
    target = dispatch(sm, stage="target").product.source
    assert target.count("expf(") == 1 and target.count("sinf(") == 1
    _host_run(sm)


def test_ops_sharing_only_an_input_are_one_region():
    sm = program([T], [T, T, T], f"""\
    %0 = "semantic.exp"(%a0) : ({T}) -> {T}
    %1 = "semantic.log"(%a0) : ({T}) -> {T}
    %2 = "semantic.abs"(%a0) : ({T}) -> {T}
    "func.return"(%0, %1, %2) : ({T}, {T}, {T}) -> ()""")
    r = dispatch(sm)
    (region,) = regions(r)
    assert body_ops(region) == ["prim.exp", "prim.log", "prim.abs"]
    assert list(region.operands) == [r.product.entry().body.args[0]] and len(region.results) == 3
    assert r.pass_stats["form-dispatch-regions"]["fused-siblings"] == 2


def test_a_reduction_of_a_prologue_joins_a_sibling_row_reduction_of_its_input():
    """sum(x), sum(cast(x)) and max(exp(cast(x))) over the same rows: one row region
    reading x once (the exp prologue moves into the sibling's group; the cast is the
    conversion at x's load), three outputs."""
    B = "tensor<4x8xbf16>"
    sm = program([B], ["tensor<4xbf16>", "tensor<4xf32>", "tensor<4xf32>"], f"""\
    %0 = "semantic.reduce_sum"(%a0) {{axes = array<i64: 1>, keepdims = false}} : ({B}) -> tensor<4xbf16>
    %1 = "semantic.cast"(%a0) : ({B}) -> {T}
    %2 = "semantic.reduce_sum"(%1) {{axes = array<i64: 1>, keepdims = false}} : ({T}) -> tensor<4xf32>
    %3 = "semantic.exp"(%1) : ({T}) -> {T}
    %4 = "semantic.reduce_max"(%3) {{axes = array<i64: 1>, keepdims = false}} : ({T}) -> tensor<4xf32>
    "func.return"(%0, %2, %4) : (tensor<4xbf16>, tensor<4xf32>, tensor<4xf32>) -> ()""")
    r = dispatch(sm)
    (region,) = regions(r)
    assert region.kind == "rows" and list(region.operands) == [r.product.entry().body.args[0]]
    assert body_ops(region) == ["prim.reduce", "prim.reduce", "prim.exp", "prim.reduce"]
    assert body_ops(region, casts=True).count("prim.cast") == 1
    stats = r.pass_stats["form-dispatch-regions"]
    assert stats["fused-sibling-prologues"] == 1 and stats["rows-regions"] == 1
    x = np.random.default_rng(2).standard_normal((4, 8)).astype(np.float32)
    for got, want in zip(run_reference(r.product.module, [x]), run_reference(sm.module, [x]),
                         strict=True):
        np.testing.assert_array_equal(got, want)
    _host_run(sm)


def test_a_prologue_reading_the_sibling_row_groups_output_does_not_join_it():
    """y = x + sum(x) (the row sums read through their reshape and a broadcast along
    the rows: not row-local, so y is a group of its own) and max(y): y's group reads
    the row group's output through the reshape, so moving it there would make that
    region read its own output."""
    S = "tensor<8x8xf32>"
    sm = program([S], ["tensor<8xf32>", "tensor<8xf32>"], f"""\
    %0 = "semantic.reduce_sum"(%a0) {{axes = array<i64: 1>, keepdims = false}} : ({S}) -> tensor<8xf32>
    %1 = "semantic.add"(%a0, %0) : ({S}, tensor<8xf32>) -> {S}
    %2 = "semantic.reduce_max"(%1) {{axes = array<i64: 1>, keepdims = false}} : ({S}) -> tensor<8xf32>
    "func.return"(%0, %2) : (tensor<8xf32>, tensor<8xf32>) -> ()""")
    r = dispatch(sm)
    first, second = regions(r)
    assert (first.kind, second.kind) == ("rows", "rows")
    assert body_ops(first) == ["prim.reduce"]
    assert body_ops(second) == ["prim.add", "prim.reduce"]
    assert "fused-sibling-prologues" not in r.pass_stats["form-dispatch-regions"]
    _host_run(sm)


def test_a_merge_that_would_make_a_cycle_through_a_matmul_is_refused():
    # %0 feeds the matmul %1 and, directly, %4 — which also reads the matmul through
    # a transpose (so %4 cannot be its epilogue). Putting %0 and %4 in one region
    # would make it read itself through the matmul: three regions, in order.
    S = "tensor<8x8xf32>"
    sm = program([S, S], [S], f"""\
    %0 = "semantic.exp"(%a0) : ({S}) -> {S}
    %1 = "semantic.matmul"(%0, %a1) : ({S}, {S}) -> {S}
    %2 = "semantic.neg"(%0) : ({S}) -> {S}
    %t = "semantic.transpose"(%1) {{permutation = array<i64: 1, 0>}} : ({S}) -> {S}
    %4 = "semantic.mul"(%2, %t) : ({S}, {S}) -> {S}
    %5 = "semantic.add"(%4, %0) : ({S}, {S}) -> {S}
    "func.return"(%5) : ({S}) -> ()""")
    r = dispatch(sm)
    first, mm, last = regions(r)
    assert (first.kind, mm.kind, last.kind) == ("elementwise", "matmul", "elementwise")
    assert body_ops(first) == ["prim.exp", "prim.neg"]
    assert body_ops(last) == ["prim.mul", "prim.add"]  # %0 is materialized, read by both
    assert len(first.results) == 2 and mm.operands[0] is first.results[0]
    assert set(last.operands) == {first.results[0], first.results[1], mm.results[0]}
    _host_run(sm)


def test_a_merge_that_would_make_a_cycle_through_a_reshape_is_refused():
    # A = exp(x); B reads A through a reshape (another shape); C reads A and B:
    # A and C cannot be one region, since B sits between them.
    R = "tensor<8x4xf32>"
    sm = program([T], [T], f"""\
    %0 = "semantic.exp"(%a0) : ({T}) -> {T}
    %1 = "semantic.reshape"(%0) : ({T}) -> {R}
    %2 = "semantic.neg"(%1) : ({R}) -> {R}
    %3 = "semantic.reshape"(%2) : ({R}) -> {T}
    %4 = "semantic.tanh"(%a0) : ({T}) -> {T}
    %5 = "semantic.mul"(%4, %3) : ({T}, {T}) -> {T}
    %6 = "semantic.add"(%5, %0) : ({T}, {T}) -> {T}
    "func.return"(%6) : ({T}) -> ()""")
    r = dispatch(sm)
    ops = [op.op_name for op in r.product.entry().body.ops]
    assert ops == ["dispatch.region", "prim.reshape", "dispatch.region", "prim.reshape",
                   "dispatch.region", "func.return"]
    first, _, last = regions(r)
    # tanh(%a0) joins exp as its sibling; the ops reading the reshaped value cannot
    # join (or be merged with) that region: it would read itself through the reshapes
    assert body_ops(first) == ["prim.exp", "prim.tanh"]
    assert body_ops(last) == ["prim.mul", "prim.add"]
    assert r.pass_stats["form-dispatch-regions"].get("merged-groups", 0) == 0
    _host_run(sm)


def test_a_dag_fuses_only_up_to_max_region_ops():
    sm = program([T, T], [T], DAG + f"""
    "func.return"(%6) : ({T}) -> ()""")
    r = dispatch(sm, opts=["dispatch.max_region_ops=3"])
    assert all(len(body_ops(g)) <= 3 for g in regions(r))
    assert sum(len(body_ops(g)) for g in regions(r)) == 7
    x = [np.random.default_rng(3).standard_normal((4, 8)).astype(np.float32) for _ in range(2)]
    np.testing.assert_allclose(run_reference(r.product.module, x)[0],
                               run_reference(sm.module, x)[0], rtol=1e-6)


# -------------------------------------------------- the reference answer is kept


def _shapes(sm: SemanticModule, size: int) -> dict[int, tuple[int, ...]]:
    out = {}
    for i, t in enumerate(sm.entry().function_type.inputs):
        assert isinstance(t, TensorType)
        out[i] = tuple(size if d is None else d for d in t.shape)
    return out


def _inputs(sm: SemanticModule, shapes, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    xs = []
    for i, t in enumerate(sm.entry().function_type.inputs):
        xs.append(rng.standard_normal(shapes[i]).astype(numpy_dtype(t.element)))
    return xs


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize("size", [6, 8])
@pytest.mark.parametrize("path", GRAPHS, ids=[p.stem for p in GRAPHS])
def test_dispatch_output_keeps_the_reference_answer(path, size, fuse):
    sm = SemanticModule.from_file(str(path))
    shapes = _shapes(sm, size)
    xs = _inputs(sm, shapes, seed=size)
    opts = RunOptions.parse("host", {"dispatch.fuse": fuse})
    tensor = prepare_through(sm, "tensor", opts, shapes)
    out = run_stage("dispatch", tensor.product, PreparationRequest(options=opts,
                                                                   shapes=shapes))
    assert regions(out)
    want = run_reference(sm.module, xs)
    lowered = run_reference(tensor.product.module, xs)
    got = run_reference(out.product.module, xs)
    assert len(got) == len(want)
    for g, lo, w in zip(got, lowered, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, lo)  # the regions run the very same prim ops
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- plan fingerprint


def test_plan_fingerprint_is_16_hex_and_stable():
    a = dispatch(graph("softmax"), {0: (8, 16)})
    b = dispatch(graph("softmax"), {0: (8, 16)})
    assert re.fullmatch(r"[0-9a-f]{16}", a.plan_fingerprint)
    assert a.plan_fingerprint == b.plan_fingerprint
    assert dispatch(graph("softmax"), {0: (8, 16)}, stage="tensor").plan_fingerprint is None


def test_plan_fingerprint_changes_with_the_fusion():
    sm = chain_program()
    seen = {dispatch(sm, opts=o).plan_fingerprint for o in (
        [], ["dispatch.fuse=false"], ["dispatch.max_region_ops=4"],
        ["dispatch.max_region_ops=3"])}
    assert len(seen) == 4
    soft = graph("softmax")
    assert dispatch(soft, {0: (8, 16)}).plan_fingerprint != \
        dispatch(soft, {0: (8, 16)}, ["dispatch.fuse=false"]).plan_fingerprint


def test_plan_fingerprint_does_not_change_when_the_fusion_does_not():
    sm = chain_program()
    assert dispatch(sm).plan_fingerprint == \
        dispatch(sm, opts=["dispatch.max_region_ops=10"]).plan_fingerprint


def test_plan_fingerprint_changes_when_only_the_split_point_moves():
    # same kinds, iteration spaces and region count: only what each region holds differs
    sm = chain_program()
    five = dispatch(sm, opts=["dispatch.max_region_ops=5"])
    six = dispatch(sm, opts=["dispatch.max_region_ops=6"])
    assert [len(body_ops(g)) for g in regions(five)] != [len(body_ops(g)) for g in regions(six)]
    assert five.plan_fingerprint != six.plan_fingerprint


@pytest.mark.parametrize("shape", [(64, 48), (64, 64)])
def test_a_column_softmax_is_one_row_region_storing_through_the_transpose(shape):
    """softmax over axis 0: the row group (rows = columns) stores its result through
    the permutation; no copy region transposes it back. Square shapes too (where the
    transposed result has the iteration's shape). Compiled for the host and compared."""
    from accy.executable.cache import FragmentCompilerCache

    sm = graph("softmax_axis0")
    result = dispatch(sm, {0: shape})
    (region,) = regions(result)
    assert region.kind == "rows"
    (out,) = region.body.terminator.operands
    assert out.op.op_name == "prim.transpose"
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    update = FragmentCompilerCache().refresh_from_semantic_module(
        graph("softmax_axis0"), PreparationRequest(options=RunOptions(), shapes={0: shape}))
    (y,) = update.fragment(x)
    np.testing.assert_allclose(y, run_reference(graph("softmax_axis0").module, [x])[0],
                               rtol=1e-5, atol=1e-7)
