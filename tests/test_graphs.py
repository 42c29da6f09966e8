"""The example programs in ``graphs/``: they round-trip through accy and ``mlir-opt``,
and the reference interpreter runs each of them."""

from __future__ import annotations

import math
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from accy.choir.attributes import TensorType, numpy_dtype
from accy.choir.builtin import ModuleOp
from accy.choir.parser import parse_file, parse_module
from accy.choir.printer import print_op
from accy.reference import run_reference

GRAPHS_DIR = Path(__file__).resolve().parents[1] / "graphs"
GRAPHS = sorted(GRAPHS_DIR.glob("*.mlir"))
IDS = [p.name for p in GRAPHS]
MLIR_OPT = "mlir-opt-19"
needs_mlir_opt = pytest.mark.skipif(shutil.which(MLIR_OPT) is None,
                                    reason=f"{MLIR_OPT} is not installed")

REQUIRED = {"softmax", "layernorm", "rmsnorm", "bias_gelu", "mlp", "attention", "reductions",
            "elementwise_chain", "dynamic", "all_ops", "residual_norm", "gelu_tanh"}
SEMANTIC_OPS = {
    "neg", "abs", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "relu", "erf", "sin", "cos",
    "reciprocal", "floor", "gelu", "add", "sub", "mul", "div", "max", "min", "pow", "cmp",
    "select", "cast", "constant", "reduce_sum", "reduce_max", "reduce_min", "reduce_mean",
    "reshape", "transpose", "broadcast_to", "matmul", "softmax", "layernorm", "rmsnorm",
}
SHAPES = {
    # graphs whose `?` dims must not all be equal to exercise them (rows ≠ columns)
    "dynamic.mlir": [(3, 5), (5,)],
    "elementwise_chain.mlir": [(3, 5), (1, 5)],
}


def mlir_opt(text: str, *flags: str) -> str:
    proc = subprocess.run([MLIR_OPT, "--allow-unregistered-dialect", "-mlir-print-op-generic",
                           *flags], input=text, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def make_inputs(module: ModuleOp, name: str, n: int, seed: int) -> list[np.ndarray]:
    """Random normal inputs, binding every `?` to ``n`` (or the shapes in ``SHAPES``)."""
    rng = np.random.default_rng(seed)
    types = module.entry().function_type.inputs
    shapes = SHAPES.get(name) or [
        tuple(n if d is None else d for d in t.shape) for t in types  # type: ignore[attr-defined]
    ]
    out = []
    for t, shape in zip(types, shapes):
        assert isinstance(t, TensorType)
        out.append(rng.normal(size=shape).astype(numpy_dtype(t.element)))
    return out


def test_the_expected_graphs_exist() -> None:
    assert len(GRAPHS) >= 12
    assert REQUIRED <= {p.stem for p in GRAPHS}


def test_all_ops_uses_every_semantic_op() -> None:
    module = parse_file(str(GRAPHS_DIR / "all_ops.mlir"))
    used = {op.op_name.removeprefix("semantic.") for op in module.walk()
            if op.op_name.startswith("semantic.")}
    assert used == SEMANTIC_OPS
    preds = {op.attr("predicate").value for op in module.walk()  # type: ignore[union-attr]
             if op.op_name == "semantic.cmp"}
    assert preds == {"lt", "le", "gt", "ge", "eq", "ne"}


@pytest.mark.parametrize("path", GRAPHS, ids=IDS)
def test_print_parse_print_is_a_fixed_point(path: Path) -> None:
    module = parse_file(str(path))
    text = print_op(module)
    again = print_op(parse_module(text, path.name))
    assert again == text
    with_locs = print_op(module, debuginfo=True)
    assert print_op(parse_module(with_locs), debuginfo=True) == with_locs


@needs_mlir_opt
@pytest.mark.parametrize("path", GRAPHS, ids=IDS)
def test_mlir_opt_accepts_the_file_and_our_print(path: Path) -> None:
    ours = print_op(parse_file(str(path)))
    mlir_opt(path.read_text())
    for flags in ((), ("-mlir-print-debuginfo",)):
        theirs = mlir_opt(ours, *flags)
        assert print_op(parse_module(theirs, "mlir-opt-output")) == ours


@needs_mlir_opt
@pytest.mark.parametrize("path", GRAPHS, ids=IDS)
def test_locations_survive_mlir_opt(path: Path) -> None:
    ours = print_op(parse_file(str(path)), debuginfo=True)
    theirs = mlir_opt(ours, "-mlir-print-debuginfo")
    assert print_op(parse_module(theirs), debuginfo=True) == ours


@pytest.mark.parametrize("n", [3, 8])
@pytest.mark.parametrize("path", GRAPHS, ids=IDS)
def test_reference_runs_every_graph(path: Path, n: int) -> None:
    module = parse_file(str(path))
    results = run_reference(module, make_inputs(module, path.name, n, seed=n))
    declared = module.entry().function_type.results
    assert len(results) == len(declared)
    for r, t in zip(results, declared):
        assert isinstance(t, TensorType)
        assert r.dtype == numpy_dtype(t.element)
        assert r.ndim == t.rank
        assert all(d is None or d == s for d, s in zip(t.shape, r.shape))
        assert np.isfinite(r).all()


# ---------------------------------------------- a few graphs against plain NumPy


def _run(name: str, inputs: list[np.ndarray]) -> list[np.ndarray]:
    return run_reference(parse_file(str(GRAPHS_DIR / name)), inputs)


def _softmax(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def test_softmax_graphs() -> None:
    x = np.random.default_rng(0).normal(size=(64, 5)).astype(np.float32)
    (col,) = _run("softmax_axis0.mlir", [x])
    np.testing.assert_allclose(col, _softmax(x.astype(np.float64), 0), rtol=1e-6)
    row = np.random.default_rng(1).normal(size=(2, 4096)).astype(np.float32)
    (out,) = _run("softmax.mlir", [row])
    np.testing.assert_allclose(out.sum(axis=-1), 1.0, rtol=1e-6)


def test_reductions_graph() -> None:
    x = np.random.default_rng(2).normal(size=(64, 128)).astype(np.float32)
    s, mx, mn, mean = _run("reductions.mlir", [x])
    v = x.astype(np.float64)
    np.testing.assert_allclose(s, v.sum(axis=1), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(mx, x.max(axis=0, keepdims=True))
    np.testing.assert_array_equal(mn, x.min(axis=1))
    assert mean.shape == () and math.isclose(float(mean), v.mean(), rel_tol=1e-6)


def test_attention_graph() -> None:
    rng = np.random.default_rng(3)
    q, k, v = (rng.normal(size=(2, 128, 64)).astype(np.float32) for _ in range(3))
    (out,) = _run("attention.mlir", [q, k, v])
    s = q.astype(np.float64) @ k.transpose(0, 2, 1) / 8.0
    np.testing.assert_allclose(out, _softmax(s, -1) @ v, rtol=1e-4, atol=1e-5)


def test_mlp_graph() -> None:
    rng = np.random.default_rng(4)
    x = rng.normal(size=(3, 256)).astype(np.float32)
    w1 = (rng.normal(size=(256, 1024)) / 16).astype(np.float32)
    b1 = rng.normal(size=1024).astype(np.float32)
    w2 = (rng.normal(size=(1024, 256)) / 32).astype(np.float32)
    b2 = rng.normal(size=256).astype(np.float32)
    (out,) = _run("mlp.mlir", [x, w1, b1, w2, b2])
    # each op rounds to f32 in the reference; here the f32 rounding happens per step too
    h = (x.astype(np.float64) @ w1).astype(np.float32) + b1
    g = 0.5 * h * (1 + np.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h.astype(np.float64) ** 3)))
    want = g.astype(np.float32).astype(np.float64) @ w2 + b2
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)


def test_dynamic_graph() -> None:
    rng = np.random.default_rng(5)
    x, b = rng.normal(size=(4, 7)).astype(np.float32), rng.normal(size=7).astype(np.float32)
    y, mean = _run("dynamic.mlir", [x, b])
    v = x.astype(np.float64)
    c = v - v.mean(axis=1, keepdims=True)
    np.testing.assert_allclose(mean, v.mean(axis=1, keepdims=True), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(y, c / (np.abs(c).max(axis=1, keepdims=True) + 1) + b,
                               rtol=1e-5, atol=1e-6)


def test_residual_norm_graph() -> None:
    rng = np.random.default_rng(6)
    x, r = (rng.normal(size=(3, 1024)).astype(np.float32) for _ in range(2))
    ones, zeros = np.ones(1024, np.float32), np.zeros(1024, np.float32)
    y, h = _run("residual_norm.mlir", [x, r, ones, zeros])
    np.testing.assert_array_equal(h, x + r)
    np.testing.assert_allclose(y.mean(axis=-1), 0.0, atol=1e-6)
    np.testing.assert_allclose(y.std(axis=-1), 1.0, rtol=1e-4)
