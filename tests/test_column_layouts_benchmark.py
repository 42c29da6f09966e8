"""benchmarks/column_layouts.py: every layout it times renders a kernel NVRTC compiles
(no GPU needed), and accy's own kernel is the one ``accy emit`` renders."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import column_layouts  # noqa: E402

from accy.executable.device import compile_cuda  # noqa: E402


@pytest.mark.parametrize("which", ["probe", "order"])
def test_every_layout_compiles(which: str) -> None:
    cases = column_layouts.probe_set() if which == "probe" else column_layouts.order_set()
    assert len({c["tag"] for c in cases}) == len(cases)
    for case in cases:
        assert 524288 % case["tcols"] == 0, case["tag"]
        assert compile_cuda(case["source"], "sm_90")[:4] == b"\x7fELF", case["tag"]


def test_the_tile_orders_are_spelled_as_the_kernel_stage_deals_them() -> None:
    """``streams`` G here (G dividing the grid) takes the tiles ``stream_tile`` gives."""
    from accy.preparation.passes.kernel import stream_tile

    src, _ = column_layouts.tilecopy(2, 4, 256, streams=8)
    assert column_layouts.tile_of(8) in src
    grid = 64
    spelled = [(b % 8) * (grid // 8) + b // 8 for b in range(grid)]
    assert spelled == [stream_tile(b, grid, 8) for b in range(grid)]


def test_accys_kernel_is_the_rendered_one() -> None:
    case = column_layouts.accy_kernel(65536)
    assert case["name"] == "k0_rows" and case["block"] == 256 and case["grid"] == 65536 // 128
    assert "accy_tile" in case["source"]  # dealt into runs (kernel.column_streams)
    assert compile_cuda(case["source"], "sm_90")[:4] == b"\x7fELF"
