"""``specialize-shapes``: bind the entry arguments' ``?`` dims and re-infer every type.

Example
-------
>>> from accy.choir.parser import parse_module
>>> from accy.choir.passes import PassManager
>>> m = parse_module('''"builtin.module"() ({
...   "func.func"() <{function_type = (tensor<?x4xf32>) -> tensor<?x4xf32>, sym_name = "main"}> ({
...   ^bb0(%x: tensor<?x4xf32>):
...     %0 = "semantic.exp"(%x) : (tensor<?x4xf32>) -> tensor<?x4xf32>
...     "func.return"(%0) : (tensor<?x4xf32>) -> ()
...   }) : () -> ()
... }) : () -> ()''')
>>> _ = PassManager("contract", (SpecializeShapes(((0, (8, 4)),)),)).run(m)
>>> str(m.entry().function_type)
'(tensor<8x4xf32>) -> tensor<8x4xf32>'
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from accy.choir.attributes import FunctionType, TensorType
from accy.choir.builtin import FuncOp, ModuleOp
from accy.choir.ir import Operation
from accy.choir.passes import Pass, PassContext
from accy.dialects.semantic import SemanticOp
from accy.dialects.shapes import merge_types
from accy.errors import VerifyError
from accy.preparation.passes.rewrite import blocks


def _fmt_shape(shape: tuple[int, ...]) -> str:
    return "x".join(map(str, shape)) if shape else "scalar"


@dataclass(frozen=True)
class SpecializeShapes(Pass):
    """Bind ``?`` dims of the entry function's arguments, then propagate.

    Every op's result type is re-inferred (``SemanticOp.infer``) and refined
    with :func:`accy.dialects.shapes.merge_types`; a declared type that
    disagrees with the inferred one is a ``VerifyError`` at the op. The
    function types follow their blocks and ``func.return``. Unbound ``?``
    dims may remain (check mode).
    """

    name = "specialize-shapes"

    shapes: tuple[tuple[int, tuple[int, ...]], ...] = ()
    """(argument index, full shape) pairs, e.g. ``((0, (8192, 4096)),)``."""

    def __post_init__(self) -> None:
        # a reproducer rebuilds the pass from JSON lists; a recipe may pass a mapping
        raw: Any = self.shapes
        items = raw.items() if isinstance(raw, Mapping) else raw
        try:
            norm = tuple(sorted((int(i), tuple(int(d) for d in s)) for i, s in items))
        except (TypeError, ValueError):
            raise VerifyError(f"specialize-shapes: malformed shapes {raw!r} (expected "
                              f"(argument index, shape) pairs)") from None
        if len({i for i, _ in norm}) != len(norm):
            raise VerifyError("specialize-shapes: an argument is bound twice")
        if any(d < 0 for _, s in norm for d in s):
            raise VerifyError("specialize-shapes: dims must be >= 0")
        object.__setattr__(self, "shapes", norm)

    def apply(self, ctx: PassContext, module: Operation) -> None:
        assert isinstance(module, ModuleOp)
        if self.shapes:
            self._bind(ctx, module.entry())
        for func in module.functions:
            self._propagate(ctx, func)

    def _bind(self, ctx: PassContext, func: FuncOp) -> None:
        args = func.body.args
        for index, shape in self.shapes:
            if index >= len(args):
                raise VerifyError(f"--shape arg{index}={_fmt_shape(shape)}: function "
                                  f"'{func.sym_name}' has {len(args)} argument"
                                  f"{'s' if len(args) != 1 else ''}", func.loc)
            t = args[index].type
            if not isinstance(t, TensorType):
                raise VerifyError(f"argument {index} of '{func.sym_name}' has type {t}; only "
                                  f"tensor arguments take a shape", func.loc)
            if len(shape) != t.rank:
                raise VerifyError(f"argument {index} of '{func.sym_name}' is {t} (rank "
                                  f"{t.rank}) but the bound shape {_fmt_shape(shape)} has rank "
                                  f"{len(shape)}", func.loc)
            bound = merge_types(t, t.with_shape(shape))
            if bound is None:
                raise VerifyError(f"argument {index} of '{func.sym_name}' is {t}; the bound "
                                  f"shape {_fmt_shape(shape)} disagrees with its static dims",
                                  func.loc)
            if bound != t:
                args[index].type = bound
                ctx.stat("bound-args")

    def _propagate(self, ctx: PassContext, func: FuncOp) -> None:
        for block in blocks(func):
            for op in block.ops:
                if not isinstance(op, SemanticOp):
                    continue
                declared = op.declared
                inferred = op.infer()
                merged = merge_types(declared, inferred)
                if merged is None:
                    raise VerifyError(f"'{op.op_name}': declared type {declared} disagrees "
                                      f"with inferred {inferred}", op.loc)
                if merged != declared:
                    op.results[0].type = merged
                    ctx.stat("refined-types")
        ftype = func.function_type
        ret = func.return_op
        results = list(ftype.results)
        for i, (v, want) in enumerate(zip(ret.operands, ftype.results)):
            merged = merge_types(want, v.type)
            if merged is None:
                raise VerifyError(f"'func.return' operand {i} has type {v.type} but function "
                                  f"'{func.sym_name}' returns {want}", ret.loc)
            results[i] = merged
        new = FunctionType(tuple(a.type for a in func.body.args), tuple(results))
        if new != ftype:
            func.set_function_type(new)
