"""Test-wide hooks: tests marked ``gpu`` are skipped on machines without a GPU."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    from accy.executable.device import gpu_available

    if gpu_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (none visible to CuPy)")
    for item in gpu_items:
        item.add_marker(skip)


@pytest.fixture(autouse=True)
def _cold_compiles():
    """Every test starts with an empty binary memo, as a fresh process does (what one
    test compiled must not turn another's compile into a reuse)."""
    from accy.executable.compile import BINARIES

    BINARIES.clear()
    yield
