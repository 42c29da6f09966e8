"""``inline-calls``: ``func.call`` becomes its callee's body (the contract stage's first pass)."""

from __future__ import annotations

import numpy as np
import pytest

from accy.choir.parser import parse_module
from accy.choir.passes import PassManager
from accy.errors import PassFailedError, VerifyError
from accy.preparation.passes.contract import InlineCalls
from accy.reference import run_reference

HEADER = '"builtin.module"() ({\n'
FOOTER = '}) : () -> ()\n'


def func(name: str, body: str, args: str = "tensor<4xf32>", res: str = "tensor<4xf32>") -> str:
    return (f'  "func.func"() <{{function_type = ({args}) -> {res}, sym_name = "{name}"}}> ({{\n'
            f'  ^bb0(%x: tensor<4xf32>):\n{body}\n  }}) : () -> ()\n')


SCALE = func("scale", '''\
    %0 = "semantic.mul"(%x, %x) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    %1 = "semantic.neg"(%0) : (tensor<4xf32>) -> tensor<4xf32>
    "func.return"(%1) : (tensor<4xf32>) -> ()''')
OUTER = func("outer", '''\
    %0 = "func.call"(%x) {callee = @scale} : (tensor<4xf32>) -> tensor<4xf32>
    %1 = "semantic.exp"(%0) : (tensor<4xf32>) -> tensor<4xf32>
    "func.return"(%1) : (tensor<4xf32>) -> ()''')
MAIN = func("main", '''\
    %0 = "func.call"(%x) {callee = @outer} : (tensor<4xf32>) -> tensor<4xf32>
    %1 = "func.call"(%0) {callee = @scale} : (tensor<4xf32>) -> tensor<4xf32>
    %2 = "semantic.add"(%1, %x) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    "func.return"(%2) : (tensor<4xf32>) -> ()''')


def test_nested_calls_inline_and_keep_the_reference_result() -> None:
    text = HEADER + SCALE + OUTER + MAIN + FOOTER
    x = np.array([0.5, -1.0, 2.0, 0.0], np.float32)
    want = run_reference(parse_module(text), [x])[0]
    m = parse_module(text)
    stats = PassManager("contract", (InlineCalls(),)).run(m).stats["inline-calls"]
    assert stats == {"inlined": 3, "functions-dropped": 2}
    assert [f.sym_name for f in m.functions] == ["main"]
    assert not any(op.op_name == "func.call" for op in m.walk())
    np.testing.assert_array_equal(run_reference(m, [x])[0], want)
    assert np.isfinite(want).all() and not np.array_equal(want, x)


def test_a_module_without_calls_is_unchanged() -> None:
    m = parse_module(HEADER + SCALE + FOOTER)
    assert PassManager("contract", (InlineCalls(),)).run(m).stats.get("inline-calls", {}) == {}
    assert [op.op_name for op in m.entry().body.ops] == ["semantic.mul", "semantic.neg",
                                                         "func.return"]


@pytest.mark.parametrize("body,message", [
    ('    %0 = "func.call"(%x) {callee = @main} : (tensor<4xf32>) -> tensor<4xf32>\n'
     '    "func.return"(%0) : (tensor<4xf32>) -> ()', "is recursive (main -> main)"),
    ('    %0 = "func.call"(%x) {callee = @nowhere} : (tensor<4xf32>) -> tensor<4xf32>\n'
     '    "func.return"(%0) : (tensor<4xf32>) -> ()', "which the module does not define"),
    ('    %0 = "func.call"(%x, %x) {callee = @scale} : (tensor<4xf32>, tensor<4xf32>) -> '
     'tensor<4xf32>\n    "func.return"(%0) : (tensor<4xf32>) -> ()', "passes 2 operands"),
])
def test_bad_calls_are_errors_at_the_call(body: str, message: str) -> None:
    m = parse_module(HEADER + SCALE + func("main", body) + FOOTER, "prog.mlir")
    with pytest.raises((VerifyError, PassFailedError)) as info:
        PassManager("contract", (InlineCalls(),)).run(m)
    assert message in str(info.value)
    assert "prog.mlir:" in str(info.value)
