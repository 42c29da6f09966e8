"""Row kernels (reductions, softmax over any axis): how often each reads its input
from global memory, NVRTC compiling them for sm_90 (no GPU needed), and every kernel
of the program run on the CPU (:mod:`cuda_on_cpu`) against the reference.

On a GPU, ``tests/executable/test_kernels_gpu.py`` runs them for real.
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
from stage_programs import graph, with_element  # noqa: E402

from accy.dialects.kernel import KernelFuncOp  # noqa: E402
from accy.dialects.memory import BufferSpec  # noqa: E402
from accy.executable.device import compile_cuda  # noqa: E402
from accy.pipeline import prepare_through  # noqa: E402
from accy.preparation.options import RunOptions  # noqa: E402
from accy.preparation.passes.kernel import column_split  # noqa: E402
from accy.preparation.products import SemanticModule  # noqa: E402

CUDA = "cuda:sm_90"
needs_cxx = pytest.mark.skipif(not cuda_on_cpu.available(), reason="needs g++ (C++20)")


def kernel_bodies(job) -> dict[str, str]:  # type: ignore[no-untyped-def]
    text = cuda_on_cpu.job_source(job)
    return {k.sym_name: cuda_on_cpu.kernel_text(text, k.sym_name)
            for k in job.module.body.ops if isinstance(k, KernelFuncOp)}


def global_reads(body: str, param: str = "in0") -> int:
    """Loads from ``param`` in a kernel's text (each inside an unrolled column loop
    is one read of the row)."""
    return len(re.findall(rf"\b{param}\[|\b{param} \+", body))


# ------------------------------------------------------ softmax over axis 0


@pytest.mark.parametrize("cols", [16384, 16384 + 77])
def test_a_column_softmax_reads_each_column_once(cols: int) -> None:
    """64 × many: a thread per column holds its 64 values in registers after one
    read (through the transpose), so the max, the sum and the output read them there."""
    sm = graph("softmax_axis0")
    job = cuda_on_cpu.target_job(sm, {0: (64, cols)})
    (k,) = [op for op in job.module.body.ops if isinstance(op, KernelFuncOp)]
    assert k.plan.mapping == "thread-per-row" and k.plan.cached_inputs == (0,)
    (body,) = kernel_bodies(job).values()
    assert global_reads(body) == 1
    assert compile_cuda(cuda_on_cpu.job_source(job), "sm_90")[:4] == b"\x7fELF"


@needs_cxx
def test_a_column_softmax_matches_the_reference_on_the_cpu() -> None:
    sm = graph("softmax_axis0")
    x = np.random.default_rng(0).standard_normal((64, 16384 + 77)).astype(np.float32) * 4
    assert cuda_on_cpu.job_error(cuda_on_cpu.target_job(sm, {0: x.shape}), sm, [x]) <= 1e-5


@needs_cxx
@pytest.mark.parametrize("split", [0, 1, 2, 4, 8])
@pytest.mark.parametrize("element,rows", [("f32", 64), ("f32", 67), ("bf16", 67)])
def test_a_column_softmax_split_over_threads_matches_the_reference_on_the_cpu(
        split: int, element: str, rows: int) -> None:
    """``column_split`` threads share a column (every split-th value each; 0 picks: 4 for
    64 values, 8 for 67), their max and sum combined through shared memory; the grid's last
    block is ragged (16461 columns) and 67 values leave a split's last step short."""
    text = (Path(__file__).resolve().parents[2] / "graphs" / "softmax_axis0.mlir").read_text()
    sm = SemanticModule.from_text(with_element(text.replace("64x", f"{rows}x"), element))
    x = np.random.default_rng(3).standard_normal((rows, 16384 + 77)).astype(np.float32) * 4
    job = cuda_on_cpu.target_job(sm, {0: x.shape}, [f"kernel.column_split={split}"])
    (k,) = [op for op in job.module.body.ops if isinstance(op, KernelFuncOp)]
    threads = split or column_split(rows, 256)
    assert k.plan.mapping == "thread-per-row" and k.plan.block == (256, 1, 1)
    assert k.plan.rows_per_block == 256 // threads and k.plan.items == -(-rows // threads)
    assert k.plan.cached_inputs == ((0,) if k.plan.items <= 64 else ())  # 67 alone: read again
    (body,) = kernel_bodies(job).values()
    assert ("__syncthreads();" in body) == (threads > 1)
    assert cuda_on_cpu.job_error(job, sm, [x]) <= (1e-5 if element == "f32" else TOLERANCE[element])


@needs_cxx
@pytest.mark.parametrize("streams", [1, 3, 8, 1024])
@pytest.mark.parametrize("element", ["f32", "bf16"])
def test_a_column_softmax_in_streams_matches_the_reference_on_the_cpu(
        streams: int, element: str) -> None:
    """``kernel.column_streams``: the blocks dealt into runs of tiles (259 blocks: runs
    of unequal length; 1024 runs: a tile each, most of them none) still cover every
    column once."""
    sm = column_softmax(64, element)
    x = np.random.default_rng(5).standard_normal((64, 16525)).astype(np.float32) * 4
    job = cuda_on_cpu.target_job(sm, {0: x.shape}, [f"kernel.column_streams={streams}"])
    (k,) = [op for op in job.module.body.ops if isinstance(op, KernelFuncOp)]
    assert k.plan.streams == streams and k.plan.grid[0] == 259  # odd: a column a thread
    (body,) = kernel_bodies(job).values()
    assert ("accy_tile" in body) == (streams > 1)
    assert cuda_on_cpu.job_error(job, sm, [x]) <= TOLERANCE[element]


@needs_cxx
@pytest.mark.parametrize("split", [1, 4])
def test_a_column_max_split_over_threads_writes_each_column_once(split: int) -> None:
    """The reductions program at 100 × 16389: its kept column max is a thread-per-row
    kernel whose per-row result the first of a row's threads stores."""
    sm = reductions(100, 16389)
    x = np.random.default_rng(4).standard_normal((100, 16389)).astype(np.float32)
    job = cuda_on_cpu.target_job(sm, opts=[f"kernel.column_split={split}"])
    split_kernels = [k for k in job.module.body.ops if isinstance(k, KernelFuncOp)
                     and k.plan.mapping == "thread-per-row"]
    assert split_kernels and all(k.plan.rows_per_block == 256 // split for k in split_kernels)
    assert cuda_on_cpu.job_error(job, sm, [x]) <= TOLERANCE["f32"]


def column_softmax(rows: int, element: str = "f32") -> SemanticModule:
    """graphs/softmax_axis0.mlir over ``rows`` values a column, in ``element``."""
    text = (Path(__file__).resolve().parents[2] / "graphs" / "softmax_axis0.mlir").read_text()
    return SemanticModule.from_text(with_element(text.replace("64x", f"{rows}x"), element))


@needs_cxx
@pytest.mark.parametrize("vec,split", [(2, 0), (4, 0), (8, 0), (4, 1), (8, 8), (2, 2)])
@pytest.mark.parametrize("element,rows", [("f32", 64), ("bf16", 67), ("f16", 64)])
def test_a_column_softmax_of_several_columns_a_thread_matches_the_reference_on_the_cpu(
        vec: int, split: int, element: str, rows: int) -> None:
    """``column_vector``: a thread owns ``vec`` neighbouring columns (at most 16 bytes: 4
    floats, 8 halves), reads each of their rows as one vector and writes them as one; the
    grid's last block is ragged (16456 columns: 2057 vectors of 8, blocks of 32 to 256
    threads' columns); 67 values a column over 8 threads take 9 × 8 halves, more than
    a thread's 64: 4 columns a thread."""
    sm = column_softmax(rows, element)
    x = (np.random.default_rng(6).standard_normal((rows, 16456)) * 4).astype(
        np.float16 if element == "f16" else np.float32)
    job = cuda_on_cpu.target_job(sm, {0: x.shape}, [f"kernel.column_vector={vec}",
                                                    f"kernel.column_split={split}"])
    (k,) = [op for op in job.module.body.ops if isinstance(op, KernelFuncOp)]
    want = min(vec, 4 if element == "f32" else 8)
    while -(-rows // 8) * want > 64:  # a thread's values (over 8 threads a column) fit
        want //= 2
    assert k.plan.mapping == "thread-per-row" and k.plan.vector_width == want
    assert k.plan.grid[0] == -(-16456 // (k.plan.rows_per_block * want))
    if not split:  # picked: the column's values of the thread's columns fit its registers
        assert k.plan.items * want <= 64 and k.plan.cached_inputs == (0,)
    (body,) = kernel_bodies(job).values()
    if k.plan.cached_inputs:
        assert global_reads(body) == 1
    vector = {"f32": f"float{want}", "bf16": {2: "unsigned int", 4: "uint2", 8: "uint4"}[want]}
    vector["f16"] = vector["bf16"]
    assert f"reinterpret_cast<{vector[element]}*>(out0" in body  # one store a step
    assert compile_cuda(cuda_on_cpu.job_source(job), "sm_90")[:4] == b"\x7fELF"
    assert cuda_on_cpu.job_error(job, sm, [x]) <= TOLERANCE[element]


@pytest.mark.parametrize("cols,vec,want", [(16389, 4, 1), (16390, 4, 2), (16392, 8, 4),
                                           (16392, 0, 2), (16389, 0, 1)])
def test_a_thread_owns_only_as_many_columns_as_divide_them(cols: int, vec: int,
                                                           want: int) -> None:
    """The columns' count must divide the vector (so no vector straddles a row's end);
    8 asks for more than an f32 thread takes (16 bytes: 4 floats); 0 picks 2."""
    job = cuda_on_cpu.target_job(graph("softmax_axis0"), {0: (64, cols)},
                                 [f"kernel.column_vector={vec}"])
    (k,) = [op for op in job.module.body.ops if isinstance(op, KernelFuncOp)]
    assert k.plan.vector_width == want


@pytest.mark.parametrize("element", ["f32", "bf16", "f16"])
def test_a_picked_column_vector_keeps_a_thread_to_32_values(element: str) -> None:
    """``column_vector`` 0 (the default): the column softmax (64 values a column, 4
    threads a column) takes two columns a thread, 32 values; the reductions program's
    column max over 8192 rows is two kernels: the first (rows of 256 over 8 threads)
    would walk 64 values with two columns, so takes one, unless asked; the second
    (the 32 partial maxima of a column) takes two."""
    job = cuda_on_cpu.target_job(column_softmax(64, element), {0: (64, 16384)})
    (k,) = [op for op in job.module.body.ops if isinstance(op, KernelFuncOp)]
    assert k.plan.mapping == "thread-per-row" and k.plan.vector_width == 2
    assert k.plan.items * k.plan.vector_width == 32
    for vec, first in ((0, 1), (2, 2)):
        job = cuda_on_cpu.target_job(reductions(8192, 16384, element),
                                     opts=[f"kernel.column_vector={vec}"])
        plans = [k.plan for k in job.module.body.ops if isinstance(k, KernelFuncOp)
                 and k.plan.mapping == "thread-per-row"]
        assert [(p.cols, p.items, p.vector_width) for p in plans] == [(256, 32, first),
                                                                      (32, 16, 2)]


@needs_cxx
def test_a_batched_column_softmax_of_several_columns_a_thread_matches_the_reference() -> None:
    """softmax over the middle axis of 4 × 64 × 4100: rows (4, 4100) decomposed a lane
    each, 4100 columns take vectors of 4 (not 8)."""
    sm = SemanticModule.from_text('''"builtin.module"() ({
  "func.func"() <{function_type = (tensor<4x64x4100xf32>) -> tensor<4x64x4100xf32>, sym_name = "main"}> ({
  ^bb0(%x: tensor<4x64x4100xf32>):
    %0 = "semantic.softmax"(%x) {axis = 1 : i64} : (tensor<4x64x4100xf32>) -> tensor<4x64x4100xf32>
    "func.return"(%0) : (tensor<4x64x4100xf32>) -> ()
  }) : () -> ()
}) : () -> ()''')
    x = np.random.default_rng(7).standard_normal((4, 64, 4100)).astype(np.float32) * 4
    job = cuda_on_cpu.target_job(sm, {0: x.shape}, ["kernel.column_vector=8"])
    (k,) = [op for op in job.module.body.ops if isinstance(op, KernelFuncOp)]
    assert k.plan.mapping == "thread-per-row" and k.plan.vector_width == 4
    assert cuda_on_cpu.job_error(job, sm, [x]) <= TOLERANCE["f32"]


@needs_cxx
@pytest.mark.parametrize("element", ["f32", "bf16"])
def test_a_column_max_of_several_columns_a_thread_writes_each_once(element: str) -> None:
    """The reductions program at 100 × 16392, 8 columns a thread asked: 4 (a thread's
    13 values of 4 columns fit its 64; of 8, halves, they would not): the kept column
    max is stored a column at a time by the first of its threads."""
    sm = reductions(100, 16392, element)
    x = np.random.default_rng(8).standard_normal((100, 16392)).astype(np.float32)
    job = cuda_on_cpu.target_job(sm, opts=["kernel.column_vector=8"])
    vectored = [k for k in job.module.body.ops if isinstance(k, KernelFuncOp)
                and k.plan.mapping == "thread-per-row"]
    assert vectored and all(k.plan.vector_width == 4 for k in vectored)
    assert cuda_on_cpu.job_error(job, sm, [x]) <= TOLERANCE[element]


def i64_sum(shape: tuple[int, int], axis: int) -> SemanticModule:
    """``reduce_sum`` of an i64 ``shape`` over ``axis``."""
    out = shape[1 - axis]
    return SemanticModule.from_text(f'''"builtin.module"() ({{
  "func.func"() <{{function_type = (tensor<{shape[0]}x{shape[1]}xi64>) -> tensor<{out}xi64>, sym_name = "main"}}> ({{
  ^bb0(%x: tensor<{shape[0]}x{shape[1]}xi64>):
    %0 = "semantic.reduce_sum"(%x) {{axes = array<i64: {axis}>, keepdims = false}} : (tensor<{shape[0]}x{shape[1]}xi64>) -> tensor<{out}xi64>
    "func.return"(%0) : (tensor<{out}xi64>) -> ()
  }}) : () -> ()
}}) : () -> ()''')


@needs_cxx
@pytest.mark.parametrize("shape,axis,mapping,base", [
    ((4, 8192), 1, "block-per-row", 49),      # a warp's partial near 2^59
    ((64, 16389), 0, "thread-per-row", 52),   # four threads a column: partials near 2^56
])
def test_i64_row_sums_cross_shared_memory_exactly(shape: tuple[int, int], axis: int,
                                                  mapping: str, base: int) -> None:
    """A row kernel's partials cross shared memory as themselves, not through ``double``
    (53 bits): sums of values near 2^49 / 2^52 come out exact."""
    sm = i64_sum(shape, axis)
    x = np.random.default_rng(5).integers(0, 2 ** 20, shape, dtype=np.int64) + 2 ** base
    job = cuda_on_cpu.target_job(sm)
    (k,) = [op for op in job.module.body.ops if isinstance(op, KernelFuncOp)]
    assert k.plan.mapping == mapping
    assert compile_cuda(cuda_on_cpu.job_source(job), "sm_90")[:4] == b"\x7fELF"
    (got,) = cuda_on_cpu.run_job(job, [x])
    assert np.array_equal(got, x.sum(axis=axis))


# ---------------------------------------- half rows whose reductions chain


@needs_cxx
@pytest.mark.parametrize("name,element", [
    ("softmax", "bf16"), ("layernorm", "f16"), ("dynamic", "bf16"), ("softmax", "f16"),
])
def test_a_chained_half_row_on_128_threads_matches_the_reference_on_the_cpu(
        name: str, element: str) -> None:
    """32 values of the row a thread, four warps a block (the kernel stage's rule for
    halves whose reductions chain), against the reference in one half ulp's tolerance."""
    sm = graph(name, element)
    rng = np.random.default_rng(7)
    inputs = []
    for t in sm.entry().function_type.inputs:
        shape = tuple(3 if d is None else d for d in t.shape)
        shape = (3, 4096) if len(shape) == 2 else (4096,)
        x = rng.standard_normal(shape).astype(np.float32) * 2
        inputs.append(x.astype(np.float16) if element == "f16" else x)
    job = cuda_on_cpu.target_job(sm, {i: x.shape for i, x in enumerate(inputs)})
    (k,) = [op for op in job.module.body.ops if isinstance(op, KernelFuncOp)]
    assert k.plan.block == (128, 1, 1) and k.plan.cached_inputs == (0,)
    assert cuda_on_cpu.job_error(job, sm, inputs) <= TOLERANCE[element]


# ------------------------------------------- reductions over one or both axes


def reductions(rows: int, cols: int, element: str = "f32") -> SemanticModule:
    """graphs/reductions.mlir at rows × cols: sum over axis 1, max over axis 0 (kept),
    min over axis 1, mean over both (in ``element``, as the benchmark makes it)."""
    text = (Path(__file__).resolve().parents[2] / "graphs" / "reductions.mlir").read_text()
    text = text.replace("64x128", f"{rows}x{cols}").replace(
        "tensor<64xf32>", f"tensor<{rows}xf32>").replace("1x128xf32", f"1x{cols}xf32")
    return SemanticModule.from_text(with_element(text, element))


def buffer_root(job):  # type: ignore[no-untyped-def]
    """Buffer id → the buffer it is a view of (through every alias), in the job's plan."""
    specs = {s.id: s for s in (BufferSpec.from_attr(a)
                               for a in job.module.attributes["target.buffers"].values)}

    def root(i: int) -> BufferSpec:
        while specs[i].kind == "alias":
            i = specs[i].alias_of
        return specs[i]

    return root


def input_reads(job) -> int:  # type: ignore[no-untyped-def]
    """Launches that read argument 0 (through any view of it)."""
    root = buffer_root(job)
    return sum(any(root(i).kind == "arg" for i in dict(launch.entries)["buffers"].values)
               for launch in job.module.attributes["target.launches"].values)


def launches(job) -> list[str]:  # type: ignore[no-untyped-def]
    return [dict(launch.entries)["kernel"].value
            for launch in job.module.attributes["target.launches"].values]


def test_sibling_row_reductions_are_one_kernel() -> None:
    """The row sum and the row min of x read it in one launch with two outputs."""
    job = cuda_on_cpu.target_job(reductions(8192, 4096))
    bodies = kernel_bodies(job)
    two = [name for name, body in bodies.items() if "out1[row]" in body]
    assert len(two) >= 1
    assert global_reads(bodies[two[0]]) == 1
    assert input_reads(job) == 2  # was 4: sum, min, the column max and the mean
    assert compile_cuda(cuda_on_cpu.job_source(job), "sm_90")[:4] == b"\x7fELF"


def test_a_mean_over_both_axes_starts_from_the_row_sum() -> None:
    """successive-reductions: the mean's first level is the row sum already computed
    (one prim.reduce of x over its rows after CSE, not a flat reshape read again)."""
    from accy.pipeline import prepare_through as through

    tensor = through(reductions(8192, 4096), "tensor", RunOptions.parse(CUDA), {}).product
    text = tensor.text()
    assert text.count('"prim.reduce"(%arg0) {kind = "sum"}') == 1
    assert "tensor<4096x8192xf32>" not in text  # no flat view of x


@pytest.mark.parametrize("element", ["f32", "bf16", "f16"])
def test_the_reductions_write_their_results_in_four_launches(element: str) -> None:
    """At the benchmark's 8192 × 4096 on sm_90a: the row sum and min (and, in halves,
    the mean's f32 row sums) in one kernel, the column max in two (split), the mean's
    sum of the row sums with its scale (and cast) as the epilogue. No copy kernel: each
    result is a reduction's output, the plan's result buffer seen through a view."""
    job = prepare_through(reductions(8192, 4096, element), "target",
                          RunOptions.parse("cuda:sm_90a"), {}).product
    kernels = [k for k in job.module.body.ops if isinstance(k, KernelFuncOp)]
    assert len(launches(job)) == 4
    assert all(any(op.op_name == "prim.reduce" for op in k.body.ops) for k in kernels)
    assert input_reads(job) == 2  # the row kernel and the column max's first level
    root = buffer_root(job)
    written = [root(i).index for op in job.module.entry().body.ops if op.op_name ==
               "kernel.launch" for i in op.attr("memory.outputs").values
               if root(i).kind == "result"]
    assert sorted(written) == [0, 1, 2, 3]  # each result written once, by its reduction


TOLERANCE = {"f32": 1e-5, "bf16": 2.0 ** -7, "f16": 2.0 ** -10}
"""Max |Δ| / max(1, max |ref|): f32 rounding, or one ulp of the half result."""


@needs_cxx
@pytest.mark.parametrize("element,shape", [
    ("f32", (64, 128)), ("f32", (256, 1024)), ("f32", (1, 1)), ("f32", (17, 17)),
    ("f32", (1, 4097)), ("f32", (4097, 17)), ("bf16", (17, 4097)), ("bf16", (4097, 1)),
    ("bf16", (64, 128)), ("f16", (17, 17)), ("f16", (1, 4097)),
])
def test_reductions_match_the_reference_on_the_cpu(element: str, shape: tuple[int, int]) \
        -> None:
    """Every launch (the copies gone: the reductions write the results) on ragged shapes,
    in f32 and in halves (whose mean sums f32 row sums)."""
    sm = reductions(*shape, element)
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    if element == "f16":
        x = x.astype(np.float16)
    job = cuda_on_cpu.target_job(sm)
    assert not any(not any(op.op_name == "prim.reduce" for op in k.body.ops)
                   for k in job.module.body.ops if isinstance(k, KernelFuncOp))
    assert cuda_on_cpu.job_error(job, sm, [x]) <= TOLERANCE[element]


# ------------------------------------------------------ row counts as launch scalars


@needs_cxx
@pytest.mark.parametrize("name,cols,opts", [
    ("softmax", 1024, ()),  # a warp per row, checking the row count
    ("bias_gelu", 4096, ()),  # elementwise: the vector count
    ("gelu_tanh", 4096, ("kernel.vector_width=1",)),
    ("layernorm", 4096, ()),  # a block per row: nothing to pass
])
def test_one_source_serves_every_row_count(name: str, cols: int, opts: tuple[str, ...]) -> None:
    sm = graph(name)
    jobs = {rows: cuda_on_cpu.target_job(sm, {0: (rows, cols)}, opts) for rows in (8, 17, 33, 1)}
    assert len({cuda_on_cpu.job_source(jobs[rows]) for rows in (8, 17, 33)}) == 1  # a single row is special
    rng = np.random.default_rng(3)
    for rows, j in jobs.items():
        inputs = [rng.standard_normal(s.shape).astype(np.float32)
                  for s in (BufferSpec.from_attr(a) for a in
                            j.module.attributes["target.buffers"].values) if s.kind == "arg"]
        assert cuda_on_cpu.job_error(j, sm, inputs) < 1e-5, rows


# ------------------------------------------------------ half elementwise kernels


@needs_cxx
@pytest.mark.parametrize("element,rows,vec", [
    ("f32", 17, 4),
    ("f32", 5, 1),
    ("bf16", 9, 4),  # 8 halves a vector
    ("f16", 3, 4),
])
def test_elementwise_kernels_match_the_reference_on_the_cpu(element: str, rows: int,
                                                             vec: int) -> None:
    """bias_gelu's one kernel against the reference (blocks of 64 threads): in half
    precision ``x + b`` is rounded (a packed add, two lanes an instruction), the result
    only by its store (rounding it before too would be rounding twice to one type)."""
    sm = graph("bias_gelu", None if element == "f32" else element)
    job = cuda_on_cpu.target_job(sm, {0: (rows, 4096)}, (f"kernel.vector_width={vec}", "kernel.block_size=64"))
    [kernel] = [k for k in job.module.body.ops if isinstance(k, KernelFuncOp)]
    body = kernel_bodies(job)[kernel.sym_name]
    rounds = body.count("accy_bf2f(accy_f2bf(") + body.count("accy_h2f(accy_f2h(")
    assert rounds == 0  # x + b's is the packed add's, not a lane's; not the gelu's
    packed = body.count("accy_add_bf2(") + body.count("accy_add_h2(")
    assert packed == (0 if element == "f32" else 4)  # 8 halves a vector, 2 a word
    rng = np.random.default_rng(5)
    x = rng.standard_normal((rows, 4096)).astype(np.float32)
    b = rng.standard_normal(4096).astype(np.float32)
    if element == "f16":
        x, b = x.astype(np.float16), b.astype(np.float16)
    assert cuda_on_cpu.job_error(job, sm, [x, b]) < (1e-5 if element == "f32" else 1e-2)


# ------------------------------------------------------ the picked launch geometry


@needs_cxx
@pytest.mark.parametrize("name,element,shape,block", [
    ("softmax", "f32", (3, 20000), 1024),  # grown past 512: 5 vectors a thread, cached
    ("layernorm", "f32", (5, 4096), 512),  # 8 floats a thread
    ("softmax", "bf16", (3, 4097), 256),  # halves keep 256; unvectorized, ragged
])
def test_the_picked_row_blocks_match_the_reference_on_the_cpu(
        name: str, element: str, shape: tuple[int, int], block: int) -> None:
    rows, cols = shape
    text = graph(name, None if element == "f32" else element).text()
    sm = SemanticModule.from_text(text.replace("4096", str(cols)), f"{name}.mlir")
    job = cuda_on_cpu.target_job(sm, {0: shape})
    (launch,) = job.module.attributes["target.launches"].values
    assert tuple(dict(launch.entries)["block"].values) == (block, 1, 1)
    rng = np.random.default_rng(7)
    inputs = [rng.standard_normal(s.shape).astype(np.float32)
              for s in (BufferSpec.from_attr(a) for a in
                        job.module.attributes["target.buffers"].values) if s.kind == "arg"]
    assert cuda_on_cpu.job_error(job, sm, inputs) <= TOLERANCE[element]


@needs_cxx
def test_an_elementwise_grid_of_two_vectors_a_thread_covers_a_ragged_tail() -> None:
    """1100 rows of 4096: 1,126,400 vectors over 4096 blocks of 256 threads, so the
    grid-stride loop's second step covers the last 77,824 vectors only."""
    sm = graph("gelu_tanh")
    job = cuda_on_cpu.target_job(sm, {0: (1100, 4096)})
    (launch,) = job.module.attributes["target.launches"].values
    assert tuple(dict(launch.entries)["grid"].values) == (4096, 1, 1)
    x = np.random.default_rng(8).standard_normal((1100, 4096)).astype(np.float32)
    assert cuda_on_cpu.job_error(job, sm, [x]) < 1e-5


THREE_REDUCTIONS = '''"builtin.module"() ({
  "func.func"() <{function_type = (tensor<?x4096xf32>) -> tensor<?x4096xf32>, sym_name = "main"}> ({
  ^bb0(%x: tensor<?x4096xf32>):
    %mean = "semantic.reduce_mean"(%x) {axes = array<i64: 1>, keepdims = true} : (tensor<?x4096xf32>) -> tensor<?x1xf32>
    %c = "semantic.sub"(%x, %mean) : (tensor<?x4096xf32>, tensor<?x1xf32>) -> tensor<?x4096xf32>
    %a = "semantic.abs"(%c) : (tensor<?x4096xf32>) -> tensor<?x4096xf32>
    %m = "semantic.reduce_max"(%a) {axes = array<i64: 1>, keepdims = true} : (tensor<?x4096xf32>) -> tensor<?x1xf32>
    %n = "semantic.div"(%c, %m) : (tensor<?x4096xf32>, tensor<?x1xf32>) -> tensor<?x4096xf32>
    %q = "semantic.mul"(%n, %n) : (tensor<?x4096xf32>, tensor<?x4096xf32>) -> tensor<?x4096xf32>
    %s = "semantic.reduce_sum"(%q) {axes = array<i64: 1>, keepdims = true} : (tensor<?x4096xf32>) -> tensor<?x1xf32>
    %y = "semantic.mul"(%n, %s) : (tensor<?x4096xf32>, tensor<?x1xf32>) -> tensor<?x4096xf32>
    "func.return"(%y) : (tensor<?x4096xf32>) -> ()
  }) : () -> ()
}) : () -> ()'''
"""Three chained row reductions (mean, max of the centred values, sum of squares of the
scaled ones) in one kernel: the third reuses the first's shared-memory slots."""


@needs_cxx
@pytest.mark.parametrize("block", [0, 64])
def test_three_chained_row_reductions_share_two_sets_of_slots(block: int) -> None:
    """A block-per-row kernel's reductions take the two sets of warp slots in turn, a
    barrier each: three in a row (the third writing where the first read) still match
    the reference on the CPU, whose threads are real threads."""
    sm = SemanticModule.from_text(THREE_REDUCTIONS, "three.mlir")
    job = cuda_on_cpu.target_job(sm, {0: (6, 4096)}, [f"kernel.block_size={block}"])
    (k,) = [op for op in job.module.body.ops if isinstance(op, KernelFuncOp)]
    assert k.plan.mapping == "block-per-row"
    (body,) = kernel_bodies(job).values()
    assert body.count("__syncthreads();") == 3
    assert "accy_sh[(t >> 5)]" in body and "accy_sh[32 + (t >> 5)]" in body
    x = np.random.default_rng(11).standard_normal((6, 4096)).astype(np.float32)
    assert cuda_on_cpu.job_error(job, sm, [x]) <= TOLERANCE["f32"]
