"""``benchmarks/batch.py``'s task-stream figures: where a batch's wall time went."""

from __future__ import annotations

import pytest


@pytest.fixture
def batch(benchmark_script):  # type: ignore[no-untyped-def]
    return benchmark_script("batch")


def task(key, worker, *spans):  # type: ignore[no-untyped-def]
    return {"key": key, "worker": worker,
            "startstops": [{"action": a, "start": s, "stop": e} for a, s, e in spans]}


def test_only_compute_counts_and_the_edges_are_measured(batch):
    stream = [task(("accy_group-contract-load", "g1"), "w1", ("compute", 10.2, 10.8)),
              task(("accy_contract-load", "c1"), "w1", ("transfer", 10.8, 10.9),
                   ("compute", 10.9, 10.95)),
              task(("accy_group-contract-load", "g2"), "w2", ("compute", 10.3, 11.0))]
    f = batch.stream_figures(stream, 10.0, 11.25, 2)
    assert f["tasks"] == 3 and f["wall_s"] == 1.25
    assert f["first_start_s"] == 0.2 and f["after_last_s"] == 0.25
    assert f["busy_fraction"] == round((0.6 + 0.05 + 0.7) / 2 / 1.25, 3)
    assert f["kinds"] == {"accy_group-contract-load": [2, 1.3], "accy_contract-load": [1, 0.05]}


def test_an_empty_stream_has_no_tasks(batch):
    assert batch.stream_figures([], 0.0, 1.0, 4) == {"tasks": 0}


def test_the_warm_up_renders_every_source_the_measured_sets_render(batch):
    """Rows are launch scalars, so a program's source is its options': the warm-up must
    hold every program under every kernel option set, on rows no measured set uses."""
    warm = batch.warm_up_variants(2, "cuda")
    seen = {(v.program, tuple(sorted(v.options.items()))) for v in warm}
    for v in batch.shared_variants(len(batch.PROGRAMS) * len(batch.KERNEL_AXES) * 2, "cuda") \
            + batch.distinct_variants(60, "cuda"):
        assert (v.program, tuple(sorted(v.options.items()))) in seen
    warm_rows = {shape[0] for v in warm for shape in v.shapes.values()}
    measured = batch.distinct_variants(480, "cuda", first_rows=8 + 8000) \
        + batch.shared_variants(480, "cuda", first_rows=16 + 8000)
    assert not warm_rows & {shape[0] for v in measured for shape in v.shapes.values()}


def test_accys_warm_up_sets_have_the_measured_make_up_on_rows_of_their_own(batch):
    """accy's compile groups form NVRTC programs from the batch's make-up, so its second
    warm-up repeats each measured set's programs and options in order, on other rows."""
    def make_up(vs):
        return [(v.program, tuple(sorted(v.options.items()))) for v in vs]

    def rows(vs):
        return {shape[0] for v in vs for shape in v.shapes.values()}

    distinct, shared = batch.accy_warm_up_sets(480, "cuda")
    measured = [batch.distinct_variants(480, "cuda", first_rows=8 + off)
                + batch.shared_variants(480, "cuda", first_rows=16 + off)
                for off in (0, 8000, 16000, 24000)]
    profiled = batch.distinct_variants(480, "cuda", first_rows=8 * 480 + 4)
    assert make_up(distinct) == make_up(measured[1][:480])
    assert make_up(shared) == make_up(measured[1][480:])
    for vs in [*measured, profiled, batch.warm_up_variants(15, "cuda")]:
        assert not rows(distinct + shared) & rows(vs)
    assert len(batch.accy_warm_up_sets(60, "cuda", shared=24)[1]) == 24


def test_the_compile_count_sees_each_nvrtc_program_and_its_kernels(batch):
    from accy.executable.device import compile_cuda, compile_cuda_parts

    k = 'extern "C" __global__ void {}(float* x) {{ x[0] = {}; }}\n'
    batch.count_compiles()
    compile_cuda(k.format("a", 1), "sm_90")
    programs, kernels, seconds = batch.compiles_counted()
    assert (programs, kernels) == (1, 1) and seconds > 0
    compile_cuda_parts("", [k.format("b", 2), k.format("c", 3)], "sm_90")  # a program each
    compile_cuda(k.format("d", 4) + k.format("e", 5), "sm_90")  # one program, two kernels
    assert batch.compiles_counted()[:2] == [4, 5]
    assert batch.compiles_counted()[2] > seconds  # three more programs' time
    batch.count_compiles()  # from zero again
    compile_cuda(k.format("f", 6), "sm_90")
    assert batch.compiles_counted()[:2] == [1, 1]
