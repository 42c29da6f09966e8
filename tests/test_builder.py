"""The Python builder: programs built in code verify, print, and run like text ones."""

from __future__ import annotations

import numpy as np
import pytest

from accy.builder import Program
from accy.choir.parser import parse_module
from accy.choir.printer import print_op
from accy.errors import VerifyError
from accy.executable.cache import FragmentCompilerCache
from accy.preparation.stages import PreparationRequest
from accy.reference import run_reference


def _mlp_block() -> Program:
    p = Program()
    x = p.arg("?x256xf32")
    w = p.arg("256x64xf32")
    b = p.arg("64xf32")
    h = p.gelu(p.add(p.matmul(x, w), b), approximate="tanh")
    p.ret(p.softmax(h), p.reduce_mean(h, [1], keepdims=True))
    return p


def test_types_are_inferred_as_ops_are_added() -> None:
    p = Program()
    x = p.arg("?x4096xf32")
    y = p.reduce_max(x, [1], keepdims=True)
    assert str(y.type) == "tensor<?x1xf32>"
    assert str(p.cmp(x, y, "gt").type) == "tensor<?x4096xi1>"


def test_built_program_prints_parses_and_fingerprints_like_text() -> None:
    sm = _mlp_block().build()
    text = sm.text()
    again = parse_module(text)
    assert print_op(again) == text
    from accy.choir.wire import fingerprint

    assert fingerprint(again) == sm.fingerprint()


def test_built_program_runs_on_host_like_the_reference() -> None:
    sm = _mlp_block().build()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 256)).astype(np.float32)
    w = (rng.standard_normal((256, 64)) / 16).astype(np.float32)
    b = rng.standard_normal(64).astype(np.float32)
    update = FragmentCompilerCache().refresh_from_semantic_module(
        sm, PreparationRequest(shapes={0: (5, 256)}))
    got = update.fragment(x, w, b)
    want = run_reference(sm.module, [x, w, b])
    for g, r in zip(got, want):
        np.testing.assert_allclose(g, r, rtol=2e-5, atol=2e-5)


def test_errors_surface_while_building() -> None:
    p = Program()
    a = p.arg("4x3xf32")
    b = p.arg("5xf32")
    with pytest.raises(VerifyError, match="do not broadcast"):
        p.add(a, b)
    with pytest.raises(VerifyError, match="out of range"):
        p.softmax(a, axis=2)
    with pytest.raises(VerifyError, match="no results"):
        Program().build()


def test_constants_casts_and_layout_ops() -> None:
    p = Program()
    x = p.arg("2x3xf32")
    c = p.constant([[1.0, 2.0, 3.0]])
    y = p.cast(p.mul(x, c), "f16")
    z = p.transpose(p.reshape(p.cast(y, "f32"), (3, 2)), (1, 0))
    p.ret(z, p.broadcast_to(c, (4, 3)))
    sm = p.build()
    x0 = np.arange(6, dtype=np.float32).reshape(2, 3)
    z0, c0 = run_reference(sm.module, [x0])
    expect = (x0 * np.array([1, 2, 3], np.float32)).astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(z0, expect.reshape(3, 2).T)
    assert c0.shape == (4, 3)
