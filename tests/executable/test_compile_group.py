"""Several CUDA fragments compiled in one NVRTC program (``compile_fragments``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "preparation"))
from stage_programs import graph, matmul  # noqa: E402

from accy.executable.compile import (  # noqa: E402
    BINARIES,
    FragmentPlan,
    compile_fragment,
    compile_fragments,
    compile_key,
)
from accy.executable.device import compile_cuda, local_arch  # noqa: E402
from accy.pipeline import prepare_through  # noqa: E402
from accy.preparation.options import RunOptions  # noqa: E402


def job(name: str, target: str = "cuda:sm_90", opts=(), shape=(8, 4096)):  # type: ignore[no-untyped-def]
    return prepare_through(graph(name), "target", RunOptions.parse(target, list(opts)),
                           {0: shape}).product


def test_fragments_of_one_arch_and_flags_share_one_cubin_under_renamed_kernels() -> None:
    jobs = [job("softmax"), job("layernorm"), job("softmax", opts=("kernel.block_size=128",))]
    keys = [compile_key(j) for j in jobs]
    got = compile_fragments(jobs, keys)
    assert [c.key.hex for c in got] == [k.hex for k in keys]  # type: ignore[union-attr]
    assert len({c.binary for c in got}) == 1  # type: ignore[union-attr]
    for i, (c, j) in enumerate(zip(got, jobs)):
        alone = FragmentPlan.of(j)
        names = [launch.kernel for launch in c.plan.launches]  # type: ignore[union-attr]
        assert names == [f"accy_g{i}_{launch.kernel}" for launch in alone.launches]
        assert all(n.encode() in c.binary for n in names)  # type: ignore[union-attr]
        assert c.meta["grain"] == 3  # type: ignore[union-attr]
        # its source is its own part of the program, and compiles alone to those kernels
        assert all(n.encode() in compile_cuda(c.source, "sm_90", options=["--fmad=false"])
                   for n in names)  # type: ignore[union-attr]
        assert c.plan.buffers == alone.buffers  # type: ignore[union-attr]


def test_with_group_sources_off_each_source_is_a_program_of_its_own(monkeypatch) -> None:
    """``ACCY_GROUP_SOURCES=0``: the text a plain compile makes (no renamed kernels), one
    NVRTC program a distinct source, a source seen twice compiled once."""
    from accy.executable.compile import GROUP_SOURCES_ENV
    from accy.executable.device import nvrtc_counts

    monkeypatch.setenv(GROUP_SOURCES_ENV, "0")
    BINARIES.clear()
    jobs = [job("softmax"), job("layernorm"), job("softmax", shape=(16, 4096))]
    nvrtc_counts(reset=True)
    got = compile_fragments(jobs, [compile_key(j) for j in jobs])
    assert nvrtc_counts().programs == 2
    assert got[0].binary != got[1].binary and got[2].binary == got[0].binary  # type: ignore[union-attr]
    for c, j in zip(got, jobs):
        assert [launch.kernel for launch in c.plan.launches] == \
            [launch.kernel for launch in FragmentPlan.of(j).launches]  # type: ignore[union-attr]
        assert c.source == compile_fragment(j).source  # type: ignore[union-attr]


def test_other_flags_and_the_host_compile_apart() -> None:
    jobs = [job("softmax"), job("softmax", opts=("target.fast_math=true",)),
            job("layernorm", target="host"), job("rmsnorm")]
    got = compile_fragments(jobs, [compile_key(j) for j in jobs])
    fast, host = got[1], got[2]
    assert got[0].binary == got[3].binary != fast.binary  # type: ignore[union-attr]
    assert "grain" not in fast.meta and "grain" not in host.meta  # type: ignore[union-attr]
    assert host.plan.target == "host"  # type: ignore[union-attr]


def test_a_broken_unit_fails_alone() -> None:
    from accy.choir.attributes import StringAttr
    from accy.errors import FragmentCompileError

    jobs = [job("softmax"), job("layernorm"), job("rmsnorm")]
    attrs = jobs[1].module.attributes
    attrs["target.source"] = StringAttr(attrs["target.source"].value + "\n#error broken\n")
    got = compile_fragments(jobs, [compile_key(j) for j in jobs])
    assert isinstance(got[1], FragmentCompileError) and "#error directive: broken" in got[1].log
    assert got[0].binary != got[2].binary  # type: ignore[union-attr]  # each alone


def test_warpgroup_fragments_share_a_program_too() -> None:
    """sm_90a units (TMA tensor-map parameters of a namespaced struct type, mbarriers,
    dynamic shared memory) compile side by side with a row kernel."""
    hopper = RunOptions.parse("cuda:sm_90a", [])
    jobs = [prepare_through(matmul(256, 256, 128, "bf16"), "target", hopper, {}).product,
            prepare_through(matmul(256, 512, 128, "f16", (), True), "target", hopper,
                            {}).product,
            job("softmax", target="cuda:sm_90a")]
    got = compile_fragments(jobs, [compile_key(j) for j in jobs])
    assert len({c.binary for c in got}) == 1  # type: ignore[union-attr]
    assert [len(c.plan.launches[0].tensor_maps) for c in got] == [2, 2, 0]  # type: ignore[union-attr]


@pytest.mark.gpu
def test_fragments_of_one_group_load_one_module_and_run_their_own_kernels() -> None:
    import numpy as np

    from accy.executable.fragment import LoadedFragment
    from accy.reference import run_reference

    arch = local_arch()
    jobs = [job("softmax", f"cuda:{arch}"),
            job("softmax", f"cuda:{arch}", opts=("kernel.block_size=128",))]
    got = compile_fragments(jobs, [compile_key(j) for j in jobs])
    a, b = (LoadedFragment(c) for c in got)  # type: ignore[arg-type]
    assert a._module is b._module  # one module load for the group's cubin
    x = np.random.default_rng(0).standard_normal((8, 4096)).astype(np.float32)
    want = run_reference(graph("softmax").module, [x])[0]
    for frag in (a, b):
        np.testing.assert_allclose(frag(x)[0], want, rtol=2e-5, atol=1e-7)


def test_row_counts_of_a_program_are_one_unit_and_later_ones_no_compile(monkeypatch) -> None:
    """A row count is a launch scalar, not part of the source: variants that differ only
    in it compile once in a group, and a later one reuses the binary outright."""
    from accy.target.backend import CudaBackend

    calls: list[str] = []
    real = CudaBackend.compile

    def counted(self, source, workspace, flags):  # type: ignore[no-untyped-def]
        calls.append(source)
        return real(self, source, workspace, flags)

    monkeypatch.setattr(CudaBackend, "compile", counted)
    jobs = [job("softmax", shape=(r, 1024)) for r in (8, 24, 40)] + [job("layernorm")]
    got = compile_fragments(jobs, [compile_key(j) for j in jobs])
    assert len(calls) == 1 and got[0].meta["units"] == 2  # type: ignore[union-attr]
    assert len({c.key.hex for c in got}) == 4  # type: ignore[union-attr]  # each its own key
    kernels = {c.plan.launches[0].kernel for c in got[:3]}  # type: ignore[union-attr]
    assert len(kernels) == 1 and got[3].plan.launches[0].kernel not in kernels  # type: ignore[union-attr]
    scalars = [c.plan.launches[0].scalars for c in got[:3]]  # type: ignore[union-attr]
    assert len(set(scalars)) == 3  # the row counts travel in the launch table
    later = compile_fragment(job("softmax", shape=(56, 1024)))
    assert len(calls) == 1 and later.meta["binary"] == "reused"
    assert later.binary == got[0].binary  # type: ignore[union-attr]
    assert later.plan.launches[0].kernel in kernels


def test_a_binary_is_found_in_the_store_by_what_was_compiled(tmp_path) -> None:
    from accy.store import ArtifactStore

    store = ArtifactStore(str(tmp_path))
    first = compile_fragment(job("softmax", shape=(8, 1024)), store=store)
    assert "binary" not in first.meta
    BINARIES.clear()  # another process: only the store remembers
    again = compile_fragment(job("softmax", shape=(16, 1024)), store=store)
    assert again.meta["binary"] == "reused" and again.binary == first.binary
    other_flags = compile_fragment(job("softmax", shape=(16, 1024),
                                       opts=("target.fast_math=true",)), store=store)
    assert "binary" not in other_flags.meta and other_flags.binary != first.binary


@pytest.mark.gpu
@pytest.mark.parametrize("name,cols", [("softmax", 1024), ("bias_gelu", 4096),
                                       ("gelu_tanh", 4096), ("residual_norm", 1024)])
def test_a_binary_reused_at_another_row_count_computes_that_row_count(name: str, cols: int) \
        -> None:
    import numpy as np

    from accy.executable.fragment import LoadedFragment
    from accy.reference import run_reference

    arch = local_arch()
    rng = np.random.default_rng(1)
    first = None
    for rows in (8, 37, 1):
        shapes = {0: (rows, cols), 1: (rows, cols)} if name == "residual_norm" else \
            {0: (rows, cols)}
        j = prepare_through(graph(name), "target", RunOptions.parse(f"cuda:{arch}", []),
                            shapes).product
        c = compile_fragment(j)
        if first is None:
            first = c
        elif rows > 1:  # a single row renders its own source (its index is 0)
            assert c.meta["binary"] == "reused" and c.binary == first.binary
        frag = LoadedFragment(c)
        xs = [rng.standard_normal(tuple(int(d) for d in shape)).astype(np.float32)
              for shape, _ in c.plan.args]
        want = run_reference(graph(name).module, xs)
        for got, w in zip(frag(*xs), want):
            np.testing.assert_allclose(got, w, rtol=2e-5, atol=1e-6)
