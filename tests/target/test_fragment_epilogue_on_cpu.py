"""The tensor-core matmuls' epilogue (``mma.sync`` and ``wgmma``: accumulators in the
m16n8 C-fragment layout) run on the CPU (:mod:`cuda_on_cpu`).

Their main loops (``ldmatrix``, ``mma.sync``, TMA, ``wgmma``) cannot run here, so the
test keeps the emitted kernel's prologue and epilogue and puts in place of the main
loop accumulators filled from a matrix, each where the fragment layout says it is
(PTX ISA, "Matrix Fragments for mma.m16n8k16": accumulator ``h`` of lane ``l`` is row
``l / 4`` (+8 for ``h`` ≥ 2), column ``2·(l % 4)`` (+1 for odd ``h``) of its 16×8
tile). The epilogue must then write every output element where it belongs, as the
reference computes it — the pairs of columns packed in one word, low half first.
The packing helpers are modelled on the host by the host target's conversions
(round to nearest even, as ``cvt.rn.bf16x2.f32`` and ``cvt.rn.f16x2.f32`` round each
half).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "preparation"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import cuda_on_cpu  # noqa: E402
from cuda_on_cpu import HOPPER, MMA_SYNC  # noqa: E402
from stage_programs import graph, matmul  # noqa: E402

from accy.dialects.kernel import KernelFuncOp  # noqa: E402
from accy.reference import run_reference  # noqa: E402

needs_cxx = pytest.mark.skipif(not cuda_on_cpu.available(), reason="needs g++ (C++20)")


HALF = {"bf16": None, "f16": np.float16}


def to_bits(x: np.ndarray, element: str) -> np.ndarray:
    """``x`` (exact in ``element``) as its 16-bit patterns."""
    if element == "f16":
        return x.astype(np.float16).view(np.uint16)
    return (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def from_bits(bits: np.ndarray, element: str) -> np.ndarray:
    if element == "f16":
        return bits.view(np.float16).astype(np.float32)
    return (bits.astype(np.uint32) << 16).view(np.float32)


def epilogue_kernel(text: str, k: KernelFuncOp) -> tuple[str, str]:
    """Kernel ``k`` of ``text`` with its main loop replaced by accumulators read from an
    extra parameter ``accsrc`` (the matmul's f32 values, row-major), its parameters all
    ``float*`` (cast back inside); and the macro ``ACC`` (tile, tile, h) it reads them
    with."""
    body = cuda_on_cpu.kernel_text(text, k.sym_name)
    head, rest = body.split("\n", 1)
    start = head.index(f" {k.sym_name}(") + len(k.sym_name) + 2
    decls = [d for d in head[start:head.rindex(")")].split(", ")
             if "accy_tmap" not in d]
    casts = []
    for i, d in enumerate(decls):
        ctype, name = d.rsplit(" ", 1)
        ctype = ctype.replace(" __restrict__", "")
        casts.append(f"  {ctype} {name} = reinterpret_cast<{ctype}>(p{i});")
    params = ", ".join(f"float* p{i}" for i in range(len(decls) + 1))
    plan = k.plan
    acc_lines: list[str]
    if plan.mapping == "mma-tiled":
        (wtm, wtn), (mt, nt) = plan.warp_tile, (plan.warp_tile[0] // 16, plan.warp_tile[1] // 8)
        prologue = rest[:rest.index("  const unsigned short* Ag")]
        epilogue = rest[rest.index('cp.async.wait_group 0;" ::);') + 29:]
        row, col = f"wm * {wtm} + (I) * 16", f"wn * {wtn} + (J) * 8"
        acc_lines = [f"  float acc[{mt}][{nt}][4];",
                     f"  for (int i = 0; i < {mt}; ++i) for (int j = 0; j < {nt}; ++j)",
                     "    for (int h = 0; h < 4; ++h) acc[i][j][h] = ACC(i, j, h);"]
    else:
        per, tn = plan.warps[1], plan.tile[1]
        prologue = "\n".join(line for line in rest[:rest.index("  const int kts")].splitlines()
                             if "smem_raw" not in line and "bars" not in line
                             and "accy_d" not in line) + "\n"
        # the epilogue starts after the last wait, without the moves of the accumulator
        # registers to its array (the shim fills the array); its stores straight from the
        # registers read the array instead (stores_as_c); a staged one's barriers are the
        # consumers' (named: the prelude's) and its tile the shim's shared memory, from
        # shared address 0
        start = rest.rindex('asm volatile("wgmma.wait_group.sync.aligned 0;"')
        epilogue = "".join(
            line for line in rest[rest.index("\n", start) + 1:].splitlines(keepends=True)
            if 'asm volatile("mov.b32 %' not in line and "float d[" not in line)
        epilogue = stores_as_c(epilogue, plan.mma.rsplit(".", 1)[-1])
        epilogue = re.sub(r'asm volatile\("bar\.sync 1, \d+;" ::: "memory"\);',
                          "accy_named_sync(1);", epilogue)
        epilogue = epilogue.replace(
            'asm volatile("bar.sync %0, 128;" :: "r"(2 + cw) : "memory");',
            "accy_named_sync(2 + cw);")
        epilogue = re.sub(r"float\* const tile = .*;", "float* const tile = accy_smem;",
                          epilogue)
        row, col = f"(cw * {per} + (I)) * 64 + wq * 16", "(J) * 8"
        acc_lines = ["  if (wg == 0) return;",
                     "  {",
                     "    const unsigned base = 0;",
                     "    const int cw = wg - 1;",
                     f"    float d[{per}][{tn // 2}];",
                     f"    for (int mt = 0; mt < {per}; ++mt) for (int j = 0; j < {tn // 8}; ++j)",
                     "      for (int h = 0; h < 4; ++h) d[mt][4 * j + h] = ACC(mt, j, h);"]
    m, n = plan.grid[1] * plan.tile[0], plan.grid[0] * plan.tile[1]
    consumers = plan.warps[0] if plan.mapping == "wgmma-tiled" else 0
    named = "".join(f"static std::barrier<> accy_named_{i}({consumers * 128 if i == 1 else 128});\n"
                    for i in range(1, consumers + 2))
    named += ("static void accy_named_sync(int id) {\n  std::barrier<>* bars[] = {"
              + ", ".join(["nullptr"] + [f"&accy_named_{i}" for i in range(1, consumers + 2)])
              + "};\n  bars[id]->arrive_and_wait();\n}\n") if consumers else ""
    acc = named + (f"#define ACC(I, J, H) accsrc[(bz * {m} + m0 + {row} + (lane >> 2) + ((H) >> 1) * 8)"
           f" * {n} + n0 + {col} + (lane & 3) * 2 + ((H) & 1)]")
    text = "\n".join([f'extern "C" __global__ void epi({params}) {{', *casts,
                      f"  const float* accsrc = p{len(decls)};", prologue.rstrip("\n"),
                      *acc_lines, epilogue.rstrip("\n"), ""])
    return text, acc + "\n"


STORES = re.compile(r'asm volatile\("\{\\n\.reg \.b32 w;\\n(.*?)\}\\n" :: "[rl]"\((.*?)\) '
                    r': "memory"\);')
PAIR = re.compile(r"cvt\.rn\.\w+x2\.f32 w, accy_d(\d+)_(\d+), accy_d\d+_(\d+);\\n"
                  r"st\.global\.b32 \[%0\+(\d+)\], w;\\n"
                  r"|st\.shared\.v2\.f32 \[%0\+(\d+)\], \{accy_d(\d+)_(\d+), accy_d\d+_(\d+)\};\\n")


def stores_as_c(text: str, element: str) -> str:
    """``text`` with each statement that stores accumulators straight from their
    registers (``accy.target.cuda._wgmma_stores``) spelled in C over the array ``d`` —
    a global pair rounded and packed as ``cvt.rn.<el>x2.f32`` does (high lane first),
    a shared pair of floats at its shared address in the shim's shared memory."""
    pack = cuda_on_cpu.CONVERT[element][1]

    def spelled(statement: re.Match[str]) -> str:
        body, pointer = statement.groups()
        out = []
        for p in PAIR.finditer(body):
            if p.group(1) is not None:
                mt, hi, lo, off = p.group(1, 2, 3, 4)
                out.append(f"*reinterpret_cast<unsigned int*>(reinterpret_cast<char*>"
                           f"({pointer}) + {off}) = {pack}(d[{mt}][{lo}], d[{mt}][{hi}]);")
            else:
                off, mt, lo, hi = p.group(5, 6, 7, 8)
                out.append(f"*reinterpret_cast<float2*>(reinterpret_cast<char*>(accy_smem) "
                           f"+ ({pointer}) + {off}) = make_float2(d[{mt}][{lo}], d[{mt}][{hi}]);")
        assert len(out) == body.count("st."), body  # every store of the statement spelled
        return " ".join(out)

    return STORES.sub(spelled, text)


def run_epilogue(sm, target: str, opts: tuple[str, ...], element: str) \
        -> tuple[list[np.ndarray], list[np.ndarray]]:  # type: ignore[no-untyped-def]
    """The epilogue of the program's matmul kernels on the CPU, each from the f32 matmul
    of its (exact) inputs, against the reference; the outputs and the reference's."""
    job = cuda_on_cpu.target_job(sm, {}, opts, target)
    text = job.source
    ks = [op for op in job.module.body.ops if isinstance(op, KernelFuncOp)]
    rng = np.random.default_rng(0)
    ins = [rng.integers(-2, 3, tuple(t.shape)).astype(np.float32)
           for t in sm.entry().function_type.inputs]
    want = run_reference(sm.module, [x.astype(HALF[element] or np.float32) for x in ins])
    (k,) = ks
    assert k.plan.mapping in ("mma-tiled", "wgmma-tiled")
    kernel, acc_macro = epilogue_kernel(text, k)
    a, b = ins[0], ins[1]
    accsrc = (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32)
    bufs = [to_bits(x, element) for x in ins]
    outs = [np.zeros(tuple(t.shape), np.uint16) for t in sm.entry().function_type.results]
    cuda_on_cpu.run(kernel, "epi", tuple(k.plan.grid), k.plan.block[0],
                    bufs + outs + [np.ascontiguousarray(accsrc)], prelude=acc_macro)
    return [from_bits(o, element) for o in outs], [np.asarray(w, np.float32) for w in want]


CASES = [("mma", "cuda:sm_90", MMA_SYNC), ("wgmma", HOPPER, ())]


@needs_cxx
@pytest.mark.parametrize("element", ["bf16", "f16"])
@pytest.mark.parametrize("epilogue", [False, True], ids=["plain", "bias-relu"])
@pytest.mark.parametrize("kind,target,opts", CASES, ids=[c[0] for c in CASES])
def test_the_fragment_epilogue_writes_every_element_as_the_reference(
        kind: str, target: str, opts: tuple[str, ...], epilogue: bool, element: str) -> None:
    """Small integers: every value (the matmul's, the bias's, their sum) is exact in
    the element type, so the outputs equal the reference's bit for bit."""
    got, want = run_epilogue(matmul(128, 256, 64, element, (), epilogue), target, opts,
                             element)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


@needs_cxx
@pytest.mark.parametrize("epilogue", [False, True], ids=["plain", "bias-relu"])
@pytest.mark.parametrize("kind,target,opts", CASES, ids=[c[0] for c in CASES])
def test_a_batched_fragment_epilogue_finds_each_batch(
        kind: str, target: str, opts: tuple[str, ...], epilogue: bool) -> None:
    got, want = run_epilogue(matmul(128, 256, 64, "bf16", (2,), epilogue), target, opts,
                             "bf16")
    np.testing.assert_array_equal(got[0], want[0])


@needs_cxx
@pytest.mark.parametrize("element", ["bf16", "f16"])
@pytest.mark.parametrize("batch", [(), (2,)], ids=["one", "batched"])
def test_a_heavy_warpgroup_epilogue_runs_staged_as_the_reference(
        element: str, batch: tuple[int, ...]) -> None:
    """A sigmoid in the epilogue: the accumulators go through shared memory to one
    loop of four columns an iteration (below: the tile's 128 rows by 256 columns
    of two consumers). Each output is the reference's value or one of its neighbours in
    the element type (the shim's ``exp2f`` is the host's)."""
    sm = matmul(128, 256, 64, element, batch, True, op="sigmoid")
    text = cuda_on_cpu.job_source(cuda_on_cpu.target_job(sm, {}, (), HOPPER))
    assert "bar.sync 1, 256;" in text and "#pragma unroll 2" in text
    body = text[text.index("__global__"):]
    # the loop's four lanes, not one a fragment pair (a sigmoid of the half type: its
    # half-precision helper, accy.target.cuda.sigmoid_half_helper)
    assert body.count("accy_sigmoid_half(") == 4
    got, want = run_epilogue(sm, HOPPER, (), element)
    ulp = 2.0 ** -7 if element == "bf16" else 2.0 ** -10
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=ulp, atol=0)


def test_the_mlp_block_in_bf16_packs_its_epilogue_pairs() -> None:
    """Both matmuls of the bf16 MLP block: gelu's and the bias's results rounded per
    element, then packed — the gelu kernel's staged loop stores four columns as two
    words, the bias kernel a fragment's pair of columns as one."""
    job = cuda_on_cpu.target_job(graph("mlp", "bf16"), {0: (4096, 256)}, (), HOPPER)
    text = job.source
    assert text.count("= make_uint2(accy_pack_bf2(") == 1
    assert text.count("= accy_pack_bf2(") == 1
    assert "accy_f2bf(accv" not in text


@needs_cxx
@pytest.mark.parametrize("epilogue", [False, True], ids=["plain", "bias-relu"])
def test_a_warpgroup_tile_of_two_slices_writes_both(epilogue: bool) -> None:
    """256 rows a block: each consumer warpgroup holds two 64-row slices (two sets of
    accumulator registers), each stored at its own rows."""
    sm = matmul(256, 256, 64, "f16", (), epilogue)
    job = cuda_on_cpu.target_job(sm, {}, ("kernel.wgmma_tile_m=256",), HOPPER)
    assert job.source.count(".reg .f32 accy_d1_<") == 1
    got, want = run_epilogue(sm, HOPPER, ("kernel.wgmma_tile_m=256",), "f16")
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
