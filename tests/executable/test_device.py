"""The device boundary: NVRTC and cc compiles, host and CUDA loads, lazy CuPy."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

import numpy as np
import pytest

from accy.errors import FragmentCompileError, FragmentLoadError
from accy.executable import device

SCALE_CU = """
extern "C" __global__ void scale(float* x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= a;
}
"""

SCALE_C = """
#include <stdint.h>
void scale(void** b, int64_t n) {
    float* x = b[0];
    const float* y = b[1];
    for (int64_t i = 0; i < n; i++) x[i] = 3.0f * x[i] + y[i];
}
"""


def test_nvrtc_identity():
    major, minor = device.nvrtc_version()
    assert major >= 12
    assert device.cuda_compiler_identity() == f"nvrtc-{major}.{minor}"


def test_compile_cuda_gives_a_cubin_without_a_gpu(tmp_path):
    cubin = device.compile_cuda(
        SCALE_CU, "sm_90", options=["-use_fast_math"], workspace=str(tmp_path)
    )
    assert cubin[:4] == b"\x7fELF"
    assert (tmp_path / "fragment.cu").read_text() == SCALE_CU


@pytest.mark.parametrize("arch", ["sm_80", "sm_90", "sm_90a"])
def test_the_cubin_is_a_whole_elf_file(arch):
    """Its section and program header tables end inside it (CuPy's getCUBIN alone
    leaves the file one byte short, device._whole_cubin)."""
    import struct

    cubin = device.compile_cuda(SCALE_CU, arch)
    phoff, shoff = struct.unpack_from("<QQ", cubin, 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", cubin, 0x36)
    assert len(cubin) >= max(phoff + phnum * phentsize, shoff + shnum * shentsize)


def test_compile_cuda_differs_by_arch():
    assert device.compile_cuda(SCALE_CU, "sm_80") != device.compile_cuda(SCALE_CU, "sm_90")


def test_cuda_syntax_error_carries_log_options_and_source():
    bad = 'extern "C" __global__ void k(float* x) { x[0] = ; }'
    with pytest.raises(FragmentCompileError) as info:
        device.compile_cuda(bad, "sm_90", name="bad.cu", options=["-use_fast_math"])
    err = info.value
    assert "bad.cu(1): error" in err.log
    assert "expected an expression" in err.log
    assert err.options == ("-arch=sm_90", "--std=c++17", "-use_fast_math")
    assert err.source_path is not None and err.source_path.endswith("bad.cu")
    with open(err.source_path) as f:
        assert f.read() == bad
    assert "bad.cu(1): error" in str(err)


def test_cuda_bad_arch_is_a_compile_error():
    with pytest.raises(FragmentCompileError, match="sm_1"):
        device.compile_cuda(SCALE_CU, "sm_1")


def test_host_compiler_identity():
    ident = device.host_compiler_identity()
    assert ident.split(": ")[0] == shlex.split(os.environ.get("CC", "cc"))[0]
    assert len(ident) > len("cc: ")


def test_compile_host_and_call_with_buffers(tmp_path):
    so = device.compile_host(SCALE_C, str(tmp_path), name="scale")
    assert so == str(tmp_path / "scale.so")
    assert (tmp_path / "scale.c").read_text() == SCALE_C
    assert sorted(os.listdir(tmp_path)) == ["scale.c", "scale.so"]  # no temp left over
    lib = device.HostLibrary(so)
    x = np.arange(5, dtype=np.float32)
    y = np.full(5, 0.5, dtype=np.float32)
    lib.call_with_buffers("scale", [x, y], x.size)
    np.testing.assert_array_equal(x, 3.0 * np.arange(5, dtype=np.float32) + 0.5)


def test_call_with_offset_view(tmp_path):
    lib = device.HostLibrary(device.compile_host(SCALE_C, str(tmp_path)))
    arena = np.zeros(16, dtype=np.float32)
    arena[4:8] = 1.0
    lib.call_with_buffers("scale", [arena[4:8], arena[8:12]], 4)
    assert arena.tolist() == [0.0] * 4 + [3.0] * 4 + [0.0] * 8
    with pytest.raises(ValueError, match="C-contiguous"):
        lib.call_with_buffers("scale", [arena[::2], arena[8:12]], 4)


def test_host_compile_error_carries_stderr(tmp_path):
    with pytest.raises(FragmentCompileError) as info:
        device.compile_host(
            "void f(void** b) { return 1 }", str(tmp_path), flags=("-shared", "-fPIC")
        )
    err = info.value
    assert "error" in err.log and "fragment.c" in err.log
    assert err.options == ("-shared", "-fPIC")
    assert err.source_path == str(tmp_path / "fragment.c")
    assert os.path.exists(err.source_path)
    assert not (tmp_path / "fragment.so").exists()
    assert os.listdir(tmp_path) == ["fragment.c"]


def test_missing_c_compiler_is_a_compile_error(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", "/nonexistent/accy-cc")
    with pytest.raises(FragmentCompileError, match="no usable C compiler"):
        device.compile_host("void f(void** b) {}", str(tmp_path))


def test_host_load_errors(tmp_path):
    with pytest.raises(FragmentLoadError):
        device.HostLibrary(str(tmp_path / "missing.so"))
    lib = device.HostLibrary(device.compile_host(SCALE_C, str(tmp_path)))
    with pytest.raises(FragmentLoadError, match="nope"):
        lib.call("nope", [])


@pytest.mark.parametrize("module", ["accy", "accy.executable.device"])
def test_import_does_not_import_cupy(module):
    code = (
        f"import sys, {module}\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('cupy', 'cupy_backends'))\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_gpu_probe_is_consistent():
    arch = device.local_arch()
    assert (arch is None) == (not device.gpu_available())
    assert arch is None or arch.startswith("sm_")


def test_cuda_module_without_gpu_is_a_load_error():
    if device.gpu_available():
        pytest.skip("a GPU is present")
    with pytest.raises(FragmentLoadError):
        device.CudaModule(device.compile_cuda(SCALE_CU, "sm_90"))


@pytest.mark.gpu
def test_cuda_module_launch_on_arrays_and_offset_views():
    import cupy

    mod = device.CudaModule(device.compile_cuda(SCALE_CU, device.local_arch()))
    x = cupy.arange(100, dtype=cupy.float32)
    mod.launch("scale", (1, 1, 1), (128, 1, 1), [x, np.float32(2.0), np.int32(100)])
    np.testing.assert_array_equal(x.get(), 2.0 * np.arange(100, dtype=np.float32))

    arena = cupy.zeros(64, dtype=cupy.uint8)
    view = arena[16:32].view(cupy.float32)  # 4 floats at byte offset 16
    view[...] = 1.0
    mod.launch("scale", (1, 1, 1), (32, 1, 1), [view, np.float32(3.0), np.int32(4)])
    mod.launch("scale", (1, 1, 1), (32, 1, 1), [arena.data + 16, np.float32(2.0), np.int32(2)])
    cupy.cuda.get_current_stream().synchronize()
    floats = arena.view(cupy.float32).get()
    assert floats.tolist() == [0, 0, 0, 0, 6, 6, 3, 3] + [0] * 8


@pytest.mark.gpu
def test_cuda_module_errors():
    mod = device.CudaModule(device.compile_cuda(SCALE_CU, device.local_arch()))
    with pytest.raises(FragmentLoadError, match="missing"):
        mod.get_function("missing")
    with pytest.raises(TypeError, match="NumPy scalar"):
        mod.launch("scale", (1, 1, 1), (1, 1, 1), [None, 2.0, 1])
    with pytest.raises(FragmentLoadError):
        device.CudaModule(b"not a cubin")


TWICE_CU = 'extern "C" __global__ void {0}(float* x) {{ x[threadIdx.x] *= {1}; }}\n'


def test_a_unit_compiles_in_parts_at_once(tmp_path):
    """One NVRTC program per part: several cubins in one binary; the workspace keeps the
    whole unit."""
    head = "#define TWO 2.0f\n"
    parts = [TWICE_CU.format("twice", "TWO"), TWICE_CU.format("thrice", "3.0f")]
    binary = device.compile_cuda_parts(head, parts, "sm_90", workspace=str(tmp_path))
    found = device.cubins(binary)
    assert len(found) == 2 and all(c[:4] == b"\x7fELF" for c in found)
    assert found[0] == device.compile_cuda(head + parts[0], "sm_90")
    assert (tmp_path / "fragment.cu").read_text() == head + "".join(parts)
    # one part (or none) is one program: a plain cubin
    assert device.compile_cuda_parts(head, parts[:1], "sm_90")[:4] == b"\x7fELF"
    assert device.cubins(found[1]) == [found[1]]


def test_a_failing_part_reports_the_whole_unit(tmp_path):
    parts = [TWICE_CU.format("twice", "2.0f"), TWICE_CU.format("broken", "undefined_name")]
    with pytest.raises(FragmentCompileError) as e:
        device.compile_cuda_parts("", parts, "sm_90", workspace=str(tmp_path))
    assert "undefined_name" in e.value.log
    assert e.value.source_path == str(tmp_path / "fragment.cu")


@pytest.mark.gpu
def test_a_unit_compiled_in_parts_loads_as_one_module():
    import cupy

    parts = [TWICE_CU.format("twice", "2.0f"), TWICE_CU.format("thrice", "3.0f")]
    mod = device.CudaModule(device.compile_cuda_parts("", parts, device.local_arch()))
    x = cupy.ones(32, dtype=cupy.float32)
    mod.launch("twice", (1, 1, 1), (32, 1, 1), [x])
    mod.launch("thrice", (1, 1, 1), (32, 1, 1), [x])
    assert x.get().tolist() == [6.0] * 32
    with pytest.raises(FragmentLoadError, match="missing"):
        mod.get_function("missing")
