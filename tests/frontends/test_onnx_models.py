"""Small real models end to end: built with onnx.helper, imported, compiled for the host
target, and compared with onnxruntime's CPU result."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, numpy_helper  # noqa: E402
from onnx import helper as h  # noqa: E402

from accy.executable.cache import FragmentCompilerCache  # noqa: E402
from accy.frontends.onnx import import_onnx  # noqa: E402
from accy.preparation.options import RunOptions  # noqa: E402
from accy.preparation.stages import PreparationRequest  # noqa: E402

F = TensorProto.FLOAT
RNG = np.random.default_rng(0)
IR_VERSION = 8
"""The IR version of opset 17 (onnx's own table), fixed: a newer onnx stamps its own,
which an older onnxruntime refuses (the GPU machine's onnx writes IR 14, its
onnxruntime reads up to 13)."""


def _init(name: str, *shape: int, scale: float = 0.1) -> onnx.TensorProto:
    return numpy_helper.from_array((RNG.standard_normal(shape) * scale).astype(np.float32), name)


def _ints(name: str, values: list[int]) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, np.int64), name)


def _compiled(m: onnx.ModelProto, x: np.ndarray, target: str = "host") -> np.ndarray:
    sm = import_onnx(m, file="model.onnx", input_shapes={"x": x.shape})
    update = FragmentCompilerCache().refresh_from_semantic_module(
        sm, PreparationRequest(source="model.onnx", options=RunOptions.parse(target)))
    assert update.fragment is not None
    (y,) = update.fragment(x)
    return np.asarray(y)


def _ort(m: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def mlp() -> onnx.ModelProto:
    """Gemm + Relu + MatMul + Add + Softmax over a named batch dimension."""
    nodes = [h.make_node("Gemm", ["x", "w1", "b1"], ["h1"], transB=1),
             h.make_node("Relu", ["h1"], ["a1"]),
             h.make_node("MatMul", ["a1", "w2"], ["h2"]),
             h.make_node("Add", ["h2", "b2"], ["h3"]),
             h.make_node("Softmax", ["h3"], ["y"], axis=-1)]
    inits = [_init("w1", 128, 64), _init("b1", 128), _init("w2", 128, 10), _init("b2", 10)]
    g = h.make_graph(nodes, "mlp", [h.make_tensor_value_info("x", F, ["batch", 64])],
                     [h.make_tensor_value_info("y", F, ["batch", 10])], initializer=inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=IR_VERSION)
    onnx.checker.check_model(m)
    return m


def test_mlp_matches_onnxruntime() -> None:
    m = mlp()
    x = RNG.standard_normal((16, 64)).astype(np.float32)
    np.testing.assert_allclose(_compiled(m, x), _ort(m, x), rtol=1e-4, atol=1e-6)


def _transformer_block(seq: int | str, d: int, heads: int) -> onnx.ModelProto:
    """Pre-LN attention + erf-GELU MLP, as exporters write it (shapes via Shape/Concat)."""
    hd = d // heads
    n = []
    n += [h.make_node("LayerNormalization", ["x", "ln1_g", "ln1_b"], ["ln1"], axis=-1,
                      epsilon=1e-5)]
    for p in "qkv":
        n += [h.make_node("MatMul", ["ln1", f"w{p}"], [f"{p}0"]),
              h.make_node("Add", [f"{p}0", f"b{p}"], [f"{p}1"]),
              h.make_node("Reshape", [f"{p}1", "heads_shape"], [f"{p}2"]),
              h.make_node("Transpose", [f"{p}2"], [f"{p}h"], perm=[1, 0, 2])]
    n += [h.make_node("Transpose", ["kh"], ["kt"], perm=[0, 2, 1]),
          h.make_node("MatMul", ["qh", "kt"], ["s0"]),
          h.make_node("Div", ["s0", "scale"], ["s1"]),
          h.make_node("Softmax", ["s1"], ["p"], axis=-1),
          h.make_node("MatMul", ["p", "vh"], ["o0"]),
          h.make_node("Transpose", ["o0"], ["o1"], perm=[1, 0, 2]),
          h.make_node("Shape", ["x"], ["xs"]),
          h.make_node("Reshape", ["o1", "xs"], ["o2"]),
          h.make_node("MatMul", ["o2", "wo"], ["o3"]),
          h.make_node("Add", ["x", "o3"], ["r1"]),
          h.make_node("LayerNormalization", ["r1", "ln2_g", "ln2_b"], ["ln2"], axis=-1),
          h.make_node("MatMul", ["ln2", "wf1"], ["f0"]),
          h.make_node("Add", ["f0", "bf1"], ["f1"]),
          h.make_node("Div", ["f1", "sqrt2"], ["g0"]),
          h.make_node("Erf", ["g0"], ["g1"]),
          h.make_node("Add", ["g1", "one"], ["g2"]),
          h.make_node("Mul", ["f1", "g2"], ["g3"]),
          h.make_node("Mul", ["g3", "half"], ["g4"]),
          h.make_node("MatMul", ["g4", "wf2"], ["f2"]),
          h.make_node("Add", ["r1", "f2"], ["y"])]
    scalar = lambda name, v: numpy_helper.from_array(np.array(v, np.float32), name)  # noqa: E731
    inits = [numpy_helper.from_array(np.ones(d, np.float32), "ln1_g"), _init("ln1_b", d),
             numpy_helper.from_array(np.ones(d, np.float32), "ln2_g"), _init("ln2_b", d),
             _init("wq", d, d), _init("bq", d), _init("wk", d, d), _init("bk", d),
             _init("wv", d, d), _init("bv", d), _init("wo", d, d),
             _init("wf1", d, 4 * d), _init("bf1", 4 * d), _init("wf2", 4 * d, d),
             _ints("heads_shape", [0, heads, hd]), scalar("scale", np.sqrt(hd)),
             scalar("sqrt2", np.sqrt(2.0)), scalar("one", 1.0), scalar("half", 0.5)]
    g = h.make_graph(n, "block", [h.make_tensor_value_info("x", F, [seq, d])],
                     [h.make_tensor_value_info("y", F, [seq, d])], initializer=inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=IR_VERSION)
    onnx.checker.check_model(m)
    return m


def test_transformer_block_matches_onnxruntime() -> None:
    m = _transformer_block(seq=32, d=64, heads=4)
    x = RNG.standard_normal((32, 64)).astype(np.float32)
    np.testing.assert_allclose(_compiled(m, x), _ort(m, x), rtol=1e-4, atol=1e-5)


def batch_and_run(tmp_path, target: str) -> None:  # type: ignore[no-untyped-def]
    """The user's path: save the models, ``accy batch`` them over shapes × block sizes
    for ``target``, then ``accy run`` each shape and compare with onnxruntime."""
    import json
    import subprocess
    import sys

    onnx.save(mlp(), str(tmp_path / "mlp.onnx"))
    onnx.save(_transformer_block("seq", 64, 4), str(tmp_path / "block.onnx"))
    shapes = [(32, 64), (96, 64)]
    (tmp_path / "sweep.yaml").write_text(
        "programs: [mlp.onnx, block.onnx]\n"
        f"targets: [{target}]\n"
        "shapes:\n" + "".join(f"  - {{arg0: {a}x{b}}}\n" for a, b in shapes) +
        "options:\n  kernel.block_size: [128, 256]\n")
    report = tmp_path / "report.json"
    out = subprocess.run([sys.executable, "-m", "accy", "batch", str(tmp_path / "sweep.yaml"),
                          "--workers", "1", "--no-progress", "--report", str(report)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    variants = json.loads(report.read_text())["variants"]
    assert len(variants) == 8 and {v["status"] for v in variants} == {"ok"}
    rng = np.random.default_rng(2)
    for name in ("mlp", "block"):
        model = onnx.load(str(tmp_path / f"{name}.onnx"))
        for shape in shapes:
            x = rng.standard_normal(shape).astype(np.float32)
            np.save(tmp_path / "x.npy", x)
            out = subprocess.run([sys.executable, "-m", "accy", "run",
                                  str(tmp_path / f"{name}.onnx"), "--target", target,
                                  "--input", str(tmp_path / "x.npy"),
                                  "--option", "kernel.block_size=128",
                                  "--output-dir", str(tmp_path / "out")],
                                 capture_output=True, text=True, timeout=300)
            assert out.returncode == 0, out.stdout + out.stderr
            y = np.load(tmp_path / "out" / "result0.npy")
            np.testing.assert_allclose(y, _ort(model, x), rtol=1e-4, atol=1e-5)


def test_models_batch_over_shapes_and_block_sizes_and_match_onnxruntime(tmp_path) -> None:  # type: ignore[no-untyped-def]
    batch_and_run(tmp_path, "host")
