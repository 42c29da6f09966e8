"""Contract stage passes, on the semantic dialect, in pipeline order.

0. :class:`InlineCalls` — ``func.call`` becomes its callee's body; only the entry stays;
1. :class:`SpecializeShapes` — bind the variant's argument shapes and re-infer
   every type (shape and dtype checking, NumPy broadcasting);
2. :class:`Simplify` — algebraic identities (``x+0``, ``reshape∘reshape`` …);
3. :class:`FoldConstants` — ops of constants become constants;
4. :class:`CSE` — merge identical pure ops;
5. :class:`DCE` — erase unused pure ops.
"""

from __future__ import annotations

from accy.preparation.passes.contract.cse import CSE
from accy.preparation.passes.contract.dce import DCE
from accy.preparation.passes.contract.fold_constants import FoldConstants
from accy.preparation.passes.contract.inline_calls import InlineCalls
from accy.preparation.passes.contract.simplify import Simplify
from accy.preparation.passes.contract.specialize_shapes import SpecializeShapes

__all__ = ["CSE", "DCE", "FoldConstants", "InlineCalls", "Simplify", "SpecializeShapes"]
