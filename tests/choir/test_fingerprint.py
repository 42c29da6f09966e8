"""Fingerprints: stable across processes, blind to names, layout and locations, and
sensitive to every attribute, type and op."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from accy.choir.attributes import F32, BoolAttr, StringAttr, TensorType
from accy.choir.builtin import FuncOp, ModuleOp, ReturnOp
from accy.choir.ir import Operation
from accy.choir.location import Location
from accy.choir.wire import fingerprint
from accy.preparation.products import SemanticModule

ROOT = Path(__file__).resolve().parents[2]
GRAPHS = sorted((ROOT / "graphs").glob("*.mlir"))
HEX32 = re.compile(r"[0-9a-f]{32}")

BASE = '''"builtin.module"() ({
  "func.func"() <{function_type = (tensor<?x64xf32>, tensor<64xf32>) -> tensor<?x64xf32>, sym_name = "main"}> ({
  ^bb0(%x: tensor<?x64xf32>, %b: tensor<64xf32>):
    %0 = "semantic.add"(%x, %b) : (tensor<?x64xf32>, tensor<64xf32>) -> tensor<?x64xf32>
    %1 = "semantic.gelu"(%0) {approximate = "tanh"} : (tensor<?x64xf32>) -> tensor<?x64xf32>
    %2 = "semantic.softmax"(%1) {axis = -1 : i64} : (tensor<?x64xf32>) -> tensor<?x64xf32>
    %3 = "semantic.reduce_sum"(%2) {axes = array<i64: 1>, keepdims = true} : (tensor<?x64xf32>) -> tensor<?x1xf32>
    %4 = "semantic.constant"() {value = dense<2.500000e-01> : tensor<f32>} : () -> tensor<f32>
    %5 = "semantic.mul"(%3, %4) : (tensor<?x1xf32>, tensor<f32>) -> tensor<?x1xf32>
    %6 = "semantic.sub"(%2, %5) : (tensor<?x64xf32>, tensor<?x1xf32>) -> tensor<?x64xf32>
    "func.return"(%6) : (tensor<?x64xf32>) -> ()
  }) : () -> ()
}) : () -> ()
'''


def fp(text: str, file: str = "f.mlir") -> str:
    return SemanticModule.from_text(text, file).fingerprint()


def changed(old: str, new: str, count: int = 1) -> str:
    assert BASE.count(old) == count, old
    return BASE.replace(old, new)


def test_is_32_hex_chars() -> None:
    for path in GRAPHS:
        assert HEX32.fullmatch(SemanticModule.from_file(str(path)).fingerprint())


def test_graphs_have_distinct_fingerprints() -> None:
    prints = {SemanticModule.from_file(str(p)).fingerprint() for p in GRAPHS}
    assert len(prints) == len(GRAPHS)


def test_equal_in_separate_processes() -> None:
    path = "graphs/mlp.mlir"
    code = ("from accy.preparation.products import SemanticModule; "
            f"print(SemanticModule.from_file({path!r}).fingerprint())")
    outs = []
    for seed in ("1", "2"):  # different str hash seeds: nothing may depend on set/dict order
        env = {**os.environ, "PYTHONHASHSEED": seed}
        proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        outs.append(proc.stdout.strip())
    here = SemanticModule.from_file(str(ROOT / path)).fingerprint()
    assert outs[0] == outs[1] == here
    assert HEX32.fullmatch(here)


def test_module_and_product_fingerprints_agree() -> None:
    sm = SemanticModule.from_text(BASE)
    assert sm.fingerprint() == fingerprint(sm.module)


# ------------------------------------------------------------------------ blind to


def test_renaming_ssa_values() -> None:
    renamed = BASE.replace("%x", "%input").replace("%b", "%bias")
    for i in range(7):
        renamed = re.sub(rf"%{i}\b", f"%t{i}", renamed)
    assert "%0" not in renamed and "%input" in renamed
    assert fp(renamed) == fp(BASE)


def test_whitespace_comments_and_blank_lines() -> None:
    moved = "// a header comment\n\n\n" + BASE.replace("\n    ", "\n\n      // note\n          ")
    moved = moved.replace(", ", " ,   ").replace("(%x", "(  %x")
    assert moved.count("\n") > BASE.count("\n") + 10
    assert fp(moved) == fp(BASE)


def test_file_name_and_explicit_locations() -> None:
    located = BASE.replace(' : (tensor<?x64xf32>) -> tensor<?x64xf32>\n',
                           ' : (tensor<?x64xf32>) -> tensor<?x64xf32> loc("model.py":12:3)\n')
    assert "loc(" in located
    assert fp(located, "a.mlir") == fp(BASE, "b.mlir")


def test_property_spelling_as_attributes_dictionary_is_sorted() -> None:
    # attribute order in the text does not matter
    swapped = changed("{axes = array<i64: 1>, keepdims = true}",
                      "{keepdims = true, axes = array<i64: 1>}")
    assert fp(swapped) == fp(BASE)


def test_programmatic_module_equals_parsed_one() -> None:
    text = ('"builtin.module"() ({\n'
            '  "func.func"() <{function_type = (tensor<4xf32>) -> tensor<4xf32>, '
            'sym_name = "main"}> ({\n'
            '  ^bb0(%x: tensor<4xf32>):\n'
            '    %0 = "semantic.neg"(%x) : (tensor<4xf32>) -> tensor<4xf32>\n'
            '    "func.return"(%0) : (tensor<4xf32>) -> ()\n'
            '  }) : () -> ()\n'
            '}) : () -> ()\n')
    t = TensorType((4,), F32)
    module = ModuleOp.build(Location("elsewhere.py", 99, 1))
    func = FuncOp.build("main", [t], [t])
    module.body.append(func)
    neg = func.body.append(Operation.create("semantic.neg", [func.body.args[0]], [t]))
    func.body.append(ReturnOp([neg.result]))
    assert fingerprint(module) == fp(text)


# ---------------------------------------------------------------------- changed by


@pytest.mark.parametrize("old, new", [
    ('approximate = "tanh"', 'approximate = "none"'),
    ("axis = -1 : i64", "axis = 1 : i64"),
    ("axes = array<i64: 1>", "axes = array<i64: -1>"),
    ("dense<2.500000e-01>", "dense<2.500001e-01>"),
    ('sym_name = "main"', 'sym_name = "main2"'),
], ids=["string", "integer", "array", "dense", "property"])
def test_any_attribute_value_change(old: str, new: str) -> None:
    assert fp(changed(old, new)) != fp(BASE)


def test_bool_attribute_change() -> None:
    sm = SemanticModule.from_text(BASE)
    before = sm.fingerprint()
    (reduce,) = [op for op in sm.module.walk() if op.op_name == "semantic.reduce_sum"]
    reduce.attributes["keepdims"] = BoolAttr(False)
    assert fingerprint(sm.module) != before


def test_float_attribute_change_of_one_ulp() -> None:
    a = BASE.replace('{axis = -1 : i64}', '{axis = -1 : i64, t = 1.0 : f32}')
    b = BASE.replace('{axis = -1 : i64}', '{axis = -1 : i64, t = 1.00000012 : f32}')
    ma, mb = (SemanticModule.from_text(x) for x in (a, b))
    assert ma.fingerprint() != mb.fingerprint() != fp(BASE)


def test_adding_an_attribute() -> None:
    sm = SemanticModule.from_text(BASE)
    before = sm.fingerprint()
    op = sm.entry().body.ops[0]
    op.attributes["fused"] = StringAttr("")
    assert fingerprint(sm.module) != before


def test_type_change() -> None:
    static = BASE.replace("?x64", "8x64").replace("?x1", "8x1")
    assert fp(static) != fp(BASE)
    f16 = BASE.replace("f32", "f16")
    assert fp(f16) != fp(BASE) != fp(static)


def test_op_change() -> None:
    assert fp(changed('"semantic.sub"', '"semantic.add"')) != fp(BASE)
    assert fp(changed('"semantic.mul"(%3, %4)', '"semantic.div"(%3, %4)')) != fp(BASE)


def test_operand_order_change() -> None:
    swapped = changed('"semantic.add"(%x, %b) : (tensor<?x64xf32>, tensor<64xf32>)',
                      '"semantic.add"(%b, %x) : (tensor<64xf32>, tensor<?x64xf32>)')
    assert fp(swapped) != fp(BASE)


def test_wiring_change_with_the_same_ops() -> None:
    rewired = changed('"semantic.sub"(%2, %5)', '"semantic.sub"(%1, %5)')
    assert fp(rewired) != fp(BASE)
