"""Contract stage passes: specialize-shapes, simplify, fold-constants, cse, dce."""

from __future__ import annotations

import json

import numpy as np
import pytest
from stage_programs import filecheck, program_text

from accy.choir.parser import parse_module
from accy.choir.passes import PASS_REGISTRY, PassContext, PassManager, replay
from accy.choir.printer import print_op
from accy.errors import PassFailedError, VerifyError
from accy.preparation.passes.contract import CSE, DCE, FoldConstants, Simplify, SpecializeShapes
from accy.reference import run_reference


def program(args: list[str], results: list[str], body: str, file: str = "c.mlir"):
    """A parsed module whose ``main`` takes ``args``; ``body`` starts on line 4."""
    return parse_module(program_text(args, results, body), file)

def run(module, *passes):
    return PassManager("contract", passes).run(module)




def ops(module) -> list[str]:
    return [op.op_name for op in module.entry().body.ops]


# ------------------------------------------------------------- specialize-shapes

DYN = """\
    %0 = "semantic.add"(%a0, %a1) : (tensor<?x4xf32>, tensor<4xf32>) -> tensor<?x4xf32>
    %1 = "semantic.reduce_sum"(%0) {axes = array<i64: 1>, keepdims = true} : (tensor<?x4xf32>) -> tensor<?x1xf32>
    %2 = "semantic.div"(%0, %1) : (tensor<?x4xf32>, tensor<?x1xf32>) -> tensor<?x?xf32>
    "func.return"(%2, %1) : (tensor<?x?xf32>, tensor<?x1xf32>) -> ()"""


def test_specialize_shapes_makes_the_function_static():
    m = program(["tensor<?x4xf32>", "tensor<4xf32>"], ["tensor<?x?xf32>", "tensor<?x1xf32>"],
                DYN)
    result = run(m, SpecializeShapes(((0, (8, 4)),)))
    text = print_op(m)
    filecheck(text,
              "function_type = (tensor<8x4xf32>, tensor<4xf32>) -> (tensor<8x4xf32>, "
              "tensor<8x1xf32>)",
              '"semantic.add"(%arg0, %arg1) : (tensor<8x4xf32>, tensor<4xf32>) -> tensor<8x4xf32>',
              "-> tensor<8x1xf32>",
              '"semantic.div"(%0, %1) : (tensor<8x4xf32>, tensor<8x1xf32>) -> tensor<8x4xf32>',
              "NOT: ?")
    assert result.stats["specialize-shapes"] == {"bound-args": 1, "refined-types": 3}


def test_specialize_shapes_without_bindings_refines_what_it_can():
    m = program(["tensor<3x4xf32>"], ["tensor<?x?xf32>"], """\
    %0 = "semantic.exp"(%a0) : (tensor<3x4xf32>) -> tensor<?x?xf32>
    "func.return"(%0) : (tensor<?x?xf32>) -> ()""")
    run(m, SpecializeShapes())
    assert str(m.entry().function_type) == "(tensor<3x4xf32>) -> tensor<3x4xf32>"
    m = program(["tensor<?x4xf32>", "tensor<4xf32>"], ["tensor<?x?xf32>", "tensor<?x1xf32>"],
                DYN)
    run(m, SpecializeShapes())  # check mode: unbound ? dims stay
    assert str(m.entry().function_type) == \
        "(tensor<?x4xf32>, tensor<4xf32>) -> (tensor<?x4xf32>, tensor<?x1xf32>)"


@pytest.mark.parametrize("shapes,message", [
    (((0, (8,)),), "argument 0 of 'main' is tensor<?x4xf32> (rank 2) but the bound shape 8 "
                   "has rank 1"),
    (((0, (8, 5)),), "argument 0 of 'main' is tensor<?x4xf32>; the bound shape 8x5 disagrees "
                     "with its static dims"),
    (((2, (8, 4)),), "--shape arg2=8x4: function 'main' has 2 arguments"),
])
def test_specialize_shapes_rejects_bad_bindings_at_the_function(shapes, message):
    m = program(["tensor<?x4xf32>", "tensor<4xf32>"], ["tensor<?x?xf32>", "tensor<?x1xf32>"],
                DYN, "dyn.mlir")
    with pytest.raises(VerifyError) as info:
        SpecializeShapes(shapes).apply(PassContext(), m)
    assert str(info.value) == f"dyn.mlir:2:3: error: {message}"


def test_declared_type_that_disagrees_after_binding_is_an_error_at_the_op():
    m = program(["tensor<?x4xf32>"], ["tensor<8x4xf32>"], """\
    %0 = "semantic.exp"(%a0) : (tensor<?x4xf32>) -> tensor<?x4xf32>
    %1 = "semantic.neg"(%0) : (tensor<?x4xf32>) -> tensor<8x4xf32>
    "func.return"(%1) : (tensor<8x4xf32>) -> ()""", "d.mlir")
    with pytest.raises(PassFailedError) as info:
        run(m, SpecializeShapes(((0, (3, 4)),)))
    cause = info.value.__cause__
    assert isinstance(cause, VerifyError)
    assert str(cause) == ("d.mlir:5:5: error: 'semantic.neg': declared type tensor<8x4xf32> "
                          "disagrees with inferred tensor<3x4xf32>")
    assert info.value.reproducer.location == "d.mlir:5:5"


def test_binding_that_breaks_broadcasting_is_an_error_at_the_op():
    m = program(["tensor<?xf32>", "tensor<?x4xf32>"], ["tensor<?x4xf32>"], """\
    %0 = "semantic.add"(%a1, %a0) : (tensor<?x4xf32>, tensor<?xf32>) -> tensor<?x4xf32>
    "func.return"(%0) : (tensor<?x4xf32>) -> ()""", "b.mlir")
    with pytest.raises(VerifyError) as info:
        SpecializeShapes(((0, (5,)),)).apply(PassContext(), m)
    assert str(info.value).startswith("b.mlir:4:5: error: 'semantic.add' operands do not "
                                      "broadcast")


def test_specialize_shapes_options_rebuild_from_json_and_mappings():
    p = SpecializeShapes(((1, (4,)), (0, (8, 4))))
    assert p.shapes == ((0, (8, 4)), (1, (4,)))
    again = PASS_REGISTRY[p.name](**json.loads(json.dumps(p.options())))
    assert again == p and hash(again) == hash(p)
    assert SpecializeShapes({0: (8, 4), 1: [4]}) == p  # type: ignore[arg-type]
    with pytest.raises(VerifyError):
        SpecializeShapes(((0, (8,)), (0, (9,))))


def test_failed_specialization_replays_from_its_reproducer():
    m = program(["tensor<?x4xf32>", "tensor<4xf32>"], ["tensor<?x?xf32>", "tensor<?x1xf32>"],
                DYN)
    with pytest.raises(PassFailedError) as info:
        run(m, SpecializeShapes(((0, (8, 5)),)))
    repro = info.value.reproducer
    assert repro.pass_name == "specialize-shapes"
    with pytest.raises(PassFailedError, match="disagrees with its static dims"):
        replay(repro)


# ------------------------------------------------------------------ fold-constants


def test_fold_makes_a_constant_expression_one_constant():
    m = program([], ["tensor<2x3xf32>"], """\
    %c0 = "semantic.constant"() {value = dense<[1.0, 2.0, 3.0]> : tensor<3xf32>} : () -> tensor<3xf32>
    %c1 = "semantic.constant"() {value = dense<[[1.0], [2.0]]> : tensor<2x1xf32>} : () -> tensor<2x1xf32>
    %0 = "semantic.mul"(%c0, %c1) : (tensor<3xf32>, tensor<2x1xf32>) -> tensor<2x3xf32>
    %1 = "semantic.exp"(%0) : (tensor<2x3xf32>) -> tensor<2x3xf32>
    "func.return"(%1) : (tensor<2x3xf32>) -> ()""")
    want = run_reference(m, [])[0]
    stats = run(m, FoldConstants(), DCE()).stats
    assert stats["fold-constants"] == {"folded": 2}
    assert ops(m) == ["semantic.constant", "func.return"]
    np.testing.assert_array_equal(run_reference(m, [])[0], want)


def test_fold_respects_max_elements_and_leaves_non_constants():
    body = """\
    %c0 = "semantic.constant"() {value = dense<2.0> : tensor<64xf32>} : () -> tensor<64xf32>
    %0 = "semantic.exp"(%c0) : (tensor<64xf32>) -> tensor<64xf32>
    %1 = "semantic.add"(%0, %a0) : (tensor<64xf32>, tensor<64xf32>) -> tensor<64xf32>
    "func.return"(%1) : (tensor<64xf32>) -> ()"""
    m = program(["tensor<64xf32>"], ["tensor<64xf32>"], body)
    run(m, FoldConstants(max_elements=63))
    assert "semantic.exp" in ops(m)
    m = program(["tensor<64xf32>"], ["tensor<64xf32>"], body)
    run(m, FoldConstants(max_elements=64), DCE())
    assert ops(m) == ["semantic.constant", "semantic.add", "func.return"]
    filecheck(print_op(m), "dense<7.389056", ": tensor<64xf32>")  # a splat stays a splat


def test_fold_uses_the_reference_numerics_for_integers_and_casts():
    m = program([], ["tensor<3xi32>", "tensor<3xf16>"], """\
    %c0 = "semantic.constant"() {value = dense<[7, -7, 5]> : tensor<3xi32>} : () -> tensor<3xi32>
    %c1 = "semantic.constant"() {value = dense<[2, 2, 0]> : tensor<3xi32>} : () -> tensor<3xi32>
    %0 = "semantic.div"(%c0, %c1) : (tensor<3xi32>, tensor<3xi32>) -> tensor<3xi32>
    %1 = "semantic.cast"(%0) : (tensor<3xi32>) -> tensor<3xf16>
    "func.return"(%0, %1) : (tensor<3xi32>, tensor<3xf16>) -> ()""")
    run(m, FoldConstants(), DCE())
    filecheck(print_op(m), "dense<[3, -3, 0]> : tensor<3xi32>",
              "dense<[3.0e+00, -3.0e+00, 0.0e+00]> : tensor<3xf16>")


# ----------------------------------------------------------------------- simplify

SIMPLE = [
    # (arguments, result type, body ops, the returned value after simplify)
    ('"semantic.add"(%a0, %z) : (tensor<4xf32>, tensor<f32>) -> tensor<4xf32>', "%a0"),
    ('"semantic.add"(%z, %a0) : (tensor<f32>, tensor<4xf32>) -> tensor<4xf32>', "%a0"),
    ('"semantic.sub"(%a0, %z) : (tensor<4xf32>, tensor<f32>) -> tensor<4xf32>', "%a0"),
    ('"semantic.mul"(%a0, %o) : (tensor<4xf32>, tensor<f32>) -> tensor<4xf32>', "%a0"),
    ('"semantic.mul"(%o, %a0) : (tensor<f32>, tensor<4xf32>) -> tensor<4xf32>', "%a0"),
    ('"semantic.div"(%a0, %o) : (tensor<4xf32>, tensor<f32>) -> tensor<4xf32>', "%a0"),
    ('"semantic.cast"(%a0) : (tensor<4xf32>) -> tensor<4xf32>', "%a0"),
    ('"semantic.reshape"(%a0) : (tensor<4xf32>) -> tensor<4xf32>', "%a0"),
    ('"semantic.broadcast_to"(%a0) : (tensor<4xf32>) -> tensor<4xf32>', "%a0"),
    ('"semantic.transpose"(%a0) {permutation = array<i64: 0>} : (tensor<4xf32>) -> '
     'tensor<4xf32>', "%a0"),
    # not identities: x*0, x-0 on the left, a broadcasting add, x/0
    ('"semantic.mul"(%a0, %z) : (tensor<4xf32>, tensor<f32>) -> tensor<4xf32>', None),
    ('"semantic.sub"(%z, %a0) : (tensor<f32>, tensor<4xf32>) -> tensor<4xf32>', None),
    ('"semantic.add"(%a0, %zz) : (tensor<4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>', None),
    ('"semantic.div"(%o, %a0) : (tensor<f32>, tensor<4xf32>) -> tensor<4xf32>', None),
]


@pytest.mark.parametrize("line,expect", SIMPLE, ids=[s[0][1:22] + str(i)
                                                     for i, s in enumerate(SIMPLE)])
def test_simplify_identities(line, expect):
    result = line.rsplit("-> ", 1)[1]
    m = program(["tensor<4xf32>"], [result], f"""\
    %z = "semantic.constant"() {{value = dense<0.0> : tensor<f32>}} : () -> tensor<f32>
    %zz = "semantic.constant"() {{value = dense<0.0> : tensor<2x4xf32>}} : () -> tensor<2x4xf32>
    %o = "semantic.constant"() {{value = dense<1.0> : tensor<f32>}} : () -> tensor<f32>
    %r = {line}
    "func.return"(%r) : ({result}) -> ()""")
    run(m, Simplify(), DCE())
    ret = m.entry().return_op.operands[0]
    if expect == "%a0":
        assert ret is m.entry().body.args[0]
        assert ops(m) == ["func.return"]
    else:
        assert ret is not m.entry().body.args[0]


def test_simplify_chains_of_layout_and_unary_ops():
    m = program(["tensor<2x3x4xf32>"], ["tensor<4x6xf32>", "tensor<4x3x2xf32>",
                                       "tensor<2x3x4xf32>", "tensor<2x3x4xf32>"], """\
    %0 = "semantic.reshape"(%a0) : (tensor<2x3x4xf32>) -> tensor<6x4xf32>
    %1 = "semantic.reshape"(%0) : (tensor<6x4xf32>) -> tensor<24xf32>
    %2 = "semantic.reshape"(%1) : (tensor<24xf32>) -> tensor<4x6xf32>
    %3 = "semantic.transpose"(%a0) {permutation = array<i64: 1, 0, 2>} : (tensor<2x3x4xf32>) -> tensor<3x2x4xf32>
    %4 = "semantic.transpose"(%3) {permutation = array<i64: 2, 0, 1>} : (tensor<3x2x4xf32>) -> tensor<4x3x2xf32>
    %5 = "semantic.transpose"(%4) {permutation = array<i64: 2, 1, 0>} : (tensor<4x3x2xf32>) -> tensor<2x3x4xf32>
    %6 = "semantic.neg"(%a0) : (tensor<2x3x4xf32>) -> tensor<2x3x4xf32>
    %7 = "semantic.neg"(%6) : (tensor<2x3x4xf32>) -> tensor<2x3x4xf32>
    %8 = "semantic.relu"(%7) : (tensor<2x3x4xf32>) -> tensor<2x3x4xf32>
    %9 = "semantic.relu"(%8) : (tensor<2x3x4xf32>) -> tensor<2x3x4xf32>
    %10 = "semantic.abs"(%9) : (tensor<2x3x4xf32>) -> tensor<2x3x4xf32>
    %11 = "semantic.abs"(%10) : (tensor<2x3x4xf32>) -> tensor<2x3x4xf32>
    %12 = "semantic.add"(%5, %11) : (tensor<2x3x4xf32>, tensor<2x3x4xf32>) -> tensor<2x3x4xf32>
    "func.return"(%2, %4, %5, %12) : (tensor<4x6xf32>, tensor<4x3x2xf32>, tensor<2x3x4xf32>, tensor<2x3x4xf32>) -> ()""")
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    want = run_reference(m, [x])
    run(m, Simplify(), DCE())
    text = print_op(m)
    filecheck(text,
              '"semantic.reshape"(%arg0) : (tensor<2x3x4xf32>) -> tensor<4x6xf32>',
              '"semantic.transpose"(%arg0) {permutation = array<i64: 2, 1, 0>}',
              '"semantic.relu"(%arg0)', '"semantic.abs"(%2)', '"semantic.add"(%arg0, %3)',
              '"func.return"(%0, %1, %arg0, %4)', "NOT: semantic.neg")
    assert text.count("semantic.reshape") == 1 and text.count("semantic.transpose") == 1
    for g, w in zip(run_reference(m, [x]), want):
        np.testing.assert_array_equal(g, w)


def test_simplify_keeps_dynamic_reshapes_that_may_move_data():
    m = program(["tensor<?x?xf32>"], ["tensor<?x?xf32>"], """\
    %0 = "semantic.reshape"(%a0) : (tensor<?x?xf32>) -> tensor<?x?xf32>
    "func.return"(%0) : (tensor<?x?xf32>) -> ()""")
    run(m, Simplify())
    assert ops(m) == ["semantic.reshape", "func.return"]


# ---------------------------------------------------------------------- cse, dce


def test_cse_merges_identical_ops():
    m = program(["tensor<4xf32>", "tensor<4xf32>"], ["tensor<4xf32>"], """\
    %0 = "semantic.exp"(%a0) : (tensor<4xf32>) -> tensor<4xf32>
    %1 = "semantic.exp"(%a0) : (tensor<4xf32>) -> tensor<4xf32>
    %2 = "semantic.add"(%0, %a1) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    %3 = "semantic.add"(%a1, %1) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    %4 = "semantic.sub"(%2, %a1) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    %5 = "semantic.sub"(%a1, %3) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    %6 = "semantic.mul"(%4, %5) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    "func.return"(%6) : (tensor<4xf32>) -> ()""")
    stats = run(m, CSE()).stats
    assert stats["cse"] == {"merged": 2}
    text = print_op(m)
    assert text.count("semantic.exp") == 1 and text.count("semantic.add") == 1
    assert text.count("semantic.sub") == 2  # sub is not commutative


def test_cse_keeps_ops_that_differ_in_attributes_or_constant_bits():
    m = program(["tensor<4x4xf32>"], ["tensor<4xf32>", "tensor<4xf32>", "tensor<f32>",
                                      "tensor<f32>"], """\
    %0 = "semantic.reduce_sum"(%a0) {axes = array<i64: 0>} : (tensor<4x4xf32>) -> tensor<4xf32>
    %1 = "semantic.reduce_sum"(%a0) {axes = array<i64: 1>} : (tensor<4x4xf32>) -> tensor<4xf32>
    %2 = "semantic.constant"() {value = dense<0.0> : tensor<f32>} : () -> tensor<f32>
    %3 = "semantic.constant"() {value = dense<-0.0> : tensor<f32>} : () -> tensor<f32>
    %4 = "semantic.constant"() {value = dense<0.0> : tensor<f32>} : () -> tensor<f32>
    "func.return"(%0, %1, %3, %4) : (tensor<4xf32>, tensor<4xf32>, tensor<f32>, tensor<f32>) -> ()""")
    run(m, CSE(), DCE())
    text = print_op(m)
    assert text.count("semantic.reduce_sum") == 2
    filecheck(text, "dense<0.0e+00>", "dense<-0.0e+00>", '"func.return"(%0, %1, %3, %2)')


def test_dce_erases_dead_pure_ops_only():
    m = program(["tensor<4xf32>"], ["tensor<4xf32>"], """\
    %0 = "semantic.exp"(%a0) : (tensor<4xf32>) -> tensor<4xf32>
    %1 = "semantic.log"(%0) : (tensor<4xf32>) -> tensor<4xf32>
    %2 = "semantic.neg"(%a0) : (tensor<4xf32>) -> tensor<4xf32>
    %3 = "semantic.sin"(%1) : (tensor<4xf32>) -> tensor<4xf32>
    "func.return"(%2) : (tensor<4xf32>) -> ()""")
    stats = run(m, DCE()).stats
    assert stats["dce"] == {"erased": 3}
    assert ops(m) == ["semantic.neg", "func.return"]


def test_contract_pipeline_keeps_the_reference_answer():
    m = program(["tensor<?x8xf32>", "tensor<8xf32>"], ["tensor<?x8xf32>"], """\
    %one = "semantic.constant"() {value = dense<1.0> : tensor<f32>} : () -> tensor<f32>
    %two = "semantic.constant"() {value = dense<2.0> : tensor<f32>} : () -> tensor<f32>
    %h = "semantic.mul"(%one, %two) : (tensor<f32>, tensor<f32>) -> tensor<f32>
    %0 = "semantic.mul"(%a0, %one) : (tensor<?x8xf32>, tensor<f32>) -> tensor<?x8xf32>
    %1 = "semantic.add"(%0, %a1) : (tensor<?x8xf32>, tensor<8xf32>) -> tensor<?x8xf32>
    %2 = "semantic.add"(%0, %a1) : (tensor<?x8xf32>, tensor<8xf32>) -> tensor<?x8xf32>
    %3 = "semantic.mul"(%1, %2) : (tensor<?x8xf32>, tensor<?x8xf32>) -> tensor<?x8xf32>
    %4 = "semantic.mul"(%3, %h) : (tensor<?x8xf32>, tensor<f32>) -> tensor<?x8xf32>
    "func.return"(%4) : (tensor<?x8xf32>) -> ()""")
    rng = np.random.default_rng(4)
    xs = [rng.standard_normal((3, 8)).astype(np.float32),
          rng.standard_normal(8).astype(np.float32)]
    want = run_reference(m, xs)[0]
    run(m, SpecializeShapes(((0, (3, 8)),)), Simplify(), FoldConstants(), CSE(), DCE())
    assert ops(m) == ["semantic.constant", "semantic.add", "semantic.mul", "semantic.mul",
                      "func.return"]
    np.testing.assert_array_equal(run_reference(m, xs)[0], want)
