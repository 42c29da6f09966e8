"""Run a generated CUDA kernel on the CPU: a check of its indexing and arithmetic
where there is no GPU (CI), not of CUDA itself.

The kernel's text (from its ``extern "C" __global__`` line to its closing brace)
is compiled by the host C++ compiler under a small shim: ``float4`` and friends,
``__ldg`` a plain load, the half conversions (f16 through ``_Float16``, bf16 rounded
to nearest even as ``cvt.rn`` does), one thread of the host per CUDA thread of a
block, blocks one after another (the same threads, a barrier between blocks),
``__syncthreads`` a ``std::barrier``, the packed half ops (:mod:`accy.target.packed`)
a lane at a time, each lane's result rounded to its type (:func:`packed_shim`), and
``__shfl_xor_sync`` an exchange through
memory between two barriers of its warp — which is right for kernels whose every
thread of a warp reaches every shuffle (a warp-per-row kernel's warps past the last
row return, whole). Dynamic shared memory is one static array, and a block's static
``__shared__`` arrays static locals of the kernel (shared by its threads).
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import tempfile

import numpy as np

from accy.dialects.memory import BufferSpec
from accy.numerics import bf16_bits
from accy.pipeline import prepare_through
from accy.preparation.options import RunOptions
from accy.reference import run_reference
from accy.target.cuda import (
    erfc_half_helper,
    erfc_helper,
    exp_half_helper,
    fdiv_helpers,
    fminmax_helpers,
    hscale_helper,
    sigmoid_half_helper,
)
from accy.target.packed import PACKED, helper_name, helpers

SHIM = r"""
#include <barrier>
#include <cmath>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>
struct float4 { float x, y, z, w; };
struct float2 { float x, y; };
struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };
static inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
static inline float accy_bf2f(unsigned short h) { return __uint_as_float(((unsigned)h) << 16); }
static inline unsigned short accy_f2bf(float f) {  // to nearest, ties to even (cvt.rn)
  const unsigned u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
  return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static inline float accy_h2f(unsigned short h) { _Float16 v; std::memcpy(&v, &h, 2); return (float)v; }
static inline unsigned short accy_f2h(float f) {
  const _Float16 v = (_Float16)f; unsigned short h; std::memcpy(&h, &v, 2); return h;
}
struct accy_param { void* p; template <class T> operator T*() const { return (T*)p; } };
struct accy_dim3 { unsigned x, y, z; };
static inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
static inline float2 make_float2(float a, float b) { return {a, b}; }
static inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) {
  return {a, b, c, d};
}
static inline uint2 make_uint2(unsigned a, unsigned b) { return {a, b}; }
static inline unsigned accy_pack_bf2(float lo, float hi) {
  return accy_f2bf(lo) | ((unsigned)accy_f2bf(hi) << 16);
}
static inline unsigned accy_pack_h2(float lo, float hi) {
  return accy_f2h(lo) | ((unsigned)accy_f2h(hi) << 16);
}
thread_local accy_dim3 threadIdx, blockIdx;
static accy_dim3 blockDim, gridDim;
static std::barrier<>* accy_bar;
alignas(8) static unsigned char accy_slots[1024 * 8];
#define __global__
#define __restrict__
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
#define __shared__
alignas(16) float accy_smem[64 * 1024];
template <class T> static inline T __ldg(const T* p) { return *p; }
template <class T> static inline T min(T a, T b) { return b < a ? b : a; }  // CUDA's integer min
static inline void __syncthreads() { accy_bar->arrive_and_wait(); }
static std::barrier<>* accy_warp_bar[32];
template <class T> static inline T __shfl_xor_sync(unsigned, T v, int o) {
  std::barrier<>* bar = accy_warp_bar[threadIdx.x >> 5];
  T* slots = reinterpret_cast<T*>(accy_slots);
  slots[threadIdx.x] = v; bar->arrive_and_wait();
  const T r = slots[threadIdx.x ^ o]; bar->arrive_and_wait(); return r;
}
#define __expf expf
static inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
static inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  const unsigned long long v = x | ((unsigned long long)y << 32); unsigned r = 0;
  for (int n = 0; n < 4; ++n) r |= (unsigned)((v >> (8 * ((s >> (4 * n)) & 7u))) & 0xffu) << (8 * n);
  return r;
}
""" + erfc_helper("static inline", "t = 1.0f / u;") + "\n" + \
    erfc_half_helper("static inline", "t = 1.0f / u;", "exp2f") + "\n" + \
    fdiv_helpers("static inline", "r = 1.0f / b;") + "\n" + \
    exp_half_helper("static inline", "exp2f") + "\n" + hscale_helper("static inline") + "\n" + \
    sigmoid_half_helper("static inline", "exp2f", "r = 1.0f / y;") + "\n" + \
    "\n".join(fminmax_helpers("static inline", native=False).values()) + "\n"

CONVERT = {"bf16": ("accy_bf2f", "accy_pack_bf2"), "f16": ("accy_h2f", "accy_pack_h2")}
"""A half type's conversion of one half to float and of two floats to a rounded word."""
LANEWISE = {"add": "x + y", "sub": "x - y", "mul": "x * y"}
"""Packed ops that round: the f32 op on each lane, rounded to the half type."""
PICKS = {"max": "x > y || x != x", "min": "x < y || x != x", "relu": "x > 0.0f || x != x"}
"""Packed ops that pick an operand: when the f32 path's condition holds, the first
operand's half, else the second's (relu's: zero)."""


def packed_shim() -> str:
    """Host C++ for every packed helper: the ones spelled in inline PTX emulated a lane
    at a time as the f32 path computes that lane (its own words where they are plain C:
    ``neg``, ``abs``, ``accy_bits_bf2``)."""
    plain = helpers("static inline")
    lines = []
    for (el, op), p in PACKED.items():
        name = helper_name(op, el)
        if "asm(" not in p.body:
            lines.append(plain[name])
            continue
        to_f, pack = CONVERT[el]
        args = "unsigned a, unsigned b" if p.arity == 2 else "unsigned a"
        b = "b" if p.arity == 2 else "0u"
        half = [f"const unsigned short a{h} = (unsigned short)(a >> {16 * h}), "
                f"b{h} = (unsigned short)({b} >> {16 * h}); "
                f"const float x{h} = {to_f}(a{h}), y{h} = {to_f}(b{h});" for h in (0, 1)]
        if op in LANEWISE:
            f = LANEWISE[op]
            result = (f"return {pack}({f.replace('x', 'x0').replace('y', 'y0')}, "
                      f"{f.replace('x', 'x1').replace('y', 'y1')});")
        else:
            c = PICKS[op]
            result = ("return (unsigned)(" + c.replace("x", "x0").replace("y", "y0") +
                      " ? a0 : b0) | ((unsigned)(" + c.replace("x", "x1").replace("y", "y1") +
                      " ? a1 : b1) << 16);")
        lines.append(f"static inline unsigned {name}({args}) {{\n  " + "\n  ".join(half) +
                     f"\n  {result}\n}}")
    for el, (to_f, pack) in CONVERT.items():
        lines.append(f"static inline unsigned {helper_name('canon', el)}(unsigned a) {{\n"
                     f"  return {pack}({to_f}((unsigned short)a), "
                     f"{to_f}((unsigned short)(a >> 16)));\n}}")
    lines.append(plain["accy_bits_bf2"])
    return "\n".join(lines) + "\n"


def available() -> bool:
    """A C++20 compiler with ``<barrier>`` is on the PATH."""
    return shutil.which("g++") is not None


def kernel_text(source: str, name: str) -> str:
    start = source.rindex('extern "C"', 0, source.index(f" {name}(") + 1)
    end = source.index("\n}\n", start) + 3
    return source[start:end]


def run(source: str, name: str, grid: int | tuple[int, int, int], threads: int,
        buffers: list[np.ndarray], prelude: str = "", scalars: tuple[int, ...] = ()) -> None:
    """Run kernel ``name`` of CUDA ``source`` over ``grid`` blocks (x, or x, y, z) of
    ``threads`` on the CPU, its parameters the contiguous ``buffers`` (inputs, then
    outputs, written in place), in the kernel's storage types: float32, float16, or uint16
    bit patterns for bf16, then the launch's ``scalars``; ``prelude`` (host C++) goes
    before the kernel."""
    assert all(b.flags.c_contiguous for b in buffers)
    gx, gy, gz = (grid, 1, 1) if isinstance(grid, int) else grid
    args = ", ".join([f"accy_param{{b[{i}]}}" for i in range(len(buffers))]
                     + [f"{int(v)}LL" for v in scalars])
    # a block's static shared arrays are one array for every thread of the block (blocks
    # run one after another): a static local of the kernel function
    body = re.sub(r"^(\s*)__shared__ (__align__\(\d+\) )?", r"\1\2static ",
                  kernel_text(source, name).replace(
        "extern __shared__ __align__(16) float accy_smem[];", ""), flags=re.M)
    text = SHIM + packed_shim() + prelude + body + f"""
extern "C" void accy_run(void** b, int threads) {{
  std::barrier<> bar(threads);
  accy_bar = &bar;
  blockDim = {{(unsigned)threads, 1, 1}}; gridDim = {{{gx}u, {gy}u, {gz}u}};
  std::vector<std::unique_ptr<std::barrier<>>> warps;
  for (int w = 0; w * 32 < threads; ++w) {{
    warps.emplace_back(new std::barrier<>(threads - w * 32 < 32 ? threads - w * 32 : 32));
    accy_warp_bar[w] = warps.back().get();
  }}
  // one host thread per CUDA thread, for every block in turn: the block's threads all
  // leave the kernel before any starts the next block (its shared arrays are reused)
  std::barrier<> next_block(threads);
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([=, &next_block] {{
      for (unsigned g = 0; g < {gx * gy * gz}u; ++g) {{
        threadIdx = {{(unsigned)t, 0, 0}};
        blockIdx = {{g % {gx}u, g / {gx}u % {gy}u, g / {gx * gy}u}};
        {name}({args});
        next_block.arrive_and_wait();
      }}
    }});
  for (auto& th : ts) th.join();
}}
"""
    with tempfile.TemporaryDirectory() as tmp:
        src, so = os.path.join(tmp, "k.cpp"), os.path.join(tmp, "k.so")
        with open(src, "w") as f:
            f.write(text)
        built = subprocess.run(["g++", "-std=c++20", "-O1", "-fPIC", "-shared", "-pthread",
                        "-ffp-contract=off", src, "-o", so], check=False, capture_output=True, text=True)
        if built.returncode:
            raise RuntimeError(f"the kernel does not build on the host:\n{built.stderr}")
        lib = ctypes.CDLL(so)
        ptrs = (ctypes.c_void_p * len(buffers))(*[b.ctypes.data for b in buffers])
        lib.accy_run(ptrs, threads)


def sweep(tmp_path, program: str, helper: str) -> str:  # type: ignore[no-untyped-def]
    """What ``program`` with ``helper`` in it prints, built by the host C compiler
    (no FMA contraction, as NVRTC builds accy's units)."""
    src, exe = tmp_path / "sweep.c", tmp_path / "sweep"
    src.write_text(program.replace("@HELPER@", helper))
    subprocess.run(["cc", "-O2", "-ffp-contract=off", str(src), "-o", str(exe), "-lm"],
                   check=True)
    return subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout


HOPPER = "cuda:sm_90a"
"""The arch-specific target (what ``--target cuda`` is on a Hopper GPU): warpgroups."""

MMA_SYNC = ("kernel.wgmma=false",)
"""On sm_90 the warpgroup kernel is the default; these tests ask for ``mma.sync``."""


def target_job(sm, shapes=None, opts=(), target: str = "cuda:sm_90"):  # type: ignore[no-untyped-def]
    """``sm`` prepared through the target stage for ``target`` (shapes bound, options
    as the CLI spells them): the job whose source and launches :func:`run_job` runs."""
    return prepare_through(sm, "target", RunOptions.parse(target, list(opts)),
                           shapes or {}).product


def job_source(job) -> str:  # type: ignore[no-untyped-def]
    """The CUDA source of a :func:`target_job`."""
    return job.source


STORAGE = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16, "i64": np.int64}
"""The kernels' storage type of each float element type (bf16: its bit patterns)."""


def run_job(job, inputs: list[np.ndarray]) -> list[np.ndarray]:  # type: ignore[no-untyped-def]
    """Every launch of a target-stage job's table on the CPU over its buffers (f32, f16
    or bf16; arena views included, the arena and the results NaN before), in order; the
    results (bf16 as float32)."""
    attrs = job.module.attributes
    specs = [BufferSpec.from_attr(a) for a in attrs["target.buffers"].values]
    arena = np.full(max(1, attrs["target.arena_bytes"].value // 4 + 1), np.nan,
                    np.float32).view(np.uint8)
    by_id = {s.id: s for s in specs}
    arrays: dict[int, np.ndarray] = {}
    results: dict[int, np.ndarray] = {}

    def array(i: int) -> np.ndarray:
        if i in arrays:
            return arrays[i]
        s = by_id[i]
        dtype = STORAGE[s.dtype]
        n = s.bytes // np.dtype(dtype).itemsize
        if s.kind == "arg":
            x = np.asarray(inputs[s.index])
            a = (bf16_bits(x) if s.dtype == "bf16" else x.astype(dtype)).reshape(-1)
        elif s.kind == "arena":
            a = arena[s.offset:s.offset + s.bytes].view(dtype)
        elif s.kind == "alias":
            a = array(s.alias_of)[:n]
        else:
            a = array(s.inplace_of)[:n] if s.inplace_of >= 0 else \
                np.full(n, 0x7fc0, np.uint16) if s.dtype == "bf16" else \
                np.full(n, -1, dtype) if np.issubdtype(dtype, np.integer) else \
                np.full(n, np.nan, dtype)
            results[s.index] = a.reshape(s.shape)
        assert a.flags.c_contiguous
        arrays[i] = a
        return a

    for s in specs:
        array(s.id)
    text = job_source(job)
    for launch in attrs["target.launches"].values:
        e = dict(launch.entries)
        assert tuple(e["block"].values)[1:] == (1, 1)
        run(text, e["kernel"].value, tuple(e["grid"].values), e["block"].values[0],
            [array(i) for i in e["buffers"].values], scalars=tuple(e["scalars"].values))
    return [(results[i].astype(np.uint32) << 16).view(np.float32)
            if results[i].dtype == np.uint16 else results[i] for i in sorted(results)]


def job_error(job, sm, inputs: list[np.ndarray]) -> float:  # type: ignore[no-untyped-def]
    """The largest ``|got − reference| / max(1, max |reference|)`` over the results of
    :func:`run_job` (none may be NaN) against the reference interpreter's."""
    got = run_job(job, inputs)
    want = run_reference(sm.module, inputs)
    err = 0.0
    for g, w in zip(got, want, strict=True):
        w = np.asarray(w, np.float64)
        assert g.shape == w.shape and not np.isnan(g.astype(np.float64)).any()
        err = max(err, float(np.max(np.abs(g - w)) / max(1.0, float(np.max(np.abs(w))))))
    return err
