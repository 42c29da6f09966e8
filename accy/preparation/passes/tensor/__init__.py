"""Tensor stage passes, semantic → prim, in pipeline order.

1. :class:`RequireStaticShapes` — compiling needs every ``?`` bound;
2. :class:`DecomposeComposites` — softmax, layernorm, rmsnorm, gelu and
   reduce_mean become primitive semantic ops;
3. :class:`SuccessiveReductions` — a reduction over several axes whose innermost
   axis another reduction of the same tensor reduces becomes two, innermost first
   (its first level is that sibling's rows: one read of the tensor);
4. :class:`SplitReductions` — on GPU targets, a long reduction with few
   outputs becomes two (a reshape between), so it fills the GPU;
5. :class:`InnermostReductions` — every reduction runs over the last axis
   with keepdims (transposes and reshapes around it);
6. :class:`EpiloguesBeforeReshapes` — an elementwise op on a reshaped reduction
   runs before the reshape (the mean's scale, a cast: the row kernel's epilogue);
7. :class:`LowerToPrim` — explicit broadcasts, ``prim.*`` ops;
8. :class:`CastsInsideTransposes` — the transposes around a half-precision
   reduction move outside its casts (so they fuse into the row kernel).
"""

from __future__ import annotations

from accy.preparation.passes.tensor.casts_inside_transposes import CastsInsideTransposes
from accy.preparation.passes.tensor.decompose_composites import DecomposeComposites
from accy.preparation.passes.tensor.epilogues_before_reshapes import EpiloguesBeforeReshapes
from accy.preparation.passes.tensor.innermost_reductions import InnermostReductions
from accy.preparation.passes.tensor.lower_to_prim import LowerToPrim
from accy.preparation.passes.tensor.require_static_shapes import RequireStaticShapes
from accy.preparation.passes.tensor.split_reductions import SplitReductions
from accy.preparation.passes.tensor.successive_reductions import SuccessiveReductions

__all__ = ["CastsInsideTransposes", "DecomposeComposites", "EpiloguesBeforeReshapes",
           "InnermostReductions", "LowerToPrim", "RequireStaticShapes",
           "SplitReductions", "SuccessiveReductions"]
