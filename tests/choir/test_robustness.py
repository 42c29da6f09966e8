"""Hostile and extreme inputs: typed errors with locations, bounded resources, kept data.

Each test is one finding of the fuzzing review (untyped exceptions, unbounded
allocation, quadratic parsing, lost string bytes and NaN payloads).
"""

from __future__ import annotations

import resource
import time
import tracemalloc

import numpy as np
import pytest

from accy.choir.attributes import (
    BF16,
    F16,
    F32,
    F64,
    INDEX,
    MAX_DENSE_ELEMENTS,
    MAX_SPLAT_ELEMENTS,
    DenseElementsAttr,
    FloatAttr,
    StringAttr,
    TensorType,
)
from accy.choir.fuzz import pack_body
from accy.choir.parser import parse_module
from accy.choir.printer import print_attribute, print_op
from accy.choir.verifier import verify
from accy.choir.wire import decode, encode, fingerprint
from accy.errors import ParseError, WireFormatError

FILE = "r.mlir"


def attr_module(attr: str) -> str:
    """A module whose one op (line 2, column 3) carries ``v = attr``."""
    return '"builtin.module"() ({\n  "test.op"() {v = ' + attr + '} : () -> ()\n}) : () -> ()\n'


def attr_of(text: str) -> object:
    return parse_module(attr_module(text), FILE).body.ops[0].attr("v")


def expect_parse_error(text: str, message: str, line: int, col: int) -> None:
    with pytest.raises(ParseError) as info:
        parse_module(text, FILE)
    assert message in info.value.message
    loc = info.value.loc
    assert loc is not None and (loc.file, loc.line, loc.col) == (FILE, line, col), str(info.value)


def roundtrip(text: str) -> str:
    """print(parse(text)), checked to be a fixed point and to survive the wire form."""
    m = parse_module(text, FILE)
    printed = print_op(m)
    assert print_op(parse_module(printed, FILE)) == printed
    assert print_op(decode(encode(m))) == printed
    return printed


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ------------------------------------------------------------- typed parse errors

COL = len('  "test.op"() {v = ') + 1  # where the attribute starts on line 2


def test_a_unicode_digit_is_not_a_tensor_dimension() -> None:
    expect_parse_error(attr_module("tensor<²xf32>"), "bad tensor dimension '²'", 2, COL)


@pytest.mark.parametrize("open_, close", [("(", ") -> ()"), ("[", "]")])
def test_a_thousand_nested_brackets_are_too_deep(open_: str, close: str) -> None:
    attr = open_ * 1000 + close * 1000 if open_ == "[" else "(" * 1000 + ")" * 1000
    with pytest.raises(ParseError, match="nesting too deep") as info:
        parse_module(attr_module(attr), FILE)
    assert info.value.loc is not None and info.value.loc.line == 2


def test_a_thousand_nested_brackets_in_a_dense_literal_are_too_deep() -> None:
    lit = "[" * 1000 + "1.0" + "]" * 1000
    with pytest.raises(ParseError, match="nesting too deep") as info:
        parse_module(attr_module(f"dense<{lit}> : tensor<1xf32>"), FILE)
    assert info.value.loc is not None and info.value.loc.line == 2


def test_an_integer_past_the_int_string_limit_is_a_parse_error() -> None:
    expect_parse_error(attr_module("9" * 4301), "integer 999", 2, COL)
    expect_parse_error(attr_module(f"dense<[{'9' * 4301}]> : tensor<1xi64>"),
                       "does not fit in i64", 2, COL + len("dense<"))


@pytest.mark.parametrize("literal, message", [
    ("18446744073709551616 : i64", "does not fit in i64"),
    ("18446744073709551616", "does not fit in i64"),  # an untyped integer is an i64
    ("array<i64: 18446744073709551616>", "does not fit in i64"),
])
def test_integers_must_fit_their_type(literal: str, message: str) -> None:
    with pytest.raises(ParseError, match=message) as info:
        parse_module(attr_module(literal), FILE)
    assert info.value.loc is not None and info.value.loc.line == 2


@pytest.mark.parametrize("ty, message", [
    ("tensor<10000000000000000000000000000000000000000xf32>", "does not fit in int64"),
    ("tensor<9223372036854775808xf32>", "does not fit in int64"),
    ("tensor<4294967296x4294967296xf32>", "more elements than fit in int64"),
])
def test_tensor_dims_must_fit_int64(ty: str, message: str) -> None:
    expect_parse_error(attr_module(ty), message, 2, COL)


def test_a_largest_int64_dimension_still_reads() -> None:
    assert roundtrip(attr_module("tensor<9223372036854775807xf32>")).count("9223372036854775807")


@pytest.mark.parametrize("blob, ty, message", [
    ('"0xFF"', "tensor<1xbf16>", "1 bytes do not hold whole bf16 values"),
    ('"0xFFFFFF"', "tensor<1xf16>", "3 bytes do not hold whole f16 values"),
    ('"0xFFFF"', "tensor<3xi1>", "2 bytes do not hold 3 i1 values"),
])
def test_hex_blobs_of_the_wrong_size(blob: str, ty: str, message: str) -> None:
    expect_parse_error(attr_module(f"dense<{blob}> : {ty}"), message, 2, COL + len("dense<"))


def test_a_splat_past_its_shape_limit_is_a_parse_error() -> None:
    side = 1 << 19  # 2^38 elements > MAX_SPLAT_ELEMENTS = 2^36
    assert side * side > MAX_SPLAT_ELEMENTS
    expect_parse_error(attr_module(f"dense<1.0> : tensor<{side}x{side}xf32>"),
                       "exceed the limit", 2, COL)


def test_a_result_group_needs_a_result() -> None:
    text = '"builtin.module"() ({\n  %0:0 = "test.op"() : () -> ()\n}) : () -> ()\n'
    expect_parse_error(text, "at least one result", 2, 6)


def test_a_location_line_past_the_int_string_limit_is_unknown() -> None:
    text = ('"builtin.module"() ({\n  "test.op"() : () -> () loc("a.mlir":' + "9" * 5000
            + ':1)\n}) : () -> ()\n')
    parse_module(text, FILE)


# ---------------------------------------------------------------------- index type


def test_index_tensors_round_trip() -> None:
    printed = roundtrip(attr_module("dense<[1, -2, 9223372036854775807]> : tensor<3xindex>"))
    assert "dense<[1, -2, 9223372036854775807]> : tensor<3xindex>" in printed
    a = attr_of("dense<[1, -2, 3]> : tensor<3xindex>")
    assert isinstance(a, DenseElementsAttr) and a.type == TensorType((3,), INDEX)
    assert roundtrip(attr_module("tensor<4x?xindex>")).count("tensor<4x?xindex>") == 1


# -------------------------------------------------------------- bounded resources


def _splat_program(shape: str) -> str:
    t = f"tensor<{shape}xf32>"
    return ('"builtin.module"() ({\n'
            f'  "func.func"() <{{function_type = () -> {t}, sym_name = "main"}}> ({{\n'
            f'    %0 = "semantic.constant"() {{value = dense<1.0> : {t}}} : () -> {t}\n'
            f'    "func.return"(%0) : ({t}) -> ()\n'
            '  }) : () -> ()\n}) : () -> ()\n')


def test_a_huge_splat_is_never_materialised() -> None:
    before = rss_mib()
    start = time.perf_counter()
    m = parse_module(_splat_program("100000x100000"), FILE)  # 10^10 f32: 40 GB if held
    verify(m)
    fp = fingerprint(m)
    data = encode(m)
    back = decode(data)
    assert fingerprint(back) == fp and len(data) < 400
    assert "dense<1.0e+00> : tensor<100000x100000xf32>" in print_op(back)
    assert time.perf_counter() - start < 2 and rss_mib() - before < 100


def _wire_const(shape: list[int], splat: bool, payload: bytes, el: str = "f32") -> bytes:
    op = ["test.c", [], [], [["v", [7, [0, shape, el], splat, payload]]], [], [], None]
    return pack_body(op)


def test_a_tiny_wire_splat_with_a_huge_shape_fingerprints_in_constant_space() -> None:
    data = _wire_const([1 << 18, 1 << 18], True, b"\x00\x00\x80\x3f")  # 2^36 elements
    assert len(data) < 60
    before = rss_mib()
    fingerprint(decode(data))
    assert rss_mib() - before < 50


def test_a_non_splat_past_the_limit_is_rejected_before_allocation() -> None:
    data = _wire_const([MAX_DENSE_ELEMENTS + 1], False, b"\x00" * 4)
    with pytest.raises(WireFormatError, match="dense elements too large"):
        decode(data)


def test_dense_wire_payloads_decode_from_their_buffer() -> None:
    values = np.arange(1 << 22, dtype=np.float32)  # 16 MiB
    data = _wire_const([values.size], False, values.tobytes())
    tracemalloc.start()
    try:
        start = time.perf_counter()
        a = decode(data).attr("v")
        elapsed = time.perf_counter() - start
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert isinstance(a, DenseElementsAttr)
    np.testing.assert_array_equal(a.to_numpy(), values)
    assert peak <= 2 * values.nbytes, peak / values.nbytes
    assert elapsed < 1.0


def _ops(n_bytes: int) -> str:
    t = "tensor<8x16xf32>"
    head = ('"builtin.module"() ({\n'
            f'  "func.func"() <{{function_type = ({t}) -> {t}, sym_name = "main"}}> ({{\n'
            f'  ^bb0(%x: {t}):\n')
    line = '    %{i} = "semantic.add"(%x, %x) : ({t}, {t}) -> {t}\n'
    n = n_bytes // len(line.format(i=1000, t=t))
    body = "".join(line.format(i=i, t=t) for i in range(n))
    return head + body + f'    "func.return"(%x) : ({t}) -> ()\n  }}) : () -> ()\n}}) : () -> ()\n'


def test_parsing_is_linear_in_the_text() -> None:
    def seconds(text: str) -> float:
        start = time.perf_counter()
        parse_module(text, FILE)
        return time.perf_counter() - start

    small, large = _ops(50_000), _ops(800_000)
    t_small = min(seconds(small) for _ in range(3))
    t_large = seconds(large)
    assert t_large < 16 * 2 * t_small + 0.2  # 16x the text: linear, with room for noise


def test_errors_deep_in_a_large_file_point_at_their_line() -> None:
    text = _ops(300_000)
    lines = text.splitlines()
    k = len(lines) - 5
    lines[k] = lines[k].replace('"semantic.add"(%x', '"semantic.add"(%nope')
    with pytest.raises(ParseError, match="undefined value") as info:
        parse_module("\n".join(lines) + "\n", FILE)
    assert info.value.loc is not None and info.value.loc.line == k + 1


# ----------------------------------------------------------------- preserved data


def test_string_escapes_are_utf8_bytes() -> None:
    a = attr_of('"caf\\C3\\A9"')
    assert a == StringAttr("café")
    printed = roundtrip(attr_module('"caf\\C3\\A9 \\E2\\82\\AC \\01 \\7F \\n \\t \\22 \\\\"'))
    back = parse_module(printed, FILE).body.ops[0].attr("v")
    assert back == StringAttr("café € \x01 \x7f \n \t \" \\")


def test_strings_that_are_not_utf8_are_a_parse_error() -> None:
    expect_parse_error(attr_module('"ab\\FF"'), "not valid UTF-8", 2, COL)


def test_non_printable_characters_print_as_their_utf8_bytes() -> None:
    assert print_attribute(StringAttr("a\x85b\u2028")) == '"a\\C2\\85b\\E2\\80\\A8"'
    assert print_attribute(StringAttr("café")) == '"café"'


@pytest.mark.parametrize("literal", [
    "0x7FC00001 : f32", "0x7F800001 : f32", "0xFFC12345 : f32", "0x7E01 : f16",
    "0x7FC1 : bf16", "0x7F81 : bf16", "0x7FF0000000000001 : f64", "0xFFF8000000000123 : f64",
])
def test_nan_payloads_survive_print_parse_and_wire(literal: str) -> None:
    assert f"v = {literal}" in roundtrip(attr_module(literal))


def test_dense_nan_payloads_survive_print_parse_and_wire() -> None:
    for lit, ty in (("[0x7FC00001, 1.0e+00, 0x7F800001, 0xFF800000]", "tensor<4xf32>"),
                    ("[0x7E01, 0xFC01]", "tensor<2xf16>"), ("[0x7FC1, 0x7F81]", "tensor<2xbf16>"),
                    ("[0x7FF0000000000001, 2.0e+00]", "tensor<2xf64>")):
        assert f"dense<{lit}> : {ty}" in roundtrip(attr_module(f"dense<{lit}> : {ty}"))


def test_nans_with_different_payloads_differ() -> None:
    a, b = attr_of("0x7FC00001 : f32"), attr_of("0x7FC00002 : f32")
    assert a != b and a == attr_of("0x7FC00001 : f32")
    m1 = parse_module(attr_module("dense<0x7FC00001> : tensor<2xf32>"))
    m2 = parse_module(attr_module("dense<0x7FC00002> : tensor<2xf32>"))
    assert fingerprint(m1) != fingerprint(m2)


def test_nan_payloads_are_kept_from_python_values_too() -> None:
    (nan,) = np.array([0x7FC00001], np.uint32).view(np.float32).astype(np.float64).tolist()
    assert print_attribute(FloatAttr(nan, F32)) == "0x7FC00001 : f32"
    d = DenseElementsAttr(TensorType((2,), F32), (nan, 1.0))
    assert print_attribute(d) == "dense<[0x7FC00001, 1.0e+00]> : tensor<2xf32>"
    for t in (F16, BF16, F64):
        assert FloatAttr(float("nan"), t) == FloatAttr(float("nan"), t)


def test_a_deep_rank_constant_prints_without_recursion() -> None:
    a = DenseElementsAttr(TensorType((1,) * 3000 + (2,), F32), (1.0, 2.0))
    text = print_attribute(a)
    assert text.startswith("dense<" + "[" * 3001 + "1.0e+00, 2.0e+00" + "]" * 3001)


def test_empty_tensors_read_back() -> None:
    assert "dense<[[], [], []]> : tensor<3x0xf32>" in roundtrip(
        attr_module("dense<> : tensor<3x0xf32>"))
    assert "dense<> : tensor<0x4xf32>" in roundtrip(attr_module("dense<[]> : tensor<0x4xf32>"))
    assert "dense<[]> : tensor<0xf32>" in roundtrip(attr_module("dense<> : tensor<0xf32>"))


def test_a_huge_rank_reads_in_linear_time() -> None:
    start = time.perf_counter()
    ty = "tensor<" + "2x" * 100_000 + "f32>"
    expect_parse_error(attr_module(ty), "more elements than fit in int64", 2, COL)
    assert roundtrip(attr_module("tensor<" + "1x" * 100_000 + "?xf32>")).count("1x") == 100_000
    assert time.perf_counter() - start < 5
