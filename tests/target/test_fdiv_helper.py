"""accy's quotient by a shared divisor (the CUDA target's ``accy_fdiv_by``), compiled by
the host C compiler from the same text with a correctly rounded reciprocal where the
device has ``rcp.approx``: bit for bit IEEE division over every mantissa of ``a`` at a
few divisors, a stride over every f32 at many (zeros, subnormals, infinities, NaN, both
ends of the short path's range), and the divisors just outside it. The GPU build, with
the device's reciprocal, is checked by ``tests/executable/test_kernels_gpu.py`` and over
every pair of mantissas by ``benchmarks/fdiv_check.py``."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from accy.target.cuda import FDIV_SHORT_A, fdiv_helpers

PROGRAM = r"""
#include <math.h>
#include <stdio.h>
#include <string.h>
@HELPER@
static float f_of(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
static unsigned u_of(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static long bad = 0, fast = 0, n = 0;
static void check(float a, float b, float r, float lo) {
  const float got = accy_fdiv_by(a, b, r, lo), want = a / b;
  const float m = fabsf(a);
  fast += m >= lo && m <= 0x1p@HI@f;
  n++;
  if (u_of(got) != u_of(want) && !(got != got && want != want)) {
    if (bad++ < 5) printf("bad %a / %a: %a, not %a\n", a, b, got, want);
  }
}
int main(void) {
  /* divisors: the ends of the range and past them, mantissas of every shape */
  const float bs[] = {1.0f, 1.5f, 0x1.fffffep0f, 0x1.000002p0f, 0x1.555556p0f, 3.0f, 7.0f,
                      4096.0f, 0.1f, 1e-3f, 33.3f, 0x1p@LOB@f, 0x1.fffffep@HIB@f,
                      0x1p@HIB@f, 0x1.fffffep@LOBM@f, 0x1p@HIBP@f, 1e-30f, 1e30f, 0.0f,
                      INFINITY, NAN, 1e-40f};
  const int nb = sizeof bs / sizeof bs[0];
  for (int i = 0; i < nb; ++i)
    for (int s = 0; s < 2; ++s) {
      const float b = s ? -bs[i] : bs[i];
      const float r = accy_fdiv_rcp(b), lo = accy_fdiv_lo(b);
      for (unsigned long u = 0; u <= 0xffffffffu; u += 4099) check(f_of((unsigned)u), b, r, lo);
      check(0.0f, b, r, lo); check(-0.0f, b, r, lo);
      check(0x1p@LO@f, b, r, lo); check(0x1.fffffep@LOM@f, b, r, lo);
      check(0x1p@HI@f, b, r, lo); check(0x1.000002p@HI@f, b, r, lo);
    }
  /* every mantissa of a (both signs) at divisors whose mantissas are the extremes */
  const float full[] = {0x1.fffffep0f, 0x1.000002p0f, 1.0f, 0x1.2345p0f};
  for (int i = 0; i < 4; ++i) {
    const float b = full[i], r = accy_fdiv_rcp(b), lo = accy_fdiv_lo(b);
    for (unsigned m = 0; m < (1u << 23); ++m) {
      const float a = f_of(0x3f800000u | m);
      check(a, b, r, lo); check(-a, b, r, lo);
    }
  }
  printf("%ld %ld %ld\n", bad, fast, n);
  return 0;
}
"""


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_quotients_by_a_shared_divisor_are_ieee_division(tmp_path):
    lo, hi = FDIV_SHORT_A
    program = (PROGRAM.replace("@HELPER@", fdiv_helpers("static inline", "r = 1.0f / b;"))
               .replace("@LOB@", str(lo + 2)).replace("@HIB@", str(hi - 3))
               .replace("@LOBM@", str(lo + 1)).replace("@HIBP@", str(hi - 1))
               .replace("@LOM@", str(lo - 1)).replace("@LO@", str(lo))
               .replace("@HI@", str(hi)))
    src, exe = tmp_path / "fdiv.c", tmp_path / "fdiv"
    src.write_text(program)
    subprocess.run(["cc", "-O2", "-ffp-contract=off", str(src), "-o", str(exe), "-lm"],
                   check=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    *bad_lines, counts = out.splitlines()
    bad, fast, n = (int(v) for v in counts.split())
    assert bad == 0, bad_lines
    # most quotients took the short path, and the ones outside its range did not
    assert n > 40_000_000 and fast > n // 2
