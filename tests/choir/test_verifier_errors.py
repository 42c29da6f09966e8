"""Verify errors: one test per kind, through ``SemanticModule.from_text`` (parse + verify),
each checking the message, the line and the column of the op at fault."""

from __future__ import annotations

import pytest

from accy.choir.attributes import F32, TensorType
from accy.choir.builtin import FuncOp, ModuleOp, ReturnOp
from accy.choir.ir import Operation
from accy.choir.location import Location
from accy.choir.verifier import verify
from accy.errors import VerifyError
from accy.preparation.products import SemanticModule

FILE = "prog.mlir"
T = "tensor<4x8xf32>"


def program(args: list[str], results: list[str], ops: str) -> str:
    """A module whose ``main`` takes ``args`` (``%a0``, …); ``ops`` start on line 4."""
    sig = f"({', '.join(args)}) -> " + (results[0] if len(results) == 1
                                       else f"({', '.join(results)})")
    params = ", ".join(f"%a{i}: {t}" for i, t in enumerate(args))
    return ('"builtin.module"() ({\n'
            f'  "func.func"() <{{function_type = {sig}, sym_name = "main"}}> ({{\n'
            f'  ^bb0({params}):\n'
            f'{ops}'
            '  }) : () -> ()\n'
            '}) : () -> ()\n')


def position(text: str, marker: str) -> tuple[int, int]:
    pos = text.index(marker)
    return text.count("\n", 0, pos) + 1, pos - (text.rfind("\n", 0, pos) + 1) + 1


def expect_error(text: str, marker: str, message: str) -> VerifyError:
    """Loading ``text`` fails with exactly ``message`` at the first ``marker``."""
    line, col = position(text, marker)
    with pytest.raises(VerifyError) as info:
        SemanticModule.from_text(text, FILE)
    err = info.value
    assert (err.loc.file, err.loc.line, err.loc.col) == (FILE, line, col), str(err)
    assert str(err) == f"{FILE}:{line}:{col}: error: {message}"
    return err


def one_op(op: str, args: list[str], result: str) -> str:
    """``%0 = op`` on line 4, then ``func.return(%0)`` on line 5."""
    return program(args, [result], f"    %0 = {op}\n"
                                   f'    "func.return"(%0) : ({result}) -> ()\n')


def test_a_well_formed_program_loads() -> None:
    text = one_op(f'"semantic.softmax"(%a0) {{axis = -1 : i64}} : ({T}) -> {T}', [T], T)
    assert SemanticModule.from_text(text, FILE).entry().sym_name == "main"


# --------------------------------------------------------------------- op kinds


def test_unknown_semantic_op() -> None:
    text = one_op(f'"semantic.frobnicate"(%a0) : ({T}) -> {T}', [T], T)
    expect_error(text, "%0 =", "unknown operation 'semantic.frobnicate'")


def test_op_of_another_dialect() -> None:
    text = one_op(f'"test.frobnicate"(%a0) : ({T}) -> {T}', [T], T)
    expect_error(text, "%0 =", "'test.frobnicate' is not part of the semantic dialect")


def test_wrong_operand_count() -> None:
    text = one_op(f'"semantic.exp"(%a0, %a0) : ({T}, {T}) -> {T}', [T], T)
    expect_error(text, "%0 =", "'semantic.exp' takes 1 operand, got 2")


def test_wrong_operand_count_plural() -> None:
    text = one_op(f'"semantic.add"(%a0) : ({T}) -> {T}', [T], T)
    expect_error(text, "%0 =", "'semantic.add' takes 2 operands, got 1")


def test_wrong_result_count() -> None:
    text = program([T], [T], f'    %0:2 = "semantic.exp"(%a0) : ({T}) -> ({T}, {T})\n'
                             f'    "func.return"(%0#0) : ({T}) -> ()\n')
    expect_error(text, "%0:2", "'semantic.exp' has 1 result, got 2")


def test_operand_must_be_a_tensor() -> None:
    text = one_op('"semantic.exp"(%a0) : (f32) -> tensor<f32>', ["f32"], "tensor<f32>")
    expect_error(text, "%0 =", "operand 0 of 'semantic.exp' must be a tensor, got f32")


def test_float_only_op_of_an_integer_tensor() -> None:
    text = one_op('"semantic.exp"(%a0) : (tensor<4xi32>) -> tensor<4xi32>', ["tensor<4xi32>"],
                  "tensor<4xi32>")
    expect_error(text, "%0 =", "'semantic.exp' needs a floating-point operand, got tensor<4xi32>")


# ------------------------------------------------------------------ shapes, types


def test_shapes_that_do_not_broadcast() -> None:
    text = one_op(f'"semantic.add"(%a0, %a1) : ({T}, tensor<3xf32>) -> {T}',
                  [T, "tensor<3xf32>"], T)
    expect_error(text, "%0 =", "'semantic.add' operands do not broadcast: tensor<4x8xf32> and "
                               "tensor<3xf32>")


def test_declared_type_disagrees_with_inference() -> None:
    text = program([T], [T], f'    %0 = "semantic.exp"(%a0) : ({T}) -> tensor<4x9xf32>\n'
                             f'    "func.return"(%a0) : ({T}) -> ()\n')
    expect_error(text, "%0 =", "'semantic.exp' result type tensor<4x9xf32> disagrees with the "
                               "inferred type tensor<4x8xf32>")


def test_declared_rank_disagrees_with_inference_even_with_dynamic_dims() -> None:
    text = program(["tensor<?x8xf32>"], ["tensor<?x8xf32>"],
                   '    %0 = "semantic.exp"(%a0) : (tensor<?x8xf32>) -> tensor<?xf32>\n'
                   '    "func.return"(%a0) : (tensor<?x8xf32>) -> ()\n')
    expect_error(text, "%0 =", "'semantic.exp' result type tensor<?xf32> disagrees with the "
                               "inferred type tensor<?x8xf32>")


def test_binary_element_types_differ() -> None:
    text = one_op(f'"semantic.mul"(%a0, %a1) : ({T}, tensor<4x8xf16>) -> {T}',
                  [T, "tensor<4x8xf16>"], T)
    expect_error(text, "%0 =", "'semantic.mul' operands have different element types: "
                               "tensor<4x8xf32> and tensor<4x8xf16> (insert a 'semantic.cast')")


def test_reduce_mean_of_an_integer_tensor() -> None:
    text = one_op('"semantic.reduce_mean"(%a0) {axes = array<i64: 1>} : (tensor<4x8xi32>) -> '
                  'tensor<4xi32>', ["tensor<4x8xi32>"], "tensor<4xi32>")
    expect_error(text, "%0 =", "'semantic.reduce_mean' of an integer tensor is an error "
                               "(tensor<4x8xi32>)")


# -------------------------------------------------------------------------- axes


def test_softmax_axis_out_of_range() -> None:
    text = one_op(f'"semantic.softmax"(%a0) {{axis = 2 : i64}} : ({T}) -> {T}', [T], T)
    expect_error(text, "%0 =", "'semantic.softmax' axis 2 is out of range for rank 2")


def test_softmax_negative_axis_out_of_range() -> None:
    text = one_op(f'"semantic.softmax"(%a0) {{axis = -3 : i64}} : ({T}) -> {T}', [T], T)
    expect_error(text, "%0 =", "'semantic.softmax' axis -3 is out of range for rank 2")


def test_softmax_needs_an_axis() -> None:
    text = one_op(f'"semantic.softmax"(%a0) : ({T}) -> {T}', [T], T)
    expect_error(text, "%0 =", "'semantic.softmax' needs an integer attribute 'axis'")


def test_reduce_axis_out_of_range() -> None:
    text = one_op(f'"semantic.reduce_sum"(%a0) {{axes = array<i64: -3>}} : ({T}) -> tensor<4xf32>',
                  [T], "tensor<4xf32>")
    expect_error(text, "%0 =", "'semantic.reduce_sum' axis -3 is out of range for rank 2")


def test_duplicate_reduce_axis() -> None:
    text = one_op(f'"semantic.reduce_max"(%a0) {{axes = array<i64: 1, -1>}} : ({T}) -> '
                  f'tensor<4xf32>', [T], "tensor<4xf32>")
    expect_error(text, "%0 =", "'semantic.reduce_max' axis -1 appears twice in 'axes'")


def test_reduce_needs_axes() -> None:
    text = one_op(f'"semantic.reduce_min"(%a0) : ({T}) -> tensor<4xf32>', [T], "tensor<4xf32>")
    expect_error(text, "%0 =", "'semantic.reduce_min' needs 'axes = array<i64: …>'")


def test_layernorm_axis_out_of_range() -> None:
    v = "tensor<8xf32>"
    text = one_op(f'"semantic.layernorm"(%a0, %a1, %a2) {{axis = 5 : i64, epsilon = 1.0e-05 : '
                  f'f32}} : ({T}, {v}, {v}) -> {T}', [T, v, v], T)
    expect_error(text, "%0 =", "'semantic.layernorm' axis 5 is out of range for rank 2")


def test_layernorm_gamma_shape() -> None:
    text = one_op(f'"semantic.layernorm"(%a0, %a1, %a2) {{axis = -1 : i64, epsilon = 1.0e-05 : '
                  f'f32}} : ({T}, tensor<4xf32>, tensor<8xf32>) -> {T}',
                  [T, "tensor<4xf32>", "tensor<8xf32>"], T)
    expect_error(text, "%0 =", "'semantic.layernorm' operand 1 must have shape [8] "
                               "(x.shape[axis:]), got tensor<4xf32>")


def test_layernorm_beta_over_two_axes() -> None:
    text = one_op(f'"semantic.layernorm"(%a0, %a1, %a2) {{axis = 0 : i64, epsilon = 1.0e-05 : '
                  f'f32}} : ({T}, {T}, tensor<8xf32>) -> {T}', [T, T, "tensor<8xf32>"], T)
    expect_error(text, "%0 =", "'semantic.layernorm' operand 2 must have shape [4, 8] "
                               "(x.shape[axis:]), got tensor<8xf32>")


def test_rmsnorm_epsilon_must_be_a_float() -> None:
    v = "tensor<8xf32>"
    text = one_op(f'"semantic.rmsnorm"(%a0, %a1) {{axis = -1 : i64, epsilon = 1 : i64}} : '
                  f'({T}, {v}) -> {T}', [T, v], T)
    expect_error(text, "%0 =", "'semantic.rmsnorm' attribute 'epsilon' must be a float "
                               "(e.g. 1.0e-05 : f32)")


# ------------------------------------------------------------------------ layout


def test_transpose_non_permutation() -> None:
    text = one_op(f'"semantic.transpose"(%a0) {{permutation = array<i64: 1, 1>}} : ({T}) -> '
                  f'tensor<8x4xf32>', [T], "tensor<8x4xf32>")
    expect_error(text, "%0 =", "'semantic.transpose' permutation [1, 1] is not a permutation of "
                               "rank 2")


def test_transpose_permutation_of_the_wrong_rank() -> None:
    text = one_op(f'"semantic.transpose"(%a0) {{permutation = array<i64: 0>}} : ({T}) -> {T}',
                  [T], T)
    expect_error(text, "%0 =", "'semantic.transpose' permutation [0] is not a permutation of "
                               "rank 2")


def test_reshape_changes_the_element_count() -> None:
    text = one_op(f'"semantic.reshape"(%a0) : ({T}) -> tensor<5x8xf32>', [T], "tensor<5x8xf32>")
    expect_error(text, "%0 =", "'semantic.reshape' changes the element count: tensor<4x8xf32> "
                               "has 32, tensor<5x8xf32> has 40")


def test_reshape_with_one_unknown_dim_that_does_not_divide() -> None:
    text = one_op(f'"semantic.reshape"(%a0) : ({T}) -> tensor<?x5xf32>', [T], "tensor<?x5xf32>")
    expect_error(text, "%0 =", "'semantic.reshape' cannot reshape tensor<4x8xf32> to "
                               "tensor<?x5xf32>")


def test_reshape_cannot_change_the_element_type() -> None:
    text = one_op(f'"semantic.reshape"(%a0) : ({T}) -> tensor<32xf16>', [T], "tensor<32xf16>")
    expect_error(text, "%0 =", "'semantic.reshape' cannot change the element type "
                               "(tensor<4x8xf32> to tensor<32xf16>)")


def test_bad_broadcast_to() -> None:
    text = one_op(f'"semantic.broadcast_to"(%a0) : ({T}) -> tensor<4x4xf32>', [T],
                  "tensor<4x4xf32>")
    expect_error(text, "%0 =", "'semantic.broadcast_to' cannot broadcast tensor<4x8xf32> to "
                               "tensor<4x4xf32>")


def test_broadcast_to_a_lower_rank() -> None:
    text = one_op(f'"semantic.broadcast_to"(%a0) : ({T}) -> tensor<8xf32>', [T], "tensor<8xf32>")
    expect_error(text, "%0 =", "'semantic.broadcast_to' cannot broadcast tensor<4x8xf32> to "
                               "tensor<8xf32>")


def test_matmul_contraction_mismatch() -> None:
    text = one_op(f'"semantic.matmul"(%a0, %a1) : ({T}, {T}) -> {T}', [T, T], T)
    expect_error(text, "%0 =", "'semantic.matmul' contraction dims differ: tensor<4x8xf32> and "
                               "tensor<4x8xf32> (8 vs 4)")


def test_matmul_needs_rank_two() -> None:
    text = one_op('"semantic.matmul"(%a0, %a1) : (tensor<8xf32>, tensor<8x4xf32>) -> '
                  'tensor<4xf32>', ["tensor<8xf32>", "tensor<8x4xf32>"], "tensor<4xf32>")
    expect_error(text, "%0 =", "'semantic.matmul' needs operands of rank >= 2, got "
                               "tensor<8xf32> and tensor<8x4xf32>")


def test_matmul_batch_dims_do_not_broadcast() -> None:
    a, b = "tensor<2x4x8xf32>", "tensor<3x8x4xf32>"
    text = one_op(f'"semantic.matmul"(%a0, %a1) : ({a}, {b}) -> tensor<2x4x4xf32>', [a, b],
                  "tensor<2x4x4xf32>")
    expect_error(text, "%0 =", f"'semantic.matmul' batch dims do not broadcast: {a} and {b}")


# -------------------------------------------------------------------- attributes


def test_gelu_approximate_value() -> None:
    text = one_op(f'"semantic.gelu"(%a0) {{approximate = "fast"}} : ({T}) -> {T}', [T], T)
    expect_error(text, "%0 =", "'semantic.gelu' attribute 'approximate' must be one of 'none', "
                               "'tanh'")


def test_cmp_predicate() -> None:
    r = "tensor<4x8xi1>"
    text = one_op(f'"semantic.cmp"(%a0, %a1) {{predicate = "lte"}} : ({T}, {T}) -> {r}', [T, T],
                  r)
    expect_error(text, "%0 =", "'semantic.cmp' attribute 'predicate' must be one of 'lt', 'le', "
                               "'gt', 'ge', 'eq', 'ne'")


def test_cmp_result_must_be_i1() -> None:
    text = one_op(f'"semantic.cmp"(%a0, %a1) {{predicate = "lt"}} : ({T}, {T}) -> {T}', [T, T], T)
    expect_error(text, "%0 =", "'semantic.cmp' result type tensor<4x8xf32> disagrees with the "
                               "inferred type tensor<4x8xi1>")


def test_select_condition_not_i1() -> None:
    text = one_op(f'"semantic.select"(%a0, %a1, %a2) : ({T}, {T}, {T}) -> {T}', [T, T, T], T)
    expect_error(text, "%0 =", "'semantic.select' condition must be an i1 tensor, got "
                               "tensor<4x8xf32>")


def test_constant_needs_a_dense_value() -> None:
    text = one_op('"semantic.constant"() {value = 1.0 : f32} : () -> tensor<f32>', [],
                  "tensor<f32>")
    expect_error(text, "%0 =", "'semantic.constant' needs a 'value = dense<…> : tensor<…>' "
                               "attribute")


def test_constant_type_disagrees_with_its_value() -> None:
    text = one_op('"semantic.constant"() {value = dense<1.0> : tensor<2xf32>} : () -> '
                  'tensor<3xf32>', [], "tensor<3xf32>")
    expect_error(text, "%0 =", "'semantic.constant' result type tensor<3xf32> disagrees with "
                               "the inferred type tensor<2xf32>")


# ---------------------------------------------------------- functions and modules


def test_function_without_a_return() -> None:
    text = program([T], [T], f'    %0 = "semantic.exp"(%a0) : ({T}) -> {T}\n')
    expect_error(text, "%0 =", "function 'main' must end with 'func.return'")


def test_empty_function_body() -> None:
    text = program([T], [T], "")
    expect_error(text, '"func.func"', "function 'main' must end with 'func.return'")


def test_return_type_mismatch() -> None:
    text = program([T], [T], f'    %0 = "semantic.reduce_sum"(%a0) {{axes = array<i64: 1>}} : '
                             f'({T}) -> tensor<4xf32>\n'
                             f'    "func.return"(%0) : (tensor<4xf32>) -> ()\n')
    expect_error(text, '"func.return"', "'func.return' operand 0 has type tensor<4xf32> but "
                                        "function 'main' returns tensor<4x8xf32>")


def test_return_count_mismatch() -> None:
    text = program([T], [T], f'    "func.return"(%a0, %a0) : ({T}, {T}) -> ()\n')
    expect_error(text, '"func.return"', "'func.return' has 2 operands but function 'main' "
                                        "returns 1")


def test_return_must_be_last() -> None:
    text = program([T], [T], f'    "func.return"(%a0) : ({T}) -> ()\n'
                             f'    %0 = "semantic.exp"(%a0) : ({T}) -> {T}\n')
    expect_error(text, '"func.return"', "'func.return' must be the last operation of its block")


def test_entry_block_arguments_must_match_the_function_type() -> None:
    text = program([T], [T], f'    "func.return"(%a0) : ({T}) -> ()\n').replace(
        "%a0: tensor<4x8xf32>", "%a0: tensor<4x9xf32>").replace(
        f'"func.return"(%a0) : ({T})', '"func.return"(%a0) : (tensor<4x9xf32>)')
    expect_error(text, '"func.func"', "function 'main': entry block arguments do not match its "
                                      "function_type inputs")


def test_module_without_a_function() -> None:
    expect_error('"builtin.module"() ({\n}) : () -> ()\n', '"builtin.module"',
                 "module has no function")


def test_several_functions_and_none_named_main() -> None:
    func = (f'  "func.func"() <{{function_type = ({T}) -> {T}, sym_name = "NAME"}}> ({{\n'
            f'  ^bb0(%a0: {T}):\n'
            f'    "func.return"(%a0) : ({T}) -> ()\n'
            '  }) : () -> ()\n')
    text = ('"builtin.module"() ({\n' + func.replace("NAME", "f") + func.replace("NAME", "g")
            + '}) : () -> ()\n')
    expect_error(text, '"builtin.module"', "module has several functions and none is named 'main'")


def test_function_needs_a_function_type() -> None:
    text = program([T], [T], f'    "func.return"(%a0) : ({T}) -> ()\n').replace(
        f"function_type = ({T}) -> {T}", f"function_type = {T}")
    expect_error(text, '"func.func"', "'func.func' needs a 'function_type' of function type")


# --------------------------------------------------------------------- dominance


def _module_with_use_before_def(file: str = FILE) -> tuple[ModuleOp, Operation]:
    """``main(x) { %a = exp(%b); %b = neg(x); return %a }``: %b used before its def."""
    t = TensorType((4,), F32)
    module = ModuleOp.build(Location(file, 1, 1))
    func = FuncOp.build("main", [t], [t], Location(file, 2, 3))
    module.body.append(func)
    x = func.body.args[0]
    neg = Operation.create("semantic.neg", [x], [t], loc=Location(file, 5, 5))
    exp = Operation.create("semantic.exp", [neg.result], [t], loc=Location(file, 4, 5))
    func.body.append(exp)
    func.body.append(neg)
    func.body.append(ReturnOp([exp.result], loc=Location(file, 6, 5)))
    return module, exp


def test_operand_must_dominate_its_use() -> None:
    module, exp = _module_with_use_before_def()
    with pytest.raises(VerifyError) as info:
        SemanticModule(module).verify()
    assert str(info.value) == (f"{FILE}:4:5: error: operand 0 of 'semantic.exp' does not "
                               f"dominate its use")
    # moving the def first makes the same module valid
    neg = exp.operands[0].owner
    assert isinstance(neg, Operation)
    neg.parent.ops.remove(neg)  # type: ignore[union-attr]
    neg.parent = None
    exp.parent.insert_before(exp, neg)  # type: ignore[union-attr]
    SemanticModule(module).verify()


def test_a_function_cannot_use_another_functions_values() -> None:
    t = TensorType((4,), F32)
    module = ModuleOp.build(Location(FILE, 1, 1))
    f = FuncOp.build("f", [t], [t], Location(FILE, 2, 3))
    g = FuncOp.build("main", [t], [t], Location(FILE, 6, 3))
    module.body.append(f)
    module.body.append(g)
    f.body.append(ReturnOp([f.body.args[0]], loc=Location(FILE, 4, 5)))
    g.body.append(ReturnOp([f.body.args[0]], loc=Location(FILE, 8, 5)))
    with pytest.raises(VerifyError) as info:
        verify(module)
    assert str(info.value) == (f"{FILE}:8:5: error: operand 0 of 'func.return' does not "
                               f"dominate its use")


def test_an_op_cannot_use_its_own_result() -> None:
    t = TensorType((4,), F32)
    module = ModuleOp.build()
    func = FuncOp.build("main", [t], [t])
    module.body.append(func)
    op = Operation.create("semantic.neg", [func.body.args[0]], [t], loc=Location(FILE, 4, 5))
    op.set_operand(0, op.result)
    func.body.append(op)
    func.body.append(ReturnOp([op.result]))
    with pytest.raises(VerifyError, match=r"^prog\.mlir:4:5: error: operand 0 of 'semantic\.neg' "
                                          r"does not dominate its use$"):
        verify(module)


def test_every_verify_error_of_a_parsed_program_is_one_located_line() -> None:
    """A sample of the above, through the text path: no traceback text, one line each."""
    texts = [
        one_op(f'"semantic.frobnicate"(%a0) : ({T}) -> {T}', [T], T),
        one_op(f'"semantic.softmax"(%a0) {{axis = 9 : i64}} : ({T}) -> {T}', [T], T),
        program([T], [T], ""),
    ]
    for text in texts:
        with pytest.raises(VerifyError) as info:
            SemanticModule.from_text(text, FILE)
        assert str(info.value).startswith(f"{FILE}:") and "\n" not in str(info.value)
