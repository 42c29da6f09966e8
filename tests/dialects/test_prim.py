"""The prim dialect: declared ops, their verification, text/wire round trips, reference impls."""

from __future__ import annotations

import os
import shutil
import subprocess

import numpy as np
import pytest

import accy.reference_lowered  # noqa: F401  (registers the prim impls)
from accy.choir.parser import parse_module
from accy.choir.printer import print_op
from accy.choir.verifier import verify
from accy.choir.wire import decode, encode
from accy.dialects import prim
from accy.errors import VerifyError
from accy.reference import run_reference

MLIR_OPT = shutil.which("mlir-opt-19") or (
    "/usr/bin/mlir-opt-19" if os.path.exists("/usr/bin/mlir-opt-19") else None)


def program(args: list[str], results: list[str], body: str, file: str = "p.mlir") -> str:
    """A module whose ``main`` takes ``args``; ``body`` (ops from line 4) ends with its return."""
    sig = f"({', '.join(args)}) -> " + (results[0] if len(results) == 1
                                       else f"({', '.join(results)})")
    params = ", ".join(f"%a{i}: {t}" for i, t in enumerate(args))
    return (f'"builtin.module"() ({{\n'
            f'  "func.func"() <{{function_type = {sig}, sym_name = "main"}}> ({{\n'
            f'  ^bb0({params}):\n'
            f'{body}\n'
            f'  }}) : () -> ()\n'
            f'}}) : () -> ()\n')


EVERY_OP = program(
    ["tensor<4x8xf32>", "tensor<8xf32>", "tensor<4x8x3xf32>", "tensor<4x8xi32>"],
    ["tensor<4x8xf32>", "tensor<4x1xf32>", "tensor<4x4x3xf32>", "tensor<32xf32>",
     "tensor<4x8xi32>"],
    """\
    %b = "prim.broadcast"(%a1) {dims = array<i64: 1>} : (tensor<8xf32>) -> tensor<4x8xf32>
    %u0 = "prim.neg"(%a0) : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %u1 = "prim.abs"(%u0) : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %u2 = "prim.exp"(%u1) : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %u3 = "prim.log"(%u2) : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %u4 = "prim.sqrt"(%u2) : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %u5 = "prim.rsqrt"(%u4) : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %u6 = "prim.tanh"(%u5) : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %u7 = "prim.sigmoid"(%u6) : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %u8 = "prim.relu"(%a0) : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %u9 = "prim.erf"(%u8) : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %u9c = "prim.erfc"(%u9) : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %u10 = "prim.sin"(%u9c) : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %u11 = "prim.cos"(%u10) : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %u12 = "prim.reciprocal"(%u11) : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %u13 = "prim.floor"(%u12) : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %v0 = "prim.add"(%u13, %b) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %v1 = "prim.sub"(%v0, %u3) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %v2 = "prim.mul"(%v1, %u7) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %v3 = "prim.div"(%v2, %u2) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %v4 = "prim.max"(%v3, %a0) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %v5 = "prim.min"(%v4, %u2) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %v6 = "prim.pow"(%u2, %v5) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %c = "prim.cmp"(%a0, %b) {predicate = "lt"} : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xi1>
    %s = "prim.select"(%c, %v6, %a0) : (tensor<4x8xi1>, tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %k = "prim.constant"() {value = dense<2.5> : tensor<4x8xf32>} : () -> tensor<4x8xf32>
    %s2 = "prim.add"(%s, %k) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %r = "prim.reduce"(%s2) {kind = "max"} : (tensor<4x8xf32>) -> tensor<4x1xf32>
    %t = "prim.transpose"(%a2) {permutation = array<i64: 0, 2, 1>} : (tensor<4x8x3xf32>) -> tensor<4x3x8xf32>
    %m = "prim.matmul"(%a2, %t) : (tensor<4x8x3xf32>, tensor<4x3x8xf32>) -> tensor<4x8x8xf32>
    %m2 = "prim.transpose"(%a2) {permutation = array<i64: 0, 2, 1>} : (tensor<4x8x3xf32>) -> tensor<4x3x8xf32>
    %m3 = "prim.matmul"(%m2, %a2) : (tensor<4x3x8xf32>, tensor<4x8x3xf32>) -> tensor<4x3x3xf32>
    %m4 = "prim.broadcast"(%m3) {dims = array<i64: 0, 1, 2>} : (tensor<4x3x3xf32>) -> tensor<4x3x3xf32>
    %m5 = "prim.reduce"(%m) {kind = "sum"} : (tensor<4x8x8xf32>) -> tensor<4x8x1xf32>
    %m6 = "prim.reshape"(%m5) : (tensor<4x8x1xf32>) -> tensor<32xf32>
    %q = "prim.reshape"(%m4) : (tensor<4x3x3xf32>) -> tensor<4x9xf32>
    %q2 = "prim.reshape"(%q) : (tensor<4x9xf32>) -> tensor<36xf32>
    %q3 = "prim.reshape"(%q2) : (tensor<36xf32>) -> tensor<4x3x3xf32>
    %q4 = "prim.broadcast"(%q3) {dims = array<i64: 0, 1, 2>} : (tensor<4x3x3xf32>) -> tensor<4x3x3xf32>
    %q5 = "prim.reduce"(%q4) {kind = "min"} : (tensor<4x3x3xf32>) -> tensor<4x3x1xf32>
    %q6 = "prim.broadcast"(%q5) {dims = array<i64: 0, 1, 2>} : (tensor<4x3x1xf32>) -> tensor<4x3x3xf32>
    %q7 = "prim.broadcast"(%q6) {dims = array<i64: 0, 2, 3>} : (tensor<4x3x3xf32>) -> tensor<4x4x3x3xf32>
    %q8 = "prim.reshape"(%q7) : (tensor<4x4x3x3xf32>) -> tensor<4x4x9xf32>
    %q9 = "prim.reduce"(%q8) {kind = "sum"} : (tensor<4x4x9xf32>) -> tensor<4x4x1xf32>
    %q10 = "prim.broadcast"(%q9) {dims = array<i64: 0, 1, 2>} : (tensor<4x4x1xf32>) -> tensor<4x4x3xf32>
    %i = "prim.cast"(%a3) : (tensor<4x8xi32>) -> tensor<4x8xf32>
    %i2 = "prim.add"(%i, %s2) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %i3 = "prim.cast"(%i2) : (tensor<4x8xf32>) -> tensor<4x8xi32>
    %i4 = "prim.neg"(%i3) : (tensor<4x8xi32>) -> tensor<4x8xi32>
    %d1 = "prim.slice"(%a0) {starts = array<i64: 1, 7>, sizes = array<i64: 2, 4>, steps = array<i64: 2, -2>} : (tensor<4x8xf32>) -> tensor<2x4xf32>
    %d2 = "prim.concat"(%a0, %a0) {axis = 0 : i64} : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<8x8xf32>
    %z = "prim.constant"() {value = dense<0.0> : tensor<f32>} : () -> tensor<f32>
    %d3 = "prim.pad"(%a0, %z) {low = array<i64: 1, 0>, high = array<i64: 0, -2>, mode = "constant"} : (tensor<4x8xf32>, tensor<f32>) -> tensor<5x6xf32>
    %d4 = "prim.gather"(%a0, %a3) {axis = 0 : i64} : (tensor<4x8xf32>, tensor<4x8xi32>) -> tensor<4x8x8xf32>
    %d5 = "prim.gather_elements"(%a0, %a3) {axis = 1 : i64} : (tensor<4x8xf32>, tensor<4x8xi32>) -> tensor<4x8xf32>
    "func.return"(%i2, %r, %q10, %m6, %i4) : (tensor<4x8xf32>, tensor<4x1xf32>, tensor<4x4x3xf32>, tensor<32xf32>, tensor<4x8xi32>) -> ()""")


def test_every_prim_op_is_declared_and_verifies():
    m = parse_module(EVERY_OP, "every.mlir")
    verify(m)
    names = {op.op_name for op in m.walk() if op.op_name.startswith("prim.")}
    assert names == set(prim.PRIM_OPS)
    for op in m.walk():
        if op.op_name.startswith("prim."):
            assert isinstance(op, prim.PrimOp), op.op_name


def test_prim_text_and_wire_round_trip():
    m = parse_module(EVERY_OP)
    text = print_op(m)
    again = parse_module(text)
    assert print_op(again) == text
    back = decode(encode(m))
    assert print_op(back) == text
    assert all(isinstance(op, prim.PrimOp) for op in back.walk() if op.op_name.startswith("prim."))


@pytest.mark.skipif(MLIR_OPT is None, reason="mlir-opt-19 is not installed")
def test_printed_prim_module_reads_in_mlir_opt():
    text = print_op(parse_module(EVERY_OP))
    out = subprocess.run([MLIR_OPT, "--allow-unregistered-dialect", "-mlir-print-op-generic"],
                         input=text, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert print_op(parse_module(out.stdout)) == text


def test_traits():
    assert "commutative" in prim.AddOp.traits and "commutative" not in prim.SubOp.traits
    assert {"pure", "elementwise"} <= prim.ExpOp.traits
    assert "elementwise" not in prim.ReduceOp.traits and "pure" in prim.ReduceOp.traits
    assert prim.broadcast_dims(2, 4) == (2, 3)


# ------------------------------------------------------------------- verification

BAD = [
    # (arguments, result, op line, message fragment)
    (["tensor<4x8xf32>", "tensor<8xf32>"], "tensor<4x8xf32>",
     '"prim.add"(%a0, %a1) : (tensor<4x8xf32>, tensor<8xf32>) -> tensor<4x8xf32>',
     "operands must have one type (broadcast explicitly)"),
    (["tensor<?x8xf32>", "tensor<?x8xf32>"], "tensor<?x8xf32>",
     '"prim.add"(%a0, %a1) : (tensor<?x8xf32>, tensor<?x8xf32>) -> tensor<?x8xf32>',
     "must have a static type"),
    (["tensor<4x8xf32>", "tensor<4x8xf32>"], "tensor<4x8xf16>",
     '"prim.mul"(%a0, %a1) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf16>',
     "differs from the expected tensor<4x8xf32>"),
    (["tensor<4x8xi32>"], "tensor<4x8xi32>",
     '"prim.exp"(%a0) : (tensor<4x8xi32>) -> tensor<4x8xi32>',
     "needs a floating-point operand"),
    (["tensor<4x8xf32>", "tensor<4x8xf32>"], "tensor<4x8xf32>",
     '"prim.cmp"(%a0, %a1) {predicate = "lt"} : (tensor<4x8xf32>, tensor<4x8xf32>) -> '
     'tensor<4x8xf32>', "differs from the expected tensor<4x8xi1>"),
    (["tensor<4x8xf32>", "tensor<4x8xf32>"], "tensor<4x8xi1>",
     '"prim.cmp"(%a0, %a1) {predicate = "less"} : (tensor<4x8xf32>, tensor<4x8xf32>) -> '
     'tensor<4x8xi1>', "attribute 'predicate' must be one of"),
    (["tensor<4x8xf32>", "tensor<4x8xf32>"], "tensor<4x8xf32>",
     '"prim.select"(%a0, %a0, %a1) : (tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>) -> '
     'tensor<4x8xf32>', "condition must be an i1 tensor"),
    (["tensor<4x8xf32>"], "tensor<4x4xf32>",
     '"prim.cast"(%a0) : (tensor<4x8xf32>) -> tensor<4x4xf32>', "differs from the expected"),
    (["tensor<8xf32>"], "tensor<4x8xf32>",
     '"prim.broadcast"(%a0) {dims = array<i64: 0>} : (tensor<8xf32>) -> tensor<4x8xf32>',
     "operand dim 0 (8) does not broadcast to result dim 0 (4)"),
    (["tensor<4x8xf32>"], "tensor<4x8x2xf32>",
     '"prim.broadcast"(%a0) {dims = array<i64: 1, 0>} : (tensor<4x8xf32>) -> tensor<4x8x2xf32>',
     "must be strictly increasing"),
    (["tensor<4x8xf32>"], "tensor<4x8x2xf32>",
     '"prim.broadcast"(%a0) {dims = array<i64: 0>} : (tensor<4x8xf32>) -> tensor<4x8x2xf32>',
     "needs one dim per operand dimension"),
    (["tensor<4x8xf32>"], "tensor<4x8xf32>",
     '"prim.broadcast"(%a0) : (tensor<4x8xf32>) -> tensor<4x8xf32>', "needs 'dims"),
    (["tensor<4x8xf32>"], "tensor<4xf32>",
     '"prim.reduce"(%a0) {kind = "sum"} : (tensor<4x8xf32>) -> tensor<4xf32>',
     "differs from the expected tensor<4x1xf32>"),
    (["tensor<4x8xf32>"], "tensor<4x1xf32>",
     '"prim.reduce"(%a0) {kind = "mean"} : (tensor<4x8xf32>) -> tensor<4x1xf32>',
     "attribute 'kind' must be one of 'sum', 'max', 'min'"),
    (["tensor<f32>"], "tensor<1xf32>",
     '"prim.reduce"(%a0) {kind = "sum"} : (tensor<f32>) -> tensor<1xf32>', "rank >= 1"),
    (["tensor<2x4x8xf32>", "tensor<8x5xf32>"], "tensor<2x4x5xf32>",
     '"prim.matmul"(%a0, %a1) : (tensor<2x4x8xf32>, tensor<8x5xf32>) -> tensor<2x4x5xf32>',
     "needs operands of one rank"),
    (["tensor<2x4x8xf32>", "tensor<3x8x5xf32>"], "tensor<2x4x5xf32>",
     '"prim.matmul"(%a0, %a1) : (tensor<2x4x8xf32>, tensor<3x8x5xf32>) -> tensor<2x4x5xf32>',
     "batch dims differ"),
    (["tensor<4x8xf32>", "tensor<7x5xf32>"], "tensor<4x5xf32>",
     '"prim.matmul"(%a0, %a1) : (tensor<4x8xf32>, tensor<7x5xf32>) -> tensor<4x5xf32>',
     "contraction dims differ"),
    (["tensor<4x8xf32>"], "tensor<8x4xf32>",
     '"prim.transpose"(%a0) {permutation = array<i64: 0, 0>} : (tensor<4x8xf32>) -> '
     'tensor<8x4xf32>', "a permutation of rank 2"),
    (["tensor<4x8xf32>"], "tensor<4x8xf32>",
     '"prim.transpose"(%a0) {permutation = array<i64: 1, 0>} : (tensor<4x8xf32>) -> '
     'tensor<4x8xf32>', "differs from the expected tensor<8x4xf32>"),
    (["tensor<4x8xf32>"], "tensor<5x6xf32>",
     '"prim.reshape"(%a0) : (tensor<4x8xf32>) -> tensor<5x6xf32>', "cannot reshape"),
    ([], "tensor<4xf32>",
     '"prim.constant"() {value = dense<1.0> : tensor<2xf32>} : () -> tensor<4xf32>',
     "differs from the expected tensor<2xf32>"),
]


@pytest.mark.parametrize("args,result,line,message", BAD, ids=[b[3][:30] for b in BAD])
def test_verify_errors_carry_the_op_location(args, result, line, message):
    text = program(args, [result], f"    %0 = {line}\n    \"func.return\"(%0) : ({result}) -> ()")
    m = parse_module(text, "bad.mlir")
    with pytest.raises(VerifyError) as info:
        verify(m)
    assert message in str(info.value)
    assert str(info.value).startswith("bad.mlir:4:5: error: '"), str(info.value)


# -------------------------------------------------------------- reference impls


def _run(args: list[str], result: str, line: str, inputs: list[np.ndarray]) -> np.ndarray:
    m = parse_module(program(args, [result], f"    %0 = {line}\n"
                                             f"    \"func.return\"(%0) : ({result}) -> ()"))
    verify(m)
    return run_reference(m, inputs)[0]


def test_reference_broadcast_places_dims():
    x = np.arange(3, dtype=np.float32)
    y = _run(["tensor<3xf32>"], "tensor<3x2xf32>",
             '"prim.broadcast"(%a0) {dims = array<i64: 0>} : (tensor<3xf32>) -> tensor<3x2xf32>',
             [x])
    np.testing.assert_array_equal(y, np.repeat(x[:, None], 2, axis=1))
    z = np.arange(4, dtype=np.float32).reshape(4, 1)
    y = _run(["tensor<4x1xf32>"], "tensor<2x4x5xf32>",
             '"prim.broadcast"(%a0) {dims = array<i64: 1, 2>} : (tensor<4x1xf32>) -> '
             'tensor<2x4x5xf32>', [z])
    np.testing.assert_array_equal(y, np.broadcast_to(z, (2, 4, 5)))


@pytest.mark.parametrize("kind,fn", [("sum", np.sum), ("max", np.max), ("min", np.min)])
def test_reference_reduce_is_last_axis_keepdims(kind, fn):
    x = np.random.default_rng(1).standard_normal((2, 3, 5)).astype(np.float32)
    y = _run(["tensor<2x3x5xf32>"], "tensor<2x3x1xf32>",
             f'"prim.reduce"(%a0) {{kind = "{kind}"}} : (tensor<2x3x5xf32>) -> tensor<2x3x1xf32>',
             [x])
    np.testing.assert_allclose(y, fn(x.astype(np.float64), axis=-1, keepdims=True), rtol=1e-6)


def test_reference_matmul_transpose_reshape_cast():
    rng = np.random.default_rng(2)
    a = rng.standard_normal((2, 4, 3)).astype(np.float32)
    b = rng.standard_normal((2, 3, 5)).astype(np.float32)
    y = _run(["tensor<2x4x3xf32>", "tensor<2x3x5xf32>"], "tensor<2x4x5xf32>",
             '"prim.matmul"(%a0, %a1) : (tensor<2x4x3xf32>, tensor<2x3x5xf32>) -> '
             'tensor<2x4x5xf32>', [a, b])
    np.testing.assert_allclose(y, a.astype(np.float64) @ b, rtol=1e-6)
    y = _run(["tensor<2x4x3xf32>"], "tensor<3x2x4xf32>",
             '"prim.transpose"(%a0) {permutation = array<i64: 2, 0, 1>} : (tensor<2x4x3xf32>) -> '
             'tensor<3x2x4xf32>', [a])
    np.testing.assert_array_equal(y, a.transpose(2, 0, 1))
    y = _run(["tensor<2x4x3xf32>"], "tensor<8x3xf32>",
             '"prim.reshape"(%a0) : (tensor<2x4x3xf32>) -> tensor<8x3xf32>', [a])
    np.testing.assert_array_equal(y, a.reshape(8, 3))
    y = _run(["tensor<2x4x3xf32>"], "tensor<2x4x3xi32>",
             '"prim.cast"(%a0) : (tensor<2x4x3xf32>) -> tensor<2x4x3xi32>', [a * 10])
    np.testing.assert_array_equal(y, np.trunc(a * 10).astype(np.int32))


def test_reference_runs_every_op_module_like_numpy_twins():
    # the same program in semantic ops gives the same numbers as the prim one
    prim_text = program(["tensor<4x8xf32>", "tensor<4x8xf32>"], ["tensor<4x8xf32>"], """\
    %0 = "prim.sigmoid"(%a0) : (tensor<4x8xf32>) -> tensor<4x8xf32>
    %1 = "prim.cmp"(%a0, %a1) {predicate = "ge"} : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xi1>
    %2 = "prim.select"(%1, %0, %a1) : (tensor<4x8xi1>, tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %3 = "prim.pow"(%0, %2) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    "func.return"(%3) : (tensor<4x8xf32>) -> ()""")
    sem_text = prim_text.replace('"prim.', '"semantic.')
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((4, 8)).astype(np.float32) for _ in range(2)]
    got = run_reference(parse_module(prim_text), xs)[0]
    want = run_reference(parse_module(sem_text), xs)[0]
    np.testing.assert_array_equal(got, want)
