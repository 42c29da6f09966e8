"""The CUDA renderer's kernels for the kernel stage's newer plans: half-precision
vectors, and every such kernel compiled to a cubin by NVRTC (no GPU needed).

What the kernels compute is checked on a GPU (``tests/executable/test_kernels_gpu.py``);
here: the spelling the plan asks for, and that NVRTC accepts it for ``sm_90``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "preparation"))
from stage_programs import graph  # noqa: E402

from accy.executable.device import compile_cuda  # noqa: E402
from accy.pipeline import prepare_through  # noqa: E402
from accy.preparation.options import RunOptions  # noqa: E402

CUDA = "cuda:sm_90"


def source(sm, shapes, opts=()) -> str:  # type: ignore[no-untyped-def]
    job = prepare_through(sm, "target", RunOptions.parse(CUDA, list(opts)), shapes).product
    return job.module.attributes["target.source"].value


def cubin(text: str) -> bytes:
    binary = compile_cuda(text, "sm_90")
    assert binary[:4] == b"\x7fELF"
    return binary


# ------------------------------------------------------------------ half vectors


@pytest.mark.parametrize("element,pack", [("bf16", "accy_pack_bf2"), ("f16", "accy_pack_h2")])
def test_half_elementwise_moves_sixteen_bytes_an_access(element: str, pack: str) -> None:
    text = source(graph("bias_gelu", element), {0: (8, 4096)})
    assert "reinterpret_cast<const uint4*>(in0" in text
    assert f"*reinterpret_cast<uint4*>(out0 + i) = make_uint4({pack}(" in text
    assert f"unsigned int {pack}(float lo, float hi)" in text  # the helper it calls
    cubin(text)


def test_bf16_rounds_in_one_instruction() -> None:
    text = source(graph("gelu_tanh", "bf16"), {0: (4, 4096)})
    assert 'cvt.rn.bf16.f32' in text and "0x7fffu" not in text
    cubin(text)


def test_f32_programs_carry_no_half_helpers() -> None:
    text = source(graph("bias_gelu"), {0: (8, 4096)})
    assert "accy_pack_" not in text and "make_float4(" in text


@pytest.mark.parametrize("element", ["bf16", "f16"])
@pytest.mark.parametrize("name,shape", [("softmax", (8, 4096)), ("layernorm", (8, 4096)),
                                        ("rmsnorm", (3, 4096)), ("softmax", (5, 1024))])
def test_half_rows_cache_floats_and_store_packed(element: str, name: str, shape) -> None:  # type: ignore[no-untyped-def]
    text = source(graph(name, element), {0: shape})
    assert "reg0[j][0] = w" in text  # the row held as floats, unpacked once
    assert "*reinterpret_cast<uint" in text
    cubin(text)


@pytest.mark.parametrize("element", ["bf16", "f16"])
@pytest.mark.parametrize("name", ["all_ops", "bias_gelu", "dynamic", "elementwise_chain",
                                  "gelu_tanh", "layernorm", "reductions", "residual_norm",
                                  "rmsnorm", "softmax", "softmax_axis0", "mlp", "attention"])
def test_every_graph_in_half_precision_compiles(element: str, name: str) -> None:
    sm = graph(name, element)
    shapes = {i: tuple(17 if d is None else d for d in t.shape)
              for i, t in enumerate(sm.entry().function_type.inputs)}
    cubin(source(sm, shapes))
