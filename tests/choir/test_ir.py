"""The IR core: cloning, erasing, use lists, walk order, equality and hashing of ops,
values, types and attributes, dense constants, and float rounding and spelling."""

from __future__ import annotations

import dataclasses
import math
import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accy.choir.attributes import (
    BF16,
    F16,
    F32,
    F64,
    I1,
    I32,
    ArrayAttr,
    Attribute,
    BoolAttr,
    DenseArrayAttr,
    DenseElementsAttr,
    DictAttr,
    FloatAttr,
    FunctionType,
    IntegerAttr,
    OpaqueType,
    ScalarType,
    StringAttr,
    SymbolRefAttr,
    TensorType,
    TypeAttr,
    UnitAttr,
    round_bf16,
)
from accy.choir.builtin import FuncOp, ModuleOp, ReturnOp
from accy.choir.ir import Block, Operation, Region, Value
from accy.choir.parser import parse_file, parse_module
from accy.choir.printer import print_attribute, print_op

GRAPHS = sorted((Path(__file__).resolve().parents[2] / "graphs").glob("*.mlir"))
T4 = TensorType((4,), F32)


def chain() -> tuple[ModuleOp, FuncOp, list[Operation]]:
    """``main(x) { a = neg x; b = add a, a; c = exp b; return c }``."""
    module = ModuleOp.build()
    func = FuncOp.build("main", [T4], [T4])
    module.body.append(func)
    x = func.body.args[0]
    a = func.body.append(Operation.create("semantic.neg", [x], [T4]))
    b = func.body.append(Operation.create("semantic.add", [a.result, a.result], [T4]))
    c = func.body.append(Operation.create("semantic.exp", [b.result], [T4]))
    func.body.append(ReturnOp([c.result]))
    return module, func, [a, b, c]


def users(v: Value) -> list[tuple[str, int]]:
    return sorted((op.op_name, i) for op, i in v.uses)


# --------------------------------------------------------------------------- clone


@pytest.mark.parametrize("path", GRAPHS, ids=[p.name for p in GRAPHS])
def test_clone_is_deep_and_independent(path: Path) -> None:
    module = parse_file(str(path))
    before = print_op(module, debuginfo=True)
    copy = module.clone()
    assert print_op(copy, debuginfo=True) == before
    originals = {id(x) for op in module.walk() for x in (op, *op.results, *op.regions)}
    originals |= {id(a) for op in module.walk() for r in op.regions for b in r.blocks
                  for a in (b, *b.args)}
    for op in copy.walk():
        assert id(op) not in originals
        assert all(id(v) not in originals for v in op.operands)  # remapped, not shared
        for r in op.regions:
            assert id(r) not in originals
            assert all(id(b) not in originals and all(id(a) not in originals for a in b.args)
                       for b in r.blocks)
    # mutate the copy in every way; the original's print does not move
    for op in list(copy.walk()):
        op.attributes["mutated"] = UnitAttr()
        op.properties.pop("sym_name", None)
        for r in op.results:
            r.type = TensorType((1,), I32)
    func = copy.body.ops[0]
    func.body.args[0].type = TensorType((2,), F16)
    first = func.body.ops[0]
    if first.operands:
        first.set_operand(0, func.body.args[-1])
    for r in first.results:
        r.replace_all_uses_with(func.body.args[0])
    first.erase()
    assert print_op(module, debuginfo=True) == before


def test_clone_remaps_operands_through_the_mapping() -> None:
    _, func, (a, b, _) = chain()
    outside = Block([T4]).args[0]
    mapping: dict[Value, Value] = {a.result: outside}
    copy = b.clone(mapping)
    assert copy.operands == (outside, outside)
    assert mapping[b.result] is copy.result
    assert users(outside) == [("semantic.add", 0), ("semantic.add", 1)]
    assert users(a.result) == [("semantic.add", 0), ("semantic.add", 1)]  # the original's


def test_clone_of_an_unmapped_operand_shares_the_outer_value() -> None:
    _, func, (a, b, _) = chain()
    copy = b.clone()
    assert copy.operands == (a.result, a.result)
    assert len(a.result.uses) == 4  # the original add and the copy, two operands each


def test_clone_keeps_locations_and_attributes_by_value() -> None:
    module = parse_file(str(GRAPHS[0]))
    copy = module.clone()
    for op, twin in zip(module.walk(), copy.walk()):
        assert op.loc == twin.loc
        assert op.attributes == twin.attributes and op.attributes is not twin.attributes
        assert op.properties == twin.properties and op.properties is not twin.properties
        assert type(op) is type(twin)


# ----------------------------------------------------------------- uses and erase


def test_use_lists() -> None:
    _, func, (a, b, c) = chain()
    x = func.body.args[0]
    assert users(x) == [("semantic.neg", 0)]
    assert users(a.result) == [("semantic.add", 0), ("semantic.add", 1)]
    assert users(c.result) == [("func.return", 0)]
    assert a.result.has_uses and x.owner is func.body and a.result.owner is a


def test_erase_drops_uses() -> None:
    module, func, (a, b, c) = chain()
    ret = func.return_op
    ret.set_operand(0, b.result)
    assert not c.result.has_uses
    c.erase()
    assert c.parent is None and c not in func.body.ops
    assert users(b.result) == [("func.return", 0)]
    ret.set_operand(0, func.body.args[0])
    b.erase()
    assert not a.result.has_uses
    a.erase()
    assert users(func.body.args[0]) == [("func.return", 0)]
    assert [op.op_name for op in func.body.ops] == ["func.return"]


def test_erase_drops_the_uses_of_nested_ops() -> None:
    module, func, (a, b, c) = chain()
    inner = Block()
    region_op = Operation.create("test.region", [], [], regions=[Region([inner])])
    inner.append(Operation.create("test.use", [a.result, func.body.args[0]], []))
    func.body.insert_before(func.return_op, region_op)
    assert len(a.result.uses) == 3
    region_op.erase()
    assert users(a.result) == [("semantic.add", 0), ("semantic.add", 1)]
    assert users(func.body.args[0]) == [("semantic.neg", 0)]


def test_replace_all_uses_with_updates_every_user() -> None:
    _, func, (a, b, c) = chain()
    x = func.body.args[0]
    a.result.replace_all_uses_with(x)
    assert b.operands == (x, x)
    assert not a.result.has_uses
    assert users(x) == [("semantic.add", 0), ("semantic.add", 1), ("semantic.neg", 0)]
    c.result.replace_all_uses_with(b.result)
    assert func.return_op.operands == (b.result,)
    assert users(b.result) == [("func.return", 0), ("semantic.exp", 0)]


def test_replace_all_uses_across_regions() -> None:
    module, func, (a, b, c) = chain()
    inner = Block()
    inner.append(Operation.create("test.use", [a.result], []))
    func.body.insert_before(func.return_op,
                            Operation.create("test.region", [], [], regions=[Region([inner])]))
    a.result.replace_all_uses_with(func.body.args[0])
    assert inner.ops[0].operands == (func.body.args[0],)
    assert not a.result.has_uses


def test_set_operands_rewires_uses() -> None:
    _, func, (a, b, c) = chain()
    x = func.body.args[0]
    b.set_operands([x, c.result])
    assert not a.result.has_uses
    assert users(c.result) == [("func.return", 0), ("semantic.add", 1)]


# ------------------------------------------------------------------------- walking


def test_walk_is_pre_order() -> None:
    text = '''"builtin.module"() ({
  "test.a"() ({
    "test.a1"() ({
      "test.a1x"() : () -> ()
    }) : () -> ()
    "test.a2"() : () -> ()
  }, {
    "test.a3"() : () -> ()
  ^bb1:
    "test.a4"() : () -> ()
  }) : () -> ()
  "test.b"() : () -> ()
}) : () -> ()
'''
    names = [op.op_name for op in parse_module(text).walk()]
    assert names == ["builtin.module", "test.a", "test.a1", "test.a1x", "test.a2", "test.a3",
                     "test.a4", "test.b"]


def test_walk_tolerates_erasing_the_current_op() -> None:
    module, func, (a, b, c) = chain()
    func.return_op.set_operand(0, func.body.args[0])
    seen = []
    for op in module.walk():
        seen.append(op.op_name)
        if op.op_name == "semantic.exp":
            op.erase()
    assert "semantic.exp" in seen and "func.return" in seen
    assert [op.op_name for op in func.body.ops] == ["semantic.neg", "semantic.add", "func.return"]


def test_parent_links() -> None:
    module, func, (a, _, _) = chain()
    assert a.parent is func.body and a.parent_op is func and func.parent_op is module
    assert module.parent_op is None


# ------------------------------------------------------------ identity and equality


def test_ops_and_values_compare_by_identity() -> None:
    _, func, (a, _, _) = chain()
    twin = Operation.create("semantic.neg", [func.body.args[0]], [T4])
    assert twin != a and a == a
    assert len({a, twin, a.clone()}) == 3
    assert a.result != twin.result and len({a.result, twin.result}) == 2
    b1, b2 = Block([T4]), Block([T4])
    assert b1 != b2 and b1.args[0] != b2.args[0]
    assert Region() != Region()


TYPES_AND_ATTRS: list[tuple[object, object]] = [
    (lambda: TensorType((None, 4096), F32), lambda: TensorType((None, 4096), F32)),
    (lambda: FunctionType((T4,), (T4, T4)), lambda: FunctionType((T4,), (T4, T4))),
    (lambda: OpaqueType("memory.arena"), lambda: OpaqueType("memory.arena")),
    (lambda: ScalarType("bf16"), lambda: BF16),
    (lambda: IntegerAttr(3), lambda: IntegerAttr(3, ScalarType("i64"))),
    (lambda: FloatAttr(0.1, F32), lambda: FloatAttr(float(np.float32(0.1)), F32)),
    (lambda: FloatAttr(float("nan"), F32), lambda: FloatAttr(float("nan"), F32)),
    (lambda: StringAttr("none"), lambda: StringAttr("none")),
    (lambda: BoolAttr(True), lambda: BoolAttr(True)),
    (lambda: UnitAttr(), lambda: UnitAttr()),
    (lambda: TypeAttr(T4), lambda: TypeAttr(TensorType((4,), F32))),
    (lambda: DenseArrayAttr((1, 0)), lambda: DenseArrayAttr((1, 0))),
    (lambda: DenseElementsAttr(T4, (1.0, 2.0, 3.0, 4.0)),
     lambda: DenseElementsAttr(T4, [1, 2, 3, 4])),  # type: ignore[arg-type]
    (lambda: ArrayAttr((IntegerAttr(1), UnitAttr())), lambda: ArrayAttr((IntegerAttr(1),
                                                                         UnitAttr()))),
    (lambda: DictAttr((("b", UnitAttr()), ("a", IntegerAttr(1)))),
     lambda: DictAttr((("a", IntegerAttr(1)), ("b", UnitAttr())))),
    (lambda: SymbolRefAttr("main"), lambda: SymbolRefAttr("main")),
]


@pytest.mark.parametrize("make_a, make_b", TYPES_AND_ATTRS,
                         ids=[f"{i}" for i in range(len(TYPES_AND_ATTRS))])
def test_types_and_attributes_have_value_equality_and_hash(make_a, make_b) -> None:  # type: ignore[no-untyped-def]
    a, b = make_a(), make_b()
    assert a == b and hash(a) == hash(b)
    assert a is not b or isinstance(a, ScalarType)
    assert len({a, b}) == 1
    assert {a: 1}[b] == 1
    for f in dataclasses.fields(a):  # type: ignore[arg-type]
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(a, f.name, getattr(b, f.name))


@pytest.mark.parametrize("a, b", [
    (TensorType((4,), F32), TensorType((4,), F16)),
    (TensorType((4,), F32), TensorType((None,), F32)),
    (IntegerAttr(3, I32), IntegerAttr(3)),
    (FloatAttr(1.0, F32), FloatAttr(1.0, F16)),
    (FloatAttr(0.0), FloatAttr(-0.0)),
    (FloatAttr(float("nan")), FloatAttr(-float("nan"))),
    (StringAttr("a"), SymbolRefAttr("a")),
    (DenseArrayAttr((1, 0)), DenseArrayAttr((0, 1))),
    (DenseElementsAttr(T4, (0.0,)), DenseElementsAttr(T4, (-0.0,))),
    (BoolAttr(True), IntegerAttr(1)),
])
def test_different_types_and_attributes_differ(a: object, b: object) -> None:
    assert a != b


def test_dict_attr_sorts_its_entries() -> None:
    d = DictAttr((("z", UnitAttr()), ("a", IntegerAttr(1))))
    assert [k for k, _ in d.entries] == ["a", "z"]
    assert d.get("a") == IntegerAttr(1) and d.get("q") is None
    assert d.as_dict() == {"a": IntegerAttr(1), "z": UnitAttr()}


# ------------------------------------------------------------------ dense elements


def test_dense_splat_normalization() -> None:
    t = TensorType((2, 3), F32)
    splat = DenseElementsAttr(t, (2.0,))
    assert splat.splat and splat.values == (2.0,)
    every = DenseElementsAttr(t, (2.0,) * 6)
    assert every == splat and hash(every) == hash(splat) and every.splat
    assert DenseElementsAttr.from_numpy(np.full((2, 3), 2.0, np.float32), t) == splat
    np.testing.assert_array_equal(splat.to_numpy(), np.full((2, 3), 2.0, np.float32))
    assert print_attribute(every) == "dense<2.0e+00> : tensor<2x3xf32>"


def test_dense_one_element_is_never_a_splat() -> None:
    for t in (TensorType((), F32), TensorType((1, 1), F32)):
        a = DenseElementsAttr(t, (5.0,), splat=True)
        assert not a.splat
        assert a == DenseElementsAttr(t, (5.0,))
        assert a.to_numpy().shape == t.shape


def test_dense_values_that_differ_only_in_sign_or_are_nan_stay_apart() -> None:
    t = TensorType((2,), F32)
    zeros = DenseElementsAttr(t, (0.0, -0.0))
    assert not zeros.splat and math.copysign(1, zeros.values[1]) == -1
    nans = DenseElementsAttr(t, (float("nan"), float("nan")))
    assert nans.splat and nans == DenseElementsAttr(t, (float("nan"),))
    mixed = DenseElementsAttr.from_numpy(np.array([0.0, -0.0], np.float32), t)
    assert mixed == zeros


def test_dense_values_are_held_in_their_type() -> None:
    t = TensorType((3,), F16)
    a = DenseElementsAttr(t, (0.1, 70000.0, 1))
    assert a.values == (float(np.float16(0.1)), math.inf, 1.0)
    b = DenseElementsAttr(TensorType((3,), I1), (1, 0, 5))
    assert b.values == (True, False, True)
    c = DenseElementsAttr(TensorType((2,), I32), (3.0, np.int64(4)))
    assert c.values == (3, 4) and all(type(v) is int for v in c.values)


@pytest.mark.parametrize("literal, ty", [
    ("[[1.0, 2.0], [3.0, 4.0]]", "tensor<2x2xf32>"),
    ("[true, false, true]", "tensor<3xi1>"),
    ("[-1, 2147483647]", "tensor<2xi32>"),
    ("7", "tensor<2x3xi64>"),
    ("5.0e-01", "tensor<f16>"),
    ('"0x0000803F00000040"', "tensor<2xf32>"),
    ('"0x0000803F"', "tensor<3xf32>"),
])
def test_dense_literals_read_back_after_printing(literal: str, ty: str) -> None:
    a = reparse(f"dense<{literal}> : {ty}")
    assert isinstance(a, DenseElementsAttr)
    assert reparse(print_attribute(a)) == a


# ------------------------------------------------------------------ float rounding


def test_float_attr_rounds_to_its_type() -> None:
    assert FloatAttr(0.1, F32).value == float(np.float32(0.1)) != 0.1
    assert FloatAttr(0.1, F16).value == float(np.float16(0.1))
    assert FloatAttr(0.1, F64).value == 0.1
    assert FloatAttr(1e39, F32).value == math.inf
    assert FloatAttr(-1e5, F16).value == -math.inf
    assert FloatAttr(1e-46, F32).value == 0.0
    assert FloatAttr(1e-45, F32).value == float(np.float32(1e-45)) > 0  # a subnormal


@pytest.mark.parametrize("x, want", [
    (1.0 + 2**-8, 1.0),                 # halfway, ties to even (down)
    (1.0 + 3 * 2**-8, 1.0 + 2**-6),     # halfway, ties to even (up)
    (1.0 + 2**-8 + 2**-20, 1.0 + 2**-7),  # just above halfway
    (3.4e38, math.inf),                 # rounds past the largest bf16
    (-0.0, -0.0),
    (2.0**-133, 2.0**-133),             # a subnormal that bf16 holds exactly
    (2.0**-133 + 2.0**-149, 2.0**-133),  # a subnormal just above it rounds down
])
def test_bf16_rounds_to_nearest_even(x: float, want: float) -> None:
    got = FloatAttr(x, BF16).value
    assert got == want and math.copysign(1, got) == math.copysign(1, want)
    assert got == round_bf16(x)
    bits = struct.unpack("<I", struct.pack("<f", got))[0]
    assert bits & 0xFFFF == 0  # representable in bf16


# -------------------------------------------------------------- float spellings


def reparse(attr_text: str) -> Attribute:
    text = f'"builtin.module"() ({{\n  "test.a"() {{v = {attr_text}}} : () -> ()\n}}) : () -> ()\n'
    return parse_module(text).body.ops[0].attributes["v"]


def same_float(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b) and math.copysign(1, a) == math.copysign(1, b)
    return a == b and math.copysign(1, a) == math.copysign(1, b)


SPECIAL_F32 = [0.0, -0.0, math.inf, -math.inf, math.nan, -math.nan, 1e-45, -1e-45,
               1.1754942e-38, 1.17549435e-38, 3.4028234663852886e38, 1e-5, 0.1, 1 / 3]


@pytest.mark.parametrize("t", [F32, F16, BF16, F64], ids=str)
@pytest.mark.parametrize("x", SPECIAL_F32, ids=repr)
def test_special_floats_read_back_exactly(t: ScalarType, x: float) -> None:
    a = FloatAttr(x, t)
    back = reparse(print_attribute(a))
    assert isinstance(back, FloatAttr) and back.type == t
    assert same_float(back.value, a.value), print_attribute(a)
    assert back == a


def test_non_finite_floats_print_as_bit_patterns() -> None:
    assert print_attribute(FloatAttr(math.inf, F32)) == "0x7F800000 : f32"
    assert print_attribute(FloatAttr(-math.inf, F16)) == "0xFC00 : f16"
    assert print_attribute(FloatAttr(math.nan, BF16)) == "0x7FC0 : bf16"
    assert print_attribute(FloatAttr(-math.inf, F64)) == "0xFFF0000000000000 : f64"


def test_finite_floats_print_in_scientific_form_with_a_dot() -> None:
    for t in (F32, F16, BF16, F64):
        for x in (1.0, 1e-5, -2.5, 65504.0):
            text = print_attribute(FloatAttr(x, t)).split(" : ")[0]
            assert "." in text and "e" in text, text


@settings(max_examples=400, deadline=None)
@given(st.floats(width=32, allow_nan=True, allow_infinity=True, allow_subnormal=True))
def test_f32_spelling_reads_back_exactly(x: float) -> None:
    a = FloatAttr(x, F32)
    assert a.value == x or math.isnan(x)  # a float32 value is already exact
    back = reparse(print_attribute(a))
    assert same_float(back.value, a.value), print_attribute(a)  # type: ignore[attr-defined]
    assert back == a and hash(back) == hash(a)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 0xFFFF))
def test_f16_spelling_reads_back_exactly(bits: int) -> None:
    x = float(np.array(bits, np.uint16).view(np.float16))
    a = FloatAttr(x, F16)
    back = reparse(print_attribute(a))
    assert same_float(back.value, a.value), print_attribute(a)  # type: ignore[attr-defined]


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 0xFFFF))
def test_bf16_spelling_reads_back_exactly(bits: int) -> None:
    x = struct.unpack("<f", struct.pack("<I", bits << 16))[0]
    a = FloatAttr(x, BF16)
    assert same_float(a.value, x)  # every bf16 bit pattern is held exactly
    back = reparse(print_attribute(a))
    assert same_float(back.value, a.value), print_attribute(a)  # type: ignore[attr-defined]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(width=32, allow_subnormal=True), min_size=1, max_size=12))
def test_f32_dense_elements_read_back_exactly(xs: list[float]) -> None:
    a = DenseElementsAttr(TensorType((len(xs),), F32), tuple(xs))
    back = reparse(print_attribute(a))
    assert back == a
    assert all(same_float(p, q) for p, q in zip(back.values, a.values))  # type: ignore[attr-defined]
