"""f64/i8/i16 and the data-movement ops through all six stages: host runs, CUDA compiles.

Each program is lowered by the real pipelines; the host fragment runs
against the NumPy reference (and, where it is simple to state, an
expectation written here with NumPy directly); the CUDA source of the same
program is compiled with NVRTC for sm_90 (no GPU needed).
"""

from __future__ import annotations

import tempfile

import numpy as np
import pytest
from stage_programs import program

from accy.executable import device
from accy.executable.compile import compile_fragment
from accy.executable.fragment import LoadedFragment
from accy.pipeline import prepare_through
from accy.preparation.options import RunOptions
from accy.reference import run_reference

RNG = np.random.default_rng(7)


def run_host(sm, xs):
    job = prepare_through(sm, "target", RunOptions.parse("host", []), {}).product
    return [np.asarray(r) for r in LoadedFragment(compile_fragment(job, tempfile.mkdtemp()))(*xs)]


def cuda_compiles(sm) -> None:
    pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="NVRTC (CuPy) is not installed")
    job = prepare_through(sm, "target", RunOptions.parse("cuda:sm_90", []), {}).product
    src = job.source
    assert device.compile_cuda(src, "sm_90")[:4] == b"\x7fELF"


def check(sm, xs, want=None):
    got = run_host(sm, xs)
    ref = [np.asarray(r) for r in run_reference(sm.module, xs)]
    for g, r in zip(got, ref):
        assert g.dtype == r.dtype and g.shape == r.shape
        np.testing.assert_array_equal(g, r)
    if want is not None:
        for g, w in zip(got, want):
            assert g.dtype == w.dtype
            np.testing.assert_array_equal(g, w)
    cuda_compiles(sm)
    return got


# ------------------------------------------------------------------ narrow ints


@pytest.mark.parametrize("el,np_t", [("i8", np.int8), ("i16", np.int16)])
def test_narrow_int_results_wrap_before_they_are_read(el, np_t):
    # a + b wraps in el; cast to f64 must read the wrapped value (not the int sum)
    t, f = f"tensor<4x8x{el}>", "tensor<4x8xf64>"
    sm = program([t, t], [f, t], f'''\
    %0 = "semantic.add"(%a0, %a1) : ({t}, {t}) -> {t}
    %1 = "semantic.mul"(%0, %a1) : ({t}, {t}) -> {t}
    %2 = "semantic.cast"(%1) : ({t}) -> {f}
    "func.return"(%2, %0) : ({f}, {t}) -> ()''')
    info = np.iinfo(np_t)
    a = RNG.integers(info.min, info.max, (4, 8)).astype(np_t)
    b = RNG.integers(info.min, info.max, (4, 8)).astype(np_t)
    with np.errstate(all="ignore"):
        s = (a + b).astype(np_t)
        want = [(s * b).astype(np_t).astype(np.float64), s]
    check(sm, [a, b], want)


def test_f64_row_reduction_and_matmul():
    t, r, m = "tensor<4x8xf64>", "tensor<4x1xf64>", "tensor<4x4xf64>"
    sm = program([t, "tensor<8x4xf64>"], [r, m], f'''\
    %0 = "semantic.exp"(%a0) : ({t}) -> {t}
    %1 = "semantic.reduce_sum"(%0) {{axes = array<i64: 1>, keepdims = true}} : ({t}) -> {r}
    %2 = "semantic.matmul"(%a0, %a1) : ({t}, tensor<8x4xf64>) -> {m}
    "func.return"(%1, %2) : ({r}, {m}) -> ()''')
    x, y = RNG.random((4, 8)), RNG.random((8, 4))
    got = run_host(sm, [x, y])
    np.testing.assert_allclose(got[0], np.exp(x).sum(1, keepdims=True), rtol=1e-14)
    np.testing.assert_allclose(got[1], x @ y, rtol=1e-14)
    assert got[0].dtype == np.float64
    cuda_compiles(sm)


# ---------------------------------------------------------------- data movement


def _f(shape, el="f32"):
    return f"tensor<{'x'.join(map(str, shape))}x{el}>" if shape else f"tensor<{el}>"


def test_slice_with_steps_and_a_reversed_dim_feeds_an_elementwise_op():
    x = RNG.random((6, 8)).astype(np.float32)
    sm = program([_f((6, 8))], [_f((2, 4))], f'''\
    %0 = "semantic.slice"(%a0) {{starts = array<i64: 1, 7>, sizes = array<i64: 2, 4>, steps = array<i64: 3, -2>}} : ({_f((6, 8))}) -> {_f((2, 4))}
    %1 = "semantic.exp"(%0) : ({_f((2, 4))}) -> {_f((2, 4))}
    "func.return"(%1) : ({_f((2, 4))}) -> ()''')
    check(sm, [x], [np.exp(x[1:5:3, 7::-2].astype(np.float64)).astype(np.float32)])


@pytest.mark.parametrize("el,np_t", [("f32", np.float32), ("i64", np.int64)])
def test_concat_of_three_along_an_inner_axis(el, np_t):
    xs = [(RNG.random((2, n, 3)) * 100).astype(np_t) for n in (1, 4, 2)]
    sm = program([_f((2, n, 3), el) for n in (1, 4, 2)], [_f((2, 7, 3), el)], f'''\
    %0 = "semantic.concat"(%a0, %a1, %a2) {{axis = 1 : i64}} : ({_f((2, 1, 3), el)}, {_f((2, 4, 3), el)}, {_f((2, 2, 3), el)}) -> {_f((2, 7, 3), el)}
    "func.return"(%0) : ({_f((2, 7, 3), el)}) -> ()''')
    check(sm, xs, [np.concatenate(xs, axis=1)])


def test_concat_feeds_a_row_reduction_and_slice_feeds_a_matmul():
    a, b = RNG.random((4, 3)).astype(np.float32), RNG.random((4, 5)).astype(np.float32)
    w = RNG.random((6, 4)).astype(np.float32)
    sm = program(
        [_f((4, 3)), _f((4, 5)), _f((6, 4))], [_f((4, 1)), _f((4, 4))], f'''\
    %0 = "semantic.concat"(%a0, %a1) {{axis = 1 : i64}} : ({_f((4, 3))}, {_f((4, 5))}) -> {_f((4, 8))}
    %1 = "semantic.reduce_sum"(%0) {{axes = array<i64: 1>, keepdims = true}} : ({_f((4, 8))}) -> {_f((4, 1))}
    %2 = "semantic.slice"(%a2) {{starts = array<i64: 2, 0>, sizes = array<i64: 4, 4>, steps = array<i64: 1, 1>}} : ({_f((6, 4))}) -> {_f((4, 4))}
    %3 = "semantic.matmul"(%2, %2) : ({_f((4, 4))}, {_f((4, 4))}) -> {_f((4, 4))}
    "func.return"(%1, %3) : ({_f((4, 1))}, {_f((4, 4))}) -> ()''')
    got = run_host(sm, [a, b, w])
    np.testing.assert_allclose(got[0], np.concatenate([a, b], 1).sum(1, keepdims=True),
                               rtol=1e-6)
    np.testing.assert_allclose(got[1], w[2:] @ w[2:], rtol=1e-6)
    cuda_compiles(sm)


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect", "wrap"])
def test_pad_modes_match_numpy(mode):
    x = RNG.random((3, 4)).astype(np.float32)
    sm = program([_f((3, 4)), _f(())], [_f((6, 5))], f'''\
    %0 = "semantic.pad"(%a0, %a1) {{low = array<i64: 1, 2>, high = array<i64: 2, -1>, mode = "{mode}"}} : ({_f((3, 4))}, {_f(())}) -> {_f((6, 5))}
    "func.return"(%0) : ({_f((6, 5))}) -> ()''')
    v = np.array(-7.5, np.float32)
    np_mode = {"wrap": "wrap", "edge": "edge", "reflect": "reflect", "constant": "constant"}[mode]
    kw = {"constant_values": v} if mode == "constant" else {}
    want = np.pad(x, ((1, 2), (2, 0)), mode=np_mode, **kw)[:, :5]
    check(sm, [x, v], [want])


def test_gather_with_negative_indices_and_gather_elements():
    data = RNG.random((5, 3)).astype(np.float32)
    idx = np.array([[0, -1], [4, 2]], np.int64)
    ge = np.array([[1, -1, 0], [0, 2, 2]], np.int32)
    sm = program([_f((5, 3)), _f((2, 2), "i64"), _f((2, 3), "i32")],
                 [_f((2, 2, 3)), _f((2, 3)), _f((5, 2))], f'''\
    %0 = "semantic.gather"(%a0, %a1) {{axis = 0 : i64}} : ({_f((5, 3))}, {_f((2, 2), "i64")}) -> {_f((2, 2, 3))}
    %1 = "semantic.gather_elements"(%a0, %a2) {{axis = 1 : i64}} : ({_f((5, 3))}, {_f((2, 3), "i32")}) -> {_f((2, 3))}
    %2 = "semantic.slice"(%a1) {{starts = array<i64: 0, 0>, sizes = array<i64: 1, 2>, steps = array<i64: 1, 1>}} : ({_f((2, 2), "i64")}) -> {_f((1, 2), "i64")}
    %3 = "semantic.reshape"(%2) : ({_f((1, 2), "i64")}) -> {_f((2,), "i64")}
    %4 = "semantic.gather"(%a0, %3) {{axis = -1 : i64}} : ({_f((5, 3))}, {_f((2,), "i64")}) -> {_f((5, 2))}
    "func.return"(%0, %1, %4) : ({_f((2, 2, 3))}, {_f((2, 3))}, {_f((5, 2))}) -> ()''')
    check(sm, [data, idx, ge], [np.take(data, idx % 5, axis=0),
                                np.take_along_axis(data[:2], ge % 3, axis=1),
                                np.take(data, np.array([0, 2]), axis=1)])


def test_data_ops_verify_their_shapes():
    from accy.errors import AccyError

    with pytest.raises(AccyError, match="outside"):
        program([_f((4,))], [_f((3,))], f'''\
    %0 = "semantic.slice"(%a0) {{starts = array<i64: 2>, sizes = array<i64: 3>, steps = array<i64: 1>}} : ({_f((4,))}) -> {_f((3,))}
    "func.return"(%0) : ({_f((3,))}) -> ()''')
    with pytest.raises(AccyError, match="differ in dim 0"):
        program([_f((2, 3)), _f((3, 3))], [_f((2, 6))], f'''\
    %0 = "semantic.concat"(%a0, %a1) {{axis = 1 : i64}} : ({_f((2, 3))}, {_f((3, 3))}) -> {_f((2, 6))}
    "func.return"(%0) : ({_f((2, 6))}) -> ()''')


# ------------------------------------------------------------------- unsigned


@pytest.mark.parametrize("el,np_t", [("ui8", np.uint8), ("ui16", np.uint16),
                                     ("ui32", np.uint32), ("ui64", np.uint64)])
def test_unsigned_arithmetic_wraps_compares_and_casts_like_numpy(el, np_t):
    t, b1, f = f"tensor<4x8x{el}>", "tensor<4x8xi1>", "tensor<4x8xf32>"
    sm = program([t, t], [t, t, b1, f, t], f'''\
    %0 = "semantic.sub"(%a0, %a1) : ({t}, {t}) -> {t}
    %1 = "semantic.div"(%a0, %a1) : ({t}, {t}) -> {t}
    %2 = "semantic.cmp"(%0, %a0) {{predicate = "gt"}} : ({t}, {t}) -> {b1}
    %3 = "semantic.cast"(%0) : ({t}) -> {f}
    %k = "semantic.constant"() {{value = dense<255> : tensor<{el}>}} : () -> tensor<{el}>
    %4 = "semantic.mul"(%0, %k) : ({t}, tensor<{el}>) -> {t}
    %5 = "semantic.max"(%4, %a1) : ({t}, {t}) -> {t}
    "func.return"(%0, %1, %2, %3, %5) : ({t}, {t}, {b1}, {f}, {t}) -> ()''')
    info = np.iinfo(np_t)
    hi = min(int(info.max), 1 << 62)
    a = RNG.integers(0, hi, (4, 8), dtype=np.uint64).astype(np_t)
    b = RNG.integers(0, hi, (4, 8), dtype=np.uint64).astype(np_t)
    b[0, :3] = 0
    with np.errstate(all="ignore"):
        d = a - b
        q = np.where(b == 0, 0, a // np.where(b == 0, 1, b)).astype(np_t)
        m = (d * np_t(255)).astype(np_t)
    check(sm, [a, b], [d, q, d > a, d.astype(np.float32), np.maximum(m, b)])


def test_unsigned_types_print_parse_and_cross_the_wire():
    from accy.choir.printer import print_op
    from accy.choir.wire import decode, encode

    t = "tensor<2xui8>"
    sm = program([t], [t], f'''\
    %k = "semantic.constant"() {{value = dense<[255, 7]> : {t}}} : () -> {t}
    %0 = "semantic.add"(%a0, %k) : ({t}, {t}) -> {t}
    "func.return"(%0) : ({t}) -> ()''')
    text = print_op(sm.module)
    assert "dense<[255, 7]> : tensor<2xui8>" in text
    assert print_op(decode(encode(sm.module))) == text
    got = run_host(sm, [np.array([1, 250], np.uint8)])[0]
    np.testing.assert_array_equal(got, np.array([0, 1], np.uint8))
