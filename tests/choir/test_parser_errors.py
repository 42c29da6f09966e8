"""Parse errors: one test per kind, each checking the message, the line and the column.

Every expected position is given as a *marker*: the text the error must point
at (its first occurrence in the program, or the ``nth``), so a reader sees
where the caret goes without counting columns.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accy.choir.parser import parse_file, parse_module
from accy.choir.printer import print_op
from accy.errors import ParseError

GRAPHS = sorted((Path(__file__).resolve().parents[2] / "graphs").glob("*.mlir"))
FILE = "p.mlir"
T = "tensor<4xf32>"
HEAD = ('"builtin.module"() ({\n'
        f'  "func.func"() <{{function_type = ({T}) -> {T}, sym_name = "main"}}> ({{\n'
        f'  ^bb0(%x: {T}):\n')
TAIL = (f'    "func.return"(%x) : ({T}) -> ()\n'
        '  }) : () -> ()\n'
        '}) : () -> ()\n')


def body(ops: str) -> str:
    """A module whose ``main`` body starts on line 4 with ``ops``."""
    return HEAD + ops + TAIL


def position(text: str, marker: str, nth: int = 1) -> tuple[int, int]:
    """1-based (line, column) of the ``nth`` occurrence of ``marker`` in ``text``."""
    pos = -1
    for _ in range(nth):
        pos = text.index(marker, pos + 1)
    line = text.count("\n", 0, pos) + 1
    return line, pos - (text.rfind("\n", 0, pos) + 1) + 1


def expect_error(text: str, marker: str | tuple[int, int], message: str, *, nth: int = 1,
                 exact: bool = True) -> ParseError:
    """Parsing ``text`` fails at ``marker`` with ``message`` (exact, or a substring)."""
    line, col = marker if isinstance(marker, tuple) else position(text, marker, nth)
    with pytest.raises(ParseError) as info:
        parse_module(text, FILE)
    err = info.value
    assert (err.loc.line, err.loc.col) == (line, col), str(err)
    assert err.loc.file == FILE
    prefix = f"{FILE}:{line}:{col}: error: "
    assert str(err).startswith(prefix)
    if exact:
        assert err.message == message, str(err)
    else:
        assert message in err.message, str(err)
    assert "\n" not in str(err)
    return err


# ------------------------------------------------------------------ file structure


@pytest.mark.parametrize("text", ["", "\n\n   \n", "// only a comment\n// and another\n"])
def test_empty_file(text: str) -> None:
    expect_error(text, (1, 1), "empty file: expected a 'builtin.module'")


def test_custom_syntax_module_is_rejected() -> None:
    expect_error("\n  module {\n  }\n", "module",
                 "expected an operation in generic form (\"dialect.op\"), found 'module'")


def test_custom_syntax_op_inside_a_function_is_rejected() -> None:
    text = body(f"    %0 = semantic.neg %x : {T}\n")
    expect_error(text, "semantic.neg",
                 "expected an operation in generic form (\"dialect.op\"), found 'semantic.neg'")


def test_two_top_level_modules() -> None:
    one = '"builtin.module"() ({\n}) : () -> ()\n'
    expect_error(one + one, '"builtin.module"', "expected exactly one top-level 'builtin.module'",
                 nth=2)


def test_op_name_without_dialect() -> None:
    text = body(f'    %0 = "neg"(%x) : ({T}) -> {T}\n')
    expect_error(text, '"neg"', "operation name 'neg' needs a dialect prefix")


# ---------------------------------------------------------------------- SSA values


def test_use_of_undefined_value() -> None:
    text = body(f'    %0 = "semantic.neg"(%y) : ({T}) -> {T}\n')
    expect_error(text, "%y", "use of undefined value '%y'")


def test_forward_reference_is_an_undefined_value() -> None:
    text = body(f'    %0 = "semantic.neg"(%1) : ({T}) -> {T}\n'
                f'    %1 = "semantic.neg"(%x) : ({T}) -> {T}\n')
    expect_error(text, "%1", "use of undefined value '%1'")


def test_redefinition_of_a_result() -> None:
    op = f'    %0 = "semantic.neg"(%x) : ({T}) -> {T}\n'
    expect_error(body(op + op), "%0", "redefinition of SSA value '%0'", nth=2)


def test_redefinition_of_a_block_argument() -> None:
    text = HEAD.replace(f"%x: {T}", f"%x: {T}, %x: {T}") + TAIL
    expect_error(text, "%x", "redefinition of SSA value '%x'", nth=2)


def test_result_number_out_of_range() -> None:
    text = body(f'    %0:2 = "test.pair"(%x) : ({T}) -> ({T}, {T})\n'
                f'    %1 = "semantic.neg"(%0#2) : ({T}) -> {T}\n')
    expect_error(text, "%0#2", "'%0' has only 2 results")


# ------------------------------------------------------- operands, results, types


def test_operand_count_differs_from_the_function_type() -> None:
    text = body(f'    %0 = "semantic.add"(%x) : ({T}, {T}) -> {T}\n')
    expect_error(text, f"({T}, {T})", "'semantic.add' has 1 operands but its type lists 2")


def test_operand_type_differs_from_the_function_type() -> None:
    text = body('    %0 = "semantic.neg"(%x) : (tensor<8xf32>) -> tensor<8xf32>\n')
    expect_error(text, "%x)", "operand 0 of 'semantic.neg' has type tensor<4xf32> but the "
                              "operation's type says tensor<8xf32>")


def test_result_count_differs_from_the_function_type() -> None:
    text = body(f'    %0, %1 = "semantic.neg"(%x) : ({T}) -> {T}\n')
    expect_error(text, "%0, %1", "'semantic.neg' defines 2 results but its type lists 1")


def test_operation_type_must_be_a_function_type() -> None:
    text = body(f'    %0 = "semantic.neg"(%x) :   {T}\n')
    # the caret is on the type, not on the blanks after ':'
    expect_error(text, f"{T}\n", "expected a function type '(…) -> …' for the operation")


def test_missing_colon_and_type() -> None:
    text = body('    %0 = "semantic.neg"(%x)\n')
    expect_error(text, '"func.return"', "expected ':' and the operation's function type, "
                                        "found '\"'")


# -------------------------------------------------------------------------- lexing


def test_unterminated_string() -> None:
    text = body(f'    %0 = "semantic.gelu"(%x) {{approximate = "none}} : ({T}) -> {T}\n')
    expect_error(text, '"none', "unterminated string literal")


def test_unterminated_string_at_end_of_file() -> None:
    text = '"builtin.module'
    expect_error(text, (1, 1), "unterminated string literal")


def test_unknown_string_escape() -> None:
    text = body(f'    %0 = "test.s"(%x) {{s = "a\\qb"}} : ({T}) -> {T}\n')
    expect_error(text, "\\q", "unknown escape in string literal")


# --------------------------------------------------------------------------- types


def test_bad_tensor_dimension() -> None:
    text = body(f'    %0 = "semantic.neg"(%x) : ({T}) -> tensor<4yxf32>\n')
    expect_error(text, "tensor<4y", "bad tensor dimension '4y'")


def test_bad_tensor_element_type() -> None:
    text = body(f'    %0 = "semantic.neg"(%x) : ({T}) -> tensor<4xf8>\n')
    expect_error(text, "tensor<4xf8", "unsupported tensor element type 'f8'")


def test_tensor_encoding_is_unsupported() -> None:
    text = body(f'    %0 = "semantic.neg"(%x) : ({T}) -> tensor<4xf32, #enc>\n')
    expect_error(text, "tensor<4xf32, #enc>", "tensor encodings are not supported")


def test_unsupported_type() -> None:
    text = body(f'    %0 = "semantic.neg"(%x) : ({T}) -> memref<4xf32>\n')
    expect_error(text, "memref", "unsupported type 'memref'")


# ---------------------------------------------------------------------- attributes


def test_bad_attribute_value() -> None:
    text = body(f'    %0 = "semantic.softmax"(%x) {{axis = $1}} : ({T}) -> {T}\n')
    expect_error(text, "$1", "expected an attribute value, found '$'")


def test_integer_type_given_a_float() -> None:
    text = body(f'    %0 = "semantic.softmax"(%x) {{axis = 1.5 : i64}} : ({T}) -> {T}\n')
    expect_error(text, "1.5", "integer type i64 given a float value 1.5")


@pytest.mark.parametrize("literal, message", [
    ("99999999999999999999999 : i64", "integer 99999999999999999999999 does not fit in i64"),
    ("-129 : i8", "integer -129 does not fit in i8"),
    ("2 : i1", "integer 2 does not fit in i1"),
])
def test_integer_out_of_range(literal: str, message: str) -> None:
    text = body(f'    %0 = "test.a"(%x) {{v = {literal}}} : ({T}) -> {T}\n')
    expect_error(text, literal, message)


@pytest.mark.parametrize("literal", ["0x1FFFFFFFF : f32", "-0x3F800000 : f32", "0x10000 : f16",
                                     "0x1FFFF : bf16"])
def test_hex_float_that_is_not_a_bit_pattern_of_its_type(literal: str) -> None:
    text = body(f'    %0 = "test.a"(%x) {{v = {literal}}} : ({T}) -> {T}\n')
    hexa, _, ty = literal.partition(" : ")
    expect_error(text, literal, f"hex float {hexa} is not a {ty} bit pattern")


def test_number_attribute_needs_a_scalar_type() -> None:
    text = body(f'    %0 = "test.a"(%x) {{v = 1 : {T}}} : ({T}) -> {T}\n')
    expect_error(text, f"{T}}}", "a number attribute needs a scalar type")


def test_duplicate_attribute() -> None:
    text = body(f'    %0 = "semantic.softmax"(%x) {{axis = 0 : i64, axis = 0 : i64}} : ({T}) -> '
                f'{T}\n')
    expect_error(text, "axis", "duplicate attribute 'axis'", nth=2)


def test_duplicate_property() -> None:
    text = HEAD.replace('sym_name = "main"', 'sym_name = "main", sym_name = "f"') + TAIL
    expect_error(text, "sym_name", "duplicate attribute 'sym_name'", nth=2)


def test_unclosed_attribute_dictionary() -> None:
    text = body(f'    %0 = "semantic.softmax"(%x) {{axis = 0 : i64 : ({T}) -> {T}\n')
    expect_error(text, f": ({T})", "expected ',' or '}' in an attribute dictionary, found ':'")


# ------------------------------------------------------------------ dense elements


def dense_op(literal: str, ty: str) -> str:
    return body(f'    %c = "semantic.constant"() {{value = dense<{literal}> : {ty}}} : () -> {ty}\n')


def test_ragged_dense_literal() -> None:
    text = dense_op("[[1.0, 2.0], [3.0]]", "tensor<2x2xf32>")
    expect_error(text, "[[1.0", "ragged dense literal")


def test_dense_literal_with_the_wrong_element_count() -> None:
    text = dense_op("[1.0, 2.0, 3.0]", "tensor<4xf32>")
    expect_error(text, "dense<", "dense literal has shape [3] but its type is tensor<4xf32>")


def test_dense_literal_with_the_wrong_nesting() -> None:
    text = dense_op("[[1.0, 2.0]]", "tensor<2xf32>")
    expect_error(text, "dense<", "dense literal has shape [1, 2] but its type is tensor<2xf32>")


def test_dense_float_in_an_integer_tensor() -> None:
    text = dense_op("[1, 2.5]", "tensor<2xi32>")
    expect_error(text, "[1, 2.5]", "float value 2.5 in an integer dense attribute")


def test_dense_integer_out_of_range() -> None:
    text = dense_op("[1, 99999999999]", "tensor<2xi32>")
    expect_error(text, "[1, 9", "integer 99999999999 does not fit in i32")


def test_dense_needs_a_static_type() -> None:
    text = dense_op("[1.0, 2.0]", "tensor<?xf32>")
    expect_error(text, "tensor<?xf32>}", "dense elements need a static tensor type")


def test_dense_hex_blob_that_does_not_hold_whole_values() -> None:
    text = dense_op('"0x000080"', "tensor<2xf32>")
    expect_error(text, '"0x000080"', "hex dense elements of 3 bytes do not hold whole f32 values")


def test_dense_hex_blob_with_the_wrong_count() -> None:
    text = dense_op('"0x0000803F0000803F0000803F"', "tensor<2xf32>")
    expect_error(text, '"0x0000', "hex dense elements hold 3 values, type needs 2")


def test_dense_malformed_hex() -> None:
    text = dense_op('"0xZZ"', "tensor<2xf32>")
    expect_error(text, '"0xZZ"', "malformed hex in dense elements")


# ------------------------------------------------------------------------- array<>


def test_array_of_floats_is_unsupported() -> None:
    text = body(f'    %0 = "semantic.transpose"(%x) {{permutation = array<f32: 1.0>}} : ({T}) -> '
                f'{T}\n')
    expect_error(text, "f32: 1.0", "only integer 'array<…>' attributes are supported")


def test_array_without_its_closing_angle() -> None:
    text = body(f'    %0 = "semantic.transpose"(%x) {{permutation = array<i64: 1, 0}} : ({T}) -> '
                f'{T}\n')
    expect_error(text, "} :", "expected '>' to end 'array<…>', found '}'")


def test_array_value_out_of_range() -> None:
    text = body(f'    %0 = "test.a"(%x) {{v = array<i8: 1, 300>}} : ({T}) -> {T}\n')
    expect_error(text, "300", "integer 300 does not fit in i8")


def test_array_of_non_integers() -> None:
    text = body(f'    %0 = "test.a"(%x) {{v = array<i64: 1, 2.5>}} : ({T}) -> {T}\n')
    expect_error(text, "2.5", "expected integer, found '2.5'")


# ------------------------------------------------------- regions, braces, nesting


def test_end_of_file_inside_a_region() -> None:
    text = HEAD + f'    %0 = "semantic.neg"(%x) : ({T}) -> {T}\n'
    expect_error(text, (5, 1), "unexpected end of file: expected '}' to close a region")


def test_end_of_file_right_after_a_region_opens() -> None:
    expect_error('"builtin.module"() ({', (1, 22),
                 "unexpected end of file: expected '}' to close a region")


def test_extra_closing_brace() -> None:
    text = body(f'    %0 = "semantic.neg"(%x) : ({T}) -> {T}\n    }}\n')
    expect_error(text, '"func.return"', "expected ',' or ')' after region, found '\"'")


def test_unbalanced_parenthesis_in_a_function_type() -> None:
    text = body(f'    %0 = "semantic.neg"(%x) : ({T} -> {T}\n')
    expect_error(text, f"-> {T}\n", "expected ',' or ')' in a type list, found '-'")


def test_block_label_needs_a_colon() -> None:
    text = HEAD.replace(f"^bb0(%x: {T}):", f"^bb0(%x: {T})") + TAIL
    expect_error(text, '"func.return"', "expected ':' after the block label, found '\"'")


def test_block_label_needs_a_name() -> None:
    text = HEAD.replace("^bb0(", "^ (") + TAIL
    expect_error(text, " (%x", "expected a block label after '^'")


def test_a_region_may_hold_labeled_blocks_after_the_first() -> None:
    text = ('"builtin.module"() ({\n'
            '  "test.r"() ({\n'
            '    "test.a"() : () -> ()\n'
            '  ^bb1:\n'
            '    "test.b"() : () -> ()\n'
            '  }, {\n'
            '  }) : () -> ()\n'
            '}) : () -> ()\n')
    module = parse_module(text, FILE)
    region = module.body.ops[0].regions[0]
    assert len(region.blocks) == 2


def test_nesting_too_deep() -> None:
    text = '"builtin.module"() ({\n' + '"test.r"() ({\n' * 300
    expect_error(text, (201, 1), "nesting too deep")


def test_block_successors_are_unsupported() -> None:
    text = body('    "test.br"()[^bb1] : () -> ()\n')
    expect_error(text, "[^bb1]", "block successors are not supported")


def test_properties_must_be_a_dictionary() -> None:
    text = body(f'    %0 = "semantic.neg"(%x) <[1]> : ({T}) -> {T}\n')
    expect_error(text, "[1]>", "expected '{' to start properties")


def test_properties_must_close_with_an_angle() -> None:
    text = body(f'    %0 = "semantic.neg"(%x) <{{a = 1 : i64}} : ({T}) -> {T}\n')
    expect_error(text, f": ({T}) -> {T}\n", "expected '>' to end properties, found ':'")


def test_attribute_alias_definitions_are_unsupported() -> None:
    text = "#map = affine_map<(d0) -> (d0)>\n" + body("")
    expect_error(text, (1, 1), "unsupported attribute alias definition")


def test_unreadable_file_is_a_parse_error(tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.mlir")
    with pytest.raises(ParseError) as info:
        parse_file(missing)
    assert (info.value.loc.file, info.value.loc.line, info.value.loc.col) == (missing, 1, 1)
    assert str(info.value).startswith(f"{missing}:1:1: error: cannot read file: ")


def test_non_utf8_file_is_a_parse_error(tmp_path: Path) -> None:
    path = tmp_path / "latin1.mlir"
    path.write_bytes(b'"builtin.module"() ({\n}) : () -> () // \xe9\xff\n')
    with pytest.raises(ParseError, match="cannot read file"):
        parse_file(str(path))


# ---------------------------------------------------------------- block arguments


def test_block_argument_locations_point_at_the_percent_sign() -> None:
    text = ('"builtin.module"() ({\n'
            '  "func.func"() <{function_type = (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>, '
            'sym_name = "main"}> ({\n'
            '  ^bb0(%first: tensor<4xf32>,\n'
            '         %second : tensor<4xf32>):\n'
            '    "func.return"(%first) : (tensor<4xf32>) -> ()\n'
            '  }) : () -> ()\n'
            '}) : () -> ()\n')
    func = parse_module(text, FILE).entry()
    a, b = func.body.args
    assert (a.loc.file, a.loc.line, a.loc.col) == (FILE, *position(text, "%first"))
    assert (b.loc.line, b.loc.col) == position(text, "%second") == (4, 10)


def test_block_argument_with_an_explicit_location_keeps_it() -> None:
    text = HEAD.replace(f"%x: {T}", f'%x: {T} loc("src.py":7:9)') + TAIL
    (arg,) = parse_module(text, FILE).entry().body.args
    assert (arg.loc.file, arg.loc.line, arg.loc.col) == ("src.py", 7, 9)


def test_op_location_is_the_first_result_or_the_name() -> None:
    text = body(f'      %r = "semantic.neg"(%x) : ({T}) -> {T}\n')
    func = parse_module(text, FILE).entry()
    neg, ret = func.body.ops
    assert (neg.loc.line, neg.loc.col) == position(text, "%r")
    assert (ret.loc.line, ret.loc.col) == position(text, '"func.return"')


# ------------------------------------------------------------ accepted edge cases


def test_decimal_literals_may_have_leading_zeros() -> None:
    text = body(f'    %0 = "semantic.softmax"(%x) {{axis = 00 : i64}} : ({T}) -> {T}\n'
                f'    %1 = "test.a"(%x) {{v = array<i64: 01, 010>}} : ({T}) -> {T}\n')
    softmax, arr, _ = parse_module(text, FILE).entry().body.ops
    assert softmax.attr("axis").value == 0  # type: ignore[union-attr]
    assert arr.attr("v").values == (1, 10)  # type: ignore[union-attr]


def test_unsigned_spelling_of_a_dense_integer_is_its_bit_pattern() -> None:
    text = dense_op("[255, 1]", "tensor<2xi8>")
    (const, _) = parse_module(text, FILE).entry().body.ops
    assert const.attr("value").values == (-1, 1)  # type: ignore[union-attr]


def test_top_level_ops_without_a_module_are_wrapped_in_one() -> None:
    func = HEAD.split("\n", 1)[1] + TAIL.rsplit("}) : () -> ()", 1)[0]
    assert '"builtin.module"' not in func
    module = parse_module(func, FILE)
    assert module.op_name == "builtin.module" and (module.loc.line, module.loc.col) == (1, 1)
    assert [op.op_name for op in module.body.ops] == ["func.func"]


def test_a_module_and_another_top_level_op() -> None:
    text = '"builtin.module"() ({\n}) : () -> ()\n"test.x"() : () -> ()\n'
    expect_error(text, '"test.x"', "expected exactly one top-level 'builtin.module'")


def test_empty_module_has_its_block() -> None:
    module = parse_module('"builtin.module"() ({\n}) : () -> ()\n', FILE)
    assert len(module.regions[0].blocks) == 1 and not module.body.ops
    assert print_op(module) == '"builtin.module"() ({\n}) : () -> ()\n'


# ------------------------------------------------------------------------- fuzzing

_TEXTS = [p.read_text() for p in GRAPHS]
_PIECES = ['"', "(", ")", "{", "}", "<", ">", "[", "]", "%", "^", ":", ",", "=", "#", "!", "@",
           "?", "x", "0", "-1", "0x", "1e5", ".", "\\", "\n", " ", "tensor<", "dense<",
           "array<", "loc(", "99999999999999999999", "f16", "i1", "true"]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_programs_fail_only_with_a_located_parse_error(data: st.DataObject) -> None:
    text = data.draw(st.sampled_from(_TEXTS))
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(text)))
        kind = data.draw(st.sampled_from(["insert", "delete", "replace", "truncate"]))
        piece = data.draw(st.sampled_from(_PIECES))
        if kind == "insert":
            text = text[:at] + piece + text[at:]
        elif kind == "delete":
            text = text[:at] + text[at + data.draw(st.integers(1, 8)):]
        elif kind == "replace":
            text = text[:at] + piece + text[at + 1:]
        else:
            text = text[:at]
    try:
        parse_module(text, FILE)
    except ParseError as e:
        assert e.loc is not None and e.loc.file == FILE
        assert 1 <= e.loc.line <= text.count("\n") + 1
        assert 1 <= e.loc.col
        assert str(e).startswith(f"{FILE}:{e.loc.line}:{e.loc.col}: error: ")
