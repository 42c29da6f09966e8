"""The NumPy reference interpreter, op by op, against plain NumPy and ``math``."""

from __future__ import annotations

import math

import numpy as np
import pytest

from accy.choir.attributes import round_bf16
from accy.choir.parser import parse_module
from accy.errors import VerifyError
from accy.reference import IMPLS, erf, register_impl, round_bf16_array, run_reference

RNG = np.random.default_rng(1234)
_DTYPES = {"float32": "f32", "float16": "f16", "bool": "i1", "int32": "i32", "int64": "i64"}


def ttype(a: np.ndarray, element: str | None = None) -> str:
    el = element or _DTYPES[str(a.dtype)]
    return "tensor<" + "".join(f"{d}x" for d in a.shape) + el + ">"


def module_text(args: list[str], results: list[str], body: list[str]) -> str:
    params = ", ".join(f"%a{i}: {t}" for i, t in enumerate(args))
    res = results[0] if len(results) == 1 else "(" + ", ".join(results) + ")"
    lines = [
        '"builtin.module"() ({',
        f'  "func.func"() <{{function_type = ({", ".join(args)}) -> {res}, sym_name = "main"}}> ({{',
        f"  ^bb0({params}):",
        *("    " + line for line in body),
        "  }) : () -> ()",
        "}) : () -> ()",
    ]
    return "\n".join(lines)


def run_op(name: str, *arrays: np.ndarray, result: str | None = None, attrs: str = "",
           arg_types: list[str] | None = None) -> np.ndarray:
    """Run one ``semantic.<name>`` op on ``arrays`` and return its single result."""
    types = arg_types or [ttype(a) for a in arrays]
    res = result or types[0]
    operands = ", ".join(f"%a{i}" for i in range(len(arrays)))
    attr_text = f" {{{attrs}}}" if attrs else ""
    body = [f'%0 = "semantic.{name}"({operands}){attr_text} : ({", ".join(types)}) -> {res}',
            f'"func.return"(%0) : ({res}) -> ()']
    (out,) = run_reference(parse_module(module_text(types, [res], body)), list(arrays))
    return out


def normal(*shape: int, dtype: type = np.float32) -> np.ndarray:
    return RNG.normal(size=shape).astype(dtype)


def f32(values: np.ndarray) -> np.ndarray:
    return np.asarray(values, dtype=np.float64).astype(np.float32)


# -------------------------------------------------------------------------- unary

UNARY = {
    "neg": lambda x: -x,
    "abs": np.abs,
    "exp": np.exp,
    "tanh": np.tanh,
    "sigmoid": lambda x: 0.5 * (1.0 + np.tanh(x / 2.0)),
    "relu": lambda x: np.where(x > 0, x, 0.0),
    "sin": np.sin,
    "cos": np.cos,
    "floor": np.floor,
    "erf": np.frompyfunc(math.erf, 1, 1),
    "reciprocal": lambda x: 1.0 / x,
}
POSITIVE_UNARY = {"log": np.log, "sqrt": np.sqrt, "rsqrt": lambda x: np.sqrt(1.0 / x)}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_computes_in_float64_and_rounds_once(name: str) -> None:
    x = normal(40, 50) * 3
    got = run_op(name, x)
    assert got.dtype == np.float32 and got.shape == (40, 50)
    want = f32(UNARY[name](x.astype(np.float64)).astype(np.float64))
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", sorted(POSITIVE_UNARY))
def test_unary_positive_domain(name: str) -> None:
    x = np.abs(normal(4, 6)) + np.float32(0.01)
    got = run_op(name, x)
    np.testing.assert_array_equal(got, f32(POSITIVE_UNARY[name](x.astype(np.float64))))


def test_log_of_negative_is_nan_not_an_error() -> None:
    got = run_op("log", np.array([-1.0, 0.0, 1.0], dtype=np.float32))
    assert np.isnan(got[0]) and got[1] == -np.inf and got[2] == 0.0


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu(approximate: str) -> None:
    x = normal(3, 9) * 2
    got = run_op("gelu", x, attrs=f'approximate = "{approximate}"')
    v = x.astype(np.float64)
    if approximate == "none":
        want = np.array([0.5 * t * (1 + math.erf(t / math.sqrt(2))) for t in v.ravel()])
    else:
        want = 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)))
    np.testing.assert_allclose(got, f32(want.reshape(v.shape)), rtol=2e-7, atol=1e-30)


def test_gelu_defaults_to_exact_and_the_forms_differ() -> None:
    x = np.array([-2.0, -0.5, 0.7, 3.0], dtype=np.float32)
    assert np.array_equal(run_op("gelu", x), run_op("gelu", x, attrs='approximate = "none"'))
    assert not np.array_equal(run_op("gelu", x), run_op("gelu", x, attrs='approximate = "tanh"'))


def test_gelu_rejects_unknown_approximation() -> None:
    with pytest.raises(VerifyError, match="approximate"):
        run_op("gelu", normal(3), attrs='approximate = "fast"')


def test_float_only_unary_rejects_integers() -> None:
    with pytest.raises(VerifyError, match="needs a float tensor"):
        run_op("exp", np.arange(4, dtype=np.int32))


def test_integer_unary_keeps_integers() -> None:
    x = np.array([-3, 0, 5], dtype=np.int32)
    assert run_op("neg", x).tolist() == [3, 0, -5]
    assert run_op("abs", x).tolist() == [3, 0, 5]
    assert run_op("relu", x).tolist() == [0, 0, 5]
    assert run_op("relu", x).dtype == np.int32


def test_erf_is_accurate_in_float64() -> None:
    xs = np.concatenate([np.linspace(-7, 7, 20001), RNG.normal(size=5000) * 2,
                         [0.25, 0.75, 1.5, 2.5, 1e-300, 5e-324, 30.0]])
    want = np.array([math.erf(t) for t in xs])
    rel = np.abs(erf(xs) - want) / np.maximum(np.abs(want), 1e-300)
    assert rel.max() < 1e-14
    special = erf(np.array([np.nan, np.inf, -np.inf, 0.0, -0.0]))
    assert np.isnan(special[0]) and special[1] == 1.0 and special[2] == -1.0
    assert special[3] == 0.0 and np.signbit(special[4])


# ------------------------------------------------------------------------- binary

BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
          "max": np.maximum, "min": np.minimum}


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_broadcasts_like_numpy(name: str) -> None:
    a, b = normal(3, 1, 5), normal(4, 1)
    got = run_op(name, a, b, result="tensor<3x4x5xf32>")
    want = f32(BINARY[name](a.astype(np.float64), b.astype(np.float64)))
    assert got.shape == (3, 4, 5)
    np.testing.assert_array_equal(got, want)


def test_pow_with_positive_base() -> None:
    a, b = np.abs(normal(6)) + np.float32(0.5), normal(6)
    np.testing.assert_allclose(run_op("pow", a, b), f32(np.power(a.astype(float), b)),
                               rtol=2e-7)


def test_integer_div_truncates_toward_zero() -> None:
    a = np.array([7, -7, 7, -7, 6, 0, 5], dtype=np.int32)
    b = np.array([2, 2, -2, -2, 3, 5, 0], dtype=np.int32)
    got = run_op("div", a, b)
    assert got.dtype == np.int32
    assert got.tolist() == [3, -3, -3, 3, 2, 0, 0]


def test_integer_arithmetic_wraps() -> None:
    a = np.array([2**31 - 1, -(2**31)], dtype=np.int32)
    b = np.array([1, -1], dtype=np.int32)
    assert run_op("add", a, b).tolist() == [-(2**31), 2**31 - 1]
    big = np.array([2**62], dtype=np.int64)
    assert run_op("mul", big, np.array([2], dtype=np.int64)).tolist() == [-(2**63)]


def test_integer_pow_and_negative_exponents() -> None:
    a = np.array([2, 3, 1, -1, -1, 5], dtype=np.int64)
    b = np.array([10, 3, -4, -3, -2, -1], dtype=np.int64)
    assert run_op("pow", a, b).tolist() == [1024, 27, 1, -1, 1, 0]


def test_binary_rejects_mixed_element_types() -> None:
    with pytest.raises(VerifyError, match="one element type"):
        run_op("add", normal(3), normal(3, dtype=np.float16))


def test_non_broadcasting_shapes_are_a_verify_error() -> None:
    with pytest.raises(VerifyError, match="semantic.add"):
        run_op("add", normal(3), normal(4), arg_types=["tensor<?xf32>", "tensor<?xf32>"])


@pytest.mark.parametrize("pred,fn", [("lt", np.less), ("le", np.less_equal),
                                     ("gt", np.greater), ("ge", np.greater_equal),
                                     ("eq", np.equal), ("ne", np.not_equal)])
def test_cmp(pred: str, fn: object) -> None:
    a = np.array([[1.0, 2.0, 3.0], [3.0, 2.0, 1.0]], dtype=np.float32)
    b = np.array([2.0, 2.0, 2.0], dtype=np.float32)
    got = run_op("cmp", a, b, result="tensor<2x3xi1>", attrs=f'predicate = "{pred}"')
    assert got.dtype == np.bool_
    np.testing.assert_array_equal(got, fn(a, b))  # type: ignore[operator]


def test_select_broadcasts_three_ways() -> None:
    cond = np.array([[True], [False]])
    a, b = normal(1, 4), normal(2, 1)
    got = run_op("select", cond, a, b, result="tensor<2x4xf32>")
    np.testing.assert_array_equal(got, np.where(cond, a, b))


# ------------------------------------------------------------------- rounding, cast


def test_round_bf16_array_matches_scalar_rounding() -> None:
    ties = np.array([1.00390625, 1.01171875, -1.00390625, 3.4e38, -3.4e38, 1e-40, 0.0, -0.0,
                     np.inf, -np.inf], dtype=np.float64)
    xs = np.concatenate([RNG.normal(size=2000) * 10.0 ** RNG.integers(-30, 30, 2000), ties])
    got = round_bf16_array(xs)
    assert got.dtype == np.float32
    want = np.array([round_bf16(float(v)) for v in xs], dtype=np.float32)
    np.testing.assert_array_equal(got, want)
    assert got[-10:-8].tolist() == [1.0, 1.015625]  # ties go to even
    assert np.isnan(round_bf16_array(np.array([np.nan])))[0]


def test_bf16_op_rounds_its_result_once() -> None:
    a = round_bf16_array(normal(64))
    b = round_bf16_array(normal(64))
    got = run_op("add", a, b, arg_types=["tensor<64xbf16>"] * 2)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, round_bf16_array(a.astype(np.float64) + b))
    assert not np.array_equal(got, a + b)  # the f32 sum is not representable in bf16


def test_bf16_inputs_are_rounded_on_entry() -> None:
    x = np.array([1.00390625, 1.01171875], dtype=np.float32)
    got = run_op("cast", x, arg_types=["tensor<2xbf16>"], result="tensor<2xf32>")
    assert got.tolist() == [1.0, 1.015625]


def test_f16_op_computes_wide_and_rounds() -> None:
    a, b = normal(50, dtype=np.float16), normal(50, dtype=np.float16)
    got = run_op("mul", a, b)
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, (a.astype(np.float64) * b).astype(np.float16))
    big = np.array([300.0], dtype=np.float16)
    assert run_op("mul", big, big)[0] == np.inf  # 90000 overflows f16


def test_cast_between_floats() -> None:
    x = normal(100) * 100
    h = run_op("cast", x, result="tensor<100xf16>")
    assert h.dtype == np.float16
    np.testing.assert_array_equal(h, x.astype(np.float16))
    np.testing.assert_array_equal(run_op("cast", h, result="tensor<100xf32>"),
                                  h.astype(np.float32))
    bf = run_op("cast", x, result="tensor<100xbf16>")
    np.testing.assert_array_equal(bf, [round_bf16(float(v)) for v in x])


def test_cast_float_to_int_truncates_and_saturates() -> None:
    x = np.array([-1.7, 1.7, 2.5, -0.5, 3e9, -3e9, np.nan], dtype=np.float32)
    got = run_op("cast", x, result="tensor<7xi32>")
    assert got.dtype == np.int32
    assert got.tolist() == [-1, 1, 2, 0, 2**31 - 1, -(2**31), 0]


def test_cast_to_and_from_i1() -> None:
    x = np.array([0, 3, -2], dtype=np.int32)
    assert run_op("cast", x, result="tensor<3xi1>").tolist() == [False, True, True]
    f = np.array([0.0, 0.25, -0.0], dtype=np.float32)
    assert run_op("cast", f, result="tensor<3xi1>").tolist() == [False, True, False]
    b = np.array([True, False])
    got = run_op("cast", b, result="tensor<2xf32>")
    assert got.dtype == np.float32 and got.tolist() == [1.0, 0.0]


def test_cast_between_integers_wraps() -> None:
    x = np.array([2**40 + 5, -1], dtype=np.int64)
    assert run_op("cast", x, result="tensor<2xi32>").tolist() == [5, -1]
    y = np.array([7, -7], dtype=np.int32)
    got = run_op("cast", y, result="tensor<2xi64>")
    assert got.dtype == np.int64 and got.tolist() == [7, -7]


# ---------------------------------------------------------------------- constant


def _constant(value: str, t: str) -> np.ndarray:
    body = [f'%0 = "semantic.constant"() {{value = {value}}} : () -> {t}',
            f'"func.return"(%0) : ({t}) -> ()']
    return run_reference(parse_module(module_text([], [t], body)), [])[0]


def test_constants() -> None:
    splat = _constant("dense<1.250000e-01> : tensor<2x3xf32>", "tensor<2x3xf32>")
    assert splat.dtype == np.float32 and splat.shape == (2, 3) and (splat == 0.125).all()
    full = _constant("dense<[[1, 2], [3, 4]]> : tensor<2x2xi32>", "tensor<2x2xi32>")
    assert full.dtype == np.int32 and full.tolist() == [[1, 2], [3, 4]]
    scalar = _constant("dense<0.1> : tensor<bf16>", "tensor<bf16>")
    assert scalar.shape == () and scalar == np.float32(round_bf16(0.1))


def test_constant_type_must_match_result() -> None:
    with pytest.raises(VerifyError, match="constant"):
        _constant("dense<1.0> : tensor<2xf32>", "tensor<3xf32>")


# -------------------------------------------------------------------- reductions

REDUCE = {"sum": np.sum, "max": np.max, "min": np.min, "mean": np.mean}


@pytest.mark.parametrize("kind", sorted(REDUCE))
@pytest.mark.parametrize("axes,keep", [((1,), False), ((0,), True), ((-1, 0), False),
                                       ((0, 2), True)])
def test_reductions(kind: str, axes: tuple[int, ...], keep: bool) -> None:
    x = normal(3, 4, 5)
    want = f32(REDUCE[kind](x.astype(np.float64), axis=axes, keepdims=keep))
    result = "tensor<" + "".join(f"{d}x" for d in want.shape) + "f32>"
    attrs = f"axes = array<i64: {', '.join(map(str, axes))}>, keepdims = {str(keep).lower()}"
    got = run_op(f"reduce_{kind}", x, result=result, attrs=attrs)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=2e-7)


def test_reduce_keepdims_defaults_to_false() -> None:
    got = run_op("reduce_sum", normal(3, 4), result="tensor<3xf32>", attrs="axes = array<i64: 1>")
    assert got.shape == (3,)


def test_reduce_sum_of_integers_stays_integer() -> None:
    x = np.arange(12, dtype=np.int32).reshape(3, 4)
    got = run_op("reduce_sum", x, result="tensor<4xi32>", attrs="axes = array<i64: 0>")
    assert got.dtype == np.int32 and got.tolist() == [12, 15, 18, 21]


def test_reduce_mean_of_integers_is_an_error() -> None:
    with pytest.raises(VerifyError, match="reduce_mean"):
        run_op("reduce_mean", np.arange(4, dtype=np.int32), result="tensor<i32>",
               attrs="axes = array<i64: 0>")


def test_reduce_axis_out_of_range() -> None:
    with pytest.raises(VerifyError, match="out of range"):
        run_op("reduce_sum", normal(3, 4), result="tensor<3xf32>", attrs="axes = array<i64: 2>")


# ------------------------------------------------------------------------ layout


def test_reshape_binds_one_dynamic_dim() -> None:
    x = normal(6, 4)
    got = run_op("reshape", x, result="tensor<?x2x2xf32>", arg_types=["tensor<?x4xf32>"])
    np.testing.assert_array_equal(got, x.reshape(6, 2, 2))


def test_transpose() -> None:
    x = normal(2, 3, 4)
    got = run_op("transpose", x, result="tensor<4x2x3xf32>",
                 attrs="permutation = array<i64: 2, 0, 1>")
    np.testing.assert_array_equal(got, np.transpose(x, (2, 0, 1)))
    with pytest.raises(VerifyError, match="permutation"):
        run_op("transpose", x, result="tensor<4x2x3xf32>", attrs="permutation = array<i64: 2, 0>")


def test_broadcast_to() -> None:
    x = normal(3, 1)
    got = run_op("broadcast_to", x, result="tensor<2x3x5xf32>")
    np.testing.assert_array_equal(got, np.broadcast_to(x, (2, 3, 5)))
    got = run_op("broadcast_to", x, result="tensor<2x?x5xf32>", arg_types=["tensor<?x1xf32>"])
    assert got.shape == (2, 3, 5)


# ------------------------------------------------------------- matmul and norms


def test_matmul_2d() -> None:
    a, b = normal(5, 7), normal(7, 3)
    got = run_op("matmul", a, b, result="tensor<5x3xf32>")
    np.testing.assert_allclose(got, f32(a.astype(np.float64) @ b), rtol=1e-6)


def test_matmul_broadcasts_batch_dims() -> None:
    a, b = normal(2, 1, 4, 3), normal(5, 3, 6)
    got = run_op("matmul", a, b, result="tensor<2x5x4x6xf32>")
    np.testing.assert_allclose(got, f32(np.matmul(a.astype(np.float64), b)), rtol=1e-6,
                               atol=1e-6)


def test_matmul_contraction_mismatch() -> None:
    with pytest.raises(VerifyError, match="contracts"):
        run_op("matmul", normal(2, 3), normal(4, 2), result="tensor<2x2xf32>")


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_softmax(axis: int) -> None:
    x = normal(4, 6) * 5
    got = run_op("softmax", x, attrs=f"axis = {axis} : i64")
    e = np.exp(x.astype(np.float64))
    np.testing.assert_allclose(got, f32(e / e.sum(axis=axis, keepdims=True)), rtol=1e-6)


def test_softmax_is_stable_for_large_inputs() -> None:
    x = np.array([[1000.0, 1000.0], [-1000.0, 0.0]], dtype=np.float32)
    got = run_op("softmax", x, attrs="axis = -1 : i64")
    np.testing.assert_allclose(got, [[0.5, 0.5], [0.0, 1.0]])


LN_ATTRS = "axis = {axis} : i64, epsilon = 1.0e-05 : f32"


@pytest.mark.parametrize("axis", [-1, 1])
def test_layernorm(axis: int) -> None:
    x, g, b = normal(2, 3, 4), normal(3, 4) if axis == 1 else normal(4), normal(4)
    if axis == 1:
        b = normal(3, 4)
    got = run_op("layernorm", x, g, b, attrs=LN_ATTRS.format(axis=axis))
    v = x.astype(np.float64)
    axes = tuple(range(axis % 3, 3))
    mu = v.mean(axis=axes, keepdims=True)
    var = v.var(axis=axes, keepdims=True)
    eps = float(np.float32(1e-5))
    np.testing.assert_allclose(got, f32((v - mu) / np.sqrt(var + eps) * g + b), rtol=1e-6,
                               atol=1e-6)


def test_layernorm_gamma_shape_must_match() -> None:
    with pytest.raises(VerifyError, match="operand 1"):
        run_op("layernorm", normal(2, 4), normal(3), normal(4), attrs=LN_ATTRS.format(axis=-1))


def test_rmsnorm() -> None:
    x, g = normal(3, 8), normal(8)
    got = run_op("rmsnorm", x, g, attrs=LN_ATTRS.format(axis=-1))
    v = x.astype(np.float64)
    want = v / np.sqrt((v ** 2).mean(axis=-1, keepdims=True) + float(np.float32(1e-5))) * g
    np.testing.assert_allclose(got, f32(want), rtol=1e-6)


# ------------------------------------------------------------ binding and errors

DYN = module_text(["tensor<?x4xf32>", "tensor<4xf32>"], ["tensor<?x4xf32>"], [
    '%0 = "semantic.add"(%a0, %a1) : (tensor<?x4xf32>, tensor<4xf32>) -> tensor<?x4xf32>',
    '"func.return"(%0) : (tensor<?x4xf32>) -> ()',
])


@pytest.mark.parametrize("rows", [0, 1, 3, 17])
def test_dynamic_dims_bind_from_inputs(rows: int) -> None:
    x, b = normal(rows, 4), normal(4)
    (got,) = run_reference(parse_module(DYN), [x, b])
    assert got.shape == (rows, 4)
    np.testing.assert_array_equal(got, x + b)


def test_input_shape_mismatch_names_the_argument() -> None:
    with pytest.raises(VerifyError) as e:
        run_reference(parse_module(DYN), [normal(3, 5), normal(4)])
    assert str(e.value) == "input 0 has shape (3, 5) but argument 0 is tensor<?x4xf32>"
    with pytest.raises(VerifyError, match="input 1 has shape"):
        run_reference(parse_module(DYN), [normal(3, 4), normal(1, 4)])


def test_input_dtype_mismatch() -> None:
    with pytest.raises(VerifyError, match="input 0 has dtype float64"):
        run_reference(parse_module(DYN), [np.zeros((2, 4)), normal(4)])


def test_wrong_number_of_inputs() -> None:
    with pytest.raises(VerifyError, match="takes 2 arguments but 1 inputs"):
        run_reference(parse_module(DYN), [normal(2, 4)])


def test_declared_result_shape_must_agree() -> None:
    with pytest.raises(VerifyError, match=r"shape \(3, 4\) but its declared type"):
        run_op("add", normal(3, 4), normal(4), result="tensor<5x4xf32>")


def test_unknown_op_is_an_error() -> None:
    with pytest.raises(VerifyError, match="no reference implementation for 'semantic.nope'"):
        run_op("nope", normal(3))


def test_register_impl_adds_a_dialect_op() -> None:
    @register_impl("test.twice")
    def _twice(op: object, args: list[np.ndarray]) -> list[np.ndarray]:
        return [args[0] * np.float32(2)]

    try:
        t = "tensor<3xf32>"
        body = [f'%0 = "test.twice"(%a0) : ({t}) -> {t}', f'"func.return"(%0) : ({t}) -> ()']
        x = normal(3)
        (got,) = run_reference(parse_module(module_text([t], [t], body)), [x])
        np.testing.assert_array_equal(got, 2 * x)
    finally:
        del IMPLS["test.twice"]


def test_named_function_and_call() -> None:
    t = "tensor<2xf32>"
    text = f'''"builtin.module"() ({{
  "func.func"() <{{function_type = ({t}) -> {t}, sym_name = "helper"}}> ({{
  ^bb0(%x: {t}):
    %0 = "semantic.neg"(%x) : ({t}) -> {t}
    "func.return"(%0) : ({t}) -> ()
  }}) : () -> ()
  "func.func"() <{{function_type = ({t}) -> ({t}, {t}), sym_name = "main"}}> ({{
  ^bb0(%x: {t}):
    %0 = "func.call"(%x) {{callee = @helper}} : ({t}) -> {t}
    "func.return"(%0, %x) : ({t}, {t}) -> ()
  }}) : () -> ()
}}) : () -> ()'''
    m = parse_module(text)
    x = np.array([1.0, -2.0], dtype=np.float32)
    neg, same = run_reference(m, [x])
    assert neg.tolist() == [-1.0, 2.0] and same.tolist() == [1.0, -2.0] and same is not x
    assert run_reference(m, [x], function="helper")[0].tolist() == [-1.0, 2.0]
    with pytest.raises(VerifyError, match="no function named 'other'"):
        run_reference(m, [x], function="other")
