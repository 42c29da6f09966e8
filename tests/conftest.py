"""Test-wide hooks: tests marked ``gpu`` are skipped on machines without a GPU; the
``benchmark_script`` fixture loads a script of ``benchmarks/``."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


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


@pytest.fixture
def benchmark_script():  # type: ignore[no-untyped-def]
    """``load(name)``: ``benchmarks/<name>.py`` as a fresh module (the scripts are no
    package), registered in ``sys.modules`` while the test runs (a script that pickles
    its own functions to child processes needs it there)."""
    loaded: list[str] = []

    def load(name: str) -> ModuleType:
        spec = importlib.util.spec_from_file_location(f"accy_bench_{name}",
                                                      BENCHMARKS / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        loaded.append(spec.name)
        spec.loader.exec_module(module)
        return module

    yield load
    for name in loaded:
        sys.modules.pop(name, None)
