"""The fused attention kernel (``flash``) on a GPU against the reference interpreter.

Ragged shapes: 1, 17, 129 and 4097 keys, query rows off the 64-row tile, head dims
that are not a multiple of 4 (scalar loads), K given transposed or not, every tile
variant. Tolerance: max |out − ref| / max |ref| ≤ ``TOLERANCE`` = 1e-4 (f32: the
scores and the weighted sums are float sums in another order than the reference's
float64, and each key tile rescales the running sums by ``exp(m_old − m_new)``);
fused and unfused accy agree to the same bound.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "preparation"))
from stage_programs import attention, graph  # noqa: E402

from accy.executable.cache import FragmentCompilerCache  # noqa: E402
from accy.preparation.options import RunOptions  # noqa: E402
from accy.preparation.stages import PreparationRequest  # noqa: E402
from accy.reference import run_reference  # noqa: E402

TOLERANCE = 1e-4

pytestmark = pytest.mark.gpu


def run(sm, opts=(), shapes=None, seed: int = 0):  # type: ignore[no-untyped-def]
    """(accy's output on the GPU, the reference's, the launches' kernel names)."""
    rng = np.random.default_rng(seed)
    ins = sm.entry().function_type.inputs
    dims = [shapes[i] if shapes else tuple(t.shape) for i, t in enumerate(ins)]
    xs = [rng.standard_normal(s).astype(np.float32) for s in dims]
    update = FragmentCompilerCache().refresh_from_semantic_module(
        sm, PreparationRequest(options=RunOptions.parse("cuda", list(opts)),
                               shapes=dict(enumerate(dims)) if shapes else {}))
    got = np.asarray(update.fragment(*xs)[0])
    names = [launch.kernel for launch in update.fragment.plan.launches]
    return got, run_reference(sm.module, xs)[0], names


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    assert got.shape == want.shape
    assert not np.isnan(got).any()
    return float(np.max(np.abs(got.astype(np.float64) - want)) / np.max(np.abs(want)))


@pytest.mark.parametrize("keys", [1, 17, 129, 4097])
@pytest.mark.parametrize("rows", [1, 17, 130])
def test_ragged_keys_and_rows(keys: int, rows: int) -> None:
    got, want, names = run(attention((2,), rows, keys, 64, 64))
    assert names == ["k0_attention"]
    assert rel_err(got, want) <= TOLERANCE


@pytest.mark.parametrize("case", [((1,), 17, 129, 3, 3, {}), ((3,), 64, 65, 5, 7, {}),
                                  ((2,), 33, 70, 16, 8, {"k_rows": False, "scale": "div"}),
                                  ((), 100, 257, 32, 32, {"scale": "none"}),
                                  ((2, 3), 70, 129, 128, 128, {}),
                                  ((1,), 9, 40, 256, 256, {})], ids=str)
def test_head_dims_and_forms(case) -> None:  # type: ignore[no-untyped-def]
    batch, m, n, d, dv, form = case
    got, want, names = run(attention(batch, m, n, d, dv, **form))
    assert names == ["k0_attention"]
    assert rel_err(got, want) <= TOLERANCE


@pytest.mark.parametrize("opts", [["kernel.attention_tile_m=128"], ["kernel.attention_tile_m=32"],
                                  ["kernel.attention_tile_n=32"], ["kernel.attention_tile_n=128"],
                                  ["kernel.attention_threads=128"],
                                  ["kernel.attention_threads=64", "kernel.attention_tile_m=32"],
                                  ["kernel.attention_prefetch=false"],
                                  ["target.fast_math=true"]], ids=",".join)
def test_tile_variants(opts) -> None:  # type: ignore[no-untyped-def]
    got, want, _ = run(attention((4,), 130, 129, 64, 64), opts)
    assert rel_err(got, want) <= TOLERANCE


def test_the_graph_fused_and_unfused_agree() -> None:
    shapes = {i: (8, 128, 64) for i in range(3)}
    fused, want, names = run(graph("attention"), (), shapes)
    unfused, _, names_off = run(graph("attention"), ["dispatch.fuse_attention=false"], shapes)
    assert names == ["k0_attention"] and len(names_off) == 3
    assert rel_err(fused, want) <= TOLERANCE and rel_err(unfused, want) <= TOLERANCE
    assert rel_err(fused, unfused.astype(np.float64)) <= TOLERANCE
