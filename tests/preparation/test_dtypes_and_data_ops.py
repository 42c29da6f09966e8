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
    src = job.module.attributes["target.source"].value
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
