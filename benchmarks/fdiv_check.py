"""Every pair of f32 mantissas through ``accy_fdiv_by`` on the GPU; prints JSON.

The row kernels divide by a row's statistic with a reciprocal made once a row and a
correction a quotient (:func:`accy.target.cuda.fdiv_helpers`). Inside the short path's
range each of its steps scales exactly with the operands' exponents, so the 2^46 pairs
of mantissas ``a = 1.m_a``, ``b = 1.m_b`` stand for every pair in it. Each is compared
with CUDA's IEEE division (``__fdiv_rn``, bit for bit) and every 64th with the float64
quotient rounded once to f32 (correctly rounded: 53 ≥ 2·24 + 2 bits). Then samples at the
ends of the range (``|a|`` near 2^±62, ``|b|`` near 2^∓60, so quotients near 2^±122),
with negative numerators, and past the ends (``|a| > 2^62`` when its mantissa is not 1,
``|b| > 2^60``: the long path, still IEEE).

    python3 benchmarks/fdiv_check.py              # all 2^46 pairs (about a minute on an H200)
    python3 benchmarks/fdiv_check.py --b-step 4096   # every 4096th divisor mantissa
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from accy.target.cuda import HELPERS, PRELUDE  # noqa: E402

KERNEL = PRELUDE + HELPERS["accy_fdiv_by"] + r"""
extern "C" __global__ void accy_fdiv_pairs(unsigned b0, unsigned b_step, int ea, int eb,
                                           int negative, unsigned long long* out) {
  const unsigned mb = b0 + blockIdx.x * b_step;
  if (mb >= (1u << 23)) return;
  const float b = __uint_as_float(((unsigned)(eb + 127) << 23) | mb);
  const float r = accy_fdiv_rcp(b), lo = accy_fdiv_lo(b);
  unsigned long long bad = 0, bad64 = 0, n64 = 0;
  for (unsigned m = threadIdx.x; m < (1u << 23); m += blockDim.x) {
    float a = __uint_as_float(((unsigned)(ea + 127) << 23) | m);
    if (negative) a = -a;
    const float got = accy_fdiv_by(a, b, r, lo);
    bad += __float_as_uint(got) != __float_as_uint(__fdiv_rn(a, b));
    if ((m & 63) == 0) {
      n64++;
      bad64 += __float_as_uint(got) != __float_as_uint(__double2float_rn((double)a / (double)b));
    }
  }
  atomicAdd(out, bad);
  atomicAdd(out + 1, bad64);
  atomicAdd(out + 2, n64);
}
"""

CASES = [  # (exponent of a, of b, a negative, divisor mantissa step): the sampled runs
    (0, 0, True, 4096),      # negative numerators
    (-62, 59, False, 4096),  # the least quotients on the short path: about 2^-122
    (61, -60, False, 4096),  # the greatest: about 2^122
    (-62, -60, False, 4096), (61, 59, False, 4096),
    (-63, 0, False, 4096),   # past the ends: the long path
    (62, 0, False, 4096), (0, 60, False, 4096), (0, -61, False, 4096),
]


def check(ea: int, eb: int, negative: bool, b_step: int, per_launch: int = 1 << 14) \
        -> dict[str, int]:
    """Every ``a`` mantissa at exponent ``ea`` (negated with ``negative``) against every
    ``b_step``-th ``b`` mantissa at ``eb``: the mismatches against IEEE division and
    against the float64 quotient (on every 64th ``a``)."""
    import cupy as cp

    fn = cp.RawKernel(KERNEL, "accy_fdiv_pairs")
    out = cp.zeros(3, dtype=cp.uint64)
    count = ((1 << 23) + b_step - 1) // b_step
    for start in range(0, count, per_launch):
        blocks = min(per_launch, count - start)
        fn((blocks,), (1024,), (cp.uint32(start * b_step), cp.uint32(b_step), cp.int32(ea),
                                cp.int32(eb), cp.int32(int(negative)), out))
    cp.cuda.Device().synchronize()
    bad, bad64, n64 = (int(v) for v in out.get())
    return {"ea": ea, "eb": eb, "negative": negative, "b_step": b_step,
            "pairs": count << 23, "mismatch_ieee": bad, "mismatch_f64": bad64,
            "checked_f64": n64}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--b-step", type=int, default=1,
                    help="divisor mantissas: every N-th (1: all 2^23, so all 2^46 pairs)")
    args = ap.parse_args(argv)
    import cupy as cp

    t0 = time.perf_counter()
    runs = [check(0, 0, False, args.b_step)]
    whole = time.perf_counter() - t0
    runs += [check(*c) for c in CASES]
    result = {"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
              "host": platform.node(), "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                                             time.gmtime()),
              "seconds_first": round(whole, 2), "runs": runs,
              "mismatches": sum(r["mismatch_ieee"] + r["mismatch_f64"] for r in runs)}
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    sys.exit(1 if main()["mismatches"] else 0)
