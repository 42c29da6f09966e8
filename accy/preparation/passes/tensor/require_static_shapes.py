"""``require-static-shapes``: every tensor type in the module must be static.

Example
-------
>>> from accy.choir.parser import parse_module
>>> from accy.choir.passes import PassManager
>>> from accy.errors import PassFailedError
>>> m = parse_module('''"builtin.module"() ({
...   "func.func"() <{function_type = (tensor<?x4xf32>) -> tensor<?x4xf32>, sym_name = "main"}> ({
...   ^bb0(%x: tensor<?x4xf32>):
...     "func.return"(%x) : (tensor<?x4xf32>) -> ()
...   }) : () -> ()
... }) : () -> ()''', "f.mlir")
>>> try:
...     PassManager("tensor", (RequireStaticShapes(),)).run(m)
... except PassFailedError as e:
...     print(e.__cause__)
f.mlir:3:8: error: argument 0 has unbound dims (tensor<?x4xf32>): bind them with --shape arg0=Nx4
"""

from __future__ import annotations

from dataclasses import dataclass

from accy.choir.attributes import TensorType, Type
from accy.choir.builtin import ModuleOp
from accy.choir.ir import Operation
from accy.choir.passes import Pass, PassContext
from accy.errors import VerifyError
from accy.preparation.passes.rewrite import blocks


def _dynamic(t: Type) -> bool:
    return isinstance(t, TensorType) and not t.is_static


@dataclass(frozen=True)
class RequireStaticShapes(Pass):
    """Fail at the first argument or op result with a ``?`` dim."""

    name = "require-static-shapes"
    preserves = frozenset({"*"})

    def apply(self, ctx: PassContext, module: Operation) -> None:
        assert isinstance(module, ModuleOp)
        for func in module.functions:
            for i, a in enumerate(func.body.args):
                if _dynamic(a.type):
                    assert isinstance(a.type, TensorType)
                    hint = "x".join("N" if d is None else str(d) for d in a.type.shape)
                    where = a.loc if a.loc.known else func.loc
                    raise VerifyError(f"argument {i} has unbound dims ({a.type}): bind them "
                                      f"with --shape arg{i}={hint}", where)
            for block in blocks(func):
                for op in block.ops:
                    for r in op.results:
                        if _dynamic(r.type):
                            raise VerifyError(f"result of '{op.op_name}' has unbound dims "
                                              f"({r.type}); bind the arguments' shapes with "
                                              f"--shape", op.loc)
            for i, t in enumerate(func.function_type.results):
                if _dynamic(t):
                    raise VerifyError(f"result {i} of function '{func.sym_name}' has unbound "
                                      f"dims ({t})", func.loc)
