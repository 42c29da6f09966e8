"""The ONNX path on a GPU: a deterministic sample of the node tests that pass on the
host, and the two small real models, compiled for CUDA and compared with the
shipped outputs and onnxruntime's CPU result."""

from __future__ import annotations

import collections

import numpy as np
import pytest

pytest.importorskip("onnx")

from onnx_suite import collect, import_case, run_case, sample  # noqa: E402

pytestmark = pytest.mark.gpu


def test_a_sample_of_the_passing_node_tests_passes_on_the_gpu() -> None:
    chosen = sample(200)
    assert len(chosen) >= 200
    outcomes = []
    for case in collect():
        if case.name in chosen:
            sm, o = import_case(case)
            assert sm is not None, o.reason
            outcomes.append(run_case(case, sm, o, target="cuda"))
    counts = collections.Counter(o.status for o in outcomes)
    print(f"\nONNX node tests on the GPU: passed {counts['passed']} of {len(outcomes)}")
    failed = [f"{o.name}: {o.reason}" for o in outcomes if o.status != "passed"]
    assert not failed, "\n".join(failed)


@pytest.mark.parametrize("model", ["mlp", "transformer_block"])
def test_real_models_match_onnxruntime_on_the_gpu(model: str) -> None:
    import test_onnx_models as tm

    rng = np.random.default_rng(1)
    if model == "mlp":
        m, x, tol = tm.mlp(), rng.standard_normal((16, 64)).astype(np.float32), 1e-6
    else:
        m = tm._transformer_block(seq=32, d=64, heads=4)
        x, tol = rng.standard_normal((32, 64)).astype(np.float32), 1e-5
    np.testing.assert_allclose(tm._compiled(m, x, target="cuda"), tm._ort(m, x),
                               rtol=1e-4, atol=tol)


def test_models_batch_and_run_on_the_gpu_against_onnxruntime(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import test_onnx_models as tm

    tm.batch_and_run(tmp_path, "cuda")
