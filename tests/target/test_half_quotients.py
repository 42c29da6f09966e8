"""The CUDA target's half-precision exp, sigmoid and quotient (``accy_exp_half``,
``accy_sigmoid_half``, and ``(a * s) * r``
with ``s = accy_hscale(b)`` and ``r = 1 / (b * s)``), built by the host C compiler from
the text the CUDA helpers are made of (libm's ``exp2f`` for CUDA's ``exp2f``), against
float64 over sweeps of f32 arguments: the accuracy their docstrings state. The GPU
tests check the device build through a stored f16/bf16 result."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cuda_on_cpu import sweep  # noqa: E402

from accy.target.cuda import exp_half_helper, hscale_helper, sigmoid_half_helper  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")

HEAD = r"""
#include <math.h>
#include <stdio.h>
#include <string.h>
@HELPER@
static float f_of(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
static float quotient(float a, float b) {
  const float s = accy_hscale(b), r = 1.0f / (b * s);
  return (a * s) * r;
}
"""

EXP_PROGRAM = HEAD + r"""
int main(void) {
  double worst = 0, worst_abs = 0; float at = 0;
  /* every 31st f32 of [-104, 88.7]: 0xc2d00000 is -104, 0x42b17217 is 88.72 */
  for (unsigned u = 0; u <= 0x42b17217u; u += 31) {
    for (int sign = 0; sign < 2; ++sign) {
      const float x = sign ? -f_of(u) : f_of(u);
      if (x < -104.0f) continue;
      const double want = exp((double)x), got = accy_exp_half(x);
      /* relative to the least normal f32 where the result is subnormal */
      const double err = fabs(got - want) / fmax(want, 0x1p-126);
      if (err > worst) { worst = err; at = x; }
      if (want < 0x1p-126 && fabs(got - want) > worst_abs) worst_abs = fabs(got - want);
    }
  }
  printf("%.9g %.9g %.9g\n", worst, at, worst_abs);
  printf("%.9g %.9g %.9g\n", accy_exp_half(-INFINITY), accy_exp_half(INFINITY),
         accy_exp_half(NAN));
  return 0;
}
"""

SIGMOID_PROGRAM = HEAD + r"""
int main(void) {
  double worst = 0; float at = 0;
  /* every 31st f32 of [-88.7, 104] (where exp(-x) is finite) */
  for (unsigned u = 0; u <= 0x42d00000u; u += 31) {
    for (int sign = 0; sign < 2; ++sign) {
      const float x = sign ? -f_of(u) : f_of(u);
      if (x < -88.7f) continue;
      const double want = 1.0 / (1.0 + exp(-(double)x)), got = accy_sigmoid_half(x);
      const double err = fabs(got - want) / fmax(want, 0x1p-126);
      if (err > worst) { worst = err; at = x; }
    }
  }
  printf("%.9g %.9g\n", worst, at);
  printf("%.9g %.9g %.9g %.9g\n", accy_sigmoid_half(-INFINITY), accy_sigmoid_half(INFINITY),
         accy_sigmoid_half(NAN), accy_sigmoid_half(-100.0f));
  return 0;
}
"""

QUOTIENT_PROGRAM = HEAD + r"""
int main(void) {
  double worst = 0, worst_abs = 0; float wa = 0, wb = 0;
  /* a: every 4099th f32 mantissa at every exponent (subnormals too); b: 61 mantissas at
     every exponent, both signs */
  for (unsigned eb = 0; eb < 255; ++eb) {
    for (unsigned mb = 0; mb < (1u << 23); mb += (1u << 23) / 61) {
      const float b = f_of((eb << 23) | mb);
      for (unsigned ua = 0; ua < 0x7f800000u; ua += 4099 * 64) {
        for (int sign = 0; sign < 2; ++sign) {
          const float a = sign ? -f_of(ua) : f_of(ua);
          const double want = (double)a / (double)b;
          const double got = quotient(a, b);
          if (fabs(want) >= 0x1p-126 && fabs(want) <= 0x1.fffffep127) {
            const double err = fabs(got - want) / fabs(want);
            if (err > worst) { worst = err; wa = a; wb = b; }
          } else if (fabs(want) < 0x1p-126 && fabs(got - want) > worst_abs) {
            worst_abs = fabs(got - want);
          }
        }
      }
    }
  }
  printf("%.9g %.9g %.9g %.9g\n", worst, wa, wb, worst_abs);
  /* IEEE's specials: every pair of {0, -0, 1, -3, inf, -inf, nan, a subnormal, 2^127}
     as a / b, 1 where the quotient agrees with the division's (NaN with NaN) */
  const float v[] = {0.0f, -0.0f, 1.0f, -3.0f, INFINITY, -INFINITY, NAN, 0x1p-140f,
                     0x1p127f};
  int agree = 0, pairs = 0;
  for (int i = 0; i < 9; ++i)
    for (int j = 0; j < 9; ++j) {
      const float q = quotient(v[i], v[j]), w = v[i] / v[j];
      const int same = (q != q && w != w) ||
                       (q == w && signbit(q) == signbit(w)) ||
                       (fabs((double)q - (double)w) <= fabs((double)w) * 0x1p-23);
      agree += same; pairs++;
      if (!same) printf("differs: %g / %g = %g, not %g\n", v[i], v[j], q, w);
    }
  printf("%d %d\n", agree, pairs);
  return 0;
}
"""


def build_and_run(tmp_path, program: str) -> str:  # type: ignore[no-untyped-def]
    """What ``program`` prints with the three helpers in it (:func:`cuda_on_cpu.sweep`
    builds it as NVRTC builds accy's units: no FMA contraction)."""
    return sweep(tmp_path, program, "\n".join([
        exp_half_helper("static inline", "exp2f"), hscale_helper("static inline"),
        sigmoid_half_helper("static inline", "exp2f", "r = 1.0f / y;")]))


def test_the_half_precision_exp_is_within_two_to_the_minus_sixteen_point_seven(tmp_path):
    """Within ``2^-16.7`` relative (the rounding of ``x · log2 e`` and ``exp2``'s own),
    relative to the least normal f32 where the result is subnormal (there that is
    ``2^-142.7``, against a bf16 subnormal unit of ``2^-133``); ``exp(-inf) = 0``,
    ``exp(inf) = inf``, NaN stays NaN."""
    stats, specials = build_and_run(tmp_path, EXP_PROGRAM).splitlines()
    worst, at, worst_abs = (float(v) for v in stats.split())
    assert worst <= 2.0 ** -16.7, f"relative error {worst} at {at}"
    assert worst > 2.0 ** -20  # the rounding of x · log2 e shows at the ends of the range
    assert 0 < worst_abs <= 2.0 ** -142.7
    zero, inf, nan = (float(v) for v in specials.split())
    assert zero == 0.0 and inf == float("inf") and nan != nan


def test_the_half_precision_sigmoid_is_within_two_to_the_minus_sixteen_point_six(tmp_path):
    """Where ``exp(-x)`` is finite, within ``2^-16.6`` relative (relative to the least
    normal f32 below it); 0 at ``-inf`` and where ``exp(-x)`` overflows, as f32's
    ``1 / (1 + expf(-x))``; 1 at ``inf``; NaN stays NaN."""
    stats, specials = build_and_run(tmp_path, SIGMOID_PROGRAM).splitlines()
    worst, at = (float(v) for v in stats.split())
    assert 2.0 ** -22 < worst <= 2.0 ** -16.6, f"relative error {worst} at {at}"
    zero, one, nan, overflow = (float(v) for v in specials.split())
    assert zero == 0.0 and one == 1.0 and nan != nan and overflow == 0.0


def test_a_half_precision_quotient_is_within_two_to_the_minus_twenty_three(tmp_path):
    """``(a · s) · r`` against the float64 quotient over a's and b's of every exponent
    (subnormal and huge divisors included, where ``s`` is not 1): normal quotients within
    ``2^-23`` relative, subnormal ones within one subnormal unit (``a · s`` may round
    there); zeros, infinities and NaN as IEEE division gives them."""
    out = build_and_run(tmp_path, QUOTIENT_PROGRAM)
    stats, specials = out.splitlines()[-2:]
    worst, wa, wb, worst_abs = (float(v) for v in stats.split())
    assert worst > 2.0 ** -25, out  # the sweep ran: rounding shows
    assert worst <= 2.0 ** -23, f"relative error {worst} at {wa} / {wb}"
    assert worst_abs <= 2.0 ** -149
    agree, pairs = (int(v) for v in specials.split())
    assert agree == pairs == 81
