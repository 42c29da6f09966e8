"""accy's f32 erfc (the CUDA target's ``accy_erfcf``), compiled by the host C compiler
from the same text, against libm's double ``erfc`` over a sweep of every 97th f32 in
[0, 10.06] (about 11 million arguments): the accuracy the CUDA helper's docstring
states. The GPU tests check the device build against the reference."""

from __future__ import annotations

import math
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cuda_on_cpu import sweep  # noqa: E402

from accy.target.cuda import erfc_half_helper, erfc_helper

HEAD = r"""
#include <math.h>
#include <stdio.h>
#include <string.h>
@HELPER@
static float f_of(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
"""
"""What both sweeps start with: the helper under test and an f32 from its bits."""

PROGRAM = HEAD + r"""
int main(void) {
  double worst = 0, sum = 0; float at = 0; long n = 0;
  const unsigned last = 0x4120f5c3u;  /* 10.06f */
  for (unsigned u = 0; u <= last; u += 97) {
    const float a = f_of(u);
    const double want = erfc((double)a);
    const float wf = (float)want;
    if (wf < 1.2e-38f) continue;  /* denormal results: a different ulp */
    const double ulp = (double)nextafterf(wf, INFINITY) - (double)wf;
    const double err = fabs((double)accy_erfcf(a) - want) / ulp;
    sum += err; n++;
    if (err > worst) { worst = err; at = a; }
  }
  printf("%.3f %.9g %.4f\n", worst, at, sum / n);
  printf("%.9g %.9g %.9g %.9g %.9g\n", accy_erfcf(NAN), accy_erfcf(INFINITY),
         accy_erfcf(-INFINITY), accy_erfcf(-1.5f), accy_erfcf(20.0f));
  return 0;
}
"""


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_erfc_helper_is_within_five_ulp(tmp_path):
    out = sweep(tmp_path, PROGRAM, erfc_helper("static inline", "t = 1.0f / u;"))
    stats, specials = out.splitlines()
    worst, at, mean = (float(v) for v in stats.split())
    assert worst <= 5.0, f"{worst} ulp at {at}"
    assert mean < 1.5
    nan, inf, minus_inf, minus, big = (float(v) for v in specials.split())
    assert nan != nan and inf == 0.0 and minus_inf == 2.0 and big == 0.0
    assert abs(minus - 1.9661051464753108) < 2e-7  # erfc(-1.5)


HALF_PROGRAM = HEAD + r"""
int main(void) {
  double worst = 0; float at = 0;
  const unsigned last = 0x4120f5c3u;  /* 10.06f */
  for (unsigned u = 0; u <= last; u += 97) {
    for (int sign = 0; sign < 2; ++sign) {
      const float x = sign ? -f_of(u) : f_of(u);
      const double want = erfc((double)x);
      if (want < 1.2e-38) continue;  /* denormal results */
      const double err = fabs((double)accy_erfcf_half(x) - want) / want;
      if (err > worst) { worst = err; at = x; }
    }
  }
  printf("%.9g %.9g\n", worst, at);
  printf("%.9g %.9g %.9g %.9g %.9g %.9g\n", accy_erfcf_half(NAN), accy_erfcf_half(INFINITY),
         accy_erfcf_half(-INFINITY), accy_erfcf_half(10.6f), accy_erfcf_half(3e38f),
         accy_erfcf_half(-3e38f));
  return 0;
}
"""


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_the_half_precision_erfc_is_within_two_to_the_minus_16(tmp_path):
    """``accy_erfcf_half`` (host build, libm's exp2f for ``ex2.approx``) against a
    float64 erfc over the same sweep, both signs: relative error at most 2^-16, a 256th
    of a bf16 ulp and a 32nd of an f16 one."""
    stats, specials = sweep(tmp_path, HALF_PROGRAM, erfc_half_helper(
        "static inline", "t = 1.0f / u;", "exp2f")).splitlines()
    worst, at = (float(v) for v in stats.split())
    assert worst <= 2.0 ** -16, f"relative error {worst} at {at}"
    nan, inf, minus_inf, past, big, minus_big = (float(v) for v in specials.split())
    assert nan != nan and inf == 0.0 and minus_inf == 2.0 and minus_big == 2.0
    assert past == 0.0 and big == 0.0  # erfc(10.6) < 2^-149: no clamp needed


def test_the_half_precision_erfc_coefficients_are_the_fit_they_say() -> None:
    """:data:`~accy.target.cuda.HALF_ERFC_COEFFICIENTS`, redone as their docstring says,
    and the fit's error in exact arithmetic."""
    from numpy.polynomial import chebyshev, polynomial

    from accy.numerics import erfc
    from accy.target.cuda import HALF_ERFC_COEFFICIENTS, HALF_ERFC_K

    k, log2e = HALF_ERFC_K, 1.0 / math.log(2.0)
    top = 10.06 / (1.0 + k * 10.06)  # w(10.06)

    def exponent(w: np.ndarray) -> np.ndarray:
        a = w / (1.0 - k * w)
        return np.log2(erfc(a) * (1.0 + k * a)) + a * a * log2e

    nodes = np.cos(np.pi * (np.arange(4000) + 0.5) / 4000)
    fit = chebyshev.chebfit(nodes, exponent((nodes + 1.0) * top / 2.0), 6)
    in_w = polynomial.Polynomial(chebyshev.cheb2poly(fit))(
        polynomial.Polynomial([-1.0, 2.0 / top]))
    assert np.allclose(in_w.coef, HALF_ERFC_COEFFICIENTS, rtol=1e-9, atol=1e-12)
    w = np.linspace(0.0, top, 100001)
    worst = np.abs(polynomial.polyval(w, HALF_ERFC_COEFFICIENTS) - exponent(w)).max()
    assert worst * math.log(2.0) < 2.0 ** -18.9  # relative error of erfc
