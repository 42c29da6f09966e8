"""Tensor stage passes: require-static-shapes, decompose-composites, innermost-reductions,
lower-to-prim; and the reference answer through the contract + tensor pipelines."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from stage_programs import filecheck, program_text

import accy.reference_lowered  # noqa: F401  (registers the prim impls)
from accy.choir.attributes import TensorType, numpy_dtype
from accy.choir.parser import parse_file, parse_module
from accy.choir.passes import PassContext, PassManager
from accy.choir.printer import print_op
from accy.errors import PassFailedError, VerifyError
from accy.preparation.passes.contract import CSE, DCE, FoldConstants, Simplify, SpecializeShapes
from accy.preparation.passes.tensor import (
    DecomposeComposites,
    InnermostReductions,
    LowerToPrim,
    RequireStaticShapes,
)
from accy.reference import run_reference


def program(args: list[str], results: list[str], body: str, file: str = "t.mlir"):
    """A parsed module whose ``main`` takes ``args``; ``body`` starts on line 4."""
    return parse_module(program_text(args, results, body), file)


GRAPHS = sorted((Path(__file__).resolve().parents[2] / "graphs").glob("*.mlir"))
MLIR_OPT = shutil.which("mlir-opt-19") or (
    "/usr/bin/mlir-opt-19" if os.path.exists("/usr/bin/mlir-opt-19") else None)






def contract(shapes=()) -> tuple:
    return (SpecializeShapes(tuple(shapes)), Simplify(), FoldConstants(), CSE(), DCE())


def tensor(innermost: bool = True) -> tuple:
    return (RequireStaticShapes(), DecomposeComposites(), InnermostReductions(innermost),
            LowerToPrim(), CSE(), DCE())


def lower(module, shapes=(), innermost: bool = True):
    PassManager("contract", contract(shapes)).run(module)
    PassManager("tensor", tensor(innermost)).run(module)
    return module


def random_inputs(module, size: int, seed: int = 0):
    """Inputs for ``main`` with every ``?`` bound to ``size``, and the bindings."""
    rng = np.random.default_rng(seed)
    shapes, arrays = [], []
    for i, t in enumerate(module.entry().function_type.inputs):
        assert isinstance(t, TensorType)
        shape = tuple(size if d is None else d for d in t.shape)
        shapes.append((i, shape))
        dtype = numpy_dtype(t.element)
        if t.element.is_float:
            arrays.append(rng.standard_normal(shape).astype(dtype))
        elif t.element.name == "i1":
            arrays.append(rng.integers(0, 2, shape).astype(bool))
        else:
            arrays.append(rng.integers(-9, 10, shape).astype(dtype))
    return shapes, arrays


def assert_same_answer(module, size: int = 4, innermost: bool = True, seed: int = 0) -> str:
    """Lower ``module`` through both pipelines; the reference answer must not change."""
    shapes, xs = random_inputs(module, size, seed)
    want = run_reference(module, xs)
    lower(module, shapes, innermost)
    names = {op.op_name.split(".")[0] for op in module.walk()}
    assert names <= {"builtin", "func", "prim"}, names
    got = run_reference(module, xs)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        # rtol 1e-5; the atol covers values near zero, where a decomposition's
        # intermediate roundings (e.g. 1 + erf(x) for x << 0) dominate
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    return print_op(module)


def assert_reads_in_mlir_opt(text: str) -> None:
    if MLIR_OPT is None:
        pytest.skip("mlir-opt-19 is not installed")
    out = subprocess.run([MLIR_OPT, "--allow-unregistered-dialect", "-mlir-print-op-generic"],
                         input=text, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert print_op(parse_module(out.stdout)) == text


# --------------------------------------------------------- the programs in graphs/


def test_there_are_graphs():
    assert len(GRAPHS) >= 10


@pytest.mark.parametrize("size", [4, 8])
@pytest.mark.parametrize("path", GRAPHS, ids=[p.stem for p in GRAPHS])
def test_graph_keeps_its_reference_answer(path, size):
    text = assert_same_answer(parse_file(str(path)), size)
    again = parse_module(text)  # the printed prim module reads back and verifies
    assert print_op(again) == text


@pytest.mark.parametrize("path", GRAPHS, ids=[p.stem for p in GRAPHS])
def test_graph_lowered_reads_in_mlir_opt(path):
    m = parse_file(str(path))
    shapes, _ = random_inputs(m, 4)
    assert_reads_in_mlir_opt(print_op(lower(m, shapes)))


# --------------------------------------------------------- require-static-shapes


def test_unbound_argument_is_an_error_naming_the_shape_option():
    m = program(["tensor<?x4096xf32>", "tensor<4xf32>"], ["tensor<?x4096xf32>"], """\
    "func.return"(%a0) : (tensor<?x4096xf32>) -> ()""", "u.mlir")
    with pytest.raises(PassFailedError) as info:
        PassManager("tensor", tensor()).run(m)
    assert str(info.value.__cause__) == (
        "u.mlir:3:8: error: argument 0 has unbound dims (tensor<?x4096xf32>): bind them with "
        "--shape arg0=Nx4096")
    assert info.value.reproducer.pass_name == "require-static-shapes"
    m = program(["tensor<4xf32>", "tensor<?x?xf32>"], ["tensor<?x?xf32>"], """\
    "func.return"(%a1) : (tensor<?x?xf32>) -> ()""", "u.mlir")
    with pytest.raises(VerifyError, match=r"^u\.mlir:3:\d+: error: argument 1 has unbound dims "
                                          r"\(tensor<\?x\?xf32>\): bind them with --shape "
                                          r"arg1=NxN$"):
        RequireStaticShapes().apply(PassContext(), m)


def test_unrefinable_op_result_is_an_error_at_the_op():
    m = program(["tensor<4x6xf32>"], ["tensor<?x?xf32>"], """\
    %0 = "semantic.reshape"(%a0) : (tensor<4x6xf32>) -> tensor<?x?xf32>
    "func.return"(%0) : (tensor<?x?xf32>) -> ()""", "r.mlir")
    PassManager("contract", contract()).run(m)
    with pytest.raises(VerifyError) as info:
        RequireStaticShapes().apply(PassContext(), m)
    assert str(info.value).startswith("r.mlir:4:5: error: result of 'semantic.reshape' has "
                                      "unbound dims (tensor<?x?xf32>)")


# ----------------------------------------------------------- decompose-composites


def test_decomposed_softmax_has_two_reductions():
    m = program(["tensor<4x16xf32>"], ["tensor<4x16xf32>"], """\
    %0 = "semantic.softmax"(%a0) {axis = -1 : i64} : (tensor<4x16xf32>) -> tensor<4x16xf32>
    "func.return"(%0) : (tensor<4x16xf32>) -> ()""")
    text = assert_same_answer(m)
    filecheck(text,
              '"prim.reduce"(%arg0) {kind = "max"} : (tensor<4x16xf32>) -> tensor<4x1xf32>',
              '"prim.broadcast"', '"prim.sub"', '"prim.exp"',
              '{kind = "sum"} : (tensor<4x16xf32>) -> tensor<4x1xf32>',
              '"prim.broadcast"', '"prim.div"', "NOT: prim.transpose")
    assert text.count('"prim.reduce"') == 2


def test_softmax_on_axis_0_transposes_its_reductions_innermost():
    m = program(["tensor<5x3xf32>"], ["tensor<5x3xf32>"], """\
    %0 = "semantic.softmax"(%a0) {axis = 0 : i64} : (tensor<5x3xf32>) -> tensor<5x3xf32>
    "func.return"(%0) : (tensor<5x3xf32>) -> ()""")
    text = assert_same_answer(m)
    filecheck(text, '"prim.transpose"(%arg0) {permutation = array<i64: 1, 0>}',
              '"prim.reduce"', '"prim.reduce"', '"prim.transpose"', "-> tensor<5x3xf32>")
    assert text.count('"prim.reduce"') == 2


def test_softmax_on_a_middle_axis_of_rank_3():
    m = program(["tensor<2x5x3xf32>"], ["tensor<2x5x3xf32>"], """\
    %0 = "semantic.softmax"(%a0) {axis = 1 : i64} : (tensor<2x5x3xf32>) -> tensor<2x5x3xf32>
    "func.return"(%0) : (tensor<2x5x3xf32>) -> ()""")
    filecheck(assert_same_answer(m), "permutation = array<i64: 0, 2, 1>",
              "(tensor<2x3x5xf32>) -> tensor<2x3x1xf32>")


def test_layernorm_over_the_last_two_axes_reshapes_to_rows():
    m = program(["tensor<2x3x4xf32>", "tensor<3x4xf32>", "tensor<3x4xf32>"],
                ["tensor<2x3x4xf32>"], """\
    %0 = "semantic.layernorm"(%a0, %a1, %a2) {axis = -2 : i64, epsilon = 1.0e-05 : f32} : (tensor<2x3x4xf32>, tensor<3x4xf32>, tensor<3x4xf32>) -> tensor<2x3x4xf32>
    "func.return"(%0) : (tensor<2x3x4xf32>) -> ()""")
    text = assert_same_answer(m)
    filecheck(text, '"prim.reshape"(%arg0) : (tensor<2x3x4xf32>) -> tensor<2x12xf32>',
              '"prim.reshape"(%arg1) : (tensor<3x4xf32>) -> tensor<12xf32>',
              '"prim.reduce"', '"prim.reduce"', '"prim.rsqrt"',
              "-> tensor<2x3x4xf32>")
    assert text.count('"prim.reduce"') == 2


def test_rmsnorm_over_the_last_two_axes():
    m = program(["tensor<3x2x4xf32>", "tensor<2x4xf32>"], ["tensor<3x2x4xf32>"], """\
    %0 = "semantic.rmsnorm"(%a0, %a1) {axis = 1 : i64, epsilon = 1.0e-06 : f32} : (tensor<3x2x4xf32>, tensor<2x4xf32>) -> tensor<3x2x4xf32>
    "func.return"(%0) : (tensor<3x2x4xf32>) -> ()""")
    text = assert_same_answer(m)
    assert text.count('"prim.reduce"') == 1 and "prim.rsqrt" in text


@pytest.mark.parametrize("approximate,core", [("none", "prim.erfc"), ("tanh", "prim.sigmoid")])
def test_gelu_decomposes_with_splat_constants(approximate, core):
    m = program(["tensor<4x8xf32>"], ["tensor<4x8xf32>"], f"""\
    %0 = "semantic.gelu"(%a0) {{approximate = "{approximate}"}} : (tensor<4x8xf32>) -> tensor<4x8xf32>
    "func.return"(%0) : (tensor<4x8xf32>) -> ()""")
    PassManager("tensor", (DecomposeComposites(),)).run(m)
    text = print_op(m)
    filecheck(text, f'"semantic.{core.split(".")[1]}"', "NOT: semantic.gelu")
    assert approximate == "tanh" or 'dense<5.0e-01> : tensor<f32>' in text
    m = program(["tensor<4x8xf32>"], ["tensor<4x8xf32>"], f"""\
    %0 = "semantic.gelu"(%a0) {{approximate = "{approximate}"}} : (tensor<4x8xf32>) -> tensor<4x8xf32>
    "func.return"(%0) : (tensor<4x8xf32>) -> ()""")
    assert core in assert_same_answer(m)


def test_reduce_mean_becomes_a_sum_times_the_reciprocal_count():
    m = program(["tensor<4x8xf32>"], ["tensor<8xf32>"], """\
    %0 = "semantic.reduce_mean"(%a0) {axes = array<i64: 0>, keepdims = false} : (tensor<4x8xf32>) -> tensor<8xf32>
    "func.return"(%0) : (tensor<8xf32>) -> ()""")
    PassManager("tensor", (DecomposeComposites(),)).run(m)
    filecheck(print_op(m), '"semantic.reduce_sum"(%arg0) {axes = array<i64: 0>, keepdims = false}',
              "dense<2.5e-01> : tensor<f32>", '"semantic.mul"', "NOT: reduce_mean")


# ----------------------------------------------------------- innermost-reductions

REDUCE_02 = """\
    %0 = "semantic.reduce_{kind}"(%a0) {{axes = array<i64: 0, 2>, keepdims = {keep}}} : (tensor<3x4x5xf32>) -> {result}
    "func.return"(%0) : ({result}) -> ()"""


@pytest.mark.parametrize("kind", ["sum", "max", "min", "mean"])
@pytest.mark.parametrize("keep", ["true", "false"])
def test_reduce_over_axes_0_and_2_of_rank_3(kind, keep):
    result = "tensor<1x4x1xf32>" if keep == "true" else "tensor<4xf32>"
    m = program(["tensor<3x4x5xf32>"], [result],
                REDUCE_02.format(kind=kind, keep=keep, result=result))
    text = assert_same_answer(m)
    filecheck(text,
              '"prim.transpose"(%arg0) {permutation = array<i64: 1, 0, 2>} : '
              '(tensor<3x4x5xf32>) -> tensor<4x3x5xf32>',
              '"prim.reshape"(%0) : (tensor<4x3x5xf32>) -> tensor<4x15xf32>',
              f'"prim.reduce"(%1) {{kind = "{"sum" if kind == "mean" else kind}"}} : '
              '(tensor<4x15xf32>) -> tensor<4x1xf32>',
              f"-> {result}")


def test_innermost_reductions_disabled_accepts_trailing_blocks_only():
    m = program(["tensor<3x4x5xf32>"], ["tensor<3xf32>"], """\
    %0 = "semantic.reduce_sum"(%a0) {axes = array<i64: 1, 2>, keepdims = false} : (tensor<3x4x5xf32>) -> tensor<3xf32>
    "func.return"(%0) : (tensor<3xf32>) -> ()""")
    text = assert_same_answer(m, innermost=False)
    filecheck(text, "-> tensor<3x20xf32>", '"prim.reduce"', "-> tensor<3x1xf32>",
              "-> tensor<3xf32>", "NOT: prim.transpose")
    m = program(["tensor<3x4x5xf32>"], ["tensor<4xf32>"], REDUCE_02.format(
        kind="sum", keep="false", result="tensor<4xf32>"), "off.mlir")
    with pytest.raises(PassFailedError) as info:
        lower(m, innermost=False)
    assert str(info.value.__cause__).startswith(
        "off.mlir:4:5: error: 'semantic.reduce_sum' reduces axes [0, 2] of tensor<3x4x5xf32>")
    assert "turn on tensor.innermost_reductions" in str(info.value)


def test_reduction_over_every_axis_and_over_none():
    m = program(["tensor<3x4xf32>"], ["tensor<f32>", "tensor<3x4xf32>"], """\
    %0 = "semantic.reduce_max"(%a0) {axes = array<i64: 1, 0>, keepdims = false} : (tensor<3x4xf32>) -> tensor<f32>
    %1 = "semantic.reduce_sum"(%a0) {axes = array<i64>, keepdims = true} : (tensor<3x4xf32>) -> tensor<3x4xf32>
    "func.return"(%0, %1) : (tensor<f32>, tensor<3x4xf32>) -> ()""")
    text = assert_same_answer(m)
    filecheck(text, "-> tensor<12xf32>", '"prim.reduce"', "-> tensor<1xf32>", "-> tensor<f32>",
              '"func.return"(%2, %arg0)')


# ------------------------------------------------------------------ lower-to-prim


def test_matmul_with_broadcast_batch_dims():
    m = program(["tensor<2x1x4x8xf32>", "tensor<3x8x5xf32>"], ["tensor<2x3x4x5xf32>"], """\
    %0 = "semantic.matmul"(%a0, %a1) : (tensor<2x1x4x8xf32>, tensor<3x8x5xf32>) -> tensor<2x3x4x5xf32>
    "func.return"(%0) : (tensor<2x3x4x5xf32>) -> ()""")
    text = assert_same_answer(m)
    filecheck(text,
              '"prim.broadcast"(%arg0) {dims = array<i64: 0, 1, 2, 3>} : (tensor<2x1x4x8xf32>) '
              '-> tensor<2x3x4x8xf32>',
              '"prim.broadcast"(%arg1) {dims = array<i64: 1, 2, 3>} : (tensor<3x8x5xf32>) -> '
              'tensor<2x3x8x5xf32>',
              '"prim.matmul"(%0, %1) : (tensor<2x3x4x8xf32>, tensor<2x3x8x5xf32>) -> '
              'tensor<2x3x4x5xf32>')
    assert_reads_in_mlir_opt(text)


def test_matmul_of_a_matrix_with_a_batch():
    m = program(["tensor<4x8xf32>", "tensor<2x8x5xf32>"], ["tensor<2x4x5xf32>"], """\
    %0 = "semantic.matmul"(%a0, %a1) : (tensor<4x8xf32>, tensor<2x8x5xf32>) -> tensor<2x4x5xf32>
    "func.return"(%0) : (tensor<2x4x5xf32>) -> ()""")
    filecheck(assert_same_answer(m), '"prim.broadcast"(%arg0) {dims = array<i64: 1, 2>}',
              '"prim.matmul"(%0, %arg1)')


def test_select_cmp_and_integer_ops_broadcast_explicitly():
    m = program(["tensor<4x1xi32>", "tensor<6xi32>", "tensor<i32>"],
                ["tensor<4x6xi32>", "tensor<4x1xi32>"], """\
    %c = "semantic.cmp"(%a0, %a1) {predicate = "gt"} : (tensor<4x1xi32>, tensor<6xi32>) -> tensor<4x6xi1>
    %s = "semantic.select"(%c, %a1, %a2) : (tensor<4x6xi1>, tensor<6xi32>, tensor<i32>) -> tensor<4x6xi32>
    %b = "semantic.broadcast_to"(%a0) : (tensor<4x1xi32>) -> tensor<4x6xi32>
    %d = "semantic.div"(%s, %b) : (tensor<4x6xi32>, tensor<4x6xi32>) -> tensor<4x6xi32>
    %r = "semantic.reduce_sum"(%d) {axes = array<i64: -1>, keepdims = true} : (tensor<4x6xi32>) -> tensor<4x1xi32>
    "func.return"(%d, %r) : (tensor<4x6xi32>, tensor<4x1xi32>) -> ()""")
    text = assert_same_answer(m)
    filecheck(text, '"prim.broadcast"(%arg0) {dims = array<i64: 0, 1>}',
              '"prim.broadcast"(%arg1) {dims = array<i64: 1>}', '"prim.cmp"',
              '"prim.broadcast"(%arg2) {dims = array<i64>}', '"prim.select"', '"prim.div"',
              '"prim.reduce"(%5) {kind = "sum"} : (tensor<4x6xi32>) -> tensor<4x1xi32>')
    assert text.count('"prim.broadcast"(%arg0)') == 1  # cse merged the two broadcasts


def test_lowering_needs_decomposition_first():
    m = program(["tensor<4x8xf32>"], ["tensor<4x8xf32>"], """\
    %0 = "semantic.softmax"(%a0) {axis = -1 : i64} : (tensor<4x8xf32>) -> tensor<4x8xf32>
    "func.return"(%0) : (tensor<4x8xf32>) -> ()""", "s.mlir")
    with pytest.raises(VerifyError) as info:
        LowerToPrim().apply(PassContext(), m)
    assert str(info.value) == ("s.mlir:4:5: error: 'semantic.softmax' must be decomposed before "
                               "lowering (run decompose-composites first)")
    m = program(["tensor<4x8xf32>"], ["tensor<8xf32>"], """\
    %0 = "semantic.reduce_sum"(%a0) {axes = array<i64: 0>} : (tensor<4x8xf32>) -> tensor<8xf32>
    "func.return"(%0) : (tensor<8xf32>) -> ()""", "s.mlir")
    with pytest.raises(VerifyError, match="run innermost-reductions first"):
        LowerToPrim().apply(PassContext(), m)


def test_tensor_pass_statistics():
    m = parse_file(str(GRAPHS[0].parent / "softmax_axis0.mlir"))
    PassManager("contract", contract([(0, (64, 4))])).run(m)
    result = PassManager("tensor", tensor()).run(m)
    assert result.stats["decompose-composites"] == {"softmax": 1}
    assert result.stats["lower-to-prim"]["lowered"] >= 7


# ------------------------------------------------------------------- properties

_SHAPE = st.lists(st.integers(1, 4), min_size=1, max_size=3)


@st.composite
def broadcast_programs(draw):
    """Two operands that broadcast together, a binary op, and a reduction of the result."""
    full = draw(_SHAPE)
    operands = []
    for _ in range(2):
        keep = draw(st.integers(0, len(full)))
        shape = [d if draw(st.booleans()) else 1 for d in full[len(full) - keep:]]
        operands.append(tuple(shape))
    op = draw(st.sampled_from(["add", "sub", "mul", "max", "min", "div"]))
    rank = len(np.broadcast_shapes(*operands))
    axes = draw(st.lists(st.integers(0, rank - 1), unique=True, max_size=rank)) if rank else []
    kind = draw(st.sampled_from(["sum", "max", "min", "mean"]))
    keep = draw(st.booleans())
    return operands, op, sorted(axes), kind, keep


def _t(shape) -> str:
    return "tensor<" + "".join(f"{d}x" for d in shape) + "f32>"


@settings(max_examples=60, deadline=None)
@given(broadcast_programs())
def test_random_broadcast_and_reduce_programs_keep_their_answer(case):
    (sa, sb), op, axes, kind, keep = case
    out = np.broadcast_shapes(sa, sb)
    red = tuple(1 if i in axes else d for i, d in enumerate(out)) if keep else \
        tuple(d for i, d in enumerate(out) if i not in axes)
    m = program([_t(sa), _t(sb)], [_t(red)], f"""\
    %0 = "semantic.{op}"(%a0, %a1) : ({_t(sa)}, {_t(sb)}) -> {_t(out)}
    %1 = "semantic.reduce_{kind}"(%0) {{axes = array<i64{": " if axes else ""}{", ".join(map(str, axes))}>, keepdims = {str(keep).lower()}}} : ({_t(out)}) -> {_t(red)}
    "func.return"(%1) : ({_t(red)}) -> ()""")
    assert_same_answer(m)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_keeps_its_tiny_negative_tail(approximate):
    """0.5·x·(1 + erf(x/√2)) is 0 in f32 for x ≤ -5.5 (1 + erf cancels); gelu is not."""
    from accy.executable.cache import FragmentCompilerCache
    from accy.preparation.options import RunOptions
    from accy.preparation.products import SemanticModule
    from accy.preparation.stages import PreparationRequest

    text = f'''"builtin.module"() ({{
  "func.func"() <{{function_type = (tensor<3xf32>) -> tensor<3xf32>, sym_name = "main"}}> ({{
  ^bb0(%x: tensor<3xf32>):
    %0 = "semantic.gelu"(%x) {{approximate = "{approximate}"}} : (tensor<3xf32>) -> tensor<3xf32>
    "func.return"(%0) : (tensor<3xf32>) -> ()
  }}) : () -> ()
}}) : () -> ()'''
    sm = SemanticModule.from_text(text)
    x = np.array([-6.0, -8.0, 2.0], np.float32)
    update = FragmentCompilerCache().refresh_from_semantic_module(
        sm, PreparationRequest(source="gelu", options=RunOptions()))
    (y,) = update.fragment(x)
    if approximate == "none":
        want = 0.5 * x.astype(np.float64) * np.array([math.erfc(-v / math.sqrt(2)) for v in x])
    else:
        u = math.sqrt(2 / math.pi) * (x + 0.044715 * x.astype(np.float64) ** 3)
        want = x / (1 + np.exp(-2 * u))
    assert np.all(y[:2] < 0)
    np.testing.assert_allclose(y, want, rtol=1e-5)


@pytest.mark.parametrize("kind", ["sum", "max", "min"])
@pytest.mark.parametrize("shape,axes,keepdims,split", [
    ((1024, 4096), (0, 1), False, True),    # everything: [4096, 1024] rows, then one row
    ((3, 131072), (1,), True, True),        # a few long rows
    ((8192, 64), (0,), False, True),        # long columns: 256-row chunks, then 32
    ((8192, 64), (0,), True, True),
    ((64, 4096), (1,), False, False),       # enough rows already
    ((200, 8), (0,), False, False),         # short columns
])
def test_long_reductions_with_few_outputs_split_in_two_on_gpus(kind, shape, axes, keepdims,
                                                               split):
    from accy.pipeline import prepare_through
    from accy.preparation.options import RunOptions
    from accy.preparation.products import SemanticModule

    t = f"tensor<{'x'.join(map(str, shape))}xf32>"
    out_shape = [1 if i in axes else d for i, d in enumerate(shape)] if keepdims else \
        [d for i, d in enumerate(shape) if i not in axes]
    o = f"tensor<{'x'.join(map(str, out_shape))}{'x' if out_shape else ''}f32>"
    text = f'''"builtin.module"() ({{
  "func.func"() <{{function_type = ({t}) -> {o}, sym_name = "main"}}> ({{
  ^bb0(%x: {t}):
    %0 = "semantic.reduce_{kind}"(%x) {{axes = array<i64: {", ".join(map(str, axes))}>, keepdims = {"true" if keepdims else "false"}}} : ({t}) -> {o}
    "func.return"(%0) : ({o}) -> ()
  }}) : () -> ()
}}) : () -> ()'''
    sm = SemanticModule.from_text(text)
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    x.flat[12345 % x.size] = 9.0  # a maximum somewhere inside a chunk
    want = run_reference(sm.module, [x])[0]
    gpu = prepare_through(sm, "tensor", RunOptions.parse("cuda:sm_90"), {}).product
    host = prepare_through(SemanticModule.from_text(text), "tensor", RunOptions(), {}).product
    reduces = [op for op in gpu.entry().body.ops if op.op_name == "prim.reduce"]
    assert len(reduces) == (2 if split else 1)
    assert len([op for op in host.entry().body.ops if op.op_name == "prim.reduce"]) == 1
    got = run_reference(gpu.module, [x])[0]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-3 if kind == "sum" else 0)


# ------------------------------------ epilogues-before-reshapes, the half mean's levels


def _tensor_stage(text: str, target: str = "host"):
    from accy.pipeline import prepare_through
    from accy.preparation.options import RunOptions
    from accy.preparation.products import SemanticModule

    sm = SemanticModule.from_text(text)
    return sm, prepare_through(sm, "tensor", RunOptions.parse(target), {})


@pytest.mark.parametrize("element", ["f32", "bf16"])
def test_the_means_scale_and_cast_run_before_its_final_reshape(element):
    """The mean of everything: its ``× 1/32`` (and the cast back to bf16) on the
    reduction's own tensor<1xf32>, reshaped to the rank-0 result after it."""
    x = f"tensor<4x8x{element}>"
    sm, r = _tensor_stage(program_text([x], [f"tensor<{element}>"], f"""\
    %0 = "semantic.reduce_mean"(%a0) {{axes = array<i64: 0, 1>, keepdims = false}} : ({x}) -> tensor<{element}>
    "func.return"(%0) : (tensor<{element}>) -> ()"""))
    assert r.pass_stats["epilogues-before-reshapes"] == {"moved": 1 if element == "f32" else 2}
    checks = ['"prim.reduce"', "-> tensor<1xf32>", '"prim.mul"', "-> tensor<1xf32>"]
    if element == "bf16":
        checks += ['"prim.cast"', "-> tensor<1xbf16>"]
    filecheck(r.product.text(), *checks, '"prim.reshape"', f"-> tensor<{element}>",
              '"func.return"')
    xs = [np.random.default_rng(4).standard_normal((4, 8)).astype(np.float32)]
    np.testing.assert_array_equal(run_reference(r.product.module, xs)[0],
                                  run_reference(sm.module, xs)[0])


def test_an_op_reading_a_reshaped_reduction_beside_a_full_operand_stays_after_it():
    """``sum(x) + b`` with ``b`` of the result's shape (not rank 0), and ``exp`` of a
    reshaped argument (not a reduction): both stay where they are."""
    sm, r = _tensor_stage(program_text(["tensor<4x8xf32>", "tensor<4xf32>"],
                                       ["tensor<4xf32>", "tensor<8x4xf32>"], """\
    %0 = "semantic.reduce_sum"(%a0) {axes = array<i64: 1>, keepdims = false} : (tensor<4x8xf32>) -> tensor<4xf32>
    %1 = "semantic.add"(%0, %a1) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
    %2 = "semantic.reshape"(%a0) : (tensor<4x8xf32>) -> tensor<8x4xf32>
    %3 = "semantic.exp"(%2) : (tensor<8x4xf32>) -> tensor<8x4xf32>
    "func.return"(%1, %3) : (tensor<4xf32>, tensor<8x4xf32>) -> ()"""))
    assert "epilogues-before-reshapes" not in r.pass_stats
    filecheck(r.product.text(), '"prim.reshape"', "-> tensor<4xf32>", '"prim.add"',
              "(tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>")


HALF_MEAN = """\
    %0 = "semantic.reduce_{kind}"(%a0) {{axes = array<i64: 1>, keepdims = false}} : ({x}) -> tensor<{rows}x{el}>
    %1 = "semantic.reduce_mean"(%a0) {{axes = array<i64: 0, 1>, keepdims = false}} : ({x}) -> tensor<{el}>
    "func.return"(%0, %1) : (tensor<{rows}x{el}>, tensor<{el}>) -> ()"""


@pytest.mark.parametrize("el", ["bf16", "f16"])
@pytest.mark.parametrize("kind", ["sum", "max"])
def test_a_half_mean_starts_from_the_rows_a_sibling_reduction_reads(el, kind):
    """The mean's sum of cast(x) in f32 is split innermost first beside a row reduction
    of x (any kind): its first level is a row sum of cast(x) over x's rows (no flat view
    of x, on the GPU no [4096, 8192] split), its partial sums f32, never rounded to
    ``el``."""
    x = f"tensor<8192x4096x{el}>"
    sm, r = _tensor_stage(program_text([x], [f"tensor<8192x{el}>", f"tensor<{el}>"],
                                       HALF_MEAN.format(kind=kind, x=x, rows=8192, el=el)),
                          "cuda:sm_90")
    assert r.pass_stats["successive-reductions"] == {"successive": 1}
    assert "split-reductions" not in r.pass_stats
    text = r.product.text()
    filecheck(text, f'"prim.cast"(%arg0) : ({x}) -> tensor<8192x4096xf32>')
    reduces = sorted((op.attr("kind").value, str(op.results[0].type))
                     for op in r.product.entry().body.ops if op.op_name == "prim.reduce")
    assert reduces == sorted([(kind, f"tensor<8192x1x{el}>"), ("sum", "tensor<8192x1xf32>"),
                              ("sum", "tensor<1xf32>")])
    assert "tensor<4096x8192" not in text and "tensor<33554432" not in text


def test_a_half_mean_without_a_sibling_row_reduction_is_left_whole():
    x = "tensor<4x8xbf16>"
    sm, r = _tensor_stage(program_text([x], ["tensor<bf16>"], f"""\
    %0 = "semantic.reduce_mean"(%a0) {{axes = array<i64: 0, 1>, keepdims = false}} : ({x}) -> tensor<bf16>
    "func.return"(%0) : (tensor<bf16>) -> ()"""))
    assert "successive-reductions" not in r.pass_stats
    assert len([op for op in r.product.entry().body.ops if op.op_name == "prim.reduce"]) == 1
