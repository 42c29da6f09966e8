"""The ONNX importer: opset conventions, folding, bound shape inputs, locations, errors, CLI."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, numpy_helper  # noqa: E402
from onnx import helper as h  # noqa: E402

from accy.errors import FrontendError  # noqa: E402
from accy.frontends.onnx import import_onnx  # noqa: E402
from accy.reference import run_reference  # noqa: E402

F = TensorProto.FLOAT


def model(nodes, inputs, outputs, opset=17, inits=()):  # type: ignore[no-untyped-def]
    g = h.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)])


def vi(name, shape, dtype=F):  # type: ignore[no-untyped-def]
    return h.make_tensor_value_info(name, dtype, shape)


def run(m, *arrays, **kw):  # type: ignore[no-untyped-def]
    sm = import_onnx(m, **kw)
    return sm, run_reference(sm.module, list(arrays))


def test_named_dims_become_dynamic_and_the_module_verifies() -> None:
    m = model([h.make_node("Relu", ["x"], ["y"])], [vi("x", ["batch", 4])], [vi("y", None)])
    sm = import_onnx(m)
    assert str(sm.entry().function_type) == "(tensor<?x4xf32>) -> tensor<?x4xf32>"
    assert sm.meta["onnx_arguments"] == ["x"]


@pytest.mark.parametrize("opset", [11, 13])
def test_softmax_axis_convention_before_and_after_opset_13(opset: int) -> None:
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    m = model([h.make_node("Softmax", ["x"], ["y"], axis=1)], [vi("x", [2, 3, 4])],
              [vi("y", [2, 3, 4])], opset=opset)
    _, (y,) = run(m, x)
    if opset < 13:  # coerced to 2-D at axis 1: normalized over axes 1 and 2 together
        e = np.exp(x.reshape(2, 12) - x.reshape(2, 12).max(1, keepdims=True))
        want = (e / e.sum(1, keepdims=True)).reshape(2, 3, 4)
    else:
        e = np.exp(x - x.max(1, keepdims=True))
        want = e / e.sum(1, keepdims=True)
    np.testing.assert_allclose(y, want, rtol=1e-5)


@pytest.mark.parametrize("opset", [11, 13])
def test_reduce_sum_axes_attribute_then_input(opset: int) -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    if opset < 13:
        nodes, inits = [h.make_node("ReduceSum", ["x"], ["y"], axes=[1], keepdims=0)], []
    else:
        nodes = [h.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)]
        inits = [numpy_helper.from_array(np.array([1], np.int64), "axes")]
    m = model(nodes, [vi("x", [2, 3])], [vi("y", [2])], opset=opset, inits=inits)
    _, (y,) = run(m, x)
    np.testing.assert_array_equal(y, x.sum(1))


@pytest.mark.parametrize("opset", [11, 13])
def test_squeeze_unsqueeze_axes_across_opsets(opset: int) -> None:
    x = np.ones((3, 1, 4), np.float32)
    if opset < 13:
        nodes = [h.make_node("Squeeze", ["x"], ["s"], axes=[1]),
                 h.make_node("Unsqueeze", ["s"], ["y"], axes=[0])]
        inits = []
    else:
        nodes = [h.make_node("Squeeze", ["x", "a1"], ["s"]),
                 h.make_node("Unsqueeze", ["s", "a0"], ["y"])]
        inits = [numpy_helper.from_array(np.array([1], np.int64), "a1"),
                 numpy_helper.from_array(np.array([0], np.int64), "a0")]
    m = model(nodes, [vi("x", [3, 1, 4])], [vi("y", None)], opset=opset, inits=inits)
    sm, (y,) = run(m, x)
    assert y.shape == (1, 3, 4)


@pytest.mark.parametrize("opset", [6, 11])
def test_clip_bounds_attribute_then_inputs(opset: int) -> None:
    x = np.linspace(-3, 3, 7, dtype=np.float32)
    if opset < 11:
        nodes, inits = [h.make_node("Clip", ["x"], ["y"], min=-1.0, max=2.0)], []
    else:
        nodes = [h.make_node("Clip", ["x", "lo", "hi"], ["y"])]
        inits = [numpy_helper.from_array(np.array(-1.0, np.float32), "lo"),
                 numpy_helper.from_array(np.array(2.0, np.float32), "hi")]
    m = model(nodes, [vi("x", [7])], [vi("y", [7])], opset=opset, inits=inits)
    _, (y,) = run(m, x)
    np.testing.assert_array_equal(y, np.clip(x, -1, 2))


def test_shape_computations_fold_to_a_static_reshape() -> None:
    # y = Reshape(x, Concat(Shape(x)[0:1], [-1])): all folded at import
    nodes = [h.make_node("Shape", ["x"], ["s"]),
             h.make_node("Gather", ["s", "zero"], ["d0"], axis=0),
             h.make_node("Unsqueeze", ["d0", "zero1"], ["d0u"]),
             h.make_node("Concat", ["d0u", "minus1"], ["shape"], axis=0),
             h.make_node("Reshape", ["x", "shape"], ["y"])]
    inits = [numpy_helper.from_array(np.array(0, np.int64), "zero"),
             numpy_helper.from_array(np.array([0], np.int64), "zero1"),
             numpy_helper.from_array(np.array([-1], np.int64), "minus1")]
    m = model(nodes, [vi("x", [2, 3, 4])], [vi("y", None)], opset=17, inits=inits)
    sm = import_onnx(m)
    ops = [op.op_name for op in sm.entry().body.ops]
    assert ops == ["semantic.reshape", "func.return"]
    assert str(sm.entry().function_type) == "(tensor<2x3x4xf32>) -> tensor<2x12xf32>"


def test_a_shape_graph_input_is_bound_from_its_value() -> None:
    m = model([h.make_node("Reshape", ["x", "shape"], ["y"])],
              [vi("x", [2, 6]), vi("shape", [2], TensorProto.INT64)], [vi("y", None)])
    sm = import_onnx(m, input_values={"shape": np.array([3, 4], np.int64)})
    assert sm.meta["onnx_arguments"] == ["x"]
    assert str(sm.entry().function_type) == "(tensor<2x6xf32>) -> tensor<3x4xf32>"
    with pytest.raises(FrontendError, match=r"Reshape.*opset 17.*'shape' input must be known"):
        import_onnx(m)


def test_locations_name_the_node() -> None:
    m = model([h.make_node("Exp", ["x"], ["e"], name="first"),
               h.make_node("Neg", ["e"], ["y"])], [vi("x", [4])], [vi("y", [4])])
    sm = import_onnx(m, file="m.onnx")
    locs = [str(op.loc) for op in sm.entry().body.ops if op.op_name.startswith("semantic.")]
    assert locs == ["m.onnx:first:1:1", "m.onnx:Neg_1:2:1"]
    assert 'loc("m.onnx:first":1:1)' in sm.text(debuginfo=True)


def test_an_unsupported_op_is_one_line_naming_op_node_and_opset() -> None:
    m = model([h.make_node("Conv", ["x", "w"], ["y"], name="conv1")],
              [vi("x", [1, 1, 4, 4]), vi("w", [1, 1, 3, 3])], [vi("y", None)], opset=13)
    with pytest.raises(FrontendError) as e:
        import_onnx(m, file="m.onnx")
    text = str(e.value)
    assert "\n" not in text
    assert text.startswith("m.onnx:conv1:1:1: error: ONNX node 'conv1' (Conv, opset 13): "
                           "unsupported: op 'Conv'")


def test_an_unsupported_dtype_is_a_frontend_error() -> None:
    m = model([h.make_node("Relu", ["x"], ["y"])], [vi("x", [4], TensorProto.STRING)],
              [vi("y", [4], TensorProto.STRING)])
    with pytest.raises(FrontendError, match="dtype STRING of graph input 'x'"):
        import_onnx(m)


def test_f64_i8_i16_inputs_import() -> None:
    for code, el in ((TensorProto.DOUBLE, "f64"), (TensorProto.INT8, "i8"),
                     (TensorProto.INT16, "i16")):
        m = model([h.make_node("Relu", ["x"], ["y"])], [vi("x", [4], code)], [vi("y", [4], code)])
        assert str(import_onnx(m).entry().function_type) == \
            f"(tensor<4x{el}>) -> tensor<4x{el}>"


def test_an_op_defined_by_a_function_imports_as_its_body() -> None:
    m = model([h.make_node("Swish", ["x"], ["y"], name="sw", alpha=2.0)], [vi("x", [4])],
              [vi("y", [4])], opset=24)
    sm = import_onnx(m, file="m.onnx")
    x = np.array([-2.0, -0.5, 0.0, 3.0], np.float32)
    got = run_reference(sm.module, [x])[0]
    np.testing.assert_allclose(got, x / (1 + np.exp(-2 * x)), rtol=1e-6)


def test_an_unsupported_op_inside_a_function_body_names_both_nodes() -> None:
    nodes = [h.make_node("Bernoulli", ["x"], ["y"], name="nll")]
    m = model(nodes, [vi("x", [2, 3])], [vi("y", [2, 3])], opset=22)
    with pytest.raises(FrontendError) as e:
        import_onnx(m, file="m.onnx")
    text = str(e.value)
    assert "\n" not in text
    assert "ONNX node 'nll' (Bernoulli, opset 22), in its function body: node '" in text
    assert "(RandomUniformLike, opset 22): unsupported: op 'RandomUniformLike'" in text


def test_a_bad_file_is_a_frontend_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    p = tmp_path / "bad.onnx"
    p.write_bytes(b"\x00not a model")
    with pytest.raises(FrontendError, match="cannot read ONNX model"):
        import_onnx(str(p))


def test_composed_ops_match_numpy() -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 5)).astype(np.float32)
    nodes = [h.make_node("LogSoftmax", ["x"], ["a"], axis=-1),
             h.make_node("LeakyRelu", ["x"], ["b"], alpha=0.1),
             h.make_node("HardSwish", ["x"], ["c"]),
             h.make_node("ReduceLogSumExp", ["x"], ["d"], axes=[1], keepdims=0),
             h.make_node("Greater", ["x", "zero"], ["gt"]),
             h.make_node("Not", ["gt"], ["e"])]
    inits = [numpy_helper.from_array(np.array(0, np.float32), "zero")]
    m = model(nodes, [vi("x", [3, 5])], [vi(n, None) for n in "abcde"], opset=17, inits=inits)
    _, (a, b, c, d, e) = run(m, x)
    m_ = x.max(1, keepdims=True)
    lse = np.log(np.exp(x - m_).sum(1, keepdims=True)) + m_
    np.testing.assert_allclose(a, x - lse, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(b, np.where(x < 0, 0.1 * x, x), rtol=1e-6)
    np.testing.assert_allclose(c, x * np.clip(x / 6 + 0.5, 0, 1), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(d, lse[:, 0], rtol=1e-5)
    np.testing.assert_array_equal(e, ~(x > 0))


def test_cli_import_check_and_run(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from accy.cli import main

    m = model([h.make_node("Reshape", ["x", "shape"], ["r"]),
               h.make_node("Sigmoid", ["r"], ["y"])],
              [vi("x", ["n", 6]), vi("shape", [2], TensorProto.INT64)], [vi("y", None)])
    path = str(tmp_path / "m.onnx")
    onnx.save(m, path)
    out = tmp_path / "m.mlir"
    assert main(["import", path, "-o", str(out)]) == 1  # the shape input is not bound
    m2 = model([h.make_node("Sigmoid", ["x"], ["y"])], [vi("x", ["n", 6])], [vi("y", None)])
    path2 = str(tmp_path / "m2.onnx")
    onnx.save(m2, path2)
    assert main(["import", path2, "-o", str(out)]) == 0
    assert '"semantic.sigmoid"' in out.read_text()
    assert main(["check", path2]) == 0
    x = np.random.default_rng(0).standard_normal((2, 6)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "s.npy", np.array([3, 4], np.int64))
    assert main(["run", path, "--input", str(tmp_path / "x.npy"), "--input",
                 str(tmp_path / "s.npy"), "--output-dir", str(tmp_path / "o")]) == 0
    y = np.load(tmp_path / "o" / "result0.npy")
    np.testing.assert_allclose(y, 1 / (1 + np.exp(-x.reshape(3, 4))), rtol=1e-5)


def test_argument_shapes_bind_by_position_and_name_the_inputs_when_out_of_range(tmp_path) -> None:  # type: ignore[no-untyped-def]
    m = model([h.make_node("Shape", ["x"], ["s"]), h.make_node("Reshape", ["x", "s"], ["y"])],
              [vi("x", ["n", 6])], [vi("y", None)])
    with pytest.raises(FrontendError, match="Shape of a tensor with unknown dims"):
        import_onnx(m, file="m.onnx")
    sm = import_onnx(m, file="m.onnx", argument_shapes={0: (3, 6)})
    assert "tensor<3x6xf32>" in sm.text()
    with pytest.raises(FrontendError, match=r"arg1, but the model has 1 graph input\(s\) \(x\)"):
        import_onnx(m, file="m.onnx", argument_shapes={1: (3, 6)})
